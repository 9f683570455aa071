//! The SQL that writes orders: one statement for a lone order of one or
//! more products, one statement for the batches of buyers of one or more
//! products.
//! Each runs inside a lock hold, where every round trip to the database is
//! time the next buyers wait.

use chrono::{DateTime, Utc};
use diesel::prelude::*;

use crate::db::prepared::Prepared;
use crate::db::PgConn;
use crate::domain::{CustomerId, Money, OrderId, OrderStatus, Product, Quantity, StockReason};
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
    /// The number of the waiting-room pass the buyer presents (queue mode):
    /// checked against their open pass and used, in the order's transaction.
    pub pass: Option<i32>,
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

/// The order, its items and their purchase ledger rows, the customer's
/// holdings of each product, and the order named on the request's
/// idempotency key, in one statement:
/// this runs once per buyer inside a batch's lock hold, where every round
/// trip to the database is time the next buyers wait.
const WRITE_ORDER: &str = "
WITH new_order AS (
    INSERT INTO orders (customer_id, status, total_cents, payment_deadline, gate_key)
    VALUES ($1, $2, $3, $4, $5)
    RETURNING id
), lines AS (
    SELECT * FROM unnest($6::bigint[], $7::int[], $8::bigint[], $9::int[], $14::int[])
        AS line(product_id, quantity, unit_price_cents, stock_after, cap)
), held AS (
    INSERT INTO holdings (product_id, customer_id, units, cap)
    SELECT line.product_id, $1, sum(line.quantity), max(line.cap)
    FROM lines AS line GROUP BY line.product_id ORDER BY line.product_id
    ON CONFLICT (product_id, customer_id) DO UPDATE
        SET units = holdings.units + EXCLUDED.units, cap = EXCLUDED.cap
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
), pass_used AS (
    UPDATE queue_admissions a SET state = 'used', order_id = new_order.id, ended_at = clock_timestamp()
    FROM new_order WHERE $13::int IS NOT NULL AND a.product_id = ($6::bigint[])[1]
        AND a.number = $13 AND a.customer_id = $1 AND a.state = 'issued'
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
    pass: Option<i32>,
) -> Result<OrderId, AppError> {
    use diesel::sql_types::{Array, BigInt, Int4, Nullable, Text, Timestamptz};
    let total = lines
        .iter()
        .map(|(p, q, _)| p.price().times(q.get()).cents())
        .sum::<i64>();
    let written: Written = Prepared::new(WRITE_ORDER)
        .bind::<BigInt, _>(customer.get())
        .bind::<Text, _>(OrderStatus::AwaitingPayment.as_str())
        .bind::<BigInt, _>(Money::from_cents(total)?.cents())
        .bind::<Timestamptz, _>(payment_deadline)
        .bind::<Nullable<Text>, _>(gate_key.map(str::to_owned))
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
        .bind::<Nullable<Text>, _>(answer_key.map(|k| k.key.clone()))
        .bind::<Nullable<Text>, _>(answer_key.and_then(|k| k.fingerprint.clone()))
        .bind::<Nullable<Int4>, _>(pass)
        .bind::<Array<Nullable<Int4>>, _>(
            lines
                .iter()
                .map(|(p, _, _)| p.per_customer_limit)
                .collect::<Vec<_>>(),
        )
        .get_result(conn)?;
    if !written.named {
        return Err(AppError::KeyTaken);
    }
    Ok(OrderId(written.id))
}

/// Every admitted buyer's order, item and purchase ledger row, their
/// holdings (summed per customer and product: one row cannot be upserted
/// twice in a statement), the order named on their idempotency key, and each product's new stock under its
/// lock's fencing token, in one statement: a group transaction of many
/// products, one buyer each, would otherwise pay a statement's parsing and
/// planning (and a round trip, row locks held) per product.
/// Order ids are drawn in the order given (by product, arrival order within
/// it), and the ledger rows are inserted in it, so the last ledger row of a
/// product carries its new stock. A product whose token is refused is
/// missing from `stock`, so its buyers' rows say `stock` is null.
const WRITE_SALES: &str = "
WITH buyer AS MATERIALIZED (
    SELECT nextval('orders_id_seq') AS order_id, b.*
    FROM unnest($1::bigint[], $2::bigint[], $3::int[], $4::bigint[], $5::bigint[], $6::timestamptz[], $7::text[], $8::int[], $9::text[], $10::text[], $16::int[], $17::int[])
        WITH ORDINALITY AS b(product_id, customer_id, quantity, unit_price_cents, total_cents, payment_deadline, gate_key, stock_after, answer_key, answer_fingerprint, pass, cap, arrival)
), held AS (
    INSERT INTO holdings (product_id, customer_id, units, cap)
    SELECT product_id, customer_id, sum(quantity), max(cap) FROM buyer
    GROUP BY product_id, customer_id ORDER BY product_id, customer_id
    ON CONFLICT (product_id, customer_id) DO UPDATE
        SET units = holdings.units + EXCLUDED.units, cap = EXCLUDED.cap
), new_orders AS (
    INSERT INTO orders (id, customer_id, status, total_cents, payment_deadline, gate_key)
    SELECT order_id, customer_id, $11, total_cents, payment_deadline, gate_key
    FROM buyer ORDER BY arrival
), items AS (
    INSERT INTO order_items (order_id, product_id, quantity, unit_price_cents)
    SELECT order_id, product_id, quantity, unit_price_cents FROM buyer ORDER BY arrival
), ledger AS (
    INSERT INTO stock_history (product_id, order_id, delta, stock_after, reason, note)
    SELECT product_id, order_id, -quantity, stock_after, $12, '' FROM buyer ORDER BY arrival
), stock AS (
    UPDATE products p SET stock = p.stock - sold.units, fence = sold.token, updated_at = now()
    FROM unnest($13::bigint[], $14::int[], $15::bigint[]) AS sold(product_id, units, token)
    WHERE p.id = sold.product_id AND p.fence < sold.token
    RETURNING p.id, p.stock
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
), pass_used AS (
    UPDATE queue_admissions a SET state = 'used', order_id = buyer.order_id, ended_at = clock_timestamp()
    FROM buyer WHERE buyer.pass IS NOT NULL AND a.product_id = buyer.product_id
        AND a.number = buyer.pass AND a.customer_id = buyer.customer_id AND a.state = 'issued'
)
SELECT buyer.order_id, buyer.product_id,
    (SELECT stock.stock FROM stock WHERE stock.id = buyer.product_id) AS stock,
    buyer.answer_fingerprint IS NULL
        OR EXISTS (SELECT 1 FROM recorded WHERE recorded.order_id = buyer.order_id) AS named
