//! One customer's standing in a waiting room, for the waiting page and
//! `queue.json`, polled by everyone waiting: built from the shelf (the
//! sale's times, in memory), one Redis call and what this process's tick
//! last saw. No Postgres (but for one row once the sale is over for good).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::entries::recorded_entry;
use super::join::queue_sale;
use super::local::local;
use super::opening::{ensure_queue, Readied};
use super::sale::QueueSale;
use crate::domain::draw::Ticket;
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::queue::{Entry, PassRef, PassState, QueueState, QueueView};
use crate::services::Shop;

/// Where one customer stands (`queue.json`'s `state`).
///
/// `Closed` means nothing more can happen for this customer in this queue:
/// the sale ended, the queue was closed, or their own turn is over (their
/// pass was used, or lapsed and gave its place to the next in line);
/// `QueueStatus::pass_state` tells which of the last two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    NotJoined,
    Waiting,
    Admitted,
    SoldOut,
    Closed,
}

/// One customer's view of a sale's waiting room. Built without Postgres.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStatus {
    pub standing: Standing,
    pub queue: QueueState,
    /// When joining opens, and when the draw happens (the sale's start).
    pub opens_at: DateTime<Utc>,
    pub starts_at: DateTime<Utc>,
    pub ticket: Option<Ticket>,
    /// 1-based place in the line, once drawn.
    pub position: Option<i64>,
    /// Places before this one still waiting or holding a pass.
    pub ahead: Option<i64>,
    /// Units nobody holds: the gate's stock less what open passes cover.
    pub units_left: i64,
    /// Units held by open passes and unpaid orders.
    pub held: i64,
    /// When held units come back at the latest, if any are held.
    pub held_until: Option<DateTime<Utc>>,
    pub pass: Option<PassRef>,
    pub pass_state: Option<PassState>,
    pub pass_expires_at: Option<DateTime<Utc>>,
    /// From the recent admission rate; None when it cannot be told.
    pub estimated_wait: Option<Duration>,
}

/// Nobody's id (ids start at 1): a signed-out visitor sees the queue's
/// counts and no place.
const NOBODY: CustomerId = CustomerId(0);

/// `customer`'s standing (None: signed out, `NotJoined`). No Postgres while
/// the room is live.
pub async fn status(
    shop: &Shop,
    customer: Option<CustomerId>,
    product: ProductId,
) -> Result<QueueStatus, AppError> {
    let sale = queue_sale(shop, product).await?;
    let now = Utc::now();
    let who = customer.unwrap_or(NOBODY);
    let view = if sale.has_retired(&shop.settings, now) {
        Some(retired_view(shop, &sale, customer).await?)
    } else {
        shop.waiting_room.view(product, who).await?
    };
    let view = match view {
        Some(view) => view,
        // Not prepared yet: nobody has a place before the opening.
        None if !sale.is_open(now) => view_without_queue(&sale, QueueState::Pre, None),
        // Redis lost it (or nobody prepared it yet): the one poll that
        // notices asks Postgres, so no waiter is told they have no place.
        None => match ensure_queue(shop, &sale).await? {
            Readied::Retired => retired_view(shop, &sale, customer).await?,
            _ => shop.waiting_room.status(product, who).await?,
        },
    };
    let (rate, held_until) = {
        let local = local(&shop.redis_prefix);
        (local.admission_rate(product), local.held_until(product))
    };
    let held = view.outstanding.max(0) + view.unpaid.max(0);
    let standing = standing_of(&view, sale.has_ended(now));
    let ahead = view.ahead.filter(|_| standing == Standing::Waiting);
    Ok(QueueStatus {
        standing,
        queue: view.queue,
        opens_at: sale.opens_at,
        starts_at: sale.starts_at,
        ticket: view.entry.as_ref().map(|e| e.ticket.clone()),
        position: view.position,
        ahead,
        // Before the first tick counts it in Redis, the shelf's stock (a
        // fresh sale is not "sold out" for want of a count).
        units_left: if view.counted {
            view.units_left.max(0)
        } else {
            (sale.stock_on_shelf - view.outstanding).max(0)
        },
        held,
        held_until: held_until.filter(|_| held > 0),
        pass: view.pass.as_ref().map(|(pass, _, _)| pass.clone()),
        pass_state: view.pass.as_ref().map(|(_, state, _)| *state),
        pass_expires_at: view.pass.as_ref().map(|(_, _, at)| *at),
        estimated_wait: ahead
            .zip(rate)
            .map(|(ahead, rate)| Duration::from_secs_f64((ahead.max(0) as f64 + 1.0) / rate)),
    })
}

/// A finished waiting room, its queue freed from Redis (or about to be),
/// as the sale and the customer's own row say: a poll never brings a
/// hundred thousand places back into Redis for a sale that is over, and a
/// customer still finds their ticket to look up in the published order.
/// One read of Postgres, by key, for a signed-in customer: the page stops
/// polling once the room is closed.
async fn retired_view(
    shop: &Shop,
    sale: &QueueSale,
    customer: Option<CustomerId>,
) -> Result<QueueView, AppError> {
    let entry = match customer {
        Some(customer) => recorded_entry(shop, sale.product, customer).await?,
        None => None,
    };
    Ok(view_without_queue(sale, QueueState::Closed, entry))
}

/// What the sale alone says of a room Redis holds no queue for (before its
/// opening, or after it is over for good): its state, the customer's place
/// if known, the shelf's stock, nothing held and no position.
fn view_without_queue(sale: &QueueSale, queue: QueueState, entry: Option<Entry>) -> QueueView {
    QueueView {
        queue,
        drawn: queue == QueueState::Closed,
        entry,
        position: None,
        ahead: None,
        pass: None,
        units_left: sale.stock_on_shelf,
        counted: true,
        outstanding: 0,
        unpaid: 0,
    }
}

fn standing_of(view: &QueueView, ended: bool) -> Standing {
    if ended {
        return Standing::Closed;
    }
    match view.pass.as_ref().map(|(_, state, _)| *state) {
        Some(PassState::Issued | PassState::Claimed) => return Standing::Admitted,
        Some(PassState::Used | PassState::Lapsed) => return Standing::Closed,
        None => {}
    }
    match view.queue {
        QueueState::Closed => return Standing::Closed,
        QueueState::SoldOut => return Standing::SoldOut,
        _ => {}
    }
    // "Sold out" is the tick's word, decided from Postgres: counts read
    // here can be missing (a queue just rebuilt before the gate is seeded
    // again reads as no stock), and a waiter told "sold out" stops waiting.
    if view.entry.is_some() {
        Standing::Waiting
    } else {
        Standing::NotJoined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> QueueView {
        QueueView {
            queue: QueueState::Open,
            drawn: true,
            entry: None,
            position: None,
            ahead: None,
            pass: None,
            units_left: 3,
            counted: true,
            outstanding: 1,
            unpaid: 0,
        }
    }

    #[test]
    fn only_the_tick_says_sold_out() {
        let mut v = view();
        assert_eq!(standing_of(&v, false), Standing::NotJoined);
        v.units_left = 0;
        v.outstanding = 0;
        assert_eq!(
            standing_of(&v, false),
            Standing::NotJoined,
            "counts that read as nothing left may be counts not there yet"
        );
        v.queue = QueueState::SoldOut;
        assert_eq!(standing_of(&v, false), Standing::SoldOut);
        assert_eq!(standing_of(&v, true), Standing::Closed);
    }
}
