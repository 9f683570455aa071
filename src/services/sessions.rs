//! Server-side sessions, so a sign-out (or a stolen cookie) can be revoked.
//! The signed cookie carries a random 256-bit token and what the session was
//! when it started (the account, when it expires); the table keeps only the
//! token's SHA-256, so the table alone cannot be turned back into working
//! cookies.
//!
//! A request is verified from its cookie alone (`verify`): the cookie cannot
//! be forged, so what is left to ask is whether the session was revoked
//! since. Each process keeps the revoked sessions in memory (`Revocations`),
//! and a poller brings in those revoked since its last look a few times a
//! second, so a page costs Postgres nothing however busy the shop is. When
//! that copy cannot prove it is less than a second old (Postgres slow or
//! down), the table is asked per request (`find`), as before: a revoked
//! cookie is refused within a second on every instance either way.
//!
//! `revoked_at` in the table stays the truth, and is always written with
//! Postgres's clock (`now()`), the clock the poller reads by. Changing a
//! customer's role or email, or deleting the customer, revokes their
//! sessions inside Postgres (triggers), so no cookie keeps an old copy.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Bytea, Nullable, Timestamptz};
use rand::rngs::OsRng;
use rand::RngCore;
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use super::accounts::Account;
use super::Shop;
use crate::config::Settings;
use crate::db::models::Customer;
use crate::db::schema::{customers, sessions};
use crate::db::{self, PgConn, PgPool};
use crate::domain::CustomerId;
use crate::error::AppError;
use crate::metrics;

/// Revoked sessions are kept this long (who was signed in, and until when)
/// after they expire. Never less than until they expire: a process that
/// starts later learns of a revocation only from its row.
const REVOKED_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The revocation copy is trusted only if a poll that started at most this
/// long ago succeeded: the promise is that a revocation reaches every
/// instance within a second.
pub const FRESHNESS: Duration = Duration::from_secs(1);

/// Each poll reads back this far before the previous poll's start, by
/// Postgres's clock. `revoked_at` is the revoking transaction's start, so a
/// revocation committed after the previous poll's snapshot can carry an
/// earlier time; this covers any transaction shorter than the margin (the
/// shop's own revocations are single statements, bounded by the statement
/// timeout).
const OVERLAP: Duration = Duration::from_secs(10);

/// A transaction open longer than `OVERLAP` (an edit by hand, say) commits
/// a revocation older than the window: so every so often a poll reads every
/// revoked, unexpired session again, and such a revocation takes effect
/// within this long of its commit.
const FULL_RELOAD_EVERY: Duration = Duration::from_secs(5);

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

/// This process's copy of the revoked sessions that have not expired, and
/// how fresh it is.
pub struct Revocations {
    state: RwLock<Known>,
    /// Its own connections, so a poll never waits behind a crowd of requests
    /// for the shop's pool (and then every request would fall back to the table).
    pool: PgPool,
}

struct Known {
    /// Token digests, with when each session expires (then it is dropped:
    /// the cookie's own expiry refuses it from then on).
    revoked: HashMap<[u8; 32], DateTime<Utc>>,
    /// Postgres's clock at the start of the last successful poll.
    polled_at: Option<DateTime<Utc>>,
    /// When the last successful poll started, by this process's clock.
    fresh_as_of: Option<Instant>,
    /// When the last poll that read every revoked session started.
    fully_read_at: Option<Instant>,
}

impl Revocations {
    /// An empty copy, stale until the first poll.
    pub fn new(settings: &Settings) -> Revocations {
        Revocations {
            state: RwLock::new(Known {
                revoked: HashMap::new(),
                polled_at: None,
                fresh_as_of: None,
                fully_read_at: None,
            }),
            // Connects on the first poll, not before: a `Shop` built for a
            // command that never serves pages opens nothing here.
            pool: db::build_one_shot_pool(
                &settings.database_url,
                settings.db_statement_timeout,
                settings.db_connect_timeout,
            ),
        }
    }

    /// Whether the session with this digest was revoked; `None` when the
    /// copy is too old to say.
    fn is_revoked(&self, digest: &[u8; 32]) -> Option<bool> {
        let known = self.state.read().unwrap_or_else(|e| e.into_inner());
        known.is_fresh().then(|| known.revoked.contains_key(digest))
    }

