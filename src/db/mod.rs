//! The database: connection pool, the one helper that runs blocking Diesel
//! code off the async executor, migrations, and the row types.

mod backfill;
pub mod error;
pub mod fence;
pub mod holdings;
pub mod listener;
pub mod models;
pub mod prepared;
pub mod schema;

use std::time::Duration;

use diesel::connection::{InstrumentationEvent, SimpleConnection};
use diesel::pg::PgConnection;
use diesel::r2d2::{
    ConnectionManager, CustomizeConnection, ManageConnection, Pool, PooledConnection,
    R2D2Connection,
};
use diesel::{Connection, RunQueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use crate::error::AppError;

pub type PgPool = Pool<PgManager>;
/// What services take: a plain connection (pooled or not).
pub type PgConn = PgConnection;

/// A pooled connection that remembers the server dropped it. Diesel calls a
/// connection broken only when a transaction failed half-way, so one that died
/// idle in the pool (a Postgres restart) would be lent out again and again,
/// each time answering "no connection to the server".
pub struct PooledPg {
    conn: PgConnection,
    lost: bool,
    /// Since when its plans were made; see `PLANNER`.
    plans_since: std::time::Instant,
}

impl std::ops::Deref for PooledPg {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for PooledPg {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

/// Diesel's connection manager, discarding connections found lost.
pub struct PgManager(ConnectionManager<PgConnection>);

impl PgManager {
    fn new(database_url: &str) -> PgManager {
        PgManager(ConnectionManager::new(without_gss_probe(database_url)))
    }
}

/// The URL with libpq's GSSAPI-encryption probe turned off, unless the
/// operator asked for a `gssencmode` of their own. Left at its default
/// (`prefer`), libpq asks Kerberos for credentials on every connect, and
/// Kerberos's exit handlers destroy the mutex it takes for that: a pool
/// thread still connecting as the process ends (a database that just went
/// away keeps it trying) then aborts the process in `k5_mutex_lock`, which
/// CI saw after a passing `database_unreachable_answers_503`. The shop's
/// connections never use Kerberos.
pub fn without_gss_probe(database_url: &str) -> String {
    if database_url.contains("gssencmode") {
        return database_url.to_string();
    }
    if database_url.starts_with("postgres://") || database_url.starts_with("postgresql://") {
        // libpq refuses an empty parameter, so a URL that already ends in
        // its separator gets none added.
        let separator = match database_url.rfind('?') {
            None => "?",
            Some(_) if database_url.ends_with(['?', '&']) => "",
            Some(_) => "&",
        };
        format!("{database_url}{separator}gssencmode=disable")
    } else if database_url.contains('=') {
        format!("{database_url} gssencmode=disable")
    } else {
        // A bare database name (the listener passes the URL as `dbname`):
        // anything appended would make libpq read it as key=value pairs.
        database_url.to_string()
    }
}

impl ManageConnection for PgManager {
    type Connection = PooledPg;
    type Error = diesel::r2d2::Error;

    fn connect(&self) -> Result<PooledPg, Self::Error> {
        Ok(PooledPg {
            conn: self.0.connect()?,
            lost: false,
            plans_since: std::time::Instant::now(),
        })
    }

    fn is_valid(&self, pooled: &mut PooledPg) -> Result<(), Self::Error> {
        self.0.is_valid(&mut pooled.conn)
    }

    fn has_broken(&self, pooled: &mut PooledPg) -> bool {
        pooled.lost || self.0.has_broken(&mut pooled.conn)
    }
}

pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// How the shop's connections plan: Postgres's default, a statement's
/// generic plan kept once it costs no more than planning it afresh. The
/// foreign-key checks a purchase fires (`SELECT 1 FROM orders WHERE id = $1
/// FOR KEY SHARE`, three per order and as many on customers and products)
/// are among them, and planning each afresh cost a 32-buyer batch's
/// statement 5.6 ms against 3.2 ms (pgbench, `plan_cache_mode =
/// force_custom_plan` against `auto`, on the same server).
///
/// The catch: a generic plan is made with the table's size at the time.
/// Made while a sale's tables were still nearly empty (a new shop, or the
/// first sale after they were analyzed) a check's plan is a sequential
/// scan, and each check then reads the whole table, slower and slower as
/// the sale fills it: the same batch went from 15 ms to 85 ms per
/// transaction within 24 s that way. So each connection drops its plans
/// every `PLANS_KEPT` (`DISCARD PLANS`, which keeps its prepared statements)
/// and makes them again from the tables as they are: a plan is dropped the
/// first time its connection is lent out after `PLANS_KEPT`. (Pricing
/// sequential scans out instead made the shelf's read of the small,
/// much-updated `products` table a full index scan of 30 to 200 ms.)
const PLANNER: &str = "SET plan_cache_mode = auto";

/// How long a connection keeps its plans; see `PLANNER`.
pub const PLANS_KEPT: Duration = Duration::from_secs(1);

/// Every pooled connection gets a statement timeout, so no query can hold a
/// row lock longer than the Redis lease that guards it.
#[derive(Debug, Clone, Copy)]
struct SessionDefaults {
    statement_timeout: Duration,
    wait_for_flush: bool,
}

impl CustomizeConnection<PooledPg, diesel::r2d2::Error> for SessionDefaults {
    fn on_acquire(&self, conn: &mut PooledPg) -> Result<(), diesel::r2d2::Error> {
        // Counted in the shop rather than by pg_stat_statements, which needs
        // a server restart to load: the benchmark reports statements per
        // answer from this counter.
        conn.conn
            .set_instrumentation(|event: InstrumentationEvent<'_>| {
                if matches!(event, InstrumentationEvent::StartQuery { .. }) {
                    crate::metrics::db_statement();
                }
            });
        let ms = self.statement_timeout.as_millis();
        let commit = if self.wait_for_flush { "on" } else { "off" };
        conn.batch_execute(&format!(
            "SET statement_timeout = {ms}; SET idle_in_transaction_session_timeout = {ms}; \
             SET TIME ZONE 'UTC'; SET synchronous_commit = {commit}; {PLANNER}"
        ))
        .map_err(diesel::r2d2::Error::QueryError)
    }
}

/// The pool for everything that matters: commits wait until they are on disk.
pub fn build_pool(
    database_url: &str,
    size: u32,
    statement_timeout: Duration,
    connect_timeout: Duration,
) -> PgPool {
    pool_of(database_url, size, statement_timeout, connect_timeout, true)
}

/// Readies the process for libpq. libpq links OpenSSL, even for
/// connections without TLS, and left to itself initialises it with a
/// cleanup that runs at exit and frees OpenSSL's locks: a pool thread still
/// connecting then (a database that just went away keeps it trying) crashes
/// the ending process with SIGSEGV. Initialised here first, without that
/// cleanup, it never runs. Call before the first connection; again is free.
pub fn init_libpq() {
    openssl_sys::init();
}

/// A pool for a command that does one thing and exits: it opens connections
/// only when asked for one, on the caller's behalf. The shop's pool keeps
/// idle connections warm from background threads; a process that exits
/// while one of them is still inside libpq's TLS handshake can crash in
/// OpenSSL's exit handlers.
pub fn build_one_shot_pool(
    database_url: &str,
    statement_timeout: Duration,
    connect_timeout: Duration,
) -> PgPool {
    Pool::builder()
        .max_size(4)
        .min_idle(Some(0))
        .connection_timeout(connect_timeout)
        .test_on_check_out(false)
        .connection_customizer(Box::new(SessionDefaults {
            statement_timeout,
            wait_for_flush: true,
        }))
        .build_unchecked(PgManager::new(database_url))
}

/// The pool for request bookkeeping (idempotency keys), whose commits do not
/// wait for the log flush and so do not queue for the disk beside purchases.
/// Nothing is risked: the log is one sequence, so a claimed key is on disk by
/// the time the purchase it guards commits (that commit flushes the log past
/// it), and a saved answer lost to a database crash leaves the key "in
/// progress", as a shop process killed before saving it already does.
pub fn build_bookkeeping_pool(
    database_url: &str,
    size: u32,
    statement_timeout: Duration,
    connect_timeout: Duration,
) -> PgPool {
    pool_of(
        database_url,
        size,
        statement_timeout,
        connect_timeout,
        false,
    )
}

fn pool_of(
    database_url: &str,
    size: u32,
    statement_timeout: Duration,
    connect_timeout: Duration,
    wait_for_flush: bool,
) -> PgPool {
    init_libpq();
    Pool::builder()
        .max_size(size)
        .min_idle(Some(2))
        .connection_timeout(connect_timeout)
        .test_on_check_out(false)
        .connection_customizer(Box::new(SessionDefaults {
            statement_timeout,
            wait_for_flush,
        }))
        // build_unchecked: the shop starts even while Postgres is still coming
        // up, and answers 503 until it is reachable.
        .build_unchecked(PgManager::new(database_url))
}

/// Runs blocking Diesel work on the blocking thread pool with a pooled connection.
pub async fn run<T, F>(pool: &PgPool, work: F) -> Result<T, AppError>
where
    F: FnOnce(&mut PgConn) -> Result<T, AppError> + Send + 'static,
    T: Send + 'static,
{
    let pool = pool.clone();
    actix_web::web::block(move || {
        let pooled = pool
            .get()
            .map_err(|e| AppError::Unavailable(format!("database connection: {e}")))?;
        with_pooled(pooled, work)
    })
    .await
    .map_err(|e| AppError::Internal(anyhow::anyhow!("blocking task failed: {e}")))?
}

/// `work` in a transaction, like Diesel's `Connection::transaction`, except
/// that a COMMIT whose answer was lost is `AppError::OutcomeUnknown`, never
/// an error that reads as "nothing happened": Diesel reports it as the same
/// lost-connection error as a statement that never ran.
pub fn transaction<T, E>(
    conn: &mut PgConn,
    work: impl FnOnce(&mut PgConn) -> Result<T, E>,
) -> Result<T, E>
where
    E: From<diesel::result::Error> + From<AppError>,
{
    use diesel::connection::{AnsiTransactionManager, TransactionManager};
    AnsiTransactionManager::begin_transaction(conn)?;
    match work(conn) {
        Ok(value) => match AnsiTransactionManager::commit_transaction(conn) {
            Ok(()) => Ok(value),
            Err(error) => Err(error::commit_failed(error).into()),
        },
        Err(work_error) => match AnsiTransactionManager::rollback_transaction(conn) {
            // A broken manager means the work's own error is the story.
            Ok(()) | Err(diesel::result::Error::BrokenTransactionManager) => Err(work_error),
            Err(rollback_error) => Err(rollback_error.into()),
        },
    }
}

/// `SELECT 1` on a pooled connection, waiting at most `wait` for one (blocking).
pub fn answers_within(pool: &PgPool, wait: Duration) -> bool {
    pool.get_timeout(wait).is_ok_and(|pooled| {
        with_pooled(pooled, |conn| {
            Ok(diesel::sql_query("SELECT 1").execute(conn)?)
        })
        .is_ok()
    })
}

/// Runs `work` and, when it failed in a way a dropped connection could
/// explain, checks the connection so a lost one leaves the pool.
fn with_pooled<T>(
    mut pooled: PooledConnection<PgManager>,
    work: impl FnOnce(&mut PgConn) -> Result<T, AppError>,
) -> Result<T, AppError> {
    if pooled.plans_since.elapsed() >= PLANS_KEPT {
        if let Err(error) = pooled.conn.batch_execute("DISCARD PLANS") {
            // Nothing was sent for `work` yet: the connection leaves the
            // pool and the caller hears the database is unreachable.
            pooled.lost = true;
            return Err(AppError::Unavailable(format!(
                "the database connection failed: {error}"
            )));
        }
        pooled.plans_since = std::time::Instant::now();
    }
    let result = work(&mut pooled.conn);
    if matches!(
        result,
        Err(AppError::Unavailable(_) | AppError::OutcomeUnknown(_) | AppError::Internal(_))
    ) && pooled.conn.ping().is_err()
    {
        pooled.lost = true;
    }
    result
}

/// Any number that no other advisory lock of this database uses.
const MIGRATION_LOCK: i64 = 0x666c_6173_6873_616c; // "flashsal"

pub fn run_migrations(database_url: &str) -> anyhow::Result<()> {
    let mut conn = PgConnection::establish(database_url)?;
    // Instances started together (a rolling deploy, a systemd restart of
    // all) migrate one at a time: the second finds nothing pending instead
    // of racing the first to create the same tables. The lock is the
    // session's, so it goes with the connection if this process dies.
    diesel::sql_query(format!("SELECT pg_advisory_lock({MIGRATION_LOCK})")).execute(&mut conn)?;
    let migrated = conn
        .run_pending_migrations(MIGRATIONS)
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("migrations failed: {e}"))
        .and_then(|()| {
            backfill::place_rooms_drawn_without_positions(&mut conn)
                .map(|_| ())
                .map_err(|e| {
                    anyhow::anyhow!("placing the waiting rooms drawn before positions: {e}")
                })
        });
    diesel::sql_query(format!("SELECT pg_advisory_unlock({MIGRATION_LOCK})")).execute(&mut conn)?;
    migrated
}

/// Creates the database named in `database_url` if it does not exist yet.
pub fn create_database_if_missing(database_url: &str) -> anyhow::Result<()> {
    if PgConnection::establish(database_url).is_ok() {
        return Ok(());
    }
    let (server_url, name) = split_database_url(database_url)?;
    // The URL's parameters come along: with several hosts,
    // target_session_attrs=read-write is what finds the primary.
    let parameters = database_url
        .split_once('?')
        .map_or(String::new(), |(_, p)| format!("?{p}"));
    let mut conn = PgConnection::establish(&format!("{server_url}/postgres{parameters}"))?;
    diesel::sql_query(format!("CREATE DATABASE \"{name}\"")).execute(&mut conn)?;
    Ok(())
}

/// Splits `postgres://user@host:port/name?params` into the server part and the database name.
pub fn split_database_url(database_url: &str) -> anyhow::Result<(String, String)> {
    let without_params = database_url.split('?').next().unwrap_or(database_url);
    let (server, name) = without_params
        .rsplit_once('/')
        .filter(|(server, name)| {
            server.contains("://") && !server.ends_with('/') && !name.is_empty()
        })
        .ok_or_else(|| {
            anyhow::anyhow!(
                "DATABASE_URL {:?} names no database",
                without_password(database_url)
            )
        })?;
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        anyhow::bail!("database name {name:?} has unexpected characters");
    }
    Ok((server.to_string(), name.to_string()))
}

