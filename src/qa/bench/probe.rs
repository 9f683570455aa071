//! What each run cost, read from outside the load: Postgres's transaction
//! counters, the orders in the database, the shop's own counters on
//! `/metrics`, and what Postgres backends were doing while it ran.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text, Timestamptz};

use crate::db::split_database_url;

/// A backend flushes its statistics at most once a second while busy, and
/// what is left pending when it goes idle waits for its idle timeout
/// (`PGSTAT_IDLE_INTERVAL`, 10 s); past that, the counters are whole.
pub(super) const STATS_SETTLE: Duration = Duration::from_millis(10_500);

#[derive(QueryableByName)]
struct Number {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// A purchase run's selling, second by second at its ends.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct SaleShape {
    /// Orders in the run's first second of selling.
    pub first_second: u64,
    /// Orders in its last second of selling (up to its last order).
    pub last_second: u64,
    /// The most orders one transaction wrote.
    pub largest_transaction: u64,
    /// From the first order's transaction start to the last one's.
    pub selling_seconds: f64,
}

impl SaleShape {
    /// The last second's orders over the first's.
    pub fn last_over_first(&self) -> Option<f64> {
        (self.first_second > 0).then(|| self.last_second as f64 / self.first_second as f64)
    }
}

pub(super) struct Probe {
    /// On the server's `postgres` database, so reading the counters is not
    /// itself counted against the bench database.
    admin: PgConnection,
    bench_url: String,
    admin_url: String,
    datname: String,
    metrics_url: String,
    http: reqwest::Client,
}

impl Probe {
    pub fn new(database_url: &str, shop: &str) -> anyhow::Result<Probe> {
        let (server, datname) = split_database_url(database_url)?;
        let admin_url = format!("{server}/postgres");
        Ok(Probe {
            admin: PgConnection::establish(&admin_url)?,
            bench_url: database_url.to_string(),
            admin_url,
            datname,
            metrics_url: format!("{shop}/metrics"),
            http: reqwest::Client::new(),
        })
    }

    /// Committed plus rolled-back transactions of the bench database so far.
    pub fn transactions(&mut self) -> anyhow::Result<i64> {
        let row: Number = diesel::sql_query(
            "SELECT (xact_commit + xact_rollback)::bigint AS n FROM pg_stat_database WHERE datname = $1",
        )
        .bind::<Text, _>(&self.datname)
        .get_result(&mut self.admin)?;
        Ok(row.n)
    }

    /// Does now the maintenance autovacuum would otherwise do in the middle
    /// of the next run (the setup's sign-ins and joins leave dead rows and
    /// stale statistics behind), so its transactions are counted before
    /// that run's baseline rather than as the run's own.
    pub fn vacuum(&mut self) -> anyhow::Result<()> {
        use diesel::connection::SimpleConnection;
        let mut conn = PgConnection::establish(&self.bench_url)?;
        conn.batch_execute("VACUUM (ANALYZE)")?;
        Ok(())
    }

