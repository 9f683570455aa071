use actix_session::Session;
use actix_web::http::StatusCode;
use actix_web::{get, post, web, HttpRequest, HttpResponse};

use super::auth::CsrfOnlyForm;
use super::idempotency::{once, Intent};
use super::orders::parse_order_id;
use super::pages::{render, AdminDashboardPage, AdminOrdersPage, Nav, OrderPage, OrderRow};
use super::session::{verify_csrf, Admin};
use super::{html, see_other};
use crate::db;
use crate::domain::OrderStatus;
use crate::error::AppError;
use crate::services::audit::run_audit;
use crate::services::orders::{order_detail, recent_orders};
use crate::services::restore::restore_order;
use crate::services::Shop;

#[get("/admin")]
pub async fn dashboard(
    shop: web::Data<Shop>,
    _admin: Admin,
    session: Session,
) -> Result<HttpResponse, AppError> {
    let audit = db::run(&shop.pool, run_audit).await?;
    let page = AdminDashboardPage {
        nav: Nav::from_session(&session),
        audit,
    };
    Ok(html(StatusCode::OK, render(&page)?))
}

#[get("/admin/orders")]
pub async fn orders(
    shop: web::Data<Shop>,
    _admin: Admin,
    session: Session,
) -> Result<HttpResponse, AppError> {
    let orders = recent_orders(&shop.pool, 200)
        .await?
        .iter()
        .map(|(order, email)| OrderRow::new(order, email))
        .collect();
    let page = AdminOrdersPage {
        nav: Nav::from_session(&session),
        orders,
    };
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
        detail,
        admin_view: true,
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
    };
    once(&shop, admin.id, intent, || async {
        let order = parse_order_id(&path)?;
        restore_order(&shop, order, OrderStatus::Refunded).await?;
        Ok(see_other(&format!("/admin/orders/{order}")))
    })
    .await
}
