use actix_session::Session;
use actix_web::http::StatusCode;
use actix_web::{get, post, web, HttpRequest, HttpResponse};
use chrono::Utc;

use super::forms::{parse_product_id, BuyForm};
use super::idempotency::{once, Intent};
use super::pages::{render, Nav, ProductPage, SaleListPage, SaleView};
use super::session::{verify_csrf, SignedIn};
use super::{html, see_other};
use crate::error::AppError;
use crate::services::catalog::{find_product, list_products};
use crate::services::purchase::{purchase, Line};
use crate::services::Shop;

#[get("/")]
pub async fn sale_list(shop: web::Data<Shop>, session: Session) -> Result<HttpResponse, AppError> {
    let now = Utc::now();
    let sales = list_products(&shop.pool)
        .await?
        .iter()
        .map(|p| SaleView::new(p, now))
        .collect();
    let page = SaleListPage {
        nav: Nav::from_session(&session),
        sales,
    };
    Ok(html(StatusCode::OK, render(&page)?))
}

#[get("/products/{id}")]
pub async fn product_page(
    shop: web::Data<Shop>,
    session: Session,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let product = find_product(&shop.pool, parse_product_id(&path)?).await?;
    let page = ProductPage {
        nav: Nav::from_session(&session),
        sale: SaleView::new(&product, Utc::now()),
    };
    Ok(html(StatusCode::OK, render(&page)?))
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
    };
    once(&shop, account.id, intent, || async {
        let product = parse_product_id(&path)?;
        let quantity = form.quantity()?;
        let order = purchase(&shop, account.id, vec![Line { product, quantity }])
            .await?
            .into_result()?;
        Ok(see_other(&format!("/orders/{order}")))
    })
    .await
}
