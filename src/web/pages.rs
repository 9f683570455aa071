//! Page templates (askama, one base layout) and the view data they show.

use actix_session::Session;
use actix_web::{get, http::header, HttpResponse};
use askama::Template;
use chrono::{DateTime, Utc};

use super::session::{csrf_token, current_account};
use crate::db::models::{Order, Product, StockChange};
use crate::domain::SaleState;
use crate::domain::{Money, Quantity, Role};
use crate::error::AppError;
use crate::services::accounts::Account;
use crate::services::ledger_audit::AuditReport;
use crate::services::orders::OrderDetail;

/// What the base layout needs on every page: who is signed in and the form token.
pub struct Nav {
    pub account: Option<Account>,
    pub csrf_token: String,
}

impl Nav {
    pub fn from_session(session: &Session) -> Nav {
        Nav {
            account: current_account(session),
            csrf_token: csrf_token(session),
        }
    }

    /// A one-time key for a state-changing form: a double click or a resend
    /// of the same rendered form carries the same key, so it runs once.
    pub fn idempotency_key(&self) -> String {
        uuid::Uuid::new_v4().simple().to_string()
    }

    pub fn is_admin(&self) -> bool {
        self.account.as_ref().is_some_and(|a| a.role == Role::Admin)
    }
}

pub fn render(page: &impl Template) -> Result<String, AppError> {
    page.render()
        .map_err(|e| AppError::Internal(anyhow::anyhow!("template: {e}")))
}

/// Shown in the customer's zone by the page script; the text is the UTC fallback.
pub fn timestamp(at: impl std::borrow::Borrow<DateTime<Utc>>) -> String {
    at.borrow().format("%Y-%m-%d %H:%M UTC").to_string()
}

pub fn iso(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub fn money(cents: impl std::borrow::Borrow<i64>) -> String {
    Money::from_cents(*cents.borrow())
        .unwrap_or_default()
        .to_string()
}

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
}

impl SaleView {
    pub fn new(product: &Product, now: DateTime<Utc>) -> SaleView {
        let offered = product.initial_stock.max(product.stock);
        let max_quantity = product
            .stock
            .min(product.per_customer_limit.unwrap_or(i32::MAX))
            .min(Quantity::MAX);
        SaleView {
            id: product.id,
            name: product.name.clone(),
            description: product.description.clone(),
            price: product.price().to_string(),
            stock: product.stock,
            offered,
            percent_left: if offered == 0 {
                0
            } else {
                i64::from(product.stock) * 100 / i64::from(offered)
            },
            state: product.sale_state(now),
            starts_at: product.sale_starts_at,
            ends_at: product.sale_ends_at,
            per_customer_limit: product.per_customer_limit,
            max_quantity,
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

#[derive(Template)]
#[template(path = "error.html")]
pub struct ErrorPage<'a> {
    pub status: u16,
    pub title: &'a str,
    pub message: &'a str,
}

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
}

#[derive(Template)]
#[template(path = "auth.html")]
pub struct AuthPage {
    pub nav: Nav,
    pub is_signup: bool,
    pub email: String,
    pub error: Option<String>,
}

#[derive(Template)]
#[template(path = "order.html")]
pub struct OrderPage {
    pub nav: Nav,
    pub detail: OrderDetail,
    pub admin_view: bool,
}

impl OrderPage {
    pub fn status_label(&self) -> &'static str {
        self.detail.order.status().label()
    }

    pub fn status_class(&self) -> &'static str {
        self.detail.order.status().as_str()
    }

    pub fn awaiting_payment(&self) -> bool {
        self.detail.order.status() == crate::domain::OrderStatus::AwaitingPayment
    }

    pub fn refundable(&self) -> bool {
        self.detail.order.status() == crate::domain::OrderStatus::Paid
    }

    pub fn total(&self) -> String {
        self.detail.order.total().to_string()
    }

    pub fn deadline_text(&self) -> String {
        timestamp(self.detail.order.payment_deadline)
    }

    pub fn deadline_iso(&self) -> String {
        iso(&self.detail.order.payment_deadline)
    }

    pub fn created_text(&self) -> String {
        timestamp(self.detail.order.created_at)
    }

    pub fn declined_reason(&self) -> bool {
        self.detail.order.status() == crate::domain::OrderStatus::PaymentFailed
    }
}

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

#[derive(Template)]
#[template(path = "orders.html")]
pub struct OrdersPage {
    pub nav: Nav,
    pub orders: Vec<OrderRow>,
}

#[derive(Template)]
#[template(path = "admin_dashboard.html")]
pub struct AdminDashboardPage {
    pub nav: Nav,
    pub audit: AuditReport,
    pub gate: Option<GateStatus>,
}

/// The stock gate as the dashboard shows it.
pub struct GateStatus {
    /// (product id, name, gate stock if readable, database stock)
    pub products: Vec<(i64, String, Option<i64>, i32)>,
    pub gate_readable: bool,
    pub last_reconcile: Option<(String, usize, Vec<String>)>,
}

/// Pagination links that keep the rest of the query (search fields) intact.
pub struct Pager {
    pub page: i64,
    pub pages: i64,
    pub total: i64,
    pub prev: Option<String>,
    pub next: Option<String>,
}

