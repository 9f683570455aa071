//! The sale list and a product page (`sale::SaleView` is the sale itself).

use askama::Template;

use super::sale::SaleView;
use super::waiting_room::ProductQueue;
use super::Nav;

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
        if let Some(room) = &queue {
            room.count_into(&mut sale);
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
