//! The ceilings: `pgbench` running the purchase transaction's SQL, swept
//! over client counts so a ceiling is its best, not whatever it does at the
//! shop's concurrency. Two shapes: one purchase per transaction (what a
//! shop without batching would send), and one batch of buyers per
//! transaction (the shop's own batch statement, for its batch sizes).
//!
//! Buyers are drawn as the shop's scenarios draw them: with a limit, every
//! transaction buys as customers who have not bought yet (`Buyers::Distinct`:
//! client `c` of `C` buys as customer `cmin + c + C*n` on its `n`th turn, so
//! no two clients ever share one and none comes back), each buying `per`
//! times; without one, a random customer of a small rotating set.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

/// Who the scripts buy as.
#[derive(Debug, Clone, Copy)]
pub(super) enum Buyers {
    /// Never seen before: each customer buys `per` units, one per turn.
    Distinct { per: i64 },
    /// Random customers of `cmin..=cmax`, again and again (no limit).
    Rotating,
}

/// The product row lock, as the shop takes it before deciding a purchase.
const LOCK: &str = "BEGIN;
SELECT stock, per_customer_limit FROM products WHERE id = :pid FOR UPDATE;
";
/// The buyer's holdings, which the shop reads (`:cust` the buyer) only for
/// a product with a limit.
const READ_HOLDINGS: &str = "SELECT customer_id, units FROM holdings WHERE product_id = :pid AND units > 0 AND customer_id = ANY(ARRAY[:cust]::bigint[]);
";

/// One purchase per transaction, as `services::checkout` sells to a lone
/// buyer: lock the row, read the buyer's holdings (with a limit), insert the order, its
/// item, the stock's ledger row, update the stock, upsert the holdings.
fn purchase_script(buyers: Buyers) -> String {
    format!(
        "{}\\set pid random(:pmin, :pmax)
{LOCK}{}INSERT INTO orders (customer_id, status, total_cents, payment_deadline) VALUES (:cust, 'awaiting_payment', 100, now() + interval '10 minutes') RETURNING id AS order_id \\gset
INSERT INTO order_items (order_id, product_id, quantity, unit_price_cents) VALUES (:order_id, :pid, 1, 100);
UPDATE products SET stock = stock - 1, updated_at = now() WHERE id = :pid RETURNING stock AS left \\gset
INSERT INTO stock_history (product_id, order_id, delta, stock_after, reason, note) VALUES (:pid, :order_id, -1, :left, 'purchase', '');
INSERT INTO holdings (product_id, customer_id, units, cap) VALUES (:pid, :cust, 1, NULLIF(:cap::int, 0)) ON CONFLICT (product_id, customer_id) DO UPDATE SET units = holdings.units + EXCLUDED.units, cap = EXCLUDED.cap;
COMMIT;
",
        who(buyers, 1),
        match buyers {
            Buyers::Distinct { .. } => READ_HOLDINGS,
            Buyers::Rotating => "",
        }
    )
}

/// `:cust`, the buyer (the first of `batch` for a batch), and the client's
/// turn counter moved on.
fn who(buyers: Buyers, batch: usize) -> String {
    match buyers {
        Buyers::Distinct { per } => format!(
            "\\set cust :cmin + {batch} * (:client_id + :nclients * (:turn / {per}))\n\\set turn :turn + 1\n"
        ),
        Buyers::Rotating => "\\set cust random(:cmin, :cmax)\n".into(),
    }
}

