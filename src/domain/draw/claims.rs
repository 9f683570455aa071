//! A joiner's own evidence: what they saved when they joined, held against
//! the record. [`verify`] can only say that `draw.json` agrees with itself;
//! a record rewritten by someone with write access (a seed picked later and
//! its commitment with it, an entry dropped) agrees with itself too.

use super::{
    verify, DrawFault, DrawRecord, DrawVerdict, EntriesCommitment, SeedCommitment, Ticket,
};

/// What a joiner kept from the waiting room: the seed's commitment as it
/// was published when they joined, and their ticket. Each is checked only
/// when given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims {
    pub commitment: Option<SeedCommitment>,
    pub ticket: Option<Ticket>,
    /// The frozen list's commitment (`entries_sha256`) as published at the
    /// start, before the seed: the list cannot have changed since.
    pub entries: Option<EntriesCommitment>,
}

/// [`verify`], and the record held to the joiner's claims: the published
/// commitment is the one they saved ([`Check::Commitment`]), and their
/// ticket is an entry, in the frozen list if it was drawn, and in the order
/// once the seed is revealed ([`Check::Ticket`]).
///
/// [`Check::Commitment`]: super::Check::Commitment
/// [`Check::Ticket`]: super::Check::Ticket
pub fn verify_with(record: &DrawRecord, claims: &Claims) -> DrawVerdict {
    let mut verdict = verify(record);
    if let Some(saved) = claims.commitment {
        check_saved_commitment(record, saved, &mut verdict.faults);
    }
    if let Some(ticket) = &claims.ticket {
        check_ticket(record, ticket, &mut verdict.faults);
    }
    if let Some(saved) = claims.entries {
        if record.entries_sha256 != Some(saved) {
            verdict.faults.push(DrawFault::NotTheSavedList {
                saved,
                published: record.entries_sha256,
            });
        }
    }
    verdict
}

fn check_saved_commitment(record: &DrawRecord, saved: SeedCommitment, faults: &mut Vec<DrawFault>) {
    if record.seed_sha256 != saved {
        faults.push(DrawFault::NotTheSavedCommitment {
            saved,
            published: record.seed_sha256,
        });
    }
}

