//! The waiting room's pages: joining, the waiting page and the `queue.json`
//! it polls, and the published draw (`draw.json` and its page).
//!
//! `queue.json` is polled by every waiter every few seconds, so it costs
//! what a sold-out answer costs: the session is checked from its cookie
//! (and this process's revocation list), the sale comes from the sale
//! cache, and the standing from this process's snapshot of the room. No
//! template, and Postgres only when the snapshot is due.

use crate::web::session_cookie::{Session, SessionStatus};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{get, post, web, HttpRequest, HttpResponse};
use chrono::Utc;

use super::door::client_ip;
use super::forms::parse_product_id;
use super::session::{verify_csrf, SignedIn};
use super::views::draw::DrawPage;
use super::views::sale::SaleView;
use super::views::waiting_room::{QueuePage, WaitingRoomView};
use super::views::{render, Nav};
use super::{html, see_other};
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::services::catalog::{sale_on_show, ShownSale};
use crate::services::waiting_room::{self, draw_record, QueueSale, QueueStatus};
use crate::services::Shop;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(join)
        .service(waiting_page)
        .service(status_json)
        .service(draw_json)
        .service(draw_page);
}

#[derive(Debug, serde::Deserialize)]
pub struct JoinForm {
    #[serde(default)]
    pub csrf_token: String,
    /// The solved bot check, as the ALTCHA widget puts it in the form.
    #[serde(default)]
    pub altcha: String,
}

/// Joins the waiting room (joining again keeps the same place) and sends
/// the customer to the waiting page.
#[post("/products/{id}/queue")]
pub async fn join(
    shop: web::Data<Shop>,
    SignedIn(account): SignedIn,
    session: Session,
    request: HttpRequest,
    path: web::Path<String>,
    form: web::Form<JoinForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let product = parse_product_id(&path)?;
    let ip = client_ip(&request, &shop.settings.security.trusted_proxies);
    let bot_check = form.into_inner().altcha;
    waiting_room::join_at_door(&shop, account.id, product, bot_check, ip).await?;
    Ok(see_other(&waiting_page_path(product)))
}

pub fn waiting_page_path(product: ProductId) -> String {
    format!("/products/{product}/queue")
}

/// The signed-in customer, or None for a stranger. A session that could
/// not be checked (Postgres down while the revocation list is stale) is an
/// error, not a stranger: a waiter must not read "not joined" for it.
fn customer(signed_in: Result<SignedIn, AppError>) -> Result<Option<SignedIn>, AppError> {
    match signed_in {
        Ok(signed_in) => Ok(Some(signed_in)),
        Err(AppError::SignInRequired { .. }) => Ok(None),
        Err(error) => Err(error),
    }
}

/// Only a sale in queue mode has a waiting room.
fn no_waiting_room(product: ProductId) -> AppError {
    AppError::NotFound(crate::error::Missing::WaitingRoom(product))
}

#[get("/products/{id}/queue")]
pub async fn waiting_page(
    shop: web::Data<Shop>,
    signed_in: Result<SignedIn, AppError>,
    session: Session,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let product = parse_product_id(&path)?;
    let account = customer(signed_in)?;
    let shown = sale_on_show(&shop, product).await?;
    if !shown.product.queue_mode {
        return Err(no_waiting_room(product));
    }
    let status = standing(&shop, account.as_ref().map(|a| a.0.id), &shown).await?;
    let now = Utc::now();
    let room = WaitingRoomView::new(status, account.is_some(), now);
    // A customer's page carries the form token (join and buy forms); a
    // stranger's starts no session.
    let nav = if account.is_some() {
        Nav::from_session(&session)
    } else {
        Nav::for_shared_page(&session)
    };
    let page = QueuePage::new(nav, &shown.product, shown.units_left, room);
    let mut response = html(StatusCode::OK, render(&page)?);
    no_store(&mut response);
    Ok(response)
}

#[get("/products/{id}/queue.json")]
pub async fn status_json(
    shop: web::Data<Shop>,
    signed_in: Result<SignedIn, AppError>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let product = parse_product_id(&path)?;
    let account = customer(signed_in)?;
    // The sale cache and the gate's counts as the product page reads them
    // (in memory, refreshed a few times a second at most).
    let shown = sale_on_show(&shop, product).await?;
    if !shown.product.queue_mode {
        return Err(no_waiting_room(product));
    }
    let status = standing(&shop, account.as_ref().map(|a| a.0.id), &shown).await?;
    let room = WaitingRoomView::new(status, account.is_some(), Utc::now());
    let mut response = HttpResponse::Ok().json(room.json());
    no_store(&mut response);
    Ok(response)
}

/// `customer`'s standing. Before the opening nobody can have joined and
/// the room has no seed yet, so the answer is known without asking: not
/// joined, the units on sale, nothing held.
pub async fn standing(
    shop: &Shop,
    customer: Option<CustomerId>,
    shown: &ShownSale,
) -> Result<QueueStatus, AppError> {
    let product = &shown.product;
    let sale = QueueSale::of(product).ok_or_else(|| no_waiting_room(product.product_id()))?;
    if !sale.is_open(Utc::now()) {
        return Ok(waiting_room::before_opening(
            shop,
            &sale,
            i64::from(shown.units_left),
        ));
    }
    waiting_room::status(shop, customer, product.product_id()).await
}

/// Per customer and changing by the second: no cache may keep it.
fn no_store(response: &mut HttpResponse) {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::VARY, HeaderValue::from_static("Cookie"));
}

/// The same for everyone and rebuilt at most once a second per process:
/// a CDN may keep it for that second too, unless this answer names an
/// account or changes a cookie (the session check may empty a revoked one).
fn shared_for_a_second(session: &Session, named: bool, response: &mut HttpResponse) {
    let shareable = !named && session.status() == SessionStatus::Unchanged;
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
}

#[get("/products/{id}/draw.json")]
pub async fn draw_json(
    shop: web::Data<Shop>,
    session: Session,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let record = draw_record(&shop, parse_product_id(&path)?).await?;
    let mut response = HttpResponse::Ok().json(&*record);
    shared_for_a_second(&session, false, &mut response);
    Ok(response)
}

#[get("/products/{id}/draw")]
pub async fn draw_page(
    shop: web::Data<Shop>,
    session: Session,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let product = parse_product_id(&path)?;
    let record = draw_record(&shop, product).await?;
    let shown = sale_on_show(&shop, product).await?;
    let nav = Nav::for_shared_page(&session);
    let named = nav.account.is_some();
    let sale = SaleView::showing(&shown.product, shown.units_left, Utc::now());
    // A signed-in reader's page is theirs alone (not shared): it marks
    // their own ticket.
    let my_ticket = match nav.account.as_ref() {
        Some(account) => standing(&shop, Some(account.id), &shown)
            .await
            .ok()
            .and_then(|status| status.ticket)
            .map(|ticket| ticket.as_str().to_string()),
        None => None,
    };
    let mut page = DrawPage::new(nav, sale, &record);
    page.my_ticket = my_ticket;
    let mut response = html(StatusCode::OK, render(&page)?);
    shared_for_a_second(&session, named, &mut response);
    Ok(response)
}
