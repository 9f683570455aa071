//! `docs/benchmarks.md` from a run's figures.

use std::fmt::Write as _;

use super::*;

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
