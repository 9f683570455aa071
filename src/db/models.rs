//! Row types: `Thing` is what a query reads, `NewThing` what an insert writes.

use chrono::{DateTime, Utc};
use diesel::prelude::*;

use super::schema::{customers, order_items, orders, payments, products, stock_history};
use crate::domain::{Money, OrderId, OrderStatus, ProductId, SaleState};

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
pub struct Product {
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

impl Product {
    pub fn product_id(&self) -> ProductId {
        ProductId(self.id)
    }

    pub fn price(&self) -> Money {
        Money::from_cents(self.price_cents).unwrap_or_default()
    }

    pub fn sale_state(&self, now: DateTime<Utc>) -> SaleState {
        if now < self.sale_starts_at {
            SaleState::Upcoming
        } else if self.sale_ends_at.is_some_and(|end| now >= end) {
            SaleState::Ended
        } else if self.stock == 0 {
            SaleState::SoldOut
        } else {
            SaleState::Live
        }
    }
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
pub struct Order {
    pub id: i64,
    pub customer_id: i64,
    pub status: String,
    pub total_cents: i64,
    pub payment_deadline: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub gate_key: Option<String>,
}

impl Order {
    pub fn order_id(&self) -> OrderId {
        OrderId(self.id)
    }

    /// The CHECK constraint on `orders.status` makes an unknown value impossible.
    pub fn status(&self) -> OrderStatus {
        OrderStatus::parse(&self.status).expect("orders.status is constrained to known values")
    }

    pub fn total(&self) -> Money {
        Money::from_cents(self.total_cents).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Queryable, Selectable, Identifiable)]
#[diesel(table_name = order_items)]
pub struct OrderItem {
    pub id: i64,
    pub order_id: i64,
    pub product_id: i64,
    pub quantity: i32,
    pub unit_price_cents: i64,
}

#[derive(Debug, Clone, Queryable, Selectable, Identifiable)]
#[diesel(table_name = stock_history)]
pub struct StockChange {
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
pub struct Payment {
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
