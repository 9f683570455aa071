//! Buying: lock the products, re-read them `FOR UPDATE`, check, and write the
//! order, its items, the ledger rows and the new stock in one transaction.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;

use super::combining::{buy_in_batch, BatchBuyer};
use super::Shop;
use crate::db::fence::change_stock;
use crate::db::models::{Product, SaleState};
use crate::db::schema::{order_items, orders, products};
use crate::db::{self, PgConn};
use crate::domain::{
    CustomerId, IdempotencyKey, Money, OrderId, OrderStatus, ProductId, Quantity, StockReason,
};
use crate::error::AppError;
use crate::gate::{Admission, StockGate};
use crate::lock::Lease;
use crate::metrics;
use crate::services::stock_gate::{give_back_all, seed_if_absent, settle};

/// One product and how many units of it, as the buyer asked.
#[derive(Debug, Clone, Copy)]
pub struct Line {
    pub product: ProductId,
    pub quantity: Quantity,
}

/// What a purchase attempt came to. Refusals are ordinary outcomes, not errors;
/// `into_result` maps them to the shop's one error type (and so to HTTP) once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurchaseOutcome {
    Purchased(OrderId),
    SoldOut {
        product: String,
        available: i32,
    },
    LimitReached {
        product: String,
        limit: i32,
        already: i64,
    },
    SaleNotOpen {
        product: String,
        state: SaleState,
    },
    Busy,
    Unavailable(String),
}

impl PurchaseOutcome {
    pub fn into_result(self) -> Result<OrderId, AppError> {
        match self {
            PurchaseOutcome::Purchased(order) => Ok(order),
            PurchaseOutcome::SoldOut { product, available: 0 } => Err(AppError::conflict(
                "Sold out",
                format!("{product} is sold out: every unit has been bought. Nothing was reserved or charged."),
            )),
            PurchaseOutcome::SoldOut { product, available } => Err(AppError::conflict(
                "Not enough left",
                format!("Only {available} of {product} left — choose a smaller quantity. Nothing was reserved or charged."),
            )),
            PurchaseOutcome::LimitReached { product, limit, already } => Err(AppError::conflict(
                "Purchase limit reached",
                format!("{product} is limited to {limit} per customer, and your orders already hold {already}. Nothing was reserved or charged."),
            )),
            PurchaseOutcome::SaleNotOpen { product, state } => Err(AppError::conflict(
                "Sale not open",
                match state {
                    SaleState::Upcoming => format!("The sale of {product} has not started yet. Come back when the countdown ends."),
                    _ => format!("The sale of {product} has ended."),
                },
            )),
            PurchaseOutcome::Busy => Err(AppError::Busy),
            PurchaseOutcome::Unavailable(reason) => Err(AppError::Unavailable(reason)),
        }
    }
}

