//! How an `AppError` reaches a person: its status, its headers and a page
//! worded for the customer. The only place the error type meets HTTP. A form
//! body actix refuses before any handler runs gets the same page.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use actix_web::error::{InternalError, UrlencodedError};
use actix_web::http::{header, StatusCode};
use actix_web::web::Bytes;
use actix_web::{HttpResponse, ResponseError};
use askama::Template;

use super::views::render;
use super::words::{conflict_in_words, invalid_in_words, missing_in_words, not_allowed_in_words};
use super::{html, MAX_FORM_BYTES};
use crate::domain::{Refusal, SaleState};
use crate::error::{AppError, DoorRefusal, PassRefusal};

#[derive(Template)]
#[template(path = "error.html")]
pub struct ErrorPage<'a> {
    pub status: u16,
    pub title: &'a str,
    pub message: &'a str,
}

/// What a form shown again with `error` says above its fields.
pub fn in_words(error: &AppError) -> String {
    title_and_message(error).1.into_owned()
}

/// The heading and the explanation a customer reads for `error`.
fn title_and_message(error: &AppError) -> (&'static str, Cow<'static, str>) {
    match error {
        AppError::Invalid(invalid) => ("Please check what you entered", invalid_in_words(invalid)),
        AppError::NotFound(missing) => ("Not found", missing_in_words(missing)),
        AppError::Forbidden(not_allowed) => ("Not allowed", not_allowed_in_words(*not_allowed).into()),
        AppError::SignInRequired { .. } => ("Sign in required", "Sign in to continue.".into()),
        AppError::BadCsrf => (
            "This form has expired",
            "The form you sent was not issued to this session (it may be old, or come from another site). Nothing was changed. Go back, reload the page and try again.".into(),
        ),
        AppError::Refused(refusal) => refusal_in_words(refusal),
        AppError::PassRefused(refusal) => pass_refusal_in_words(*refusal),
        AppError::DoorRefused(refusal) => door_refusal_in_words(*refusal),
        AppError::Conflict(conflict) => conflict_in_words(conflict),
        AppError::KeyReused => (
            "Conflicting reuse of key",
            "This form's one-time key was already used for a different request, so nothing was done. Reload the page and try again.".into(),
        ),
        AppError::KeyInProgress | AppError::KeyTaken => (
            "Already in progress",
            "This request is still being processed (or was interrupted). Check My orders before trying again.".into(),
        ),
        AppError::TooManyAttempts { retry_after } => (
            "Too many sign-in attempts",
            Cow::Owned(format!(
                "There have been too many unsuccessful sign-in attempts for this account or from your network, so signing in is paused. Try again in {}.",
                wait_in_words(*retry_after)
            )),
        ),
        AppError::Busy => (
            "Too many buyers right now",
            "So many people are buying this item at this moment that we could not serve you in time. Nothing was charged or reserved. Please try again in a moment.".into(),
        ),
        AppError::Unavailable(_) => (
            "The shop is briefly unavailable",
            "Part of the shop is not answering right now, so we did not take your order: nothing was reserved or charged. Please try again in a minute.".into(),
        ),
        AppError::OutcomeUnknown(_) => (
            "We could not confirm your order",
            "The database stopped answering just as your order was being saved, so we cannot tell yet whether it went through. Look at My orders in a minute, or send the same form again: it will show the order if there is one and will not buy twice.".into(),
        ),
        AppError::Fenced { .. } => (
            "The shop is briefly unavailable",
            "Your checkout was paused so long that its hold on this product ran out and another checkout took over, so yours stopped before writing anything. Nothing was reserved or charged. Please try again.".into(),
        ),
        AppError::Internal(_) => (
            "Something went wrong",
            "An unexpected error stopped this request. Nothing was charged. Please try again; if it keeps happening, contact support.".into(),
        ),
    }
}

/// What a visitor turned away at sign-up or a waiting room reads.
fn door_refusal_in_words(refusal: DoorRefusal) -> (&'static str, Cow<'static, str>) {
    match refusal {
        DoorRefusal::NotSolved => (
            "The bot check is not finished",
            "To keep bots from taking the places, your browser solves a small puzzle before this form can be sent; it takes a moment and needs JavaScript. Nothing was done. Turn JavaScript on for this shop, wait for the check to say it is done, and send the form again.".into(),
        ),
        DoorRefusal::Invalid => (
            "The bot check did not pass",
            "The answer to the bot check was not one this shop can accept, so nothing was done. Reload the page and try again.".into(),
        ),
        DoorRefusal::Expired => (
            "The bot check ran out",
            "The bot check is good for ten minutes and this one ran out, so nothing was done. Reload the page and send the form again.".into(),
        ),
        DoorRefusal::Spent => (
            "The bot check was already used",
            "Each bot check works once and this one was already used, so nothing was done. Reload the page for a new one.".into(),
        ),
        DoorRefusal::TooMany { signing_up, retry_after } => (
            "Too many from your network",
            Cow::Owned(format!(
                "{} from your network address lately, so this one was not taken. Try again in {}.",
                if signing_up { "Too many accounts were created" } else { "Too many people joined this waiting room" },
                wait_in_words(retry_after)
            )),
        ),
        DoorRefusal::Unconfirmed => (
            "Confirm your email address first",
            "Waiting rooms are open to confirmed addresses only, one place per person. We sent you a link when you signed up; open it, then join again. Nothing was done. Your address page, /account/email, sends a new link if you cannot find it.".into(),
        ),
    }
}

