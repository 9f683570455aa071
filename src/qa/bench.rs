//! `flashsale bench`: closed-loop load against a shop served in this process,
//! side by side with `pgbench` running the purchase transaction's SQL on the
//! same database, so the ratio app / ceiling comes from one run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use diesel::prelude::*;
use reqwest::StatusCode;
use serde::Serialize;

use super::harness::{Browser, ScratchDb, ServedShop};
use super::{new_histogram, record, summarize, Latency};
use crate::config::Settings;
use crate::domain::Money;
use crate::services::catalog::{create_product, SaleSpec};

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

const PASSWORD: &str = "bench-buyer-password";

/// The purchase transaction of `services::purchase`, as SQL.
const PGBENCH_SCRIPT: &str = r"\set cust random(1, :ncust)
BEGIN;
SELECT stock, per_customer_limit FROM products WHERE id = :pid FOR UPDATE;
INSERT INTO orders (customer_id, status, total_cents, payment_deadline) VALUES (:cust, 'awaiting_payment', 100, now() + interval '10 minutes') RETURNING id AS order_id \gset
INSERT INTO order_items (order_id, product_id, quantity, unit_price_cents) VALUES (:order_id, :pid, 1, 100);
UPDATE products SET stock = stock - 1, updated_at = now() WHERE id = :pid RETURNING stock AS left \gset
INSERT INTO stock_history (product_id, order_id, delta, stock_after, reason, note) VALUES (:pid, :order_id, -1, :left, 'purchase', '');
COMMIT;
";

/// A signed-in buyer and the form token of its session.
#[derive(Clone)]
struct Buyer {
    browser: Browser,
    token: String,
}

async fn sign_up(base: &str, email: &str) -> anyhow::Result<Buyer> {
    let client = Browser::client_builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let browser = Browser::new(base, client);
    let response = browser.sign_up(email, PASSWORD).await?;
    if response.status() != StatusCode::SEE_OTHER {
        bail!("sign-up of {email} answered {}", response.status());
    }
    // Signing in starts a new session, with a CSRF token of its own.
    let token = browser.csrf().await?;
    Ok(Buyer { browser, token })
}

enum Load {
    Buy { products: Vec<i64> },
    Get { path: String },
}

/// `concurrency` loops send requests back to back for `seconds`; `ok` counts answers with `expect`.
async fn closed_loop(
    buyers: &[Buyer],
    load: Arc<Load>,
    concurrency: usize,
    seconds: f64,
    expect: StatusCode,
) -> (u64, u64, f64, Latency) {
    let ok = Arc::new(AtomicU64::new(0));
    let other = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut loops = Vec::with_capacity(concurrency);
    for n in 0..concurrency {
        let buyer = buyers[n % buyers.len()].clone();
        let (ok, other, load) = (ok.clone(), other.clone(), load.clone());
        loops.push(tokio::spawn(async move {
            let mut histogram = new_histogram();
            let mut i = n;
            while Instant::now() < deadline {
                let began = Instant::now();
                let request = match &*load {
                    Load::Buy { products } => {
                        let product = products[i % products.len()];
                        let key = uuid::Uuid::new_v4().to_string();
                        buyer
                            .browser
                            .buy(product, "1", &buyer.token, Some(&key))
                            .await
                    }
                    Load::Get { path } => buyer.browser.get(path).await,
                };
                let status = match request {
                    Ok(response) => {
                        let status = response.status();
                        let _ = response.bytes().await;
                        Some(status)
                    }
                    Err(_) => None,
                };
                record(&mut histogram, began.elapsed());
                if status == Some(expect) {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    other.fetch_add(1, Ordering::Relaxed);
                }
                i += concurrency;
            }
            histogram
        }));
    }
    let began = Instant::now();
    let mut histogram = new_histogram();
    for handle in loops {
        if let Ok(h) = handle.await {
            let _ = histogram.add(&h);
        }
    }
    let elapsed = began.elapsed().as_secs_f64();
    let ok = ok.load(Ordering::Relaxed);
    (
        ok,
        other.load(Ordering::Relaxed),
        ok as f64 / elapsed,
        summarize(&histogram),
    )
}

