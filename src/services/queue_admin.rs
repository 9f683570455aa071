//! The waiting rooms as an admin runs them (issue #16): how each queue-mode
//! sale's queue stands (live from Redis, recorded in Postgres), pausing and
//! resuming admission, and the draw's record at a glance.
//!
//! Pause and resume are logged in `admin_actions`; the latest of the two is
//! also the admission state a queue rebuilt from Postgres must come back
//! with (`paused_in_record`), since Redis may be lost and nothing else in
//! Postgres remembers a pause.

use chrono::{DateTime, Utc};
use diesel::prelude::*;

use crate::db::models::Product;
use crate::db::schema::{admin_actions, products, queue_admissions, queue_draws, queue_entries};
use crate::db::{self, PgConn, PgPool};
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::queue::{QueueCounts, QueueState};
use crate::services::action_log::{self, ActionKind, AdminAction};
use crate::services::catalog::{find_product, queue_opening};
use crate::services::queue::{entries_in_record, QueueSale};
use crate::services::Shop;

/// What Postgres has recorded of a sale's waiting room.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordedCounts {
    /// Entries (one per customer who joined).
    pub entries: i64,
    /// Of them, joined at or after the start.
    pub late: i64,
    /// Passes issued, whatever became of them.
    pub admitted: i64,
    /// Passes still open (neither used nor lapsed).
    pub open: i64,
    pub used: i64,
    pub lapsed: i64,
}

/// The seed's commitment and whether it has been revealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrawSummary {
    /// Lowercase hex SHA-256 of the seed, as `draw.json` publishes it.
    pub seed_sha256: String,
    pub committed_at: DateTime<Utc>,
    /// Set once the order is drawn and the seed revealed.
    pub drawn_at: Option<DateTime<Utc>>,
}

/// What Redis says of the queue right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveQueue {
    Running {
        state: QueueState,
        counts: QueueCounts,
    },
    /// Redis has no queue for the sale: not prepared yet (it is when the
    /// waiting room opens), or lost and not yet rebuilt.
    Absent,
    /// The sale is over for good and its queue was freed from Redis
    /// (`QueueSale::has_retired`); the recorded counts are the whole story.
    Retired,
    /// Redis did not answer; the recorded counts still stand.
    Unreadable(String),
}

/// One queue-mode sale on the dashboard.
#[derive(Debug, Clone)]
pub struct QueueOverview {
    pub product: Product,
    pub opens_at: DateTime<Utc>,
    pub live: LiveQueue,
    pub recorded: RecordedCounts,
    pub draw: Option<DrawSummary>,
    /// The latest pause or resume: (paused, who, when).
    pub last_admin_change: Option<(bool, String, DateTime<Utc>)>,
}

impl QueueOverview {
    /// Passes used per pass issued, from Redis when it answers (it sees a
    /// use the moment its order commits), else from Postgres; None before
    /// any admission.
    pub fn conversion(&self) -> Option<f64> {
        let (used, admitted) = match &self.live {
            LiveQueue::Running { counts, .. } => (counts.used, counts.admitted),
            _ => (self.recorded.used, self.recorded.admitted),
        };
        (admitted > 0).then(|| used as f64 / admitted as f64)
    }
}

/// Every queue-mode sale, newest start first, with its queue.
pub async fn queue_overviews(shop: &Shop) -> Result<Vec<QueueOverview>, AppError> {
    // One snapshot, so a sale's draw and its counts agree (a reveal
    // committing between them would count entries it left out).
    let recorded = db::run(&shop.pool, |conn| {
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
                    .map(|product| {
                        let id = product.id;
                        let draw = draw_summary(conn, id)?;
                        let revealed = draw.as_ref().is_some_and(|d| d.drawn_at.is_some());
                        Ok((
                            product,
                            recorded_counts(conn, id, revealed)?,
                            draw,
                            last_admin_change(conn, id)?,
                        ))
                    })
                    .collect::<Result<Vec<_>, AppError>>()
            })
    })
    .await?;
    let mut overviews = Vec::with_capacity(recorded.len());
    for (product, recorded, draw, last_admin_change) in recorded {
        let retired = QueueSale::of(&product)
            .is_some_and(|sale| sale.has_retired(&shop.settings, Utc::now()));
        let live = live_queue(shop, product.product_id(), retired).await;
        overviews.push(QueueOverview {
            opens_at: queue_opening(product.sale_starts_at, product.queue_opens_at),
            product,
            live,
            recorded,
            draw,
            last_admin_change,
        });
    }
    Ok(overviews)
}

async fn live_queue(shop: &Shop, product: ProductId, retired: bool) -> LiveQueue {
    let room = &shop.waiting_room;
    let read = async {
        if !room.exists(product).await? {
            return Ok(if retired {
                LiveQueue::Retired
            } else {
                LiveQueue::Absent
            });
        }
        let state = room.status(product, NOBODY).await?.queue;
        let counts = room.counts(product).await?;
        Ok::<_, AppError>(LiveQueue::Running { state, counts })
    };
    read.await
        .unwrap_or_else(|error| LiveQueue::Unreadable(error.to_string()))
}

/// Entries as the draw's record counts them (`entries_in_record`), so the
/// dashboard never lists a place that `draw.json` leaves out.
fn recorded_counts(
    conn: &mut PgConn,
    product: i64,
    revealed: bool,
) -> Result<RecordedCounts, AppError> {
    let entries: i64 = entries_in_record(ProductId(product), revealed)
        .count()
        .get_result(conn)?;
    let late: i64 = queue_entries::table
        .filter(queue_entries::product_id.eq(product))
        .filter(queue_entries::late)
        .count()
        .get_result(conn)?;
    let by_state: Vec<(String, i64)> = queue_admissions::table
        .filter(queue_admissions::product_id.eq(product))
        .group_by(queue_admissions::state)
        .select((queue_admissions::state, diesel::dsl::count_star()))
        .load(conn)?;
    let of = |state: &str| {
        by_state
            .iter()
            .find(|(s, _)| s == state)
            .map_or(0, |(_, n)| *n)
    };
    Ok(RecordedCounts {
        entries,
        late,
        admitted: by_state.iter().map(|(_, n)| n).sum(),
        open: of("issued"),
        used: of("used"),
        lapsed: of("lapsed"),
    })
}

