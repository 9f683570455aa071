//! `flashsale bench`: the shop served as its own release process, loaded by
//! Debian's `wrk`, beside `pgbench` running the purchase transaction's SQL
//! on the same Postgres. Purchases are counted in the database, Postgres
//! work from its own counters and the shop's statement counter. Here: what
//! a run measures and the targets; `run` drives it, `process` serves the
//! shop, `customers` signs buyers in, `wrk` and `pgbench` make the load,
//! `probe` reads the costs, `machine` what it ran on, `render` and `chart`
//! the report.

mod ceilings;
mod chart;
mod command;
mod crowd;
mod customers;
mod drop;
mod first_pass;
mod fixtures;
mod joins;
mod lua;
mod machine;
mod measure;
mod pgbench;
mod probe;
mod process;
mod render;
mod render_sales;
mod run;
mod sale_script;
mod sales;
mod sign_in;
mod targets;
mod wrk;

use std::path::PathBuf;

use serde::Serialize;

use super::Latency;

pub use chart::chart;
pub use command::{bench, BenchArgs};
pub use drop::{render_drop, run_drop, DropConfig, DropReport};
pub use first_pass::FirstPass;
pub use probe::{CpuShare, SaleShape};
pub use render::render;
pub use run::run_bench;
pub use targets::Target;

#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub database_url: String,
    /// Seconds of load per app scenario.
    pub seconds: f64,
    /// Seconds per pgbench point.
    pub pgbench_seconds: f64,
    /// Client counts pgbench is swept over; its best is the ceiling.
    pub pgbench_clients: Vec<usize>,
    /// Signed-in customers rotated across requests.
    pub customers: usize,
    /// Signed-in customers the joins scenario pairs with its waiting rooms.
    pub join_customers: usize,
    /// How many times the headline (hot product, limit 1) is measured,
    /// each in a fresh shop process; the report takes the median.
    pub hot_repeats: usize,
    /// Units of the sale sold out whole, whose first and last second of
    /// selling are compared.
    pub sell_out_units: usize,
    /// Only `/healthz`, the pages, the polls, sold-out buys and joins: no
    /// pgbench ceilings and no purchases.
    pub crowd_only: bool,
    pub output: Option<PathBuf>,
    pub chart: Option<PathBuf>,
}

/// One pgbench point.
#[derive(Debug, Clone, Serialize)]
pub struct Ceiling {
    pub clients: usize,
    pub tps: Option<f64>,
    pub latency_ms: f64,
    pub error: Option<String>,
}

pub fn best(points: &[Ceiling]) -> Option<&Ceiling> {
    points
        .iter()
        .filter(|p| p.tps.is_some())
        .max_by(|a, b| a.tps.unwrap_or(0.0).total_cmp(&b.tps.unwrap_or(0.0)))
}

/// One pgbench sweep: which SQL, on what, and its points.
#[derive(Debug, Clone, Serialize)]
pub struct Sweep {
    pub key: &'static str,
    /// Buyers each transaction sells to (1: one purchase at a time).
    pub buyers_per_transaction: usize,
    pub points: Vec<Ceiling>,
}

impl Sweep {
    /// The best point, in buyers (orders) per second.
    pub fn best_buyers_per_second(&self) -> Option<f64> {
        best(&self.points)?
            .tps
            .map(|tps| tps * self.buyers_per_transaction as f64)
    }
}

/// One wrk run against the shop.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub scenario: &'static str,
    pub note: String,
    pub connections: usize,
    /// Distinct signed-in customers the requests rotated over (0: anonymous).
    pub customers: usize,
    pub seconds: f64,
    /// Answers wrk received.
    pub answers: u64,
    /// Answers with the scenario's expected status.
    pub expected: u64,
    /// Answers of any other status, and requests with no answer.
    pub unexpected: Vec<(u16, u64)>,
    pub socket_errors: u64,
    pub latency: Latency,
    /// Orders whose transaction began within the run, from the database.
    pub orders: u64,
    /// Waiting-room places joined within the run whose row is in the
    /// database (a join is answered only once it is).
    pub places: u64,
    pub pg_transactions: i64,
    pub statements: f64,
    /// Mean buyers per combined purchase transaction, from `/metrics`.
    pub batch_mean: Option<f64>,
    pub batches: f64,
    /// Mean lock wait and purchase-transaction time in ms, from `/metrics`.
    pub lock_wait_ms: Option<f64>,
    pub batch_tx_ms: Option<f64>,
    /// Average Postgres backends by state / wait event while it ran.
    pub activity: Vec<(String, f64)>,
    pub cpu: CpuShare,
    /// `/healthz` answers/s just before and just after this run, for the
    /// crowd scenarios held to a fraction of it.
    pub healthz_beside: Option<(f64, f64)>,
    /// A purchase run's first and last second of selling, from the database.
    pub shape: Option<SaleShape>,
    /// Answers/s of a sale's crowd (sold-out buys, page views) mixed in.
    pub crowd_per_second: f64,
}

impl Measured {
    pub fn per_second(&self) -> f64 {
        self.expected as f64 / self.seconds.max(1e-9)
    }

