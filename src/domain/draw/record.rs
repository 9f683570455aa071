use chrono::{DateTime, Utc};

use super::{DrawSeed, SeedCommitment, Ticket};
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
    /// In join order (`seq`), though nothing depends on the list's order.
    pub entries: Vec<DrawEntry>,
    /// Empty until the start; late arrivals are appended as they join.
    pub order: Vec<Ticket>,
    /// In the order they were issued.
    pub admissions: Vec<DrawAdmission>,
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
            entries: vec![],
            order: vec![],
            admissions: vec![],
        };
        let json = serde_json::to_value(&record).unwrap();
        assert!(json["seed"].is_null());
        assert_eq!(
            serde_json::from_value::<DrawRecord>(json).unwrap().seed,
            None
        );
    }

    #[test]
    fn a_malformed_field_fails_the_whole_document() {
        let text = include_str!("../../../tests/fixtures/draw.json");
        let mut json: serde_json::Value = serde_json::from_str(text).unwrap();
        json["order"][0] = "h6fys9kcte".into();
        assert!(serde_json::from_value::<DrawRecord>(json.clone()).is_err());
        json["order"][0] = "H6FYS9KCTE".into();
        json["admissions"][0]["state"] = "expired".into();
        assert!(serde_json::from_value::<DrawRecord>(json).is_err());
    }
}
