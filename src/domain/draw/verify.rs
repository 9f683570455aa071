use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::{draw_order, DrawRecord, PassState, SeedCommitment, Ticket};

/// The four questions a draw answers, each checked on its own so one
/// failure does not hide another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Check {
    /// The revealed seed is the one committed to.
    Seed,
    /// Tickets and sequence numbers are unique, and each entry's `late`
    /// flag says whether it joined at or after the start.
    Entries,
    /// The published order is the one recomputed from the seed.
    Order,
    /// The admissions followed the published order.
    Admissions,
}

impl Check {
    pub const ALL: [Check; 4] = [Check::Seed, Check::Entries, Check::Order, Check::Admissions];

    pub fn name(self) -> &'static str {
        match self {
            Check::Seed => "seed",
            Check::Entries => "entries",
            Check::Order => "order",
            Check::Admissions => "admissions",
        }
    }
}

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
}

/// Times as `draw.json` writes them, so a fault can be found in the document.
fn rfc3339(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

impl DrawFault {
    pub fn check(&self) -> Check {
        match self {
            DrawFault::SeedNotRevealed | DrawFault::SeedMismatch { .. } => Check::Seed,
            DrawFault::DuplicateTicket(_)
            | DrawFault::DuplicateSeq(_)
            | DrawFault::LateFlag { .. } => Check::Entries,
            DrawFault::OrderLength { .. } | DrawFault::OrderDiffers { .. } => Check::Order,
            DrawFault::NotAnEntry { .. }
            | DrawFault::NotInOrder { .. }
            | DrawFault::AdmittedTwice { .. }
            | DrawFault::OutOfOrder { .. }
            | DrawFault::IssuedBeforeStart { .. }
            | DrawFault::IssuedBeforeJoining { .. }
            | DrawFault::IssuedOutOfTime { .. } => Check::Admissions,
        }
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

/// Checks a published draw. Positions and admission numbers in the faults
/// count from 1, as a person reads the list.
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
pub fn verify(record: &DrawRecord) -> DrawVerdict {
    let mut faults = Vec::new();
    check_seed(record, &mut faults);
    check_entries(record, &mut faults);
    check_order(record, &mut faults);
    check_admissions(record, &mut faults);
    DrawVerdict {
        counts: count(record),
        faults,
    }
}

fn check_seed(record: &DrawRecord, faults: &mut Vec<DrawFault>) {
    match &record.seed {
        None => faults.push(DrawFault::SeedNotRevealed),
        Some(seed) if !record.seed_sha256.is_of(seed) => faults.push(DrawFault::SeedMismatch {
            committed: record.seed_sha256,
            actual: seed.commitment(),
        }),
        Some(_) => {}
    }
}

fn check_entries(record: &DrawRecord, faults: &mut Vec<DrawFault>) {
    let mut tickets = HashSet::new();
    let mut seqs = HashSet::new();
    for entry in &record.entries {
        if !tickets.insert(&entry.ticket) {
            faults.push(DrawFault::DuplicateTicket(entry.ticket.clone()));
        }
        if !seqs.insert(entry.seq) {
            faults.push(DrawFault::DuplicateSeq(entry.seq));
        }
        let joined_before = entry.joined_at < record.starts_at;
        if entry.late == joined_before {
            faults.push(DrawFault::LateFlag {
                ticket: entry.ticket.clone(),
                joined_at: entry.joined_at,
                starts_at: record.starts_at,
                joined_before,
            });
        }
    }
}

fn check_order(record: &DrawRecord, faults: &mut Vec<DrawFault>) {
    // Without the committed seed there is nothing to recompute from; the
    // seed check has said why.
    let Some(seed) = record
        .seed
        .as_ref()
        .filter(|seed| record.seed_sha256.is_of(seed))
    else {
        return;
    };
    let recomputed = draw_order(seed, &record.entries);
    if recomputed.len() != record.order.len() {
        faults.push(DrawFault::OrderLength {
            published: record.order.len(),
            recomputed: recomputed.len(),
        });
    }
    let mut differing = recomputed
        .iter()
        .zip(&record.order)
        .enumerate()
        .filter(|(_, (want, got))| want != got);
    if let Some((index, (want, got))) = differing.next() {
        faults.push(DrawFault::OrderDiffers {
            position: index + 1,
            published: got.clone(),
            recomputed: want.clone(),
            differing: 1 + differing.count(),
        });
    }
}

fn check_admissions(record: &DrawRecord, faults: &mut Vec<DrawFault>) {
    let position: HashMap<&Ticket, usize> = record
        .order
        .iter()
        .enumerate()
        .map(|(index, ticket)| (ticket, index))
        .rev() // a duplicated ticket keeps its first place
        .collect();
    let joined: HashMap<&Ticket, DateTime<Utc>> = record
        .entries
        .iter()
        .map(|entry| (&entry.ticket, entry.joined_at))
        .collect();
    let mut admitted: HashMap<&Ticket, usize> = HashMap::new();
    // The first place of the order not admitted yet: measured from where the
    // admissions actually stand, one fault does not make every later
    // admission look wrong too.
    let mut next = 0;
    let mut previous: Option<(usize, DateTime<Utc>)> = None;
    for (index, admission) in record.admissions.iter().enumerate() {
        let number = index + 1;
        let ticket = &admission.ticket;
        if let Some((previous, previous_at)) = previous {
            if admission.issued_at < previous_at {
                faults.push(DrawFault::IssuedOutOfTime {
                    number,
                    ticket: ticket.clone(),
                    issued_at: admission.issued_at,
                    previous,
                    previous_at,
                });
            }
        }
        previous = Some((number, admission.issued_at));
        if admission.issued_at < record.starts_at {
            faults.push(DrawFault::IssuedBeforeStart {
                number,
                ticket: ticket.clone(),
                issued_at: admission.issued_at,
                starts_at: record.starts_at,
            });
        }
        match joined.get(ticket) {
            None => faults.push(DrawFault::NotAnEntry {
                number,
                ticket: ticket.clone(),
            }),
            Some(&joined_at) if admission.issued_at < joined_at => {
                faults.push(DrawFault::IssuedBeforeJoining {
                    number,
                    ticket: ticket.clone(),
                    issued_at: admission.issued_at,
                    joined_at,
                })
            }
            Some(_) => {}
        }
        if let Some(&earlier) = admitted.get(ticket) {
            faults.push(DrawFault::AdmittedTwice {
                number,
                ticket: ticket.clone(),
                earlier,
            });
            continue;
        }
        admitted.insert(ticket, number);
        match position.get(ticket) {
            // An entry missing from the order fails the order check too;
            // a ticket that is no entry at all has been reported above.
            None if joined.contains_key(ticket) => faults.push(DrawFault::NotInOrder {
                number,
                ticket: ticket.clone(),
            }),
            None => {}
            // Every place before `next` is admitted and this ticket is not,
            // so `place > next` and `next` is inside the order.
            Some(&place) if place != next => faults.push(DrawFault::OutOfOrder {
                number,
                ticket: ticket.clone(),
                position: place + 1,
                next: record.order[next].clone(),
                next_position: next + 1,
            }),
            Some(_) => {}
        }
        while record
            .order
            .get(next)
            .is_some_and(|ticket| admitted.contains_key(ticket))
        {
            next += 1;
        }
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
    use crate::domain::draw::{DrawAdmission, DrawSeed};

    fn fixture() -> DrawRecord {
        serde_json::from_str(include_str!("../../../tests/fixtures/draw.json")).unwrap()
    }

    fn ticket(raw: &str) -> Ticket {
        Ticket::parse(raw).unwrap()
    }

    fn at(raw: &str) -> DateTime<Utc> {
        raw.parse().unwrap()
    }

    fn faults(record: &DrawRecord) -> Vec<DrawFault> {
        verify(record).faults
    }

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
    fn a_seed_other_than_the_committed_one_fails() {
        let mut record = fixture();
        record.seed = Some(DrawSeed::from_bytes([7; 32]));
        let found = faults(&record);
        assert!(
            matches!(&found[..], [DrawFault::SeedMismatch { committed, actual }]
                if *committed == record.seed_sha256
                    && *actual == DrawSeed::from_bytes([7; 32]).commitment()),
            "{found:?}"
        );
    }

    #[test]
    fn a_commitment_other_than_the_seeds_fails() {
        let mut record = fixture();
        // The SHA-256 of the seed's hex text, a plausible slip.
        record.seed_sha256 = SeedCommitment::parse_hex(
            "6c86c6aac5fb24bcf5d9939cb7d7d5645ce39418f449e03b262dd4fa14b4b92b",
        )
        .unwrap();
        assert!(matches!(
            &faults(&record)[..],
            [DrawFault::SeedMismatch { .. }]
        ));
    }

    #[test]
    fn an_unrevealed_seed_fails_but_the_admissions_are_still_checked() {
        let mut record = fixture();
        record.seed = None;
        assert_eq!(faults(&record), [DrawFault::SeedNotRevealed]);
        record.admissions.swap(0, 1);
        let found = faults(&record);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[1].check(), Check::Admissions);
    }

    #[test]
    fn a_tampered_order_fails() {
        let original = fixture();

        // Two places nobody has been admitted to yet.
        let mut swapped = original.clone();
        swapped.order.swap(4, 5);
        assert_eq!(
            faults(&swapped),
            [DrawFault::OrderDiffers {
                position: 5,
                published: ticket("7K2M9QXH4D"),
                recomputed: ticket("B3TRW8N5ZP"),
                differing: 2,
            }]
        );

        // A late arrival moved to the front (and, the admissions being held
        // to the published order, they fail too).
        let mut promoted = original.clone();
        let late = promoted.order.remove(6);
        promoted.order.insert(0, late);
        let verdict = verify(&promoted);
        assert!(matches!(
            &verdict.faults_of(Check::Order).collect::<Vec<_>>()[..],
            [DrawFault::OrderDiffers {
                position: 1,
                differing: 7,
                ..
            }]
        ));
        assert!(verdict.faults_of(Check::Admissions).next().is_some());

        let mut dropped = original.clone();
        dropped.order.pop();
        assert_eq!(
            faults(&dropped),
            [DrawFault::OrderLength {
                published: 7,
                recomputed: 8
            }]
        );

        let mut padded = original;
        padded.order.push(ticket("A7A7A7A7A7"));
        assert_eq!(
            faults(&padded),
            [DrawFault::OrderLength {
                published: 9,
                recomputed: 8
            }]
        );
    }

    #[test]
    fn an_admission_out_of_order_fails_once() {
        let mut record = fixture();
        let (first, second) = (
            record.admissions[0].ticket.clone(),
            record.admissions[1].ticket.clone(),
        );
        record.admissions[0].ticket = second.clone();
        record.admissions[1].ticket = first.clone();
        assert_eq!(
            faults(&record),
            [DrawFault::OutOfOrder {
                number: 1,
                ticket: second,
                position: 2,
                next: first,
                next_position: 1,
            }]
        );
    }

    #[test]
    fn passing_over_someone_fails() {
        let mut record = fixture();
        // The lapsed pass's place went to the next in line; this one skips it.
        record.admissions.remove(1);
        assert!(matches!(
            &faults(&record)[..],
            [
                DrawFault::OutOfOrder {
                    number: 2,
                    position: 3,
                    next_position: 2,
                    ..
                },
                ..
            ]
        ));
    }

    #[test]
    fn a_ticket_admitted_that_is_no_entry_fails() {
        let mut record = fixture();
        record.admissions.push(DrawAdmission {
            ticket: ticket("A7A7A7A7A7"),
            issued_at: at("2026-12-01T10:04:00Z"),
            state: PassState::Issued,
        });
        assert_eq!(
            faults(&record),
            [DrawFault::NotAnEntry {
                number: 5,
                ticket: ticket("A7A7A7A7A7")
            }]
        );
    }

    #[test]
    fn a_second_admission_of_a_lapsed_ticket_fails() {
        let mut record = fixture();
        let lapsed = record.admissions[1].clone();
        record.admissions.push(DrawAdmission {
            issued_at: at("2026-12-01T10:04:00Z"),
            ..lapsed
        });
        assert!(matches!(
            &faults(&record)[..],
            [DrawFault::AdmittedTwice {
                number: 5,
                earlier: 2,
                ..
            }]
        ));
    }

    #[test]
    fn admissions_must_come_after_the_start_and_the_join_and_in_time_order() {
        let mut early = fixture();
        early.admissions[0].issued_at = at("2026-12-01T09:59:59.9995Z");
        assert!(matches!(
            &faults(&early)[..],
            [DrawFault::IssuedBeforeStart { number: 1, .. }]
        ));

        let mut backwards = fixture();
        backwards.admissions[3].issued_at = at("2026-12-01T10:01:00Z");
        assert!(matches!(
            &faults(&backwards)[..],
            [DrawFault::IssuedOutOfTime {
                number: 4,
                previous: 3,
                ..
            }]
        ));

        // Everyone drawn admitted, then a late arrival before it had joined.
        let mut record = fixture();
        record.entries[6].joined_at = at("2026-12-01T10:02:00.600Z");
        record.entries[7].joined_at = at("2026-12-01T10:02:00.700Z");
        for (number, place) in (5..=7).zip(4..) {
            record.admissions.push(DrawAdmission {
                ticket: record.order[place].clone(),
                issued_at: at("2026-12-01T10:02:00.500Z"),
                state: PassState::Issued,
            });
            assert_eq!(record.admissions.len(), number);
        }
        assert!(matches!(
            &faults(&record)[..],
            [DrawFault::IssuedBeforeJoining { number: 7, .. }]
        ));
    }

    #[test]
    fn entries_must_be_unique_and_honestly_marked_late() {
        let mut relabelled = fixture();
        // A late arrival passed off as drawn: the order recomputed from the
        // entries as published would even agree, so only the flag check and
        // the start time catch it.
        relabelled.entries[7].late = false;
        let seed = relabelled.seed.clone().unwrap();
        relabelled.order = crate::domain::draw::draw_order(&seed, &relabelled.entries);
        relabelled.admissions.clear();
        let found = faults(&relabelled);
        assert!(
            matches!(
                &found[..],
                [DrawFault::LateFlag {
                    joined_before: false,
                    ..
                }]
            ),
            "{found:?}"
        );
        assert_eq!(
            found[0].to_string(),
            "ticket N4PD2WQ7XA joined at 2026-12-01T10:00:03Z, at or after the start at \
             2026-12-01T10:00:00Z, but is marked drawn"
        );

        let mut early_marked_late = fixture();
        early_marked_late.entries[0].late = true;
        assert!(faults(&early_marked_late).iter().any(|f| matches!(
            f,
            DrawFault::LateFlag {
                joined_before: true,
                ..
            }
        )));

        let mut twice = fixture();
        twice.entries[1].ticket = twice.entries[0].ticket.clone();
        twice.entries[2].seq = twice.entries[0].seq;
        let found = faults(&twice);
        assert!(found.contains(&DrawFault::DuplicateTicket(ticket("7K2M9QXH4D"))));
        assert!(found.contains(&DrawFault::DuplicateSeq(1)));
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
        assert!(checks.contains(&Check::Admissions));
        assert_eq!(verdict.faults_of(Check::Order).count(), 0);
    }
}
