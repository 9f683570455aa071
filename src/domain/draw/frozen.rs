use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

use super::seed::parse_32_hex;
use super::{DrawFault, DrawRecord, Ticket};
use crate::domain::{HexValue, InvalidInput};

/// The frozen list's commitment: SHA-256 of the pre-queue tickets in their
/// canonical form. The tickets are sorted ascending by their bytes, each is
/// followed by one `"\n"` (the last one too), and the resulting text is
/// hashed; nothing else goes in (no seed, no times, no separator between
/// entries besides the newline). A duplicated ticket would be listed twice.
///
/// The list is frozen at the start and this hash published before the seed
/// is revealed, so entries cannot be added to, or dropped from, the drawn
/// part of the line once the seed would tell someone where they land.
///
/// A stranger recomputes it from `draw.json` with coreutils and jq (the
/// drawn entries are those with `"late": false`):
///
/// ```text
/// jq -r '.entries[] | select(.late | not) | .ticket' draw.json | LC_ALL=C sort | sha256sum
/// ```
///
/// or from a list of tickets `printf '%s\n' T1 T2 ... | LC_ALL=C sort | sha256sum`
/// (`LC_ALL=C` sorts by bytes, as here; an empty list is the SHA-256 of the
/// empty text, `e3b0c442...b855`, which `printf` with no tickets does not
/// give because it still prints one newline).
pub fn frozen_list_sha256(tickets: &[Ticket]) -> EntriesCommitment {
    let mut sorted: Vec<&str> = tickets.iter().map(Ticket::as_str).collect();
    // `str`'s order is its bytes' order, which is what `LC_ALL=C sort` uses.
    sorted.sort_unstable();
    let mut hasher = Sha256::new();
    for ticket in sorted {
        hasher.update(ticket.as_bytes());
        hasher.update(b"\n");
    }
    EntriesCommitment(hasher.finalize().into())
}

/// The published SHA-256 of the frozen list of pre-queue tickets (see
/// [`frozen_list_sha256`]). Written as 64 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct EntriesCommitment([u8; 32]);

impl EntriesCommitment {
    /// A commitment read back from storage (`queue_draws.entries_sha256`).
    pub fn from_bytes(bytes: [u8; 32]) -> EntriesCommitment {
        EntriesCommitment(bytes)
    }

    pub fn parse_hex(raw: &str) -> Result<EntriesCommitment, InvalidInput> {
        parse_32_hex(raw, HexValue::FrozenListSha256).map(EntriesCommitment)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex, as it is published.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn is_of(&self, tickets: &[Ticket]) -> bool {
        frozen_list_sha256(tickets) == *self
    }
}

impl fmt::Display for EntriesCommitment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for EntriesCommitment {
    type Err = InvalidInput;

    fn from_str(raw: &str) -> Result<EntriesCommitment, InvalidInput> {
        EntriesCommitment::parse_hex(raw)
    }
}

impl TryFrom<String> for EntriesCommitment {
    type Error = InvalidInput;

