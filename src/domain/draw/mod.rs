//! The waiting room's draw (issue #16): a fair opening anyone can check.
//!
//! When the pre-queue opens the shop draws a secret [`DrawSeed`] and
//! publishes its [`SeedCommitment`]; every entry gets a public [`Ticket`]. At
//! the start the seed is revealed, and the order is the drawn tickets sorted
//! by HMAC-SHA256(seed, ticket), then the late arrivals in arrival order
//! ([`draw_order`]). [`DrawRecord`] is `draw.json`, and [`verify`] checks one
//! from the outside: the seed against its commitment, the order against the
//! seed, the admissions against the order.
//!
//! Pure computation, no Redis or Postgres: the queue that keeps entries and
//! issues passes (see `docs/waiting-room.md`) is built on these.

mod order;
mod record;
mod seed;
mod ticket;
mod verify;

pub use order::{draw_order, place_key, shuffle};
pub use record::{DrawAdmission, DrawEntry, DrawRecord, PassState};
pub use seed::{DrawSeed, SeedCommitment};
pub use ticket::Ticket;
pub use verify::{verify, Check, DrawCounts, DrawFault, DrawVerdict};
