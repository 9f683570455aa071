//! Orders: a row in a list (the customer's and the admin's), and one order
//! as every page that shows a whole order shows it.

use askama::Template;

use super::Nav;
use crate::db::models::{Order, Payment, StockChange};
use crate::domain::OrderStatus;
use crate::services::orders::{OrderDetail, OrderLine};
use crate::web::format::{iso, timestamp};

/// One order in a list of orders.
pub struct OrderRow {
    pub id: i64,
    pub status: String,
    pub status_class: &'static str,
    pub total: String,
    pub created_at: String,
    pub created_iso: String,
    pub email: String,
}

impl OrderRow {
    pub fn new(order: &Order, email: &str) -> OrderRow {
        OrderRow {
            id: order.id,
            status: order.status().label().to_string(),
            status_class: order.status().as_str(),
            total: order.total().to_string(),
            created_at: timestamp(order.created_at),
            created_iso: iso(&order.created_at),
            email: email.to_string(),
        }
    }
}

/// One order with its lines, payments and ledger rows: what the order page
/// (customer and admin alike) and the admin's refund confirmation show.
pub struct OrderView {
    order: Order,
    pub customer_email: String,
    pub lines: Vec<OrderLine>,
    pub payments: Vec<Payment>,
    pub history: Vec<StockChange>,
}

impl OrderView {
    pub fn new(detail: OrderDetail) -> OrderView {
        OrderView {
            order: detail.order,
            customer_email: detail.customer_email,
            lines: detail.lines,
            payments: detail.payments,
            history: detail.history,
        }
    }

    pub fn id(&self) -> i64 {
        self.order.id
    }

    pub fn status_label(&self) -> &'static str {
        self.order.status().label()
    }

    pub fn status_class(&self) -> &'static str {
        self.order.status().as_str()
    }

    pub fn total(&self) -> String {
        self.order.total().to_string()
    }

    /// Units over every line.
    pub fn units(&self) -> i32 {
        self.lines.iter().map(|l| l.item.quantity).sum()
    }

    pub fn awaiting_payment(&self) -> bool {
        self.order.status() == OrderStatus::AwaitingPayment
    }

    pub fn payment_declined(&self) -> bool {
        self.order.status() == OrderStatus::PaymentFailed
    }

    /// A charge was sent and its answer has not come back yet.
    pub fn payment_pending(&self) -> bool {
        self.payments.iter().any(|p| p.outcome == "pending")
    }

    pub fn refundable(&self) -> bool {
        self.order.status() == OrderStatus::Paid
    }

    pub fn created_text(&self) -> String {
        timestamp(self.order.created_at)
    }

    pub fn created_iso(&self) -> String {
        iso(&self.order.created_at)
    }

    pub fn deadline_text(&self) -> String {
        timestamp(self.order.payment_deadline)
    }

    pub fn deadline_iso(&self) -> String {
        iso(&self.order.payment_deadline)
    }
}

#[derive(Template)]
#[template(path = "orders.html")]
pub struct OrdersPage {
    pub nav: Nav,
    pub orders: Vec<OrderRow>,
}

/// One order: the customer's page, or with `admin_view` the admin's, which
/// adds the customer, payments, ledger rows and the refund link.
#[derive(Template)]
#[template(path = "order.html")]
pub struct OrderPage {
    pub nav: Nav,
    pub order: OrderView,
    pub admin_view: bool,
}
