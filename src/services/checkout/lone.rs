//! A purchase served on its own: a cart of several products, or any
//! purchase with combining off. Takes every product's lock (ascending ids),
//! re-reads each row `FOR UPDATE`, checks, and writes the order, its items,
//! the ledger rows and the new stock in one transaction.

use chrono::{DateTime, Utc};

use super::order_rows::{write_order, KeyRow};
use super::outcome::{Line, PurchaseOutcome};
use super::rules::{check_buyer, holders_of, lock_product, pass_refusal, passes_of};
use crate::db::fence::change_stock;
use crate::db::holdings::Holder;
use crate::db::{self, PgConn};
use crate::domain::{CustomerId, Product, ProductId, Quantity};
use crate::error::AppError;
use crate::gate::Settled;
use crate::lock::Lease;
use crate::metrics;
use crate::services::stock_gate::settle;
use crate::services::Shop;

/// Buys `lines` (sorted by product, each product once) under their locks.
/// `pass`: the waiting-room pass a one-product purchase presents.
pub(super) async fn buy_alone(
    shop: &Shop,
    customer: CustomerId,
    lines: Vec<Line>,
    payment_deadline: DateTime<Utc>,
    gate_key: Option<String>,
    answer_key: Option<KeyRow>,
    pass: Option<i32>,
) -> Result<PurchaseOutcome, AppError> {
    let products: Vec<ProductId> = lines.iter().map(|l| l.product).collect();
    let pool = shop.pool.clone();
    let locked_shop = shop.clone();
    shop.locks
        .with_locks(products, move |lease| async move {
            let started = std::time::Instant::now();
            let admitted: Vec<(ProductId, Quantity)> =
                lines.iter().map(|l| (l.product, l.quantity)).collect();
            let admission = gate_key.clone();
            let outcome = db::run(&pool, move |conn| {
                db::transaction(conn, |conn| {
                    let keys = OrderKeys {
                        gate_key: gate_key.as_deref(),
                        answer_key: answer_key.as_ref(),
                        pass,
                    };
                    let outcome = purchase_in_transaction(
                        conn,
                        &lease,
                        customer,
                        &lines,
                        payment_deadline,
                        keys,
                    )?;
                    lease.ensure_valid()?;
                    Ok(outcome)
                })
            })
            .await;
            metrics::transaction_time("purchase", started.elapsed());
            if let (Ok(PurchaseOutcome::Purchased(_)), Some(key)) = (&outcome, &admission) {
                // Before the locks go, so a resync never counts these twice.
                for (product, quantity) in admitted {
                    let settled = Settled {
                        admission: key,
                        customer,
                        quantity,
                    };
                    settle(&locked_shop, product, &[settled]).await;
                }
            }
            outcome
        })
        .await
}

/// What an order is written under: the gate's admission, the request's
/// idempotency key, and the waiting-room pass it presents (one product only).
struct OrderKeys<'a> {
    gate_key: Option<&'a str>,
    answer_key: Option<&'a KeyRow>,
    pass: Option<i32>,
}

/// Everything between lock and unlock for an order of several products.
/// Returning a refusal commits nothing (no row was written before the checks passed).
fn purchase_in_transaction(
    conn: &mut PgConn,
    lease: &Lease,
    customer: CustomerId,
    lines: &[Line],
    payment_deadline: DateTime<Utc>,
    keys: OrderKeys<'_>,
) -> Result<PurchaseOutcome, AppError> {
    // A pass is one customer's for one product: a cart presents none.
    let pass = keys.pass.filter(|_| lines.len() == 1);
    let now = Utc::now();
    let mut checked: Vec<(Product, Quantity)> = Vec::with_capacity(lines.len());
    for line in lines {
        let product = lock_product(conn, line.product)?;
        let holder = match product.per_customer_limit {
            Some(_) => holders_of(conn, &[customer], line.product)?
                .get(&customer)
                .copied()
                .unwrap_or_default(),
            None => Holder::default(),
        };
        let held = passes_of(conn, &product, &[customer])?;
        pass_refusal(&product, line.quantity, pass, held.get(&customer))?;
        if let Err(refusal) = check_buyer(&product, line.quantity, holder, now) {
            return Ok(PurchaseOutcome::Refused(refusal));
        }
        checked.push((product, line.quantity));
    }
    let mut written = Vec::with_capacity(checked.len());
    for (product, quantity) in &checked {
        let stock_after = change_stock(conn, lease, product.product_id(), -quantity.get())?;
        written.push((product, *quantity, stock_after));
    }
    let order = write_order(
        conn,
        customer,
        &written,
        payment_deadline,
        keys.gate_key,
        keys.answer_key,
        pass,
    )?;
    Ok(PurchaseOutcome::Purchased(order))
}