    pub fn orders_per_second(&self) -> f64 {
        self.orders as f64 / self.seconds.max(1e-9)
    }

    pub fn places_per_second(&self) -> f64 {
        self.places as f64 / self.seconds.max(1e-9)
    }

    pub fn per_answer(&self, cost: f64) -> f64 {
        cost / self.answers.max(1) as f64
    }

    /// This run's answers/s over the mean of the `/healthz` runs beside it.
    pub fn ratio_to_healthz_beside(&self) -> Option<f64> {
        let (before, after) = self.healthz_beside?;
        let beside = (before + after) / 2.0;
        (beside > 0.0).then(|| self.per_second() / beside)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub machine: Vec<(String, String)>,
    pub shop: Vec<(String, String)>,
    pub ceilings: Vec<Sweep>,
    pub runs: Vec<Measured>,
    /// The most buyers one of the shop's purchase transactions sold to, over
    /// the headline runs (orders sharing a transaction's `now()`).
    pub largest_batch: Option<u64>,
    /// A waiting room's start to its first pass, by pre-queue size.
    pub first_passes: Vec<FirstPass>,
}

impl BenchReport {
    pub fn all(&self, scenario: &'static str) -> impl Iterator<Item = &Measured> {
        self.runs.iter().filter(move |r| r.scenario == scenario)
    }

    pub fn ceiling(&self, key: &'static str) -> Option<&Sweep> {
        self.ceilings.iter().find(|s| s.key == key)
    }

    /// A run's orders/s over the best of pgbench on the same SQL.
    pub fn ratio_to_ceiling(&self, run: &Measured, key: &'static str) -> Option<f64> {
        let ceiling = self.ceiling(key)?.best_buyers_per_second()?;
        (ceiling > 0.0).then(|| run.orders_per_second() / ceiling)
    }

    pub fn find(&self, scenario: &'static str) -> Option<&Measured> {
        self.all(scenario).next()
    }

    /// The median run of a repeated scenario by orders/s (the lower middle one
    /// of an even count), so one lucky or unlucky run does not decide.
    pub fn median(&self, scenario: &'static str) -> Option<&Measured> {
        let mut runs: Vec<&Measured> = self.all(scenario).collect();
        runs.sort_by(|a, b| a.orders_per_second().total_cmp(&b.orders_per_second()));
        runs.get(runs.len().saturating_sub(1) / 2).copied()
    }
}

pub const HEALTHZ: &str = "`/healthz` (wrk's own request loop)";
pub const HEALTHZ_SCRIPTED: &str = "`/healthz` through the rotating Lua script";
pub const LIST_ANON: &str = "sale list, anonymous";
pub const LIST_SIGNED: &str = "sale list, signed in";
pub const PRODUCT_ANON: &str = "product page, anonymous";
pub const PRODUCT_SIGNED: &str = "product page, signed in";
pub const SOLD_OUT: &str = "sold-out buys";
pub const QUEUE_STATUS: &str = "waiting-room status polls (`queue.json`), signed in";
/// The headline: a drop of one hot product, limit 1, to distinct buyers.
pub const HOT_LIMIT_1: &str = "hot product, limit 1, distinct buyers buying once";
pub const HOT_LIMIT_2: &str = "hot product, limit 2, distinct buyers buying twice";
pub const HOT_NO_LIMIT: &str = "hot product, no limit, 256 buyers rotating";
pub const HOT_256: &str = "hot product, no limit, 256 buyers, 256 connections, buys only";
pub const SPREAD_LIMIT_1: &str = "100 products, limit 1, distinct buyers buying once";
pub const SELL_OUT: &str = "hot product, limit 1, the whole stock sold out";

/// pgbench's sweeps, by the SQL they run.
pub const PG_HOT_LIMIT_1: &str =
    "one purchase per transaction, one row, limit 1, a new customer each";
pub const PG_HOT_LIMIT_2: &str =
    "one purchase per transaction, one row, limit 2, each customer twice";
pub const PG_HOT_NO_LIMIT: &str =
    "one purchase per transaction, one row, no limit, 256 customers at random";
pub const PG_SPREAD_LIMIT_1: &str =
    "one purchase per transaction, 100 rows, limit 1, a new customer each";
pub const PG_BATCH_32: &str =
    "the batch statement, 32 new customers per transaction, one row, limit 1";
pub const PG_BATCH_LARGEST: &str =
    "the batch statement, the shop's largest batch per transaction, one row, limit 1";

/// The pgbench sweep running a scenario's SQL one purchase at a time.
pub fn ceiling_of(scenario: &str) -> Option<&'static str> {
    Some(match scenario {
        HOT_LIMIT_1 | SELL_OUT => PG_HOT_LIMIT_1,
        HOT_LIMIT_2 => PG_HOT_LIMIT_2,
        HOT_NO_LIMIT | HOT_256 => PG_HOT_NO_LIMIT,
        SPREAD_LIMIT_1 => PG_SPREAD_LIMIT_1,
        _ => return None,
    })
}

pub const JOINS: &str = "waiting-room joins, a new place each";
