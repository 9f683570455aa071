//! Settings come from the environment so one binary serves a laptop, CI and a
//! real deployment; tests build `Settings` directly (`Settings::for_tests`)
//! and change any field, so nothing a test needs is read from the process
//! environment behind the builder's back.

mod env;
mod mail;
mod security;

pub use mail::SmtpServer;
pub use security::{DoorSettings, LoginLimits, SecuritySettings, TrustedProxies, MAX_CHECK_WORK};

use std::time::Duration;

use anyhow::{bail, Context};

use env::{on_off, parse_var, split_urls, var};

#[derive(Debug, Clone)]
pub struct Settings {
    pub database_url: String,
    pub db_pool_size: u32,
    /// Bounds every SQL statement; the lock lease is always longer.
    pub db_statement_timeout: Duration,
    /// How long a request waits for a free database connection before answering 503.
    pub db_connect_timeout: Duration,
    /// One URL, or several separated by commas for a Redlock quorum.
    pub redis_urls: Vec<String>,
    /// `REDIS_URL` names the seed nodes of one Redis Cluster (`REDIS_CLUSTER=on`)
    /// instead of independent servers.
    pub redis_cluster: bool,
    /// Prepended to every Redis key, so deployments (and tests) sharing one Redis stay apart.
    pub redis_key_prefix: String,
    pub bind: String,
    pub lock_wait: Duration,
    pub lock_lease: Duration,
    pub payment_timeout: Duration,
    /// How often the background jobs (order expiry, key purge) run.
    pub jobs_interval: Duration,
    /// How long an idempotency key and its answer are kept.
    pub idempotency_retention: Duration,
    /// How long the stock gate remembers a refused purchase under its
    /// idempotency key, so a resend gets the same answer. A refusal changed
    /// nothing, so a resend after this is simply decided again; kept short
    /// because a crowd's refusals are many (`REFUSAL_RETENTION_SECS`).
    pub refusal_retention: Duration,
    /// Whether the Redis stock gate turns away sold-out buyers before the lock.
    pub stock_gate: bool,
    /// Serve queued buyers of one product in one transaction per lock hold
    /// (`COMBINING=on|off`), at most `combine_max` of them at a time.
    pub combining: bool,
    pub combine_max: usize,
    /// Products whose batches one purchase transaction may carry together
    /// (`COMBINE_PRODUCTS`; 1 gives each batch its own transaction).
    pub combine_products: usize,
    /// Take the Redis lock around stock changes. Not configurable from the
    /// environment: only the benchmark turns it off, to measure what it costs.
    pub redis_lock: bool,
    /// How often the gate is compared with the database and corrected.
    pub reconcile_interval: Duration,
    /// How long a gate admission may stay pending (admitted, not yet written
    /// nor given back) before reconcile counts its buyer as gone and hands
    /// its units back; see `gate_pending_ttl()` for the default.
    pub gate_pending_ttl: Option<Duration>,
    /// Tests only: fail every purchase right after the gate admits it.
    pub inject_fault_after_admission: bool,
    /// 64 bytes that sign and encrypt session cookies; every instance of one shop must share it.
    pub session_key: Vec<u8>,
    pub cookie_secure: bool,
    /// Sign-in throttling, trusted proxies, session lifetime.
    pub security: SecuritySettings,
    /// Whether `GET /metrics` answers (`METRICS=on|off`).
    pub metrics: bool,
    /// Who charges cards: one of `payment::PROVIDERS` (`PAYMENT_PROVIDER`).
    pub payment_provider: String,
    /// How long a payment waits for the provider's answer before the
    /// attempt is left pending for the settling job.
    pub payment_provider_timeout: Duration,
    /// How long a waiting room's pass lets its holder buy (`QUEUE_PASS_SECS`).
    pub queue_pass: Duration,
    /// How often each process runs the waiting rooms' tick: the draw,
    /// passes, lapses and the Postgres record (`QUEUE_TICK_MS`). A unit that
    /// comes back admits the next waiter within about this long.
    pub queue_tick: Duration,
    /// At most this many joins share one insert and one commit
    /// (`QUEUE_JOIN_MAX`).
    pub queue_join_max: usize,
    /// After SIGTERM, how long `/readyz` answers 503 while every request
    /// that still arrives is served, before the process stops accepting
    /// (`DRAIN_SECONDS`): a load balancer needs a poll or two to notice.
    pub drain: Duration,
    /// Then at most this long, all steps together, for what is in flight
    /// (requests, give-backs, the jobs' current run) to finish before the
    /// process exits anyway (`SHUTDOWN_TIMEOUT_SECS`).
    pub shutdown_timeout: Duration,
    /// Where the customer's mail goes out (`SMTP_URL`, `smtp://host:port`);
    /// without it messages wait in the outbox, visible on `/admin/mail`.
    pub smtp_url: Option<String>,
    /// The sender of the customer's mail (`MAIL_FROM`).
    pub mail_from: String,
    /// The right-hand side of every Message-ID (`MAIL_DOMAIN`).
    pub mail_domain: String,
    /// The shop's address as customers reach it, for links in mail (`SHOP_URL`).
    pub shop_url: String,
    /// How often the mail job looks for messages to send (`MAIL_INTERVAL_MS`).
    pub mail_interval: Duration,
}