/// What a refused buyer reads. Every refusal says that nothing was taken,
/// because a buyer in a crowd needs to know whether to try again.
fn refusal_in_words(refusal: &Refusal) -> (&'static str, Cow<'static, str>) {
    // The stock gate refuses before the product's row is read.
    let named = |product: &Option<String>| product.clone().unwrap_or_else(|| "This product".into());
    match refusal {
        // What a crowd gets once the gate is empty: fixed words, so the
        // page is rendered once (see `fixed_page`).
        Refusal::SoldOut {
            product: None,
            available: 0,
        } => (
            "Sold out",
            Cow::Borrowed(
                "This product is sold out: every unit has been bought. Nothing was reserved or charged.",
            ),
        ),
        Refusal::SoldOut {
            product: Some(product),
            available: 0,
        } => (
            "Sold out",
            Cow::Owned(format!(
                "{product} is sold out: every unit has been bought. Nothing was reserved or charged."
            )),
        ),
        Refusal::SoldOut { product, available } => (
            "Not enough left",
            Cow::Owned(format!(
                "Only {available} of {} left — choose a smaller quantity. Nothing was reserved or charged.",
                named(product)
            )),
        ),
        Refusal::LimitReached {
            product,
            limit,
            already,
        } => (
            "Purchase limit reached",
            Cow::Owned(format!(
                "{} is limited to {limit} per customer, and your orders already hold {already}. Nothing was reserved or charged.",
                named(product)
            )),
        ),
        Refusal::AddressUnconfirmed { product, limit } => (
            "Confirm your email address first",
            Cow::Owned(format!(
                "{} is limited to {limit} per person, so it is sold only to accounts whose email address is confirmed. Open the link we mailed you (your account page sends a new one), then buy again. Nothing was reserved or charged.",
                named(product)
            )),
        ),
        Refusal::SaleNotOpen { product, state } => (
            "Sale not open",
            Cow::Owned(match state {
                SaleState::Upcoming => format!(
                    "The sale of {product} has not started yet. Come back when the countdown ends."
                ),
                _ => format!("The sale of {product} has ended."),
            }),
        ),
    }
}

/// What a buyer turned away at their waiting-room pass reads.
fn pass_refusal_in_words(refusal: PassRefusal) -> (&'static str, Cow<'static, str>) {
    let (title, message) = match refusal {
        PassRefusal::NoPass => (
            "Wait for your turn",
            "This sale has a waiting room: you can buy once the waiting room gives you a pass. Join it (or keep its page open) and the Buy button appears when your turn comes. Nothing was reserved or charged.",
        ),
        PassRefusal::Forged => (
            "This pass is not valid",
            "The pass sent with this purchase was not issued by this sale's waiting room, so nothing was bought, reserved or charged. Open the waiting room page to see your place.",
        ),
        PassRefusal::NotYours => (
            "This pass is someone else's",
            "The pass sent with this purchase was issued to another customer, and a pass can only be used by the customer it was issued to. Nothing was bought, reserved or charged.",
        ),
        PassRefusal::Lapsed => (
            "Your pass has run out",
            "Your turn to buy ended before this purchase arrived, and your place went to the next in line. Nothing was bought, reserved or charged.",
        ),
        PassRefusal::Used => (
            "Your pass has been used",
            "This pass already bought its order (see My orders); a pass buys once. Nothing more was bought or charged.",
        ),
        PassRefusal::InUse => (
            "Already in progress",
            "A purchase under this pass is already on its way. Check My orders in a moment before trying again; nothing more was bought or charged.",
        ),
    };
    (title, Cow::Borrowed(message))
}

/// "45 seconds", "1 minute", "15 minutes": rounded up, so waiting that long is enough.
fn wait_in_words(wait: std::time::Duration) -> String {
    let seconds = wait.as_secs().max(1);
    let (amount, unit) = if seconds < 60 {
        (seconds, "second")
    } else {
        (seconds.div_ceil(60), "minute")
    };
    format!("{amount} {unit}{}", if amount == 1 { "" } else { "s" })
}

