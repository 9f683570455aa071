//! A product as the shop sells it: its sale's terms and its stock as last
//! read. Postgres holds the truth; `db::models::ProductRow` is how a row of
//! `products` becomes one of these.

use chrono::{DateTime, Utc};

use super::{Money, ProductId, SaleState};

#[derive(Debug, Clone)]
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
