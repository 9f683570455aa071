//! The waiting room's Redis side (issue #16, `docs/waiting-room.md`): one
//! queue per sale in queue mode, shared by every instance. Every key is
//! `{prefix}queue:{product:ID}:…`, the gate's hash tag, so each script runs
//! on one slot (Redis Cluster too) and may read the gate's stock in the same
//! atomic step. Postgres holds what the queue is rebuilt from
//! (`services::queue`); nothing here touches Postgres.
//!
//! API CONTRACT (skeleton): the signatures below are what `services::queue`
//! and the web layer code against. Bodies are being written.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::draw::Ticket;
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::redis_node::RedisNode;

/// Where a queue stands as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueState {
    /// Before the start: joins go to the pre-queue.
    Pre,
    /// Admitting in order.
    Open,
    /// An admin paused admission; joins still go to the back.
    Paused,
    /// Every unit is sold and nothing can come back: nobody else is admitted.
    SoldOut,
    /// The sale ended (or was closed): nobody else joins or is admitted.
    Closed,
}

/// What a queue needs to know about its sale.
#[derive(Debug, Clone, Copy)]
pub struct QueueSetup {
    pub starts_at: DateTime<Utc>,
    /// How long a pass lasts (`QUEUE_PASS_SECS`).
    pub pass: Duration,
    /// Units a pass covers: the sale's per-customer limit.
    pub units: i64,
}

/// One customer's place, as Redis has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub customer: CustomerId,
    pub ticket: Ticket,
    /// Arrival order, from 1.
    pub seq: i64,
    pub joined_at: DateTime<Utc>,
    /// Joined at or after the start (or after the draw): goes behind the drawn.
    pub late: bool,
    /// Its Postgres row is committed.
    pub confirmed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// A new place: insert its row, then `confirm` (or `undo_join`).
    New(Entry),
    /// The customer's place from before (one place per customer).
    Again(Entry),
    /// Sold out or closed: nobody joins.
    Refused(QueueState),
    /// Redis has no such queue (never prepared, or lost): prepare or rebuild first.
    Missing,
}

/// The pre-queue as the draw reads it.
#[derive(Debug, Clone)]
pub struct PreQueue {
    pub drawn: bool,
    /// Pre-queue tickets in arrival order.
    pub tickets: Vec<Ticket>,
    /// Entries (pre-queue or late) whose Postgres row is not yet confirmed.
    pub unconfirmed: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drawn {
    Done,
    /// Drawn before (by another caller): nothing changed.
    Already,
    /// The pre-queue is not the set the order was computed from (a join
    /// landed in between, or one is unconfirmed): read it again.
    Changed,
    Missing,
}

/// Which count bounds the passes: the gate's stock key (the gate on), or
/// the queue's own mirror of the Postgres stock (`STOCK_GATE=off`, kept by
/// `mirror_stock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssueBound {
    Gate,
    Mirror,
}

/// A pass names its admission: `TICKET-NUMBER`. It is not a secret (a
/// claim also checks the customer); a form's pass that names no pass of
/// this queue is forged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PassRef {
    pub ticket: Ticket,
    pub number: i64,
}

impl PassRef {
    pub fn parse(raw: &str) -> Option<PassRef> {
        let (ticket, number) = raw.trim().split_once('-')?;
        let number: i64 = number.parse().ok().filter(|n| *n > 0)?;
        Some(PassRef {
            ticket: Ticket::parse(ticket).ok()?,
            number,
        })
    }
}

impl std::fmt::Display for PassRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ticket.as_str(), self.number)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PassState {
    Issued,
    /// A purchase under it is on its way (admitted at the gate).
    Claimed,
    Used,
    Lapsed,
}

/// One admission: a pass issued to the ticket at `cursor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    pub number: i64,
    pub ticket: Ticket,
    pub customer: CustomerId,
    pub issued_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// What the queue's log holds for Postgres (`queue_admissions`), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEvent {
    Issued(Issued),
    Lapsed {
        number: i64,
        ticket: Ticket,
        at: DateTime<Utc>,
    },
}