/// One batch of `batch` distinct buyers of one product per transaction, as
/// `services::checkout::sell` serves a batch: the row locked, every buyer's
/// holdings read in one statement, then every order, item, ledger row,
/// idempotency key, holdings row and the stock (under a fencing token) in
/// one statement: `WRITE_SALES` of `checkout::order_rows`, its arrays
/// made here by `generate_series` instead of bound by the shop.
pub(super) fn batch_script(batch: usize) -> String {
    let last = batch - 1;
    format!(
        "{who}\\set pid :pmin
BEGIN;
SELECT stock, per_customer_limit, fence FROM products WHERE id = :pid FOR UPDATE;
SELECT customer_id, units FROM holdings WHERE product_id = :pid AND units > 0 AND customer_id = ANY(ARRAY(SELECT generate_series(:cust::bigint, :cust + {last})));
WITH buyer AS MATERIALIZED (
    SELECT nextval('orders_id_seq') AS order_id, b.*
    FROM (SELECT :pid::bigint AS product_id, c AS customer_id, 1 AS quantity, 100::bigint AS unit_price_cents,
            100::bigint AS total_cents, now() + interval '10 minutes' AS payment_deadline, NULL::text AS gate_key,
            0 AS stock_after, md5(random()::text) AS answer_key, 'bench' AS answer_fingerprint, NULL::int AS pass,
            row_number() OVER () AS arrival
          FROM generate_series(:cust::bigint, :cust + {last}) AS c) AS b
), held AS (
    INSERT INTO holdings (product_id, customer_id, units, cap)
    SELECT product_id, customer_id, sum(quantity), NULLIF(:cap::int, 0) FROM buyer
    GROUP BY product_id, customer_id ORDER BY product_id, customer_id
    ON CONFLICT (product_id, customer_id) DO UPDATE
        SET units = holdings.units + EXCLUDED.units, cap = EXCLUDED.cap
), new_orders AS (
    INSERT INTO orders (id, customer_id, status, total_cents, payment_deadline, gate_key)
    SELECT order_id, customer_id, 'awaiting_payment', total_cents, payment_deadline, gate_key
    FROM buyer ORDER BY arrival
), items AS (
    INSERT INTO order_items (order_id, product_id, quantity, unit_price_cents)
    SELECT order_id, product_id, quantity, unit_price_cents FROM buyer ORDER BY arrival
), ledger AS (
    INSERT INTO stock_history (product_id, order_id, delta, stock_after, reason, note)
    SELECT product_id, order_id, -quantity, stock_after, 'purchase', '' FROM buyer ORDER BY arrival
), stock AS (
    UPDATE products p SET stock = p.stock - {batch}, fence = p.fence + 1, updated_at = now()
    WHERE p.id = :pid
    RETURNING p.id, p.stock
), recorded AS (
    INSERT INTO idempotency_keys (customer_id, key, fingerprint, order_id)
    SELECT customer_id, answer_key, answer_fingerprint, order_id FROM buyer ORDER BY arrival
    ON CONFLICT DO NOTHING
    RETURNING order_id
)
SELECT buyer.order_id, buyer.product_id, (SELECT stock.stock FROM stock WHERE stock.id = buyer.product_id) AS stock,
    EXISTS (SELECT 1 FROM recorded WHERE recorded.order_id = buyer.order_id) AS named
FROM buyer ORDER BY arrival;
COMMIT;
",
        who = who(Buyers::Distinct { per: 1 }, batch)
    )
}

/// Writes the one-purchase script for `buyers` under `dir`.
pub(super) fn write_purchase_script(
    dir: &Path,
    buyers: Buyers,
) -> anyhow::Result<std::path::PathBuf> {
    let name = match buyers {
        Buyers::Distinct { per } => format!("purchase-distinct-{per}.pgbench.sql"),
        Buyers::Rotating => "purchase-rotating.pgbench.sql".into(),
    };
    let path = dir.join(name);
    std::fs::write(&path, purchase_script(buyers))?;
    Ok(path)
}

/// Inclusive id ranges of the rows pgbench buys from and the customers it
/// buys as, and the per-customer limit the holdings rows carry (None: no limit).
#[derive(Debug, Clone, Copy)]
pub(super) struct Rows {
    pub products: (i64, i64),
    pub customers: (i64, i64),
    pub cap: Option<i32>,
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
    let define = |name: &str, value: String| format!("{name}={value}");
    let output = Command::new("pgbench")
        // Prepared statements: pgbench's fastest protocol, and what the
        // shop's own statements are.
        .args(["-n", "-M", "prepared", "-f"])
        .arg(script)
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
        ])
        .args(["-T", &(seconds.round() as u64).max(1).to_string()])
        .args(["-D", &define("pmin", rows.products.0.to_string())])
        .args(["-D", &define("pmax", rows.products.1.to_string())])
        .args(["-D", &define("cmin", rows.customers.0.to_string())])
        .args(["-D", &define("cmax", rows.customers.1.to_string())])
        .args(["-D", &define("nclients", clients.to_string())])
        .args(["-D", &define("turn", "0".into())])
        .args([
            "-D",
            // 0 for none: with prepared statements a variable is a bound
            // value, and the scripts turn 0 into NULL (a limit is >= 1).
            &define("cap", rows.cap.unwrap_or(0).to_string()),
        ])
        .arg(db_url)
        .output()
        .context("running pgbench (Debian: apt-get install postgresql-contrib)")?;
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let errors = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() || errors.contains("ERROR") {
        bail!("pgbench failed: {}{}", text.trim(), errors.trim());
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
