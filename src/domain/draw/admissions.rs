//! The admissions against the published order (the rule is on
//! [`verify`](super::verify)).

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::{DrawFault, DrawRecord, Ticket};

pub(super) fn check_admissions(record: &DrawRecord, faults: &mut Vec<DrawFault>) {
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

#[cfg(test)]
mod tests {
    use crate::domain::draw::testing::{at, faults, fixture, ticket};
    use crate::domain::draw::{DrawAdmission, DrawFault, PassState};

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
}
