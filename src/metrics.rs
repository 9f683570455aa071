//! Process-wide Prometheus metrics behind a small typed API.
//!
//! Callers name what happened (`purchase_outcome("sold_out")`), never a metric
//! object, so the metric names, label names and buckets live only here. The
//! same registry feeds `GET /metrics` (text format) and the admin
//! "Operations" page (`snapshot`).

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::proto::{Metric, MetricFamily};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// Seconds, from half a millisecond (an uncontended Redis round trip) to ten
/// seconds (far past any lock lease), so both ends of a sale burst stay visible.
const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const BATCH_SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

struct Metrics {
    registry: Registry,
    purchases: IntCounterVec,
    lock_wait: HistogramVec,
    lock_hold: Histogram,
    transactions: HistogramVec,
    batch_size: Histogram,
    redis_batch: HistogramVec,
    gate_decisions: IntCounterVec,
    drift_products: IntGauge,
    drift_units: IntGauge,
    reconcile_runs: IntCounter,
    job_runs: IntCounterVec,
    restores: IntCounterVec,
    lock_handover: Histogram,
    db_statements: IntCounter,
}

const PURCHASES: &str = "flashsale_purchases_total";
const LOCK_WAIT: &str = "flashsale_lock_wait_seconds";
const LOCK_HOLD: &str = "flashsale_lock_hold_seconds";
const TRANSACTIONS: &str = "flashsale_db_transaction_seconds";
const BATCH_SIZE: &str = "flashsale_purchase_batch_size";
const REDIS_BATCH: &str = "flashsale_redis_batch_calls";
const GATE_DECISIONS: &str = "flashsale_gate_decisions_total";
const DRIFT_PRODUCTS: &str = "flashsale_gate_drift_products";
const DRIFT_UNITS: &str = "flashsale_gate_drift_units";
const RECONCILE_RUNS: &str = "flashsale_reconcile_runs_total";
const JOB_RUNS: &str = "flashsale_job_runs_total";
const RESTORES: &str = "flashsale_restores_total";
const LOCK_HANDOVER: &str = "flashsale_lock_handover_seconds";
const DB_STATEMENTS: &str = "flashsale_db_statements_total";

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::register);

impl Metrics {
    fn register() -> Metrics {
        let registry = Registry::new();
        let counters = |name: &str, help: &str, label: &str| {
            registered(
                &registry,
                IntCounterVec::new(Opts::new(name, help), &[label]),
            )
        };
        let histograms = |name: &str, help: &str, label: &str| {
            let opts = HistogramOpts::new(name, help).buckets(SECONDS_BUCKETS.to_vec());
            registered(&registry, HistogramVec::new(opts, &[label]))
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
            registered(&registry, Histogram::with_opts(opts))
        };
        let gauge = |name: &str, help: &str| registered(&registry, IntGauge::new(name, help));
        Metrics {
            purchases: counters(PURCHASES, "Purchase attempts by outcome.", "outcome"),
            lock_wait: histograms(
                LOCK_WAIT,
                "Time spent waiting for a product lock.",
                "result",
            ),
            lock_hold: histogram(LOCK_HOLD, "Time a product lock was held.", SECONDS_BUCKETS),
            transactions: histograms(
                TRANSACTIONS,
                "Duration of database transactions by kind.",
                "kind",
            ),
            batch_size: histogram(
                BATCH_SIZE,
                "Buyers served by one combined purchase transaction.",
                BATCH_SIZE_BUCKETS,
            ),
            redis_batch: registered(
                &registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        REDIS_BATCH,
                        "Calls of one script sent to Redis together (see redis_batch; `confirm`: places whose rows committed, a commit's joins together), by script.",
                    )
                    .buckets(BATCH_SIZE_BUCKETS.to_vec()),
                    &["script"],
                ),
            ),
            gate_decisions: counters(
                GATE_DECISIONS,
                "Stock gate answers by decision.",
                "decision",
            ),
            drift_products: gauge(
                DRIFT_PRODUCTS,
                "Products whose gate count differed from Postgres at the last reconcile.",
            ),
            drift_units: gauge(
                DRIFT_UNITS,
                "Sum of gate minus Postgres units corrected at the last reconcile.",
            ),
            reconcile_runs: registered(
                &registry,
                IntCounter::new(RECONCILE_RUNS, "Stock gate reconcile passes completed."),
            ),
            job_runs: counters(JOB_RUNS, "Background job passes by job.", "job"),
            restores: counters(
                RESTORES,
                "Orders whose stock was restored, by reason.",
                "reason",
            ),
            lock_handover: histogram(
                LOCK_HANDOVER,
                "Gap between a lock release and the next holder taking it.",
                SECONDS_BUCKETS,
            ),
            db_statements: registered(
                &registry,
                IntCounter::new(
                    DB_STATEMENTS,
                    "SQL statements sent to Postgres by pooled connections (BEGIN and COMMIT included).",
                ),
            ),
            registry,
        }
    }
}

