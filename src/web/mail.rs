//! `/admin/mail`: the customer's mail as the shop wrote it, sent or waiting.

use crate::web::session_cookie::Session;
use actix_web::http::StatusCode;
use actix_web::{get, web, HttpResponse};

use super::html;
use super::session::Admin;
use super::views::mail::{MailPage, MailRow};
use super::views::{render, Nav};
use crate::error::AppError;
use crate::services::mail::recent;
use crate::services::Shop;

const MESSAGES_SHOWN: i64 = 100;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(mail_page);
}

#[get("/admin/mail")]
pub async fn mail_page(
    shop: web::Data<Shop>,
    _admin: Admin,
    session: Session,
) -> Result<HttpResponse, AppError> {
    let messages = recent(&shop, MESSAGES_SHOWN).await?;
    let page = MailPage {
        nav: Nav::from_session(&session),
        sending: shop.settings.smtp_url.is_some(),
        rows: messages
            .into_iter()
            .map(MailRow::from)
            .map(|row| match shop.settings.smtp_url {
                // Mail goes out: a link that confirms someone's address is
                // theirs to open, not the admin's.
                Some(_) => row.without_confirmation_links(),
                None => row,
            })
            .collect(),
    };
    Ok(html(StatusCode::OK, render(&page)?))
}