/// A buy's pass, checked and taken in one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Taken for this admission; `units` is what the pass covers.
    Claimed { units: i64 },
    /// The customer holds no pass (not joined, or still waiting).
    NoPass,
    /// The form's pass names no pass of this queue.
    Forged,
    /// The pass is another customer's.
    NotYours,
    Lapsed,
    Used,
    /// Claimed by another purchase still on its way.
    InUse,
    Missing,
}

/// A claimed pass past its deadline and grace: its purchase either
/// committed (settle it) or never will (lapse it); Postgres tells which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleClaim {
    pub pass: PassRef,
    pub customer: CustomerId,
    pub admission: String,
}

/// One customer's view (`queue.json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueView {
    pub queue: QueueState,
    pub drawn: bool,
    pub entry: Option<Entry>,
    /// 1-based place in the line, once drawn (late arrivals: at once).
    pub position: Option<i64>,
    /// Places before this one not yet admitted.
    pub ahead: Option<i64>,
    pub pass: Option<(PassRef, PassState, DateTime<Utc>)>,
    /// Stock the gate can still admit, less what open passes cover.
    pub units_left: i64,
    /// Covered by open passes.
    pub outstanding: i64,
    /// Units in unpaid orders, as last mirrored (`mirror_unpaid`).
    pub unpaid: i64,
}

/// Counts for the admin dashboard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounts {
    pub joined: i64,
    /// In the line, not yet admitted.
    pub waiting: i64,
    pub admitted: i64,
    /// Passes issued or claimed, not yet used or lapsed.
    pub open_passes: i64,
    pub outstanding_units: i64,
    pub used: i64,
    pub lapsed: i64,
}

/// Everything Postgres knows, to rebuild a queue Redis lost.
#[derive(Debug, Clone)]
pub struct QueueSnapshot {
    pub setup: QueueSetup,
    pub state: QueueState,
    pub drawn: bool,
    /// Every confirmed entry.
    pub entries: Vec<Entry>,
    /// When drawn: the whole line in order (the draw's order), else empty.
    pub line: Vec<Ticket>,
    /// Every admission, by number, with its state (issued ones are open).
    pub admissions: Vec<(Issued, PassState)>,
}

#[derive(Clone)]
pub struct WaitingRoom {
    #[allow(dead_code)]
    node: RedisNode,
    #[allow(dead_code)]
    prefix: String,
}

#[allow(unused_variables)]
impl WaitingRoom {
    pub fn new(node: RedisNode, prefix: &str) -> WaitingRoom {
        WaitingRoom {
            node,
            prefix: prefix.to_string(),
        }
    }

    /// Creates the queue (state `Pre`) unless it exists; before the draw an
    /// existing queue takes the new setup (an admin moved the start).
    /// Returns whether it was created.
    pub async fn prepare(&self, product: ProductId, setup: &QueueSetup) -> Result<bool, AppError> {
        unimplemented!("queue: prepare")
    }

    /// Whether Redis has this queue (false after Redis lost it: rebuild).
    pub async fn exists(&self, product: ProductId) -> Result<bool, AppError> {
        unimplemented!("queue: exists")
    }

    /// A place for `customer`: theirs from before, or a new one with `fresh`.
    pub async fn join(
        &self,
        product: ProductId,
        customer: CustomerId,
        fresh: &Ticket,
    ) -> Result<Joined, AppError> {
        unimplemented!("queue: join")
    }

    /// The entry's Postgres row committed.
    pub async fn confirm(&self, product: ProductId, ticket: &Ticket) -> Result<(), AppError> {
        unimplemented!("queue: confirm")
    }

    /// Takes back a place whose row could not be written (only while unconfirmed).
    pub async fn undo_join(
        &self,
        product: ProductId,
        customer: CustomerId,
        ticket: &Ticket,
    ) -> Result<(), AppError> {
        unimplemented!("queue: undo_join")
    }

    /// Unconfirmed entries older than `age` (their joiner died): the jobs
    /// insert their rows and confirm them.
    pub async fn unconfirmed(
        &self,
        product: ProductId,
        age: Duration,
    ) -> Result<Vec<Entry>, AppError> {
        unimplemented!("queue: unconfirmed")
    }

    pub async fn pre_queue(&self, product: ProductId) -> Result<PreQueue, AppError> {
        unimplemented!("queue: pre_queue")
    }

