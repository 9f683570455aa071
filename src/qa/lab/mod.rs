//! `flashsale lab`: the same contest (N units, M one-unit requests from W
//! workers released together) run against real Redis and Postgres with each
//! way of taking stock, so the shop's choice is measured, not asserted.
//! Here: the strategies and the lab's configuration; `contest` runs them,
//! `attempts` is one request of each, `report` the tables, `experiments`
//! the Redis behaviours shown on their own.

mod attempts;
mod contest;
mod experiments;
mod report;

use anyhow::bail;
use serde::Serialize;

use crate::config::Settings;

pub use contest::run_lab;
pub use experiments::{render_experiments, run_experiments, Experiment};
pub use report::{lab_document, ContestReport, LabReport, StrategyResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    RedisGetDecr,
    RedisPipeline,
    RedisMulti,
    RedisWatch,
    RedisLua,
    PgReadUpdate,
    PgForUpdate,
    PgConditional,
    Flashsale,
    FlashsaleNoGate,
}

impl Strategy {
    pub const ALL: [Strategy; 10] = [
        Strategy::RedisGetDecr,
        Strategy::RedisPipeline,
        Strategy::RedisMulti,
        Strategy::RedisWatch,
        Strategy::RedisLua,
        Strategy::PgReadUpdate,
        Strategy::PgForUpdate,
        Strategy::PgConditional,
        Strategy::Flashsale,
        Strategy::FlashsaleNoGate,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Strategy::RedisGetDecr => "Redis GET then DECR",
            Strategy::RedisPipeline => "Redis pipeline GET+DECRBY",
            Strategy::RedisMulti => "Redis MULTI/EXEC GET+DECRBY",
            Strategy::RedisWatch => "Redis WATCH + retry",
            Strategy::RedisLua => "Redis Lua check-and-decrement",
            Strategy::PgReadUpdate => "Postgres read then update",
            Strategy::PgForUpdate => "Postgres SELECT FOR UPDATE",
            Strategy::PgConditional => "Postgres conditional UPDATE",
            Strategy::Flashsale => "flashsale, Redis gate + Redlock + FOR UPDATE",
            Strategy::FlashsaleNoGate => "flashsale, gate off: Redlock + FOR UPDATE",
        }
    }

    /// Whether the strategy claims never to sell more than it has. The others
    /// can oversell, but whether a short run shows it depends on timing.
    pub fn safe(self) -> bool {
        !matches!(
            self,
            Strategy::RedisGetDecr | Strategy::RedisPipeline | Strategy::PgReadUpdate
        )
    }

    fn uses_redis(self) -> bool {
        matches!(
            self,
            Strategy::RedisGetDecr
                | Strategy::RedisPipeline
                | Strategy::RedisMulti
                | Strategy::RedisWatch
                | Strategy::RedisLua
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Contest {
    pub units: i32,
    pub requests: usize,
    pub workers: usize,
}

impl std::str::FromStr for Contest {
    type Err = String;

    /// `UNITSxREQUESTSxWORKERS`, e.g. `100x1000x32`.
    fn from_str(raw: &str) -> Result<Contest, String> {
        let parts: Vec<&str> = raw.split('x').collect();
        let bad = || format!("{raw:?} is not UNITSxREQUESTSxWORKERS (e.g. 100x1000x32)");
        if parts.len() != 3 {
            return Err(bad());
        }
        let contest = Contest {
            units: parts[0].parse().map_err(|_| bad())?,
            requests: parts[1].parse().map_err(|_| bad())?,
            workers: parts[2].parse().map_err(|_| bad())?,
        };
        if contest.units < 0 || contest.requests == 0 || contest.workers == 0 {
            return Err(bad());
        }
        Ok(contest)
    }
}

#[derive(Debug, Clone)]
pub struct LabConfig {
    /// Any database URL on the Postgres server to use; the lab makes its own database there.
    pub database_url: String,
    pub redis_url: String,
    pub contests: Vec<Contest>,
    pub strategies: Vec<Strategy>,
    /// Attempts per request before a WATCH loser gives up.
    pub watch_retries: u32,
}

impl LabConfig {
    pub fn from_env() -> LabConfig {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        LabConfig {
            database_url: var("DATABASE_URL")
                .unwrap_or_else(|| Settings::DEFAULT_DATABASE_URL.into()),
            redis_url: var("REDIS_URL")
                .and_then(|urls| urls.split(',').next().map(|u| u.trim().to_string()))
                .unwrap_or_else(|| Settings::DEFAULT_REDIS_URL.into()),
            contests: vec![
                Contest {
                    units: 5,
                    requests: 20,
                    workers: 20,
                },
                Contest {
                    units: 100,
                    requests: 1_000,
                    workers: 32,
                },
            ],
            strategies: Strategy::ALL.to_vec(),
            watch_retries: 20,
        }
    }
}

/// Refuses lab sizes that cannot be a contest.
pub fn check(config: &LabConfig) -> anyhow::Result<()> {
    if config.contests.is_empty() || config.strategies.is_empty() {
        bail!("nothing to run: give at least one contest and one strategy");
    }
    Ok(())
}
