//! The admin console's pages: the dashboard (ledger audit and stock gate),
//! the order search and refund confirmation, the sale form and a sale's
//! stock history.

use askama::Template;

use super::orders::{OrderRow, OrderView};
use super::sale::SaleView;
use super::{Nav, Pager};
use crate::domain::{Order, OrderStatus, Product, StockChange};
use crate::services::ledger_audit::AuditReport;
use crate::services::LastReconcile;
use crate::web::format::{iso, timestamp};
use crate::web::forms::{OrderSearch, SaleFields};
use crate::web::words::status_in_words;

#[derive(Template)]
#[template(path = "admin_dashboard.html")]
pub struct AdminDashboardPage {
    pub nav: Nav,
    /// The stock-ledger audit.
    pub audit: AuditView,
    pub gate: Option<GateStatus>,
}

/// The ledger audit as the dashboard shows it: what disagrees, and each
/// sale's units.
pub struct AuditView {
    pub problems: Vec<String>,
    pub products: Vec<SaleUnits>,
}

/// One sale's units on the dashboard.
pub struct SaleUnits {
    pub id: i64,
    pub name: String,
    pub offered: i64,
    pub paid_units: i64,
    pub awaiting_units: i64,
    pub restored_units: i64,
    pub stock: i32,
}

impl AuditView {
    pub fn new(report: &AuditReport) -> AuditView {
        AuditView {
            problems: report.problems.clone(),
            products: report
                .products
                .iter()
                .map(|p| SaleUnits {
                    id: p.id,
                    name: p.name.clone(),
                    offered: p.offered(),
                    paid_units: p.paid_units,
                    awaiting_units: p.awaiting_units,
                    restored_units: p.restored_units,
                    stock: p.stock,
                })
                .collect(),
        }
    }

    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// The stock gate as the dashboard shows it.
pub struct GateStatus {
    /// (product id, name, gate stock if readable, database stock)
    pub products: Vec<(i64, String, Option<i64>, i32)>,
    pub gate_readable: bool,
    /// (when, products checked, each drift found)
    pub last_reconcile: Option<(String, usize, Vec<String>)>,
}

impl GateStatus {
    pub fn new(
        products: Vec<(i64, String, Option<i64>, i32)>,
        gate_readable: bool,
        last_reconcile: Option<LastReconcile>,
    ) -> GateStatus {
        let last_reconcile = last_reconcile.map(|(at, report)| {
            let drifts = report
                .drifts
                .iter()
                .map(|d| format!("product {}: {}", d.product, d.describe()))
                .collect();
            (timestamp(at), report.checked, drifts)
        });
        GateStatus {
            products,
            gate_readable,
            last_reconcile,
        }
    }
}

/// One option of a `<select>`.
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
    /// `orders` as found (with each buyer's email), `products` for the
    /// product filter.
    pub fn new(
        nav: Nav,
        orders: &[(Order, String)],
        products: &[Product],
        search: OrderSearch,
        pager: Pager,
    ) -> AdminOrdersPage {
        AdminOrdersPage {
            nav,
            orders: orders
                .iter()
                .map(|(order, email)| OrderRow::new(order, email))
                .collect(),
            search,
            statuses: OrderStatus::ALL
                .into_iter()
                .map(|s| Choice {
                    value: s.as_str().into(),
                    label: status_in_words(s).into(),
                })
                .collect(),
            products: products
                .iter()
                .map(|p| Choice {
                    value: p.id.to_string(),
                    label: format!("#{} {}", p.id, p.name),
                })
                .collect(),
            pager,
        }
    }

    /// The address of page `n` of the orders `search` finds.
    pub fn page_link(search: &OrderSearch) -> impl Fn(i64) -> String {
        let query_string = serde_urlencoded::to_string(search).unwrap_or_default();
        move |n| {
            if query_string.is_empty() {
                format!("/admin/orders?page={n}")
            } else {
                format!("/admin/orders?{query_string}&page={n}")
            }
        }
    }

    pub fn filtered(&self) -> bool {
        !(self.search.email.is_empty()
            && self.search.status.is_empty()
            && self.search.product.is_empty())
    }
}

/// The step between the Refund button and the refund itself.
#[derive(Template)]
#[template(path = "admin_refund.html")]
pub struct RefundConfirmPage {
    pub nav: Nav,
    pub order: OrderView,
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

/// One stock-ledger row of a sale's history.
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
    /// Links the sale's waiting room.
    pub queue_mode: bool,
    pub rows: Vec<HistoryRow>,
    pub pager: Pager,
}
