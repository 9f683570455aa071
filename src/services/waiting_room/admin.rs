//! The waiting rooms as an admin runs them: how each queue-mode sale's
//! room stands and its draw, read in one snapshot, and pausing or resuming
//! admission, which changes the room's row and logs the admin action in
//! one transaction.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Nullable, Timestamptz};

use crate::db::schema::{admin_actions, customers, products};
use crate::db::{self, PgConn};
use crate::domain::{CustomerId, Product, ProductId, QueueState};
use crate::error::{AppError, Conflict, Missing, NoAdmission};
use crate::services::action_log::{self, ActionKind, AdminAction};
use crate::services::catalog::queue_opening;
use crate::services::Shop;

/// What Postgres holds of a sale's waiting room.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, QueryableByName)]
pub struct RoomCounts {
    /// Places (one per customer who joined).
    #[diesel(sql_type = BigInt)]
    pub entries: i64,
    /// Of them, joined after the pre-queue was frozen.
    #[diesel(sql_type = BigInt)]
    pub late: i64,
    /// Passes issued, whatever became of them.
    #[diesel(sql_type = BigInt)]
    pub admitted: i64,
    /// Passes still open (neither used nor lapsed).
    #[diesel(sql_type = BigInt)]
    pub open: i64,
    /// Units the open passes cover.
    #[diesel(sql_type = BigInt)]
    pub open_units: i64,
    #[diesel(sql_type = BigInt)]
    pub used: i64,
    #[diesel(sql_type = BigInt)]
    pub lapsed: i64,
    /// Units in unpaid orders of the sale (they may come back).
    #[diesel(sql_type = BigInt)]
    pub unpaid_units: i64,
}

/// The draw's commitments and when each step happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrawSummary {
    /// Lowercase hex SHA-256 of the seed, as `draw.json` publishes it.
    pub seed_sha256: String,
    pub committed_at: DateTime<Utc>,
    /// Lowercase hex SHA-256 of the frozen pre-queue list.
    pub entries_sha256: Option<String>,
    pub frozen_at: Option<DateTime<Utc>>,
    /// Set once the order is drawn and the seed revealed.
    pub drawn_at: Option<DateTime<Utc>>,
}

/// One queue-mode sale on the dashboard.
#[derive(Debug, Clone)]
pub struct QueueOverview {
    pub product: Product,
    pub opens_at: DateTime<Utc>,
    /// None before the room opens (no seed committed yet).
    pub state: Option<QueueState>,
    pub counts: RoomCounts,
    pub draw: Option<DrawSummary>,
    /// The latest pause or resume: (paused, who, when).
    pub last_admin_change: Option<(bool, String, DateTime<Utc>)>,
}

impl QueueOverview {
    /// Passes used per pass issued; None before any admission.
    pub fn conversion(&self) -> Option<f64> {
        (self.counts.admitted > 0).then(|| self.counts.used as f64 / self.counts.admitted as f64)
    }
}

/// Every queue-mode sale, newest start first, in one snapshot, so a sale's
/// draw and its counts agree.
pub async fn queue_overviews(shop: &Shop) -> Result<Vec<QueueOverview>, AppError> {
    db::run(&shop.pool, |conn| {
        conn.build_transaction()
            .repeatable_read()
            .read_only()
            .run(|conn| {
                let sales: Vec<Product> = products::table
                    .filter(products::queue_mode.eq(true))
                    .order((products::sale_starts_at.desc(), products::id.desc()))
                    .select(Product::as_select())
                    .load(conn)?;
                sales
                    .into_iter()
                    .map(|product| overview(conn, product))
                    .collect::<Result<Vec<_>, AppError>>()
            })
    })
    .await
}

#[derive(QueryableByName)]
struct DrawRow {
    #[diesel(sql_type = diesel::sql_types::Bytea)]
    seed_sha256: Vec<u8>,
    #[diesel(sql_type = Timestamptz)]
    committed_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<diesel::sql_types::Bytea>)]
    entries_sha256: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    frozen_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    drawn_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Bool)]
    admission_paused: bool,
    #[diesel(sql_type = Bool)]
    ended: bool,
}

fn overview(conn: &mut PgConn, product: Product) -> Result<QueueOverview, AppError> {
    let id = product.id;
    let draw: Option<DrawRow> = diesel::sql_query(
        "SELECT d.seed_sha256, d.committed_at, d.entries_sha256, d.frozen_at, d.drawn_at,
                d.admission_paused, coalesce(p.sale_ends_at <= clock_timestamp(), false) AS ended
         FROM queue_draws d JOIN products p ON p.id = d.product_id WHERE d.product_id = $1",
    )
    .bind::<BigInt, _>(id)
    .get_result(conn)
    .optional()?;
    let counts: RoomCounts = diesel::sql_query(
        "SELECT (SELECT count(*) FROM queue_entries e WHERE e.product_id = $1) AS entries,
            (SELECT count(*) FROM queue_entries e WHERE e.product_id = $1 AND e.late) AS late,
            count(a.number) AS admitted,
            count(a.number) FILTER (WHERE a.state = 'issued') AS open,
            coalesce(sum(a.units) FILTER (WHERE a.state = 'issued'), 0)::bigint AS open_units,
            count(a.number) FILTER (WHERE a.state = 'used') AS used,
            count(a.number) FILTER (WHERE a.state = 'lapsed') AS lapsed,
            (SELECT coalesce(sum(i.quantity), 0)::bigint FROM orders o
                JOIN order_items i ON i.order_id = o.id AND i.product_id = $1
                WHERE o.status = 'awaiting_payment') AS unpaid_units
         FROM queue_admissions a WHERE a.product_id = $1",
    )
    .bind::<BigInt, _>(id)
    .get_result(conn)?;
    let state = draw.as_ref().map(|d| {
        if d.ended {
            QueueState::Closed
        } else if d.frozen_at.is_none() {
            QueueState::Pre
        } else if d.drawn_at.is_some()
            && product.stock == 0
            && counts.open_units == 0
            && counts.unpaid_units == 0
        {
            QueueState::SoldOut
        } else if d.admission_paused {
            QueueState::Paused
        } else {
            QueueState::Open
        }
    });
    Ok(QueueOverview {
        opens_at: queue_opening(product.sale_starts_at, product.queue_opens_at),
        state,
        counts,
        draw: draw.map(|d| DrawSummary {
            seed_sha256: hex::encode(d.seed_sha256),
            committed_at: d.committed_at,
            entries_sha256: d.entries_sha256.map(hex::encode),
            frozen_at: d.frozen_at,
            drawn_at: d.drawn_at,
        }),
        last_admin_change: last_admin_change(conn, id)?,
        product,
    })
}