fn pgbench(
    db_url: &str,
    script: &Path,
    product: i64,
    customers: i64,
    clients: usize,
    seconds: f64,
) -> anyhow::Result<(f64, f64)> {
    let output = Command::new("pgbench")
        .args(["-n", "-f"])
        .arg(script)
        .args(["-c", &clients.to_string(), "-j", "2"])
        .args(["-T", &(seconds.ceil() as u64).max(1).to_string()])
        .args(["-D", &format!("pid={product}")])
        .args(["-D", &format!("ncust={customers}")])
        .arg(db_url)
        .output()
        .context("running pgbench (Debian: apt-get install postgresql-contrib)")?;
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    if !output.status.success() {
        bail!(
            "pgbench failed: {}{}",
            text,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let number_after = |label: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.starts_with(label))?;
        line.split('=')
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let tps = number_after("tps").context("no tps in pgbench output")?;
    let latency = number_after("latency average").unwrap_or(0.0);
    Ok((tps, latency))
}

fn machine() -> Vec<(String, String)> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| format!("{:.1} GiB", kb as f64 / 1_048_576.0))
        .unwrap_or_default();
    let command = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    vec![
        ("CPU".into(), cpu),
        (
            "cores".into(),
            format!(
                "{} (shared with other work on the machine)",
                std::thread::available_parallelism().map_or(0, |n| n.get())
            ),
        ),
        ("memory".into(), memory),
        ("kernel".into(), command("uname", &["-sr"])),
        ("pgbench".into(), command("pgbench", &["--version"])),
    ]
}

fn pg_settings(db_url: &str) -> Vec<(String, String)> {
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        setting: String,
    }
    let Ok(mut conn) = PgConnection::establish(db_url) else {
        return Vec::new();
    };
    diesel::sql_query(
        "SELECT name, setting FROM pg_settings WHERE name IN \
         ('server_version', 'fsync', 'synchronous_commit', 'shared_buffers', 'max_connections', 'wal_level') ORDER BY name",
    )
    .load::<Setting>(&mut conn)
    .unwrap_or_default()
    .into_iter()
    .map(|s| (format!("postgres {}", s.name), s.setting))
    .collect()
}

/// The concurrency at which the headline ratios and the lock overhead are taken.
pub const HEADLINE_BUYERS: usize = 64;
/// Alternating with/without-lock slices of half a point's duration each.
const LOCK_ROUNDS: usize = 4;

/// A shop served in this process for the benchmark, with its buyers and hot product.
struct BenchShop {
    served: ServedShop,
    buyers: Vec<Buyer>,
    hot: i64,
}

impl BenchShop {
    fn hot_load(&self) -> Arc<Load> {
        Arc::new(Load::Buy {
            products: vec![self.hot],
        })
    }
}

/// A sale that opened a minute ago, at one dollar a unit.
fn sale(name: String, stock: i32) -> SaleSpec {
    SaleSpec {
        name,
        description: "benchmark".into(),
        price: Money::from_cents(100).expect("valid price"),
        stock,
        per_customer_limit: None,
        starts_at: chrono::Utc::now() - chrono::Duration::minutes(1),
        ends_at: None,
    }
}

async fn start_shop(
    settings: Settings,
    pool: &crate::db::PgPool,
    name: String,
    customers: usize,
) -> anyhow::Result<BenchShop> {
    let served = ServedShop::start(settings).await?;
    let hot = create_product(pool, sale(name.clone(), 10_000_000))
        .await?
        .id;
    let tag: String = name.chars().filter(char::is_ascii_alphanumeric).collect();
    let mut buyers = Vec::with_capacity(customers);
    for b in 0..customers.max(1) {
        buyers.push(sign_up(&served.address, &format!("{tag}-{b}@flashsale.test")).await?);
    }
    Ok(BenchShop {
        served,
        buyers,
        hot,
    })
}

