//! One benchmark run: the pgbench ceilings first (on a database of their
//! own, while no shop holds connections), then the shop served as its own
//! process under wrk, scenario by scenario.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use diesel::{Connection, PgConnection};
use futures::StreamExt;

use super::customers::{seed, sign_in_all};
use super::sign_in::{check_signed_in, sign_in_many};
use super::first_pass::time_to_first_pass;
use super::machine::{machine, pg_settings};
use super::pgbench::{pgbench, Rows, PGBENCH_SCRIPT};
use super::probe::{load_average, wait_until_up, Cpu, Probe, STATS_SETTLE};
use super::process::ShopProcess;
use super::wrk::{wrk, Customer, Requests};
use super::*;
use crate::domain::Money;
use crate::qa::harness::ScratchDb;
use crate::services::catalog::{create_product, SaleSpec};

/// Stock no run can sell out.
const BOTTOMLESS: i32 = 10_000_000;
/// Sales on the list besides the hot and the sold-out one, so the list
/// page is a list.
const CATALOGUE: usize = 8;
const SPREAD_PRODUCTS: usize = 100;
/// Joins per second the joins scenario has pairs for: past them a request
/// repeats a place (answered, but no new row), so the rooms are as many as
/// that rate over the run calls for.
const JOIN_PAIRS_PER_SECOND: f64 = 10_000.0;

/// A sale that opened a minute ago, at one dollar a unit, with no
/// per-customer limit.
fn sale(name: String, stock: i32) -> SaleSpec {
    SaleSpec {
        name,
        description: "benchmark".into(),
        price: Money::from_cents(100).expect("valid price"),
        stock,
        per_customer_limit: None,
        starts_at: Utc::now() - chrono::Duration::minutes(1),
        ends_at: None,
        queue_mode: false,
        queue_opens_at: None,
    }
}

async fn products(
    pool: &crate::db::PgPool,
    tag: &str,
    count: usize,
    stock: i32,
) -> anyhow::Result<Vec<i64>> {
    let mut ids = Vec::with_capacity(count);
    for n in 0..count {
        ids.push(
            create_product(pool, sale(format!("{tag} {n}"), stock))
                .await?
                .id,
        );
    }
    Ok(ids)
}

fn pool(url: &str) -> crate::db::PgPool {
    crate::db::build_one_shot_pool(url, Duration::from_secs(30), Duration::from_secs(5))
}

/// pgbench swept over `config.pgbench_clients` on `rows`.
fn sweep(config: &BenchConfig, url: &str, script: &Path, rows: Rows, what: &str) -> Vec<Ceiling> {
    config
        .pgbench_clients
        .iter()
        .map(|&clients| {
            let point = match pgbench(url, script, rows, clients, config.pgbench_seconds) {
                Ok((tps, latency_ms)) => Ceiling {
                    clients,
                    tps: Some(tps),
                    latency_ms,
                    error: None,
                },
                Err(error) => Ceiling {
                    clients,
                    tps: None,
                    latency_ms: 0.0,
                    error: Some(format!("{error:#}")),
                },
            };
            match (&point.tps, &point.error) {
                (Some(tps), _) => eprintln!(
                    "pgbench {what:<9} c={clients:<3} {tps:>8.0} tps  avg {:.2} ms",
                    point.latency_ms
                ),
                (None, Some(error)) => eprintln!("pgbench {what} c={clients}: {error}"),
                _ => {}
            }
            point
        })
        .collect()
}

/// Same server, same schema and settings as the shop's database, but a
/// database of its own, so pgbench's rows never show on the shop's pages.
async fn ceilings(
    config: &BenchConfig,
    scratch: &Path,
) -> anyhow::Result<(Vec<Ceiling>, Vec<Ceiling>)> {
    let db = ScratchDb::create(&config.database_url, "bench_pgbench")?;
    let pool = pool(&db.url);
    let hot = products(&pool, "pgbench hot", 1, BOTTOMLESS).await?[0];
    let spread = products(&pool, "pgbench spread", SPREAD_PRODUCTS, BOTTOMLESS).await?;
    let (low, high) = (spread[0], spread[SPREAD_PRODUCTS - 1]);
    anyhow::ensure!(
        high - low + 1 == SPREAD_PRODUCTS as i64,
        "pgbench's rows are not contiguous"
    );
    let customers = seed(&mut PgConnection::establish(&db.url)?, config.customers)?;
    let script = scratch.join("purchase.pgbench.sql");
    std::fs::write(&script, PGBENCH_SCRIPT)?;
    let hot = sweep(
        config,
        &db.url,
        &script,
        Rows {
            products: (hot, hot),
            customers,
        },
        "hot row",
    );
    let spread = sweep(
        config,
        &db.url,
        &script,
        Rows {
            products: (low, high),
            customers,
        },
        "100 rows",
    );
    Ok((hot, spread))
}

