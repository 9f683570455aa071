use std::fmt;
use std::str::FromStr;

use rand::rngs::OsRng;
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::domain::{HexValue, InvalidInput};

/// The draw's secret: 32 bytes that decide the order of everyone who joined
/// before the start. Only its commitment is published until the start.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DrawSeed([u8; 32]);

impl DrawSeed {
    /// From the operating system's CSPRNG: anyone who could guess the seed
    /// before the start could compute the order and keep only the accounts
    /// whose tickets land first.
    pub fn generate() -> DrawSeed {
        let mut bytes = [0u8; 32];
        OsRng.fill_bytes(&mut bytes);
        DrawSeed(bytes)
    }

    /// A seed read back from storage (or a test's own RNG).
    pub fn from_bytes(bytes: [u8; 32]) -> DrawSeed {
        DrawSeed(bytes)
    }

    pub fn parse_hex(raw: &str) -> Result<DrawSeed, InvalidInput> {
        parse_32_hex(raw, HexValue::DrawSeed).map(DrawSeed)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex, as it is revealed.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// SHA-256 of the seed's 32 bytes (not of its hex): what a verifier
    /// hashes is then exactly what the HMAC is keyed with.
    pub fn commitment(&self) -> SeedCommitment {
        SeedCommitment(Sha256::digest(self.0).into())
    }
}

/// Kept out of logs: a seed printed before the start is a seed revealed early.
impl fmt::Debug for DrawSeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DrawSeed(..)")
    }
}

impl TryFrom<String> for DrawSeed {
    type Error = InvalidInput;

    fn try_from(raw: String) -> Result<DrawSeed, InvalidInput> {
        DrawSeed::parse_hex(&raw)
    }
}

impl From<DrawSeed> for String {
    fn from(seed: DrawSeed) -> String {
        seed.to_hex()
    }
}

/// The published SHA-256 of a seed, fixed before anyone joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SeedCommitment([u8; 32]);

impl SeedCommitment {
    /// A commitment read back from storage.
    pub fn from_bytes(bytes: [u8; 32]) -> SeedCommitment {
        SeedCommitment(bytes)
    }

    pub fn parse_hex(raw: &str) -> Result<SeedCommitment, InvalidInput> {
        parse_32_hex(raw, HexValue::SeedCommitment).map(SeedCommitment)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn is_of(&self, seed: &DrawSeed) -> bool {
        seed.commitment() == *self
    }
}

/// Lowercase hex, as it is published.
impl fmt::Display for SeedCommitment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// For the command line: `flashsale draw verify --commitment HEX`.
impl FromStr for SeedCommitment {
    type Err = InvalidInput;

    fn from_str(raw: &str) -> Result<SeedCommitment, InvalidInput> {
        SeedCommitment::parse_hex(raw)
    }
}

impl TryFrom<String> for SeedCommitment {
    type Error = InvalidInput;

    fn try_from(raw: String) -> Result<SeedCommitment, InvalidInput> {
        SeedCommitment::parse_hex(&raw)
    }
}

impl From<SeedCommitment> for String {
    fn from(commitment: SeedCommitment) -> String {
        commitment.to_string()
    }
}

/// Either case is read (the bytes are what count); the hashes and the seed
/// all write lowercase.
pub(super) fn parse_32_hex(raw: &str, what: HexValue) -> Result<[u8; 32], InvalidInput> {
    let mut bytes = [0u8; 32];
    if raw.len() != 64 || hex::decode_to_slice(raw, &mut bytes).is_err() {
        return Err(InvalidInput::NotHex32 {
            what,
            raw: raw.chars().take(80).collect(),
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes 0x00, 0x01, ..., 0x1f.
    fn counting_seed() -> DrawSeed {
        DrawSeed::from_bytes(std::array::from_fn(|i| i as u8))
    }

    #[test]
    fn commitment_is_sha256_of_the_bytes_not_of_the_hex() {
        // Computed with python3:
        //   hashlib.sha256(bytes(range(32))).hexdigest()
        //   hashlib.sha256(bytes(range(32)).hex().encode()).hexdigest()
        let of_bytes = "630dcd2966c4336691125448bbb25b4ff412a49c732db2c8abc1b8581bd710dd";
        let of_hex_text = "6c86c6aac5fb24bcf5d9939cb7d7d5645ce39418f449e03b262dd4fa14b4b92b";
        let seed = counting_seed();
        assert_eq!(seed.commitment().to_string(), of_bytes);
        assert_ne!(seed.commitment().to_string(), of_hex_text);
        assert!(SeedCommitment::parse_hex(of_bytes).unwrap().is_of(&seed));
        assert!(!SeedCommitment::parse_hex(of_hex_text).unwrap().is_of(&seed));
    }

    #[test]
    fn hex_round_trips_and_reads_either_case() {
        let seed = counting_seed();
        let hex = seed.to_hex();
        assert_eq!(
            hex,
            "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
        );
        assert_eq!(DrawSeed::parse_hex(&hex).unwrap(), seed);
        assert_eq!(DrawSeed::parse_hex(&hex.to_uppercase()).unwrap(), seed);
        let commitment = seed.commitment();
        assert_eq!(
            SeedCommitment::parse_hex(&commitment.to_string().to_uppercase()).unwrap(),
            commitment
        );
    }

    #[test]
    fn malformed_hex_is_refused() {
        let good = counting_seed().to_hex();
        for bad in [
            String::new(),
            good[..62].to_string(),
            format!("{good}00"),
            format!("{}zz", &good[..62]),
            format!(" {}", &good[..63]),
        ] {
            assert!(DrawSeed::parse_hex(&bad).is_err(), "{bad:?}");
            assert!(SeedCommitment::parse_hex(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn generated_seeds_differ_and_debug_hides_them() {
        let (a, b) = (DrawSeed::generate(), DrawSeed::generate());
        assert_ne!(a, b);
        assert_eq!(format!("{a:?}"), "DrawSeed(..)");
    }

    #[test]
    fn serde_writes_lowercase_hex() {
        let seed = counting_seed();
        let json = serde_json::to_string(&seed).unwrap();
        assert_eq!(json, format!("\"{}\"", seed.to_hex()));
        assert_eq!(serde_json::from_str::<DrawSeed>(&json).unwrap(), seed);
        assert!(serde_json::from_str::<DrawSeed>("\"00\"").is_err());
    }
}
