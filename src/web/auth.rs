use std::net::{IpAddr, Ipv4Addr};

use crate::web::session_cookie::Session;
use actix_web::http::StatusCode;
use actix_web::{get, post, web, HttpRequest, HttpResponse, ResponseError};

use super::forms::{
    safe_return_path, Credentials, CredentialsForm, CsrfOnlyForm, SignInAttempt, SignInQuery,
};
use super::session::{self, verify_csrf, SignedIn};
use super::views::auth::{AuthPage, WelcomePage};
use super::views::{render, Nav};
use super::{html, see_other};
use crate::config::TrustedProxies;
use crate::domain::Role;
use crate::error::AppError;
use crate::services::accounts::{sign_in, sign_up};
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
        error: error.map(|e| e.to_string()),
        next: return_to.unwrap_or_default(),
        notice,
    };
    let status = error
        .map(ResponseError::status_code)
        .unwrap_or(StatusCode::OK);
    Ok(html(status, render(&page)?))
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
        AppError::Invalid(_) | AppError::Conflict { .. } | AppError::Forbidden(_) => {
            auth_page(session, is_signup, email, return_to, None, Some(&error))
        }
        other => Err(other),
    }
}

#[post("/signup")]
pub async fn signup(
    shop: web::Data<Shop>,
    session: Session,
    form: web::Form<CredentialsForm>,
) -> Result<HttpResponse, AppError> {
    verify_csrf(&session, &form.csrf_token)?;
    let return_to = safe_return_path(&form.next);
    let attempt = async {
        let Credentials { email, password } = form.sign_up()?;
        sign_up(&shop.pool, email, password, Role::Customer).await
    };
    match attempt.await {
        Ok(account) => {
            session::sign_in(&shop, &session, &account).await?;
            Ok(see_other(&welcome_path(return_to.as_deref())))
        }
        Err(error) => form_or_error(&session, true, &form.email, return_to, error),
    }
}

/// The address sign-in throttling counts against: the TCP peer, or what a
/// trusted proxy in front of us says the client was.
fn client_ip(request: &HttpRequest, proxies: &TrustedProxies) -> IpAddr {
    let peer = request
        .peer_addr()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |addr| addr.ip());
    let forwarded_for = request
        .headers()
        .get_all("X-Forwarded-For")
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .collect::<Vec<_>>();
    proxies.client_ip(peer, forwarded_for.into_iter())
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
