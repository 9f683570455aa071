use chrono::{DateTime, Utc};

use super::{Check, EntriesCommitment, SeedCommitment, Ticket};

/// One way a draw departs from its rules, in words a stranger can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DrawFault {
    #[error("the seed is not revealed yet (it is published at the start), so the order cannot be checked")]
    SeedNotRevealed,
    #[error("the revealed seed's SHA-256 is {actual}, not the published commitment {committed}")]
    SeedMismatch {
        committed: SeedCommitment,
        actual: SeedCommitment,
    },
    #[error("the published commitment {published} is not the one you saved, {saved}: the seed may have been picked after you joined")]
    NotTheSavedCommitment {
        saved: SeedCommitment,
        published: SeedCommitment,
    },
    #[error("the published frozen list {} is not the one you saved, {saved}: the pre-queue was changed after the start", published.map_or("(none)".to_string(), |p| p.to_string()))]
    NotTheSavedList {
        saved: EntriesCommitment,
        published: Option<EntriesCommitment>,
    },
    #[error("ticket {0} is listed as more than one entry")]
    DuplicateTicket(Ticket),
    #[error("sequence number {0} is given to more than one entry")]
    DuplicateSeq(u64),
    #[error("ticket {ticket} joined at {joined_at_}, {when} the start at {starts_at_}, but is marked {marked}", when = if *.joined_before { "before" } else { "at or after" }, marked = if *.joined_before { "late" } else { "drawn" }, joined_at_ = rfc3339(.joined_at), starts_at_ = rfc3339(.starts_at))]
    LateFlag {
        ticket: Ticket,
        joined_at: DateTime<Utc>,
        starts_at: DateTime<Utc>,
        joined_before: bool,
    },
    #[error("the seed is revealed, but no SHA-256 of the list of drawn tickets frozen at the start is published (entries_sha256 is null), so nothing shows the list was fixed before the seed was known")]
    ListNotFrozen,
    #[error("the {drawn} drawn entries' tickets hash to {recomputed}, not to the SHA-256 of the list frozen at the start, {published}: an entry was added, dropped or relabelled after the freeze")]
    FrozenListDiffers {
        published: EntriesCommitment,
        recomputed: EntriesCommitment,
        drawn: usize,
    },
    #[error("the list of drawn tickets was frozen at {frozen_at_}, before the start at {starts_at_}: entries could still join the draw after the list was frozen", frozen_at_ = rfc3339(.frozen_at), starts_at_ = rfc3339(.starts_at))]
    FrozenBeforeStart {
        frozen_at: DateTime<Utc>,
        starts_at: DateTime<Utc>,
    },
    #[error("the order lists {published} tickets; the seed and entries give {recomputed}")]
    OrderLength { published: usize, recomputed: usize },
    #[error("position {position} of the order: published {published}, recomputed from the seed {recomputed} ({differing} positions differ in all)")]
    OrderDiffers {
        position: usize,
        published: Ticket,
        recomputed: Ticket,
        differing: usize,
    },
    #[error("admission {number} went to {ticket}, which is not an entry of this draw")]
    NotAnEntry { number: usize, ticket: Ticket },
    #[error("admission {number} went to {ticket}, which is not in the published order")]
    NotInOrder { number: usize, ticket: Ticket },
    #[error("admission {number} went to {ticket}, admitted already by admission {earlier}")]
    AdmittedTwice {
        number: usize,
        ticket: Ticket,
        earlier: usize,
    },
    #[error("admission {number} went to {ticket} at position {position} while {next} at position {next_position} was next in line")]
    OutOfOrder {
        number: usize,
        ticket: Ticket,
        position: usize,
        next: Ticket,
        next_position: usize,
    },
    #[error("admission {number} ({ticket}) was issued at {issued_at_}, before the start at {starts_at_}", starts_at_ = rfc3339(.starts_at), issued_at_ = rfc3339(.issued_at))]
    IssuedBeforeStart {
        number: usize,
        ticket: Ticket,
        issued_at: DateTime<Utc>,
        starts_at: DateTime<Utc>,
    },
    #[error("admission {number} ({ticket}) was issued at {issued_at_}, before its ticket joined at {joined_at_}", joined_at_ = rfc3339(.joined_at), issued_at_ = rfc3339(.issued_at))]
    IssuedBeforeJoining {
        number: usize,
        ticket: Ticket,
        issued_at: DateTime<Utc>,
        joined_at: DateTime<Utc>,
    },
    #[error("admission {number} ({ticket}) is listed as issued at {issued_at_}, earlier than admission {previous} at {previous_at_}", issued_at_ = rfc3339(.issued_at), previous_at_ = rfc3339(.previous_at))]
    IssuedOutOfTime {
        number: usize,
        ticket: Ticket,
        issued_at: DateTime<Utc>,
        previous: usize,
        previous_at: DateTime<Utc>,
    },
    #[error("your ticket {0} is not among the entries of this draw")]
    TicketNotAnEntry(Ticket),
    #[error("your ticket {0} is listed as drawn, but not in the list frozen at the start (the drawn entries do not hash to its SHA-256), so nothing shows it was drawn with the others")]
    TicketNotInFrozenList(Ticket),
    #[error("your ticket {0} is an entry, but not in the published order")]
    TicketNotInOrder(Ticket),
}

/// Times as `draw.json` writes them, so a fault can be found in the document.
pub(super) fn rfc3339(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

impl DrawFault {
    pub fn check(&self) -> Check {
        match self {
            DrawFault::SeedNotRevealed | DrawFault::SeedMismatch { .. } => Check::Seed,
            DrawFault::NotTheSavedCommitment { .. } | DrawFault::NotTheSavedList { .. } => {
                Check::Commitment
            }
            DrawFault::DuplicateTicket(_)
            | DrawFault::DuplicateSeq(_)
            | DrawFault::LateFlag { .. } => Check::Entries,
            DrawFault::ListNotFrozen
            | DrawFault::FrozenListDiffers { .. }
            | DrawFault::FrozenBeforeStart { .. } => Check::FrozenList,
            DrawFault::OrderLength { .. } | DrawFault::OrderDiffers { .. } => Check::Order,
            DrawFault::NotAnEntry { .. }
            | DrawFault::NotInOrder { .. }
            | DrawFault::AdmittedTwice { .. }
            | DrawFault::OutOfOrder { .. }
            | DrawFault::IssuedBeforeStart { .. }
            | DrawFault::IssuedBeforeJoining { .. }
            | DrawFault::IssuedOutOfTime { .. } => Check::Admissions,
            DrawFault::TicketNotAnEntry(_)
            | DrawFault::TicketNotInFrozenList(_)
            | DrawFault::TicketNotInOrder(_) => Check::Ticket,
        }
    }
}
