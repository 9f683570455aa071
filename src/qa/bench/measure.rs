//! The shop under test and one measured run of it: a fresh release process
//! on the run's scratch database, wrk's load, and what the run cost, read
//! from outside the load (the database's counters and orders, the shop's
//! `/metrics`, CPU from `/proc`).

use std::path::PathBuf;

use chrono::Utc;

use super::probe::{load_average, wait_until_up, Cpu, Probe, STATS_SETTLE};
use super::process::{forget_redis_keys, ShopProcess};
use super::wrk::{wrk, Requests};
use super::*;

/// What a run's answers per second are compared with. The crowd's cheap
/// answers are held to a fraction of `/healthz`, and on a shared machine
/// the speed available drifts within a minute: those runs take `/healthz`
/// just before and just after themselves, so the ratio divides figures
/// measured side by side.
#[derive(Clone, Copy)]
pub(super) enum Yardstick {
    Beside,
    /// Purchases are held to pgbench; `/healthz` runs are their own.
    RunsOwn,
}

/// The shop under test and what measuring it needs.
pub(super) struct Bench<'a> {
    config: &'a BenchConfig,
    pub db_url: String,
    prefix: String,
    /// The shop's `SESSION_KEY`, hex: the same for every process it
    /// starts, so cookies stay valid across restarts.
    pub session_key: String,
    scratch: PathBuf,
    shop: Option<ShopProcess>,
    starts: usize,
    probe: Option<Probe>,
    /// The transaction count as the last run left it, while nothing has
    /// run since: the next run starts from it instead of settling again.
    baseline: Option<i64>,
    runs: usize,
}

impl<'a> Bench<'a> {
    /// A bench on `db_url`, its shop not started yet (`restart`).
    pub(super) fn new(config: &'a BenchConfig, db_url: &str, scratch: PathBuf) -> Bench<'a> {
        Bench {
            config,
            db_url: db_url.into(),
            prefix: format!("bench:{}:", uuid::Uuid::new_v4().simple()),
            session_key: hex::encode(crate::config::random_session_key()),
            scratch,
            shop: None,
            starts: 0,
            probe: None,
            baseline: None,
            runs: 0,
        }
    }

    /// Seconds of load per run.
    pub(super) fn seconds(&self) -> f64 {
        self.config.seconds
    }

    pub(super) fn address(&self) -> String {
        self.shop
            .as_ref()
            .map(|s| s.address.clone())
            .unwrap_or_default()
    }

    /// A fresh shop process; cookies stay valid across restarts since
    /// every process gets the same session key.
    pub(super) async fn restart(&mut self) -> anyhow::Result<()> {
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
    pub(super) async fn warm(
        &mut self,
        requests: &Requests<'_>,
        connections: usize,
    ) -> anyhow::Result<()> {
        let script = self.scratch.join("warm.lua");
        self.baseline = None;
        wrk(&self.address(), requests, connections, 1.0, &script).await?;
        Ok(())
    }

    /// Rows written to set a run up (the waiting room's joins) are no
    /// run's: the next run counts from a fresh baseline, with the vacuum and
    /// analyze those rows call for already done, so autovacuum's
    /// transactions on them are not counted as the run's either.
    pub(super) fn set_up_done(&mut self) -> anyhow::Result<()> {
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

    pub(super) async fn measure(
        &mut self,
        scenario: &'static str,
        requests: Requests<'_>,
        connections: usize,
        expect: u16,
        note: String,
        yardstick: Yardstick,
    ) -> anyhow::Result<Measured> {
        self.measure_for(
            scenario,
            requests,
            connections,
            expect,
            note,
            yardstick,
            self.config.seconds,
        )
        .await
    }

    /// `measure`, for `seconds` of load.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn measure_for(
        &mut self,
        scenario: &'static str,
        requests: Requests<'_>,
        connections: usize,
        expect: u16,
        note: String,
        yardstick: Yardstick,
        seconds: f64,
    ) -> anyhow::Result<Measured> {
        self.runs += 1;
        let script = self.scratch.join(format!("run-{}.lua", self.runs));
        let address = self.address();
        // Just outside the run's counters and samples: before its settle
        // and baseline, and (below) after its counters are read.
        let healthz_before = match yardstick {
            Yardstick::Beside => Some(self.healthz_now(connections).await?),
            Yardstick::RunsOwn => None,
        };
        let probe = self.probe.as_mut().expect("a running shop");
        let customers = match &requests {
            Requests::Sale(sale) => sale.buyers.len(),
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
        // Up to wrk's exit, not `from` plus its duration: a large script
        // (thousands of customers) takes wrk a while to load before its
        // clock starts, and no order of the run may fall outside the count.
        let to = Utc::now();
        tokio::time::sleep(STATS_SETTLE).await;
        let metrics = probe.metrics().await?.since(&metrics);
        let transactions = probe.transactions()? - transactions;
        let (orders, places) = probe.committed_between(from, to)?;
        let buys = matches!(requests, Requests::Buy { .. } | Requests::Sale(_));
        let shape = if buys && orders > 0 {
            Some(probe.sale_shape(from, to)?)
        } else {
            None
        };
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
        // A sale's crowd answers its own way: the sold-out buys 409, the
        // page views 200.
        let crowd =
            |status: u16| matches!(requests, Requests::Sale(_)) && [409, 200].contains(&status);
        let crowd_answers: u64 = run
            .statuses
            .iter()
            .filter(|(status, _)| crowd(**status))
            .map(|(_, n)| n)
            .sum();
        let mut unexpected: Vec<(u16, u64)> = run
            .statuses
            .iter()
            .filter(|(status, _)| **status != expect && !crowd(**status))
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
            shape,
            crowd_per_second: crowd_answers as f64 / run.seconds.max(1e-9),
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
        if let Some(shape) = measured.shape {
            eprintln!(
                "{:>48} first second {} orders, last second {}, largest transaction {} buyers, batch transaction {} ms, lock wait {} ms, crowd {:.0} answers/s",
                "",
                shape.first_second,
                shape.last_second,
                shape.largest_transaction,
                measured.batch_tx_ms.map_or("–".into(), |ms| format!("{ms:.2}")),
                measured.lock_wait_ms.map_or("–".into(), |ms| format!("{ms:.2}")),
                measured.crowd_per_second
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

/// A run's Redis keys go with it (the answer records of every sold-out buy,
/// the admission markers of every order): the machine's Redis is shared,
/// and a benchmark leaves nothing of its own there. Only keys under the
/// run's own prefix; the rest of the server is never touched.
impl Drop for Bench<'_> {
    fn drop(&mut self) {
        self.shop = None;
        let forgotten = forget_redis_keys(&self.prefix);
        match forgotten {
            Ok(keys) => eprintln!("removed the run's {keys} Redis keys ({}*)", self.prefix),
            Err(error) => eprintln!(
                "could not remove the run's Redis keys ({}*): {error}",
                self.prefix
            ),
        }
    }
}
