//! One sale as every page that shows it sees it (the shop's list and
//! product page, the waiting room, the draw, the admin dashboard).

use chrono::{DateTime, Utc};

use crate::domain::{Product, Quantity, SaleState};
use crate::web::format::{iso, timestamp};

/// A product as the shop pages show it.
pub struct SaleView {
    pub id: i64,
    pub name: String,
    pub description: String,
    pub price: String,
    pub stock: i32,
    pub offered: i32,
    pub percent_left: i64,
    pub state: SaleState,
    pub starts_at: DateTime<Utc>,
    pub ends_at: Option<DateTime<Utc>>,
    pub per_customer_limit: Option<i32>,
    /// The most one order may ask for: bounded by stock, limit and `Quantity::MAX`.
    pub max_quantity: i32,
    /// Sold through a waiting room: the sale list says so.
    pub queue_mode: bool,
    /// While its waiting room counts the sale's units: (free to buy now,
    /// held by shoppers with a pass or an unpaid order), as the room's page
    /// shows them. The sale list and the product page count these.
    pub room_count: Option<(i64, i64)>,
}

impl SaleView {
    pub fn new(product: &Product, now: DateTime<Utc>) -> SaleView {
        SaleView::showing(product, product.stock, now)
    }

    /// `product` with `units_left` counted elsewhere (the stock gate) instead
    /// of its row's stock. The state comes from `now`, never from a cache.
    pub fn showing(product: &Product, units_left: i32, now: DateTime<Utc>) -> SaleView {
        let offered = product.initial_stock.max(units_left);
        let max_quantity = units_left
            .min(product.per_customer_limit.unwrap_or(i32::MAX))
            .min(Quantity::MAX);
        let state = match product.sale_state(now) {
            SaleState::Live | SaleState::SoldOut if units_left == 0 => SaleState::SoldOut,
            SaleState::Live | SaleState::SoldOut => SaleState::Live,
            timed => timed,
        };
        SaleView {
            id: product.id,
            name: product.name.clone(),
            description: product.description.clone(),
            price: product.price().to_string(),
            stock: units_left,
            offered,
            percent_left: if offered == 0 {
                0
            } else {
                i64::from(units_left) * 100 / i64::from(offered)
            },
            state,
            starts_at: product.sale_starts_at,
            ends_at: product.sale_ends_at,
            per_customer_limit: product.per_customer_limit,
            max_quantity,
            queue_mode: product.queue_mode,
            room_count: None,
        }
    }

    pub fn state_label(&self) -> &'static str {
        match self.state {
            SaleState::Upcoming => "Upcoming",
            SaleState::Live => "Live",
            SaleState::SoldOut => "Sold out",
            SaleState::Ended => "Ended",
        }
    }

    pub fn state_class(&self) -> &'static str {
        match self.state {
            SaleState::Upcoming => "upcoming",
            SaleState::Live => "live",
            SaleState::SoldOut => "soldout",
            SaleState::Ended => "ended",
        }
    }

    pub fn can_buy(&self) -> bool {
        self.state == SaleState::Live && self.max_quantity >= 1
    }

    pub fn starts_at_text(&self) -> String {
        timestamp(self.starts_at)
    }

    pub fn starts_at_iso(&self) -> String {
        iso(&self.starts_at)
    }

    pub fn ends_at_text(&self) -> Option<String> {
        self.ends_at.as_ref().map(timestamp)
    }

    pub fn ends_at_iso(&self) -> String {
        self.ends_at.as_ref().map(iso).unwrap_or_default()
    }
}
