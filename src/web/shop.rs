use std::future::Future;

use crate::web::session_cookie::{Session, SessionStatus};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{get, post, route, web, HttpRequest, HttpResponse};
use chrono::Utc;

use super::forms::{parse_product_id, BuyForm};
use super::html;
use super::idempotency::{purchase_once, Intent};
use super::session::{verify_csrf, SignedIn};
use super::views::sale::SaleView;
use super::views::shop::{ProductPage, SaleListPage};
use super::views::waiting_room::{rfc3339, ProductQueue};
use super::views::{render, Nav};
use super::waiting_room::standing;
use crate::domain::{OrderId, SaleState};
use crate::error::AppError;
use crate::metrics;
use crate::services::catalog::{sale_on_show, sales_on_show};
use crate::services::checkout::{purchase_with_pass, Line, PurchaseOutcome};
use crate::services::{confirmation, Shop};

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(sale_list).service(product_page).service(buy);
}

/// GET and HEAD: monitors and link checkers ask with HEAD (actix drops the body).
#[route("/", method = "GET", method = "HEAD")]
pub async fn sale_list(shop: web::Data<Shop>, session: Session) -> Result<HttpResponse, AppError> {
    let shown = sales_on_show(&shop).await?;
    let now = Utc::now();
    let mut sales = Vec::with_capacity(shown.len());
    for sale in &shown {
        let mut view = SaleView::showing(&sale.product, sale.units_left, now);
        if view.queue_mode && matches!(view.state, SaleState::Live | SaleState::SoldOut) {
            // The room's count, from this process's snapshot, as on the
            // product page; without it the list falls back to the stock.
            if let Ok(status) = standing(&shop, None, sale).await {
                ProductQueue::new(&sale.product, Some(&status), now).count_into(&mut view);
            }
        }
        sales.push(view);
    }
    let page = SaleListPage {
        nav: Nav::for_shared_page(&session),
        sales,
    };
    Ok(shared_page(&session, &page.nav, render(&page)?))
}

#[get("/products/{id}")]
pub async fn product_page(
    shop: web::Data<Shop>,
    session: Session,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let product = parse_product_id(&path)?;
    let shown = sale_on_show(&shop, product).await?;
    let nav = Nav::for_shared_page(&session);
    let now = Utc::now();
    let queue = if shown.product.queue_mode {
        // The room as its waiting page shows it (from this process's
        // snapshot). If it cannot be read the page still offers to join
        // (joining again keeps the same place, and says so if it fails).
        let customer = nav.account.as_ref().map(|a| a.id);
        let status = standing(&shop, customer, &shown).await.ok();
        Some(ProductQueue::new(&shown.product, status.as_ref(), now))
    } else {
        None
    };
    let page = ProductPage::new(
        nav,
        SaleView::showing(&shown.product, shown.units_left, now),
        queue,
        rfc3339(now),
    );
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
    confirmation::vouched_by_session(&shop, account.id, account.confirmed);
    let pass = form.pass()?;
    let intent = Intent {
        request: &request,
        form_key: form.idempotency_key.as_deref(),
        // A key sent again with another pass is another request.
        fields: match &pass {
            Some(pass) => format!("quantity={}\npass={pass}", form.quantity),
            None => format!("quantity={}", form.quantity),
        },
        names_order: true,
    };
    purchase_once(&shop, account.id, intent, |answer_key| async {
        counted(
            async {
                let line = Line {
                    product: parse_product_id(&path)?,
                    quantity: form.quantity()?,
                };
                purchase_with_pass(&shop, account.id, line, answer_key?, pass).await
            }
            .await,
        )
    })
    .await
}

/// Runs a purchase attempt (parsing included, so refused input counts too)
/// and counts what it came to in `flashsale_purchases_total`. Replays of a
/// claim in Postgres never get here; replays the gate answers count as such.
pub(super) async fn counted_purchase(
    attempt: impl Future<Output = Result<PurchaseOutcome, AppError>>,
) -> Result<OrderId, AppError> {
    counted(attempt.await)?.into_result()
}

fn counted(attempt: Result<PurchaseOutcome, AppError>) -> Result<PurchaseOutcome, AppError> {
    metrics::purchase_outcome(outcome_label(&attempt));
    attempt
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
