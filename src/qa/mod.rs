//! QA tooling: the race against a running shop, the strategy lab, the load
//! generator behind `scripts/bench` and the draw's outside check. None of it runs inside the shop itself.

pub mod bench;
pub mod draw;
pub mod harness;
pub mod lab;
pub mod race;

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Microsecond histogram spanning 1 µs to 10 minutes, so no sample is ever clamped
/// by a slow outlier.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

pub fn record(histogram: &mut Histogram<u64>, elapsed: Duration) {
    let micros = (elapsed.as_micros() as u64).clamp(1, 600_000_000);
    histogram.saturating_record(micros);
}

pub fn summarize(histogram: &Histogram<u64>) -> Latency {
    if histogram.is_empty() {
        return Latency::default();
    }
    let ms = |micros: u64| micros as f64 / 1000.0;
    Latency {
        p50_ms: ms(histogram.value_at_quantile(0.50)),
        p95_ms: ms(histogram.value_at_quantile(0.95)),
        p99_ms: ms(histogram.value_at_quantile(0.99)),
        max_ms: ms(histogram.max()),
    }
}
