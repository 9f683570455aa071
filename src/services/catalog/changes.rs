//! What an admin's edit of a sale changed, in the action log's words.

use chrono::{DateTime, Utc};

use super::SaleTerms;
use crate::domain::{Money, Product};

pub(super) fn audit_time(at: Option<DateTime<Utc>>) -> String {
    at.map_or("none".to_string(), |at| {
        at.format("%Y-%m-%d %H:%M UTC").to_string()
    })
}

/// What an edit changed, for the action log: "price 12.00 → 10.00; limit none → 2".
pub(super) fn changes(before: &Product, after: &SaleTerms) -> String {
    let money = |cents: i64| Money::from_cents(cents).unwrap_or_default().to_string();
    let limit = |limit: Option<i32>| limit.map_or("none".to_string(), |l| l.to_string());
    let time = audit_time;
    let mode = |queue: bool| if queue { "queue" } else { "open" };
    let mut changed = Vec::new();
    if before.name != after.name {
        changed.push(format!("name “{}” → “{}”", before.name, after.name));
    }
    if before.description != after.description {
        changed.push("description".to_string());
    }
    if before.price_cents != after.price.cents() {
        changed.push(format!(
            "price {} → {}",
            money(before.price_cents),
            money(after.price.cents())
        ));
    }
    if before.per_customer_limit != after.per_customer_limit {
        changed.push(format!(
            "limit {} → {}",
            limit(before.per_customer_limit),
            limit(after.per_customer_limit)
        ));
    }
    if before.sale_starts_at != after.starts_at {
        changed.push(format!(
            "start {} → {}",
            time(Some(before.sale_starts_at)),
            time(Some(after.starts_at))
        ));
    }
    if before.sale_ends_at != after.ends_at {
        changed.push(format!(
            "end {} → {}",
            time(before.sale_ends_at),
            time(after.ends_at)
        ));
    }
    if before.queue_mode != after.queue_mode {
        changed.push(format!(
            "mode {} → {}",
            mode(before.queue_mode),
            mode(after.queue_mode)
        ));
    }
    if before.queue_opens_at != after.queue_opens_at {
        let opening = |at: Option<DateTime<Utc>>| {
            at.map_or("15 min before start".to_string(), |at| time(Some(at)))
        };
        changed.push(format!(
            "queue opens {} → {}",
            opening(before.queue_opens_at),
            opening(after.queue_opens_at)
        ));
    }
    if before.join_check_work != after.join_check_work {
        changed.push(format!(
            "bot check {} → {} tries",
            before.join_check_work, after.join_check_work
        ));
    }
    if changed.is_empty() {
        "saved without changes".to_string()
    } else {
        changed.join("; ")
    }
}
