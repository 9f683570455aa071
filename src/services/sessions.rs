//! Server-side sessions, so a sign-out (or a stolen cookie) can be revoked.
//! The signed cookie carries a random 256-bit token and what the session was
//! when it started (the account, when it expires); the table keeps only the
//! token's SHA-256, so the table alone cannot be turned back into working
//! cookies.
//!
//! A request is verified from its cookie alone (`verify`): the cookie cannot
//! be forged, so what is left to ask is whether the session was revoked
//! since. Each process keeps the revoked sessions in memory
//! (`revocations::Revocations`, told of each revocation as it commits), so a
//! page costs Postgres nothing however busy the shop is. When that copy
//! cannot prove it is less than a second old (Postgres slow or down), the
//! table is asked per request (`find`), as before: a revoked cookie is
//! refused within a second on every instance either way.
//!
//! `revoked_at` in the table stays the truth, and is always written with
//! Postgres's clock (`now()`), the clock a poll reads by. Changing a
//! customer's role or email, or deleting the customer, revokes their
//! sessions inside Postgres (triggers), so no cookie keeps an old copy.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use rand::rngs::OsRng;
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::accounts::Account;
use super::Shop;
use crate::db::models::Customer;
use crate::db::schema::{customers, sessions};
use crate::db::{self, PgConn, PgPool};
use crate::domain::CustomerId;
use crate::error::AppError;

/// Revoked sessions are kept this long (who was signed in, and until when)
/// after they expire. Never less than until they expire: a process that
/// starts later learns of a revocation only from its row.
const REVOKED_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The secret a session cookie carries.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionToken(String);

impl SessionToken {
    fn generate() -> SessionToken {
        let mut bytes = [0u8; 32];
        OsRng.fill_bytes(&mut bytes);
        SessionToken(URL_SAFE_NO_PAD.encode(bytes))
    }

    /// A token read back from the cookie; one that names no row is simply not found.
    pub fn from_cookie(raw: String) -> SessionToken {
        SessionToken(raw)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn digest(&self) -> [u8; 32] {
        Sha256::digest(self.0.as_bytes()).into()
    }

    fn hash(&self) -> Vec<u8> {
        self.digest().to_vec()
    }
}

impl std::fmt::Debug for SessionToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionToken(<redacted>)")
    }
}

/// What a session is: whose, and until when. The signed cookie keeps a copy,
/// so a request needs the table only to learn of a revocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionClaim {
    pub account: Account,
    pub expires_at: DateTime<Utc>,
}

/// Opens a new session for `customer`, valid for `ttl`.
pub async fn start(
    pool: &PgPool,
    customer: CustomerId,
    ttl: Duration,
) -> Result<(SessionToken, DateTime<Utc>), AppError> {
    let token = SessionToken::generate();
    let id_hash = token.hash();
    let now = Utc::now();
    // Postgres keeps microseconds: the cookie's copy must equal the row's.
    let expires_at = DateTime::from_timestamp_micros((now + ttl).timestamp_micros())
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("session expiry out of range")))?;
    db::run(pool, move |conn| {
        diesel::insert_into(sessions::table)
            .values((
                sessions::id_hash.eq(id_hash),
                sessions::customer_id.eq(customer.get()),
                sessions::created_at.eq(now),
                sessions::last_seen_at.eq(now),
                sessions::expires_at.eq(expires_at),
            ))
            .execute(conn)?;
        Ok(())
    })
    .await?;
    Ok((token, expires_at))
}

/// The session behind `token`, if it is live. `claim` is the cookie's copy:
/// trusted when it has not expired and this process's revocation copy is
/// fresh enough to say it was not revoked. Otherwise the table decides.
pub async fn verify(
    shop: &Shop,
    token: &SessionToken,
    claim: Option<SessionClaim>,
) -> Result<Option<SessionClaim>, AppError> {
    if let Some(claim) = claim {
        if claim.expires_at <= Utc::now() {
            return Ok(None);
        }
        match shop.revocations.is_revoked(&token.digest()) {
            Some(true) => return Ok(None),
            Some(false) => return Ok(Some(claim)),
            None => {}
        }
    }
    find(&shop.pool, token).await
}

/// The live session (not revoked, not expired) as the tables say now: for a
/// cookie from before sessions carried their expiry, and whenever the
/// revocation copy is stale.
pub async fn find(pool: &PgPool, token: &SessionToken) -> Result<Option<SessionClaim>, AppError> {
    let id_hash = token.hash();
    db::run(pool, move |conn| {
        let live: Option<(Customer, DateTime<Utc>)> = sessions::table
            .inner_join(customers::table)
            .filter(sessions::id_hash.eq(&id_hash))
            .filter(sessions::revoked_at.is_null())
            .filter(sessions::expires_at.gt(Utc::now()))
            .select((Customer::as_select(), sessions::expires_at))
            .first(conn)
            .optional()?;
        Ok(live.map(|(customer, expires_at)| SessionClaim {
            account: customer.into(),
            expires_at,
        }))
    })
    .await
}

/// Ends the session: its cookie, wherever a copy of it is, signs in no one;
/// here at once, on other instances by their next poll.
pub async fn revoke(shop: &Shop, token: &SessionToken) -> Result<(), AppError> {
    let id_hash = token.hash();
    let revoked: Option<DateTime<Utc>> = db::run(&shop.pool, move |conn| {
        Ok(diesel::update(
            sessions::table
                .find(id_hash)
                .filter(sessions::revoked_at.is_null()),
        )
        .set(sessions::revoked_at.eq(diesel::dsl::now))
        .returning(sessions::expires_at)
        .get_result(conn)
        .optional()?)
    })
    .await?;
    if let Some(expires_at) = revoked {
        shop.revocations.insert(token.digest(), expires_at);
    }
    Ok(())
}

/// Deletes sessions that have expired, and were not revoked or were revoked
/// more than a day ago; returns how many. A revoked session's row stays
/// while its cookie could still be presented.
pub fn purge_ended(conn: &mut PgConn) -> QueryResult<usize> {
    let now = Utc::now();
    diesel::delete(
        sessions::table.filter(sessions::expires_at.lt(now)).filter(
            sessions::revoked_at
                .is_null()
                .or(sessions::revoked_at.lt(now - REVOKED_RETENTION)),
        ),
    )
    .execute(conn)
}
