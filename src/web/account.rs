//! The account's address: the confirmation link, the address page and
//! asking for a new link.

use crate::web::session_cookie::Session;
use actix_web::http::StatusCode;
use actix_web::{get, post, web, HttpResponse};

use super::forms::{ConfirmQuery, CsrfOnlyForm};
use super::session::{verify_csrf, SignedIn};
use super::views::account::{AddressPage, ConfirmPage};
use super::views::{render, Nav};
use super::{html, see_other};
use crate::error::AppError;
use crate::services::confirmation::{self, Confirmation, Resend};
use crate::services::Shop;
use crate::web::format::timestamp;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(confirm).service(address).service(resend);
}

/// Opening a confirmation link (from the mail, in any browser).
#[get("/account/confirm")]
pub async fn confirm(
    shop: web::Data<Shop>,
    session: Session,
    query: web::Query<ConfirmQuery>,
) -> Result<HttpResponse, AppError> {
    let outcome = match query.link() {
        Some(link) => confirmation::confirm(&shop, link).await?,
        None => Confirmation::Invalid,
    };
    let (status, title, message, offer_new_link) = match outcome {
        Confirmation::Confirmed { email } => (
            StatusCode::OK,
            "Email address confirmed",
            format!("Thank you: {email} is confirmed. You can now join waiting rooms."),
            false,
        ),
        Confirmation::AlreadyConfirmed { email } => (
            StatusCode::OK,
            "Email address confirmed",
            format!("{email} was already confirmed; nothing else to do."),
            false,
        ),
        Confirmation::Invalid => (
            StatusCode::BAD_REQUEST,
            "This link does not work",
            "This confirmation link is not one we sent, or it was changed on the way (or it was for an address this account no longer has), so nothing was confirmed. Ask for a new link and open it from the newest message.".to_string(),
            true,
        ),
        Confirmation::Expired => (
            StatusCode::GONE,
            "This link has expired",
            "Confirmation links work for 48 hours and this one is older, so nothing was confirmed. Ask for a new link.".to_string(),
            true,
        ),
        Confirmation::AddressTaken { email } => (
            StatusCode::CONFLICT,
            "This address already belongs to another account",
            format!("Another account of ours is already confirmed with {email} (or the same mailbox written differently), so this account was not confirmed. Sign in to that account instead."),
            false,
        ),
    };
    let page = ConfirmPage {
        nav: Nav::from_session(&session),
        title,
        message,
        offer_new_link,
    };
    Ok(html(status, render(&page)?))
}

#[get("/account/email")]
pub async fn address(
    shop: web::Data<Shop>,
    SignedIn(account): SignedIn,
    session: Session,
) -> Result<HttpResponse, AppError> {
    let state = confirmation::address_state(&shop, account.id).await?;
    let page = AddressPage::new(Nav::from_session(&session), state, None);
    Ok(html(StatusCode::OK, render(&page)?))
}

#[post("/account/email/resend")]
pub async fn resend(
    shop: web::Data<Shop>,
    SignedIn(account): SignedIn,
    session: Session,
    form: web::Form<CsrfOnlyForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    match confirmation::resend(&shop, account.id).await? {
        Resend::Sent | Resend::AlreadyConfirmed => Ok(see_other("/account/email")),
        Resend::TooSoon { from } => {
            let state = confirmation::address_state(&shop, account.id).await?;
            let message = format!(
                "A link was sent less than 5 minutes ago, so no new one was sent. Check your mailbox (and its spam folder); you can ask for another from {}.",
                timestamp(from)
            );
            let page = AddressPage::new(Nav::from_session(&session), state, Some(message));
            Ok(html(StatusCode::TOO_MANY_REQUESTS, render(&page)?))
        }
    }
}