    fn try_from(raw: String) -> Result<EntriesCommitment, InvalidInput> {
        EntriesCommitment::parse_hex(&raw)
    }
}

impl From<EntriesCommitment> for String {
    fn from(commitment: EntriesCommitment) -> String {
        commitment.to_hex()
    }
}

/// The drawn entries against the list frozen at the start (the rule is on
/// [`verify`](super::verify)).
pub(super) fn check_frozen_list(record: &DrawRecord, faults: &mut Vec<DrawFault>) {
    match &record.entries_sha256 {
        // Before the start there is no list to freeze yet; the seed check
        // already says the draw cannot pass.
        None if record.seed.is_none() => {}
        // The seed is out and nothing fixed the list before it: the shop
        // could have added or dropped entries knowing where they land.
        None => faults.push(DrawFault::ListNotFrozen),
        Some(published) => {
            let drawn = record.drawn_tickets();
            let recomputed = frozen_list_sha256(&drawn);
            if recomputed != *published {
                faults.push(DrawFault::FrozenListDiffers {
                    published: *published,
                    recomputed,
                    drawn: drawn.len(),
                });
            }
        }
    }
    if let Some(frozen_at) = record.frozen_at {
        if frozen_at < record.starts_at {
            faults.push(DrawFault::FrozenBeforeStart {
                frozen_at,
                starts_at: record.starts_at,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::draw::testing::{at, faults, fixture, redrawn, refrozen};
    use crate::domain::draw::{verify, DrawEntry};

    fn tickets(raw: &[&str]) -> Vec<Ticket> {
        raw.iter().map(|raw| Ticket::parse(raw).unwrap()).collect()
    }

    /// The fixture's six drawn tickets, listed unsorted on purpose.
    const DRAWN: [&str; 6] = [
        "7K2M9QXH4D",
        "B3TRW8N5ZP",
        "0A1B2C3D4E",
        "ZZZZZZZZZZ",
        "QX5V6JM8GR",
        "H6FYS9KCTE",
    ];

    #[test]
    fn known_answer_computed_with_sort_and_sha256sum() {
        // Computed in a shell, independently of this code:
        //   printf '%s\n' 7K2M9QXH4D B3TRW8N5ZP 0A1B2C3D4E ZZZZZZZZZZ \
        //     QX5V6JM8GR H6FYS9KCTE | LC_ALL=C sort | sha256sum
        let expected = "fbc8a67fa62427541e56c7ff2456e42f9d0082df945ed9425d4be458e889c7ae";
        let commitment = frozen_list_sha256(&tickets(&DRAWN));
        assert_eq!(commitment.to_hex(), expected);
        assert_eq!(commitment.to_string(), expected);
        assert!(EntriesCommitment::parse_hex(expected)
            .unwrap()
            .is_of(&tickets(&DRAWN)));
    }

    #[test]
    fn the_canonical_text_is_the_sorted_tickets_one_per_line() {
        let mut sorted = DRAWN;
        sorted.sort_unstable();
        let text: String = sorted.iter().map(|ticket| format!("{ticket}\n")).collect();
        let by_hand: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        assert_eq!(frozen_list_sha256(&tickets(&DRAWN)).as_bytes(), &by_hand);
    }

    #[test]
    fn the_listing_order_does_not_matter_but_every_ticket_does() {
        let listed = tickets(&DRAWN);
        let mut reversed = listed.clone();
        reversed.reverse();
        let commitment = frozen_list_sha256(&listed);
        assert_eq!(frozen_list_sha256(&reversed), commitment);

        let mut dropped = listed.clone();
        dropped.pop();
        assert_ne!(frozen_list_sha256(&dropped), commitment);
        let mut added = listed.clone();
        added.push(Ticket::parse("A7A7A7A7A7").unwrap());
        assert_ne!(frozen_list_sha256(&added), commitment);
        let mut doubled = listed;
        doubled.push(doubled[0].clone());
        assert_ne!(frozen_list_sha256(&doubled), commitment);
    }

    #[test]
    fn an_empty_list_is_the_hash_of_the_empty_text() {
        assert_eq!(
            frozen_list_sha256(&[]).to_hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn hex_and_bytes_round_trip() {
        let commitment = frozen_list_sha256(&tickets(&DRAWN));
        assert_eq!(
            EntriesCommitment::from_bytes(*commitment.as_bytes()),
            commitment
        );
        let upper = commitment.to_hex().to_uppercase();
        assert_eq!(upper.parse::<EntriesCommitment>().unwrap(), commitment);
        let json = serde_json::to_string(&commitment).unwrap();
        assert_eq!(json, format!("\"{commitment}\""));
        assert_eq!(
            serde_json::from_str::<EntriesCommitment>(&json).unwrap(),
            commitment
        );
        assert!(EntriesCommitment::parse_hex("abc").is_err());
        assert!(serde_json::from_str::<EntriesCommitment>("\"00\"").is_err());
    }

    #[test]
    fn a_back_dated_drawn_entry_fails_the_frozen_list() {
        // Added after the freeze with a join time before the start, the
        // order and the admissions redone to match: everything else agrees.
        let mut record = fixture();
        record.entries.push(DrawEntry {
            ticket: Ticket::parse("A7A7A7A7A7").unwrap(),
            seq: 9,
            joined_at: at("2026-12-01T09:58:00Z"),
            late: false,
        });
        let record = redrawn(record);
        let found = faults(&record);
        assert_eq!(
            found,
            [DrawFault::FrozenListDiffers {
                published: fixture().entries_sha256.unwrap(),
                recomputed: frozen_list_sha256(&record.drawn_tickets()),
                drawn: 7,
            }]
        );
        assert!(found[0]
            .to_string()
            .starts_with("the 7 drawn entries' tickets hash to "));
        assert!(found[0]
            .to_string()
            .ends_with("an entry was added, dropped or relabelled after the freeze"));
    }

    #[test]
    fn a_dropped_or_relabelled_drawn_entry_fails_the_frozen_list() {
        let mut dropped = fixture();
        dropped.entries.remove(0);
        let dropped = redrawn(dropped);
        assert!(matches!(
            &faults(&dropped)[..],
            [DrawFault::FrozenListDiffers { drawn: 5, .. }]
        ));

        let mut relabelled = fixture();
        relabelled.entries[7].late = false;
        let relabelled = redrawn(relabelled);
        assert!(faults(&relabelled)
            .iter()
            .any(|fault| matches!(fault, DrawFault::FrozenListDiffers { drawn: 7, .. })));
    }

    #[test]
    fn a_revealed_seed_needs_a_frozen_list() {
        let mut record = fixture();
        record.entries_sha256 = None;
        record.frozen_at = None;
        assert_eq!(faults(&record), [DrawFault::ListNotFrozen]);
    }

    #[test]
    fn before_the_start_there_may_be_no_list_but_a_published_one_must_agree() {
        let mut record = fixture();
        record.seed = None;
        record.order.clear();
        record.admissions.clear();
        let mut unfrozen = record.clone();
        unfrozen.entries_sha256 = None;
        unfrozen.frozen_at = None;
        assert_eq!(faults(&unfrozen), [DrawFault::SeedNotRevealed]);
        assert_eq!(faults(&record), [DrawFault::SeedNotRevealed]);

        record.entries.remove(2);
        assert!(matches!(
            &faults(&record)[..],
            [
                DrawFault::SeedNotRevealed,
                DrawFault::FrozenListDiffers { .. }
            ]
        ));
    }

    #[test]
    fn the_list_is_frozen_no_earlier_than_the_start() {
        let mut record = fixture();
        record.frozen_at = Some(at("2026-12-01T09:59:59.999Z"));
        assert_eq!(
            faults(&record),
            [DrawFault::FrozenBeforeStart {
                frozen_at: at("2026-12-01T09:59:59.999Z"),
                starts_at: at("2026-12-01T10:00:00Z"),
            }]
        );
        record.frozen_at = Some(record.starts_at);
        assert_eq!(faults(&record), []);
    }

    /// What `verify` alone cannot see: a rewrite that also rewrites the
    /// published SHA-256 agrees with itself. Only a copy of the SHA-256
    /// taken before the reveal (or a joiner's ticket gone missing, see
    /// `verify_with`) shows it.
    #[test]
    fn a_list_refrozen_after_the_fact_agrees_with_itself() {
        let mut record = fixture();
        record.entries.push(DrawEntry {
            ticket: Ticket::parse("A7A7A7A7A7").unwrap(),
            seq: 9,
            joined_at: at("2026-12-01T09:58:00Z"),
            late: false,
        });
        let record = refrozen(redrawn(record));
        assert!(verify(&record).passed());
    }
}