/// The definitions are constants, so a failure here is a programming error
/// that the first test touching metrics reports.
fn registered<M: Collector + Clone + 'static>(
    registry: &Registry,
    metric: prometheus::Result<M>,
) -> M {
    let metric = metric.expect("valid metric definition");
    registry
        .register(Box::new(metric.clone()))
        .expect("metric names are registered once");
    metric
}

/// One purchase attempt ended: purchased, sold_out, limit_reached, not_open,
/// busy, unavailable, invalid or error.
pub fn purchase_outcome(outcome: &'static str) {
    METRICS.purchases.with_label_values(&[outcome]).inc();
}

pub fn lock_wait(waited: Duration, acquired: bool) {
    let result = if acquired { "acquired" } else { "failed" };
    METRICS
        .lock_wait
        .with_label_values(&[result])
        .observe(waited.as_secs_f64());
}

pub fn lock_hold(held: Duration) {
    METRICS.lock_hold.observe(held.as_secs_f64());
}

/// kind: purchase_batch, purchase, restore or adjust.
pub fn transaction_time(kind: &'static str, took: Duration) {
    METRICS
        .transactions
        .with_label_values(&[kind])
        .observe(took.as_secs_f64());
}

pub fn batch_size(buyers: usize) {
    METRICS.batch_size.observe(buyers as f64);
}

/// script: `admit`, `status`, or `confirm` (places whose rows committed:
/// a commit's joins together, or the tick's).
pub fn redis_batch(script: &'static str, calls: usize) {
    METRICS
        .redis_batch
        .with_label_values(&[script])
        .observe(calls as f64);
}

/// decision: admitted, sold_out, limit_reached, unknown, repeat or error.
pub fn gate_decision(decision: &'static str) {
    METRICS.gate_decisions.with_label_values(&[decision]).inc();
}

pub fn reconcile(products_drifted: usize, units_drift: i64) {
    METRICS
        .drift_products
        .set(i64::try_from(products_drifted).unwrap_or(i64::MAX));
    METRICS.drift_units.set(units_drift);
    METRICS.reconcile_runs.inc();
}

pub fn job_run(job: &'static str) {
    METRICS.job_runs.with_label_values(&[job]).inc();
}

/// reason: payment_failed, expired or refunded.
pub fn restored(reason: &'static str, orders: u64) {
    METRICS.restores.with_label_values(&[reason]).inc_by(orders);
}

pub fn lock_handover(gap: Duration) {
    METRICS.lock_handover.observe(gap.as_secs_f64());
}

/// A pooled connection is about to send one statement to Postgres.
pub fn db_statement() {
    METRICS.db_statements.inc();
}

/// The Prometheus text exposition format (version 0.0.4) of every metric.
pub fn render() -> String {
    let mut text = Vec::new();
    TextEncoder::new()
        .encode(&METRICS.registry.gather(), &mut text)
        .expect("the text encoder writes to memory");
    String::from_utf8(text).expect("the text encoder writes UTF-8")
}

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// A counter's value for one label value.
#[derive(Debug, Clone, PartialEq)]
pub struct Tally {
    pub label: String,
    pub count: u64,
}

/// A histogram (for one label value, or "" when it has none) in figures a
/// person reads; the quantiles are estimated from the buckets, so they are
/// only as fine as the bucket bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Distribution {
    pub label: String,
    pub count: u64,
    pub sum: f64,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

