//! Each admission in Postgres (`queue_admissions`): issued, then used or
//! lapsed. Redis logs what it decided; whoever drains the log writes it
//! here (idempotently, so every instance may drain at once) and only then
//! removes it from the log. `used` is written by the purchase that used
//! the pass, or by the tick for a purchase whose process died after its
//! commit.

use chrono::{DateTime, Utc};
use diesel::prelude::*;

use crate::db::schema::{orders, queue_admissions};
use crate::db::{self, PgConn};
use crate::domain::draw::Ticket;
use crate::domain::{CustomerId, OrderId, ProductId};
use crate::error::AppError;
use crate::queue::{Behind, Issued, LogEvent, PassRef, StaleClaim};
use crate::services::Shop;

/// Log events drained per Postgres transaction.
const DRAIN_BATCH: usize = 500;
/// A drain takes at most this many batches; the next drain the rest.
const DRAIN_ROUNDS: usize = 20;

/// What a drain of the queue's log did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    /// Log events recorded in Postgres.
    pub recorded: usize,
    /// The queue was dropped, to be rebuilt from Postgres: it had issued
    /// passes under numbers or tickets the record already gave other
    /// admissions, so Redis lost writes.
    pub discarded: bool,
}

/// Records the queue's log in Postgres.
pub async fn drain_log(shop: &Shop, product: ProductId) -> Result<Drained, AppError> {
    let mut drained = Drained::default();
    for _ in 0..DRAIN_ROUNDS {
        let events = shop.waiting_room.log(product, DRAIN_BATCH).await?;
        let Some(last) = events.last().cloned() else {
            break;
        };
        let count = events.len();
        let (recorded, conflict) = db::run(&shop.pool, move |conn| {
            db::transaction(conn, |conn| record_events(conn, product, &events))
        })
        .await?;
        drained.recorded += recorded;
        if let Some(conflict) = conflict {
            // Dropping the queue drops its log too, so the proof is not
            // acknowledged away before it is acted on: a drop that fails
            // leaves the batch to be drained, and found, again.
            if shop
                .waiting_room
                .discard_behind(product, Behind::Conflicting(vec![conflict.clone()]))
                .await?
            {
                tracing::warn!(%product, number = conflict.number, ticket = %conflict.ticket, "Redis issued a pass the record has under another admission; rebuilding the queue from Postgres");
                drained.discarded = true;
                return Ok(drained);
            }
            // Rebuilt since, from a record that has this number: this
            // batch came from the queue that was lost.
        }
        shop.waiting_room.ack_log(product, &last).await?;
        if count < DRAIN_BATCH {
            break;
        }
    }
    Ok(drained)
}

/// Records `events` up to the first issue Postgres already has under
/// another admission (same number or ticket, not this issue), and returns
/// how many it recorded and that issue, if any: the queue that issued it
/// trails the record, so nothing it
/// logged after it is recorded (a later issue there, though it conflicts
/// with nothing, went to the wrong place, and its row would make every
/// queue rebuilt from the record hand a ticket a second number).
fn record_events(
    conn: &mut PgConn,
    product: ProductId,
    events: &[LogEvent],
) -> Result<(usize, Option<Issued>), AppError> {
    for (recorded, event) in events.iter().enumerate() {
        match event {
            LogEvent::Issued(issued) => {
                let inserted = diesel::insert_into(queue_admissions::table)
                    .values((
                        queue_admissions::product_id.eq(product.get()),
                        queue_admissions::number.eq(number(issued.number)?),
                        queue_admissions::ticket.eq(issued.ticket.as_str()),
                        queue_admissions::issued_at.eq(issued.issued_at),
                        queue_admissions::expires_at.eq(issued.expires_at),
                        queue_admissions::state.eq("issued"),
                    ))
                    .on_conflict_do_nothing()
                    .execute(conn)?;
                // Not inserted: recorded already by another drainer (the
                // same issue, to the millisecond), or the number or ticket
                // is another admission's.
                if inserted == 0 && !is_recorded(conn, product, issued)? {
                    return Ok((recorded, Some(issued.clone())));
                }
            }
            LogEvent::Lapsed {
                number: n,
                ticket,
                at,
            } => {
                // Never over `used`: a purchase that did commit wins, also
                // one whose claim a rebuild lost and whose process died
                // before it said so.
                used_by_their_orders(conn, product, Numbers::Only(number(*n)?))?;
                diesel::update(
                    queue_admissions::table
                        .filter(queue_admissions::product_id.eq(product.get()))
                        .filter(queue_admissions::number.eq(number(*n)?))
                        .filter(queue_admissions::ticket.eq(ticket.as_str()))
                        .filter(queue_admissions::state.eq("issued")),
                )
                .set((
                    queue_admissions::state.eq("lapsed"),
                    queue_admissions::ended_at.eq(*at),
                ))
                .execute(conn)?;
            }
        }
    }
    Ok((events.len(), None))
}

