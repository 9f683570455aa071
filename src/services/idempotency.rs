//! Storage for idempotency keys: claim a key before acting, keep the answer
//! after, replay it for repeats. Keys are scoped to the customer.

use chrono::{Duration, Utc};
use diesel::prelude::*;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::db::schema::idempotency_keys;
use crate::db::{self, PgPool};
use crate::domain::{CustomerId, IdempotencyKey, OrderId};
use crate::error::AppError;

/// The answer a request got, as it is replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedResponse {
    pub status: u16,
    pub location: Option<String>,
    pub body: Option<String>,
}

impl SavedResponse {
    /// A purchase keeps its answer as the order it made: see that order.
    pub fn order(order: OrderId) -> SavedResponse {
        SavedResponse {
            status: 303,
            location: Some(format!("/orders/{order}")),
            body: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key is new: this request runs.
    Run,
    /// The same request ran before: here is its answer.
    Replay(SavedResponse),
    /// The key was used for a different request.
    Mismatch,
    /// The first request with this key has not finished.
    InProgress,
}

/// The secret that fingerprints are keyed with. A fingerprint covers what
/// the customer sent, card number included, and a card number has few
/// enough possible values that a plain hash of it could be reversed by
/// trying them all; keyed, the stored fingerprint says nothing without the
/// secret. Derived from `SESSION_KEY`, which every instance shares, so a
/// replay on another instance still matches.
///
/// Kept as an HMAC already keyed: keying hashes the key's two pads, half the
/// work of fingerprinting a short request, so each fingerprint starts from a
/// copy instead.
#[derive(Clone)]
pub struct FingerprintKey(Hmac<Sha256>);

impl FingerprintKey {
    pub fn derive(server_secret: &[u8]) -> FingerprintKey {
        let key = hmac_sha256(server_secret, b"flashsale idempotency fingerprint v1");
        FingerprintKey(Hmac::new_from_slice(&key).expect("HMAC takes a key of any length"))
    }
}

impl std::fmt::Debug for FingerprintKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FingerprintKey(..)")
    }
}

fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

/// What identifies a request, as stored beside its key: HMAC-SHA256 of its
/// text under the server's fingerprint key. The `h1:` prefix tells it from
/// the plain hashes stored before fingerprints were keyed.
pub fn fingerprint(key: &FingerprintKey, request: &str) -> String {
    let mut mac = key.0.clone();
    mac.update(request.as_bytes());
    format!("h1:{}", hex::encode(mac.finalize().into_bytes()))
}

/// The plain SHA-256 that keys claimed before fingerprints were keyed carry;
/// only ever compared with, never stored again.
pub fn legacy_fingerprint(request: &str) -> String {
    use sha2::Digest;
    hex::encode(Sha256::digest(request.as_bytes()))
}

type StoredRow = (
    String,
    Option<i16>,
    Option<String>,
    Option<String>,
    Option<i64>,
);

/// Claims `key` for a request whose fingerprint is `fingerprint` (what a
/// new claim stores), or finds what became of the request that claimed it.
/// A stored `also_matching` (a key claimed before fingerprints were keyed)
/// is the same request too; it is never stored.
pub async fn claim(
    pool: &PgPool,
    customer: CustomerId,
    key: &IdempotencyKey,
    fingerprint: &str,
    also_matching: &str,
) -> Result<Claim, AppError> {
    let (key, fingerprint, also_matching) = (
        key.as_str().to_string(),
        fingerprint.to_string(),
        also_matching.to_string(),
    );
    db::run(pool, move |conn| {
        // The insert and the read are two statements: a request that changed
        // nothing may release the key (or the purge delete it) in between.
        // A key gone is a key free, so claim it again rather than answer
        // "not found"; past a few rounds the caller polls as for a request
        // still running.
        for _ in 0..CLAIM_ROUNDS {
            let inserted = diesel::insert_into(idempotency_keys::table)
                .values((
                    idempotency_keys::customer_id.eq(customer.get()),
                    idempotency_keys::key.eq(&key),
                    idempotency_keys::fingerprint.eq(&fingerprint),
                ))
                .on_conflict_do_nothing()
                .execute(conn)?;
            if inserted == 1 {
                return Ok(Claim::Run);
            }
            let stored: Option<StoredRow> = idempotency_keys::table
                .find((customer.get(), &key))
                .select((
                    idempotency_keys::fingerprint,
                    idempotency_keys::response_status,
                    idempotency_keys::response_location,
                    idempotency_keys::response_body,
                    idempotency_keys::order_id,
                ))
                .first(conn)
                .optional()?;
            if let Some(stored) = stored {
                return Ok(claimed_before(stored, [&fingerprint, &also_matching]));
            }
        }
        Ok(Claim::InProgress)
    })
    .await
}

/// What became of the request that claimed a key first, for a request whose
/// fingerprint is either of `matching`.
fn claimed_before(stored: StoredRow, matching: [&str; 2]) -> Claim {
    let (stored_fingerprint, status, location, body, order) = stored;
    if !matching.contains(&stored_fingerprint.as_str()) {
        Claim::Mismatch
    } else if let Some(order) = order {
        Claim::Replay(SavedResponse::order(OrderId(order)))
    } else if let Some(status) = status {
        Claim::Replay(SavedResponse {
            status: status as u16,
            location,
            body,
        })
    } else {
        Claim::InProgress
    }
}

/// How often a claim tries again when the key it collided with vanished
/// before it could be read.
const CLAIM_ROUNDS: usize = 3;