impl Settings {
    pub const DEFAULT_DATABASE_URL: &'static str =
        "postgres://postgres:postgres@127.0.0.1:5432/flashsale";
    pub const DEFAULT_REDIS_URL: &'static str = "redis://127.0.0.1:6379";
    pub const DEFAULT_MAIL_FROM: &'static str = "flashsale <shop@flashsale.test>";
    pub const DEFAULT_MAIL_DOMAIN: &'static str = "flashsale.test";
    pub const DEFAULT_SHOP_URL: &'static str = "http://127.0.0.1:8080";

    pub fn from_env() -> anyhow::Result<Settings> {
        let settings = Settings {
            database_url: var("DATABASE_URL").unwrap_or_else(|| Self::DEFAULT_DATABASE_URL.into()),
            db_pool_size: parse_var("DB_POOL_SIZE", 16)?,
            db_statement_timeout: Duration::from_millis(parse_var(
                "DB_STATEMENT_TIMEOUT_MS",
                5_000,
            )?),
            db_connect_timeout: Duration::from_millis(parse_var("DB_CONNECT_TIMEOUT_MS", 3_000)?),
            redis_urls: split_urls(
                &var("REDIS_URL").unwrap_or_else(|| Self::DEFAULT_REDIS_URL.into()),
            ),
            redis_cluster: on_off("REDIS_CLUSTER", false)?,
            redis_key_prefix: var("REDIS_KEY_PREFIX").unwrap_or_default(),
            bind: var("BIND").unwrap_or_else(|| "127.0.0.1:8080".into()),
            lock_wait: Duration::from_millis(parse_var("LOCK_WAIT_MS", 3_000)?),
            lock_lease: Duration::from_millis(parse_var("LOCK_LEASE_MS", 15_000)?),
            payment_timeout: Duration::from_secs(parse_var("PAYMENT_TIMEOUT", 600)?),
            jobs_interval: Duration::from_secs(parse_var("JOBS_INTERVAL", 30)?),
            stock_gate: on_off("STOCK_GATE", true)?,
            combining: on_off("COMBINING", true)?,
            combine_max: parse_var("COMBINE_MAX", 32)?,
            combine_products: parse_var("COMBINE_PRODUCTS", 64)?,
            redis_lock: true,
            reconcile_interval: Duration::from_secs(parse_var("RECONCILE_INTERVAL", 60)?),
            gate_pending_ttl: var("GATE_PENDING_TTL_MS")
                .map(|_| parse_var("GATE_PENDING_TTL_MS", 0).map(Duration::from_millis))
                .transpose()?,
            inject_fault_after_admission: false,
            idempotency_retention: Duration::from_secs(
                3600 * parse_var("IDEMPOTENCY_RETENTION_HOURS", 24)?,
            ),
            refusal_retention: Duration::from_secs(parse_var("REFUSAL_RETENTION_SECS", 600)?),
            session_key: match var("SESSION_KEY") {
                Some(key) => hex::decode(key.trim()).context("SESSION_KEY must be hex")?,
                None => {
                    tracing::warn!("SESSION_KEY is not set: using a random key, so sessions end when the process stops");
                    random_session_key()
                }
            },
            cookie_secure: parse_var("COOKIE_SECURE", false)?,
            security: SecuritySettings::from_env()?,
            // Anything but `off` keeps it on, as it always has.
            metrics: !var("METRICS").is_some_and(|v| v.trim().eq_ignore_ascii_case("off")),
            payment_provider: var("PAYMENT_PROVIDER").unwrap_or_else(|| "sandbox".into()),
            payment_provider_timeout: Duration::from_millis(parse_var(
                "PAYMENT_PROVIDER_TIMEOUT_MS",
                10_000,
            )?),
            queue_pass: Duration::from_secs(parse_var("QUEUE_PASS_SECS", 120)?),
            queue_tick: Duration::from_millis(parse_var("QUEUE_TICK_MS", 250)?),
            queue_join_max: parse_var("QUEUE_JOIN_MAX", 1_000)?,
            drain: Duration::from_secs(parse_var("DRAIN_SECONDS", 5)?),
            shutdown_timeout: Duration::from_secs(parse_var("SHUTDOWN_TIMEOUT_SECS", 30)?),
            smtp_url: var("SMTP_URL").map(|url| url.trim().to_string()),
            mail_from: var("MAIL_FROM").unwrap_or_else(|| Self::DEFAULT_MAIL_FROM.into()),
            mail_domain: var("MAIL_DOMAIN").unwrap_or_else(|| Self::DEFAULT_MAIL_DOMAIN.into()),
            shop_url: var("SHOP_URL")
                .map(|url| url.trim().trim_end_matches('/').to_string())
                .unwrap_or_else(|| Self::DEFAULT_SHOP_URL.into()),
            mail_interval: Duration::from_millis(parse_var("MAIL_INTERVAL_MS", 1_000)?),
        };
        settings.validate()?;
        Ok(settings)
    }

