use super::admissions::check_admissions;
use super::checks::{check_entries, check_order, check_seed};
use super::frozen::check_frozen_list;
use super::{DrawFault, DrawRecord, PassState};

/// The questions a draw answers, each checked on its own so one failure
/// does not hide another. [`verify`] asks the ones about the record; the
/// claims ([`Check::is_claim`]) are asked by
/// [`verify_with`](super::verify_with), against what a joiner kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Check {
    /// The revealed seed is the one committed to.
    Seed,
    /// The published commitment is the one the joiner saved when they
    /// joined: without it a shop could publish a seed picked later, with
    /// a commitment to match.
    Commitment,
    /// Tickets and sequence numbers are unique, and each entry's `late`
    /// flag says whether it joined at or after the start.
    Entries,
    /// The drawn entries are the list frozen at the start, whose SHA-256
    /// was published before the seed was revealed.
    FrozenList,
    /// The published order is the one recomputed from the seed.
    Order,
    /// The admissions followed the published order.
    Admissions,
    /// The joiner's ticket is an entry, in the frozen list if drawn, and in
    /// the order.
    Ticket,
}

impl Check {
    /// In the order a report lists them.
    pub const ALL: [Check; 7] = [
        Check::Seed,
        Check::Commitment,
        Check::Entries,
        Check::FrozenList,
        Check::Order,
        Check::Admissions,
        Check::Ticket,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Check::Seed => "seed",
            Check::Commitment => "commitment",
            Check::Entries => "entries",
            Check::FrozenList => "frozen",
            Check::Order => "order",
            Check::Admissions => "admissions",
            Check::Ticket => "ticket",
        }
    }

    /// Checked only when the joiner brings what it needs (see
    /// [`Claims`](super::Claims)); the others hold the record to itself.
    pub fn is_claim(self) -> bool {
        matches!(self, Check::Commitment | Check::Ticket)
    }
}

/// What was counted, pass or fail, so a report can say what it looked at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrawCounts {
    pub entries: usize,
    pub drawn: usize,
    pub late: usize,
    pub order: usize,
    pub admissions: usize,
    pub outstanding: usize,
    pub used: usize,
    pub lapsed: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrawVerdict {
    pub counts: DrawCounts,
    /// Empty when the draw is fair as published.
    pub faults: Vec<DrawFault>,
}

impl DrawVerdict {
    pub fn passed(&self) -> bool {
        self.faults.is_empty()
    }

    pub fn faults_of(&self, check: Check) -> impl Iterator<Item = &DrawFault> {
        self.faults
            .iter()
            .filter(move |fault| fault.check() == check)
    }
}

/// Checks a published draw against itself. Positions and admission numbers
/// in the faults count from 1, as a person reads the list.
///
/// **The frozen list.** At the start the drawn entries (those that joined
/// before it) are frozen and the SHA-256 of their tickets
/// ([`frozen_list_sha256`](super::frozen_list_sha256)) is published before
/// the seed is revealed. Once the seed is out, that SHA-256 must be published
/// and be the one of the drawn entries listed, and the list cannot have been
/// frozen before the start. Before the seed is out there may be no list yet;
/// one that is published must already agree.
///
/// **The admission rule.** Taken in the order they were issued (the list's
/// order, whose `issued_at` never goes back), the admissions went to the
/// tickets of the published order one after another from its first place:
/// the n-th admission to the ticket at position n. Equivalently, each
/// admission goes to the first ticket of the order not admitted yet. So
/// nobody is admitted while someone ahead of them still waits, and nobody
/// ahead is passed over. A pass that lapses does not come back to its
/// ticket; its place goes to the next position. Admissions come at or after the start, and a late
/// arrival's at or after it joined. An entry that may be passed over (a
/// customer who left, say) would need its own published state; there is
/// none yet, so every gap counts as a fault.
///
/// The order check and the admission check are independent: admissions are
/// held to the order as published, and the order to the seed.
///
/// A record that agrees with itself is not yet one that was not rewritten:
/// whoever can write the database can pick a seed and publish its
/// commitment, or add an entry and publish the list's SHA-256 to match.
/// [`verify_with`](super::verify_with) also holds it to what a joiner saved.
pub fn verify(record: &DrawRecord) -> DrawVerdict {
    let mut faults = Vec::new();
    check_seed(record, &mut faults);
    check_entries(record, &mut faults);
    check_frozen_list(record, &mut faults);
    check_order(record, &mut faults);
    check_admissions(record, &mut faults);
    DrawVerdict {
        counts: count(record),
        faults,
    }
}

fn count(record: &DrawRecord) -> DrawCounts {
    let late = record.entries.iter().filter(|entry| entry.late).count();
    let in_state = |state: PassState| {
        record
            .admissions
            .iter()
            .filter(|admission| admission.state == state)
            .count()
    };
    DrawCounts {
        entries: record.entries.len(),
        drawn: record.entries.len() - late,
        late,
        order: record.order.len(),
        admissions: record.admissions.len(),
        outstanding: in_state(PassState::Issued),
        used: in_state(PassState::Used),
        lapsed: in_state(PassState::Lapsed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::draw::testing::fixture;
    use crate::domain::draw::DrawSeed;

    #[test]
    fn the_fixture_passes_with_its_counts() {
        let verdict = verify(&fixture());
        assert_eq!(verdict.faults, []);
        assert!(verdict.passed());
        assert_eq!(
            verdict.counts,
            DrawCounts {
                entries: 8,
                drawn: 6,
                late: 2,
                order: 8,
                admissions: 4,
                outstanding: 1,
                used: 2,
                lapsed: 1,
            }
        );
    }

    #[test]
    fn every_fault_belongs_to_one_check() {
        let mut record = fixture();
        record.seed = Some(DrawSeed::from_bytes([1; 32]));
        record.entries[0].late = true;
        record.admissions.swap(0, 2);
        let verdict = verify(&record);
        let checks: Vec<Check> = verdict.faults.iter().map(DrawFault::check).collect();
        assert!(checks.contains(&Check::Seed));
        assert!(checks.contains(&Check::Entries));
        assert!(checks.contains(&Check::FrozenList));
        assert!(checks.contains(&Check::Admissions));
        assert_eq!(verdict.faults_of(Check::Order).count(), 0);
        assert!(!checks.iter().any(|check| check.is_claim()));
    }

    /// A report prints them in a column of 11 characters.
    #[test]
    fn check_names_are_short_and_distinct() {
        let names: std::collections::HashSet<&str> =
            Check::ALL.iter().map(|check| check.name()).collect();
        assert_eq!(names.len(), Check::ALL.len());
        assert!(names.iter().all(|name| name.len() < 11), "{names:?}");
    }
}
