//! The drop's section of the benchmark report: one table for the shop
//! owner's figures, the database's checks, and how they were measured.

use std::fmt::Write as _;

use super::{DirectRun, DropReport, QueuedRun};
use crate::domain::grouped_thousands;
use crate::qa::Latency;

fn thousands(n: impl Into<f64>) -> String {
    grouped_thousands(n.into().round() as i64)
}

fn ms(value: Option<f64>) -> String {
    value.map_or("–".into(), |v| format!("{} ms", thousands(v)))
}

fn p50_p99(latency: &Latency) -> String {
    format!(
        "{} / {} ms",
        thousands(latency.p50_ms),
        thousands(latency.p99_ms)
    )
}

fn statuses(counts: &[(u16, u64)]) -> String {
    if counts.is_empty() {
        return "–".into();
    }
    counts
        .iter()
        .map(|(status, n)| {
            let status = if *status == 0 {
                "no answer".to_string()
            } else {
                status.to_string()
            };
            format!("{status}: {}", thousands(*n as f64))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn yes(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**no**"
    }
}

pub fn render_drop(report: &DropReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## A whole drop: {} customers, {} units, limit 1\n",
        thousands(report.customers as f64),
        thousands(report.units)
    );
    let direct = report.without_waiting_room.as_ref();
    let queued = report.through_waiting_room.as_ref();
    let cell = |f: &dyn Fn(&DirectRun) -> String, g: &dyn Fn(&QueuedRun) -> String| {
        (direct.map_or("–".into(), f), queued.map_or("–".into(), g))
    };
    let rows: Vec<(&str, (String, String))> = vec![
        (
            "opening (start) to the last unit sold (orders' `created_at`)",
            cell(&|d| ms(d.checked.last_order_ms), &|q| {
                ms(q.checked.last_order_ms)
            }),
        ),
        (
            "opening to the first unit sold",
            cell(&|d| ms(d.checked.first_order_ms), &|q| {
                ms(q.checked.first_order_ms)
            }),
        ),
        (
            "a buyer's wait, p50 / p99: the opening to the order's answer",
            cell(&|d| p50_p99(&d.wait_opening_buyers), &|q| {
                p50_p99(&q.buyer_wait)
            }),
        ),
        (
            "the same from Postgres: the opening to the order's `created_at`, p50 / p99",
            cell(
                &|d| {
                    format!(
                        "{} / {}",
                        ms(d.checked.order_p50_ms),
                        ms(d.checked.order_p99_ms)
                    )
                },
                &|q| {
                    format!(
                        "{} / {}",
                        ms(q.checked.order_p50_ms),
                        ms(q.checked.order_p99_ms)
                    )
                },
            ),
        ),
        (
            "a buyer's buy request, on the wire to its answer, p50 / p99",
            cell(&|d| p50_p99(&d.wait_sent_buyers), &|q| {
                p50_p99(&q.buy_latency)
            }),
        ),
        (
            "every customer's answer, p50 / p99 (from the opening / on the wire)",
            cell(
                &|d| {
                    format!(
                        "{} ; {}",
                        p50_p99(&d.wait_opening_all),
                        p50_p99(&d.wait_sent_all)
                    )
                },
                &|_| "– (the others keep waiting)".into(),
            ),
        ),
        (
            "answers to the buys",
            cell(&|d| statuses(&d.answers), &|q| statuses(&q.buys)),
        ),
        (
            "crowd's rate into the shop",
            cell(
                &|d| {
                    format!(
                        "{} buys/s ({} buys on the wire within {:.2} s)",
                        thousands(d.send_rate),
                        thousands(d.customers as f64),
                        d.send_seconds
                    )
                },
                &|q| {
                    format!(
                        "{} polls/s answered (peak second {}), {} pages",
                        thousands(q.polls_per_second),
                        thousands(q.peak_polls_per_second),
                        thousands(q.pages as f64)
                    )
                },
            ),
        ),
        (
            "Postgres commits per answer (from the opening)",
            cell(
                &|d| {
                    format!(
                        "{:.4} ({} commits / {} answers)",
                        d.commits_per_answer(),
                        thousands(d.transactions.commits as f64),
                        thousands(d.answered() as f64)
                    )
                },
                &|q| {
                    format!(
                        "{:.4} ({} commits / {} answers)",
                        q.drop_commits_per_answer(),
                        thousands(q.drop_transactions.commits as f64),
                        thousands(q.drop_answers as f64)
                    )
                },
            ),
        ),
        (
            "cores busy over the drop: machine / shop / driver (of 2)",
            cell(
                &|d| {
                    format!(
                        "{:.2} / {:.2} / {:.2}",
                        d.cpu.machine_busy_cores, d.cpu.shop_cores, d.driver_cores
                    )
                },
                &|q| {
                    format!(
                        "{:.2} / {:.2} / {:.2}",
                        q.cpu.machine_busy_cores, q.cpu.shop_cores, q.driver_cores
                    )
                },
            ),
        ),
        (
            "checked in Postgres: orders, units, stock left, customers with two",
            cell(
                &|d| {
                    format!(
                        "{}, {}, {}, {}: {}",
                        d.checked.orders,
                        d.checked.units_sold,
                        d.checked.stock_left,
                        d.checked.customers_with_two,
                        yes(d.checked.sold_out_exactly(d.units))
                    )
                },
                &|q| {
                    format!(
                        "{}, {}, {}, {}: {}",
                        q.checked.orders,
                        q.checked.units_sold,
                        q.checked.stock_left,
                        q.checked.customers_with_two,
                        yes(q.checked.sold_out_exactly(q.units))
                    )
                },
            ),
        ),
        (
            "passes issued / used / lapsed; orders from their buyer's pass",
            cell(&|_| "–".into(), &|q| {
                format!(
                    "{} / {} / {}; {}: {}",
                    q.checked.passes_issued,
                    q.checked.passes_used,
                    q.checked.passes_lapsed,
                    q.checked.orders_from_a_pass,
                    yes(q.checked.sold_through_passes(q.units))
                )
            }),
        ),
    ];
    out.push_str("| | without the waiting room | through the waiting room |\n|---|---|---|\n");
    for (what, (without, through)) in rows {
        let _ = writeln!(out, "| {what} | {without} | {through} |");
    }
    if let Some(q) = queued {
        let _ = writeln!(
            out,
            "\nThe waiting room's joins, before the start: {} joins in {:.1} s ({} /s; answers {}; POST p50 / p99 {}), \
             each followed by its waiting page ({} pages); the last join was answered {:.1} s before the start. \
             {} places in Postgres, {} of them late. Before the start the pre-queue's pages polled {} times. \
             The first pass was issued {} after the start. Over the whole run (joins, pre-queue, drop) Postgres \
             committed {:.4} transactions per answer ({} / {}).{}",
            thousands(q.customers as f64),
            q.joins_seconds,
            thousands(q.customers as f64 / q.joins_seconds.max(1e-9)),
            statuses(&q.joins),
            p50_p99(&q.join_latency),
            thousands(q.join_pages as f64),
            q.joins_done_before_start_ms / 1000.0,
            thousands(q.checked.places as f64),
            thousands(q.checked.late_places as f64),
            thousands(q.prequeue_polls as f64),
            ms(q.checked.first_pass_ms),
            q.run_commits_per_answer(),
            thousands(q.run_transactions.commits as f64),
            thousands(q.run_answers as f64),
            if q.sold_out_in_time {
                String::new()
            } else {
                format!(
                    " **The drop did not sell out within {:.0} s.**",
                    q.drop_ms / 1000.0
                )
            }
        );
    }
    let d = &report.driver;
    let _ = writeln!(
        out,
        "\n**Method.** The shop runs as its own release process on a scratch database and a Redis key prefix of \
         its own; {} customers are seeded and signed in (real sessions). The crowd is a tokio driver (its own HTTP/1.1 over \
         tokio sockets) in the benchmark's process, on the same 2 cores as the shop, Postgres and Redis; it keeps at most {} \
         requests on the wire over as many keep-alive connections, and every request is timed on its own. \
         Its own speed, measured first against `/healthz` (no database, no Redis) through the same connections: \
         **{} answers/s** (p50 {:.1} ms, {} requests; Debian's `wrk`, its own loop on 2 threads, against the \
         same shop and connections just after: {} answers/s). \
         *Without the waiting room* every customer presses Buy (`POST /products/{{id}}/buy`, quantity 1, an \
         idempotency key of their own) at the opening, all at once: the driver puts them on the wire as fast \
         as connections free up, and a buyer's wait from the opening includes the wait for a connection. \
         *Through the waiting room* the sale's room is open and its start a little later; every customer joins \
         (`POST /products/{{id}}/queue`) and loads the waiting page it is sent to, and from then on does what \
         the page's script (`templates/static/app.js`) does: polls `queue.json` every 5 s in the pre-queue, \
         150 ms past the start, every 700 ms while drawing and every 2 s while waiting, fetches the page again \
         when the phase (or, while waiting, the availability) changes, and on the page with the pass presses \
         Buy at once with it (no think time; the order page it is sent to is not fetched). The run ends when \
         the last unit's buy is answered; the customers still waiting stop there. Times of sale are the orders' \
         `created_at` (the start of the order's transaction) on the database's clock less the sale's start. \
         Postgres commits are the change of `xact_commit` of the shop's database (rollbacks: {} and {}); \
         for the waiting room's drop, the counter is read at the start, while the pre-queue is polling, so up \
         to a second of the pre-queue's work may count as the drop's. They include the shop's background jobs.",
        thousands(report.customers as f64),
        report.connections,
        thousands(d.per_second),
        d.latency.p50_ms,
        thousands(d.requests as f64),
        d.wrk_per_second.map_or("–".into(), thousands),
        direct.map_or("–".into(), |d| d.transactions.rollbacks.to_string()),
        queued.map_or("–".into(), |q| q.drop_transactions.rollbacks.to_string()),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(thousands(50_000.0), "50,000");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(-1234.0), "-1,234");
        assert_eq!(thousands(1_000_000), "1,000,000");
    }
}
