//! This process's copy of the revoked sessions that have not expired, and
//! the proof that it is current.
//!
//! The copy is read whole at start-up. From then on a connection of its own
//! `LISTEN`s on `flashsale_session_revoked`, which a trigger on `sessions`
//! notifies as each revocation commits (whoever wrote it, however long its
//! transaction was open), and every `SESSION_POLL_MS` a round trip on that
//! connection, which starts no transaction, proves that nothing sent before
//! it is still missing. So keeping the copy current costs Postgres no
//! transaction at all, busy or idle. While the listener is down, the copy
//! is polled instead, as it always was: one indexed read of the sessions
//! revoked since the previous poll, every interval.
//!
//! The copy is trusted while its last proof (a round trip, or a poll)
//! started at most a second ago: the promise is that a revocation reaches
//! every instance within a second. Past that, pages ask the table.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::sql_types::{Bytea, Nullable, Timestamptz};
use diesel::QueryableByName;
use tokio::task::JoinHandle;

use super::Shop;
use crate::config::Settings;
use crate::db::listener::Listener;
use crate::db::{self, PgPool};
use crate::error::AppError;
use crate::metrics;
use crate::shutdown::StopSignal;

/// The copy is trusted only if a proof that started at most this long ago
/// succeeded.
pub const FRESHNESS: Duration = Duration::from_secs(1);

/// The channel the `sessions_notify_revoked` trigger notifies; its payload
/// is the token digest in hex and the expiry in microseconds.
const CHANNEL: &str = "flashsale_session_revoked";

/// Each poll reads back this far before the previous poll's start, by
/// Postgres's clock. `revoked_at` is the revoking transaction's start, so a
/// revocation committed after the previous poll's snapshot can carry an
/// earlier time; this covers any transaction shorter than the margin (the
/// shop's own revocations are single statements, bounded by the statement
/// timeout).
const OVERLAP: Duration = Duration::from_secs(10);

/// While polling, a transaction open longer than `OVERLAP` (an edit by hand,
/// say) commits a revocation older than the window: so every so often a poll
/// reads every revoked, unexpired session again, and such a revocation takes
/// effect within this long of its commit. (A listener is told at commit.)
const FULL_RELOAD_EVERY: Duration = Duration::from_secs(5);

/// While listening, the copy is still read whole this often: a revocation
/// written with triggers off (a restore, `session_replication_role =
/// replica`) notifies no one.
const SAFETY_READ_EVERY: Duration = Duration::from_secs(60);

/// After the listener fails, the copy is polled this long before listening
/// is tried again.
const RELISTEN_AFTER: Duration = Duration::from_secs(5);

pub struct Revocations {
    state: RwLock<Known>,
    /// Its own connections, so a poll never waits behind a crowd of requests
    /// for the shop's pool (and then every request would fall back to the table).
    pool: PgPool,
    database_url: String,
    connect_timeout: Duration,
}

struct Known {
    /// Token digests, with when each session expires (then it is dropped:
    /// the cookie's own expiry refuses it from then on).
    revoked: HashMap<[u8; 32], DateTime<Utc>>,
    /// Postgres's clock at the start of the last successful poll.
    polled_at: Option<DateTime<Utc>>,
    /// When the last successful proof (round trip or poll) started, by this
    /// process's clock.
    fresh_as_of: Option<Instant>,
    /// When the last poll that read every revoked session started.
    fully_read_at: Option<Instant>,
    /// Whether revocations arrive by notification.
    listening: bool,
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
                listening: false,
            }),
            // Connects on the first poll, not before: a `Shop` built for a
            // command that never serves pages opens nothing here.
            pool: db::build_one_shot_pool(
                &settings.database_url,
                settings.db_statement_timeout,
                settings.db_connect_timeout,
            ),
            database_url: settings.database_url.clone(),
            connect_timeout: settings.db_connect_timeout,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Known> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Known> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the session with this digest was revoked; `None` when the
    /// copy is too old to say.
    pub(super) fn is_revoked(&self, digest: &[u8; 32]) -> Option<bool> {
        let known = self.read();
        known.is_fresh().then(|| known.revoked.contains_key(digest))
    }

    pub(super) fn insert(&self, digest: [u8; 32], expires_at: DateTime<Utc>) {
        self.write().revoked.insert(digest, expires_at);
    }

    /// Whether a proof succeeded within the last second (pages trust cookies).
    pub fn is_fresh(&self) -> bool {
        self.read().is_fresh()
    }

    /// Whether revocations arrive by notification (else by polling).
    pub fn is_listening(&self) -> bool {
        self.read().listening
    }

    fn set_listening(&self, listening: bool) {
        self.write().listening = listening;
    }

    /// Everything committed before `started` is known.
    fn proven(&self, started: Instant) {
        let mut known = self.write();
        known.fresh_as_of = known.fresh_as_of.max(Some(started));
    }

    /// Adds what notifications said; false if one could not be read (the
    /// copy then needs a whole read to be sure of it).
    fn apply(&self, payloads: &[String]) -> bool {
        if payloads.is_empty() {
            return true;
        }
        let mut known = self.write();
        let mut all_read = true;
        for payload in payloads {
            match parse_payload(payload) {
                Some((digest, expires_at)) => {
                    known.revoked.insert(digest, expires_at);
                }
                None => all_read = false,
            }
        }
        all_read
    }
}

impl Known {
    fn is_fresh(&self) -> bool {
        self.fresh_as_of.is_some_and(|at| at.elapsed() <= FRESHNESS)
    }
}

