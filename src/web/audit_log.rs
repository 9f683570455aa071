//! The admin audit log: who refunded, adjusted, resynced, created or edited what.

use actix_session::Session;
use actix_web::http::StatusCode;
use actix_web::{get, web, HttpResponse};
use askama::Template;

use super::admin::{page_number, PageQuery};
use super::html;
use super::pages::{iso, render, timestamp, Nav, Pager};
use super::session::Admin;
use crate::error::AppError;
use crate::services::action_log::{recent_actions, ActionKind, RecordedAction};
use crate::services::Shop;

const ACTIONS_PER_PAGE: i64 = 50;

pub struct AuditRow {
    pub at_iso: String,
    pub at_text: String,
    pub admin_email: String,
    pub action: &'static str,
    pub product_id: Option<i64>,
    pub order_id: Option<i64>,
    pub detail: String,
}

impl From<RecordedAction> for AuditRow {
    fn from(recorded: RecordedAction) -> Self {
        AuditRow {
            at_iso: iso(&recorded.created_at),
            at_text: timestamp(recorded.created_at),
            admin_email: recorded.admin_email,
            action: ActionKind::parse(&recorded.action).map_or("Other", ActionKind::label),
            product_id: recorded.product_id,
            order_id: recorded.order_id,
            detail: recorded.detail,
        }
    }
}

#[derive(Template)]
#[template(path = "admin_audit_log.html")]
pub struct AuditLogPage {
    pub nav: Nav,
    pub rows: Vec<AuditRow>,
    pub pager: Pager,
}

#[get("/admin/audit-log")]
pub async fn audit_log(
    shop: web::Data<Shop>,
    _admin: Admin,
    session: Session,
    query: web::Query<PageQuery>,
) -> Result<HttpResponse, AppError> {
    let page = page_number(&query.page);
    let (actions, total) =
        recent_actions(&shop.pool, (page - 1) * ACTIONS_PER_PAGE, ACTIONS_PER_PAGE).await?;
    let page = AuditLogPage {
        nav: Nav::from_session(&session),
        rows: actions.into_iter().map(AuditRow::from).collect(),
        pager: Pager::new(page, ACTIONS_PER_PAGE, total, |n| {
            format!("/admin/audit-log?page={n}")
        }),
    };
    Ok(html(StatusCode::OK, render(&page)?))
}
