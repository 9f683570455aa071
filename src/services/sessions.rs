//! Server-side sessions, so a sign-out (or a stolen cookie) can be revoked.
//! The signed cookie carries a random 256-bit token; the table keeps only its
//! SHA-256, so the table alone cannot be turned back into working cookies.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use rand::rngs::OsRng;
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::accounts::Account;
use crate::db::models::Customer;
use crate::db::schema::{customers, sessions};
use crate::db::{self, PgConn, PgPool};
use crate::domain::CustomerId;
use crate::error::AppError;

/// `last_seen_at` is refreshed at most this often, so a busy session costs
/// one indexed read per request rather than a write.
const LAST_SEEN_GRANULARITY: Duration = Duration::from_secs(5 * 60);

/// Revoked sessions are kept this long (who was signed in, and until when)
/// before the background job deletes them.
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

    fn hash(&self) -> Vec<u8> {
        Sha256::digest(self.0.as_bytes()).to_vec()
    }
}

impl std::fmt::Debug for SessionToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionToken(<redacted>)")
    }
}

/// Opens a new session for `customer`, valid for `ttl`.
pub async fn start(
    pool: &PgPool,
    customer: CustomerId,
    ttl: Duration,
) -> Result<SessionToken, AppError> {
    let token = SessionToken::generate();
    let id_hash = token.hash();
    db::run(pool, move |conn| {
        let now = Utc::now();
        diesel::insert_into(sessions::table)
            .values((
                sessions::id_hash.eq(id_hash),
                sessions::customer_id.eq(customer.get()),
                sessions::created_at.eq(now),
                sessions::last_seen_at.eq(now),
                sessions::expires_at.eq(now + ttl),
            ))
            .execute(conn)?;
        Ok(())
    })
    .await?;
    Ok(token)
}

/// The account of a live session (not revoked, not expired), as the
/// customers table says now, so a changed role applies at once.
pub async fn find(pool: &PgPool, token: &SessionToken) -> Result<Option<Account>, AppError> {
    let id_hash = token.hash();
    db::run(pool, move |conn| {
        let now = Utc::now();
        let live: Option<(Customer, DateTime<Utc>)> = sessions::table
            .inner_join(customers::table)
            .filter(sessions::id_hash.eq(&id_hash))
            .filter(sessions::revoked_at.is_null())
            .filter(sessions::expires_at.gt(now))
            .select((Customer::as_select(), sessions::last_seen_at))
            .first(conn)
            .optional()?;
        let Some((customer, last_seen)) = live else {
            return Ok(None);
        };
        if last_seen + LAST_SEEN_GRANULARITY < now {
            diesel::update(sessions::table.find(&id_hash))
                .set(sessions::last_seen_at.eq(now))
                .execute(conn)?;
        }
        Ok(Some(customer.into()))
    })
    .await
}

/// Ends the session: its cookie, wherever a copy of it is, signs in no one.
pub async fn revoke(pool: &PgPool, token: &SessionToken) -> Result<(), AppError> {
    let id_hash = token.hash();
    db::run(pool, move |conn| {
        diesel::update(
            sessions::table
                .find(id_hash)
                .filter(sessions::revoked_at.is_null()),
        )
        .set(sessions::revoked_at.eq(Utc::now()))
        .execute(conn)?;
        Ok(())
    })
    .await
}

/// Deletes sessions that expired or were revoked more than a day ago; returns how many.
pub fn purge_ended(conn: &mut PgConn) -> QueryResult<usize> {
    let now = Utc::now();
    diesel::delete(
        sessions::table.filter(
            sessions::expires_at
                .lt(now)
                .or(sessions::revoked_at.lt(now - REVOKED_RETENTION)),
        ),
    )
    .execute(conn)
}
