//! The admin console: the dashboard (ledger audit and stock gate), orders
//! and refunds, creating and editing sales, stock adjustments and history,
//! and the waiting rooms (counts, pause and resume, the draw).

use crate::web::session_cookie::Session;
use actix_web::http::StatusCode;
use actix_web::{get, post, web, HttpRequest, HttpResponse, ResponseError};
use chrono::Utc;

use super::forms::{
    parse_order_id, parse_product_id, AdjustForm, CsrfOnlyForm, OrderSearch, PageQuery, SaleFields,
    SavedQuery,
};
use super::idempotency::{once, Intent};
use super::session::{verify_csrf, Admin};
use super::views::admin::{
    AdminDashboardPage, AdminHistoryPage, AdminOrdersPage, AdminSaleFormPage, AuditView,
    GateStatus, HistoryRow, RefundConfirmPage,
};
use super::views::orders::{OrderPage, OrderView};
use super::views::sale::SaleView;
use super::views::waiting_room_admin::{panels_live_first, DoorPanel, QueueDashboardPage};
use super::views::{render, Nav, Pager};
use super::{html, see_other};
use crate::domain::{OrderStatus, ProductId};
use crate::error::AppError;
use crate::services::action_log::{record_done, ActionKind, AdminAction};
use crate::services::catalog::{
    create_sale_by, find_product, list_products, update_sale, SaleSpec,
};
use crate::services::door::{self, Door};
use crate::services::ledger_audit::{self, AuditReport};
use crate::services::orders::{order_detail, search_orders};
use crate::services::restore::restore_order;
use crate::services::stock::{adjust_stock, history_of};
use crate::services::stock_gate::seed_if_absent;
use crate::services::waiting_room::{queue_overviews, set_admission_paused};
use crate::services::Shop;

const ORDERS_PER_PAGE: i64 = 25;
const HISTORY_PER_PAGE: i64 = 50;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(dashboard)
        .service(resync_gate)
        .service(orders)
        .service(order_detail_page)
        .service(refund_confirm)
        .service(refund)
        .service(new_sale_page)
        .service(create_sale)
        .service(edit_sale_page)
        .service(edit_sale)
        .service(adjust)
        .service(history)
        .service(queues)
        .service(pause_queue)
        .service(resume_queue);
}

#[get("/admin")]
pub async fn dashboard(
    shop: web::Data<Shop>,
    _admin: Admin,
    session: Session,
) -> Result<HttpResponse, AppError> {
    let audit = ledger_audit::audit(&shop.pool).await?;
    let gate = gate_status(&shop, &audit).await;
    let page = AdminDashboardPage {
        nav: Nav::from_session(&session),
        audit: AuditView::new(&audit),
        gate,
    };
    Ok(html(StatusCode::OK, render(&page)?))
}

/// Each product's stock in the gate beside its stock in the database, and
/// the last reconcile; `None` when the gate is off.
async fn gate_status(shop: &Shop, audit: &AuditReport) -> Option<GateStatus> {
    let gate = shop.gate.as_ref()?;
    let mut products = Vec::new();
    let mut gate_readable = true;
    for ledger in &audit.products {
        let in_gate = gate.stock(ProductId(ledger.id)).await;
        gate_readable &= in_gate.is_ok();
        products.push((
            ledger.id,
            ledger.name.clone(),
            in_gate.ok().flatten(),
            ledger.stock,
        ));
    }
    let last_reconcile = shop
        .last_reconcile
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Some(GateStatus::new(products, gate_readable, last_reconcile))
}

/// Overwrites the product's stock gate from the database, under its lock.
#[post("/admin/products/{id}/resync-gate")]
pub async fn resync_gate(
    shop: web::Data<Shop>,
    Admin(admin): Admin,
    session: Session,
    path: web::Path<String>,
    form: web::Form<CsrfOnlyForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let product = parse_product_id(&path)?;
    find_product(&shop.pool, product).await?;
    let drift = crate::services::stock_gate::resync(&shop, product).await?;
    let detail = match (&shop.gate, drift) {
        (None, _) => "stock gate is off: nothing to resync".to_string(),
        (Some(_), Some(drift)) => drift.describe(),
        (Some(_), None) => "gate already matched the database".to_string(),
    };
    let action = AdminAction::on_product(admin.id, ActionKind::GateResync, product, detail);
    record_done(&shop.pool, action).await?;
    Ok(see_other("/admin#gate"))
}

