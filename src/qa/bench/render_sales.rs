//! The report's sales and ceilings: each purchase scenario against pgbench
//! on the same SQL, its first and last second, and the shop's batches
//! against the ceiling of its own batch statement.

use std::fmt::Write as _;

use super::sale_script::mix_described;
use super::*;

fn figure(value: Option<f64>, digits: usize) -> String {
    value
        .map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "–".into())
}

fn tps(point: &Ceiling) -> String {
    match (point.tps, &point.error) {
        (Some(tps), _) => format!("{tps:.0}"),
        (None, Some(error)) => format!(
            "failed: {}",
            error.lines().last().unwrap_or("").replace('|', "/")
        ),
        _ => "–".into(),
    }
}

/// A sale's orders per second while it sold: over the whole run, or for
/// the sell-out, from its first order to its last.
fn selling_rate(run: &Measured) -> f64 {
    match run.shape {
        Some(shape) if run.scenario == SELL_OUT && shape.selling_seconds > 0.0 => {
            run.orders as f64 / shape.selling_seconds
        }
        _ => run.orders_per_second(),
    }
}

pub(super) fn render_sales(report: &BenchReport) -> String {
    let mut out = String::new();
    let sales: Vec<&Measured> = report
        .runs
        .iter()
        .filter(|r| ceiling_of(r.scenario).is_some())
        .collect();
    if !sales.is_empty() {
        let _ = write!(
            out,
            "\n## Sales against pgbench\n\n\
             Every sale but the 256-connection one has the crowd mixed in: {}, all signed in \
             (the buys as the scenario's buyers, the rest as the {} rotating customers). The \
             crowd's answers (409 for the sold-out buys, 200 for the pages) are not counted as \
             purchases. A limited sale's buyers are customers new to its product (every sale \
             sells products made for it), each buying once (limit 1) or twice (limit 2); orders \
             are counted in the database. The first and last second are the orders of the \
             first second from the run's first order, and of the last second up to its last \
             order; wrk's threads send their first request only once every one of them has loaded its buyers \
             (else the first would sell alone while the others load), and the whole-stock sale \
             has a fifth more customers than units, so it sells out with new buyers still \
             coming. Each sale starts on a database vacuumed and analyzed after the runs \
             before it. `largest transaction` is the most orders that shared one transaction's \
             `now()`. The ratio divides by pgbench's best on the same SQL, one purchase per \
             transaction (see *The ceilings*).\n\n\
             | scenario | buyers | orders/s, database | first second | last second | buyers per batch (mean) | largest transaction | batch transaction ms (mean) | lock wait ms (mean) | crowd answers/s | p99 ms | cores busy / shop | pgbench best, same SQL | ratio |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n",
            mix_described(),
            report
                .shop
                .iter()
                .find(|(k, _)| k.starts_with("customers a sale"))
                .map_or("", |(_, v)| v.as_str()),
        );
        for run in sales {
            let key = ceiling_of(run.scenario).unwrap_or_default();
            let ceiling = report.ceiling(key).and_then(Sweep::best_buyers_per_second);
            let shape = run.shape.unwrap_or_default();
            let _ = writeln!(
                out,
                "| {}{} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {:.0} | {:.1} | {:.2} / {:.2} | {} | {} |",
                run.scenario,
                if run.note.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", run.note)
                },
                run.customers,
                selling_rate(run),
                shape.first_second,
                shape.last_second,
                figure(run.batch_mean, 1),
                shape.largest_transaction,
                figure(run.batch_tx_ms, 2),
                figure(run.lock_wait_ms, 2),
                run.crowd_per_second,
                run.latency.p99_ms,
                run.cpu.machine_busy_cores,
                run.cpu.shop_cores,
                figure(ceiling, 0),
                figure(ceiling.map(|c| selling_rate(run) / c), 2),
            );
        }
    }
    out.push_str(&render_ceilings(report));
    out
}

fn render_ceilings(report: &BenchReport) -> String {
    let mut out = String::new();
    if report.ceilings.is_empty() {
        return out;
    }
    out.push_str(
        "\n## The ceilings\n\n\
         **One purchase per transaction** is the shop's purchase SQL for a lone buyer: lock the \
         product row (`SELECT … FOR UPDATE`), read the buyer's `holdings` row (with a limit, as the shop does), insert the order, \
         its item and the stock's ledger row, update the stock, upsert the buyer's `holdings` \
         row, commit. (It writes no idempotency key, which the shop does: that favours pgbench.) \
         **The batch statement** is the shop's own batch transaction (`checkout::sell`): the row \
         locked, every buyer's holdings read in one statement, then `WRITE_SALES` of \
         `checkout::order_rows` (every order, item, ledger row, idempotency key and holdings row, \
         and the stock under a fencing token, in one statement), commit; its arrays are made \
         by `generate_series` instead of bound. Its figures are buyers per second (transactions \
         times buyers per transaction).\n\n\
         **Distinct customers, honestly:** with a limit, client `c` of `C` buys on its `n`th \
         transaction as customer `first + c + C·n` (or, for limit 2, `first + c + C·⌊n/2⌋`, so \
         each buys twice; a batch takes the next run of customers), from pgbench's own \
         variables: no two clients ever share a customer, no customer comes back beyond its \
         limit, and every holdings row is a new one (limit 1) or grows once (limit 2), as in \
         the shop's runs. Each sweep point buys from products made for it. A limit is also \
         written as the holdings row's `cap`, checked by the table. Without a limit, customers \
         are drawn at random from as many as the shop's rotating buyers.\n\n",
    );
    for sweep in &report.ceilings {
        let _ = write!(
            out,
            "**{}** ({} buyer{} per transaction)\n\n| clients | tps | buyers/s | avg ms |\n|---:|---:|---:|---:|\n",
            sweep.key,
            sweep.buyers_per_transaction,
            if sweep.buyers_per_transaction == 1 { "" } else { "s" }
        );
        for point in &sweep.points {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} |",
                point.clients,
                tps(point),
                figure(
                    point.tps.map(|t| t * sweep.buyers_per_transaction as f64),
                    0
                ),
                point.latency_ms
            );
        }
        if let Some(best) = best(&sweep.points) {
            let _ = writeln!(
                out,
                "\nBest: **{} buyers/s** at {} clients.\n",
                figure(sweep.best_buyers_per_second(), 0),
                best.clients
            );
        }
    }
    if let Some(headline) = report.median(HOT_LIMIT_1) {
        let _ = writeln!(
            out,
            "The shop's largest purchase transaction in the headline runs: **{}** buyers \
             (`COMBINE_MAX` buyers of one product per batch; a transaction may also hold other \
             products' batches). The headline's median run, {:.0} orders/s, against the batch \
             statement's ceiling:\n",
            report.largest_batch.map_or("–".into(), |b| b.to_string()),
            headline.orders_per_second()
        );
        out.push_str("| ceiling | best buyers/s | shop / ceiling |\n|---|---:|---:|\n");
        for key in [PG_HOT_LIMIT_1, PG_BATCH_32, PG_BATCH_LARGEST] {
            if let Some(sweep) = report.ceiling(key) {
                let _ = writeln!(
                    out,
                    "| {key} | {} | {} |",
                    figure(sweep.best_buyers_per_second(), 0),
                    figure(report.ratio_to_ceiling(headline, key), 2)
                );
            }
        }
    }
    out
}
