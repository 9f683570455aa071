//! Orders: a row in a list (the customer's and the admin's), and one order
//! as every page that shows a whole order shows it.

use askama::Template;

use super::Nav;
use crate::domain::{Order, OrderStatus};
use crate::services::orders::{OrderDetail, OrderSummary};
use crate::services::payment::CARD_TRIES;
use crate::web::format::{iso, money, timestamp};
use crate::web::words::status_in_words;

/// One order in a list of orders.
pub struct OrderRow {
    pub id: i64,
    pub status: String,
    pub status_class: &'static str,
    pub total: String,
    pub created_at: String,
    pub created_iso: String,
    pub email: String,
    /// What the order bought: "Limited sneakers × 2, Signed poster".
    pub items: String,
}

impl OrderRow {
    pub fn new(order: &Order, email: &str) -> OrderRow {
        OrderRow {
            items: String::new(),
            id: order.id,
            status: status_in_words(order.status()).to_string(),
            status_class: order.status().as_str(),
            total: order.total().to_string(),
            created_at: timestamp(order.created_at),
            created_iso: iso(&order.created_at),
            email: email.to_string(),
        }
    }
}

/// One of the customer's own orders, naming what it bought.
pub fn customer_row(summary: &OrderSummary, email: &str) -> OrderRow {
    let items = summary
        .lines
        .iter()
        .map(|(name, quantity)| match quantity {
            1 => name.clone(),
            n => format!("{name} × {n}"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    OrderRow {
        items,
        ..OrderRow::new(&summary.order, email)
    }
}

/// One order with its lines, payments and ledger rows: what the order page
/// (customer and admin alike) and the admin's refund confirmation show.
/// Built from the service's `OrderDetail`; holds only what the pages print.
pub struct OrderView {
    id: i64,
    status: OrderStatus,
    total: String,
    created_text: String,
    created_iso: String,
    deadline_text: String,
    deadline_iso: String,
    payment_pending: bool,
    /// Declined cards so far: each leaves the units held until the last.
    declines: i64,
    /// Why the card just typed was not sent (a mistyped number), shown at
    /// the card field.
    pub payment_error: Option<String>,
    pub customer_email: String,
    pub lines: Vec<LineView>,
    pub payments: Vec<PaymentView>,
    pub history: Vec<LedgerView>,
}

/// One product line of an order.
pub struct LineView {
    pub product_id: i64,
    pub product_name: String,
    pub quantity: i32,
    pub unit_price: String,
}

/// One payment attempt, as the admin's order page lists it.
pub struct PaymentView {
    pub at_iso: String,
    pub at_text: String,
    pub outcome: String,
    pub card_last4: String,
    pub amount: String,
}

/// One stock-ledger row of an order, as the admin's order page lists it.
pub struct LedgerView {
    pub at_iso: String,
    pub at_text: String,
    pub product_id: i64,
    pub delta: String,
    pub stock_after: i32,
    pub reason: String,
}

/// The payment attempts, and the refund as the money's way back: the
/// ledger's refund row says when, the approved charge which card.
fn payments_with_refund(detail: &OrderDetail) -> Vec<PaymentView> {
    let mut payments: Vec<PaymentView> = detail
        .payments
        .iter()
        .map(|p| PaymentView {
            at_iso: iso(&p.created_at),
            at_text: timestamp(p.created_at),
            outcome: p.outcome.clone(),
            card_last4: p.card_last4.clone(),
            amount: money(p.amount_cents),
        })
        .collect();
    let refunded_at = detail
        .history
        .iter()
        .filter(|h| h.reason == "refund")
        .map(|h| h.created_at)
        .max();
    let charged = detail.payments.iter().find(|p| p.outcome == "approved");
    if let (Some(at), Some(charged)) = (refunded_at, charged) {
        payments.push(PaymentView {
            at_iso: iso(&at),
            at_text: timestamp(at),
            outcome: "refunded".into(),
            card_last4: charged.card_last4.clone(),
            amount: format!("−{}", money(charged.amount_cents)),
        });
    }
    payments
}

impl OrderView {
    pub fn new(detail: OrderDetail) -> OrderView {
        let payments = payments_with_refund(&detail);
        let order = &detail.order;
        OrderView {
            id: order.id,
            status: order.status(),
            total: order.total().to_string(),
            created_text: timestamp(order.created_at),
            created_iso: iso(&order.created_at),
            deadline_text: timestamp(order.payment_deadline),
            deadline_iso: iso(&order.payment_deadline),
            payment_pending: detail.payments.iter().any(|p| p.outcome == "pending"),
            declines: detail
                .payments
                .iter()
                .filter(|p| p.outcome == "declined")
                .count() as i64,
            payment_error: None,
            customer_email: detail.customer_email,
            lines: detail
                .lines
                .iter()
                .map(|line| LineView {
                    product_id: line.item.product_id,
                    product_name: line.product_name.clone(),
                    quantity: line.item.quantity,
                    unit_price: money(line.item.unit_price_cents),
                })
                .collect(),
            payments,
            history: detail
                .history
                .iter()
                .map(|h| LedgerView {
                    at_iso: iso(&h.created_at),
                    at_text: timestamp(h.created_at),
                    product_id: h.product_id,
                    delta: format!("{:+}", h.delta),
                    stock_after: h.stock_after,
                    reason: h.reason.clone(),
                })
                .collect(),
        }
    }

    pub fn id(&self) -> i64 {
        self.id
    }

    pub fn status_label(&self) -> &'static str {
        status_in_words(self.status)
    }

    pub fn status_class(&self) -> &'static str {
        self.status.as_str()
    }

    pub fn total(&self) -> String {
        self.total.clone()
    }

    /// Units over every line.
    pub fn units(&self) -> i32 {
        self.lines.iter().map(|l| l.quantity).sum()
    }

    pub fn awaiting_payment(&self) -> bool {
        self.status == OrderStatus::AwaitingPayment
    }

    /// The order was cancelled and its units released: after its last
    /// declined card, or because the customer gave up.
    pub fn payment_declined(&self) -> bool {
        self.status == OrderStatus::PaymentFailed
    }

    /// Cancelled after the last card it allows was declined.
    pub fn declined_to_the_end(&self) -> bool {
        self.payment_declined() && self.declines >= CARD_TRIES
    }

    /// A card was declined and another may still be tried.
    pub fn declined_can_retry(&self) -> bool {
        self.awaiting_payment() && self.declines > 0 && self.declines < CARD_TRIES
    }

    /// The last card it allows was declined and its units are on their way
    /// back (the restore runs after the decline's own commit): no more
    /// cards are taken.
    pub fn being_cancelled(&self) -> bool {
        self.awaiting_payment() && self.declines >= CARD_TRIES
    }

    pub fn declines(&self) -> i64 {
        self.declines
    }

    pub fn tries_left(&self) -> i64 {
        (CARD_TRIES - self.declines).max(0)
    }

    pub fn card_tries(&self) -> i64 {
        CARD_TRIES
    }

    /// A charge was sent and its answer has not come back yet.
    pub fn payment_pending(&self) -> bool {
        self.payment_pending
    }

    pub fn refundable(&self) -> bool {
        self.status == OrderStatus::Paid
    }

    pub fn created_text(&self) -> String {
        self.created_text.clone()
    }

    pub fn created_iso(&self) -> String {
        self.created_iso.clone()
    }

    pub fn deadline_text(&self) -> String {
        self.deadline_text.clone()
    }

    pub fn deadline_iso(&self) -> String {
        self.deadline_iso.clone()
    }
}

#[derive(Template)]
#[template(path = "orders.html")]
pub struct OrdersPage {
    pub nav: Nav,
    pub orders: Vec<OrderRow>,
    /// The account's address is not confirmed yet: the notice shows.
    pub unconfirmed: bool,
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
