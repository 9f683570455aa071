//! The SQL that writes orders: one statement for a lone order of one or
//! more products, one statement for a whole batch of buyers of one product.
//! Each runs inside a lock hold, where every round trip to the database is
//! time the next buyers wait.

use chrono::{DateTime, Utc};
use diesel::prelude::*;

use crate::db::models::Product;
use crate::db::PgConn;
use crate::domain::{CustomerId, Money, OrderId, OrderStatus, Quantity, StockReason};
use crate::error::AppError;

/// One buyer of one product in a batch: what they asked for, and the keys
/// their order is written with.
pub struct Buyer {
    pub customer: CustomerId,
    pub quantity: Quantity,
    pub payment_deadline: DateTime<Utc>,
    /// The stock gate's admission key, kept on the order for give-backs.
    pub gate_key: Option<String>,
    /// The idempotency key the order is named on, if the request had one.
    pub answer_key: Option<KeyRow>,
}

/// The idempotency key an order is named on, in the order's own transaction.
#[derive(Debug, Clone)]
pub struct KeyRow {
    pub key: String,
    /// With a fingerprint the key has no row yet (the stock gate kept the
    /// request's answer): the order's statement inserts it, and a key some
    /// earlier order already took refuses the order (`AppError::KeyTaken`).
    /// Without, the request claimed the key's row before: the order is
    /// named on that row.
    pub fingerprint: Option<String>,
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
), claimed AS (
    UPDATE idempotency_keys SET order_id = new_order.id
    FROM new_order WHERE $12::text IS NULL AND customer_id = $1 AND key = $11
), recorded AS (
    INSERT INTO idempotency_keys (customer_id, key, fingerprint, order_id)
    SELECT $1, $11, $12, new_order.id FROM new_order WHERE $12::text IS NOT NULL
    ON CONFLICT DO NOTHING
    RETURNING order_id
)
SELECT id, $12::text IS NULL OR EXISTS (SELECT 1 FROM recorded) AS named FROM new_order";

#[derive(QueryableByName)]
struct Written {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    id: i64,
    /// Whether the order is named on its idempotency key (false: the key
    /// was already taken, and the order must not stand).
    #[diesel(sql_type = diesel::sql_types::Bool)]
    named: bool,
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
    answer_key: Option<&KeyRow>,
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
        .bind::<Nullable<Text>, _>(answer_key.map(|k| k.key.as_str()))
        .bind::<Nullable<Text>, _>(answer_key.and_then(|k| k.fingerprint.as_deref()))
        .get_result(conn)?;
    if !written.named {
        return Err(AppError::KeyTaken);
    }
    Ok(OrderId(written.id))
}

/// Every admitted buyer's order, item and purchase ledger row, the order
/// named on their idempotency key, and the product's new stock under the
/// lock's fencing token, in one statement.
/// Order ids are drawn in arrival order, and the ledger rows are inserted in
/// it, so the last ledger row of the product carries its new stock.
const WRITE_BATCH: &str = "
WITH buyer AS MATERIALIZED (
    SELECT nextval('orders_id_seq') AS order_id, b.*
    FROM unnest($1::bigint[], $2::int[], $3::bigint[], $4::timestamptz[], $5::text[], $6::int[], $13::text[], $14::text[])
        WITH ORDINALITY AS b(customer_id, quantity, total_cents, payment_deadline, gate_key, stock_after, answer_key, answer_fingerprint, arrival)
), new_orders AS (
    INSERT INTO orders (id, customer_id, status, total_cents, payment_deadline, gate_key)
    SELECT order_id, customer_id, $7, total_cents, payment_deadline, gate_key
    FROM buyer ORDER BY arrival
), items AS (
    INSERT INTO order_items (order_id, product_id, quantity, unit_price_cents)
    SELECT order_id, $8, quantity, $9 FROM buyer ORDER BY arrival
), ledger AS (
    INSERT INTO stock_history (product_id, order_id, delta, stock_after, reason, note)
    SELECT $8, order_id, -quantity, stock_after, $10, '' FROM buyer ORDER BY arrival
), stock AS (
    UPDATE products SET stock = stock - $11, fence = $12, updated_at = now()
    WHERE id = $8 AND fence < $12
    RETURNING stock
), claimed AS (
    UPDATE idempotency_keys k SET order_id = buyer.order_id
    FROM buyer WHERE buyer.answer_fingerprint IS NULL
        AND k.customer_id = buyer.customer_id AND k.key = buyer.answer_key
), recorded AS (
    INSERT INTO idempotency_keys (customer_id, key, fingerprint, order_id)
    SELECT customer_id, answer_key, answer_fingerprint, order_id FROM buyer
    WHERE answer_fingerprint IS NOT NULL ORDER BY arrival
    ON CONFLICT DO NOTHING
    RETURNING order_id
)
SELECT buyer.order_id, (SELECT stock FROM stock) AS stock,
    buyer.answer_fingerprint IS NULL
        OR EXISTS (SELECT 1 FROM recorded WHERE recorded.order_id = buyer.order_id) AS named
FROM buyer ORDER BY arrival";

#[derive(QueryableByName)]
pub(super) struct WrittenBuyer {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub order_id: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
    /// None when the fencing token refused the stock update.
    pub stock: Option<i32>,
    /// False when the buyer's idempotency key was already taken.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub named: bool,
}

/// Writes every buyer in `taking` (each with the stock left after them, in
/// arrival order) and takes their units off `product` under `token`.
/// The error is Diesel's own, so the caller can tell a refused row from a
/// failed batch.
pub(super) fn write_batch(
    conn: &mut PgConn,
    product: &Product,
    token: i64,
    taking: &[(&Buyer, i32)],
) -> Result<Vec<WrittenBuyer>, diesel::result::Error> {
    use diesel::sql_types::{Array, BigInt, Int4, Nullable, Text, Timestamptz};
    let price = product.price();
    let totals: Vec<i64> = taking
        .iter()
        .map(|(b, _)| price.times(b.quantity.get()).cents())
        .collect();
    let units: i32 = taking.iter().map(|(b, _)| b.quantity.get()).sum();
    diesel::sql_query(WRITE_BATCH)
        .bind::<Array<BigInt>, _>(
            taking
                .iter()
                .map(|(b, _)| b.customer.get())
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Int4>, _>(
            taking
                .iter()
                .map(|(b, _)| b.quantity.get())
                .collect::<Vec<_>>(),
        )
        .bind::<Array<BigInt>, _>(totals)
        .bind::<Array<Timestamptz>, _>(
            taking
                .iter()
                .map(|(b, _)| b.payment_deadline)
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Nullable<Text>>, _>(
            taking
                .iter()
                .map(|(b, _)| b.gate_key.clone())
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Int4>, _>(taking.iter().map(|(_, after)| *after).collect::<Vec<_>>())
        .bind::<Text, _>(OrderStatus::AwaitingPayment.as_str())
        .bind::<BigInt, _>(product.id)
        .bind::<BigInt, _>(product.price_cents)
        .bind::<Text, _>(StockReason::Purchase.as_str())
        .bind::<Int4, _>(units)
        .bind::<BigInt, _>(token)
        .bind::<Array<Nullable<Text>>, _>(
            taking
                .iter()
                .map(|(b, _)| b.answer_key.as_ref().map(|k| k.key.clone()))
                .collect::<Vec<_>>(),
        )
        .bind::<Array<Nullable<Text>>, _>(
            taking
                .iter()
                .map(|(b, _)| b.answer_key.as_ref().and_then(|k| k.fingerprint.clone()))
                .collect::<Vec<_>>(),
        )
        .load(conn)
}
