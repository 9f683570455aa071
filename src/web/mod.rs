//! HTTP: thin handlers that parse forms into domain types, call a service,
//! and render a page or redirect (303 after every POST).

pub mod admin;
pub mod audit_log;
pub mod auth;
pub mod cart;
pub mod error;
pub mod forms;
pub mod health;
pub mod idempotency;
pub mod operations;
pub mod orders;
pub mod pages;
pub mod request_id;
pub mod session;
pub mod shop;

use actix_web::error::{InternalError, UrlencodedError};
use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpResponse};

use crate::error::AppError;
use pages::{render, ErrorPage};

pub const MAX_FORM_BYTES: usize = 64 * 1024;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.app_data(
        web::FormConfig::default()
            .limit(MAX_FORM_BYTES)
            .error_handler(|error, _req| form_refused(error)),
    )
    .app_data(web::QueryConfig::default().error_handler(|error, _req| {
        AppError::Invalid(format!("The address could not be read: {error}.")).into()
    }))
    .app_data(web::PathConfig::default().error_handler(|_error, _req| {
        AppError::NotFound("There is no page at this address.".into()).into()
    }))
    .service(health::healthz)
    .service(health::readyz)
    .service(health::metrics_text)
    .service(operations::operations)
    .service(pages::stylesheet)
    .service(pages::script)
    .service(shop::sale_list)
    .service(shop::product_page)
    .service(shop::buy)
    .service(auth::signup_page)
    .service(auth::signup)
    .service(auth::login_page)
    .service(auth::login)
    .service(auth::logout)
    .service(cart::cart_page)
    .service(cart::add)
    .service(cart::update)
    .service(cart::remove)
    .service(cart::checkout)
    .service(orders::my_orders)
    .service(orders::order_page)
    .service(orders::pay)
    .service(admin::dashboard)
    .service(admin::resync_gate)
    .service(admin::orders)
    .service(admin::order_detail_page)
    .service(admin::refund_confirm)
    .service(admin::refund)
    .service(admin::new_sale_page)
    .service(admin::create_sale)
    .service(admin::edit_sale_page)
    .service(admin::edit_sale)
    .service(admin::adjust)
    .service(admin::history)
    .service(audit_log::audit_log)
    .default_service(web::to(|| async {
        Err::<HttpResponse, _>(AppError::NotFound(
            "There is no page at this address.".into(),
        ))
    }));
}

pub fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, location))
        .finish()
}

pub fn html(status: actix_web::http::StatusCode, body: String) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(body)
}

/// A POST body that is not a form this shop could have sent: too large, or
/// not `application/x-www-form-urlencoded` (JSON, multipart, plain text, no
/// type at all). Nothing was read, so nothing was changed.
fn form_refused(error: UrlencodedError) -> actix_web::Error {
    let (status, message) = match &error {
        UrlencodedError::Overflow { .. } => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "The form you sent is larger than the {} KiB this shop accepts, so it was not read and nothing was changed.",
                MAX_FORM_BYTES / 1024
            ),
        ),
        UrlencodedError::ContentType => (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "This address only takes a web form as the shop's own pages send it (application/x-www-form-urlencoded), so nothing was changed.".to_string(),
        ),
        other => (
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("The form could not be read ({other}), so nothing was changed."),
        ),
    };
    let page = ErrorPage {
        status: status.as_u16(),
        title: "Please check what you sent",
        message: &message,
    };
    let response = match render(&page) {
        Ok(body) => html(status, body),
        Err(error) => return error.into(),
    };
    InternalError::from_response(error, response).into()
}