pub async fn run_bench(config: &BenchConfig) -> anyhow::Result<BenchReport> {
    let db = ScratchDb::create(&config.database_url, "bench")?;
    let prefix = format!("bench:{}:", uuid::Uuid::new_v4().simple());
    let pool = crate::db::build_pool(&db.url, 4, Duration::from_secs(5), Duration::from_secs(3));
    let ceiling = create_product(&pool, sale("pgbench".into(), 10_000_000))
        .await?
        .id;
    let sold_out = create_product(&pool, sale("gone".into(), 0)).await?.id;
    let mut spread = Vec::with_capacity(100);
    for n in 0..100 {
        spread.push(
            create_product(&pool, sale(format!("spread {n}"), 10_000_000))
                .await?
                .id,
        );
    }

    let mut report = BenchReport {
        points: Vec::new(),
        machine: machine(),
        stock_gate: Settings::for_tests(&db.url, &prefix).stock_gate,
        handover: Vec::new(),
        lock_overhead: Vec::new(),
    };
    report.machine.extend(pg_settings(&db.url));
    let seconds = config.seconds;
    let mut push =
        |scenario: &str, concurrency: usize, result: (u64, u64, f64, Latency), note: String| {
            let (ok, other, per_second, latency) = result;
            eprintln!(
                "{scenario:<44} c={concurrency:<4} {per_second:>9.1}/s  p99 {:.1} ms  {note}",
                latency.p99_ms
            );
            report.points.push(Point {
                scenario: scenario.into(),
                concurrency,
                ok,
                other,
                per_second,
                latency,
                note,
            });
        };

    // pgbench's orders need customers 1..=N; they never sign in.
    let customers = config.customers.max(1) as i64;
    crate::db::run(&pool, move |conn| {
        Ok(diesel::sql_query(
            "INSERT INTO customers (email, password_hash, role) \
             SELECT 'pgbench' || n || '@flashsale.test', '!', 'customer' FROM generate_series(1, $1) AS n",
        )
        .bind::<diesel::sql_types::BigInt, _>(customers)
        .execute(conn)?)
    })
    .await?;
    // The ceiling first, while no shop holds connections of the shared server.
    let script = std::env::temp_dir().join(format!("{}.pgbench.sql", prefix.replace(':', "_")));
    std::fs::write(&script, PGBENCH_SCRIPT)?;
    for &c in &config.concurrency {
        let clients = c.min(config.pgbench_max_clients);
        let (url, script, customers) = (
            db.url.clone(),
            script.clone(),
            config.customers.max(1) as i64,
        );
        let (tps, avg) = tokio::task::spawn_blocking(move || {
            pgbench(&url, &script, ceiling, customers, clients, seconds)
        })
        .await??;
        let note = if clients < c {
            format!("{clients} clients (connection cap); average latency {avg:.1} ms")
        } else {
            format!("average latency {avg:.1} ms")
        };
        push(PGBENCH, c, (0, 0, tps, Latency::default()), note);
    }
    let _ = std::fs::remove_file(&script);

    for combining in [false, true] {
        let hot_name = if combining { HOT } else { HOT_ONE_BY_ONE };
        let start = |redis_lock: bool, tag: String| {
            let mut settings = Settings::for_tests(&db.url, &prefix);
            settings.combining = combining;
            settings.redis_lock = redis_lock;
            start_shop(settings, &pool, tag, config.customers)
        };
        let locked = start(true, hot_name.to_string()).await?;
        let unlocked = start(false, format!("{hot_name}, no Redis lock")).await?;
        for &c in &config.concurrency {
            let result = closed_loop(
                &locked.buyers,
                locked.hot_load(),
                c,
                seconds,
                StatusCode::SEE_OTHER,
            )
            .await;
            push(hot_name, c, result, String::new());
            if combining {
                let spread_load = Arc::new(Load::Buy {
                    products: spread.clone(),
                });
                let result = closed_loop(
                    &locked.buyers,
                    spread_load,
                    c,
                    seconds,
                    StatusCode::SEE_OTHER,
                )
                .await;
                push(SPREAD, c, result, String::new());
            }
        }
        // What the lock costs: the same load with and without it, in
        // alternating slices so that drift in the machine's load hits both.
        let (mut with, mut without) = ((0, 0.0), (0, 0.0));
        for _ in 0..LOCK_ROUNDS {
            for (shop, total) in [(&locked, &mut with), (&unlocked, &mut without)] {
                let began = Instant::now();
                let (ok, ..) = closed_loop(
                    &shop.buyers,
                    shop.hot_load(),
                    HEADLINE_BUYERS,
                    seconds / 2.0,
                    StatusCode::SEE_OTHER,
                )
                .await;
                total.0 += ok;
                total.1 += began.elapsed().as_secs_f64();
            }
        }
        let overhead = LockOverhead {
            combining,
            with_lock: with.0 as f64 / with.1,
            without_lock: without.0 as f64 / without.1,
        };
        eprintln!(
            "lock overhead, combining {combining}: {:.1}/s with, {:.1}/s without",
            overhead.with_lock, overhead.without_lock
        );
        report.lock_overhead.push(overhead);
        if combining {
            let page_concurrency = 64.min(*config.concurrency.iter().max().unwrap_or(&64));
            let gets: [(&str, String, StatusCode); 4] = [
                (SOLD_OUT, String::new(), StatusCode::CONFLICT),
                (HEALTHZ, "/healthz".into(), StatusCode::OK),
                (SALE_LIST, "/".into(), StatusCode::OK),
                (
                    PRODUCT_PAGE,
                    format!("/products/{}", locked.hot),
                    StatusCode::OK,
                ),
            ];
            for (scenario, path, expect) in gets {
                let load = if path.is_empty() {
                    Arc::new(Load::Buy {
                        products: vec![sold_out],
                    })
                } else {
                    Arc::new(Load::Get { path })
                };
                let result =
                    closed_loop(&locked.buyers, load, page_concurrency, seconds, expect).await;
                push(scenario, page_concurrency, result, String::new());
            }
        }
        locked.served.server.stop(true).await;
        unlocked.served.server.stop(true).await;
    }

    let redis_urls = Settings::for_tests(&db.url, &prefix).redis_urls;
    for (scope, instances, tasks) in [("one instance, 8 buyers", 1, 8), ("two instances", 2, 1)] {
        let figure = handover(&redis_urls, &prefix, instances, tasks, seconds).await?;
        eprintln!(
            "hand-over {scope}: {} hand-overs, p50 {:.3} ms, p99 {:.3} ms",
            figure.handovers, figure.gap.p50_ms, figure.gap.p99_ms
        );
        report.handover.push(Handover {
            scope: scope.into(),
            ..figure
        });
    }
    Ok(report)
}