    /// Orders whose transaction began in `[from, to)`, and waiting-room
    /// places joined then. Counted on a connection of its own that is
    /// closed before this returns: a backend flushes its statistics as it
    /// exits, so the count's own transactions are in `transactions()` from
    /// then on, never in a later run's figure.
    pub fn committed_between(
        &mut self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> anyhow::Result<(u64, u64)> {
        #[derive(QueryableByName)]
        struct Counted {
            #[diesel(sql_type = BigInt)]
            n: i64,
            #[diesel(sql_type = BigInt)]
            places: i64,
            #[diesel(sql_type = diesel::sql_types::Integer)]
            pid: i32,
        }
        let mut conn = PgConnection::establish(&self.bench_url)?;
        let counted: Counted = diesel::sql_query(
            "SELECT (SELECT count(*) FROM orders WHERE created_at >= $1 AND created_at < $2) AS n, \
                    (SELECT count(*) FROM queue_entries WHERE joined_at >= $1 AND joined_at < $2) AS places, \
                    pg_backend_pid() AS pid",
        )
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .get_result(&mut conn)?;
        drop(conn);
        self.wait_gone(counted.pid)?;
        Ok((counted.n as u64, counted.places as u64))
    }

    /// How a purchase run sold, from the orders whose transaction began in
    /// `[from, to)`: the orders of its first and of its last second of
    /// selling (from the first order's start, and up to the last one's),
    /// and the most orders one transaction wrote (a transaction's orders
    /// share its `now()`, their `created_at`). On a connection of its own,
    /// closed before this returns, as `committed_between`.
    pub fn sale_shape(
        &mut self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> anyhow::Result<SaleShape> {
        #[derive(QueryableByName)]
        struct Shape {
            #[diesel(sql_type = BigInt)]
            first: i64,
            #[diesel(sql_type = BigInt)]
            last: i64,
            #[diesel(sql_type = BigInt)]
            largest: i64,
            #[diesel(sql_type = diesel::sql_types::Double)]
            selling: f64,
            #[diesel(sql_type = diesel::sql_types::Integer)]
            pid: i32,
        }
        let mut conn = PgConnection::establish(&self.bench_url)?;
        // Every CTE materialized, so each is computed once whatever plan
        // the statistics suggest: analyzed just before the run, they see no
        // order in its window, and the per-quarter count after a
        // 100,000-order run ran for more than ten minutes without this.
        let shape: Shape = diesel::sql_query(
            "WITH run AS MATERIALIZED (SELECT created_at FROM orders WHERE created_at >= $1 AND created_at < $2), \
                  span AS MATERIALIZED (SELECT min(created_at) AS first, max(created_at) AS last FROM run) \
             SELECT (SELECT count(*) FROM run, span WHERE created_at < span.first + interval '1 second') AS first, \
                    (SELECT count(*) FROM run, span WHERE created_at > span.last - interval '1 second') AS last, \
                    coalesce((SELECT count(*) FROM run GROUP BY created_at ORDER BY count(*) DESC LIMIT 1), 0) AS largest, \
                    coalesce((SELECT extract(epoch FROM span.last - span.first)::float8 FROM span), 0) AS selling, \
                    pg_backend_pid() AS pid",
        )
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .get_result(&mut conn)?;
        #[derive(QueryableByName)]
        struct Quarter {
            #[diesel(sql_type = BigInt)]
            quarter: i64,
            #[diesel(sql_type = BigInt)]
            n: i64,
        }
        // Orders per quarter second of selling, on stderr: how the rate
        // moved between the first and the last second (a quarter without
        // orders reads 0).
        let quarters: Vec<Quarter> = diesel::sql_query(
            "WITH run AS MATERIALIZED (SELECT created_at FROM orders WHERE created_at >= $1 AND created_at < $2), \
                  span AS MATERIALIZED (SELECT min(created_at) AS first FROM run) \
             SELECT floor(extract(epoch FROM run.created_at - span.first) * 4)::bigint AS quarter, \
                    count(*) AS n \
             FROM run, span GROUP BY 1 ORDER BY 1",
        )
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .load(&mut conn)?;
        let mut per_quarter = vec![0; quarters.last().map_or(0, |q| q.quarter as usize + 1)];
        for q in &quarters {
            per_quarter[q.quarter as usize] = q.n;
        }
        eprintln!(
            "  orders per quarter second of selling: {}",
            per_quarter
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        );
        drop(conn);
        self.wait_gone(shape.pid)?;
        Ok(SaleShape {
            first_second: shape.first as u64,
            last_second: shape.last as u64,
            largest_transaction: shape.largest as u64,
            selling_seconds: shape.selling,
        })
    }

    /// Until the backend `pid` has exited: it flushes its statistics as it
    /// does, so its transactions are in `transactions()` from then on.
    fn wait_gone(&mut self, pid: i32) -> anyhow::Result<()> {
        for _ in 0..200 {
            let alive: Number =
                diesel::sql_query("SELECT count(*) AS n FROM pg_stat_activity WHERE pid = $1")
                    .bind::<diesel::sql_types::Integer, _>(pid)
                    .get_result(&mut self.admin)?;
            if alive.n == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// The shop's counters and histogram sums, by series.
    pub async fn metrics(&self) -> anyhow::Result<Scrape> {
        let text = self
            .http
            .get(&self.metrics_url)
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        Ok(Scrape::parse(&text))
    }

    /// Samples `pg_stat_activity` of the bench database every 25 ms until
    /// the returned sampler is stopped.
    pub fn sample_activity(&self) -> anyhow::Result<Sampler> {
        let mut conn = PgConnection::establish(&self.admin_url)?;
        let datname = self.datname.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            #[derive(QueryableByName)]
            struct Backend {
                #[diesel(sql_type = Text)]
                what: String,
            }
            let mut seen = Activity::default();
            while !stopping.load(Ordering::Relaxed) {
                // A backend is "idle" while the shop holds it outside a
                // transaction; the rest is where Postgres time goes.
                let backends: Vec<Backend> = diesel::sql_query(
                    "SELECT state || ' / ' || coalesce(wait_event_type || ':' || wait_event, 'running') \
                       || CASE WHEN wait_event_type = 'Lock' THEN ' / ' || left(regexp_replace(query, '\\s+', ' ', 'g'), 48) ELSE '' END AS what \
                     FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                )
                .bind::<Text, _>(&datname)
                .load(&mut conn)
                .unwrap_or_default();
                seen.samples += 1;
                for backend in backends {
                    *seen.counts.entry(backend.what).or_default() += 1;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            seen
        });
        Ok(Sampler { stop, thread })
    }
}

#[derive(Debug, Default)]
pub(super) struct Activity {
    samples: u64,
    counts: HashMap<String, u64>,
}

impl Activity {
    /// Average backends in each state, busiest first.
    pub fn averages(&self) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = self
            .counts
            .iter()
            .map(|(what, n)| (what.clone(), *n as f64 / self.samples.max(1) as f64))
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1));
        out
    }
}

pub(super) struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Activity>,
}

impl Sampler {
    pub fn finish(self) -> Activity {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// One scrape of `/metrics`: every sample line's value by its series
/// (`name{labels}`).
#[derive(Debug, Clone, Default)]
pub(super) struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    fn parse(text: &str) -> Scrape {
        Scrape(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| {
                    let (series, value) = l.rsplit_once(' ')?;
                    Some((series.to_string(), value.parse().ok()?))
                })
                .collect(),
        )
    }

