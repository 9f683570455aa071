//! The admin action log: who refunded, adjusted, resynced, created or edited
//! what. Its address stays `/admin/audit-log`.

use crate::web::session_cookie::Session;
use actix_web::http::StatusCode;
use actix_web::{get, web, HttpResponse};

use super::forms::PageQuery;
use super::html;
use super::session::Admin;
use super::views::action_log::{ActionLogPage, ActionRow};
use super::views::{render, Nav, Pager};
use crate::error::AppError;
use crate::services::action_log::recent_actions;
use crate::services::Shop;

const ACTIONS_PER_PAGE: i64 = 50;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(action_log);
}

#[get("/admin/audit-log")]
pub async fn action_log(
    shop: web::Data<Shop>,
    _admin: Admin,
    session: Session,
    query: web::Query<PageQuery>,
) -> Result<HttpResponse, AppError> {
    let page = query.number();
    let (actions, total) =
        recent_actions(&shop.pool, (page - 1) * ACTIONS_PER_PAGE, ACTIONS_PER_PAGE).await?;
    let page = ActionLogPage {
        nav: Nav::from_session(&session),
        rows: actions.into_iter().map(ActionRow::from).collect(),
        pager: Pager::new(page, ACTIONS_PER_PAGE, total, |n| {
            format!("/admin/audit-log?page={n}")
        }),
    };
    Ok(html(StatusCode::OK, render(&page)?))
}