impl Pager {
    /// `link(n)` builds the address of page `n`.
    pub fn new(page: i64, per_page: i64, total: i64, link: impl Fn(i64) -> String) -> Pager {
        let pages = ((total + per_page - 1) / per_page).max(1);
        Pager {
            page,
            pages,
            total,
            prev: (page > 1).then(|| link(page - 1)),
            next: (page < pages).then(|| link(page + 1)),
        }
    }
}

/// What the admin typed into the order search, echoed back into the form.
#[derive(Default, serde::Serialize, serde::Deserialize, Clone)]
pub struct OrderSearch {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub email: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub product: String,
    #[serde(default, skip_serializing)]
    pub page: String,
}

pub struct Choice {
    pub value: String,
    pub label: String,
}

#[derive(Template)]
#[template(path = "admin_orders.html")]
pub struct AdminOrdersPage {
    pub nav: Nav,
    pub orders: Vec<OrderRow>,
    pub search: OrderSearch,
    pub statuses: Vec<Choice>,
    pub products: Vec<Choice>,
    pub pager: Pager,
}

impl AdminOrdersPage {
    pub fn filtered(&self) -> bool {
        !(self.search.email.is_empty()
            && self.search.status.is_empty()
            && self.search.product.is_empty())
    }
}

/// The sale form's fields as text, so a refused form comes back as typed.
#[derive(Default, serde::Deserialize)]
pub struct SaleFields {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub price: String,
    #[serde(default)]
    pub stock: String,
    #[serde(default)]
    pub per_customer_limit: String,
    #[serde(default)]
    pub starts_at: String,
    #[serde(default)]
    pub ends_at: String,
    #[serde(default)]
    pub csrf_token: String,
}

/// The value a `datetime-local` input shows for `at`; the form is in UTC.
pub fn form_time(at: &DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M").to_string()
}

impl SaleFields {
    pub fn of(product: &Product) -> SaleFields {
        SaleFields {
            name: product.name.clone(),
            description: product.description.clone(),
            price: format!(
                "{}.{:02}",
                product.price_cents / 100,
                product.price_cents % 100
            ),
            stock: product.stock.to_string(),
            per_customer_limit: product
                .per_customer_limit
                .map(|l| l.to_string())
                .unwrap_or_default(),
            starts_at: form_time(&product.sale_starts_at),
            ends_at: product
                .sale_ends_at
                .as_ref()
                .map(form_time)
                .unwrap_or_default(),
            csrf_token: String::new(),
        }
    }
}

/// Create (no `sale`) or edit (with the sale as it stands) a flash sale.
#[derive(Template)]
#[template(path = "admin_sale_form.html")]
pub struct AdminSaleFormPage {
    pub nav: Nav,
    pub sale: Option<SaleView>,
    pub fields: SaleFields,
    pub error: Option<String>,
    pub saved: bool,
}

impl AdminSaleFormPage {
    pub fn action(&self) -> String {
        match &self.sale {
            Some(sale) => format!("/admin/products/{}/edit", sale.id),
            None => "/admin/products".into(),
        }
    }
}

pub struct HistoryRow {
    pub at_iso: String,
    pub at_text: String,
    pub delta: String,
    pub stock_after: i32,
    pub reason: &'static str,
    pub note: String,
    pub order_id: Option<i64>,
}

impl HistoryRow {
    pub fn new(change: &StockChange) -> HistoryRow {
        HistoryRow {
            at_iso: iso(&change.created_at),
            at_text: timestamp(change.created_at),
            delta: format!("{:+}", change.delta),
            stock_after: change.stock_after,
            reason: match change.reason.as_str() {
                "purchase" => "Purchase",
                "payment_failed" => "Payment declined",
                "expired" => "Payment window expired",
                "refund" => "Refund",
                "admin_adjust" => "Admin adjustment",
                _ => "Other",
            },
            note: change.note.clone(),
            order_id: change.order_id,
        }
    }
}

#[derive(Template)]
#[template(path = "admin_history.html")]
pub struct AdminHistoryPage {
    pub nav: Nav,
    pub sale: SaleView,
    pub rows: Vec<HistoryRow>,
    pub pager: Pager,
}

#[derive(Template)]
#[template(path = "admin_refund.html")]
pub struct RefundConfirmPage {
    pub nav: Nav,
    pub detail: OrderDetail,
}

impl RefundConfirmPage {
    pub fn refundable(&self) -> bool {
        self.detail.order.status() == crate::domain::OrderStatus::Paid
    }

    pub fn status_label(&self) -> &'static str {
        self.detail.order.status().label()
    }

    pub fn status_class(&self) -> &'static str {
        self.detail.order.status().as_str()
    }

    pub fn total(&self) -> String {
        self.detail.order.total().to_string()
    }

    pub fn units(&self) -> i32 {
        self.detail.lines.iter().map(|l| l.item.quantity).sum()
    }
}

#[get("/static/app.css")]
pub async fn stylesheet() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/css; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .body(include_str!("../../templates/static/app.css"))
}

#[get("/static/app.js")]
pub async fn script() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .body(include_str!("../../templates/static/app.js"))
}
