//! The waiting room (issues #16, #37): a sale in queue mode lets customers
//! join before the start, draws their order from a seed committed to in
//! advance, and admits them in that order with passes that never cover
//! more units than can still be sold.
//!
//! Every fact is decided in Postgres, in the transaction that acts on it:
//! a place is a `queue_entries` row, the draw writes every pre-queue
//! place's position in one transaction timed by the database's clock, a
//! pass is a `queue_admissions` row issued from the stock in one
//! transaction, and it is used inside the order's own transaction
//! (`checkout`). Process memory (`Rooms`) only caches what polls read: a
//! miss reads one indexed row; losing it loses nothing.
//!
//! # Layout
//! - `sale`: what a queue-mode sale is (its opening, start, end).
//! - `rooms` and `places`: this process's cache of each room (one snapshot
//!   per room, read at most every `FRESH_FOR`) and of customers' places.
//! - `join` and `enter`: a place, committed with the process's other joins
//!   in one transaction, each room decided by the database's clock.
//! - `draw`: opening a room (the seed's commitment), freezing the
//!   pre-queue at the start and revealing the seed with the positions.
//! - `passes`: issuing passes from the stock, lapses, and the pass a
//!   purchase presents.
//! - `status`: one customer's standing, for the waiting page and `queue.json`.
//! - `record`: the published draw (`draw.json`).
//! - `admin`: the dashboard and pausing or resuming admission.
//! - `tick`: what every process does every `QUEUE_TICK_MS`.

mod admin;
mod draw;
mod enter;
mod join;
mod passes;
mod places;
mod record;
mod rooms;
mod sale;
mod status;
mod tick;

pub use crate::domain::PASS_GRACE;
pub use admin::{queue_overviews, set_admission_paused, DrawSummary, QueueOverview, RoomCounts};
pub use draw::{draw, ensure_room, hold_room, Drawn};
pub use join::{join, join_at_door};
pub use passes::{check_presented, issue, lock_open_passes, Issued, OpenPass};
pub use record::draw_record;
pub use rooms::{RoomSnapshot, Rooms};
pub use sale::{queue_sale, QueueSale};
pub use status::{before_opening, status, QueueStatus, WaitEstimate};
pub use tick::{run_forever, run_once, run_until, TickReport};

/// The advisory lock class of a room: joins before the start hold it
/// shared, the freeze at the start holds it alone, so the frozen list is
/// exactly the places committed before it.
const ROOM_LOCK: i32 = 0x5752; // "WR"
/// The advisory lock class of a room's issuer: one issuer per room at a time.
const ISSUER_LOCK: i32 = 0x5749; // "WI"
