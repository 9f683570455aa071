use std::fmt;
use std::str::FromStr;

use rand::rngs::OsRng;
use rand::RngCore;

use crate::domain::{echo, InvalidInput};

/// A waiting-room entry's public name: shown to its customer, published in
/// the draw, and the message the seed's HMAC places in the order.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct Ticket(String);

impl Ticket {
    /// 50 bits: two of 2,000 entries share a ticket with odds of about
    /// 2e-9, and the entries table's unique index turns even that into a
    /// retry rather than two customers on one place.
    pub const LEN: usize = 10;

    /// Crockford's base32 digits: no I, L, O or U, so a ticket read aloud or
    /// copied by hand is not mistaken for another.
    pub const ALPHABET: &'static [u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

    /// Drawn by the shop, never chosen by the customer, so nobody can aim a
    /// ticket at a place once the seed is out.
    pub fn generate() -> Ticket {
        let mut bytes = [0u8; Self::LEN];
        OsRng.fill_bytes(&mut bytes);
        // 256 is a multiple of 32, so the low five bits are uniform.
        Ticket(
            bytes
                .iter()
                .map(|b| Self::ALPHABET[usize::from(b & 31)] as char)
                .collect(),
        )
    }

    /// One spelling per ticket: the exact bytes are the HMAC's message, so a
    /// lowercase or look-alike copy is refused instead of being drawn as a
    /// different ticket.
    pub fn parse(raw: &str) -> Result<Ticket, InvalidInput> {
        if raw.len() == Self::LEN && raw.bytes().all(|b| Self::ALPHABET.contains(&b)) {
            Ok(Ticket(raw.to_string()))
        } else {
            Err(InvalidInput::NotATicket {
                len: Self::LEN,
                raw: echo(raw),
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// For the command line: `flashsale draw verify --ticket TICKET`.
impl FromStr for Ticket {
    type Err = InvalidInput;

    fn from_str(raw: &str) -> Result<Ticket, InvalidInput> {
        Ticket::parse(raw)
    }
}

impl TryFrom<String> for Ticket {
    type Error = InvalidInput;

    fn try_from(raw: String) -> Result<Ticket, InvalidInput> {
        Ticket::parse(&raw)
    }
}

impl From<Ticket> for String {
    fn from(ticket: Ticket) -> String {
        ticket.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tickets_parse_and_differ() {
        let tickets: Vec<Ticket> = (0..1000).map(|_| Ticket::generate()).collect();
        for ticket in &tickets {
            assert_eq!(Ticket::parse(ticket.as_str()).as_ref(), Ok(ticket));
        }
        let distinct: std::collections::HashSet<_> = tickets.iter().collect();
        assert_eq!(distinct.len(), tickets.len());
    }

    #[test]
    fn every_symbol_is_used() {
        let seen: std::collections::HashSet<u8> = (0..200)
            .flat_map(|_| Ticket::generate().0.into_bytes())
            .collect();
        assert_eq!(seen.len(), 32);
    }

    #[test]
    fn only_the_canonical_spelling_parses() {
        assert!(Ticket::parse("7K2M9QXH4D").is_ok());
        assert!(Ticket::parse("0123456789").is_ok());
        for bad in [
            "",
            "7K2M9QXH4",
            "7K2M9QXH4DD",
            "7k2m9qxh4d",
            "7K2M9QXH4O",
            "7K2M9QXH4I",
            "7K2M9QXH4L",
            "7K2M9QXH4U",
            "7K2M9QXH4-",
            "7K2M9QXH4É",
            " 7K2M9QXH4",
        ] {
            assert!(Ticket::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn serde_reads_through_parse() {
        let ticket: Ticket = serde_json::from_str("\"7K2M9QXH4D\"").unwrap();
        assert_eq!(ticket.as_str(), "7K2M9QXH4D");
        assert_eq!(serde_json::to_string(&ticket).unwrap(), "\"7K2M9QXH4D\"");
        assert!(serde_json::from_str::<Ticket>("\"7k2m9qxh4d\"").is_err());
    }
}
