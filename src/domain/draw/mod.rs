//! The waiting room's draw (issue #16): a fair opening anyone can check.
//!
//! When the pre-queue opens the shop draws a secret [`DrawSeed`] and
//! publishes its [`SeedCommitment`]; every entry gets a public [`Ticket`]. At
//! the start the list of drawn tickets (those that joined before it) is
//! frozen and its SHA-256 published ([`frozen_list_sha256`]), so entries
//! cannot be added or dropped once the seed would tell where they land; then
//! the seed is revealed, and the order is the drawn tickets sorted by
//! HMAC-SHA256(seed, ticket), then the late arrivals in arrival order
//! ([`draw_order`]). [`DrawRecord`] is `draw.json`, and [`verify`] checks
//! one from the outside: the seed against its commitment, the drawn entries
//! against the frozen list, the order against the seed, the admissions
//! against the order. [`verify_with`] also holds it to what a joiner saved
//! ([`Claims`]): the commitment and their ticket.
//!
//! Pure computation, no Redis or Postgres: the queue that keeps entries and
//! issues passes (see `docs/waiting-room.md`) is built on these.

mod admissions;
mod checks;
mod claims;
mod fault;
mod frozen;
mod order;
mod record;
mod seed;
mod summary;
#[cfg(test)]
mod testing;
mod ticket;
mod verify;

pub use claims::{verify_with, Claims};
pub use fault::DrawFault;
pub use frozen::{frozen_list_sha256, EntriesCommitment};
pub use order::{draw_order, place_key, shuffle};
pub use record::{DrawAdmission, DrawEntry, DrawRecord, PassState};
pub use seed::{DrawSeed, SeedCommitment};
pub use summary::{vouched_for, Vouched};
pub use ticket::Ticket;
pub use verify::{verify, Check, DrawCounts, DrawVerdict};