/// Buys `lines` (one order, all lines or none) for `customer`. The order is
/// named on `answer_key` (an idempotency key this request has claimed) in
/// the order's own transaction, so a replay finds it.
pub async fn purchase(
    shop: &Shop,
    customer: CustomerId,
    mut lines: Vec<Line>,
    answer_key: Option<IdempotencyKey>,
) -> Result<PurchaseOutcome, AppError> {
    // Lock order and row-lock order are both ascending product id.
    lines.sort_by_key(|l| l.product);
    if lines.is_empty() || lines.windows(2).any(|w| w[0].product == w[1].product) {
        return Err(AppError::Invalid(
            "An order needs each product once, with a quantity.".into(),
        ));
    }
    let products: Vec<ProductId> = lines.iter().map(|l| l.product).collect();
    let admission = match &shop.gate {
        Some(gate) => match admit_all(shop, gate, customer, &lines).await? {
            Ok(admission) => Some(admission),
            Err(refusal) => return Ok(refusal),
        },
        None => {
            if let Some(refusal) = refusal_before_locking(shop, &lines).await? {
                return Ok(refusal);
            }
            None
        }
    };
    let gate_key = admission.clone();
    let admitted_products = products.clone();
    let payment_deadline = Utc::now() + shop.settings.payment_timeout;
    let answer_key = answer_key.map(|key| key.as_str().to_string());
    let result = if shop.settings.inject_fault_after_admission {
        Err(AppError::Internal(anyhow::anyhow!(
            "injected fault between admission and the database"
        )))
    } else if let ([line], Some(_)) = (lines.as_slice(), &shop.combiner) {
        let buyer = BatchBuyer {
            customer,
            quantity: line.quantity,
            payment_deadline,
            gate_key,
            answer_key,
        };
        buy_in_batch(shop, line.product, buyer).await
    } else {
        let pool = shop.pool.clone();
        let locked_shop = shop.clone();
        shop.locks
            .with_locks(products, move |lease| async move {
                let started = std::time::Instant::now();
                let admitted: Vec<(ProductId, Quantity)> =
                    lines.iter().map(|l| (l.product, l.quantity)).collect();
                let admission = gate_key.clone();
                let outcome = db::run(&pool, move |conn| {
                    conn.transaction(|conn| {
                        let outcome = purchase_in_transaction(
                            conn,
                            &lease,
                            customer,
                            &lines,
                            payment_deadline,
                            gate_key.as_deref(),
                            answer_key.as_deref(),
                        )?;
                        lease.ensure_valid()?;
                        Ok(outcome)
                    })
                })
                .await;
                metrics::transaction_time("purchase", started.elapsed());
                if let (Ok(PurchaseOutcome::Purchased(_)), Some(key)) = (&outcome, &admission) {
                    // Before the locks go, so a resync never counts these twice.
                    for (product, units) in admitted {
                        settle(&locked_shop, product, &[(key.as_str(), units)]).await;
                    }
                }
                outcome
            })
            .await
    };
    // Whatever kept the order from being written hands the admitted units back.
    if let (Some(gate), Some(admission)) = (&shop.gate, &admission) {
        if !matches!(result, Ok(PurchaseOutcome::Purchased(_))) {
            give_back_all(gate, customer, admission, &admitted_products).await;
        }
    }
    match result {
        Err(AppError::Busy) => Ok(PurchaseOutcome::Busy),
        Err(AppError::Unavailable(reason)) => Ok(PurchaseOutcome::Unavailable(reason)),
        other => other,
    }
}

/// Admits every line at the gate, or none: a refused line hands back the
/// lines admitted before it. Returns the admission key, or the refusal.
async fn admit_all(
    shop: &Shop,
    gate: &StockGate,
    customer: CustomerId,
    lines: &[Line],
) -> Result<Result<String, PurchaseOutcome>, AppError> {
    let key = uuid::Uuid::new_v4().simple().to_string();
    let mut admitted = Vec::with_capacity(lines.len());
    for line in lines {
        let mut answer = gate
            .admit(line.product, customer, line.quantity, &key)
            .await;
        if let Ok(Admission::Unknown) = answer {
            // Created after this instance seeded, or lost with a Redis restart:
            // seed from the database (if still absent) and ask once more.
            seed_if_absent(shop, vec![line.product]).await?;
            answer = gate
                .admit(line.product, customer, line.quantity, &key)
                .await;
        }
        let refusal = match answer {
            Ok(Admission::Admitted | Admission::Repeat) => {
                admitted.push(line.product);
                continue;
            }
            Ok(Admission::SoldOut { available }) => PurchaseOutcome::SoldOut {
                product: "This product".into(),
                available: available as i32,
            },
            // Unknown even after seeding: the product does not exist.
            Ok(Admission::Unknown) => {
                give_back_all(gate, customer, &key, &admitted).await;
                return Err(AppError::NotFound(format!(
                    "There is no product with id {}.",
                    line.product
                )));
            }
            Ok(Admission::LimitReached { held, limit }) => PurchaseOutcome::LimitReached {
                product: "This product".into(),
                limit: limit as i32,
                already: held,
            },
            Ok(Admission::Conflict) => {
                give_back_all(gate, customer, &key, &admitted).await;
                return Err(AppError::Internal(anyhow::anyhow!(
                    "a fresh admission key was already in the gate"
                )));
            }
            Err(error) => {
                give_back_all(gate, customer, &key, &admitted).await;
                return Err(error);
            }
        };
        give_back_all(gate, customer, &key, &admitted).await;
        return Ok(Err(refusal));
    }
    Ok(Ok(key))
}