/// `<digest in hex> <expiry in µs since the epoch>`, as the trigger writes it.
fn parse_payload(payload: &str) -> Option<([u8; 32], DateTime<Utc>)> {
    let (digest, expires) = payload.split_once(' ')?;
    let digest = <[u8; 32]>::try_from(hex::decode(digest).ok()?).ok()?;
    let expires = DateTime::from_timestamp_micros(expires.parse().ok()?)?;
    Some((digest, expires))
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
/// unexpired ones the first time and every `FULL_RELOAD_EVERY`), in one
/// statement on an index.
pub async fn poll_revocations(shop: &Shop) -> Result<PollReport, AppError> {
    poll(shop, false).await
}

async fn poll(shop: &Shop, whole: bool) -> Result<PollReport, AppError> {
    let revocations = &shop.revocations;
    let started = Instant::now();
    let (since, full) = {
        let known = revocations.read();
        let full = whole
            || known
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
        use diesel::RunQueryDsl;
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
    let mut known = revocations.write();
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

/// Keeps the copy current until `stop` fires: listening while it can,
/// polling every `security.session_poll_interval` while it cannot. The
/// start-up poll has already run.
///
/// Unlike the other jobs it is stopped wherever it is: it only reads
/// (revoked sessions into this process's memory, which ends with it), so
/// there is no run to finish and nothing to hand back.
pub fn spawn_revocation_watcher(shop: Shop, mut stop: StopSignal) -> JoinHandle<()> {
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.stopped() => {}
            _ = watch_until_aborted(shop) => {}
        }
    })
}

async fn watch_until_aborted(shop: Shop) {
    let interval = shop.settings.security.session_poll_interval;
    // Once per outage, not four times a second.
    let mut failing = false;
    loop {
        match listen(&shop).await {
            Ok(listener) => {
                if failing {
                    tracing::info!("listening for revoked sessions again");
                }
                let error = watch(&shop, listener, interval).await;
                tracing::warn!(%error, "lost the revoked-sessions listener; polling until it is back");
                failing = true;
            }
            Err(error) if !failing => {
                tracing::warn!(%error, "could not listen for revoked sessions; polling meanwhile");
                failing = true;
            }
            Err(_) => {}
        }
        shop.revocations.set_listening(false);
        poll_for(&shop, interval, RELISTEN_AFTER).await;
    }
}

async fn listen(shop: &Shop) -> Result<Listener, AppError> {
    let revocations = &shop.revocations;
    let listener = Listener::listen(
        &revocations.database_url,
        CHANNEL,
        revocations.connect_timeout,
    )
    .await?;
    poll(shop, true).await?;
    revocations.set_listening(true);
    Ok(listener)
}

/// Applies notifications as they come and proves the copy current every
/// `interval`, until the connection fails.
async fn watch(shop: &Shop, mut listener: Listener, interval: Duration) -> AppError {
    let revocations = &shop.revocations;
    let mut next_proof = tokio::time::Instant::now();
    let mut next_whole_read = next_proof + SAFETY_READ_EVERY;
    let mut whole_read: Option<JoinHandle<()>> = None;
    loop {
        let now = tokio::time::Instant::now();
        if now >= next_proof {
            let started = Instant::now();
            match listener.round_trip(FRESHNESS).await {
                Ok(payloads) => {
                    if !revocations.apply(&payloads) {
                        next_whole_read = now;
                    }
                    revocations.proven(started);
                }
                Err(error) => return error,
            }
            next_proof = now + interval;
        }
        if now >= next_whole_read {
            next_whole_read = now + SAFETY_READ_EVERY;
            // On a task of its own: a slow read (Postgres under load) must
            // not hold up the next proof, or the copy would go stale and
            // every signed-in page would ask the table just then. A poll
            // only adds to the copy, so it may overlap notifications.
            if whole_read.as_ref().is_none_or(JoinHandle::is_finished) {
                let shop = shop.clone();
                whole_read = Some(tokio::spawn(async move {
                    if let Err(error) = poll(&shop, true).await {
                        tracing::warn!(%error, "could not read the revoked sessions whole");
                    }
                }));
            }
        }
        match listener
            .notifications(next_proof.min(next_whole_read))
            .await
        {
            Ok(payloads) => {
                if !revocations.apply(&payloads) {
                    tracing::warn!(
                        "a revoked-session notification could not be read; reading them all"
                    );
                    next_whole_read = tokio::time::Instant::now();
                }
            }
            Err(error) => return error,
        }
    }
}

/// Polls every `interval` for `span`, the first at once.
async fn poll_for(shop: &Shop, interval: Duration, span: Duration) {
    let until = tokio::time::Instant::now() + span;
    loop {
        if let Err(error) = poll_revocations(shop).await {
            tracing::debug!(%error, "could not poll revoked sessions; pages ask the sessions table until a poll succeeds");
        }
        let now = tokio::time::Instant::now();
        if now >= until {
            return;
        }
        tokio::time::sleep(interval.min(until - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::parse_payload;

    #[test]
    fn payloads_read_as_the_trigger_writes_them() {
        let digest = "ab".repeat(32);
        let (read, expires) = parse_payload(&format!("{digest} 1767225600000000")).unwrap();
        assert_eq!(read, [0xab; 32]);
        assert_eq!(expires.timestamp(), 1_767_225_600);
        assert!(parse_payload("ab 1").is_none());
        assert!(parse_payload(&digest).is_none());
        assert!(parse_payload(&format!("{digest} soon")).is_none());
    }
}
