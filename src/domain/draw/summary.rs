//! What a check that found no fault vouches for, in words: the faults say
//! what is wrong, these say what was looked at when nothing is.

use super::fault::rfc3339;
use super::{Check, Claims, DrawRecord, DrawVerdict, Ticket};

/// A check with no fault in a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vouched {
    /// It ran, and this is what it vouches for.
    For(String),
    /// It could not run on this record, and why.
    Skipped(&'static str),
    /// A claim check the joiner brought nothing for.
    NotClaimed,
}

/// What `check` vouches for in `verdict`, the [`verify_with`](super::verify_with)
/// of `record` and `claims`. Meant for checks with no fault.
pub fn vouched_for(
    check: Check,
    record: &DrawRecord,
    claims: &Claims,
    verdict: &DrawVerdict,
) -> Vouched {
    let counts = &verdict.counts;
    Vouched::For(match check {
        Check::Seed => "revealed; its SHA-256 is the published commitment".into(),
        Check::Commitment if claims.commitment.is_none() => return Vouched::NotClaimed,
        Check::Commitment => "the published commitment is the one you saved".into(),
        Check::Entries => format!(
            "{} ({} drawn at the start, {} late); tickets and sequence numbers unique; \
             late flags agree with the join times",
            counts.entries, counts.drawn, counts.late
        ),
        Check::FrozenList => match &record.entries_sha256 {
            Some(sha256) => format!(
                "the {} drawn tickets are the list frozen at {}, SHA-256 {sha256}",
                counts.drawn,
                record
                    .frozen_at
                    .map_or("a time not published".into(), |at| rfc3339(&at)),
            ),
            None => return Vouched::Skipped("not frozen yet: the list is frozen at the start"),
        },
        Check::Order if verdict.faults_of(Check::Seed).next().is_some() => {
            return Vouched::Skipped("not checked: needs the committed seed")
        }
        Check::Order => format!(
            "{} tickets, as recomputed from the seed and the entries",
            record.order.len()
        ),
        Check::Admissions => format!(
            "{} issued ({} used, {} lapsed, {} outstanding), to the first {} tickets \
             of the order in turn",
            counts.admissions, counts.used, counts.lapsed, counts.outstanding, counts.admissions
        ),
        Check::Ticket => match &claims.ticket {
            Some(ticket) => place_of(record, ticket),
            None => return Vouched::NotClaimed,
        },
    })
}

/// Where a ticket stands: its entry, whether it was drawn, its place in
/// the order and its admission.
fn place_of(record: &DrawRecord, ticket: &Ticket) -> String {
    let Some(entry) = record.entries.iter().find(|entry| entry.ticket == *ticket) else {
        return format!("{ticket} is not an entry");
    };
    let drawn = match (entry.late, record.entries_sha256.is_some()) {
        (true, _) => "a late arrival",
        (false, true) => "drawn at the start and in the frozen list",
        (false, false) => "drawn at the start (the list is not frozen yet)",
    };
    let place = match record.order.iter().position(|listed| listed == ticket) {
        Some(index) => format!(", position {} of {}", index + 1, record.order.len()),
        None => "; the order is not out yet".into(),
    };
    let admitted = record
        .admissions
        .iter()
        .position(|admission| admission.ticket == *ticket);
    let admission = match admitted {
        Some(index) => format!(
            "; admitted by admission {} ({})",
            index + 1,
            record.admissions[index].state.as_str()
        ),
        None if record.order.is_empty() => String::new(),
        None => "; not admitted yet".into(),
    };
    format!("{ticket} is entry {}, {drawn}{place}{admission}", entry.seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::draw::testing::{fixture, ticket};
    use crate::domain::draw::verify_with;

    fn vouched(check: Check, record: &DrawRecord, claims: &Claims) -> Vouched {
        vouched_for(check, record, claims, &verify_with(record, claims))
    }

    fn claiming(raw: &str) -> Claims {
        Claims {
            commitment: Some(fixture().seed_sha256),
            ticket: Some(ticket(raw)),
            entries: None,
        }
    }

    #[test]
    fn a_ticket_is_placed_in_the_draw() {
        let record = fixture();
        let for_ticket = |raw| vouched(Check::Ticket, &record, &claiming(raw));
        assert_eq!(
            for_ticket("0A1B2C3D4E"),
            Vouched::For(
                "0A1B2C3D4E is entry 3, drawn at the start and in the frozen list, \
                 position 2 of 8; admitted by admission 2 (lapsed)"
                    .into()
            )
        );
        assert_eq!(
            for_ticket("N4PD2WQ7XA"),
            Vouched::For(
                "N4PD2WQ7XA is entry 8, a late arrival, position 8 of 8; not admitted yet".into()
            )
        );

        let mut before = fixture();
        before.seed = None;
        before.entries_sha256 = None;
        before.order.clear();
        before.admissions.clear();
        assert_eq!(
            vouched(Check::Ticket, &before, &claiming("7K2M9QXH4D")),
            Vouched::For(
                "7K2M9QXH4D is entry 1, drawn at the start (the list is not frozen yet); \
                 the order is not out yet"
                    .into()
            )
        );
        assert_eq!(
            vouched(Check::FrozenList, &before, &Claims::default()),
            Vouched::Skipped("not frozen yet: the list is frozen at the start")
        );
    }

    #[test]
    fn claims_not_brought_are_not_vouched_for() {
        let record = fixture();
        for check in [Check::Commitment, Check::Ticket] {
            assert_eq!(
                vouched(check, &record, &Claims::default()),
                Vouched::NotClaimed
            );
        }
        assert_eq!(
            vouched(Check::Commitment, &record, &claiming("7K2M9QXH4D")),
            Vouched::For("the published commitment is the one you saved".into())
        );
    }
}