/// Turns away, without queueing for the lock, a buyer that the locked check
/// would refuse anyway: sold out, not open, unknown product. It can only say
/// no: a yes here is re-decided under the locks, so a stale read never sells.
/// After a sell-out this keeps the lock queue for buyers who can still win.
async fn refusal_before_locking(
    shop: &Shop,
    lines: &[Line],
) -> Result<Option<PurchaseOutcome>, AppError> {
    let ids: Vec<i64> = lines.iter().map(|l| l.product.get()).collect();
    let found: Vec<Product> = db::run(&shop.pool, move |conn| {
        Ok(products::table
            .filter(products::id.eq_any(ids))
            .select(Product::as_select())
            .load(conn)?)
    })
    .await?;
    let now = Utc::now();
    for line in lines {
        let product = found
            .iter()
            .find(|p| p.id == line.product.get())
            .ok_or_else(|| {
                AppError::NotFound(format!("There is no product with id {}.", line.product))
            })?;
        if let Some(refusal) = refusal_for(product, line.quantity, now) {
            return Ok(Some(refusal));
        }
    }
    Ok(None)
}

/// The sale-window and stock rules for one line.
pub(super) fn refusal_for(
    product: &Product,
    quantity: Quantity,
    now: DateTime<Utc>,
) -> Option<PurchaseOutcome> {
    match product.sale_state(now) {
        state @ (SaleState::Upcoming | SaleState::Ended) => Some(PurchaseOutcome::SaleNotOpen {
            product: product.name.clone(),
            state,
        }),
        _ if product.stock < quantity.get() => Some(PurchaseOutcome::SoldOut {
            product: product.name.clone(),
            available: product.stock,
        }),
        _ => None,
    }
}