/// Release-to-next-holder gaps of one product's lock, with `instances`
/// separate lock clients (as separate processes would have) and `tasks`
/// contenders in each, all looping acquire → release for `seconds`.
/// With several instances only hand-overs between instances count.
async fn handover(
    redis_urls: &[String],
    prefix: &str,
    instances: usize,
    tasks: usize,
    seconds: f64,
) -> anyhow::Result<Handover> {
    let product = crate::domain::ProductId(1);
    let prefix = format!("{prefix}handover{instances}:");
    let clients = (0..instances)
        .map(|_| {
            crate::lock::ProductLocks::new(
                redis_urls,
                false,
                &prefix,
                Duration::from_secs(10),
                Duration::from_secs(10),
                true,
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let holds = Arc::new(std::sync::Mutex::new(Vec::new()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(seconds);
    let mut contenders = Vec::new();
    for (instance, locks) in clients.iter().enumerate() {
        for _ in 0..tasks {
            let (locks, holds) = (locks.clone(), holds.clone());
            contenders.push(tokio::spawn(async move {
                while tokio::time::Instant::now() < deadline {
                    let Ok(held) = locks.acquire(vec![product]).await else {
                        continue;
                    };
                    let acquired = tokio::time::Instant::now();
                    let releasing = tokio::time::Instant::now();
                    held.release().await;
                    holds
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((acquired, releasing, instance));
                }
            }));
        }
    }
    for contender in contenders {
        contender.await?;
    }
    let mut holds = std::mem::take(&mut *holds.lock().unwrap_or_else(|p| p.into_inner()));
    holds.sort_by_key(|(acquired, _, _)| *acquired);
    let mut histogram = new_histogram();
    let mut handovers = 0;
    for pair in holds.windows(2) {
        let ((_, released, from), (acquired, _, to)) = (pair[0], pair[1]);
        if instances > 1 && from == to {
            continue;
        }
        record(&mut histogram, acquired.saturating_duration_since(released));
        handovers += 1;
    }
    Ok(Handover {
        scope: String::new(),
        handovers,
        holds: holds.len() as u64,
        gap: summarize(&histogram),
    })
}

pub fn render(report: &BenchReport, config: &BenchConfig, command: &str) -> String {
    let mut out = String::from("# Benchmarks\n\n");
    let _ = writeln!(
        out,
        "Regenerate with `scripts/bench` (a release build; a few seconds of load per point); \
         this report came from `{command}`. \
         Every figure below comes from that one run, so the ratios compare numbers measured \
         side by side on the same machine, database and settings.\n"
    );
    out.push_str("## Machine and settings\n\n| what | value |\n|---|---|\n");
    for (what, value) in &report.machine {
        let _ = writeln!(out, "| {what} | {value} |");
    }
    let _ = writeln!(
        out,
        "| shop | in-process `Application` on 127.0.0.1, DB pool 16, Redlock on the local Redis, stock gate {}, release build |\n\
         | load | closed loop: each of C clients sends its next request when the last is answered, {:.0} s per point; {} signed-up buyers share the clients |\n",
        if report.stock_gate { "on" } else { "off" },
        config.seconds, config.customers
    );
    out.push_str(
        "The shop and the load generator share the machine's cores, and so does pgbench with Postgres; \
         absolute numbers are small for that reason. The ratios are the point.\n\n",
    );

    out.push_str("## Hot product: purchases/s vs the pgbench ceiling, combining off and on\n\n");
    out.push_str(
        "All buyers on one product with stock that never runs out. The ceiling is `pgbench` running \
         the purchase transaction's SQL (lock the row, insert order, item and history row, update the \
         stock, commit) one purchase at a time on another hot row of the same database, with the \
         same durability settings. *Combining off* is one purchase per lock hold and per commit; \
         *combining on* serves up to 32 queued buyers of the product per transaction, their rows \
         written by one statement (buyer by buyer under savepoints only if Postgres refuses it). \
         Every request goes through HTTP with \
         its session, CSRF token, idempotency key and stock-gate admission.\n\n",
    );
    out.push_str("| buyers | pgbench tps | combining off: purchases/s | off / ceiling | off p99 ms | combining on: purchases/s | on / ceiling | on p99 ms | on / off | 100 products (on): purchases/s | pgbench notes |\n");
    out.push_str("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for &c in &config.concurrency {
        let (Some(off), Some(on), Some(ceiling)) = (
            report.find(HOT_ONE_BY_ONE, c),
            report.find(HOT, c),
            report.find(PGBENCH, c),
        ) else {
            continue;
        };
        let spread = report
            .find(SPREAD, c)
            .map(|p| format!("{:.0}", p.per_second))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| {c} | {:.0} | {:.0} | {:.2} | {:.1} | {:.0} | {:.2} | {:.1} | {:.2} | {spread} | {} |",
            ceiling.per_second,
            off.per_second,
            report.ratio(HOT_ONE_BY_ONE, c).unwrap_or(0.0),
            off.latency.p99_ms,
            on.per_second,
            report.ratio(HOT, c).unwrap_or(0.0),
            on.latency.p99_ms,
            on.per_second / off.per_second.max(1e-9),
            ceiling.note
        );
    }
    out.push_str(
        "\npgbench's clients queue inside Postgres on the one row lock, each holding a backend and \
         each paying its own commit. With combining, one commit (one WAL flush) carries a whole \
         batch, which is what lifts the shop past the one-commit-per-purchase ceiling; every buyer \
         still gets their own order, item and ledger row, and the checks run per buyer in arrival \
         order.\n\n",
    );
    out.push_str("### What the Redis lock costs\n\n");
    out.push_str(
        "The same load at 64 buyers on two shops side by side, one with the Redis lock and one \
         without it (a benchmark-only setting: the in-process queue and the Postgres row lock \
         still order the writes), measured in alternating slices so drift in the machine's load \
         hits both alike.\n\n\
         | combining | with the Redis lock /s | without /s | lock overhead |\n|---|---:|---:|---:|\n",
    );
    for figure in &report.lock_overhead {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.1} % |",
            if figure.combining { "on" } else { "off" },
            figure.with_lock,
            figure.without_lock,
            100.0 * (1.0 - figure.with_lock / figure.without_lock.max(1e-9))
        );
    }
    out.push_str(
        "\nA negative overhead means the run with the lock was the faster one: the difference is \
         inside the machine's noise.\n\n### Lock hand-over\n\n\
         Release of a product's lock to the start of the next holder's work, while others wait for \
         it: within one instance the holder passes its Redis lock straight to the next local waiter \
         (no Redis round trip, for at most 256 holders or 50 ms in a row, then it goes back to \
         Redis); across instances the release is published on a Redis channel that wakes the \
         other instance's waiter (no polling). Measured with `ProductLocks` directly, no \
         database.\n\n\
         | scope | holds | hand-overs counted | gap p50 ms | gap p99 ms | gap max ms |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for figure in &report.handover {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} |",
            figure.scope,
            figure.holds,
            figure.handovers,
            figure.gap.p50_ms,
            figure.gap.p99_ms,
            figure.gap.max_ms
        );
    }
    out.push_str("\n![throughput vs concurrency](bench.svg)\n\n");
    out.push_str("## Sold out and pages\n\n| scenario | clients | answers/s | p50 ms | p99 ms | unexpected answers |\n|---|---:|---:|---:|---:|---:|\n");
    for scenario in [SOLD_OUT, HEALTHZ, SALE_LIST, PRODUCT_PAGE] {
        if let Some(p) = report.points.iter().find(|p| p.scenario == scenario) {
            let _ = writeln!(
                out,
                "| {} | {} | {:.0} | {:.1} | {:.1} | {} |",
                scenario, p.concurrency, p.per_second, p.latency.p50_ms, p.latency.p99_ms, p.other
            );
        }
    }
    if let (Some(rejected), Some(health)) = (
        report.points.iter().find(|p| p.scenario == SOLD_OUT),
        report.points.iter().find(|p| p.scenario == HEALTHZ),
    ) {
        let _ = writeln!(
            out,
            "\nSold-out rejections run at {:.2}x the rate of `/healthz` on the same server. {}",
            rejected.per_second / health.per_second.max(1e-9),
            if report.stock_gate {
                "With the stock gate on, a rejection takes no lock and no stock query: it checks \
                 the session (one indexed read of the sessions table) and the CSRF token, claims \
                 the form's idempotency key (one insert), makes one Redis script call, renders the \
                 sold-out page and keeps it as the key's answer (one update)."
            } else {
                "With the stock gate off, a rejection is one plain database read before the lock \
                 queue (it can only say no) plus the session, CSRF check, idempotency key claim \
                 and answer, and page render."
            }
        );
    }
    out
}

pub fn chart(report: &BenchReport, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let series = [
        (HOT, RED),
        (HOT_ONE_BY_ONE, MAGENTA),
        (SPREAD, BLUE),
        (PGBENCH, BLACK),
    ];
    let top = report
        .points
        .iter()
        .filter(|p| series.iter().any(|(s, _)| *s == p.scenario))
        .map(|p| p.per_second)
        .fold(1.0, f64::max)
        * 1.15;
    let xs: Vec<usize> = {
        let mut xs: Vec<usize> = report
            .points
            .iter()
            .filter(|p| p.scenario == HOT)
            .map(|p| p.concurrency)
            .collect();
        xs.sort_unstable();
        xs
    };
    // The concurrency steps grow by 4x to 16x: evenly spaced points read better than a linear axis.
    let x_of = |c: usize| xs.iter().position(|&x| x == c).unwrap_or(0) as f64;
    let x_max = xs.len().max(1) as f64 - 0.5;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Purchases per second vs concurrent buyers",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..x_max, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("concurrent buyers")
        .y_desc("purchases / s")
        .x_labels(xs.len().max(2))
        .x_label_formatter(&|x| {
            let i = x.round();
            match xs.get(i as usize) {
                Some(c) if (x - i).abs() < 1e-6 && i >= 0.0 => c.to_string(),
                _ => String::new(),
            }
        })
        .draw()?;
    for (scenario, color) in series {
        let points: Vec<(f64, f64)> = xs
            .iter()
            .filter_map(|&c| report.find(scenario, c).map(|p| (x_of(c), p.per_second)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(scenario)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