/// Whether Postgres has exactly this issue: its number, ticket and times
/// (both: a clock that stepped back can give a re-issue the same start).
fn is_recorded(conn: &mut PgConn, product: ProductId, issued: &Issued) -> Result<bool, AppError> {
    Ok(diesel::select(diesel::dsl::exists(
        queue_admissions::table
            .filter(queue_admissions::product_id.eq(product.get()))
            .filter(queue_admissions::number.eq(number(issued.number)?))
            .filter(queue_admissions::ticket.eq(issued.ticket.as_str()))
            .filter(queue_admissions::issued_at.eq(issued.issued_at))
            .filter(queue_admissions::expires_at.eq(issued.expires_at)),
    ))
    .get_result(conn)?)
}

/// The admission key a purchase with `pass` runs under: the pass's ticket,
/// then `fresh`. Orders keep it (`gate_key`), so Postgres alone can tell
/// which pass an order used when the claim that said so lived only in a
/// Redis that was lost (`used_by_their_orders`).
pub fn pass_admission(pass: &PassRef, fresh: &str) -> String {
    format!("{}-{fresh}", pass.ticket.as_str())
}

/// Which admissions `used_by_their_orders` looks at.
#[derive(Debug, Clone, Copy)]
pub enum Numbers {
    All,
    Only(i32),
    /// Numbers 1..=n: those a rebuild wrote.
    Through(i32),
}

/// Marks `used` every admission of `product` (of `numbers`) still `issued`
/// in Postgres whose pass an order was bought with, by
/// the order's admission key (`pass_admission`). A purchase records its
/// pass used after its commit; one whose process died first left only its
/// claim in Redis, and a rebuild or a lapse must not take that pass for
/// open. Returns the admissions marked.
pub fn used_by_their_orders(
    conn: &mut PgConn,
    product: ProductId,
    numbers: Numbers,
) -> Result<usize, AppError> {
    let (only, through) = match numbers {
        Numbers::All => (None, None),
        Numbers::Only(n) => (Some(n), None),
        Numbers::Through(n) => (None, Some(n)),
    };
    // Tickets are [0-9A-Z] only, so the LIKE pattern is the exact prefix.
    Ok(diesel::sql_query(
        "UPDATE queue_admissions a
            SET state = 'used', order_id = o.id, ended_at = now()
           FROM queue_entries e
           JOIN orders o ON o.customer_id = e.customer_id
          WHERE a.product_id = $1
            AND ($2::int IS NULL OR a.number = $2)
            AND ($3::int IS NULL OR a.number <= $3)
            AND a.state = 'issued'
            AND e.product_id = a.product_id AND e.ticket = a.ticket
            AND o.gate_key LIKE a.ticket || '-%'
            AND EXISTS (SELECT 1 FROM order_items i
                         WHERE i.order_id = o.id AND i.product_id = a.product_id)",
    )
    .bind::<diesel::sql_types::BigInt, _>(product.get())
    .bind::<diesel::sql_types::Nullable<diesel::sql_types::Integer>, _>(only)
    .bind::<diesel::sql_types::Nullable<diesel::sql_types::Integer>, _>(through)
    .execute(conn)?)
}

fn number(n: i64) -> Result<i32, AppError> {
    i32::try_from(n)
        .map_err(|_| AppError::Internal(anyhow::anyhow!("admission number {n} out of range")))
}

/// The purchase under `pass` (claimed as `admission`) committed `order`:
/// `used` in Postgres first (so a rebuild never reopens it), then in Redis,
/// which hands its units back from what passes hold.
pub async fn record_used(
    shop: &Shop,
    product: ProductId,
    pass: &PassRef,
    admission: &str,
    order: OrderId,
) -> Result<(), AppError> {
    if mark_used(shop, product, pass.clone(), order).await? == 0 {
        // Its issue is still in the log: record that first.
        drain_log(shop, product).await?;
        if mark_used(shop, product, pass.clone(), order).await? == 0 {
            return Err(AppError::Internal(anyhow::anyhow!(
                "pass {pass} of product {product} has no admission row"
            )));
        }
    }
    if !shop.waiting_room.settle(product, pass, admission).await? {
        tracing::warn!(%product, %pass, "a used pass was no longer claimed by its purchase in Redis");
    }
    Ok(())
}

