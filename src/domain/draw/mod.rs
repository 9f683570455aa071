//! The waiting room's draw (issue #16): a fair opening anyone can check.
//!
//! When the pre-queue opens the shop draws a secret [`DrawSeed`] and
//! publishes its [`SeedCommitment`]; every entry gets a public [`Ticket`].
//!
//! Pure computation, no Redis or Postgres: the queue that keeps entries and
//! issues passes (see `docs/waiting-room.md`) is built on these.

mod seed;
mod ticket;

pub use seed::{DrawSeed, SeedCommitment};
pub use ticket::Ticket;