FROM buyer ORDER BY arrival";

#[derive(QueryableByName)]
pub(super) struct WrittenBuyer {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub order_id: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub product_id: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
    /// None when the fencing token refused the product's stock update.
    pub stock: Option<i32>,
    /// False when the buyer's idempotency key was already taken.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub named: bool,
}

/// One product's admitted buyers, each with the stock left after them in
/// arrival order, to be written under the lock's fencing `token`.
pub(super) struct Sale<'a> {
    pub product: &'a Product,
    pub token: i64,
    pub taking: &'a [(&'a Buyer, i32)],
}

/// Writes every sale's buyers and takes their units off each product, in
/// one statement; the rows come back in the order given. The error is
/// Diesel's own, so the caller can tell a refused row from a failed write.
pub(super) fn write_sales(
    conn: &mut PgConn,
    sales: &[Sale<'_>],
) -> Result<Vec<WrittenBuyer>, diesel::result::Error> {
    use diesel::sql_types::{Array, BigInt, Int4, Nullable, Text, Timestamptz};
    let buyers = || {
        sales
            .iter()
            .flat_map(|sale| sale.taking.iter().map(move |taken| (sale.product, taken)))
    };
    let column = |each: &dyn Fn(&Product, &Buyer, i32) -> i64| -> Vec<i64> {
        buyers().map(|(p, (b, after))| each(p, b, *after)).collect()
    };
    let texts = |each: &dyn Fn(&Buyer) -> Option<String>| -> Vec<Option<String>> {
        buyers().map(|(_, (b, _))| each(b)).collect()
    };
    let quantities: Vec<i32> = buyers().map(|(_, (b, _))| b.quantity.get()).collect();
    let stock_after: Vec<i32> = buyers().map(|(_, (_, after))| *after).collect();
    let deadlines: Vec<DateTime<Utc>> = buyers().map(|(_, (b, _))| b.payment_deadline).collect();
    let units: Vec<i32> = sales
        .iter()
        .map(|sale| sale.taking.iter().map(|(b, _)| b.quantity.get()).sum())
        .collect();
    Prepared::new(WRITE_SALES)
        .bind::<Array<BigInt>, _>(column(&|p, _, _| p.id))
        .bind::<Array<BigInt>, _>(column(&|_, b, _| b.customer.get()))
        .bind::<Array<Int4>, _>(quantities)
        .bind::<Array<BigInt>, _>(column(&|p, _, _| p.price_cents))
        .bind::<Array<BigInt>, _>(column(&|p, b, _| p.price().times(b.quantity.get()).cents()))
        .bind::<Array<Timestamptz>, _>(deadlines)
        .bind::<Array<Nullable<Text>>, _>(texts(&|b| b.gate_key.clone()))
        .bind::<Array<Int4>, _>(stock_after)
        .bind::<Array<Nullable<Text>>, _>(texts(&|b| b.answer_key.as_ref().map(|k| k.key.clone())))
        .bind::<Array<Nullable<Text>>, _>(texts(&|b| {
            b.answer_key.as_ref().and_then(|k| k.fingerprint.clone())
        }))
        .bind::<Text, _>(OrderStatus::AwaitingPayment.as_str())
        .bind::<Text, _>(StockReason::Purchase.as_str())
        .bind::<Array<BigInt>, _>(sales.iter().map(|s| s.product.id).collect::<Vec<_>>())
        .bind::<Array<Int4>, _>(units)
        .bind::<Array<BigInt>, _>(sales.iter().map(|s| s.token).collect::<Vec<_>>())
        .bind::<Array<Nullable<Int4>>, _>(buyers().map(|(_, (b, _))| b.pass).collect::<Vec<_>>())
        .bind::<Array<Nullable<Int4>>, _>(
            buyers()
                .map(|(p, _)| p.per_customer_limit)
                .collect::<Vec<_>>(),
        )
        .load(conn)
}
