//! What the draw's tests share: the fixture, and the edits a tamperer with
//! write access would make so that the record still agrees with itself.

use chrono::{DateTime, Utc};

use super::{draw_order, frozen_list_sha256, verify, DrawFault, DrawRecord, Ticket};

pub fn fixture() -> DrawRecord {
    serde_json::from_str(include_str!("../../../tests/fixtures/draw.json")).unwrap()
}

pub fn ticket(raw: &str) -> Ticket {
    Ticket::parse(raw).unwrap()
}

pub fn at(raw: &str) -> DateTime<Utc> {
    raw.parse().unwrap()
}

pub fn faults(record: &DrawRecord) -> Vec<DrawFault> {
    verify(record).faults
}

/// The order recomputed from the record's seed and entries, and each
/// admission moved to the ticket at its number's place, times and states
/// kept: what the shop would publish had the draw really gone that way.
pub fn redrawn(mut record: DrawRecord) -> DrawRecord {
    let seed = record.seed.clone().expect("a revealed seed");
    record.order = draw_order(&seed, &record.entries);
    for (admission, ticket) in record.admissions.iter_mut().zip(&record.order) {
        admission.ticket = ticket.clone();
    }
    record
}

/// The frozen list's SHA-256 recomputed from the entries as they now are.
pub fn refrozen(mut record: DrawRecord) -> DrawRecord {
    record.entries_sha256 = Some(frozen_list_sha256(&record.drawn_tickets()));
    record
}