    /// Settings for a throw-away instance (tests, benchmarks) on the given database and Redis prefix.
    pub fn for_tests(database_url: &str, redis_key_prefix: &str) -> Settings {
        Settings {
            database_url: database_url.into(),
            db_pool_size: 16,
            db_statement_timeout: Duration::from_secs(5),
            db_connect_timeout: Duration::from_secs(3),
            redis_urls: split_urls(
                &var("REDIS_URL").unwrap_or_else(|| Self::DEFAULT_REDIS_URL.into()),
            ),
            redis_cluster: false,
            redis_key_prefix: redis_key_prefix.into(),
            bind: "127.0.0.1:0".into(),
            lock_wait: Duration::from_secs(3),
            lock_lease: Duration::from_secs(15),
            payment_timeout: Duration::from_secs(600),
            jobs_interval: Duration::from_secs(30),
            // The suite runs with the gate on and again with STOCK_GATE=off.
            stock_gate: on_off("STOCK_GATE", true).unwrap_or(true),
            // ... and again with COMBINING=off.
            combining: on_off("COMBINING", true).unwrap_or(true),
            combine_max: 32,
            combine_products: 64,
            redis_lock: true,
            reconcile_interval: Duration::from_secs(60),
            gate_pending_ttl: None,
            inject_fault_after_admission: false,
            idempotency_retention: Duration::from_secs(24 * 3600),
            refusal_retention: Duration::from_secs(600),
            session_key: random_session_key(),
            cookie_secure: false,
            security: SecuritySettings {
                // A throw-away shop's visitors are the suite's own clients,
                // by the hundred from one address; the door's own tests
                // set it as a real shop has it.
                door: DoorSettings {
                    signup_work: 1,
                    join_work: 1,
                    signups_per_address: 1_000_000,
                    joins_per_address: 1_000_000,
                    ..SecuritySettings::default().door
                },
                ..SecuritySettings::default()
            },
            metrics: true,
            payment_provider: "sandbox".into(),
            payment_provider_timeout: Duration::from_secs(10),
            queue_pass: Duration::from_secs(120),
            queue_tick: Duration::from_millis(250),
            queue_join_max: 1_000,
            drain: Duration::from_secs(5),
            shutdown_timeout: Duration::from_secs(30),
            smtp_url: None,
            mail_from: Self::DEFAULT_MAIL_FROM.into(),
            mail_domain: Self::DEFAULT_MAIL_DOMAIN.into(),
            shop_url: Self::DEFAULT_SHOP_URL.into(),
            mail_interval: Duration::from_millis(200),
        }
    }