    /// Puts the pre-queue in `order` (positions 1..n; late arrivals already
    /// in the line move behind), opens admission (state `Open`, cursor 1).
    pub async fn draw(&self, product: ProductId, order: &[Ticket]) -> Result<Drawn, AppError> {
        unimplemented!("queue: draw")
    }

    /// Issues passes in line order while the queue is open, the next entry
    /// is confirmed, and open passes plus one more pass's units fit in what
    /// `bound` says can still be admitted. Each is appended to the log.
    pub async fn issue(&self, product: ProductId, bound: IssueBound) -> Result<Vec<Issued>, AppError> {
        unimplemented!("queue: issue")
    }

    /// The log's oldest events (at most `max`), not removed.
    pub async fn log(&self, product: ProductId, max: usize) -> Result<Vec<LogEvent>, AppError> {
        unimplemented!("queue: log")
    }

    /// Removes the log's leading events up to and including `through`
    /// (an event equal to it), once Postgres has them; concurrent drainers
    /// never remove an event another has not recorded.
    pub async fn ack_log(&self, product: ProductId, through: &LogEvent) -> Result<(), AppError> {
        unimplemented!("queue: ack_log")
    }

    /// Checks and takes `customer`'s pass for the purchase `admission`.
    pub async fn claim(
        &self,
        product: ProductId,
        customer: CustomerId,
        pass: &PassRef,
        admission: &str,
    ) -> Result<Claim, AppError> {
        unimplemented!("queue: claim")
    }

    /// The purchase under the claim wrote nothing: the pass is `Issued`
    /// again until its deadline (only while `admission` holds it).
    pub async fn unclaim(
        &self,
        product: ProductId,
        pass: &PassRef,
        admission: &str,
    ) -> Result<(), AppError> {
        unimplemented!("queue: unclaim")
    }

    /// The purchase under the claim committed: `Used`, its units no longer
    /// outstanding. Returns false when the pass was not claimed by `admission`.
    pub async fn settle(
        &self,
        product: ProductId,
        pass: &PassRef,
        admission: &str,
    ) -> Result<bool, AppError> {
        unimplemented!("queue: settle")
    }

    /// Lapses every issued pass past its deadline (logged), and returns the
    /// claimed ones past deadline plus `grace`, for the caller to settle or
    /// `lapse_claim` by what Postgres says.
    pub async fn lapse_due(
        &self,
        product: ProductId,
        grace: Duration,
    ) -> Result<Vec<StaleClaim>, AppError> {
        unimplemented!("queue: lapse_due")
    }

    /// A stale claim whose purchase never committed: `Lapsed` (logged).
    pub async fn lapse_claim(
        &self,
        product: ProductId,
        pass: &PassRef,
        admission: &str,
    ) -> Result<bool, AppError> {
        unimplemented!("queue: lapse_claim")
    }

    pub async fn status(&self, product: ProductId, customer: CustomerId) -> Result<QueueView, AppError> {
        unimplemented!("queue: status")
    }

    /// Pause, resume (`Open`), `SoldOut` or `Closed`. Resuming before the draw is refused (false).
    pub async fn set_state(&self, product: ProductId, state: QueueState) -> Result<bool, AppError> {
        unimplemented!("queue: set_state")
    }

    pub async fn counts(&self, product: ProductId) -> Result<QueueCounts, AppError> {
        unimplemented!("queue: counts")
    }

    /// The Postgres stock, for `IssueBound::Mirror`.
    pub async fn mirror_stock(&self, product: ProductId, units: i64) -> Result<(), AppError> {
        unimplemented!("queue: mirror_stock")
    }

    /// Units in unpaid orders (shown as held).
    pub async fn mirror_unpaid(&self, product: ProductId, units: i64) -> Result<(), AppError> {
        unimplemented!("queue: mirror_unpaid")
    }

    /// Rebuilds a queue Redis lost, from Postgres alone, once (under a
    /// `SET NX` key, so two instances do not both rebuild). Returns false
    /// when the queue exists or another caller is rebuilding.
    pub async fn rebuild(&self, product: ProductId, snapshot: &QueueSnapshot) -> Result<bool, AppError> {
        unimplemented!("queue: rebuild")
    }
}
