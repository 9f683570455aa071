//! A sale in queue mode, as the waiting room sees it: when joining opens,
//! when the draw happens, when it ends, and what its Redis queue is set up
//! with.

use std::time::Duration;

use chrono::{DateTime, Duration as TimeDelta, Utc};

use crate::config::Settings;
use crate::db::models::Product;
use crate::domain::ProductId;
use crate::error::AppError;
use crate::queue::QueueSetup;
use crate::services::catalog::queue_opening;

#[derive(Debug, Clone)]
pub struct QueueSale {
    pub product: ProductId,
    pub name: String,
    pub opens_at: DateTime<Utc>,
    /// The sale's start to the millisecond, rounded up: Redis counts in
    /// milliseconds and decides `late` as `joined_ms >= starts_at_ms`, which
    /// with the start rounded up is exactly "joined at or after the start"
    /// (the rule `verify` checks against the sale's real start).
    pub starts_at: DateTime<Utc>,
    pub ends_at: Option<DateTime<Utc>>,
    /// Units a pass covers: the per-customer limit (queue mode requires one).
    pub units: i64,
    /// The stock as the shelf last read it (at most a second old).
    pub stock_on_shelf: i64,
}

impl QueueSale {
    /// None for a sale in open mode.
    pub fn of(product: &Product) -> Option<QueueSale> {
        if !product.queue_mode {
            return None;
        }
        Some(QueueSale {
            product: product.product_id(),
            name: product.name.clone(),
            opens_at: queue_opening(product.sale_starts_at, product.queue_opens_at),
            starts_at: ceil_to_millisecond(product.sale_starts_at),
            ends_at: product.sale_ends_at,
            units: i64::from(product.per_customer_limit.unwrap_or(1).max(1)),
            stock_on_shelf: i64::from(product.stock),
        })
    }

    pub fn setup(&self, settings: &Settings) -> QueueSetup {
        QueueSetup {
            starts_at: self.starts_at,
            pass: settings.queue_pass,
            units: self.units,
        }
    }

    pub fn is_open(&self, now: DateTime<Utc>) -> bool {
        now >= self.opens_at
    }

    pub fn has_started(&self, now: DateTime<Utc>) -> bool {
        now >= self.starts_at
    }

    pub fn has_ended(&self, now: DateTime<Utc>) -> bool {
        self.ends_at.is_some_and(|end| now >= end)
    }

    /// When the waiting room is over for good: a while after the end, long
    /// enough for the last passes and claims to be settled and the record
    /// to be complete. From then on nobody needs its Redis queue (the tick
    /// frees it, and a poll answers from the sale alone); None for a sale
    /// without an end.
    pub fn retires_at(&self, settings: &Settings) -> Option<DateTime<Utc>> {
        let linger = settings.queue_pass + settings.gate_pending_ttl() + Duration::from_secs(60);
        let linger = TimeDelta::from_std(linger).unwrap_or(TimeDelta::minutes(5));
        self.ends_at.map(|end| end + linger)
    }

    pub fn has_retired(&self, settings: &Settings, now: DateTime<Utc>) -> bool {
        self.retires_at(settings).is_some_and(|at| now >= at)
    }

    /// Why nobody may join now, if so.
    pub fn refuse_join(&self, now: DateTime<Utc>) -> Result<(), AppError> {
        if !self.is_open(now) {
            return Err(AppError::conflict(
                "The waiting room is not open yet",
                format!(
                    "The waiting room for {} opens at {} UTC. Come back then; nothing was changed.",
                    self.name,
                    self.opens_at.format("%Y-%m-%d %H:%M:%S")
                ),
            ));
        }
        if self.has_ended(now) {
            return Err(closed(&self.name));
        }
        Ok(())
    }
}

pub fn closed(name: &str) -> AppError {
    AppError::conflict(
        "The waiting room is closed",
        format!("The sale of {name} has ended, so its waiting room takes nobody else. Nothing was changed."),
    )
}

pub fn sold_out(name: &str) -> AppError {
    AppError::conflict(
        "Sold out",
        format!("{name} is sold out and no unit can come back, so its waiting room takes nobody else. Nothing was changed."),
    )
}

pub fn not_in_queue_mode(name: &str) -> AppError {
    AppError::conflict(
        "This sale has no waiting room",
        format!("{name} is sold to whoever buys first, without a waiting room: buy it from its page once the sale is open. Nothing was changed."),
    )
}

fn ceil_to_millisecond(at: DateTime<Utc>) -> DateTime<Utc> {
    let past = at.timestamp_subsec_nanos() % 1_000_000;
    if past == 0 {
        at
    } else {
        at + TimeDelta::nanoseconds(i64::from(1_000_000 - past))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_between_milliseconds_rounds_up() {
        let at: DateTime<Utc> = "2026-12-01T12:00:00.000500Z".parse().unwrap();
        let want: DateTime<Utc> = "2026-12-01T12:00:00.001Z".parse().unwrap();
        assert_eq!(ceil_to_millisecond(at), want);
        assert_eq!(ceil_to_millisecond(want), want);
    }
}