impl ResponseError for AppError {
    fn status_code(&self) -> StatusCode {
        match self {
            AppError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AppError::NotFound(_) => StatusCode::NOT_FOUND,
            AppError::Forbidden(_)
            | AppError::BadCsrf
            | AppError::Refused(Refusal::AddressUnconfirmed { .. })
            | AppError::PassRefused(PassRefusal::NoPass | PassRefusal::NotYours) => {
                StatusCode::FORBIDDEN
            }
            AppError::PassRefused(PassRefusal::Forged) => StatusCode::UNPROCESSABLE_ENTITY,
            AppError::PassRefused(PassRefusal::Lapsed | PassRefusal::Used | PassRefusal::InUse) => {
                StatusCode::CONFLICT
            }
            AppError::SignInRequired { .. } => StatusCode::SEE_OTHER,
            AppError::Conflict(_)
            | AppError::Refused(_)
            | AppError::KeyReused
            | AppError::KeyInProgress
            | AppError::KeyTaken => StatusCode::CONFLICT,
            AppError::TooManyAttempts { .. }
            | AppError::DoorRefused(DoorRefusal::TooMany { .. }) => StatusCode::TOO_MANY_REQUESTS,
            AppError::DoorRefused(DoorRefusal::Unconfirmed) => StatusCode::FORBIDDEN,
            AppError::DoorRefused(DoorRefusal::Spent) => StatusCode::CONFLICT,
            AppError::DoorRefused(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AppError::Busy
            | AppError::Unavailable(_)
            | AppError::OutcomeUnknown(_)
            | AppError::Fenced { .. } => StatusCode::SERVICE_UNAVAILABLE,
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            AppError::Internal(error) => tracing::error!(error = ?error, "request failed"),
            AppError::Unavailable(reason) => tracing::warn!(%reason, "dependency unavailable"),
            AppError::OutcomeUnknown(reason) => {
                tracing::warn!(%reason, "commit outcome unknown")
            }
            AppError::Fenced { product, fence } => {
                tracing::warn!(%product, fence, "stock write refused by its fencing token")
            }
            _ => {}
        }
        let status = self.status_code();
        if let AppError::SignInRequired { return_to, to_act } = self {
            return HttpResponse::SeeOther()
                .insert_header((
                    header::LOCATION,
                    sign_in_location(return_to.as_deref(), *to_act),
                ))
                .finish();
        }
        let (title, message) = title_and_message(self);
        let mut response = HttpResponse::build(status);
        match self {
            AppError::TooManyAttempts { retry_after }
            | AppError::DoorRefused(DoorRefusal::TooMany { retry_after, .. }) => {
                response.insert_header((header::RETRY_AFTER, retry_after.as_secs().max(1)));
            }
            _ if status == StatusCode::SERVICE_UNAVAILABLE => {
                response.insert_header((header::RETRY_AFTER, "2"));
            }
            _ => {}
        }
        let page = match message {
            Cow::Borrowed(message) => fixed_page(status, title, message),
            Cow::Owned(message) => error_page(status, title, &message),
        };
        match page {
            Ok(html) => response.content_type("text/html; charset=utf-8").body(html),
            Err(text) => response
                .content_type("text/plain; charset=utf-8")
                .body(text),
        }
    }
}

/// The error page, or its words as plain text if the template fails.
fn error_page(status: StatusCode, title: &str, message: &str) -> Result<Bytes, String> {
    ErrorPage {
        status: status.as_u16(),
        title,
        message,
    }
    .render()
    .map(Bytes::from)
    .map_err(|_| format!("{title}\n\n{message}"))
}

/// An error page whose words are all fixed is the same for everyone who
/// gets it (it names no account), and a sold-out crowd gets one thousands
/// of times a second: each is rendered once per process. The words are
/// `'static`, so there are only as many pages as the code has wordings.
fn fixed_page(
    status: StatusCode,
    title: &'static str,
    message: &'static str,
) -> Result<Bytes, String> {
    type Pages = RwLock<HashMap<(u16, &'static str, &'static str), Bytes>>;
    static PAGES: OnceLock<Pages> = OnceLock::new();
    let pages = PAGES.get_or_init(Pages::default);
    let key = (status.as_u16(), title, message);
    if let Some(page) = pages.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(page.clone());
    }
    let page = error_page(status, title, message)?;
    pages
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, page.clone());
    Ok(page)
}

/// A POST body that is not a form this shop could have sent: too large, or
/// not `application/x-www-form-urlencoded` (JSON, multipart, plain text, no
/// type at all). Nothing was read, so nothing was changed.
pub fn form_refused(error: UrlencodedError) -> actix_web::Error {
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

/// The sign-in page, told where to come back to and whether the request
/// that sent the customer there would have acted.
pub fn sign_in_location(return_to: Option<&str>, to_act: bool) -> String {
    let mut query: Vec<(&str, &str)> = Vec::new();
    if let Some(path) = return_to {
        query.push(("next", path));
    }
    if to_act {
        query.push(("why", "act"));
    }
    match serde_urlencoded::to_string(&query) {
        Ok(query) if !query.is_empty() => format!("/login?{query}"),
        _ => "/login".into(),
    }
}
