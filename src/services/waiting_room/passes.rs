//! Passes. One issuer per room at a time (an advisory lock tried, never
//! waited for) lapses the passes past their deadline and issues the next
//! positions passes from the stock, in one transaction: the units of open
//! passes never exceed the units that can still be sold, and each pass
//! covers min(limit, units still free). A pass is used inside the order's
//! own transaction (`checkout` locks it with `lock_passes`), so no cache
//! can let a buy through.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Int4, Nullable, Text, Timestamptz};

use super::rooms::snapshot;
use super::ISSUER_LOCK;
use crate::db::{self, PgConn};
use crate::domain::PASS_GRACE;
use crate::domain::{CustomerId, PassRef, ProductId};
use crate::error::{AppError, Invalid, PassRefusal};
use crate::services::mail::{self, Mail};
use crate::services::Shop;

/// What one issuing step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Issued {
    pub lapsed: usize,
    pub issued: usize,
}

#[derive(QueryableByName)]
struct Supply {
    #[diesel(sql_type = BigInt)]
    stock: i64,
    #[diesel(sql_type = Nullable<Int4>)]
    per_customer_limit: Option<i32>,
    #[diesel(sql_type = Bool)]
    issuing: bool,
    #[diesel(sql_type = Int4)]
    last_position: i32,
    #[diesel(sql_type = Int4)]
    admitted: i32,
    #[diesel(sql_type = BigInt)]
    open_units: i64,
}

/// Lapses `product`'s passes past their deadline and issues passes to the
/// next positions while units are free. Does nothing while another issuer
/// runs for the room (it will have done the same).
pub async fn issue(shop: &Shop, product: ProductId, pass_ms: i64) -> Result<Issued, AppError> {
    let issued = db::run(&shop.pool, move |conn| {
        db::transaction(conn, |conn| issue_in(conn, product, pass_ms))
    })
    .await?;
    if issued != Issued::default() {
        shop.waiting_room.forget(product);
    }
    Ok(issued)
}

fn issue_in(conn: &mut PgConn, product: ProductId, pass_ms: i64) -> Result<Issued, AppError> {
    #[derive(QueryableByName)]
    struct Got {
        #[diesel(sql_type = Bool)]
        got: bool,
    }
    let turn: Got =
        diesel::sql_query("SELECT pg_try_advisory_xact_lock($1, ($2 % 2147483647)::int) AS got")
            .bind::<Int4, _>(ISSUER_LOCK)
            .bind::<BigInt, _>(product.get())
            .get_result(conn)?;
    if !turn.got {
        return Ok(Issued::default());
    }
    // The product's row first, shared: every stock change (purchase,
    // restore, admin adjustment) holds it for update, so the stock read
    // below is the stock until this commits, and locks are always taken
    // product row first, then passes, as a purchase takes them.
    diesel::sql_query("SELECT 1 FROM products WHERE id = $1 FOR SHARE")
        .bind::<BigInt, _>(product.get())
        .execute(conn)?;
    // A pass lapses `PASS_GRACE` after its deadline: a buy sent before the
    // deadline may still be waiting for the product's lock.
    let lapsed = diesel::sql_query(
        "UPDATE queue_admissions SET state = 'lapsed', ended_at = clock_timestamp()
         WHERE product_id = $1 AND state = 'issued'
           AND expires_at + $2 * interval '1 millisecond' <= clock_timestamp()",
    )
    .bind::<BigInt, _>(product.get())
    .bind::<BigInt, _>(grace_ms())
    .execute(conn)?;
    // One statement, so the stock and the open passes are one snapshot.
    let supply: Option<Supply> = diesel::sql_query(
        "SELECT p.stock::bigint AS stock, p.per_customer_limit,
            p.queue_mode AND d.drawn_at IS NOT NULL AND NOT d.admission_paused
                AND (p.sale_ends_at IS NULL OR p.sale_ends_at > clock_timestamp()) AS issuing,
            d.last_position,
            (SELECT coalesce(max(a.number), 0) FROM queue_admissions a WHERE a.product_id = p.id) AS admitted,
            (SELECT coalesce(sum(a.units), 0)::bigint FROM queue_admissions a
                WHERE a.product_id = p.id AND a.state = 'issued') AS open_units
         FROM products p JOIN queue_draws d ON d.product_id = p.id WHERE p.id = $1",
    )
    .bind::<BigInt, _>(product.get())
    .get_result(conn)
    .optional()?;
    let Some(supply) = supply.filter(|s| s.issuing) else {
        return Ok(Issued { lapsed, issued: 0 });
    };
    let limit = i64::from(supply.per_customer_limit.unwrap_or(1).max(1));
    let mut free = supply.stock - supply.open_units;
    let (mut positions, mut units) = (Vec::new(), Vec::new());
    let mut next = supply.admitted + 1;
    while free > 0 && next <= supply.last_position {
        let covers = limit.min(free);
        positions.push(next);
        units.push(covers as i32);
        free -= covers;
        next += 1;
    }
    if positions.is_empty() {
        return Ok(Issued { lapsed, issued: 0 });
    }
    let issued: Vec<IssuedPass> = diesel::sql_query(
        "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS at),
         issued AS (
             INSERT INTO queue_admissions (product_id, number, ticket, customer_id, units, issued_at, expires_at, state)
             SELECT $1, e.position, e.ticket, e.customer_id, n.units, now.at,
                    now.at + $4 * interval '1 millisecond', 'issued'
             FROM unnest($2::int[], $3::int[]) AS n(position, units)
             JOIN queue_entries e ON e.product_id = $1 AND e.position = n.position
             CROSS JOIN now
             RETURNING number, customer_id, units, expires_at)
         SELECT issued.*, p.name AS product FROM issued JOIN products p ON p.id = $1",
    )
    .bind::<BigInt, _>(product.get())
    .bind::<Array<Int4>, _>(positions)
    .bind::<Array<Int4>, _>(units)
    .bind::<BigInt, _>(pass_ms)
    .load(conn)?;
    // "Your turn", written with the pass it announces.
    for pass in &issued {
        mail::enqueue(
            conn,
            CustomerId(pass.customer_id),
            &Mail::YourTurn {
                product_id: product.get(),
                number: pass.number,
                product: pass.product.clone(),
                units: pass.units,
                deadline: pass.expires_at,
            },
        )?;
    }
    Ok(Issued {
        lapsed,
        issued: issued.len(),
    })
}

