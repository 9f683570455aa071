//! The waiting room's use cases (issue #16): joining, a customer's standing,
//! the draw at the start, passes issued in order, lapses, and keeping
//! Postgres (what the queue is rebuilt from and audited against) in step
//! with Redis (`crate::queue`, what every instance reads).
//!
//! - `sale`: what a queue-mode sale is (its opening, start, end, setup).
//! - `opening`: the seed committed and the Redis queue prepared, or rebuilt
//!   from the three tables when Redis lost it.
//! - `join` and `entries`: a place in Redis, its row committed with the
//!   process's other joins in one insert.
//! - `standing`: one customer's status, without Postgres.
//! - `passes` and `admissions`: a buy's claim on its pass, and each
//!   admission's record in Postgres.
//! - `tick`: what every process does every `QUEUE_TICK_MS` (the draw,
//!   issuing, lapses, closing, the record).
//! - `local`: what this process remembers between calls.

mod admissions;
mod entries;
mod join;
mod local;
mod opening;
mod passes;
mod sale;
mod standing;
mod tick;

pub use admissions::{
    drain_log, order_under_claim, pass_admission, record_used, resolve_stale,
    settle_uses_a_rebuild_missed, Resolved,
};
pub use entries::{entries_in_record, record_entries};
pub use join::{join, queue_sale};
pub use opening::{ensure_queue, ensure_seed, read_record, snapshot, QueueRecord, Readied};
pub use passes::{claim, unclaim};
pub use sale::QueueSale;
pub use standing::{status, QueueStatus, Standing};
pub use tick::{run_forever, run_once, TickReport};
