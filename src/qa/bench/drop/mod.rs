//! A whole drop, from the opening to the last unit sold (issue #38): a
//! crowd of signed-in customers after a few units at a limit of one, once
//! buying straight from the product page and once through the waiting
//! room. The shop runs as its own release process on a scratch database
//! and its own Redis key prefix; the crowd is a tokio driver in this
//! process (`crowd`), whose own speed is measured first against
//! `/healthz`. What sold, and when, is read from Postgres.
//!
//! `run_drop` runs it, `render_drop` writes the report's section.

mod crowd;
mod database;
mod direct;
mod queued;
mod render;

use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use diesel::{Connection, PgConnection};
use serde::Serialize;

use super::customers::seed;
use super::customers::Customer;
use super::machine::machine;
use super::probe::{load_average, wait_until_up, Cpu};
use super::process::{forget_redis_keys, ShopProcess};
use super::sign_in::{check_signed_in, sign_in_many};
use super::wrk::{wrk, Requests};
use super::CpuShare;
use crate::db::PgPool;
use crate::domain::Money;
use crate::qa::harness::ScratchDb;
use crate::services::catalog::{create_product, SaleSpec};

pub use crowd::DriverCapacity;
pub use direct::DirectRun;
pub use queued::QueuedRun;
pub use render::render_drop;

#[derive(Debug, Clone)]
pub struct DropConfig {
    pub database_url: String,
    /// Distinct signed-in customers in the crowd.
    pub customers: usize,
    /// Units on sale (limit one per customer).
    pub units: i32,
    /// Requests the driver keeps on the wire at once (and connections).
    pub connections: usize,
    pub without_waiting_room: bool,
    pub through_waiting_room: bool,
    /// The longest the waiting room's drop may run before it is reported unsold.
    pub time_limit: Duration,
}