/// After a rebuild: settles every pass the rebuild wrote (the record's
/// numbers up to its highest then) that Postgres has used. A purchase that
/// committed after the rebuild's snapshot was read, and settled before the
/// queue was whole again, found nothing to settle (a half-built queue takes
/// no change), so its pass came back open over a sold unit; so did one
/// whose process died after its commit. Driven by the record, not by
/// paging Redis's open passes (which purchases and lapses change
/// meanwhile), and bounded by number, not by time (two Redis hosts' clocks
/// differ). Returns the passes settled here.
pub async fn settle_uses_a_rebuild_missed(
    shop: &Shop,
    product: ProductId,
) -> Result<usize, AppError> {
    let Some(rebuilt) = shop.waiting_room.rebuilt_admissions(product).await? else {
        return Ok(0);
    };
    if rebuilt <= 0 {
        return Ok(0);
    }
    let through = number(rebuilt)?;
    let used: Vec<(i32, String, Option<String>)> = db::run(&shop.pool, move |conn| {
        used_by_their_orders(conn, product, Numbers::Through(through))?;
        Ok(queue_admissions::table
            .inner_join(orders::table.on(orders::id.nullable().eq(queue_admissions::order_id)))
            .filter(queue_admissions::product_id.eq(product.get()))
            .filter(queue_admissions::state.eq("used"))
            .filter(queue_admissions::number.le(through))
            .select((
                queue_admissions::number,
                queue_admissions::ticket,
                orders::gate_key,
            ))
            .load(conn)?)
    })
    .await?;
    let mut passes = Vec::with_capacity(used.len());
    for (number, ticket, admission) in used {
        let (Ok(ticket), Some(admission)) = (Ticket::parse(&ticket), admission) else {
            continue;
        };
        passes.push((
            PassRef {
                ticket,
                number: i64::from(number),
            },
            admission,
        ));
    }
    shop.waiting_room.settle_used(product, &passes).await
}

/// Rows marked: 0 when the admission's row is not there (yet).
async fn mark_used(
    shop: &Shop,
    product: ProductId,
    pass: PassRef,
    order: OrderId,
) -> Result<usize, AppError> {
    db::run(&shop.pool, move |conn| {
        let now: DateTime<Utc> = Utc::now();
        Ok(diesel::update(
            queue_admissions::table
                .filter(queue_admissions::product_id.eq(product.get()))
                .filter(queue_admissions::number.eq(number(pass.number)?))
                .filter(queue_admissions::ticket.eq(pass.ticket.as_str())),
        )
        .set((
            queue_admissions::state.eq("used"),
            queue_admissions::order_id.eq(order.get()),
            queue_admissions::ended_at.eq(now),
        ))
        .execute(conn)?)
    })
    .await
}

/// The order a claim's purchase committed, if any: orders carry the
/// claim's admission key (`orders.gate_key`, also with the gate off).
pub async fn order_under_claim(
    shop: &Shop,
    customer: CustomerId,
    admission: &str,
) -> Result<Option<OrderId>, AppError> {
    let admission = admission.to_string();
    db::run(&shop.pool, move |conn| {
        Ok(orders::table
            .filter(orders::customer_id.eq(customer.get()))
            .filter(orders::gate_key.eq(admission))
            .select(orders::id)
            .first::<i64>(conn)
            .optional()?
            .map(OrderId))
    })
    .await
}

/// What became of a stale claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    Used,
    Lapsed,
}

/// A claim past its pass's deadline and the gate's grace: its purchase
/// either committed (the pass is used) or never will (it lapses, and its
/// place goes to the next in line).
pub async fn resolve_stale(
    shop: &Shop,
    product: ProductId,
    stale: &StaleClaim,
) -> Result<Resolved, AppError> {
    match order_under_claim(shop, stale.customer, &stale.admission).await? {
        Some(order) => {
            record_used(shop, product, &stale.pass, &stale.admission, order).await?;
            Ok(Resolved::Used)
        }
        None => {
            shop.waiting_room
                .lapse_claim(product, &stale.pass, &stale.admission)
                .await?;
            Ok(Resolved::Lapsed)
        }
    }
}
