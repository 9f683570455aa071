//! A lab run: every contest with every strategy, on a database of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer};
use hdrhistogram::Histogram;
use tokio::sync::Barrier;

use super::attempts::{pg_attempt, redis_attempt, Attempt, Env, Stock, TAKE_ONE_LUA};
use super::{Contest, ContestReport, LabConfig, LabReport, Strategy, StrategyResult};
use crate::config::Settings;
use crate::db;
use crate::domain::CustomerId;
use crate::qa::harness::ScratchDb;
use crate::qa::{new_histogram, record, summarize};
use crate::services::Shop;

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

pub async fn run_lab(config: &LabConfig) -> anyhow::Result<LabReport> {
    let db = ScratchDb::create(&config.database_url, "lab")?;
    let max_workers = config.contests.iter().map(|c| c.workers).max().unwrap_or(1);
    let pool_size = max_workers.clamp(2, 32) as u32;
    let pool = db::build_pool(
        &db.url,
        pool_size,
        Duration::from_secs(30),
        Duration::from_secs(30),
    );
    let prefix = format!("lab:{}:", uuid::Uuid::new_v4().simple());
    let mut settings = Settings::for_tests(&db.url, &prefix);
    settings.redis_urls = vec![config.redis_url.clone()];
    settings.db_pool_size = pool_size;
    settings.stock_gate = true;
    let shop = Shop::new(settings.clone()).await?;
    settings.stock_gate = false;
    let shop_without_gate = Shop::new(settings).await?;
    // Open every connection now, so the first contest does not pay for connecting.
    for warm in [&pool, &shop.pool, &shop_without_gate.pool] {
        let warm = warm.clone();
        tokio::task::spawn_blocking(move || {
            let held: Vec<_> = (0..warm.max_size())
                .map_while(|_| warm.get().ok())
                .collect();
            drop(held);
        })
        .await?;
    }
    let most = config
        .contests
        .iter()
        .map(|c| c.requests)
        .max()
        .unwrap_or(1);
    let customers = db::run(&pool, move |conn| {
        Ok(diesel::sql_query(
            "INSERT INTO customers (email, password_hash) \
             SELECT 'lab' || g || '@lab.test', 'not a hash' FROM generate_series(1, $1) g RETURNING id",
        )
        .bind::<BigInt, _>(most as i64)
        .load::<Id>(conn)?)
    })
    .await?
    .into_iter()
    .map(|row| CustomerId(row.id))
    .collect();
    let env = Arc::new(Env {
        redis: redis::Client::open(config.redis_url.as_str())?,
        prefix,
        pool,
        shop,
        shop_without_gate,
        customers,
        watch_retries: config.watch_retries,
        _db: db,
    });

    let mut report = LabReport {
        contests: Vec::new(),
    };
    for (n, &contest) in config.contests.iter().enumerate() {
        let mut results = Vec::new();
        for &strategy in &config.strategies {
            results.push(run_contest(&env, strategy, contest, n).await?);
        }
        report.contests.push(ContestReport { contest, results });
    }
    cleanup_redis(&env).await;
    Ok(report)
}

async fn cleanup_redis(env: &Env) {
    let Ok(mut con) = env.redis.get_multiplexed_async_connection().await else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", env.prefix))
        .query_async(&mut con)
        .await
        .unwrap_or_default();
    if !keys.is_empty() {
        let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(keys).query_async(&mut con).await;
    }
}