pub async fn save(
    pool: &PgPool,
    customer: CustomerId,
    key: &IdempotencyKey,
    response: SavedResponse,
) -> Result<(), AppError> {
    let key = key.as_str().to_string();
    db::run(pool, move |conn| {
        diesel::update(idempotency_keys::table.find((customer.get(), &key)))
            .set((
                idempotency_keys::response_status.eq(Some(response.status as i16)),
                idempotency_keys::response_location.eq(response.location),
                idempotency_keys::response_body.eq(response.body),
            ))
            .execute(conn)?;
        Ok(())
    })
    .await
}

/// The order a purchase named on `key`, read from the database. The name is
/// written in the order's own transaction, so after a COMMIT whose answer was
/// lost this tells exactly whether it landed.
pub async fn order_named(
    pool: &PgPool,
    customer: CustomerId,
    key: &IdempotencyKey,
) -> Result<Option<OrderId>, AppError> {
    let key = key.as_str().to_string();
    db::run(pool, move |conn| {
        let order: Option<Option<i64>> = idempotency_keys::table
            .find((customer.get(), &key))
            .select(idempotency_keys::order_id)
            .first(conn)
            .optional()?;
        Ok(order.flatten().map(OrderId))
    })
    .await
}

/// A key's row as a purchase's transaction left it: what request it was
/// used for, and the order it names, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyUse {
    pub fingerprint: String,
    pub order: Option<OrderId>,
}

/// What `key` was used for, if it has a row.
pub async fn key_use(
    pool: &PgPool,
    customer: CustomerId,
    key: &IdempotencyKey,
) -> Result<Option<KeyUse>, AppError> {
    let key = key.as_str().to_string();
    db::run(pool, move |conn| {
        let found: Option<(String, Option<i64>)> = idempotency_keys::table
            .find((customer.get(), &key))
            .select((idempotency_keys::fingerprint, idempotency_keys::order_id))
            .first(conn)
            .optional()?;
        Ok(found.map(|(fingerprint, order)| KeyUse {
            fingerprint,
            order: order.map(OrderId),
        }))
    })
    .await
}

/// What a purchase's claim that has been in progress longer than any request
/// can run comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Abandoned {
    /// Its purchase committed (the answer was lost): this is its order.
    Ordered(OrderId),
    /// Nothing was bought under it, and this request now holds the claim.
    TakenOver,
    /// Still young, answered meanwhile, or taken over by another resend.
    NotYet,
}

/// Looks at a purchase's claim that is still "in progress" after `older_than`:
/// no request can still commit under it by then, so its `order_id` is final.
/// Taking it over restarts its clock in the same statement that checks it,
/// so two resends cannot both take it.
pub async fn take_over_abandoned(
    pool: &PgPool,
    customer: CustomerId,
    key: &IdempotencyKey,
    fingerprint: &str,
    older_than: std::time::Duration,
) -> Result<Abandoned, AppError> {
    let (key, fingerprint) = (key.as_str().to_string(), fingerprint.to_string());
    let cutoff = Utc::now() - Duration::from_std(older_than).unwrap_or(Duration::minutes(5));
    db::run(pool, move |conn| {
        let taken = diesel::update(
            idempotency_keys::table
                .find((customer.get(), &key))
                .filter(idempotency_keys::created_at.lt(cutoff))
                .filter(idempotency_keys::order_id.is_null())
                .filter(idempotency_keys::response_status.is_null()),
        )
        // Taken over, the claim is this request's: its keyed fingerprint
        // replaces a plain hash kept from before fingerprints were keyed,
        // which must not live on for another retention.
        .set((
            idempotency_keys::created_at.eq(Utc::now()),
            idempotency_keys::fingerprint.eq(&fingerprint),
        ))
        .execute(conn)?;
        if taken == 1 {
            return Ok(Abandoned::TakenOver);
        }
        let order: Option<Option<i64>> = idempotency_keys::table
            .find((customer.get(), &key))
            .select(idempotency_keys::order_id)
            .first(conn)
            .optional()?;
        Ok(match order.flatten() {
            Some(order) => Abandoned::Ordered(OrderId(order)),
            None => Abandoned::NotYet,
        })
    })
    .await
}

/// Frees a claimed key whose request changed nothing (it failed closed), so
/// the customer's retry with the same form can run.
pub async fn release(
    pool: &PgPool,
    customer: CustomerId,
    key: &IdempotencyKey,
) -> Result<(), AppError> {
    let key = key.as_str().to_string();
    db::run(pool, move |conn| {
        diesel::delete(idempotency_keys::table.find((customer.get(), &key))).execute(conn)?;
        Ok(())
    })
    .await
}

/// Deletes keys older than the retention period; returns how many.
pub fn purge_expired(
    conn: &mut db::PgConn,
    retention: std::time::Duration,
) -> Result<usize, AppError> {
    let cutoff = Utc::now() - Duration::from_std(retention).unwrap_or(Duration::days(1));
    Ok(
        diesel::delete(idempotency_keys::table.filter(idempotency_keys::created_at.lt(cutoff)))
            .execute(conn)?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_keyed_by_the_server_secret() {
        let (ours, theirs) = (
            FingerprintKey::derive(&[7; 64]),
            FingerprintKey::derive(&[8; 64]),
        );
        let request = "POST /orders/1/pay\ncard_number=4242 4242 4242 4242";
        // Instances sharing SESSION_KEY agree, so a replay elsewhere matches.
        assert_eq!(
            fingerprint(&ours, request),
            fingerprint(&FingerprintKey::derive(&[7; 64]), request)
        );
        assert_ne!(fingerprint(&ours, request), fingerprint(&theirs, request));
        assert_ne!(
            fingerprint(&ours, request),
            fingerprint(&ours, "POST /orders/1/pay\ncard_number=4000 0000 0000 0002")
        );
        assert!(!fingerprint(&ours, request).contains("4242"));
    }
}
