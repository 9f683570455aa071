use std::future::Future;

use actix_session::{Session, SessionStatus};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{get, post, web, HttpRequest, HttpResponse};
use chrono::Utc;

use super::forms::{parse_product_id, BuyForm};
use super::idempotency::{answer_kept, once, Intent};
use super::session::{verify_csrf, SignedIn};
use super::views::shop::{ProductPage, SaleListPage, SaleView};
use super::views::{render, Nav};
use super::{html, see_other};
use crate::domain::OrderId;
use crate::error::AppError;
use crate::metrics;
use crate::services::catalog::{sale_on_show, sales_on_show};
use crate::services::checkout::{purchase, Line, PurchaseOutcome};
use crate::services::Shop;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(sale_list).service(product_page).service(buy);
}

#[get("/")]
pub async fn sale_list(shop: web::Data<Shop>, session: Session) -> Result<HttpResponse, AppError> {
    let shown = sales_on_show(&shop).await?;
    let now = Utc::now();
    let page = SaleListPage {
        nav: Nav::for_shared_page(&session),
        sales: shown
            .iter()
            .map(|s| SaleView::showing(&s.product, s.units_left, now))
            .collect(),
    };
    Ok(shared_page(&session, &page.nav, render(&page)?))
}

#[get("/products/{id}")]
pub async fn product_page(
    shop: web::Data<Shop>,
    session: Session,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let shown = sale_on_show(&shop, parse_product_id(&path)?).await?;
    let page = ProductPage {
        nav: Nav::for_shared_page(&session),
        sale: SaleView::showing(&shown.product, shown.units_left, Utc::now()),
    };
    Ok(shared_page(&session, &page.nav, render(&page)?))
}

/// A stranger's copy of a shop page is the same for every stranger, so a
/// CDN may keep it for a second (as old as the page's own data may be);
/// one that names an account or carries a cookie change is nobody else's.
fn shared_page(session: &Session, nav: &Nav, body: String) -> HttpResponse {
    let shareable = nav.account.is_none() && session.status() == SessionStatus::Unchanged;
    let mut response = html(StatusCode::OK, body);
    let headers = response.headers_mut();
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(if shareable {
            "public, max-age=1"
        } else {
            "private, no-store"
        }),
    );
    headers.insert(header::VARY, HeaderValue::from_static("Cookie"));
    response
}

#[post("/products/{id}/buy")]
pub async fn buy(
    shop: web::Data<Shop>,
    SignedIn(account): SignedIn,
    session: Session,
    request: HttpRequest,
    path: web::Path<String>,
    form: web::Form<BuyForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let intent = Intent {
        request: &request,
        form_key: form.idempotency_key.as_deref(),
        fields: format!("quantity={}", form.quantity),
        names_order: true,
    };
    once(&shop, account.id, intent, |key| async {
        let order = counted_purchase(async {
            let product = parse_product_id(&path)?;
            let quantity = form.quantity()?;
            purchase(&shop, account.id, vec![Line { product, quantity }], key).await
        })
        .await?;
        Ok(answer_kept(see_other(&format!("/orders/{order}"))))
    })
    .await
}

/// Runs a purchase attempt (parsing included, so refused input counts too)
/// and counts what it came to in `flashsale_purchases_total`. Idempotent
/// replays never get here, so each attempt is counted once.
pub(super) async fn counted_purchase(
    attempt: impl Future<Output = Result<PurchaseOutcome, AppError>>,
) -> Result<OrderId, AppError> {
    let attempt = attempt.await;
    metrics::purchase_outcome(outcome_label(&attempt));
    attempt?.into_result()
}

fn outcome_label(attempt: &Result<PurchaseOutcome, AppError>) -> &'static str {
    match attempt {
        Ok(outcome) => outcome.kind(),
        Err(AppError::Busy) => "busy",
        Err(AppError::Unavailable(_)) => "unavailable",
        Err(AppError::OutcomeUnknown(_)) => "outcome_unknown",
        Err(AppError::Invalid(_) | AppError::NotFound(_)) => "invalid",
        Err(_) => "error",
    }
}
