//! `flashsale lab`: the same contest (N units, M one-unit requests from W
//! workers released together) run against real Redis and Postgres with each
//! way of taking stock, so the shop's choice is measured, not asserted.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Integer};
use hdrhistogram::Histogram;
use redis::aio::MultiplexedConnection;
use serde::Serialize;
use tokio::sync::Barrier;

use super::harness::ScratchDb;
use super::{new_histogram, record, summarize, Latency};
use crate::config::Settings;
use crate::db::{self, PgPool};
use crate::domain::{CustomerId, ProductId, Quantity, Refusal};
use crate::error::AppError;
use crate::services::checkout::{purchase, Line, PurchaseOutcome};
use crate::services::Shop;

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

#[derive(Debug, Clone, Serialize)]
pub struct StrategyResult {
    pub strategy: Strategy,
    pub label: &'static str,
    pub safe: bool,
    pub sold: usize,
    pub rejected: usize,
    /// Requests that ended without an answer about stock: WATCH retries exhausted, lock busy.
    pub gave_up: usize,
    pub errors: usize,
    pub first_error: Option<String>,
    pub oversold: usize,
    pub final_stock: i64,
    pub elapsed_ms: f64,
    pub throughput: f64,
    pub latency: Latency,
}

impl StrategyResult {
    /// For a safe strategy: nothing oversold, and the stock accounts for every sale.
    pub fn held(&self, contest: &Contest) -> bool {
        self.oversold == 0
            && self.errors == 0
            && self.final_stock >= 0
            && self.sold as i64 + self.final_stock == i64::from(contest.units)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ContestReport {
    pub contest: Contest,
    pub results: Vec<StrategyResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LabReport {
    pub contests: Vec<ContestReport>,
}

impl LabReport {
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        for report in &self.contests {
            let c = report.contest;
            let _ = writeln!(
                out,
                "### {} units, {} requests of 1 unit, {} workers\n",
                c.units, c.requests, c.workers
            );
            out.push_str("| strategy | safe? | sold | oversold | rejected | gave up | errors | final stock | req/s | p50 ms | p99 ms |\n");
            out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
            for r in &report.results {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {:.2} | {:.2} |",
                    r.label,
                    if r.safe { "yes" } else { "no" },
                    r.sold,
                    if r.oversold > 0 {
                        format!("**{}**", r.oversold)
                    } else {
                        "0".into()
                    },
                    r.rejected,
                    r.gave_up,
                    r.errors,
                    r.final_stock,
                    r.throughput,
                    r.latency.p50_ms,
                    r.latency.p99_ms
                );
            }
            for r in report.results.iter().filter(|r| r.first_error.is_some()) {
                let _ = writeln!(
                    out,
                    "\n{}: first error: {}",
                    r.label,
                    r.first_error.as_deref().unwrap_or_default()
                );
            }
            out.push('\n');
        }
        out.push_str(
            "Unsafe strategies (safe? = no) are reported, not asserted: whether their race shows \
             in a run depends on timing, so an oversold of 0 for them proves nothing. A safe \
             strategy that oversells is a failure.\n",
        );
        out
    }

    /// Safe strategies that sold more than they had or lost track of stock.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for report in &self.contests {
            for r in report.results.iter().filter(|r| r.safe) {
                if !r.held(&report.contest) {
                    failures.push(format!(
                        "{} in {}x{}x{}: sold {}, oversold {}, final stock {}, errors {}",
                        r.label,
                        report.contest.units,
                        report.contest.requests,
                        report.contest.workers,
                        r.sold,
                        r.oversold,
                        r.final_stock,
                        r.errors
                    ));
                }
            }
        }
        failures
    }
}

enum Attempt {
    Sold,
    Rejected,
    GaveUp,
    Error(String),
}

