use crate::web::session_cookie::Session;
use actix_web::http::StatusCode;
use actix_web::{get, post, web, HttpRequest, HttpResponse, ResponseError};

use super::forms::{parse_order_id, CsrfOnlyForm, PayForm};
use super::idempotency::{once, Intent};
use super::session::{verify_csrf, SignedIn};
use super::views::orders::{customer_row, OrderPage, OrderView, OrdersPage};
use super::views::{render, Nav};
use super::{html, see_other};
use crate::domain::{CustomerId, OrderId};
use crate::error::AppError;
use crate::services::confirmation::is_confirmed;
use crate::services::orders::{order_detail, orders_of};
use crate::services::payment::{give_up, pay as pay_order};
use crate::services::Shop;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(my_orders)
        .service(order_page)
        .service(pay)
        .service(cancel);
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
        .map(|o| customer_row(o, &account.email))
        .collect();
    let page = OrdersPage {
        nav: Nav::from_session(&session),
        orders,
        unconfirmed: !is_confirmed(&shop, account.id).await?,
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
    customer_order_page(&shop, &session, account.id, parse_order_id(&path)?, None).await
}

/// The customer's order page; with `card_error`, the pay form answers a
/// card number that could not be sent (422), so the customer stays on
/// the order, with its deadline and their menu, and types it again.
async fn customer_order_page(
    shop: &Shop,
    session: &Session,
    customer: CustomerId,
    order: OrderId,
    card_error: Option<AppError>,
) -> Result<HttpResponse, AppError> {
    let detail = order_detail(&shop.pool, order, Some(customer)).await?;
    let status = card_error
        .as_ref()
        .map_or(StatusCode::OK, ResponseError::status_code);
    let mut order = OrderView::new(detail);
    order.payment_error = card_error.as_ref().map(super::error::in_words);
    let page = OrderPage {
        nav: Nav::from_session(session),
        order,
        admin_view: false,
    };
    Ok(html(status, render(&page)?))
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
    let order = parse_order_id(&path)?;
    // Checked before the key is claimed: a mistyped number changes nothing.
    let card = match form.card() {
        Ok(card) => card,
        Err(error) => {
            return customer_order_page(&shop, &session, account.id, order, Some(error)).await
        }
    };
    let intent = Intent {
        request: &request,
        form_key: form.idempotency_key.as_deref(),
        fields: format!("card_number={}", form.card_number),
        names_order: false,
    };
    once(&shop, account.id, intent, |_| async {
        pay_order(&shop, account.id, order, card).await?;
        Ok(see_other(&format!("/orders/{order}")))
    })
    .await
}

/// The customer gives up an unpaid order: its units go back now.
#[post("/orders/{id}/cancel")]
pub async fn cancel(
    shop: web::Data<Shop>,
    SignedIn(account): SignedIn,
    session: Session,
    path: web::Path<String>,
    form: web::Form<CsrfOnlyForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let order = parse_order_id(&path)?;
    give_up(&shop, account.id, order).await?;
    Ok(see_other(&format!("/orders/{order}")))
}