/// Everything between lock and unlock for an order of several products.
/// Returning a refusal commits nothing (no row was written before the checks passed).
fn purchase_in_transaction(
    conn: &mut PgConn,
    lease: &Lease,
    customer: CustomerId,
    lines: &[Line],
    payment_deadline: DateTime<Utc>,
    gate_key: Option<&str>,
    answer_key: Option<&str>,
) -> Result<PurchaseOutcome, AppError> {
    let now = Utc::now();
    let mut checked: Vec<(Product, Quantity)> = Vec::with_capacity(lines.len());
    for line in lines {
        let product: Product = products::table
            .find(line.product.get())
            .for_update()
            .select(Product::as_select())
            .first(conn)
            .optional()?
            .ok_or_else(|| {
                AppError::NotFound(format!("There is no product with id {}.", line.product))
            })?;
        if let Some(refusal) = refusal_for(&product, line.quantity, now) {
            return Ok(refusal);
        }
        if let Some(limit) = product.per_customer_limit {
            let already = held_by_customers(conn, &[customer], line.product)?
                .get(&customer)
                .copied()
                .unwrap_or(0);
            if already + i64::from(line.quantity.get()) > i64::from(limit) {
                return Ok(PurchaseOutcome::LimitReached {
                    product: product.name,
                    limit,
                    already,
                });
            }
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
        gate_key,
        answer_key,
    )?;
    Ok(PurchaseOutcome::Purchased(order))
}

/// The order, its items and their purchase ledger rows, and the order named
/// on the request's idempotency key, in one statement:
/// this runs once per buyer inside a batch's lock hold, where every round
/// trip to the database is time the next buyers wait.
const WRITE_ORDER: &str = "
WITH new_order AS (
    INSERT INTO orders (customer_id, status, total_cents, payment_deadline, gate_key)
    VALUES ($1, $2, $3, $4, $5)
    RETURNING id
), lines AS (
    SELECT * FROM unnest($6::bigint[], $7::int[], $8::bigint[], $9::int[])
        AS line(product_id, quantity, unit_price_cents, stock_after)
), items AS (
    INSERT INTO order_items (order_id, product_id, quantity, unit_price_cents)
    SELECT new_order.id, line.product_id, line.quantity, line.unit_price_cents
    FROM new_order, lines AS line
), ledger AS (
    INSERT INTO stock_history (product_id, order_id, delta, stock_after, reason, note)
    SELECT line.product_id, new_order.id, -line.quantity, line.stock_after, $10, ''
    FROM new_order, lines AS line
), answered AS (
    UPDATE idempotency_keys SET order_id = new_order.id
    FROM new_order WHERE customer_id = $1 AND key = $11
)
SELECT id FROM new_order";

#[derive(QueryableByName)]
struct Written {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
}

/// A checked order's rows: the order, one item and one purchase ledger row
/// per product (`stock_after` is the product's stock once this order is
/// taken). The stock itself is changed by the caller, once per lock hold.
pub(super) fn write_order(
    conn: &mut PgConn,
    customer: CustomerId,
    lines: &[(&Product, Quantity, i32)],
    payment_deadline: DateTime<Utc>,
    gate_key: Option<&str>,
    answer_key: Option<&str>,
) -> Result<OrderId, AppError> {
    use diesel::sql_types::{Array, BigInt, Int4, Nullable, Text, Timestamptz};
    let total = lines
        .iter()
        .map(|(p, q, _)| p.price().times(q.get()).cents())
        .sum::<i64>();
    let written: Written = diesel::sql_query(WRITE_ORDER)
        .bind::<BigInt, _>(customer.get())
        .bind::<Text, _>(OrderStatus::AwaitingPayment.as_str())
        .bind::<BigInt, _>(Money::from_cents(total)?.cents())
        .bind::<Timestamptz, _>(payment_deadline)
        .bind::<Nullable<Text>, _>(gate_key)
        .bind::<Array<BigInt>, _>(lines.iter().map(|(p, _, _)| p.id).collect::<Vec<_>>())
        .bind::<Array<Int4>, _>(lines.iter().map(|(_, q, _)| q.get()).collect::<Vec<_>>())
        .bind::<Array<BigInt>, _>(
            lines
                .iter()
                .map(|(p, _, _)| p.price_cents)
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Int4>, _>(lines.iter().map(|(_, _, after)| *after).collect::<Vec<_>>())
        .bind::<Text, _>(StockReason::Purchase.as_str())
        .bind::<Nullable<Text>, _>(answer_key)
        .get_result(conn)?;
    Ok(OrderId(written.id))
}

/// Units of `product` in each customer's live orders (awaiting payment or paid).
pub(super) fn held_by_customers(
    conn: &mut PgConn,
    customers: &[CustomerId],
    product: ProductId,
) -> Result<HashMap<CustomerId, i64>, AppError> {
    let live = [
        OrderStatus::AwaitingPayment.as_str(),
        OrderStatus::Paid.as_str(),
    ];
    let ids: Vec<i64> = customers.iter().map(|c| c.get()).collect();
    let held: Vec<(i64, Option<i64>)> = order_items::table
        .inner_join(orders::table)
        .filter(orders::customer_id.eq_any(ids))
        .filter(orders::status.eq_any(live))
        .filter(order_items::product_id.eq(product.get()))
        .group_by(orders::customer_id)
        .select((orders::customer_id, diesel::dsl::sum(order_items::quantity)))
        .load(conn)?;
    Ok(held
        .into_iter()
        .map(|(customer, units)| (CustomerId(customer), units.unwrap_or(0)))
        .collect())
}