impl DropConfig {
    /// The drop: 50,000 customers after 1,000 units, both ways.
    pub fn new(database_url: String) -> DropConfig {
        DropConfig {
            database_url,
            customers: 50_000,
            units: 1_000,
            connections: 256,
            without_waiting_room: true,
            through_waiting_room: true,
            time_limit: Duration::from_secs(180),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct DropReport {
    pub machine: Vec<(String, String)>,
    pub customers: usize,
    pub units: i32,
    pub connections: usize,
    pub driver: DriverCapacity,
    pub without_waiting_room: Option<DirectRun>,
    pub through_waiting_room: Option<QueuedRun>,
}

/// `/healthz` requests the driver's own speed is measured with.
const DRIVER_PROBE_REQUESTS: usize = 100_000;

pub async fn run_drop(config: &DropConfig) -> anyhow::Result<DropReport> {
    let scratch =
        std::env::temp_dir().join(format!("flashsale-drop-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&scratch)?;
    eprintln!("drop: shop logs in {}", scratch.display());
    let db = ScratchDb::create(&config.database_url, "bench_drop")?;
    seed(&mut PgConnection::establish(&db.url)?, config.customers)?;
    let mut shop = Shop {
        process: None,
        pool: crate::db::build_one_shot_pool(
            &db.url,
            Duration::from_secs(30),
            Duration::from_secs(5),
        ),
        db_url: db.url.clone(),
        prefix: format!("bench:drop:{}:", uuid::Uuid::new_v4().simple()),
        session_key: hex::encode(crate::config::random_session_key()),
        scratch,
        starts: 0,
        counters: database::Counters::new(&db.url)?,
        customers: Vec::new(),
    };
    shop.restart().await?;
    let signing_in = std::time::Instant::now();
    shop.customers = sign_in_many(&shop.db_url, &shop.session_key, config.customers)?;
    eprintln!(
        "drop: {} customers signed in in {:.1} s",
        shop.customers.len(),
        signing_in.elapsed().as_secs_f64()
    );
    // The minted cookies work (a page and a buy), on a sale of its own.
    let checked_on = create_product(&shop.pool, sale_spec("sign-in check", 1))
        .await?
        .id;
    tokio::time::sleep(crate::services::sale_cache::SERVE_AT_MOST).await;
    if let Some(last) = shop.customers.last() {
        check_signed_in(&shop.address(), last, checked_on).await?;
    }
    let mut driver =
        crowd::capacity(&shop.address(), config.connections, DRIVER_PROBE_REQUESTS).await?;
    let healthz = Requests::Plain {
        path: "/healthz".into(),
    };
    let script = shop.scratch.join("healthz.lua");
    driver.wrk_per_second =
        match wrk(&shop.address(), &healthz, config.connections, 3.0, &script).await {
            Ok(run) => Some((run.requests - run.failing) as f64 / run.seconds.max(1e-9)),
            Err(error) => {
                eprintln!("drop: no wrk to compare the driver with: {error:#}");
                None
            }
        };
    eprintln!(
        "drop: the driver's own speed: {:.0} /healthz answers/s over {} connections (p50 {:.1} ms); wrk: {:?}",
        driver.per_second, driver.connections, driver.latency.p50_ms, driver.wrk_per_second
    );
    let without_waiting_room = if config.without_waiting_room {
        Some(direct::run_direct(&mut shop, config.units, config.connections).await?)
    } else {
        None
    };
    let through_waiting_room = if config.through_waiting_room {
        // A fresh process, as the first run had: no cache or pool warmed by it.
        shop.restart().await?;
        Some(
            queued::run_queued(
                &mut shop,
                config.units,
                config.connections,
                config.time_limit,
            )
            .await?,
        )
    } else {
        None
    };
    drop(shop);
    Ok(DropReport {
        machine: machine(),
        customers: config.customers,
        units: config.units,
        connections: config.connections,
        driver,
        without_waiting_room,
        through_waiting_room,
    })
}

/// The shop under the drop, its database and its signed-in crowd.
pub(super) struct Shop {
    process: Option<ShopProcess>,
    pool: PgPool,
    db_url: String,
    prefix: String,
    session_key: String,
    scratch: PathBuf,
    starts: usize,
    counters: database::Counters,
    customers: Vec<Customer>,
}

impl Shop {
    fn address(&self) -> String {
        self.process
            .as_ref()
            .map(|p| p.address.clone())
            .unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.process.as_ref().map_or(0, ShopProcess::pid)
    }

    /// A fresh shop process with the same session key: cookies stay valid.
    async fn restart(&mut self) -> anyhow::Result<()> {
        self.process = None;
        self.starts += 1;
        let log = self.scratch.join(format!("shop-{}.log", self.starts));
        let process = ShopProcess::start(&self.db_url, &self.prefix, &self.session_key, &log)?;
        wait_until_up(&process.address).await?;
        self.process = Some(process);
        Ok(())
    }

    /// The maintenance the sign-ins' and the last run's rows call for, done
    /// before a run's counters start rather than by autovacuum within it.
    fn vacuum(&self) -> anyhow::Result<()> {
        use diesel::connection::SimpleConnection;
        PgConnection::establish(&self.db_url)?.batch_execute("VACUUM (ANALYZE)")?;
        Ok(())
    }
}

/// The run's Redis keys go with it; only keys under its own prefix.
impl Drop for Shop {
    fn drop(&mut self) {
        self.process = None;
        let removed = forget_redis_keys(&self.prefix);
        match removed {
            Ok(keys) => eprintln!(
                "drop: removed the run's {keys} Redis keys ({}*)",
                self.prefix
            ),
            Err(error) => eprintln!(
                "drop: could not remove the run's Redis keys ({}*): {error}",
                self.prefix
            ),
        }
    }
}

/// The CPU the machine, the shop and the driver (this process) used over a
/// window: on a shared machine, what the figures had of it.
pub(super) struct CpuWindow {
    load: f64,
    shop_pid: u32,
    shop: Cpu,
    driver: Cpu,
}

impl CpuWindow {
    fn start(shop_pid: u32) -> CpuWindow {
        CpuWindow {
            load: load_average(),
            shop_pid,
            shop: Cpu::now(shop_pid),
            driver: Cpu::now(std::process::id()),
        }
    }

    /// The machine's and the shop's cores, and the driver's.
    fn finish(&self) -> (CpuShare, f64) {
        let shop = Cpu::now(self.shop_pid).share_since(&self.shop, self.load);
        let driver = Cpu::now(std::process::id()).share_since(&self.driver, self.load);
        (shop, driver.shop_cores)
    }
}

/// A sale of `units` at one dollar, open since a minute ago, no limit: the
/// runs set their own.
fn sale_spec(name: &str, units: i32) -> SaleSpec {
    SaleSpec {
        name: name.into(),
        description: "benchmark drop".into(),
        price: Money::from_cents(100).expect("valid price"),
        stock: units,
        per_customer_limit: None,
        starts_at: Utc::now() - chrono::Duration::minutes(1),
        ends_at: None,
        queue_mode: false,
        queue_opens_at: None,
        join_check_work: 1,
    }
}