/// What a run's answers per second are compared with. The crowd's cheap
/// answers are held to a fraction of `/healthz`, and on a shared machine
/// the speed available drifts within a minute: those runs take `/healthz`
/// just before and just after themselves, so the ratio divides figures
/// measured side by side.
#[derive(Clone, Copy)]
enum Yardstick {
    Beside,
    /// Purchases are held to pgbench; `/healthz` runs are their own.
    RunsOwn,
}

/// The shop under test and what measuring it needs.
struct Bench<'a> {
    config: &'a BenchConfig,
    db_url: String,
    prefix: String,
    session_key: String,
    scratch: PathBuf,
    shop: Option<ShopProcess>,
    starts: usize,
    probe: Option<Probe>,
    /// The transaction count as the last run left it, while nothing has
    /// run since: the next run starts from it instead of settling again.
    baseline: Option<i64>,
    runs: usize,
}

impl Bench<'_> {
    fn address(&self) -> String {
        self.shop
            .as_ref()
            .map(|s| s.address.clone())
            .unwrap_or_default()
    }

    /// A fresh shop process; cookies stay valid across restarts since
    /// every process gets the same session key.
    async fn restart(&mut self) -> anyhow::Result<()> {
        self.probe = None;
        self.shop = None;
        self.baseline = None;
        self.starts += 1;
        let log = self.scratch.join(format!("shop-{}.log", self.starts));
        let shop = ShopProcess::start(&self.db_url, &self.prefix, &self.session_key, &log)?;
        wait_until_up(&shop.address).await?;
        self.probe = Some(Probe::new(&self.db_url, &shop.address)?);
        self.shop = Some(shop);
        Ok(())
    }

    /// Load without measuring: seeds the gate's counts, fills the pools.
    async fn warm(&mut self, requests: &Requests<'_>, connections: usize) -> anyhow::Result<()> {
        let script = self.scratch.join("warm.lua");
        self.baseline = None;
        wrk(&self.address(), requests, connections, 1.0, &script).await?;
        Ok(())
    }

    /// Rows written to set a run up (the waiting room's joins) are no
    /// run's: the next run counts from a fresh baseline, with the vacuum and
    /// analyze those rows call for already done, so autovacuum's
    /// transactions on them are not counted as the run's either.
    fn set_up_done(&mut self) -> anyhow::Result<()> {
        self.baseline = None;
        self.probe.as_mut().expect("a running shop").vacuum()
    }

    /// `/healthz` through wrk's own loop, as long and as wide as a run: the
    /// yardstick measured beside a crowd scenario. It touches neither
    /// Postgres nor Redis, but the shop's background jobs do work meanwhile,
    /// so no run's counters start before it ends: the next run settles and
    /// reads its own baseline.
    async fn healthz_now(&mut self, connections: usize) -> anyhow::Result<f64> {
        let script = self.scratch.join("healthz-beside.lua");
        let plain = Requests::Plain {
            path: "/healthz".into(),
        };
        let run = wrk(
            &self.address(),
            &plain,
            connections,
            self.config.seconds,
            &script,
        )
        .await?;
        self.baseline = None;
        Ok((run.requests - run.failing) as f64 / run.seconds.max(1e-9))
    }

    async fn measure(
        &mut self,
        scenario: &'static str,
        requests: Requests<'_>,
        connections: usize,
        expect: u16,
        note: String,
        yardstick: Yardstick,
    ) -> anyhow::Result<Measured> {
        self.runs += 1;
        let script = self.scratch.join(format!("run-{}.lua", self.runs));
        let address = self.address();
        let seconds = self.config.seconds;
        // Just outside the run's counters and samples: before its settle
        // and baseline, and (below) after its counters are read.
        let healthz_before = match yardstick {
            Yardstick::Beside => Some(self.healthz_now(connections).await?),
            Yardstick::RunsOwn => None,
        };
        let probe = self.probe.as_mut().expect("a running shop");
        let customers = match &requests {
            Requests::Plain { .. } => 0,
            Requests::Get { customers, .. }
            | Requests::Buy { customers, .. }
            | Requests::Join { customers, .. } => customers.len(),
        };
        let transactions = match self.baseline.take() {
            Some(count) => count,
            None => {
                tokio::time::sleep(STATS_SETTLE).await;
                probe.transactions()?
            }
        };
        let metrics = probe.metrics().await?;
        let sampler = probe.sample_activity()?;
        let pid = self.shop.as_ref().map_or(0, ShopProcess::pid);
        let (load, cpu) = (load_average(), Cpu::now(pid));
        let from = Utc::now();
        let run = wrk(&address, &requests, connections, seconds, &script).await;
        let cpu = Cpu::now(pid).share_since(&cpu, load);
        let activity = sampler.finish();
        let run = run?;
        let to = from + chrono::Duration::microseconds((run.seconds * 1e6) as i64);
        tokio::time::sleep(STATS_SETTLE).await;
        let metrics = probe.metrics().await?.since(&metrics);
        let transactions = probe.transactions()? - transactions;
        let (orders, places) = probe.committed_between(from, to)?;
        self.baseline = Some(probe.transactions()?);
        let healthz_beside = match healthz_before {
            Some(before) => Some((before, self.healthz_now(connections).await?)),
            None => None,
        };
        let counted = !matches!(
            requests,
            Requests::Plain { .. } | Requests::Get { count: false, .. }
        );
        let expected = if counted {
            run.count(expect)
        } else {
            run.requests - run.failing
        };
        let mut unexpected: Vec<(u16, u64)> = run
            .statuses
            .iter()
            .filter(|(status, _)| **status != expect)
            .map(|(s, n)| (*s, *n))
            .collect();
        if !counted && run.failing > 0 {
            unexpected.push((400, run.failing));
        }
        let batch = "flashsale_purchase_batch_size";
        let measured = Measured {
            scenario,
            note,
            connections,
            customers,
            seconds: run.seconds,
            answers: run.requests,
            expected,
            unexpected,
            socket_errors: run.socket_errors,
            latency: run.latency,
            orders,
            places,
            pg_transactions: transactions,
            statements: metrics.get("flashsale_db_statements_total"),
            batch_mean: metrics.mean(batch, ""),
            batches: metrics.count(batch, ""),
            lock_wait_ms: metrics
                .mean("flashsale_lock_wait_seconds", "{result=\"acquired\"}")
                .map(|s| s * 1000.0),
            batch_tx_ms: metrics
                .mean(
                    "flashsale_db_transaction_seconds",
                    "{kind=\"purchase_batch\"}",
                )
                .map(|s| s * 1000.0),
            activity: activity.averages().into_iter().take(6).collect(),
            cpu,
            healthz_beside,
        };
        eprintln!(
            "{scenario:<48} c={connections:<3} {:>9.0} answers/s  {:>7.0} orders/s  p50 {:>6.1} ms  p99 {:>7.1} ms  {:.4} tx/answer  {:.4} stmt/answer  cpu: machine {:.2} shop {:.2} load {:.1}{}",
            measured.per_second(),
            measured.orders_per_second(),
            measured.latency.p50_ms,
            measured.latency.p99_ms,
            measured.per_answer(measured.pg_transactions as f64),
            measured.per_answer(measured.statements),
            measured.cpu.machine_busy_cores,
            measured.cpu.shop_cores,
            measured.cpu.load_average,
            measured
                .batch_mean
                .map(|b| format!("  batch {b:.1}"))
                .unwrap_or_default(),
        );
        if let (Some((before, after)), Some(ratio)) =
            (measured.healthz_beside, measured.ratio_to_healthz_beside())
        {
            eprintln!(
                "{:>48} /healthz beside: {before:.0} before, {after:.0} after; ratio {ratio:.2}",
                ""
            );
        }
        if measured.places > 0 {
            eprintln!(
                "{:>48} {:.0} places committed/s",
                "",
                measured.places_per_second()
            );
        }
        if measured.expected == 0 {
            anyhow::bail!(
                "{scenario}: no answer had status {expect} (answers: {:?}, socket errors {})",
                measured.unexpected,
                measured.socket_errors
            );
        }
        Ok(measured)
    }
}

