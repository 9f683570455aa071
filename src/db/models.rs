//! Row types: `ThingRow` is what a query reads, `NewThing` what an insert
//! writes. A row read for the layers above becomes its `domain` record, so
//! nothing above the services knows a table.

use chrono::{DateTime, Utc};
use diesel::backend::Backend;
use diesel::deserialize;
use diesel::prelude::*;

use super::schema::{customers, order_items, orders, payments, products, stock_history};
use crate::domain::{Order, OrderItem, Payment, Product, StockChange};

#[derive(Debug, Clone, Queryable, Selectable, Identifiable)]
#[diesel(table_name = customers)]
pub struct Customer {
    pub id: i64,
    pub email: String,
    pub password_hash: String,
    pub role: String,
    pub created_at: DateTime<Utc>,
    pub email_confirmed_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Insertable)]
#[diesel(table_name = customers)]
pub struct NewCustomer<'a> {
    pub email: &'a str,
    pub password_hash: &'a str,
    pub role: &'a str,
    /// `domain::canonical_email` of `email`.
    pub email_canonical: &'a str,
}

#[derive(Debug, Clone, Queryable, Selectable, Identifiable)]
#[diesel(table_name = products)]
pub struct ProductRow {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub price_cents: i64,
    pub stock: i32,
    pub initial_stock: i32,
    pub per_customer_limit: Option<i32>,
    pub sale_starts_at: DateTime<Utc>,
    pub sale_ends_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Fencing token of the last lock holder that wrote the stock.
    pub fence: i64,
    /// Customers wait in the waiting room and buy with a pass (issue #16).
    pub queue_mode: bool,
    /// When the waiting room opens; None means 15 minutes before the start.
    pub queue_opens_at: Option<DateTime<Utc>>,
    /// The size of the bot check for joining its waiting room (`services::door`).
    pub join_check_work: i32,
}

#[derive(Debug, Insertable)]
#[diesel(table_name = products)]
pub struct NewProduct<'a> {
    pub name: &'a str,
    pub description: &'a str,
    pub price_cents: i64,
    pub stock: i32,
    pub initial_stock: i32,
    pub per_customer_limit: Option<i32>,
    pub sale_starts_at: DateTime<Utc>,
    pub sale_ends_at: Option<DateTime<Utc>>,
    pub queue_mode: bool,
    pub queue_opens_at: Option<DateTime<Utc>>,
    pub join_check_work: i32,
}

#[derive(Debug, Clone, Queryable, Selectable, Identifiable)]
#[diesel(table_name = orders)]
pub struct OrderRow {
    pub id: i64,
    pub customer_id: i64,
    pub status: String,
    pub total_cents: i64,
    pub payment_deadline: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub gate_key: Option<String>,
}

#[derive(Debug, Clone, Queryable, Selectable, Identifiable)]
#[diesel(table_name = order_items)]
pub struct OrderItemRow {
    pub id: i64,
    pub order_id: i64,
    pub product_id: i64,
    pub quantity: i32,
    pub unit_price_cents: i64,
}

#[derive(Debug, Clone, Queryable, Selectable, Identifiable)]
#[diesel(table_name = stock_history)]
pub struct StockChangeRow {
    pub id: i64,
    pub product_id: i64,
    pub order_id: Option<i64>,
    pub delta: i32,
    pub stock_after: i32,
    pub reason: String,
    pub note: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Insertable)]
#[diesel(table_name = stock_history)]
pub struct NewStockChange<'a> {
    pub product_id: i64,
    pub order_id: Option<i64>,
    pub delta: i32,
    pub stock_after: i32,
    pub reason: &'a str,
    pub note: &'a str,
}

#[derive(Debug, Clone, Queryable, Selectable, Identifiable)]
#[diesel(table_name = payments)]
pub struct PaymentRow {
    pub id: i64,
    pub order_id: i64,
    pub outcome: String,
    pub amount_cents: i64,
    pub card_last4: String,
    pub created_at: DateTime<Utc>,
    /// The key the provider deduplicates this attempt on.
    pub attempt_key: String,
    /// When the result was recorded; None while the attempt is pending.
    pub settled_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Insertable)]
#[diesel(table_name = payments)]
pub struct NewPayment<'a> {
    pub order_id: i64,
    pub outcome: &'a str,
    pub amount_cents: i64,
    pub card_last4: &'a str,
    pub attempt_key: &'a str,
}

/// A `domain` record is read straight from its row: it selects what its
/// row type selects and is built from it, field by field (a field missing
/// on either side does not compile), so the layers above query and load
/// the record and never name the row.
macro_rules! read_from_row {
    ($($record:ident => $row:ident { $($field:ident),* $(,)? }),* $(,)?) => {$(
        impl From<$row> for $record {
            fn from(row: $row) -> $record {
                let $row { $($field),* } = row;
                $record { $($field),* }
            }
        }

        impl<DB: Backend> Selectable<DB> for $record
        where
            $row: Selectable<DB>,
        {
            type SelectExpression = <$row as Selectable<DB>>::SelectExpression;

            fn construct_selection() -> Self::SelectExpression {
                <$row>::construct_selection()
            }
        }

        impl<ST, DB: Backend> Queryable<ST, DB> for $record
        where
            $row: Queryable<ST, DB>,
        {
            type Row = <$row as Queryable<ST, DB>>::Row;

            fn build(row: Self::Row) -> deserialize::Result<Self> {
                <$row>::build(row).map(<$record>::from)
            }
        }
    )*};
}

read_from_row! {
    Product => ProductRow {
        id, name, description, price_cents, stock, initial_stock, per_customer_limit,
        sale_starts_at, sale_ends_at, created_at, updated_at, fence, queue_mode, queue_opens_at,
        join_check_work,
    },
    Order => OrderRow {
        id, customer_id, status, total_cents, payment_deadline, created_at, updated_at,
        gate_key,
    },
    OrderItem => OrderItemRow {
        id, order_id, product_id, quantity, unit_price_cents,
    },
    StockChange => StockChangeRow {
        id, product_id, order_id, delta, stock_after, reason, note, created_at,
    },
    Payment => PaymentRow {
        id, order_id, outcome, amount_cents, card_last4, created_at, attempt_key, settled_at,
    },
}