fn check_ticket(record: &DrawRecord, ticket: &Ticket, faults: &mut Vec<DrawFault>) {
    let Some(entry) = record.entries.iter().find(|entry| entry.ticket == *ticket) else {
        faults.push(DrawFault::TicketNotAnEntry(ticket.clone()));
        return;
    };
    // A drawn ticket is in the frozen list when the list's published
    // SHA-256 is the one of the drawn entries listed, this one among them.
    // A list not frozen yet (before the start) vouches for nobody, and the
    // frozen list check already fails one missing after the seed is out.
    let in_a_differing_list = record
        .entries_sha256
        .is_some_and(|published| !published.is_of(&record.drawn_tickets()));
    if !entry.late && in_a_differing_list {
        faults.push(DrawFault::TicketNotInFrozenList(ticket.clone()));
    }
    if record.seed.is_some() && !record.order.contains(ticket) {
        faults.push(DrawFault::TicketNotInOrder(ticket.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::draw::testing::{at, fixture, redrawn, refrozen, ticket};
    use crate::domain::draw::{Check, DrawEntry, DrawSeed};

    fn saved() -> Claims {
        Claims {
            commitment: Some(fixture().seed_sha256),
            ticket: Some(ticket("7K2M9QXH4D")),
            entries: None,
        }
    }

    fn claim_faults(record: &DrawRecord, claims: &Claims) -> Vec<DrawFault> {
        verify_with(record, claims).faults
    }

    #[test]
    fn the_fixture_passes_the_joiners_claims() {
        let verdict = verify_with(&fixture(), &saved());
        assert_eq!(verdict.faults, []);
        assert_eq!(verdict, verify(&fixture()));
        for late in ["M9CE3RV6SB", "N4PD2WQ7XA"] {
            let claims = Claims {
                ticket: Some(ticket(late)),
                ..saved()
            };
            assert_eq!(claim_faults(&fixture(), &claims), []);
        }
        assert_eq!(claim_faults(&fixture(), &Claims::default()), []);
    }

    #[test]
    fn a_seed_picked_later_with_its_commitment_fails_the_saved_commitment() {
        // Seed, commitment, order and admissions all rewritten together.
        let mut record = fixture();
        let picked = DrawSeed::from_bytes([42; 32]);
        record.seed_sha256 = picked.commitment();
        record.seed = Some(picked);
        let record = redrawn(record);
        assert!(verify(&record).passed(), "{:?}", verify(&record).faults);

        let found = claim_faults(&record, &saved());
        assert_eq!(
            found,
            [DrawFault::NotTheSavedCommitment {
                saved: fixture().seed_sha256,
                published: record.seed_sha256,
            }]
        );
        assert_eq!(found[0].check(), Check::Commitment);
        assert!(found[0].to_string().starts_with(&format!(
            "the published commitment {} is not the one you saved, {}",
            record.seed_sha256,
            fixture().seed_sha256
        )));
    }

    #[test]
    fn a_back_dated_entry_fails_the_frozen_list_and_the_drawn_ticket_claim() {
        let mut record = fixture();
        record.entries.push(DrawEntry {
            ticket: ticket("A7A7A7A7A7"),
            seq: 9,
            joined_at: at("2026-12-01T09:58:00Z"),
            late: false,
        });
        let record = redrawn(record);
        let verdict = verify_with(&record, &saved());
        assert!(matches!(
            &verdict.faults_of(Check::FrozenList).collect::<Vec<_>>()[..],
            [DrawFault::FrozenListDiffers { .. }]
        ));
        // The joiner's drawn ticket now sits in a list nobody froze.
        assert_eq!(
            verdict.faults_of(Check::Ticket).collect::<Vec<_>>(),
            [&DrawFault::TicketNotInFrozenList(ticket("7K2M9QXH4D"))]
        );
        // A late arrival was never in the frozen list, so has no claim on it.
        let late = Claims {
            ticket: Some(ticket("N4PD2WQ7XA")),
            ..saved()
        };
        assert_eq!(
            verify_with(&record, &late).faults_of(Check::Ticket).count(),
            0
        );
    }

    #[test]
    fn a_dropped_ticket_fails_the_claim_even_when_the_rest_agrees() {
        // The entry removed, and the order, admissions and frozen list
        // recomputed without it: only the joiner can tell.
        let mut record = fixture();
        record
            .entries
            .retain(|entry| entry.ticket != ticket("7K2M9QXH4D"));
        let record = refrozen(redrawn(record));
        assert!(verify(&record).passed(), "{:?}", verify(&record).faults);
        let found = claim_faults(&record, &saved());
        assert_eq!(found, [DrawFault::TicketNotAnEntry(ticket("7K2M9QXH4D"))]);
        assert_eq!(
            found[0].to_string(),
            "your ticket 7K2M9QXH4D is not among the entries of this draw"
        );
    }

    #[test]
    fn a_ticket_left_out_of_the_order_fails_the_claim() {
        let mut record = fixture();
        record
            .order
            .retain(|listed| *listed != ticket("7K2M9QXH4D"));
        let verdict = verify_with(&record, &saved());
        assert_eq!(
            verdict.faults_of(Check::Ticket).collect::<Vec<_>>(),
            [&DrawFault::TicketNotInOrder(ticket("7K2M9QXH4D"))]
        );
        // The order check fails too: the seed puts it back.
        assert!(verdict.faults_of(Check::Order).next().is_some());
    }

    #[test]
    fn before_the_start_a_ticket_needs_only_to_be_an_entry() {
        let mut record = fixture();
        record.seed = None;
        record.entries_sha256 = None;
        record.frozen_at = None;
        record.order.clear();
        record.admissions.clear();
        let verdict = verify_with(&record, &saved());
        assert_eq!(verdict.faults, [DrawFault::SeedNotRevealed]);
    }

    #[test]
    fn a_list_refrozen_after_the_start_fails_the_saved_list() {
        let saved_list = Claims {
            entries: fixture().entries_sha256,
            ..saved()
        };
        assert_eq!(claim_faults(&fixture(), &saved_list), []);
        let mut record = fixture();
        record.entries_sha256 = Some(crate::domain::draw::frozen_list_sha256(&[ticket(
            "7K2M9QXH4D",
        )]));
        let found = claim_faults(&record, &saved_list);
        assert!(
            found
                .iter()
                .any(|f| matches!(f, DrawFault::NotTheSavedList { .. })
                    && f.check() == Check::Commitment),
            "{found:?}"
        );
    }
}
