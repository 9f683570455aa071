//! What a run is held to (issue #38 and those before it): the crowd's cheap
//! answers beside `/healthz`, the purchases against pgbench's best on the
//! same SQL, and a sale's rate as it fills.

use serde::Serialize;

use super::*;

#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub what: String,
    pub value: Option<f64>,
    pub bound: &'static str,
    pub limit: f64,
    pub pass: bool,
}

impl Target {
    fn new(what: impl Into<String>, value: Option<f64>, bound: &'static str, limit: f64) -> Target {
        let pass = value.is_some_and(|v| match bound {
            ">=" => v >= limit,
            "<=" => v <= limit,
            _ => v < limit,
        });
        Target {
            what: what.into(),
            value,
            bound,
            limit,
            pass,
        }
    }
    fn at_least(what: impl Into<String>, value: Option<f64>, limit: f64) -> Target {
        Target::new(what, value, ">=", limit)
    }
    fn at_most(what: impl Into<String>, value: Option<f64>, limit: f64) -> Target {
        Target::new(what, value, "<=", limit)
    }
    fn below(what: impl Into<String>, value: Option<f64>, limit: f64) -> Target {
        Target::new(what, value, "<", limit)
    }
}

impl BenchReport {
    pub fn targets(&self) -> Vec<Target> {
        let mut out = self.crowd_targets();
        let against_pgbench = |run: Option<&Measured>| {
            let run = run?;
            self.ratio_to_ceiling(run, ceiling_of(run.scenario)?)
        };
        out.push(Target::at_least(
            format!("{HOT_LIMIT_1} (median run) / pgbench best, same SQL"),
            against_pgbench(self.median(HOT_LIMIT_1)),
            5.0,
        ));
        out.push(Target::at_least(
            format!("{HOT_NO_LIMIT} / pgbench best, same SQL"),
            against_pgbench(self.find(HOT_NO_LIMIT)),
            5.0,
        ));
        out.push(Target::at_least(
            format!("{HOT_LIMIT_2} / pgbench best, same SQL"),
            against_pgbench(self.find(HOT_LIMIT_2)),
            5.0,
        ));
        out.push(Target::at_least(
            format!("{SPREAD_LIMIT_1} / pgbench best over 100 rows, same SQL"),
            against_pgbench(self.find(SPREAD_LIMIT_1)),
            1.5,
        ));
        out.push(Target::at_most(
            format!("{SELL_OUT}: first and last second of selling differ by, % of the larger"),
            self.find(SELL_OUT).and_then(|r| r.shape).and_then(|shape| {
                let larger = shape.first_second.max(shape.last_second) as f64;
                (larger > 0.0)
                    .then(|| 100.0 * shape.first_second.abs_diff(shape.last_second) as f64 / larger)
            }),
            10.0,
        ));
        out.push(Target::below(
            format!("{HOT_256}: p99 ms"),
            self.find(HOT_256).map(|r| r.latency.p99_ms),
            250.0,
        ));
        out
    }

    /// The crowd's cheap answers, held where they were before #38.
    fn crowd_targets(&self) -> Vec<Target> {
        let mut out = Vec::new();
        let ratio_to_healthz =
            |scenario: &'static str| self.find(scenario)?.ratio_to_healthz_beside();
        out.push(Target::at_least(
            "sold-out answers / `/healthz` beside",
            ratio_to_healthz(SOLD_OUT),
            0.25,
        ));
        out.push(Target::at_most(
            "Postgres transactions per 1,000 sold-out answers",
            self.find(SOLD_OUT)
                .map(|r| 1000.0 * r.per_answer(r.pg_transactions as f64)),
            1.0,
        ));
        for page in [LIST_ANON, LIST_SIGNED, PRODUCT_ANON, PRODUCT_SIGNED] {
            out.push(Target::at_least(
                format!("{page} / `/healthz` beside"),
                ratio_to_healthz(page),
                0.25,
            ));
        }
        out.push(Target::at_least(
            format!("{QUEUE_STATUS} / `/healthz` beside"),
            ratio_to_healthz(QUEUE_STATUS),
            0.25,
        ));
        out.push(Target::at_most(
            "Postgres transactions per 1,000 status polls",
            self.find(QUEUE_STATUS)
                .map(|r| 1000.0 * r.per_answer(r.pg_transactions as f64)),
            1.0,
        ));
        out.push(Target::at_least(
            "waiting-room joins: places committed per second",
            self.find(JOINS).map(Measured::places_per_second),
            5000.0,
        ));
        for first in &self.first_passes {
            out.push(Target::below(
                format!(
                    "waiting room, {} waiting: start to first pass, ms",
                    first.waiters
                ),
                first.ms,
                1000.0,
            ));
        }
        out
    }
}
