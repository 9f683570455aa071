use crate::web::session_cookie::Session;
use actix_web::http::{header, StatusCode};
use actix_web::{get, post, web, HttpRequest, HttpResponse, ResponseError};

use super::door::client_ip;
use super::forms::{
    safe_return_path, Credentials, CredentialsForm, CsrfOnlyForm, SignInAttempt, SignInQuery,
};
use super::session::{self, verify_csrf, SignedIn};
use super::views::auth::{AuthPage, WelcomePage};
use super::views::{render, Nav};
use super::{html, see_other};
use crate::domain::Role;
use crate::error::{AppError, DoorRefusal};
use crate::services::accounts::{sign_in, sign_up_at_door};
use crate::services::confirmation::is_confirmed;
use crate::services::Shop;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(signup_page)
        .service(signup)
        .service(login_page)
        .service(login)
        .service(logout)
        .service(welcome);
}

fn auth_page(
    session: &Session,
    is_signup: bool,
    email: &str,
    return_to: Option<String>,
    notice: Option<&'static str>,
    error: Option<&AppError>,
) -> Result<HttpResponse, AppError> {
    let page = AuthPage {
        nav: Nav::from_session(session),
        is_signup,
        email: email.chars().take(254).collect(),
        error: error.map(super::error::in_words),
        next: return_to.unwrap_or_default(),
        notice,
    };
    let status = error
        .map(ResponseError::status_code)
        .unwrap_or(StatusCode::OK);
    let mut response = html(status, render(&page)?);
    if let Some(AppError::DoorRefused(DoorRefusal::TooMany { retry_after, .. })) = error {
        response.headers_mut().insert(
            header::RETRY_AFTER,
            header::HeaderValue::from(retry_after.as_secs().max(1)),
        );
    }
    Ok(response)
}

/// Why the sign-in page was shown, when another page sent the customer.
fn notice_for(query: &SignInQuery, return_to: Option<&str>) -> Option<&'static str> {
    if query.why == "act" {
        Some("You need an account to buy or to join a waiting room, so nothing was done yet. Sign in (or create an account) and you come back to the page you were on.")
    } else if return_to.is_some() {
        Some("Sign in to see that page; you come back to it afterwards.")
    } else {
        None
    }
}

#[get("/signup")]
pub async fn signup_page(
    session: Session,
    query: web::Query<SignInQuery>,
) -> Result<HttpResponse, AppError> {
    let return_to = safe_return_path(&query.next);
    auth_page(&session, true, "", return_to, None, None)
}

#[get("/login")]
pub async fn login_page(
    session: Session,
    query: web::Query<SignInQuery>,
) -> Result<HttpResponse, AppError> {
    let return_to = safe_return_path(&query.next);
    let notice = notice_for(&query, return_to.as_deref());
    auth_page(&session, false, "", return_to, notice, None)
}

/// Form mistakes (taken email, wrong password, short password) come back on
/// the same form with the message; anything else is an error page.
fn form_or_error(
    session: &Session,
    is_signup: bool,
    email: &str,
    return_to: Option<String>,
    error: AppError,
) -> Result<HttpResponse, AppError> {
    match error {
        AppError::Invalid(_)
        | AppError::Conflict(_)
        | AppError::Forbidden(_)
        | AppError::DoorRefused(_) => {
            auth_page(session, is_signup, email, return_to, None, Some(&error))
        }
        other => Err(other),
    }
}

#[post("/signup")]
pub async fn signup(
    shop: web::Data<Shop>,
    session: Session,
    request: HttpRequest,
    form: web::Form<CredentialsForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let return_to = safe_return_path(&form.next);
    let attempt = async {
        let Credentials { email, password } = form.sign_up()?;
        let ip = client_ip(&request, &shop.settings.security.trusted_proxies);
        sign_up_at_door(&shop, email, password, form.altcha.clone(), ip).await
    };
    match attempt.await {
        Ok(account) => {
            session::sign_in(&shop, &session, &account).await?;
            Ok(see_other(&welcome_path(return_to.as_deref())))
        }
        Err(error) => form_or_error(&session, true, &form.email, return_to, error),
    }
}

#[post("/login")]
pub async fn login(
    shop: web::Data<Shop>,
    session: Session,
    request: HttpRequest,
    form: web::Form<CredentialsForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let return_to = safe_return_path(&form.next);
    let attempt = async {
        let SignInAttempt { email, password } = form.sign_in_attempt()?;
        let ip = client_ip(&request, &shop.settings.security.trusted_proxies);
        sign_in(&shop, email, password, ip).await
    };
    match attempt.await {
        Ok(account) => {
            session::sign_in(&shop, &session, &account).await?;
            let home = if account.role == Role::Admin {
                "/admin"
            } else {
                "/"
            };
            Ok(see_other(return_to.as_deref().unwrap_or(home)))
        }
        Err(error) => form_or_error(&session, false, &form.email, return_to, error),
    }
}

#[post("/logout")]
pub async fn logout(
    shop: web::Data<Shop>,
    session: Session,
    form: web::Form<CsrfOnlyForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    session::sign_out(&shop, &session).await?;
    Ok(see_other("/"))
}

fn welcome_path(return_to: Option<&str>) -> String {
    match return_to.map(|next| serde_urlencoded::to_string([("next", next)])) {
        Some(Ok(query)) => format!("/welcome?{query}"),
        _ => "/welcome".into(),
    }
}

/// A new account's confirmation, with the way back to where it started.
#[get("/welcome")]
pub async fn welcome(
    shop: web::Data<Shop>,
    SignedIn(account): SignedIn,
    session: Session,
    query: web::Query<SignInQuery>,
) -> Result<HttpResponse, AppError> {
    let page = WelcomePage {
        nav: Nav::from_session(&session),
        email: account.email.to_string(),
        next: safe_return_path(&query.next).unwrap_or_else(|| "/".into()),
        unconfirmed: !is_confirmed(&shop, account.id).await?,
    };
    Ok(html(StatusCode::OK, render(&page)?))
}