    /// Twice the longest a live admission can take to reach Postgres (its
    /// wait for the lock plus a statement), unless set.
    pub fn gate_pending_ttl(&self) -> Duration {
        self.gate_pending_ttl
            .unwrap_or(2 * (self.lock_wait + self.db_statement_timeout))
    }

    /// How long after claiming an idempotency key a purchase may still
    /// commit: its wait for a connection and for the lock, then at most its
    /// lease (the transaction checks the lease before COMMIT) and one more
    /// statement; twice that, for margin. A purchase's claim older than this
    /// without an order will never get one.
    pub fn longest_purchase(&self) -> Duration {
        2 * (self.db_connect_timeout + self.lock_wait + self.lock_lease + self.db_statement_timeout)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.redis_urls.is_empty() {
            bail!("REDIS_URL names no server");
        }
        if self.session_key.len() < 64 {
            bail!("SESSION_KEY must be at least 64 bytes (128 hex characters)");
        }
        if self.payment_provider_timeout.is_zero() {
            bail!("PAYMENT_PROVIDER_TIMEOUT_MS must be at least 1");
        }
        if self.combine_max == 0 {
            bail!("COMBINE_MAX must be at least 1");
        }
        if self.combine_products == 0 {
            bail!("COMBINE_PRODUCTS must be at least 1");
        }
        if self.jobs_interval.is_zero() {
            bail!("JOBS_INTERVAL must be at least one second");
        }
        // A zero period would panic inside the reconcile job's timer, long
        // after start-up said all was well.
        if self.reconcile_interval.is_zero() {
            bail!("RECONCILE_INTERVAL must be at least one second");
        }
        if self.refusal_retention.is_zero() {
            bail!("REFUSAL_RETENTION_SECS must be at least 1");
        }
        if self.gate_pending_ttl().is_zero() {
            bail!("GATE_PENDING_TTL_MS must be at least 1");
        }
        if self.queue_pass.is_zero() {
            bail!("QUEUE_PASS_SECS must be at least 1");
        }
        if self.queue_tick.is_zero() {
            bail!("QUEUE_TICK_MS must be at least 1");
        }
        if self.queue_join_max == 0 {
            bail!("QUEUE_JOIN_MAX must be at least 1");
        }
        if self.shutdown_timeout.is_zero() {
            bail!("SHUTDOWN_TIMEOUT_SECS must be at least 1, or a stop would cut purchases off half way");
        }
        if self.mail_interval.is_zero() {
            bail!("MAIL_INTERVAL_MS must be at least 1");
        }
        if let Some(url) = &self.smtp_url {
            SmtpServer::parse(url)?;
        }
        if self.mail_from.parse::<lettre::message::Mailbox>().is_err() {
            bail!(
                "MAIL_FROM={:?} is not a mail address (like `Shop <shop@example.com>`)",
                self.mail_from
            );
        }
        if self.lock_lease <= self.db_statement_timeout {
            bail!("LOCK_LEASE_MS must be longer than DB_STATEMENT_TIMEOUT_MS, or a slow statement could outlive the lock");
        }
        Ok(())
    }
}

pub fn random_session_key() -> Vec<u8> {
    use rand::RngCore;
    let mut key = vec![0u8; 64];
    rand::thread_rng().fill_bytes(&mut key);
    key
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// `LOG_FORMAT`: `text` (default) or `json`. Read on its own, before the
/// other settings, so that a bad setting is itself logged in that format.
pub fn log_format() -> anyhow::Result<LogFormat> {
    match var("LOG_FORMAT").map(|value| value.trim().to_ascii_lowercase()) {
        None => Ok(LogFormat::Text),
        Some(value) if value == "text" => Ok(LogFormat::Text),
        Some(value) if value == "json" => Ok(LogFormat::Json),
        Some(other) => bail!("LOG_FORMAT must be text or json, not {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> Settings {
        Settings::for_tests(Settings::DEFAULT_DATABASE_URL, "config-test:")
    }

    #[test]
    fn test_settings_are_valid() {
        valid().validate().unwrap();
    }

    #[test]
    fn zero_periods_are_refused_at_start() {
        let mut settings = valid();
        settings.reconcile_interval = Duration::ZERO;
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains("RECONCILE_INTERVAL"), "{error}");
        let mut settings = valid();
        settings.jobs_interval = Duration::ZERO;
        assert!(settings.validate().is_err());
    }
}