pub async fn run_bench(config: &BenchConfig) -> anyhow::Result<BenchReport> {
    let scratch =
        std::env::temp_dir().join(format!("flashsale-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&scratch)?;
    eprintln!(
        "scratch files (scripts, shop logs) in {}",
        scratch.display()
    );
    let (pgbench_hot, pgbench_spread) = if config.crowd_only {
        (Vec::new(), Vec::new())
    } else {
        ceilings(config, &scratch).await?
    };

    let db = ScratchDb::create(&config.database_url, "bench")?;
    let pool = pool(&db.url);
    let hot = products(&pool, "hot", 1, BOTTOMLESS).await?[0];
    let sold_out = products(&pool, "gone", 1, 0).await?[0];
    products(&pool, "catalogue", CATALOGUE, 1000).await?;
    let accounts = config.customers.max(config.join_customers);
    seed(&mut PgConnection::establish(&db.url)?, accounts)?;

    let mut bench = Bench {
        config,
        db_url: db.url.clone(),
        prefix: format!("bench:{}:", uuid::Uuid::new_v4().simple()),
        session_key: hex::encode(crate::config::random_session_key()),
        scratch: scratch.clone(),
        shop: None,
        starts: 0,
        probe: None,
        baseline: None,
        runs: 0,
    };
    bench.restart().await?;
    let customers: Vec<Customer> = sign_in_many(&db.url, &bench.session_key, accounts)?;
    check_signed_in(&bench.address(), &customers[accounts - 1], hot).await?;
    // A few through the shop's own form as well, as a browser would.
    for by_form in sign_in_all(&bench.address(), 2).await? {
        check_signed_in(&bench.address(), &by_form, hot).await?;
    }
    eprintln!("{} customers signed in", customers.len());
    let mut runs = Vec::new();
    let signed = &customers[..config.customers];
    let joiners = &customers[..config.join_customers];
    let anonymous: &[Customer] = &[];
    let tag = |name: &str| format!("{name}-{}", uuid::Uuid::new_v4().simple());
    let buy = |products: Vec<i64>, customers, name: &str| Requests::Buy {
        products,
        customers,
        tag: tag(name),
    };
    let get = |path: String, customers| Requests::Get {
        paths: vec![path],
        customers,
        count: false,
    };

    runs.push(
        bench
            .measure(
                HEALTHZ,
                Requests::Plain {
                    path: "/healthz".into(),
                },
                64,
                200,
                String::new(),
                Yardstick::RunsOwn,
            )
            .await?,
    );
    runs.push(
        bench
            .measure(
                HEALTHZ_SCRIPTED,
                Requests::Get {
                    paths: vec!["/healthz".into()],
                    customers: anonymous,
                    count: true,
                },
                64,
                200,
                String::new(),
                Yardstick::RunsOwn,
            )
            .await?,
    );
    let product = format!("/products/{hot}");
    for (scenario, path, who) in [
        (LIST_ANON, "/".to_string(), anonymous),
        (LIST_SIGNED, "/".to_string(), signed),
        (PRODUCT_ANON, product.clone(), anonymous),
        (PRODUCT_SIGNED, product.clone(), signed),
    ] {
        check_page(&bench.address(), &path, who.first()).await?;
        runs.push(
            bench
                .measure(
                    scenario,
                    get(path, who),
                    64,
                    200,
                    String::new(),
                    Yardstick::Beside,
                )
                .await?,
        );
    }
    let waiting_room = queue_sale(&pool, "waiting room", QUEUE_UNITS).await?;
    join_waiting_room(&bench.address(), signed, waiting_room).await?;
    bench.set_up_done()?;
    runs.push(
        bench
            .measure(
                QUEUE_STATUS,
                get(format!("/products/{waiting_room}/queue.json"), signed),
                64,
                200,
                String::new(),
                Yardstick::Beside,
            )
            .await?,
    );
    bench.warm(&buy(vec![sold_out], signed, "warm"), 64).await?;
    runs.push(
        bench
            .measure(
                SOLD_OUT,
                buy(vec![sold_out], signed, "gone"),
                64,
                409,
                String::new(),
                Yardstick::Beside,
            )
            .await?,
    );

    // Purchases, unless only the crowd's cheap answers and joins are wanted.
    if !config.crowd_only {
        // Twice per process, in fresh processes: a mode fixed at start-up shows
        // as runs that agree within a process and differ across processes. One
        // customer's 64 concurrent buys run between the two, so each has a
        // 64-customer run on either side under the same conditions.
        for process in 1..=config.hot_repeats.max(1) {
            if process > 1 {
                bench.restart().await?;
            }
            bench.warm(&buy(vec![hot], signed, "warm"), 64).await?;
            let note = |run: usize| format!("shop process {process}, run {run}");
            runs.push(
                bench
                    .measure(
                        HOT_64,
                        buy(vec![hot], signed, "hot"),
                        64,
                        303,
                        note(1),
                        Yardstick::RunsOwn,
                    )
                    .await?,
            );
            runs.push(
                bench
                    .measure(
                        ONE_CUSTOMER,
                        buy(vec![hot], &signed[..1], "one"),
                        64,
                        303,
                        note(2),
                        Yardstick::RunsOwn,
                    )
                    .await?,
            );
            runs.push(
                bench
                    .measure(
                        HOT_64,
                        buy(vec![hot], signed, "hot"),
                        64,
                        303,
                        note(3),
                        Yardstick::RunsOwn,
                    )
                    .await?,
            );
        }
        runs.push(
            bench
                .measure(
                    HOT_256,
                    buy(vec![hot], signed, "hot256"),
                    256,
                    303,
                    String::new(),
                    Yardstick::RunsOwn,
                )
                .await?,
        );
        let spread = products(&pool, "spread", SPREAD_PRODUCTS, BOTTOMLESS).await?;
        bench.warm(&buy(spread.clone(), signed, "warm"), 64).await?;
        runs.push(
            bench
                .measure(
                    SPREAD,
                    buy(spread, signed, "spread"),
                    64,
                    303,
                    String::new(),
                    Yardstick::RunsOwn,
                )
                .await?,
        );
    }
    // Last, as its waiting rooms stay live (ticking) from here on.
    let room_count =
        ((config.seconds * JOIN_PAIRS_PER_SECOND) / joiners.len() as f64).ceil() as usize;
    let mut rooms = Vec::new();
    for n in 0..room_count.max(1) {
        rooms.push(queue_sale(&pool, &format!("joins {n}"), QUEUE_UNITS).await?);
    }
    // The shop's copy of the sales learns of them within a second.
    tokio::time::sleep(crate::services::sale_cache::SERVE_AT_MOST).await;
    bench.set_up_done()?;
    let pairs = rooms.len() * joiners.len();
    let note = format!("{} rooms, {pairs} customer-room pairs", rooms.len());
    let joins = bench
        .measure(
            JOINS,
            Requests::Join {
                products: rooms,
                customers: joiners,
            },
            64,
            303,
            note,
            Yardstick::RunsOwn,
        )
        .await?;
    if joins.answers > pairs as u64 {
        eprintln!(
            "joins: {} answers for {pairs} pairs; the rest joined again (no new place)",
            joins.answers
        );
    }
    runs.push(joins);
    let mut first_passes = Vec::new();
    for waiters in [1, joiners.len()] {
        first_passes.push(time_to_first_pass(&pool, &bench.address(), joiners, waiters).await?);
    }
    drop(bench);

    let mut machine = machine();
    machine.extend(pg_settings(&db.url));
    Ok(BenchReport {
        machine,
        shop: shop_settings(config),
        pgbench_hot,
        pgbench_spread,
        runs,
        first_passes,
    })
}

/// A run's Redis keys go with it (the answer records of every sold-out buy,
/// the admission markers of every order): the machine's Redis is shared,
/// and a benchmark leaves nothing of its own there. Only keys under the
/// run's own prefix; the rest of the server is never touched.
impl Drop for Bench<'_> {
    fn drop(&mut self) {
        self.shop = None;
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let forgotten = redis::Client::open(url.split(',').next().unwrap_or_default())
            .and_then(|client| client.get_connection())
            .and_then(|mut redis| {
                let keys: Vec<String> = redis::cmd("SCAN")
                    .cursor_arg(0)
                    .arg("MATCH")
                    .arg(format!("{}*", self.prefix))
                    .arg("COUNT")
                    .arg(10_000)
                    .clone()
                    .iter(&mut redis)?
                    .collect::<Result<_, _>>()?;
                for chunk in keys.chunks(1_000) {
                    redis::cmd("UNLINK").arg(chunk).exec(&mut redis)?;
                }
                Ok(keys.len())
            });
        match forgotten {
            Ok(keys) => eprintln!("removed the run's {keys} Redis keys ({}*)", self.prefix),
            Err(error) => eprintln!(
                "could not remove the run's Redis keys ({}*): {error}",
                self.prefix
            ),
        }
    }
}

/// The page runs tell answers apart only as below 400 or not, so before
/// them: the page is a 200, and signed in or not as the run means it to be.
/// Units of the benchmark's waiting room: more than its customers, so the
/// room stays open for every poll.
const QUEUE_UNITS: i32 = 1_000;

/// A sale in queue mode whose waiting room is open and whose start is an
/// hour away: every customer who joins waits in the pre-queue.
async fn queue_sale(pool: &crate::db::PgPool, name: &str, stock: i32) -> anyhow::Result<i64> {
    queue_sale_starting(pool, name, stock, Utc::now() + chrono::Duration::hours(1)).await
}

/// A sale in queue mode, limit 1, whose waiting room is open and which
/// starts at `starts_at`.
pub(super) async fn queue_sale_starting(
    pool: &crate::db::PgPool,
    name: &str,
    stock: i32,
    starts_at: chrono::DateTime<Utc>,
) -> anyhow::Result<i64> {
    let spec = SaleSpec {
        per_customer_limit: Some(1),
        starts_at,
        queue_mode: true,
        queue_opens_at: Some(Utc::now() - chrono::Duration::minutes(1)),
        ..sale(name.into(), stock)
    };
    Ok(create_product(pool, spec).await?.id)
}

/// Every customer joins `product`'s waiting room through the shop's form.
pub(super) async fn join_waiting_room(
    address: &str,
    customers: &[Customer],
    product: i64,
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    futures::stream::iter(customers)
        .map(|customer| {
            let client = client.clone();
            async move {
                let response = client
                    .post(format!("{address}/products/{product}/queue"))
                    .header(reqwest::header::COOKIE, &customer.cookie)
                    .form(&[("csrf_token", customer.csrf.as_str())])
                    .send()
                    .await?;
                anyhow::ensure!(
                    response.status() == reqwest::StatusCode::SEE_OTHER,
                    "joining the waiting room answered {}",
                    response.status()
                );
                Ok(())
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<anyhow::Result<()>>>()
        .await
        .into_iter()
        .collect()
}

async fn check_page(address: &str, path: &str, who: Option<&Customer>) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let mut request = client.get(format!("{address}{path}"));
    if let Some(customer) = who {
        request = request.header(reqwest::header::COOKIE, &customer.cookie);
    }
    let response = request.send().await?;
    let status = response.status();
    let signed_in = response.text().await?.contains("action=\"/logout\"");
    anyhow::ensure!(
        status == reqwest::StatusCode::OK && signed_in == who.is_some(),
        "GET {path} answered {status}, signed in: {signed_in}, expected 200 and {}",
        who.is_some()
    );
    Ok(())
}

/// The settings the shop ran with: its defaults unless the environment
/// of `flashsale bench` changed them.
fn shop_settings(config: &BenchConfig) -> Vec<(String, String)> {
    let var = |name: &str, default: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| default.into())
    };
    vec![
        (
            "build".into(),
            if cfg!(debug_assertions) {
                "debug (figures not comparable)"
            } else {
                "release"
            }
            .into(),
        ),
        ("DB_POOL_SIZE".into(), var("DB_POOL_SIZE", "16 (default)")),
        ("STOCK_GATE".into(), var("STOCK_GATE", "on (default)")),
        ("COMBINING".into(), var("COMBINING", "on (default)")),
        ("COMBINE_MAX".into(), var("COMBINE_MAX", "32 (default)")),
        (
            "COMBINE_PRODUCTS".into(),
            var("COMBINE_PRODUCTS", "64 (default)"),
        ),
        ("signed-in customers".into(), config.customers.to_string()),
        (
            "seconds per app run".into(),
            format!("{:.0}", config.seconds),
        ),
        (
            "seconds per pgbench point".into(),
            format!("{:.0}", config.pgbench_seconds),
        ),
    ]
}
