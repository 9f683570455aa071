//! An order as the shop keeps it, with what it bought, what was paid and
//! what it moved in the stock ledger. `db::models` maps the rows onto these.

use chrono::{DateTime, Utc};

use super::{Money, OrderId, OrderStatus};

#[derive(Debug, Clone)]
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

#[derive(Debug, Clone)]
pub struct OrderItem {
    pub id: i64,
    pub order_id: i64,
    pub product_id: i64,
    pub quantity: i32,
    pub unit_price_cents: i64,
}

/// One try at paying an order, as recorded.
#[derive(Debug, Clone)]
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

/// One row of a product's stock ledger: every change of its stock, with why.
#[derive(Debug, Clone)]
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
