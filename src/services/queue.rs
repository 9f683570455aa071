//! The waiting room's use cases (issue #16): joining, a customer's standing,
//! the draw at the start, passes issued in order, lapses, and keeping
//! Postgres (what the queue is rebuilt from and audited against) in step
//! with Redis (`crate::queue`, what every instance reads).
//!
//! API CONTRACT (skeleton): the web layer codes against these signatures.
//! Bodies are being written.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::draw::Ticket;
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::queue::{PassRef, PassState, QueueState};
use crate::services::Shop;

/// Where one customer stands (`queue.json`'s `state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
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

/// Joins `customer` to `product`'s waiting room (one place per customer:
/// joining again returns the same ticket). Answered once the entry's row
/// has committed.
#[allow(unused_variables)]
pub async fn join(shop: &Shop, customer: CustomerId, product: ProductId) -> Result<Ticket, AppError> {
    unimplemented!("services::queue::join")
}

/// `customer`'s standing (None: signed out, `NotJoined`). No Postgres.
#[allow(unused_variables)]
pub async fn status(
    shop: &Shop,
    customer: Option<CustomerId>,
    product: ProductId,
) -> Result<QueueStatus, AppError> {
    unimplemented!("services::queue::status")
}