/// `url` with the password of its user info, if any, replaced by `***`: a
/// connection string said in an error or a log must not carry its secret.
pub fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((user_info, hosts)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{hosts}")
        }
        _ => url.to_string(),
    }
}

/// The namespace of this database's Redis keys, created by its migrations.
pub async fn redis_namespace(pool: &PgPool) -> Result<String, AppError> {
    use diesel::prelude::*;
    use schema::deployment;
    run(pool, |conn| {
        Ok(deployment::table
            .select(deployment::redis_namespace)
            .first(conn)?)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::{split_database_url, without_gss_probe, without_password};

    #[test]
    fn a_connection_string_is_said_without_its_password() {
        assert_eq!(
            without_password("postgres://shop:s3cret@h1:5432,h2:5432/shop?x=1"),
            "postgres://shop:***@h1:5432,h2:5432/shop?x=1"
        );
        assert_eq!(
            without_password("postgres://u@h/shop"),
            "postgres://u@h/shop"
        );
        let refused = split_database_url("postgres://shop:s3cret@h1:5432").unwrap_err();
        assert!(!refused.to_string().contains("s3cret"), "{refused}");
    }

    #[test]
    fn the_gss_probe_is_turned_off_in_every_form_of_connection_string() {
        assert_eq!(
            without_gss_probe("postgres://u@h:5432/shop"),
            "postgres://u@h:5432/shop?gssencmode=disable"
        );
        assert_eq!(
            without_gss_probe("postgresql://u@h/shop?sslmode=require"),
            "postgresql://u@h/shop?sslmode=require&gssencmode=disable"
        );
        assert_eq!(
            without_gss_probe("postgres://u@h/shop?"),
            "postgres://u@h/shop?gssencmode=disable"
        );
        assert_eq!(
            without_gss_probe("host=h dbname=shop"),
            "host=h dbname=shop gssencmode=disable"
        );
    }

    #[test]
    fn a_bare_database_name_is_left_as_it_is() {
        assert_eq!(without_gss_probe("shop"), "shop");
    }

    #[test]
    fn an_operators_own_gssencmode_is_kept() {
        let url = "postgres://u@h/shop?gssencmode=require";
        assert_eq!(without_gss_probe(url), url);
    }
}
