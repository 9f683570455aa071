//! `flashsale bench`: the shop served as its own release process, loaded by
//! Debian's `wrk`, beside `pgbench` running the purchase transaction's SQL
//! on the same Postgres. Purchases are counted in the database, Postgres
//! work from its own counters and the shop's statement counter. Here: what
//! a run measures and the targets; `run` drives it, `process` serves the
//! shop, `customers` signs buyers in, `wrk` and `pgbench` make the load,
//! `probe` reads the costs, `machine` what it ran on, `render` and `chart`
//! the report.

mod chart;
mod customers;
mod drop;
mod first_pass;
mod machine;
mod pgbench;
mod probe;
mod process;
mod render;
mod run;
mod sign_in;
mod wrk;

use std::path::PathBuf;

use serde::Serialize;

use super::Latency;

pub use chart::chart;
pub use drop::{render_drop, run_drop, DropConfig, DropReport};
pub use first_pass::FirstPass;
pub use probe::CpuShare;
pub use render::render;
pub use run::run_bench;

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
    /// How many times the hot product at 64 buyers is measured.
    pub hot_repeats: usize,
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
    pub pgbench_hot: Vec<Ceiling>,
    pub pgbench_spread: Vec<Ceiling>,
    pub runs: Vec<Measured>,
    /// A waiting room's start to its first pass, by pre-queue size.
    pub first_passes: Vec<FirstPass>,
}

impl BenchReport {
    pub fn all(&self, scenario: &'static str) -> impl Iterator<Item = &Measured> {
        self.runs.iter().filter(move |r| r.scenario == scenario)
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

    pub fn targets(&self) -> Vec<Target> {
        let mut out = Vec::new();
        let ratio_to_healthz =
            |scenario: &'static str| self.find(scenario)?.ratio_to_healthz_beside();
        out.push(Target::at_least(
            "sold-out answers / `/healthz` beside",
            ratio_to_healthz(SOLD_OUT),
            0.25,
        ));
        out.push(Target::at_most(
            "Postgres transactions per 1,000 sold-out answers",
            self.find(SOLD_OUT)
                .map(|r| 1000.0 * r.per_answer(r.pg_transactions as f64)),
            1.0,
        ));
        for page in [LIST_ANON, LIST_SIGNED, PRODUCT_ANON, PRODUCT_SIGNED] {
            out.push(Target::at_least(
                format!("{page} / `/healthz` beside"),
                ratio_to_healthz(page),
                0.25,
            ));
        }
        out.push(Target::at_least(
            format!("{QUEUE_STATUS} / `/healthz` beside"),
            ratio_to_healthz(QUEUE_STATUS),
            0.25,
        ));
        out.push(Target::at_most(
            "Postgres transactions per 1,000 status polls",
            self.find(QUEUE_STATUS)
                .map(|r| 1000.0 * r.per_answer(r.pg_transactions as f64)),
            1.0,
        ));
        out.push(Target::at_least(
            "waiting-room joins: places committed per second",
            self.find(JOINS).map(Measured::places_per_second),
            5000.0,
        ));
        for first in &self.first_passes {
            out.push(Target::below(
                format!(
                    "waiting room, {} waiting: start to first pass, ms",
                    first.waiters
                ),
                first.ms,
                1000.0,
            ));
        }
        let hot_best = best(&self.pgbench_hot).and_then(|c| c.tps);
        out.push(Target::at_least(
            "hot product, 64 buyers (median run) / pgbench best on one row",
            self.median(HOT_64)
                .zip(hot_best)
                .map(|(r, c)| r.orders_per_second() / c),
            3.0,
        ));
        out.push(Target::below(
            "hot product, 256 buyers: p99 ms",
            self.find(HOT_256).map(|r| r.latency.p99_ms),
            250.0,
        ));
        let spread_best = best(&self.pgbench_spread).and_then(|c| c.tps);
        out.push(Target::at_least(
            "100 products, 64 buyers / pgbench best over 100 rows",
            self.find(SPREAD)
                .zip(spread_best)
                .map(|(r, c)| r.orders_per_second() / c),
            0.7,
        ));
        out
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub what: String,
    pub value: Option<f64>,
    pub bound: &'static str,
    pub limit: f64,
    pub pass: bool,
}

impl Target {
    fn new(what: impl Into<String>, value: Option<f64>, bound: &'static str, limit: f64) -> Target {
        let pass = value.is_some_and(|v| match bound {
            ">=" => v >= limit,
            "<=" => v <= limit,
            _ => v < limit,
        });
        Target {
            what: what.into(),
            value,
            bound,
            limit,
            pass,
        }
    }
    fn at_least(what: impl Into<String>, value: Option<f64>, limit: f64) -> Target {
        Target::new(what, value, ">=", limit)
    }
    fn at_most(what: impl Into<String>, value: Option<f64>, limit: f64) -> Target {
        Target::new(what, value, "<=", limit)
    }
    fn below(what: impl Into<String>, value: Option<f64>, limit: f64) -> Target {
        Target::new(what, value, "<", limit)
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
pub const HOT_64: &str = "hot product, 64 buyers";
pub const HOT_256: &str = "hot product, 256 buyers";
pub const ONE_CUSTOMER: &str = "hot product, one customer, 64 concurrent buys";
pub const SPREAD: &str = "100 products, 64 buyers";
pub const JOINS: &str = "waiting-room joins, a new place each";
