use crate::web::session_cookie::Session;
use actix_web::http::StatusCode;
use actix_web::{get, post, web, HttpRequest, HttpResponse};

use super::forms::{parse_order_id, PayForm};
use super::idempotency::{once, Intent};
use super::session::{verify_csrf, SignedIn};
use super::views::orders::{OrderPage, OrderRow, OrderView, OrdersPage};
use super::views::{render, Nav};
use super::{html, see_other};
use crate::error::AppError;
use crate::services::orders::{order_detail, orders_of};
use crate::services::payment::pay as pay_order;
use crate::services::Shop;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(my_orders).service(order_page).service(pay);
}

#[get("/orders")]
pub async fn my_orders(
    shop: web::Data<Shop>,
    SignedIn(account): SignedIn,
    session: Session,
) -> Result<HttpResponse, AppError> {
    let orders = orders_of(&shop.pool, account.id)
        .await?
        .iter()
        .map(|o| OrderRow::new(o, &account.email))
        .collect();
    let page = OrdersPage {
        nav: Nav::from_session(&session),
        orders,
    };
    Ok(html(StatusCode::OK, render(&page)?))
}

#[get("/orders/{id}")]
pub async fn order_page(
    shop: web::Data<Shop>,
    SignedIn(account): SignedIn,
    session: Session,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let detail = order_detail(&shop.pool, parse_order_id(&path)?, Some(account.id)).await?;
    let page = OrderPage {
        nav: Nav::from_session(&session),
        order: OrderView::new(detail),
        admin_view: false,
    };
    Ok(html(StatusCode::OK, render(&page)?))
}

/// Approved or declined, the answer is the order page, which shows the outcome.
#[post("/orders/{id}/pay")]
pub async fn pay(
    shop: web::Data<Shop>,
    SignedIn(account): SignedIn,
    session: Session,
    request: HttpRequest,
    path: web::Path<String>,
    form: web::Form<PayForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let intent = Intent {
        request: &request,
        form_key: form.idempotency_key.as_deref(),
        fields: format!("card_number={}", form.card_number),
        names_order: false,
    };
    once(&shop, account.id, intent, |_| async {
        let order = parse_order_id(&path)?;
        let card = form.card()?;
        pay_order(&shop, account.id, order, card).await?;
        Ok(see_other(&format!("/orders/{order}")))
    })
    .await
}
