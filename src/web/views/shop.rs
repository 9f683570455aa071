//! The sale list and a product page (`sale::SaleView` is the sale itself).

use askama::Template;

use super::sale::SaleView;
use super::waiting_room::{Availability, ProductQueue};
use super::Nav;
use crate::domain::SaleState;

#[derive(Template)]
#[template(path = "sale_list.html")]
pub struct SaleListPage {
    pub nav: Nav,
    pub sales: Vec<SaleView>,
}

#[derive(Template)]
#[template(path = "product.html")]
pub struct ProductPage {
    pub nav: Nav,
    pub sale: SaleView,
    /// A sale in queue mode: its waiting room instead of the Buy form.
    pub queue: Option<ProductQueue>,
    /// The server's clock (RFC 3339), so the page script enables Buy at the
    /// opening second by the shop's clock rather than the reader's. Only an
    /// upcoming sale's page carries it: a live one stays the same for
    /// every stranger.
    pub served_at: String,
}

impl ProductPage {
    pub fn new(
        nav: Nav,
        mut sale: SaleView,
        queue: Option<ProductQueue>,
        served_at: String,
    ) -> ProductPage {
        // While its room counts the units, a waiting-room sale is sold out
        // when the room says so, not when the stock row reaches 0: units in
        // unpaid orders are held and may come back, and late arrivals can
        // still join the back of the line meanwhile.
        if let Some(live) = queue.as_ref().and_then(|q| q.live) {
            sale.state = if live == Availability::AllSold {
                SaleState::SoldOut
            } else {
                SaleState::Live
            };
        }
        ProductPage {
            nav,
            sale,
            queue,
            served_at,
        }
    }

    /// The waiting room, while it counts the sale's units.
    pub fn room_count(&self) -> Option<&ProductQueue> {
        self.queue.as_ref().filter(|q| q.counts_units())
    }
}