    pub fn get(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or(0.0)
    }

    /// What happened between `before` and this scrape.
    pub fn since(&self, before: &Scrape) -> Scrape {
        Scrape(
            self.0
                .iter()
                .map(|(series, value)| (series.clone(), value - before.get(series)))
                .collect(),
        )
    }

    /// Mean of a histogram (sum / count) over its series matching `labels`.
    pub fn mean(&self, name: &str, labels: &str) -> Option<f64> {
        let count = self.get(&format!("{name}_count{labels}"));
        (count > 0.0).then(|| self.get(&format!("{name}_sum{labels}")) / count)
    }

    pub fn count(&self, name: &str, labels: &str) -> f64 {
        self.get(&format!("{name}_count{labels}"))
    }
}

/// CPU time so far, in clock ticks: the whole machine's (busy and all) and
/// one process's, from `/proc`. On a shared machine this says how much of
/// the CPU the measured stack had.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Cpu {
    busy: u64,
    total: u64,
    process: u64,
}

/// What a run had of the machine.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct CpuShare {
    /// Cores busy on average, anything included.
    pub machine_busy_cores: f64,
    /// Cores the shop process used on average.
    pub shop_cores: f64,
    /// The 1-minute load average when the run began.
    pub load_average: f64,
}

impl Cpu {
    pub fn now(pid: u32) -> Cpu {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|t| t.parse().ok())
            .collect();
        let total: u64 = ticks.iter().take(8).sum();
        // idle and iowait
        let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
        let process = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                // Fields after the command name, which may hold spaces.
                let rest = s.rsplit_once(')')?.1.to_string();
                let fields: Vec<u64> = rest
                    .split_whitespace()
                    .skip(11)
                    .take(2)
                    .filter_map(|f| f.parse().ok())
                    .collect();
                Some(fields.iter().sum())
            })
            .unwrap_or(0);
        Cpu {
            busy: total.saturating_sub(idle),
            total,
            process,
        }
    }

    pub fn share_since(&self, before: &Cpu, load_average: f64) -> CpuShare {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let total = self.total.saturating_sub(before.total).max(1) as f64;
        // /proc/stat sums the ticks of every core.
        let per_core = total / cores;
        CpuShare {
            machine_busy_cores: self.busy.saturating_sub(before.busy) as f64 / per_core,
            shop_cores: self.process.saturating_sub(before.process) as f64 / per_core,
            load_average,
        }
    }
}

pub(super) fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Waits for the shop to answer `/healthz`.
pub(super) async fn wait_until_up(address: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    for _ in 0..200 {
        if let Ok(response) = client.get(format!("{address}/healthz")).send().await {
            if response.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(anyhow::anyhow!(
        "the shop at {address} never answered /healthz"
    ))
    .context("starting the shop")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrapes_are_read_and_subtracted() {
        let before = Scrape::parse("# HELP x\nflashsale_db_statements_total 10\nh_sum{kind=\"a\"} 1.5\nh_count{kind=\"a\"} 3\n");
        let after = Scrape::parse(
            "flashsale_db_statements_total 25\nh_sum{kind=\"a\"} 3.5\nh_count{kind=\"a\"} 7\n",
        );
        let delta = after.since(&before);
        assert_eq!(delta.get("flashsale_db_statements_total"), 15.0);
        assert_eq!(delta.mean("h", "{kind=\"a\"}"), Some(0.5));
    }
}
