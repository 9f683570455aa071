//! The address-confirmation link. Nothing of it is stored: it is an
//! HMAC-SHA256 over the account, its address and the time it was issued,
//! under a key derived from `SESSION_KEY`, recomputed to check it. A link
//! for an address the account no longer has, or older than `LINK_VALIDITY`,
//! confirms nothing.

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::domain::CustomerId;

/// How long a confirmation link works.
pub const LINK_VALIDITY: chrono::Duration = chrono::Duration::hours(48);
/// A link issued by an instance whose clock is this much ahead still works.
const CLOCK_SKEW: chrono::Duration = chrono::Duration::minutes(5);

/// The key confirmation links are signed with.
pub struct LinkKey(Hmac<Sha256>);

impl LinkKey {
    pub fn derive(server_secret: &[u8]) -> LinkKey {
        let mut derive =
            Hmac::<Sha256>::new_from_slice(server_secret).expect("HMAC takes a key of any length");
        derive.update(b"flashsale address confirmation link v1");
        let key = derive.finalize().into_bytes();
        LinkKey(Hmac::new_from_slice(&key).expect("HMAC takes a key of any length"))
    }

    fn code(&self, customer: CustomerId, email: &str, issued: i64) -> Vec<u8> {
        let mut mac = self.0.clone();
        mac.update(format!("{customer}\n{issued}\n{email}").as_bytes());
        mac.finalize().into_bytes().to_vec()
    }
}

impl std::fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkKey(..)")
    }
}

/// What a confirmation link carries in its query string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmLink {
    pub customer: CustomerId,
    pub issued: i64,
    pub code: String,
}

/// Why a link confirms nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkRefusal {
    /// Altered, or made for another account or address.
    Invalid,
    /// Older than `LINK_VALIDITY`.
    Expired,
}

impl ConfirmLink {
    pub fn issue(key: &LinkKey, customer: CustomerId, email: &str, issued: i64) -> ConfirmLink {
        ConfirmLink {
            customer,
            issued,
            code: hex::encode(key.code(customer, email, issued)),
        }
    }

    /// The link's path and query on the shop.
    pub fn path(&self) -> String {
        format!(
            "/account/confirm?account={}&issued={}&code={}",
            self.customer, self.issued, self.code
        )
    }

    /// Whether this link was issued for `email` of its account and still works at `now`.
    pub fn check(&self, key: &LinkKey, email: &str, now: DateTime<Utc>) -> Result<(), LinkRefusal> {
        let expected = key.code(self.customer, email, self.issued);
        let given = hex::decode(&self.code).map_err(|_| LinkRefusal::Invalid)?;
        if !bool::from(expected.ct_eq(&given)) {
            return Err(LinkRefusal::Invalid);
        }
        let Some(issued) = DateTime::<Utc>::from_timestamp(self.issued, 0) else {
            return Err(LinkRefusal::Invalid);
        };
        if issued > now + CLOCK_SKEW {
            return Err(LinkRefusal::Invalid);
        }
        if now - issued > LINK_VALIDITY {
            return Err(LinkRefusal::Expired);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> LinkKey {
        LinkKey::derive(&[7u8; 64])
    }

    #[test]
    fn a_fresh_link_checks_out() {
        let now = Utc::now();
        let link = ConfirmLink::issue(&key(), CustomerId(5), "ada@example.com", now.timestamp());
        assert_eq!(link.check(&key(), "ada@example.com", now), Ok(()));
        assert!(link
            .path()
            .starts_with("/account/confirm?account=5&issued="));
    }

    #[test]
    fn another_address_account_key_or_code_is_invalid() {
        let now = Utc::now();
        let link = ConfirmLink::issue(&key(), CustomerId(5), "ada@example.com", now.timestamp());
        assert_eq!(
            link.check(&key(), "eve@example.com", now),
            Err(LinkRefusal::Invalid)
        );
        let other_key = LinkKey::derive(&[8u8; 64]);
        assert_eq!(
            link.check(&other_key, "ada@example.com", now),
            Err(LinkRefusal::Invalid)
        );
        let moved = ConfirmLink {
            customer: CustomerId(6),
            ..link.clone()
        };
        assert_eq!(
            moved.check(&key(), "ada@example.com", now),
            Err(LinkRefusal::Invalid)
        );
        let later = ConfirmLink {
            issued: link.issued + 1,
            ..link.clone()
        };
        assert_eq!(
            later.check(&key(), "ada@example.com", now),
            Err(LinkRefusal::Invalid)
        );
        let garbled = ConfirmLink {
            code: "zz".into(),
            ..link
        };
        assert_eq!(
            garbled.check(&key(), "ada@example.com", now),
            Err(LinkRefusal::Invalid)
        );
    }

    #[test]
    fn a_link_expires_after_48_hours() {
        let issued = Utc::now() - chrono::Duration::hours(49);
        let link = ConfirmLink::issue(&key(), CustomerId(5), "ada@example.com", issued.timestamp());
        assert_eq!(
            link.check(&key(), "ada@example.com", Utc::now()),
            Err(LinkRefusal::Expired)
        );
        let almost = issued + chrono::Duration::hours(47);
        assert_eq!(link.check(&key(), "ada@example.com", almost), Ok(()));
    }
}