#[get("/admin/orders")]
pub async fn orders(
    shop: web::Data<Shop>,
    _admin: Admin,
    session: Session,
    query: web::Query<OrderSearch>,
) -> Result<HttpResponse, AppError> {
    let search = query.into_inner();
    let filter = search.filter()?;
    let page = search.page_number();
    let (found, total) = search_orders(
        &shop.pool,
        filter,
        (page - 1) * ORDERS_PER_PAGE,
        ORDERS_PER_PAGE,
    )
    .await?;
    let products = list_products(&shop.pool).await?;
    let pager = Pager::new(
        page,
        ORDERS_PER_PAGE,
        total,
        AdminOrdersPage::page_link(&search),
    );
    let page = AdminOrdersPage::new(
        Nav::from_session(&session),
        &found,
        &products,
        search,
        pager,
    );
    Ok(html(StatusCode::OK, render(&page)?))
}

#[get("/admin/orders/{id}")]
pub async fn order_detail_page(
    shop: web::Data<Shop>,
    _admin: Admin,
    session: Session,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let detail = order_detail(&shop.pool, parse_order_id(&path)?, None).await?;
    let page = OrderPage {
        nav: Nav::from_session(&session),
        order: OrderView::new(detail),
        admin_view: true,
    };
    Ok(html(StatusCode::OK, render(&page)?))
}

/// The step between the Refund button and the refund itself.
#[get("/admin/orders/{id}/refund")]
pub async fn refund_confirm(
    shop: web::Data<Shop>,
    _admin: Admin,
    session: Session,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let detail = order_detail(&shop.pool, parse_order_id(&path)?, None).await?;
    let page = RefundConfirmPage {
        nav: Nav::from_session(&session),
        order: OrderView::new(detail),
    };
    Ok(html(StatusCode::OK, render(&page)?))
}

#[post("/admin/orders/{id}/refund")]
pub async fn refund(
    shop: web::Data<Shop>,
    Admin(admin): Admin,
    session: Session,
    request: HttpRequest,
    path: web::Path<String>,
    form: web::Form<CsrfOnlyForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let intent = Intent {
        request: &request,
        form_key: form.idempotency_key.as_deref(),
        fields: String::new(),
        names_order: false,
    };
    once(&shop, admin.id, intent, |_| async {
        let order = parse_order_id(&path)?;
        let action = AdminAction::on_order(
            admin.id,
            ActionKind::Refund,
            order,
            "refunded; units back in stock".to_string(),
        );
        restore_order(&shop, order, OrderStatus::Refunded, Some(action)).await?;
        Ok(see_other(&format!("/admin/orders/{order}")))
    })
    .await
}

/// A refused sale form comes back filled in as typed, with the reason on top.
fn sale_form(
    session: &Session,
    sale: Option<SaleView>,
    fields: SaleFields,
    error: Option<AppError>,
    saved: bool,
) -> Result<HttpResponse, AppError> {
    let status = error
        .as_ref()
        .map(ResponseError::status_code)
        .unwrap_or(StatusCode::OK);
    let page = AdminSaleFormPage {
        nav: Nav::from_session(session),
        sale,
        fields,
        error: error.as_ref().map(super::error::in_words),
        saved,
    };
    Ok(html(status, render(&page)?))
}

#[get("/admin/products/new")]
pub async fn new_sale_page(
    shop: web::Data<Shop>,
    _admin: Admin,
    session: Session,
) -> Result<HttpResponse, AppError> {
    let fields = SaleFields::for_new_sale(Utc::now(), shop.settings.security.door.join_work);
    sale_form(&session, None, fields, None, false)
}

#[post("/admin/products")]
pub async fn create_sale(
    shop: web::Data<Shop>,
    Admin(admin): Admin,
    session: Session,
    form: web::Form<SaleFields>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let fields = form.into_inner();
    let created = async {
        let spec = fields.spec(shop.settings.security.door.join_work)?;
        create_sale_by(&shop.pool, spec, admin.id).await
    };
    match created.await {
        Ok(product) => {
            // Seed the gate now rather than on the first buyer; failing here is
            // not fatal, the first purchase seeds it.
            if let Err(error) = seed_if_absent(&shop, vec![product.product_id()]).await {
                tracing::warn!(%error, "new sale saved, but its stock gate was not seeded yet");
            }
            Ok(see_other(&format!(
                "/admin/products/{}/edit?saved=1",
                product.id
            )))
        }
        Err(error @ AppError::Invalid(_)) => sale_form(&session, None, fields, Some(error), false),
        Err(other) => Err(other),
    }
}

