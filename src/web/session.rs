//! Who is asking, and whether their form came from us. The session cookie is
//! signed and encrypted; it carries a session token, a copy of the account
//! for the page header, when the session expires, and the CSRF token.
//! `check_session` verifies it once per request (`sessions::verify`): from
//! the cookie and this process's list of revoked sessions, or from the
//! `sessions` table when that list is not known to be fresh. A signed-out or
//! revoked cookie signs in no one, wherever a copy of it turns up.

use crate::web::session_cookie::{session_of, Session};
use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method};
use actix_web::middleware::Next;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use futures::future::LocalBoxFuture;
use subtle::ConstantTimeEq;

use super::forms::safe_return_path;
use crate::domain::Role;
use crate::error::AppError;
use crate::services::accounts::Account;
use crate::services::sessions::{self, SessionClaim, SessionToken};
use crate::services::Shop;

const ACCOUNT_KEY: &str = "account";
const CSRF_KEY: &str = "csrf";
const TOKEN_KEY: &str = "session_token";
/// Microseconds since the epoch, as Postgres keeps `sessions.expires_at`.
const EXPIRES_KEY: &str = "session_expires";

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredAccount {
    id: i64,
    email: String,
    role: Role,
    /// Absent from cookies made before it was kept: unconfirmed, which
    /// only costs a look in the database.
    #[serde(default)]
    confirmed: bool,
}

impl From<&Account> for StoredAccount {
    fn from(account: &Account) -> Self {
        StoredAccount {
            id: account.id.get(),
            email: account.email.clone(),
            role: account.role,
            confirmed: account.confirmed,
        }
    }
}

/// The account shown in the page header. `check_session` has already
/// verified the cookie for this request.
pub fn current_account(session: &Session) -> Option<Account> {
    session
        .get::<StoredAccount>(ACCOUNT_KEY)
        .ok()
        .flatten()
        .map(|s| Account {
            id: crate::domain::CustomerId(s.id),
            email: s.email,
            role: s.role,
            confirmed: s.confirmed,
        })
}

fn session_token(session: &Session) -> Option<SessionToken> {
    session
        .get::<String>(TOKEN_KEY)
        .ok()
        .flatten()
        .map(SessionToken::from_cookie)
}

/// The session as the cookie describes it; `None` for a cookie from before
/// cookies carried their expiry.
fn stored_claim(session: &Session) -> Option<SessionClaim> {
    let expires = session.get::<i64>(EXPIRES_KEY).ok().flatten()?;
    Some(SessionClaim {
        account: current_account(session)?,
        expires_at: chrono::DateTime::from_timestamp_micros(expires)?,
    })
}

fn store_claim(session: &Session, claim: &SessionClaim) -> Result<(), AppError> {
    session
        .insert(ACCOUNT_KEY, StoredAccount::from(&claim.account))
        .and_then(|()| session.insert(EXPIRES_KEY, claim.expires_at.timestamp_micros()))
        .map_err(|e| AppError::Internal(anyhow::anyhow!("session: {e}")))
}

/// Starts a fresh session for `account`: a new server-side session, a new
/// cookie and a new CSRF token, so nothing issued before sign-in is trusted
/// after it. A session this cookie already held is revoked.
pub async fn sign_in(shop: &Shop, session: &Session, account: &Account) -> Result<(), AppError> {
    if let Some(previous) = session_token(session) {
        sessions::revoke(shop, &previous).await?;
    }
    let (token, expires_at) =
        sessions::start(&shop.pool, account.id, shop.settings.security.session_ttl).await?;
    session.clear();
    store_claim(
        session,
        &SessionClaim {
            account: account.clone(),
            expires_at,
        },
    )?;
    session
        .insert(TOKEN_KEY, token.as_str())
        .map_err(|e| AppError::Internal(anyhow::anyhow!("session: {e}")))?;
    new_csrf_token(session);
    session.renew();
    Ok(())
}

/// Revokes the server-side session, then drops the cookie.
pub async fn sign_out(shop: &Shop, session: &Session) -> Result<(), AppError> {
    if let Some(token) = session_token(session) {
        sessions::revoke(shop, &token).await?;
    }
    session.purge();
    Ok(())
}

/// The session's CSRF token, created on first use.
pub fn csrf_token(session: &Session) -> String {
    if let Ok(Some(token)) = session.get::<String>(CSRF_KEY) {
        return token;
    }
    new_csrf_token(session)
}