/// (seed_sha256, committed_at, drawn_at)
type DrawRow = (Vec<u8>, DateTime<Utc>, Option<DateTime<Utc>>);

fn draw_summary(conn: &mut PgConn, product: i64) -> Result<Option<DrawSummary>, AppError> {
    let row: Option<DrawRow> = queue_draws::table
        .find(product)
        .select((
            queue_draws::seed_sha256,
            queue_draws::committed_at,
            queue_draws::drawn_at,
        ))
        .first(conn)
        .optional()?;
    Ok(row.map(|(sha, committed_at, drawn_at)| DrawSummary {
        seed_sha256: hex::encode(sha),
        committed_at,
        drawn_at,
    }))
}

fn last_admin_change(
    conn: &mut PgConn,
    product: i64,
) -> Result<Option<(bool, String, DateTime<Utc>)>, AppError> {
    use crate::db::schema::customers;
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

/// Whether an admin's latest word on `product`'s admission was a pause: the
/// state a queue rebuilt from Postgres must come back in (`Paused` rather
/// than `Open`), since only Redis holds the live state.
pub async fn paused_in_record(pool: &PgPool, product: ProductId) -> Result<bool, AppError> {
    db::run(pool, move |conn| {
        Ok(last_admin_change(conn, product.get())?.is_some_and(|(paused, _, _)| paused))
    })
    .await
}

/// Pauses (`true`) or resumes (`false`) `product`'s admission and logs who
/// did it. Waiters keep their places while paused, and joins still go to
/// the back; only the issuing of passes stops. Only an admitting queue
/// pauses and only a paused one resumes (a sold-out or closed queue must not
/// come back to life by a resume); asking for the state it is already in
/// changes and logs nothing. Redis is changed first and the action logged
/// right after it took effect, as a gate resync is; a refusal logs nothing.
/// The log is what a rebuilt queue comes back with, so a change it could
/// not log is undone (the admin is told it failed, and a rebuild would
/// drop it anyway), and a logged one is put again if a rebuild from the
/// record before it came in between.
pub async fn set_admission_paused(
    shop: &Shop,
    product: ProductId,
    paused: bool,
    admin: CustomerId,
) -> Result<(), AppError> {
    let sale = find_product(&shop.pool, product).await?;
    if !sale.queue_mode {
        return Err(AppError::conflict(
            "Not a queue-mode sale",
            format!(
                "Sale #{product} is not in queue mode: it has no waiting room to pause or resume."
            ),
        ));
    }
    let room = &shop.waiting_room;
    let unchanged = |message: String| AppError::conflict("Admission unchanged", message);
    if !room.exists(product).await? {
        if QueueSale::of(&sale).is_some_and(|sale| sale.has_ended(Utc::now())) {
            return Err(unchanged(format!(
                "Sale #{product} is over: its waiting room is closed, so there is no admission to pause or resume."
            )));
        }
        return Err(unchanged(format!(
            "Sale #{product}'s waiting room is not running yet (it opens {}), so there is no admission to pause or resume.",
            audit_time(queue_opening(sale.sale_starts_at, sale.queue_opens_at))
        )));
    }
    let (from, to) = if paused {
        (QueueState::Open, QueueState::Paused)
    } else {
        (QueueState::Paused, QueueState::Open)
    };
    let now = room.status(product, NOBODY).await?.queue;
    if now == to {
        return Ok(());
    }
    if now != from {
        return Err(unchanged(match now {
            QueueState::Pre => format!(
                "Sale #{product}'s waiting room is not admitting yet: the draw at the start ({}) opens admission.",
                audit_time(sale.sale_starts_at)
            ),
            QueueState::SoldOut => format!("Sale #{product}'s waiting room is sold out: nobody else is admitted."),
            QueueState::Closed => format!("Sale #{product}'s waiting room is closed: nobody else is admitted."),
            QueueState::Open | QueueState::Paused => unreachable!("handled above"),
        }));
    }
    if !room.set_state_from(product, from, to).await? {
        return Err(unchanged(format!(
            "Sale #{product}'s waiting room changed while you asked; look again and retry."
        )));
    }
    let (kind, detail) = if paused {
        (
            ActionKind::QueuePause,
            "admission paused; waiters keep their places",
        )
    } else {
        (ActionKind::QueueResume, "admission resumed")
    };
    let action = AdminAction::on_product(admin, kind, product, detail.to_string());
    if let Err(error) = action_log::record_done(&shop.pool, action).await {
        if let Err(undo) = room.set_state_from(product, to, from).await {
            tracing::error!(%product, ?to, %undo, "an admission change that could not be logged could not be undone either; a rebuild will drop it");
        }
        return Err(error);
    }
    // Only from `from`: a queue rebuilt meanwhile from the record without
    // this change comes back in `from`; one that moved on (sold out, closed,
    // another admin's word) stays.
    room.set_state_from(product, from, to).await?;
    Ok(())
}

/// The queue's API has no state-only read; a customer in no queue (no
/// account has id 0) is shown the queue's state and nothing of anyone's.
const NOBODY: CustomerId = CustomerId(0);

fn audit_time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M UTC").to_string()
}
