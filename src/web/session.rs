//! Who is asking, and whether their form came from us. The session lives in a
//! signed, encrypted cookie; it carries the account and the CSRF token.

use actix_session::{Session, SessionExt};
use actix_web::{dev::Payload, FromRequest, HttpRequest};
use futures::future::{ready, Ready};
use subtle::ConstantTimeEq;

use crate::domain::Role;
use crate::error::AppError;
use crate::services::accounts::Account;

const ACCOUNT_KEY: &str = "account";
const CSRF_KEY: &str = "csrf";

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredAccount {
    id: i64,
    email: String,
    role: Role,
}

pub fn current_account(session: &Session) -> Option<Account> {
    session
        .get::<StoredAccount>(ACCOUNT_KEY)
        .ok()
        .flatten()
        .map(|s| Account {
            id: crate::domain::CustomerId(s.id),
            email: s.email,
            role: s.role,
        })
}

/// Starts a fresh session for `account`: a new cookie and a new CSRF token,
/// so nothing issued before sign-in is trusted after it.
pub fn sign_in(session: &Session, account: &Account) -> Result<(), AppError> {
    session.clear();
    session
        .insert(
            ACCOUNT_KEY,
            StoredAccount {
                id: account.id.get(),
                email: account.email.clone(),
                role: account.role,
            },
        )
        .map_err(|e| AppError::Internal(anyhow::anyhow!("session: {e}")))?;
    new_csrf_token(session);
    session.renew();
    Ok(())
}

pub fn sign_out(session: &Session) {
    session.purge();
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

/// A signed-in account; strangers are sent to the sign-in page.
pub struct SignedIn(pub Account);

impl FromRequest for SignedIn {
    type Error = AppError;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        ready(
            current_account(&req.get_session())
                .map(SignedIn)
                .ok_or(AppError::SignInRequired),
        )
    }
}

/// A signed-in admin; customers get 403, strangers the sign-in page.
pub struct Admin(pub Account);

impl FromRequest for Admin {
    type Error = AppError;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        ready(match current_account(&req.get_session()) {
            Some(account) if account.role == Role::Admin => Ok(Admin(account)),
            Some(_) => Err(AppError::Forbidden(
                "This part of the shop is for administrators only.".into(),
            )),
            None => Err(AppError::SignInRequired),
        })
    }
}
