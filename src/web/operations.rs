//! The admin "Operations" page: this process's metrics as tables for people
//! (`views::operations` lays them out).

use crate::web::session_cookie::Session;
use actix_web::http::StatusCode;
use actix_web::{get, web, HttpResponse};

use super::html;
use super::session::Admin;
use super::views::operations::OperationsPage;
use super::views::{render, Nav};
use crate::error::AppError;
use crate::metrics;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(operations);
}

#[get("/admin/operations")]
pub async fn operations(_admin: Admin, session: Session) -> Result<HttpResponse, AppError> {
    let page = OperationsPage::new(Nav::from_session(&session), metrics::snapshot());
    Ok(html(StatusCode::OK, render(&page)?))
}
