//! The admin "Operations" page: the figures `/metrics` exposes, as tables
//! for people (counts since this process started).

use askama::Template;

use super::Nav;
use crate::metrics::{Distribution, OperationsSnapshot, Tally};

/// Label values shown even before they are first counted, so a zero is
/// visible as a zero rather than as a missing row.
const OUTCOMES: &[&str] = &[
    "purchased",
    "sold_out",
    "limit_reached",
    "not_open",
    "busy",
    "unavailable",
    "invalid",
    "error",
];
const GATE_DECISIONS: &[&str] = &[
    "admitted",
    "sold_out",
    "limit_reached",
    "unknown",
    "repeat",
    "conflict",
    "error",
];
const TRANSACTION_KINDS: &[&str] = &["purchase_batch", "purchase", "restore", "adjust"];
const LOCK_RESULTS: &[&str] = &["acquired", "failed"];
const RESTORE_REASONS: &[&str] = &["payment_failed", "expired", "refunded"];
const JOBS: &[&str] = &["expire_unpaid_orders", "purge_idempotency_keys"];

pub struct CountRow {
    pub label: String,
    pub count: u64,
}

pub struct DistributionRow {
    pub label: String,
    pub count: u64,
    pub p50: String,
    pub p99: String,
    pub mean: String,
}

#[derive(Template)]
#[template(path = "admin_operations.html")]
pub struct OperationsPage {
    pub nav: Nav,
    pub purchases: Vec<CountRow>,
    pub lock_timings: Vec<DistributionRow>,
    pub transactions: Vec<DistributionRow>,
    /// One row: the histogram has no labels.
    pub batch_sizes: Vec<DistributionRow>,
    pub gate_decisions: Vec<CountRow>,
    pub drift_products: i64,
    pub drift_units: i64,
    pub reconcile_runs: u64,
    pub job_runs: Vec<CountRow>,
    pub restores: Vec<CountRow>,
}

impl OperationsPage {
    pub fn new(nav: Nav, snapshot: OperationsSnapshot) -> OperationsPage {
        let mut lock_timings = timing_rows(LOCK_RESULTS, &snapshot.lock_wait, "Wait, ");
        lock_timings.push(timing_row("Hold".into(), &snapshot.lock_hold));
        lock_timings.push(timing_row("Hand-over gap".into(), &snapshot.lock_handover));
        OperationsPage {
            nav,
            purchases: count_rows(OUTCOMES, &snapshot.purchases),
            lock_timings,
            transactions: timing_rows(TRANSACTION_KINDS, &snapshot.transactions, ""),
            batch_sizes: vec![distribution_row(
                "All batches".into(),
                &snapshot.batch_size,
                |buyers| format!("{buyers:.1}"),
            )],
            gate_decisions: count_rows(GATE_DECISIONS, &snapshot.gate_decisions),
            drift_products: snapshot.drift_products,
            drift_units: snapshot.drift_units,
            reconcile_runs: snapshot.reconcile_runs,
            job_runs: count_rows(JOBS, &snapshot.job_runs),
            restores: count_rows(RESTORE_REASONS, &snapshot.restores),
        }
    }
}

/// The known labels in their usual order, then any other label counted.
fn count_rows(known: &[&str], tallies: &[Tally]) -> Vec<CountRow> {
    let extra = tallies
        .iter()
        .map(|tally| tally.label.as_str())
        .filter(|label| !known.contains(label));
    known
        .iter()
        .copied()
        .chain(extra)
        .map(|label| CountRow {
            label: label.to_owned(),
            count: OperationsSnapshot::count(tallies, label),
        })
        .collect()
}

fn timing_rows(
    known: &[&str],
    distributions: &[Distribution],
    prefix: &str,
) -> Vec<DistributionRow> {
    let extra = distributions
        .iter()
        .map(|distribution| distribution.label.as_str())
        .filter(|label| !known.contains(label));
    known
        .iter()
        .copied()
        .chain(extra)
        .map(|label| {
            let row_label = format!("{prefix}{label}");
            match distributions.iter().find(|d| d.label == label) {
                Some(distribution) => timing_row(row_label, distribution),
                None => empty_row(row_label),
            }
        })
        .collect()
}

fn timing_row(label: String, distribution: &Distribution) -> DistributionRow {
    distribution_row(label, distribution, seconds)
}

fn distribution_row(
    label: String,
    distribution: &Distribution,
    format: impl Fn(f64) -> String,
) -> DistributionRow {
    let shown = |value: Option<f64>| value.map_or_else(|| "—".to_owned(), &format);
    DistributionRow {
        label,
        count: distribution.count,
        p50: shown(distribution.p50),
        p99: shown(distribution.p99),
        mean: shown(distribution.mean()),
    }
}

fn empty_row(label: String) -> DistributionRow {
    DistributionRow {
        label,
        count: 0,
        p50: "—".into(),
        p99: "—".into(),
        mean: "—".into(),
    }
}

fn seconds(value: f64) -> String {
    if value < 1.0 {
        format!("{:.1} ms", value * 1000.0)
    } else {
        format!("{value:.2} s")
    }
}