#[derive(QueryableByName)]
struct IssuedPass {
    #[diesel(sql_type = Int4)]
    number: i32,
    #[diesel(sql_type = BigInt)]
    customer_id: i64,
    #[diesel(sql_type = Int4)]
    units: i32,
    #[diesel(sql_type = Timestamptz)]
    expires_at: DateTime<Utc>,
    #[diesel(sql_type = Text)]
    product: String,
}

/// A customer's pass as the order's transaction finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenPass {
    Open {
        number: i32,
        units: i32,
    },
    Used {
        number: i32,
    },
    /// Lapsed, or past its deadline and about to be.
    Lapsed {
        number: i32,
    },
}

impl OpenPass {
    pub fn number(&self) -> i32 {
        match self {
            OpenPass::Open { number, .. }
            | OpenPass::Used { number }
            | OpenPass::Lapsed { number } => *number,
        }
    }
}

pub(super) fn grace_ms() -> i64 {
    PASS_GRACE.as_millis() as i64
}

#[derive(QueryableByName)]
struct PassLock {
    #[diesel(sql_type = BigInt)]
    customer_id: i64,
    #[diesel(sql_type = Int4)]
    number: i32,
    #[diesel(sql_type = Int4)]
    units: i32,
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = Bool)]
    expired: bool,
}

/// The passes `customers` hold for `product`, locked for the rest of the
/// order's transaction: a lapse waits for it, and the order's statement
/// marks the pass used.
pub fn lock_open_passes(
    conn: &mut PgConn,
    product: ProductId,
    customers: &[CustomerId],
) -> Result<HashMap<CustomerId, OpenPass>, AppError> {
    let ids: Vec<i64> = customers.iter().map(|c| c.get()).collect();
    let rows: Vec<PassLock> = diesel::sql_query(
        "SELECT customer_id, number, units, state,
                expires_at + $3 * interval '1 millisecond' <= clock_timestamp() AS expired
         FROM queue_admissions WHERE product_id = $1 AND customer_id = ANY($2) FOR UPDATE",
    )
    .bind::<BigInt, _>(product.get())
    .bind::<Array<BigInt>, _>(ids)
    .bind::<BigInt, _>(grace_ms())
    .load(conn)?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let pass = match row.state.as_str() {
                "issued" if !row.expired => OpenPass::Open {
                    number: row.number,
                    units: row.units,
                },
                "used" => OpenPass::Used { number: row.number },
                _ => OpenPass::Lapsed { number: row.number },
            };
            (CustomerId(row.customer_id), pass)
        })
        .collect())
}

/// Turns away, before the gate and the lock, a buy whose pass cannot be
/// this customer's open pass. It can only say no: the order's transaction
/// decides. Free while the room's snapshot shows the pass open; otherwise
/// one indexed read (a pass newer than the snapshot, or one that ended).
pub async fn check_presented(
    shop: &Shop,
    product: ProductId,
    customer: CustomerId,
    pass: &PassRef,
    quantity: i32,
) -> Result<(), AppError> {
    let room = snapshot(shop, product).await?;
    if let Some(open) = room.open_passes.get(&customer) {
        if open.number == pass.number && open.ticket == pass.ticket {
            return covers(open.units, quantity);
        }
    }
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        customer_id: i64,
        #[diesel(sql_type = Text)]
        ticket: String,
        #[diesel(sql_type = Text)]
        state: String,
        #[diesel(sql_type = Int4)]
        units: i32,
        #[diesel(sql_type = Timestamptz)]
        expires_at: DateTime<Utc>,
        #[diesel(sql_type = Timestamptz)]
        now: DateTime<Utc>,
    }
    let number = pass.number;
    let row: Option<Row> = db::run(&shop.pool, move |conn| {
        Ok(diesel::sql_query(
            "SELECT customer_id, ticket, state, units, expires_at, clock_timestamp() AS now
             FROM queue_admissions WHERE product_id = $1 AND number = $2",
        )
        .bind::<BigInt, _>(product.get())
        .bind::<Int4, _>(number)
        .get_result(conn)
        .optional()?)
    })
    .await?;
    let refused = |why| Err(AppError::PassRefused(why));
    let Some(row) = row.filter(|row| row.ticket == pass.ticket.as_str()) else {
        return refused(PassRefusal::Forged);
    };
    if row.customer_id != customer.get() {
        return refused(PassRefusal::NotYours);
    }
    match row.state.as_str() {
        "used" => refused(PassRefusal::Used),
        "issued" if row.expires_at + chrono::Duration::milliseconds(grace_ms()) > row.now => {
            covers(row.units, quantity)
        }
        _ => refused(PassRefusal::Lapsed),
    }
}

fn covers(units: i32, quantity: i32) -> Result<(), AppError> {
    if quantity > units {
        return Err(AppError::Invalid(Invalid::BeyondPass { units }));
    }
    Ok(())
}