fn last_admin_change(
    conn: &mut PgConn,
    product: i64,
) -> Result<Option<(bool, String, DateTime<Utc>)>, AppError> {
    let row: Option<(String, String, DateTime<Utc>)> = admin_actions::table
        .inner_join(customers::table)
        .filter(admin_actions::product_id.eq(product))
        .filter(admin_actions::action.eq_any(vec![
            ActionKind::QueuePause.as_str(),
            ActionKind::QueueResume.as_str(),
        ]))
        .order(admin_actions::id.desc())
        .select((
            admin_actions::action,
            customers::email,
            admin_actions::created_at,
        ))
        .first(conn)
        .optional()?;
    Ok(row.map(|(action, email, at)| (action == ActionKind::QueuePause.as_str(), email, at)))
}

/// Pauses (`true`) or resumes (`false`) `product`'s admission and logs who
/// did it, in one transaction. Waiters keep their places while paused and
/// joins still go to the back; only the issuing of passes stops. Only an
/// admitting room pauses and only a paused one resumes; asking for the
/// state it is already in changes and logs nothing.
pub async fn set_admission_paused(
    shop: &Shop,
    product: ProductId,
    paused: bool,
    admin: CustomerId,
) -> Result<(), AppError> {
    db::run(&shop.pool, move |conn| {
        db::transaction(conn, |conn| change_admission(conn, product, paused, admin))
    })
    .await?;
    shop.waiting_room.forget(product);
    Ok(())
}

fn change_admission(
    conn: &mut PgConn,
    product: ProductId,
    paused: bool,
    admin: CustomerId,
) -> Result<(), AppError> {
    #[derive(QueryableByName)]
    struct Room {
        #[diesel(sql_type = Bool)]
        queue_mode: bool,
        #[diesel(sql_type = Nullable<Bool>)]
        paused: Option<bool>,
        #[diesel(sql_type = Bool)]
        frozen: bool,
        #[diesel(sql_type = Bool)]
        ended: bool,
        #[diesel(sql_type = Timestamptz)]
        starts_at: DateTime<Utc>,
        #[diesel(sql_type = Nullable<Timestamptz>)]
        opens_at: Option<DateTime<Utc>>,
    }
    // The room's row first, as a late join takes it (then the product's
    // key share): the product's row is read, not locked.
    diesel::sql_query("SELECT 1 FROM queue_draws WHERE product_id = $1 FOR UPDATE")
        .bind::<BigInt, _>(product.get())
        .execute(conn)?;
    let room: Option<Room> = diesel::sql_query(
        "SELECT p.queue_mode, d.admission_paused AS paused,
                coalesce(d.frozen_at IS NOT NULL, false) AS frozen,
                coalesce(p.sale_ends_at <= clock_timestamp(), false) AS ended,
                p.sale_starts_at AS starts_at, p.queue_opens_at AS opens_at
         FROM products p LEFT JOIN queue_draws d ON d.product_id = p.id
         WHERE p.id = $1",
    )
    .bind::<BigInt, _>(product.get())
    .get_result(conn)
    .optional()?;
    let Some(room) = room else {
        return Err(AppError::NotFound(Missing::Sale(product)));
    };
    let unchanged = |why| Err(Conflict::AdmissionUnchanged { sale: product, why }.into());
    if !room.queue_mode {
        return Err(Conflict::AdmissionNotQueueMode(product).into());
    }
    if room.ended {
        return unchanged(NoAdmission::Ended);
    }
    let Some(was_paused) = room.paused else {
        return unchanged(NoAdmission::NotRunningYet {
            opens_at: queue_opening(room.starts_at, room.opens_at),
        });
    };
    if !room.frozen {
        return unchanged(NoAdmission::NotAdmittingYet {
            starts_at: room.starts_at,
        });
    }
    if was_paused == paused {
        return Ok(());
    }
    diesel::sql_query("UPDATE queue_draws SET admission_paused = $2 WHERE product_id = $1")
        .bind::<BigInt, _>(product.get())
        .bind::<Bool, _>(paused)
        .execute(conn)?;
    let (kind, detail) = if paused {
        (
            ActionKind::QueuePause,
            "admission paused; waiters keep their places",
        )
    } else {
        (ActionKind::QueueResume, "admission resumed")
    };
    action_log::record(
        conn,
        &AdminAction::on_product(admin, kind, product, detail.to_string()),
    )?;
    Ok(())
}