impl Distribution {
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

/// The current value of every metric, for the admin "Operations" page.
#[derive(Debug, Clone, PartialEq)]
pub struct OperationsSnapshot {
    pub purchases: Vec<Tally>,
    pub lock_wait: Vec<Distribution>,
    pub lock_hold: Distribution,
    pub transactions: Vec<Distribution>,
    pub batch_size: Distribution,
    pub gate_decisions: Vec<Tally>,
    pub drift_products: i64,
    pub drift_units: i64,
    pub reconcile_runs: u64,
    pub job_runs: Vec<Tally>,
    pub restores: Vec<Tally>,
    pub lock_handover: Distribution,
}

impl OperationsSnapshot {
    /// The count for one label value of a tally list, 0 when never counted.
    pub fn count(tallies: &[Tally], label: &str) -> u64 {
        tallies
            .iter()
            .find(|tally| tally.label == label)
            .map_or(0, |tally| tally.count)
    }
}

pub fn snapshot() -> OperationsSnapshot {
    let families = METRICS.registry.gather();
    let family = |name: &str| -> &[Metric] {
        families
            .iter()
            .find(|family| family.name() == name)
            .map_or(&[], MetricFamily::get_metric)
    };
    let single = |name: &str| {
        distributions(family(name))
            .pop()
            .unwrap_or_else(|| Distribution {
                label: String::new(),
                count: 0,
                sum: 0.0,
                p50: None,
                p99: None,
            })
    };
    OperationsSnapshot {
        purchases: tallies(family(PURCHASES)),
        lock_wait: distributions(family(LOCK_WAIT)),
        lock_hold: single(LOCK_HOLD),
        transactions: distributions(family(TRANSACTIONS)),
        batch_size: single(BATCH_SIZE),
        gate_decisions: tallies(family(GATE_DECISIONS)),
        drift_products: METRICS.drift_products.get(),
        drift_units: METRICS.drift_units.get(),
        reconcile_runs: METRICS.reconcile_runs.get(),
        job_runs: tallies(family(JOB_RUNS)),
        restores: tallies(family(RESTORES)),
        lock_handover: single(LOCK_HANDOVER),
    }
}

fn label_of(metric: &Metric) -> String {
    metric
        .get_label()
        .first()
        .map(|pair| pair.value().to_owned())
        .unwrap_or_default()
}

fn tallies(metrics: &[Metric]) -> Vec<Tally> {
    metrics
        .iter()
        .map(|metric| Tally {
            label: label_of(metric),
            // Counters hold whole numbers; the proto carries them as f64.
            count: metric.get_counter().get_value() as u64,
        })
        .collect()
}

fn distributions(metrics: &[Metric]) -> Vec<Distribution> {
    metrics
        .iter()
        .map(|metric| {
            let histogram = metric.get_histogram();
            let buckets: Vec<(f64, u64)> = histogram
                .get_bucket()
                .iter()
                .map(|bucket| (bucket.upper_bound(), bucket.cumulative_count()))
                .collect();
            let count = histogram.get_sample_count();
            Distribution {
                label: label_of(metric),
                count,
                sum: histogram.get_sample_sum(),
                p50: quantile(&buckets, count, 0.5),
                p99: quantile(&buckets, count, 0.99),
            }
        })
        .collect()
}

/// Estimates a quantile from cumulative buckets the way Prometheus'
/// `histogram_quantile` does: linear interpolation inside the bucket holding
/// the rank, the lowest bucket starting at 0, and the highest finite bound
/// when the rank falls in the overflow (+Inf) bucket.
fn quantile(buckets: &[(f64, u64)], count: u64, q: f64) -> Option<f64> {
    if count == 0 || buckets.is_empty() {
        return None;
    }
    let rank = q * count as f64;
    let mut lower = (0.0, 0u64);
    for &(upper_bound, cumulative) in buckets {
        if cumulative as f64 >= rank {
            let (lower_bound, below) = lower;
            let in_bucket = (cumulative - below) as f64;
            if in_bucket == 0.0 {
                return Some(upper_bound);
            }
            let fraction = (rank - below as f64) / in_bucket;
            return Some(lower_bound + (upper_bound - lower_bound) * fraction);
        }
        lower = (upper_bound, cumulative);
    }
    Some(lower.0)
}

#[cfg(test)]
mod tests {
    use super::quantile;

    const BUCKETS: &[(f64, u64)] = &[(1.0, 2), (2.0, 6), (4.0, 10)];

    #[test]
    fn no_samples_have_no_quantile() {
        assert_eq!(quantile(BUCKETS, 0, 0.5), None);
    }

    #[test]
    fn quantile_interpolates_inside_its_bucket() {
        // rank 5 of 10 is the 3rd of 4 samples in (1, 2].
        assert_eq!(quantile(BUCKETS, 10, 0.5), Some(1.75));
        assert_eq!(quantile(BUCKETS, 10, 0.1), Some(0.5));
    }

    #[test]
    fn overflow_reports_the_highest_finite_bound() {
        assert_eq!(quantile(BUCKETS, 20, 0.99), Some(4.0));
    }
}
