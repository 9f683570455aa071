//! The record's own rules: the seed against its commitment, the entries'
//! uniqueness and late flags, and the order against the seed.

use std::collections::HashSet;

use super::{draw_order, DrawFault, DrawRecord};

pub(super) fn check_seed(record: &DrawRecord, faults: &mut Vec<DrawFault>) {
    match &record.seed {
        None => faults.push(DrawFault::SeedNotRevealed),
        Some(seed) if !record.seed_sha256.is_of(seed) => faults.push(DrawFault::SeedMismatch {
            committed: record.seed_sha256,
            actual: seed.commitment(),
        }),
        Some(_) => {}
    }
}

pub(super) fn check_entries(record: &DrawRecord, faults: &mut Vec<DrawFault>) {
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

pub(super) fn check_order(record: &DrawRecord, faults: &mut Vec<DrawFault>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::draw::testing::{faults, fixture, refrozen, ticket};
    use crate::domain::draw::{verify, Check, DrawSeed, SeedCommitment};

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
    fn entries_must_be_unique_and_honestly_marked_late() {
        let mut relabelled = fixture();
        // A late arrival passed off as drawn. The frozen list catches that
        // (see the frozen list's tests); here its SHA-256 and the order are
        // recomputed from the entries as published, so that only the flag
        // check and the start time are left to catch it.
        relabelled.entries[7].late = false;
        let seed = relabelled.seed.clone().unwrap();
        relabelled.order = crate::domain::draw::draw_order(&seed, &relabelled.entries);
        relabelled.admissions.clear();
        let relabelled = refrozen(relabelled);
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
}
