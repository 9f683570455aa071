//! `flashsale bench`: closed-loop load against a shop served in this process,
//! side by side with `pgbench` running the purchase transaction's SQL on the
//! same database, so the ratio app / ceiling comes from one run. Here: what
//! a run measures; `run` drives it, `load` is the buyers' closed loop,
//! `pgbench` the ceiling, `handover` the lock's gaps, `machine` what it ran
//! on, `render` and `chart` the report.

mod chart;
mod handover;
mod load;
mod machine;
mod pgbench;
mod render;
mod run;

use std::path::PathBuf;

use serde::Serialize;

use super::Latency;

pub use chart::chart;
pub use render::render;
pub use run::run_bench;

#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub database_url: String,
    pub seconds: f64,
    pub concurrency: Vec<usize>,
    /// pgbench clients never exceed this: the Postgres server is shared and has a connection cap.
    pub pgbench_max_clients: usize,
    pub customers: usize,
    pub output: Option<PathBuf>,
    pub chart: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub scenario: String,
    pub concurrency: usize,
    pub ok: u64,
    pub other: u64,
    pub per_second: f64,
    pub latency: Latency,
    pub note: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub points: Vec<Point>,
    pub machine: Vec<(String, String)>,
    /// Whether the shop ran with the Redis stock gate (`STOCK_GATE`).
    pub stock_gate: bool,
    pub handover: Vec<Handover>,
    pub lock_overhead: Vec<LockOverhead>,
}

/// Purchases/s at 64 buyers with and without the Redis lock, measured in
/// alternating slices.
#[derive(Debug, Clone, Serialize)]
pub struct LockOverhead {
    pub combining: bool,
    pub with_lock: f64,
    pub without_lock: f64,
}

/// How long a product's lock sits free between one holder's release and the
/// next holder's start, while others are waiting for it.
#[derive(Debug, Clone, Serialize)]
pub struct Handover {
    pub scope: String,
    pub holds: u64,
    pub handovers: u64,
    pub gap: Latency,
}

impl BenchReport {
    fn find(&self, scenario: &str, concurrency: usize) -> Option<&Point> {
        self.points
            .iter()
            .find(|p| p.scenario == scenario && p.concurrency == concurrency)
    }

    /// Purchases/s of `scenario` over the pgbench ceiling at the same concurrency.
    pub fn ratio(&self, scenario: &str, concurrency: usize) -> Option<f64> {
        let app = self.find(scenario, concurrency)?;
        let ceiling = self.find(PGBENCH, concurrency)?;
        (ceiling.per_second > 0.0).then(|| app.per_second / ceiling.per_second)
    }
}

pub const HOT: &str = "app: hot product, combining on";
pub const HOT_ONE_BY_ONE: &str = "app: hot product, combining off";
pub const SPREAD: &str = "app: 100 products";
pub const PGBENCH: &str = "pgbench: same SQL, hot row";
pub const SOLD_OUT: &str = "app: sold-out rejections";
pub const HEALTHZ: &str = "app: /healthz";
pub const SALE_LIST: &str = "app: sale list page";
pub const PRODUCT_PAGE: &str = "app: product page";

/// The concurrency at which the headline ratios and the lock overhead are taken.
pub const HEADLINE_BUYERS: usize = 64;
