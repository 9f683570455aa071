//! Sign-up and sign-in. Passwords are hashed with argon2 on the blocking pool;
//! sign-in is throttled per email and per client address (`throttle`).

use std::net::IpAddr;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};

use crate::db::models::{Customer, NewCustomer};
use crate::db::schema::customers;
use crate::db::{self, PgConn, PgPool};
use crate::domain::{canonical_email, CustomerId, Email, InvalidInput, Password, Role};
use crate::error::{AppError, Conflict, NotAllowed};
use crate::services::door::{self, Door};
use crate::services::{confirmation, throttle, Shop};

/// Who is signed in; kept in the signed session cookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub id: CustomerId,
    pub email: String,
    pub role: Role,
    /// The address was confirmed when the session was made. Only ever a
    /// trustworthy yes (the shop never undoes a confirmation); a no may be
    /// stale, since the link may have been opened since.
    pub confirmed: bool,
}

impl From<Customer> for Account {
    fn from(c: Customer) -> Self {
        Account {
            id: CustomerId(c.id),
            role: Role::parse(&c.role).unwrap_or(Role::Customer),
            email: c.email,
            confirmed: c.email_confirmed_at.is_some(),
        }
    }
}

pub fn hash_password(password: &Password) -> anyhow::Result<String> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.expose().as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| anyhow::anyhow!("hashing failed: {e}"))
}

pub async fn sign_up(
    pool: &PgPool,
    email: Email,
    password: Password,
    role: Role,
) -> Result<Account, AppError> {
    db::run(pool, move |conn| {
        let hash = hash_password(&password)?;
        db::transaction(conn, |conn| insert_account(conn, &email, &hash, role))
    })
    .await
}

/// A customer's own sign-up: through the door (a solved bot check, used
/// once, and the address's limit), in the same transaction as the account.
pub async fn sign_up_at_door(
    shop: &Shop,
    email: Email,
    password: Password,
    bot_check: String,
    ip: IpAddr,
) -> Result<Account, AppError> {
    let keys = shop.door_keys.clone();
    let counts = shop.door_counts.clone();
    let limits = shop.settings.security.door;
    // The answer first, before anything costs the shop: a sign-up sent
    // without solving takes no password hash and no connection.
    door::check_answer(&keys, &counts, Door::SignUp, &bot_check)?;
    db::run(&shop.pool, move |conn| {
        // Hashed before the transaction: it takes a while on purpose, and
        // the door's lock on this address should not be held meanwhile.
        let hash = hash_password(&password)?;
        db::transaction(conn, |conn| {
            door::let_through(conn, &keys, &counts, &limits, Door::SignUp, &bot_check, ip)?;
            insert_account(conn, &email, &hash, Role::Customer)
        })
    })
    .await
}

/// The account and its confirmation message, in the caller's transaction.
fn insert_account(
    conn: &mut PgConn,
    email: &Email,
    password_hash: &str,
    role: Role,
) -> Result<Account, AppError> {
    let canonical = canonical_email(email);
    let inserted = diesel::insert_into(customers::table)
        .values(NewCustomer {
            email: email.as_str(),
            password_hash,
            role: role.as_str(),
            email_canonical: &canonical,
        })
        .returning(Customer::as_returning())
        .get_result(conn);
    match inserted {
        Ok(customer) => {
            confirmation::enqueue_link(conn, CustomerId(customer.id))?;
            Ok(customer.into())
        }
        Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {
            Err(Conflict::EmailTaken {
                email: email.as_str().to_string(),
            }
            .into())
        }
        Err(other) => Err(other.into()),
    }
}

/// Checks the password, unless the email or the client address is throttled:
/// then the answer is 429 before any password is looked at, so a throttled
/// guesser learns nothing. Unknown email and wrong password get the same
/// answer, so the form does not reveal who has an account.
pub async fn sign_in(
    shop: &Shop,
    email: Email,
    password: Result<Password, InvalidInput>,
    ip: IpAddr,
) -> Result<Account, AppError> {
    let limits = shop.settings.security.login_limits;
    if let Err(error) = throttle::begin_attempt(&shop.pool, limits, &email, ip).await {
        if let AppError::TooManyAttempts { retry_after } = &error {
            tracing::warn!(%ip, retry_after_secs = retry_after.as_secs(), "sign-in throttled");
        }
        return Err(error);
    }
    let checked = match password {
        Ok(password) => check_password(&shop.pool, email.clone(), password).await,
        // Too short or too long to be anyone's password: a miss like any other.
        Err(_) => Err(refused()),
    };
    match checked {
        Ok(account) => {
            throttle::clear_for_account(&shop.pool, &email).await?;
            Ok(account)
        }
        Err(error) => {
            if let AppError::Forbidden(_) = error {
                tracing::info!(%ip, "sign-in refused: email and password do not match");
            }
            Err(error)
        }
    }
}

fn refused() -> AppError {
    AppError::Forbidden(NotAllowed::WrongCredentials)
}

async fn check_password(
    pool: &PgPool,
    email: Email,
    password: Password,
) -> Result<Account, AppError> {
    let customer: Option<Customer> = db::run(pool, move |conn| {
        Ok(customers::table
            .filter(customers::email.eq(email.as_str()))
            .select(Customer::as_select())
            .first(conn)
            .optional()?)
    })
    .await?;
    actix_web::web::block(move || {
        let Some(customer) = customer else {
            // Spend the same time as a real check so timing does not tell either.
            let _ = hash_password(&password);
            return Err(refused());
        };
        let parsed = PasswordHash::new(&customer.password_hash)
            .map_err(|e| anyhow::anyhow!("stored hash: {e}"))?;
        Argon2::default()
            .verify_password(password.expose().as_bytes(), &parsed)
            .map_err(|_| refused())?;
        Ok(customer.into())
    })
    .await
    .map_err(|e| AppError::Internal(anyhow::anyhow!("verification task: {e}")))?
}

/// Creates the account, or makes an existing one an admin with the given password.
pub async fn ensure_admin(
    pool: &PgPool,
    email: Email,
    password: Password,
) -> Result<Account, AppError> {
    db::run(pool, move |conn| {
        let hash = hash_password(&password)?;
        let customer = diesel::insert_into(customers::table)
            .values(NewCustomer {
                email: email.as_str(),
                password_hash: &hash,
                role: Role::Admin.as_str(),
                email_canonical: &canonical_email(&email),
            })
            .on_conflict(customers::email)
            .do_update()
            .set((
                customers::password_hash.eq(&hash),
                customers::role.eq(Role::Admin.as_str()),
            ))
            .returning(Customer::as_returning())
            .get_result(conn)?;
        Ok(customer.into())
    })
    .await
}