async fn run_contest(
    env: &Arc<Env>,
    strategy: Strategy,
    contest: Contest,
    n: usize,
) -> anyhow::Result<StrategyResult> {
    let key = format!("{}stock:{n}:{strategy:?}", env.prefix);
    let mut product = 0;
    if strategy.uses_redis() {
        let mut con = env.redis.get_multiplexed_async_connection().await?;
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(contest.units)
            .query_async(&mut con)
            .await?;
    } else {
        let units = contest.units;
        let name = format!("lab {strategy:?} {n}");
        product = db::run(&env.pool, move |conn| {
            Ok(diesel::sql_query(
                "INSERT INTO products (name, description, price_cents, stock, initial_stock, sale_starts_at) \
                 VALUES ($1, '', 100, $2, $2, now() - interval '1 minute') RETURNING id",
            )
            .bind::<diesel::sql_types::Text, _>(name)
            .bind::<Integer, _>(units)
            .load::<Id>(conn)?[0]
                .id)
        })
        .await?;
    }

    let next = Arc::new(AtomicUsize::new(0));
    let start_line = Arc::new(Barrier::new(contest.workers + 1));
    let script = Arc::new(redis::Script::new(TAKE_ONE_LUA));
    let mut workers = Vec::with_capacity(contest.workers);
    for _ in 0..contest.workers {
        let env = env.clone();
        let next = next.clone();
        let start_line = start_line.clone();
        let key = key.clone();
        let script = script.clone();
        workers.push(tokio::spawn(async move {
            // One connection per worker: WATCH state belongs to a connection.
            let mut con = if strategy.uses_redis() {
                Some(env.redis.get_multiplexed_async_connection().await)
            } else {
                None
            };
            start_line.wait().await;
            let mut tally = Tally::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= contest.requests {
                    break;
                }
                let began = Instant::now();
                let attempt = match con.as_mut() {
                    Some(Ok(con)) => redis_attempt(strategy, con, &key, &script, &env)
                        .await
                        .unwrap_or_else(|e| Attempt::Error(e.to_string())),
                    Some(Err(e)) => Attempt::Error(e.to_string()),
                    None => pg_attempt(strategy, &env, product, i)
                        .await
                        .unwrap_or_else(|e| Attempt::Error(e.to_string())),
                };
                record(&mut tally.latency, began.elapsed());
                tally.add(attempt);
            }
            tally
        }));
    }
    start_line.wait().await;
    let began = Instant::now();
    let mut total = Tally::default();
    for worker in workers {
        total.merge(worker.await?);
    }
    let elapsed = began.elapsed();

    let final_stock = if strategy.uses_redis() {
        let mut con = env.redis.get_multiplexed_async_connection().await?;
        redis::cmd("GET").arg(&key).query_async(&mut con).await?
    } else {
        i64::from(
            db::run(&env.pool, move |conn| {
                Ok(
                    diesel::sql_query("SELECT stock FROM products WHERE id = $1")
                        .bind::<BigInt, _>(product)
                        .get_result::<Stock>(conn)?
                        .stock,
                )
            })
            .await?,
        )
    };
    let units = usize::try_from(contest.units).unwrap_or(0);
    Ok(StrategyResult {
        strategy,
        label: strategy.label(),
        safe: strategy.safe(),
        sold: total.sold,
        rejected: total.rejected,
        gave_up: total.gave_up,
        errors: total.errors,
        first_error: total.first_error,
        oversold: total.sold.saturating_sub(units),
        final_stock,
        elapsed_ms: elapsed.as_secs_f64() * 1000.0,
        throughput: contest.requests as f64 / elapsed.as_secs_f64().max(1e-9),
        latency: summarize(&total.latency),
    })
}

struct Tally {
    sold: usize,
    rejected: usize,
    gave_up: usize,
    errors: usize,
    first_error: Option<String>,
    latency: Histogram<u64>,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            sold: 0,
            rejected: 0,
            gave_up: 0,
            errors: 0,
            first_error: None,
            latency: new_histogram(),
        }
    }
}

impl Tally {
    fn add(&mut self, attempt: Attempt) {
        match attempt {
            Attempt::Sold => self.sold += 1,
            Attempt::Rejected => self.rejected += 1,
            Attempt::GaveUp => self.gave_up += 1,
            Attempt::Error(message) => {
                self.errors += 1;
                self.first_error.get_or_insert(message);
            }
        }
    }

    fn merge(&mut self, other: Tally) {
        self.sold += other.sold;
        self.rejected += other.rejected;
        self.gave_up += other.gave_up;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        let _ = self.latency.add(&other.latency);
    }
}