    fn insert(&self, digest: [u8; 32], expires_at: DateTime<Utc>) {
        let mut known = self.state.write().unwrap_or_else(|e| e.into_inner());
        known.revoked.insert(digest, expires_at);
    }

    /// Whether a poll succeeded within the last second (pages trust cookies).
    pub fn is_fresh(&self) -> bool {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_fresh()
    }
}

impl Known {
    fn is_fresh(&self) -> bool {
        self.fresh_as_of.is_some_and(|at| at.elapsed() <= FRESHNESS)
    }
}

/// What one poll found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollReport {
    /// Revoked sessions read (new ones and the overlap already known).
    pub read: usize,
    /// Revoked, unexpired sessions this process now knows of.
    pub known: usize,
}

#[derive(QueryableByName)]
struct Revoked {
    #[diesel(sql_type = Timestamptz)]
    polled_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Bytea>)]
    id_hash: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    expires_at: Option<DateTime<Utc>>,
}

/// One poll: reads the sessions revoked since the previous poll (all revoked,
/// unexpired ones the first time), in one statement on an index.
pub async fn poll_revocations(shop: &Shop) -> Result<PollReport, AppError> {
    let revocations = &shop.revocations;
    let started = Instant::now();
    let (since, full) = {
        let known = revocations.state.read().unwrap_or_else(|e| e.into_inner());
        let full = known
            .fully_read_at
            .is_none_or(|at| at.elapsed() >= FULL_RELOAD_EVERY);
        let since = match known.polled_at {
            Some(at) if !full => at - OVERLAP,
            _ => DateTime::UNIX_EPOCH,
        };
        (since, full)
    };
    let now = Utc::now();
    let rows: Vec<Revoked> = db::run(&revocations.pool, move |conn| {
        // The LEFT JOIN makes an empty answer still say when it was taken.
        Ok(diesel::sql_query(
            "SELECT p.polled_at, s.id_hash, s.expires_at \
             FROM (SELECT now() AS polled_at) p \
             LEFT JOIN sessions s ON s.revoked_at > $1 AND s.expires_at > $2",
        )
        .bind::<Timestamptz, _>(since)
        // Expiry by this process's clock, the clock its cookie check uses.
        .bind::<Timestamptz, _>(now)
        .load(conn)?)
    })
    .await?;
    let polled_at = rows
        .first()
        .map(|row| row.polled_at)
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("revocation poll returned no row")))?;
    let mut known = revocations.state.write().unwrap_or_else(|e| e.into_inner());
    let mut read = 0;
    for row in rows {
        if let (Some(hash), Some(expires_at)) = (row.id_hash, row.expires_at) {
            if let Ok(digest) = <[u8; 32]>::try_from(hash) {
                known.revoked.insert(digest, expires_at);
                read += 1;
            }
        }
    }
    let now = Utc::now();
    known.revoked.retain(|_, expires_at| *expires_at > now);
    // Polls may overlap (the loop and a test's call): keep the latest.
    known.polled_at = known.polled_at.max(Some(polled_at));
    known.fresh_as_of = known.fresh_as_of.max(Some(started));
    if full {
        known.fully_read_at = known.fully_read_at.max(Some(started));
    }
    let report = PollReport {
        read,
        known: known.revoked.len(),
    };
    drop(known);
    metrics::job_run("poll_revoked_sessions");
    Ok(report)
}

/// Polls every `security.session_poll_interval` until the task is aborted.
/// The start-up poll has already run.
pub fn spawn_revocation_poller(shop: Shop) -> JoinHandle<()> {
    let interval = shop.settings.security.session_poll_interval;
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let mut failing = false;
        loop {
            ticker.tick().await;
            match poll_revocations(&shop).await {
                Ok(_) if failing => {
                    tracing::info!("revoked sessions polled again; cookies are trusted again");
                    failing = false;
                }
                Ok(_) => {}
                // Once per outage, not four times a second.
                Err(error) if !failing => {
                    tracing::warn!(%error, "could not poll revoked sessions; pages ask the sessions table until a poll succeeds");
                    failing = true;
                }
                Err(_) => {}
            }
        }
    })
}