struct Env {
    redis: redis::Client,
    prefix: String,
    pool: PgPool,
    shop: Shop,
    shop_without_gate: Shop,
    customers: Vec<CustomerId>,
    watch_retries: u32,
    // Last: the pools above hold connections into it.
    _db: ScratchDb,
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

#[derive(QueryableByName)]
struct Stock {
    #[diesel(sql_type = Integer)]
    stock: i32,
}

const TAKE_ONE_LUA: &str = r"
local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if stock < want then return -1 end
return redis.call('DECRBY', KEYS[1], want)
";

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

async fn redis_attempt(
    strategy: Strategy,
    con: &mut MultiplexedConnection,
    key: &str,
    script: &redis::Script,
    env: &Env,
) -> redis::RedisResult<Attempt> {
    Ok(match strategy {
        Strategy::RedisGetDecr => {
            let stock: i64 = redis::cmd("GET").arg(key).query_async(con).await?;
            if stock < 1 {
                return Ok(Attempt::Rejected);
            }
            let _: i64 = redis::cmd("DECR").arg(key).query_async(con).await?;
            Attempt::Sold
        }
        Strategy::RedisPipeline | Strategy::RedisMulti => {
            let mut pipe = redis::pipe();
            if strategy == Strategy::RedisMulti {
                pipe.atomic();
            }
            let (before, _after): (i64, i64) = pipe
                .cmd("GET")
                .arg(key)
                .cmd("DECRBY")
                .arg(key)
                .arg(1)
                .query_async(con)
                .await?;
            if before >= 1 {
                Attempt::Sold
            } else {
                // The decrement ran whatever GET said: give the unit back.
                let _: i64 = redis::cmd("INCRBY")
                    .arg(key)
                    .arg(1)
                    .query_async(con)
                    .await?;
                Attempt::Rejected
            }
        }
        Strategy::RedisWatch => {
            for _ in 0..env.watch_retries {
                let _: () = redis::cmd("WATCH").arg(key).query_async(con).await?;
                let stock: i64 = redis::cmd("GET").arg(key).query_async(con).await?;
                if stock < 1 {
                    let _: () = redis::cmd("UNWATCH").query_async(con).await?;
                    return Ok(Attempt::Rejected);
                }
                let committed: Option<(i64,)> = redis::pipe()
                    .atomic()
                    .cmd("DECRBY")
                    .arg(key)
                    .arg(1)
                    .query_async(con)
                    .await?;
                if committed.is_some() {
                    return Ok(Attempt::Sold);
                }
            }
            Attempt::GaveUp
        }
        Strategy::RedisLua => {
            let left: i64 = script.key(key).arg(1).invoke_async(con).await?;
            if left >= 0 {
                Attempt::Sold
            } else {
                Attempt::Rejected
            }
        }
        _ => unreachable!("{strategy:?} is not a Redis strategy"),
    })
}

async fn pg_attempt(
    strategy: Strategy,
    env: &Env,
    product: i64,
    request: usize,
) -> Result<Attempt, AppError> {
    if matches!(strategy, Strategy::Flashsale | Strategy::FlashsaleNoGate) {
        let shop = if strategy == Strategy::Flashsale {
            &env.shop
        } else {
            &env.shop_without_gate
        };
        let customer = env.customers[request % env.customers.len()];
        let line = Line {
            product: ProductId(product),
            quantity: Quantity::new(1)?,
        };
        return Ok(match purchase(shop, customer, vec![line], None).await? {
            PurchaseOutcome::Purchased(_) => Attempt::Sold,
            PurchaseOutcome::Refused(Refusal::SoldOut { .. }) => Attempt::Rejected,
            PurchaseOutcome::Busy | PurchaseOutcome::Unavailable(_) => Attempt::GaveUp,
            other => Attempt::Error(format!("{other:?}")),
        });
    }
    db::run(&env.pool, move |conn| {
        let read = |conn: &mut PgConnection, sql: &str| -> Result<i32, AppError> {
            Ok(diesel::sql_query(sql)
                .bind::<BigInt, _>(product)
                .get_result::<Stock>(conn)?
                .stock)
        };
        Ok(match strategy {
            Strategy::PgReadUpdate => {
                let stock = read(conn, "SELECT stock FROM products WHERE id = $1")?;
                if stock < 1 {
                    return Ok(Attempt::Rejected);
                }
                diesel::sql_query("UPDATE products SET stock = $2 WHERE id = $1")
                    .bind::<BigInt, _>(product)
                    .bind::<Integer, _>(stock - 1)
                    .execute(conn)?;
                Attempt::Sold
            }
            Strategy::PgForUpdate => conn.transaction(|conn| {
                let stock = read(conn, "SELECT stock FROM products WHERE id = $1 FOR UPDATE")?;
                if stock < 1 {
                    return Ok::<_, AppError>(Attempt::Rejected);
                }
                diesel::sql_query("UPDATE products SET stock = stock - 1 WHERE id = $1")
                    .bind::<BigInt, _>(product)
                    .execute(conn)?;
                Ok(Attempt::Sold)
            })?,
            Strategy::PgConditional => {
                let taken = diesel::sql_query(
                    "UPDATE products SET stock = stock - $1 WHERE id = $2 AND stock >= $1",
                )
                .bind::<Integer, _>(1)
                .bind::<BigInt, _>(product)
                .execute(conn)?;
                if taken == 1 {
                    Attempt::Sold
                } else {
                    Attempt::Rejected
                }
            }
            _ => unreachable!("{strategy:?} is not a Postgres strategy"),
        })
    })
    .await
}

/// One of the Redis behaviours the lab demonstrates on its own.
#[derive(Debug, Clone, Serialize)]
pub struct Experiment {
    pub name: &'static str,
    pub expected: String,
    pub observed: String,
    pub pass: bool,
}

fn experiment(name: &'static str, expected: String, observed: String) -> Experiment {
    Experiment {
        pass: expected == observed,
        name,
        expected,
        observed,
    }
}

/// Script that takes `ARGV[1]` units once per request id `KEYS[2]`: a repeat
/// with the same quantity answers what the first call answered, a repeat with
/// another quantity is refused, and neither touches the stock again.
const IDEMPOTENT_TAKE_LUA: &str = r"
local done = redis.call('HGET', KEYS[2], 'quantity')
if done then
  if done ~= ARGV[1] then return {'conflict', tonumber(done)} end
  return {'replay', tonumber(redis.call('HGET', KEYS[2], 'left'))}
end
local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if stock < want then return {'sold-out', stock} end
local left = redis.call('DECRBY', KEYS[1], want)
redis.call('HSET', KEYS[2], 'quantity', ARGV[1], 'left', left)
redis.call('EXPIRE', KEYS[2], 3600)
return {'taken', left}
";

fn show(value: &redis::Value) -> String {
    match value {
        redis::Value::Nil => "nil".into(),
        redis::Value::Int(n) => n.to_string(),
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::Okay => "OK".into(),
        redis::Value::Array(items) => format!(
            "[{}]",
            items.iter().map(show).collect::<Vec<_>>().join(", ")
        ),
        redis::Value::ServerError(error) => {
            format!("error {}", error.code())
        }
        other => format!("{other:?}"),
    }
}

pub async fn run_experiments(redis_url: &str) -> anyhow::Result<Vec<Experiment>> {
    let client = redis::Client::open(redis_url)?;
    let prefix = format!("lab:{}:", uuid::Uuid::new_v4().simple());
    let key = |name: &str| format!("{prefix}{name}");
    let mut con = client.get_multiplexed_async_connection().await?;
    let mut out = Vec::new();

    // 1. A plain pipeline only batches round trips: DECRBY runs whatever GET saw.
    let stock = key("pipeline");
    let _: () = redis::cmd("SET")
        .arg(&stock)
        .arg(0)
        .query_async(&mut con)
        .await?;
    let (seen, after): (i64, i64) = redis::pipe()
        .cmd("GET")
        .arg(&stock)
        .cmd("DECRBY")
        .arg(&stock)
        .arg(1)
        .query_async(&mut con)
        .await?;
    out.push(experiment(
        "pipeline GET+DECRBY at stock 0",
        "GET 0, DECRBY -1: the decrement is not conditional".into(),
        format!("GET {seen}, DECRBY {after}: the decrement is not conditional"),
    ));

    // 2. Inside MULTI the GET's answer arrives with EXEC, too late to decide anything.
    let stock = key("multi");
    let _: () = redis::cmd("SET")
        .arg(&stock)
        .arg(0)
        .query_async(&mut con)
        .await?;
    let (seen, after): (i64, i64) = redis::pipe()
        .atomic()
        .cmd("GET")
        .arg(&stock)
        .cmd("DECRBY")
        .arg(&stock)
        .arg(1)
        .query_async(&mut con)
        .await?;
    out.push(experiment(
        "MULTI with GET then DECRBY at stock 0",
        "EXEC answers [0, -1]: atomic, yet the DECRBY could not depend on the GET".into(),
        format!(
            "EXEC answers [{seen}, {after}]: atomic, yet the DECRBY could not depend on the GET"
        ),
    ));

    // 3. WATCH: a write by another connection between WATCH and EXEC voids the transaction.
    let stock = key("watch");
    let mut watcher = client.get_multiplexed_async_connection().await?;
    let mut other = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("SET")
        .arg(&stock)
        .arg(5)
        .query_async(&mut con)
        .await?;
    let _: () = redis::cmd("WATCH")
        .arg(&stock)
        .query_async(&mut watcher)
        .await?;
    let _: i64 = redis::cmd("GET")
        .arg(&stock)
        .query_async(&mut watcher)
        .await?;
    let _: i64 = redis::cmd("DECR")
        .arg(&stock)
        .query_async(&mut other)
        .await?;
    let exec: redis::Value = redis::pipe()
        .atomic()
        .cmd("DECRBY")
        .arg(&stock)
        .arg(1)
        .query_async(&mut watcher)
        .await?;
    let left: i64 = redis::cmd("GET").arg(&stock).query_async(&mut con).await?;
    out.push(experiment(
        "WATCH, then another client writes, then EXEC",
        "EXEC nil, stock 4".into(),
        format!("EXEC {}, stock {left}", show(&exec)),
    ));

    // 4. An idempotent Lua decrement, called twice, then with a conflicting quantity.
    let stock = key("idem-stock");
    let request = key("idem-request:1");
    let script = redis::Script::new(IDEMPOTENT_TAKE_LUA);
    let _: () = redis::cmd("SET")
        .arg(&stock)
        .arg(10)
        .query_async(&mut con)
        .await?;
    let mut answers = Vec::new();
    for quantity in [2, 2, 3] {
        let answer: redis::Value = script
            .key(&stock)
            .key(&request)
            .arg(quantity)
            .invoke_async(&mut con)
            .await?;
        answers.push(show(&answer));
    }
    let left: i64 = redis::cmd("GET").arg(&stock).query_async(&mut con).await?;
    out.push(experiment(
        "idempotent Lua decrement: qty 2, same again, then qty 3 with the same id",
        "[taken, 8] [replay, 8] [conflict, 2], stock 8".into(),
        format!("{}, stock {left}", answers.join(" ")),
    ));

    // 5. A command failing inside EXEC does not undo the ones before it: no rollback.
    let stock = key("wrongtype-stock");
    let list = key("wrongtype-list");
    let _: () = redis::cmd("SET")
        .arg(&stock)
        .arg(5)
        .query_async(&mut con)
        .await?;
    let _: i64 = redis::cmd("RPUSH")
        .arg(&list)
        .arg("x")
        .query_async(&mut con)
        .await?;
    let exec: redis::Value = redis::pipe()
        .atomic()
        .cmd("DECRBY")
        .arg(&stock)
        .arg(1)
        .cmd("INCR")
        .arg(&list)
        .cmd("DECRBY")
        .arg(&stock)
        .arg(1)
        .ignore_errors()
        .query_async(&mut con)
        .await?;
    let left: i64 = redis::cmd("GET").arg(&stock).query_async(&mut con).await?;
    out.push(experiment(
        "MULTI: DECRBY, a WRONGTYPE INCR, DECRBY",
        "EXEC [4, error WRONGTYPE, 3], stock 3: the writes around the error stay".into(),
        format!(
            "EXEC {}, stock {left}: the writes around the error stay",
            show(&exec)
        ),
    ));

    let keys: Vec<String> = [
        "pipeline",
        "multi",
        "watch",
        "idem-stock",
        "idem-request:1",
        "wrongtype-stock",
        "wrongtype-list",
    ]
    .iter()
    .map(|k| key(k))
    .collect();
    let _: i64 = redis::cmd("DEL").arg(keys).query_async(&mut con).await?;
    Ok(out)
}

pub fn render_experiments(experiments: &[Experiment]) -> String {
    let mut out = String::new();
    for (n, e) in experiments.iter().enumerate() {
        let _ = writeln!(
            out,
            "{}. [{}] {}\n   expected: {}\n   observed: {}",
            n + 1,
            if e.pass { "PASS" } else { "FAIL" },
            e.name,
            e.expected,
            e.observed
        );
    }
    out
}

/// Refuses lab sizes that cannot be a contest.
pub fn check(config: &LabConfig) -> anyhow::Result<()> {
    if config.contests.is_empty() || config.strategies.is_empty() {
        bail!("nothing to run: give at least one contest and one strategy");
    }
    Ok(())
}

/// `docs/lab.md`: how it was produced, the contest tables and the experiments.
pub fn lab_document(report: &LabReport, experiments: &[Experiment]) -> String {
    let mut out = String::from("# Stock strategy lab\n\n");
    let contests: Vec<String> = report
        .contests
        .iter()
        .map(|c| {
            format!(
                "--contest {}x{}x{}",
                c.contest.units, c.contest.requests, c.contest.workers
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "Generated by `cargo run --release -- lab {} --output docs/lab.md` on {} \
         ({} CPUs, shared), against the local Postgres and Redis. Each request asks for one unit; \
         all workers start together; throughput is requests / wall time of the contest.\n",
        contests.join(" "),
        chrono::Utc::now().format("%Y-%m-%d"),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    out.push_str("## Contests\n\n");
    out.push_str(&report.markdown());
    out.push_str("\n## Redis experiments (`flashsale lab experiments`)\n\n");
    out.push_str("| # | experiment | expected | observed | result |\n|---|---|---|---|---|\n");
    for (n, e) in experiments.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            n + 1,
            e.name,
            e.expected,
            e.observed,
            if e.pass { "PASS" } else { "FAIL" }
        );
    }
    out
}
