//! The cart page: each line with what stands in the way of buying it.

use askama::Template;
use chrono::{DateTime, Utc};

use super::Nav;
use crate::domain::{Product, SaleState};

/// One cart line as the cart page shows it.
pub struct CartLine {
    pub product_id: i64,
    pub name: String,
    pub units: i32,
    pub unit_price: String,
    pub line_total: String,
    pub note: Option<String>,
}

impl CartLine {
    pub fn new(product: &Product, units: i32, now: DateTime<Utc>) -> CartLine {
        let note = match product.sale_state(now) {
            SaleState::Upcoming => Some("The sale has not started yet.".to_string()),
            SaleState::Ended => Some("The sale has ended.".to_string()),
            SaleState::SoldOut => Some("Sold out.".to_string()),
            SaleState::Live if product.stock < units => {
                Some(format!("Only {} left.", product.stock))
            }
            SaleState::Live => None,
        };
        CartLine {
            product_id: product.id,
            name: product.name.clone(),
            units,
            unit_price: product.price().to_string(),
            line_total: product.price().times(units).to_string(),
            note,
        }
    }
}

#[derive(Template)]
#[template(path = "cart.html")]
pub struct CartPage {
    pub nav: Nav,
    pub lines: Vec<CartLine>,
}
