//! The ceiling: `pgbench` running the purchase transaction's SQL one
//! purchase at a time, on one hot row or on a random one of many rows,
//! swept over client counts so the ceiling is its best, not whatever it
//! does at the shop's concurrency.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

/// The purchase transaction of `services::checkout`, as SQL. `:pid` is
/// drawn from `pmin..=pmax`, so one script serves the hot row (pmin = pmax)
/// and the spread.
pub(super) const PGBENCH_SCRIPT: &str = r"\set cust random(:cmin, :cmax)
\set pid random(:pmin, :pmax)
BEGIN;
SELECT stock, per_customer_limit FROM products WHERE id = :pid FOR UPDATE;
INSERT INTO orders (customer_id, status, total_cents, payment_deadline) VALUES (:cust, 'awaiting_payment', 100, now() + interval '10 minutes') RETURNING id AS order_id \gset
INSERT INTO order_items (order_id, product_id, quantity, unit_price_cents) VALUES (:order_id, :pid, 1, 100);
UPDATE products SET stock = stock - 1, updated_at = now() WHERE id = :pid RETURNING stock AS left \gset
INSERT INTO stock_history (product_id, order_id, delta, stock_after, reason, note) VALUES (:pid, :order_id, -1, :left, 'purchase', '');
COMMIT;
";

/// Inclusive id ranges of the rows pgbench buys from and the customers it buys as.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rows {
    pub products: (i64, i64),
    pub customers: (i64, i64),
}

/// One pgbench run: transactions per second and the average latency in ms,
/// or why it failed (a shared server can refuse 64 more connections).
pub(super) fn pgbench(
    db_url: &str,
    script: &Path,
    rows: Rows,
    clients: usize,
    seconds: f64,
) -> anyhow::Result<(f64, f64)> {
    let define = |name: &str, value: i64| format!("{name}={value}");
    let output = Command::new("pgbench")
        .args(["-n", "-f"])
        .arg(script)
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
        ])
        .args(["-T", &(seconds.round() as u64).max(1).to_string()])
        .args(["-D", &define("pmin", rows.products.0)])
        .args(["-D", &define("pmax", rows.products.1)])
        .args(["-D", &define("cmin", rows.customers.0)])
        .args(["-D", &define("cmax", rows.customers.1)])
        .arg(db_url)
        .output()
        .context("running pgbench (Debian: apt-get install postgresql-contrib)")?;
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    if !output.status.success() {
        bail!(
            "pgbench failed: {}{}",
            text.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let number_after = |label: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.starts_with(label))?;
        line.split('=')
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let tps = number_after("tps").context("no tps in pgbench output")?;
    let latency = number_after("latency average").unwrap_or(0.0);
    Ok((tps, latency))
}