fn new_csrf_token(session: &Session) -> String {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let _ = session.insert(CSRF_KEY, &token);
    token
}

pub fn verify_csrf(session: &Session, submitted: &str) -> Result<(), AppError> {
    match session.get::<String>(CSRF_KEY) {
        Ok(Some(expected))
            if !submitted.is_empty()
                && bool::from(expected.as_bytes().ct_eq(submitted.as_bytes())) =>
        {
            Ok(())
        }
        _ => Err(AppError::BadCsrf),
    }
}

/// This request's verdict on its session, so it is looked up once however
/// many extractors ask.
#[derive(Clone)]
struct Verified(Option<Account>);

/// The signed-in account behind `req`. A cookie whose session is revoked,
/// expired or unknown is emptied, so nothing later in the request (the page
/// header, the CSRF token) trusts it either.
async fn verified_account(req: &HttpRequest) -> Result<Option<Account>, AppError> {
    if let Some(Verified(account)) = req.extensions().get::<Verified>() {
        return Ok(account.clone());
    }
    let session = session_of(req);
    let stored = stored_claim(&session);
    let live = match session_token(&session) {
        Some(token) => {
            let shop = req
                .app_data::<web::Data<Shop>>()
                .ok_or_else(|| AppError::Internal(anyhow::anyhow!("no Shop in app data")))?;
            sessions::verify(shop, &token, stored.clone()).await?
        }
        None => None,
    };
    match &live {
        // Rewrite the copy only when the table said otherwise (a cookie from
        // before it carried its expiry), so an unchanged session sends no new cookie.
        Some(live) if stored.as_ref() != Some(live) => store_claim(&session, live)?,
        Some(_) => {}
        None if current_account(&session).is_some() || session_token(&session).is_some() => {
            session.clear()
        }
        None => {}
    }
    let account = live.map(|claim| claim.account);
    req.extensions_mut().insert(Verified(account.clone()));
    Ok(account)
}

/// Middleware: checks the session before any handler runs. Static files are
/// the same for everyone and skip the check. If the check itself fails (the
/// database is down), the request goes on unverified: a page that needs the
/// account asks again through `SignedIn`/`Admin` and answers that error,
/// while pages that do not (sign-in, health) still work.
pub async fn check_session(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    if !req.path().starts_with("/static/") {
        let _ = verified_account(req.request()).await;
    }
    next.call(req).await
}

/// A signed-in account; strangers are sent to the sign-in page.
pub struct SignedIn(pub Account);

impl FromRequest for SignedIn {
    type Error = AppError;
    type Future = LocalBoxFuture<'static, Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            verified_account(&req)
                .await?
                .map(SignedIn)
                .ok_or_else(|| sign_in_required(&req))
        })
    }
}

/// A signed-in admin; customers get 403, strangers the sign-in page.
pub struct Admin(pub Account);

impl FromRequest for Admin {
    type Error = AppError;
    type Future = LocalBoxFuture<'static, Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            match verified_account(&req).await? {
                Some(account) if account.role == Role::Admin => Ok(Admin(account)),
                Some(_) => Err(AppError::Forbidden(crate::error::NotAllowed::AdminsOnly)),
                None => Err(sign_in_required(&req)),
            }
        })
    }
}

/// Sends a stranger to sign in, to come back where they were: the page
/// they asked for, or for a form they sent (a buy, a join) the page that
/// held the form, as its same-origin `Referer` says. Only the shop's own
/// paths are kept (`safe_return_path`).
fn sign_in_required(req: &HttpRequest) -> AppError {
    let to_act = !matches!(*req.method(), Method::GET | Method::HEAD);
    let asked = if to_act {
        same_origin_referer_path(req)
    } else {
        req.uri().path_and_query().map(|p| p.as_str().to_string())
    };
    AppError::SignInRequired {
        return_to: asked.as_deref().and_then(safe_return_path),
        to_act,
    }
}

/// The path and query of the `Referer`, if it is this shop's own address.
fn same_origin_referer_path(req: &HttpRequest) -> Option<String> {
    let referer = req.headers().get(header::REFERER)?.to_str().ok()?;
    let host = req.connection_info().host().to_string();
    ["http://", "https://"].iter().find_map(|scheme| {
        let rest = referer.strip_prefix(scheme)?.strip_prefix(host.as_str())?;
        rest.starts_with('/').then(|| rest.to_string())
    })
}