#[get("/admin/products/{id}/edit")]
pub async fn edit_sale_page(
    shop: web::Data<Shop>,
    _admin: Admin,
    session: Session,
    path: web::Path<String>,
    query: web::Query<SavedQuery>,
) -> Result<HttpResponse, AppError> {
    let product = find_product(&shop.pool, parse_product_id(&path)?).await?;
    let sale = SaleView::new(&product, Utc::now());
    sale_form(
        &session,
        Some(sale),
        SaleFields::of(&SaleSpec::of(&product)),
        None,
        query.saved(),
    )
}

#[post("/admin/products/{id}/edit")]
pub async fn edit_sale(
    shop: web::Data<Shop>,
    Admin(admin): Admin,
    session: Session,
    path: web::Path<String>,
    form: web::Form<SaleFields>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let id = parse_product_id(&path)?;
    let fields = form.into_inner();
    let updated = async {
        let terms = fields.terms(shop.settings.security.door.join_work)?;
        update_sale(&shop, id, terms, admin.id).await
    };
    match updated.await {
        Ok(product) => Ok(see_other(&format!(
            "/admin/products/{}/edit?saved=1",
            product.id
        ))),
        // A refusal the queue's state makes (the draw is published, customers
        // are waiting) comes back on the form too, as typed.
        Err(error @ (AppError::Invalid(_) | AppError::Conflict(_))) => {
            let product = find_product(&shop.pool, id).await?;
            let sale = SaleView::new(&product, Utc::now());
            sale_form(&session, Some(sale), fields, Some(error), false)
        }
        Err(other) => Err(other),
    }
}

#[post("/admin/products/{id}/stock")]
pub async fn adjust(
    shop: web::Data<Shop>,
    Admin(admin): Admin,
    session: Session,
    path: web::Path<String>,
    form: web::Form<AdjustForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let product = parse_product_id(&path)?;
    let adjustment = form.adjustment()?;
    adjust_stock(&shop, product, adjustment, admin.id).await?;
    Ok(see_other(&format!("/admin/products/{product}/history")))
}

#[get("/admin/products/{id}/history")]
pub async fn history(
    shop: web::Data<Shop>,
    _admin: Admin,
    session: Session,
    path: web::Path<String>,
    query: web::Query<PageQuery>,
) -> Result<HttpResponse, AppError> {
    let id = parse_product_id(&path)?;
    let product = find_product(&shop.pool, id).await?;
    let page = query.number();
    let (rows, total) = history_of(
        &shop.pool,
        id,
        (page - 1) * HISTORY_PER_PAGE,
        HISTORY_PER_PAGE,
    )
    .await?;
    let page = AdminHistoryPage {
        nav: Nav::from_session(&session),
        sale: SaleView::new(&product, Utc::now()),
        queue_mode: product.queue_mode,
        rows: rows.iter().map(HistoryRow::new).collect(),
        pager: Pager::new(page, HISTORY_PER_PAGE, total, |n| {
            format!("/admin/products/{id}/history?page={n}")
        }),
    };
    Ok(html(StatusCode::OK, render(&page)?))
}

#[get("/admin/queues")]
pub async fn queues(
    shop: web::Data<Shop>,
    _admin: Admin,
    session: Session,
) -> Result<HttpResponse, AppError> {
    let overviews = queue_overviews(&shop).await?;
    let doors = std::iter::once(Door::SignUp)
        .chain(overviews.iter().map(|o| Door::Join(o.product.product_id())))
        .collect();
    let mut doors = door::stats_of(&shop, doors).await?.into_iter();
    let signup_door = DoorPanel::new(&doors.next().unwrap_or_default());
    let page = QueueDashboardPage {
        nav: Nav::from_session(&session),
        queues: panels_live_first(&overviews.into_iter().zip(doors).collect::<Vec<_>>()),
        signup_door,
    };
    Ok(html(StatusCode::OK, render(&page)?))
}

#[post("/admin/products/{id}/queue/pause")]
pub async fn pause_queue(
    shop: web::Data<Shop>,
    Admin(admin): Admin,
    session: Session,
    path: web::Path<String>,
    form: web::Form<CsrfOnlyForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let product = parse_product_id(&path)?;
    set_admission_paused(&shop, product, true, admin.id).await?;
    Ok(see_other(&format!("/admin/queues#queue-{product}")))
}

#[post("/admin/products/{id}/queue/resume")]
pub async fn resume_queue(
    shop: web::Data<Shop>,
    Admin(admin): Admin,
    session: Session,
    path: web::Path<String>,
    form: web::Form<CsrfOnlyForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let product = parse_product_id(&path)?;
    set_admission_paused(&shop, product, false, admin.id).await?;
    Ok(see_other(&format!("/admin/queues#queue-{product}")))
}
