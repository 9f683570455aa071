//! One benchmark run: the ceiling first, then the shop with combining off
//! and on, with and without the Redis lock, then pages and hand-overs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::RunQueryDsl;
use reqwest::StatusCode;

use super::handover::handover;
use super::load::{closed_loop, sign_up, Buyer, Load};
use super::machine::{machine, pg_settings};
use super::pgbench::{pgbench, PGBENCH_SCRIPT};
use super::*;
use crate::config::Settings;
use crate::domain::Money;
use crate::qa::harness::{ScratchDb, ServedShop};
use crate::qa::Latency;
use crate::services::catalog::{create_product, SaleSpec};

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
