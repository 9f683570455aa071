use chrono::{DateTime, Utc};

use super::{DrawSeed, EntriesCommitment, SeedCommitment, Ticket};
use crate::domain::ProductId;

/// `GET /products/{id}/draw.json`: everything a stranger needs to recompute
/// the order and check the admissions, and nothing about who the customers
/// are. The endpoint serialises this struct and `flashsale draw verify`
/// reads it back, so the two cannot drift apart.
///
/// Every field is parsed into its domain type on the way in: a document
/// that deserialises has well-formed tickets, hex and times, and `verify`
/// is left with only the questions that matter.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DrawRecord {
    /// Lets the verifier notice it was handed another product's draw.
    pub product: ProductId,
    /// Entries that joined strictly before this instant are drawn; the rest
    /// are late. Published so the `late` flags can be checked.
    pub starts_at: DateTime<Utc>,
    pub seed_sha256: SeedCommitment,
    /// `null` until the start.
    pub seed: Option<DrawSeed>,
    /// [`frozen_list_sha256`](super::frozen_list_sha256) of the drawn
    /// (not late) entries' tickets, published when the list is frozen at
    /// the start and before the seed is revealed. `null` until then (and in
    /// documents written before the list was frozen at all).
    #[serde(default)]
    pub entries_sha256: Option<EntriesCommitment>,
    /// When the list was frozen: at or after the start. `null` until then.
    #[serde(default)]
    pub frozen_at: Option<DateTime<Utc>>,
    /// In join order (`seq`), though nothing depends on the list's order.
    pub entries: Vec<DrawEntry>,
    /// Empty until the start; late arrivals are appended as they join.
    pub order: Vec<Ticket>,
    /// In the order they were issued.
    pub admissions: Vec<DrawAdmission>,
}

impl DrawRecord {
    /// The entries that joined before the start, whose tickets the seed
    /// shuffles and the frozen list holds, in the listing's order.
    pub fn drawn_tickets(&self) -> Vec<Ticket> {
        self.entries
            .iter()
            .filter(|entry| !entry.late)
            .map(|entry| entry.ticket.clone())
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DrawEntry {
    pub ticket: Ticket,
    /// Taken in the same atomic step as the join, so two late arrivals
    /// with the same `joined_at` still have one order every instance agrees on.
    pub seq: u64,
    pub joined_at: DateTime<Utc>,
    pub late: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DrawAdmission {
    pub ticket: Ticket,
    pub issued_at: DateTime<Utc>,
    pub state: PassState,
}

/// What became of a pass: still open, spent on a purchase, or run out (its
/// place went to the next in line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PassState {
    Issued,
    Used,
    Lapsed,
}

impl PassState {
    /// As `draw.json` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            PassState::Issued => "issued",
            PassState::Used => "used",
            PassState::Lapsed => "lapsed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixture_reads_and_writes_the_same_document() {
        let text = include_str!("../../../tests/fixtures/draw.json");
        let record: DrawRecord = serde_json::from_str(text).unwrap();
        assert_eq!(record.product, ProductId(7));
        assert_eq!(record.entries.len(), 8);
        assert_eq!(record.admissions[1].state, PassState::Lapsed);
        for state in [PassState::Issued, PassState::Used, PassState::Lapsed] {
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
        let again: serde_json::Value = serde_json::to_value(&record).unwrap();
        let back: DrawRecord = serde_json::from_value(again.clone()).unwrap();
        assert_eq!(back, record);
        assert_eq!(again["seed"], record.seed.as_ref().unwrap().to_hex());
    }

    #[test]
    fn before_the_start_the_seed_is_null() {
        let record = DrawRecord {
            product: ProductId(1),
            starts_at: "2026-12-01T10:00:00Z".parse().unwrap(),
            seed_sha256: DrawSeed::generate().commitment(),
            seed: None,
            entries_sha256: None,
            frozen_at: None,
            entries: vec![],
            order: vec![],
            admissions: vec![],
        };
        let json = serde_json::to_value(&record).unwrap();
        assert!(json["seed"].is_null());
        assert!(json["entries_sha256"].is_null());
        assert!(json["frozen_at"].is_null());
        assert_eq!(
            serde_json::from_value::<DrawRecord>(json).unwrap().seed,
            None
        );
    }

    #[test]
    fn the_frozen_list_is_written_right_after_the_seed() {
        let text = include_str!("../../../tests/fixtures/draw.json");
        let record: DrawRecord = serde_json::from_str(text).unwrap();
        assert_eq!(
            record.entries_sha256,
            Some(super::super::frozen_list_sha256(&record.drawn_tickets()))
        );
        let written = serde_json::to_string(&record).unwrap();
        let at = |key: &str| written.find(&format!("\"{key}\":")).unwrap();
        assert!(at("seed") < at("entries_sha256"));
        assert!(at("entries_sha256") < at("frozen_at"));
        assert!(at("frozen_at") < at("entries"));
    }

    #[test]
    fn a_document_from_before_the_frozen_list_still_reads() {
        let text = include_str!("../../../tests/fixtures/draw.json");
        let mut json: serde_json::Value = serde_json::from_str(text).unwrap();
        let fields = json.as_object_mut().unwrap();
        fields.remove("entries_sha256");
        fields.remove("frozen_at");
        let record: DrawRecord = serde_json::from_value(json).unwrap();
        assert_eq!(record.entries_sha256, None);
        assert_eq!(record.frozen_at, None);
    }

    #[test]
    fn a_malformed_field_fails_the_whole_document() {
        let text = include_str!("../../../tests/fixtures/draw.json");
        let mut json: serde_json::Value = serde_json::from_str(text).unwrap();
        json["order"][0] = "h6fys9kcte".into();
        assert!(serde_json::from_value::<DrawRecord>(json.clone()).is_err());
        json["order"][0] = "H6FYS9KCTE".into();
        json["admissions"][0]["state"] = "expired".into();
        assert!(serde_json::from_value::<DrawRecord>(json.clone()).is_err());
        json["admissions"][0]["state"] = "used".into();
        json["entries_sha256"] = "ab".into();
        assert!(serde_json::from_value::<DrawRecord>(json).is_err());
    }
}
