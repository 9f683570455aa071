//! HTTP: thin handlers that parse forms into domain types, call a service,
//! and render a page or redirect (303 after every POST).
//!
//! - one file per area holds its handlers and registers its routes
//!   (`shop`, `waiting_room` (the waiting room and its draw), `cart`, `orders`,
//!   `auth`, `door` (the bot check's challenges), `account` (the address and
//!   its confirmation), `admin`, `action_log`, `mail` (the admin's view of the
//!   customer's mail), `operations`, `health`, `assets`); `routes` below puts
//!   them together;
//! - `views/` holds what each area's pages show (template structs and view
//!   data), `format` how pages write times and money;
//! - `forms` holds every form and query string the shop accepts, and their
//!   parsers;
//! - `error` turns an `AppError` into a status and a worded page;
//! - `session_cookie`, `session`, `idempotency` and `request_id` are what
//!   handlers and middleware share: the cookie that carries the session,
//!   who is asking, run-at-most-once, the request's id.
//!
//! Calls go one way: web → services/domain/db. Nothing below `web` imports it.

pub mod account;
pub mod action_log;
pub mod admin;
pub mod assets;
pub mod auth;
pub mod cart;
pub mod door;
pub mod error;
pub mod format;
pub mod forms;
pub mod health;
pub mod idempotency;
pub mod mail;
pub mod operations;
pub mod orders;
pub mod request_id;
pub mod session;
pub mod session_cookie;
pub mod shop;
pub mod views;
pub mod waiting_room;
mod words;

use actix_web::http::header;
use actix_web::{web, HttpResponse};

use crate::error::AppError;

pub const MAX_FORM_BYTES: usize = 64 * 1024;

/// The whole site: how extractors answer what they cannot read, each area's
/// pages, and a 404 page for every other address.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.app_data(
        web::FormConfig::default()
            .limit(MAX_FORM_BYTES)
            .error_handler(|error, _req| error::form_refused(error)),
    )
    .app_data(web::QueryConfig::default().error_handler(|error, _req| {
        AppError::Invalid(crate::error::Invalid::UnreadableQuery(error.to_string())).into()
    }))
    .app_data(
        web::PathConfig::default()
            .error_handler(|_error, _req| AppError::NotFound(crate::error::Missing::Page).into()),
    )
    .configure(health::routes)
    .configure(operations::routes)
    .configure(assets::routes)
    .configure(shop::routes)
    .configure(waiting_room::routes)
    .configure(auth::routes)
    .configure(door::routes)
    .configure(account::routes)
    .configure(cart::routes)
    .configure(orders::routes)
    .configure(admin::routes)
    .configure(action_log::routes)
    .configure(mail::routes)
    .default_service(web::to(|| async {
        Err::<HttpResponse, _>(AppError::NotFound(crate::error::Missing::Page))
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
