//! Sign-in throttling. Each attempt is written down *before* its password is
//! checked, under an advisory lock per email and per address, so a burst of
//! parallel guesses is counted exactly instead of racing past the limit. A
//! successful sign-in deletes its account's rows; the rest age out of the
//! window and the background job purges them.

use std::net::IpAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::sql_types::Text;

use crate::config::LoginLimits;
use crate::db::schema::login_attempts;
use crate::db::{self, PgConn, PgPool};
use crate::domain::Email;
use crate::error::AppError;

/// Records an attempt for `email` from `ip`, or refuses it with how long to
/// wait when either already had its allowance of attempts in the window.
/// A refused attempt is not recorded, so the wait does not grow while it runs.
pub async fn begin_attempt(
    pool: &PgPool,
    limits: LoginLimits,
    email: &Email,
    ip: IpAddr,
) -> Result<(), AppError> {
    let (email, ip) = (email.as_str().to_string(), ip.to_string());
    db::run(pool, move |conn| {
        conn.transaction(|conn| {
            // Email before address, always: two attempts never wait on each other in a cycle.
            lock(conn, &format!("login-email:{email}"))?;
            lock(conn, &format!("login-ip:{ip}"))?;
            let now = Utc::now();
            let since = now - limits.window;
            let by_email = login_attempts::table
                .filter(login_attempts::email.eq(&email))
                .into_boxed();
            let by_ip = login_attempts::table
                .filter(login_attempts::ip.eq(&ip))
                .into_boxed();
            let free_at = [
                oldest_counted(conn, by_email, limits.per_email, since)?,
                oldest_counted(conn, by_ip, limits.per_ip, since)?,
            ]
            .into_iter()
            .flatten()
            .max();
            if let Some(oldest) = free_at {
                let retry_after = (oldest + limits.window - now)
                    .to_std()
                    .unwrap_or_default()
                    .max(Duration::from_secs(1));
                return Err(AppError::TooManyAttempts { retry_after });
            }
            diesel::insert_into(login_attempts::table)
                .values((
                    login_attempts::email.eq(&email),
                    login_attempts::ip.eq(&ip),
                    login_attempts::attempted_at.eq(now),
                ))
                .execute(conn)?;
            Ok(())
        })
    })
    .await
}

/// The account signed in: its earlier misses no longer count against it.
pub async fn clear_for_account(pool: &PgPool, email: &Email) -> Result<(), AppError> {
    let email = email.as_str().to_string();
    db::run(pool, move |conn| {
        diesel::delete(login_attempts::table.filter(login_attempts::email.eq(email)))
            .execute(conn)?;
        Ok(())
    })
    .await
}

/// Deletes attempts too old to count any more; returns how many.
pub fn purge_expired(conn: &mut PgConn, window: Duration) -> QueryResult<usize> {
    let cutoff = Utc::now() - window;
    diesel::delete(login_attempts::table.filter(login_attempts::attempted_at.lt(cutoff)))
        .execute(conn)
}

fn lock(conn: &mut PgConn, key: &str) -> QueryResult<()> {
    diesel::sql_query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind::<Text, _>(key)
        .execute(conn)
        .map(drop)
}

/// When `limit` or more attempts fall inside the window: the time of the one
/// whose expiry brings the count back under the limit. `None` while under it.
fn oldest_counted(
    conn: &mut PgConn,
    attempts: login_attempts::BoxedQuery<'_, Pg>,
    limit: u32,
    since: DateTime<Utc>,
) -> QueryResult<Option<DateTime<Utc>>> {
    attempts
        .filter(login_attempts::attempted_at.gt(since))
        .order(login_attempts::attempted_at.desc())
        .offset(i64::from(limit) - 1)
        .limit(1)
        .select(login_attempts::attempted_at)
        .first(conn)
        .optional()
}
