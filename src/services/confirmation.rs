//! Confirming an account's address (issue #41): the link sent at sign-up
//! (or again on request) proves the customer reads that mailbox. One person
//! (one canonical address, `domain::canonical_email`) has at most one
//! confirmed account, which a unique index in Postgres holds to.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};

use super::mail::link::LinkRefusal;
use super::mail::{self, ConfirmLink, LinkKey, Mail};
use super::Shop;
use crate::db::schema::{customers, mail_outbox};
use crate::db::{self, PgConn};
use crate::domain::{canonical_address, CustomerId};
use crate::error::{AppError, Conflict};

/// At most one new link per this long per account.
pub const RESEND_PAUSE: chrono::Duration = chrono::Duration::minutes(5);

/// What opening a confirmation link did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmation {
    Confirmed {
        email: String,
    },
    /// Confirmed before (this link or another): nothing changed.
    AlreadyConfirmed {
        email: String,
    },
    /// Altered, or for an address the account no longer has: nothing changed.
    Invalid,
    /// Older than the link's validity: nothing changed.
    Expired,
    /// Another account of the same person (the same address up to `+tags`
    /// and dots) is confirmed: nothing changed.
    AddressTaken {
        email: String,
    },
}

/// Writes the confirmation message for a new account, in its transaction.
/// False when a link of this account was already issued this very second.
pub fn enqueue_link(conn: &mut PgConn, customer: CustomerId) -> QueryResult<bool> {
    mail::enqueue(
        conn,
        customer,
        &Mail::ConfirmAddress {
            issued: Utc::now().timestamp(),
        },
    )
}

pub async fn confirm(shop: &Shop, link: ConfirmLink) -> Result<Confirmation, AppError> {
    let key = LinkKey::derive(&shop.settings.session_key);
    db::run(&shop.pool, move |conn| {
        conn.transaction(|conn| {
            let account: Option<(String, Option<DateTime<Utc>>)> = customers::table
                .find(link.customer.get())
                .select((customers::email, customers::email_confirmed_at))
                .for_update()
                .first(conn)
                .optional()?;
            let Some((email, confirmed_at)) = account else {
                return Ok(Confirmation::Invalid);
            };
            match link.check(&key, &email, Utc::now()) {
                Err(LinkRefusal::Invalid) => return Ok(Confirmation::Invalid),
                Err(LinkRefusal::Expired) if confirmed_at.is_none() => {
                    return Ok(Confirmation::Expired)
                }
                Err(LinkRefusal::Expired) | Ok(()) => {}
            }
            if confirmed_at.is_some() {
                return Ok(Confirmation::AlreadyConfirmed { email });
            }
            let confirmed = diesel::update(customers::table.find(link.customer.get()))
                .set((
                    customers::email_confirmed_at.eq(diesel::dsl::now),
                    customers::email_canonical.eq(canonical_address(&email)),
                ))
                .execute(conn);
            match confirmed {
                Ok(_) => Ok(Confirmation::Confirmed { email }),
                Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {
                    Ok(Confirmation::AddressTaken { email })
                }
                Err(other) => Err(other.into()),
            }
        })
    })
    .await
}

/// What asking for a new link did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resend {
    Sent,
    AlreadyConfirmed,
    /// A link was issued less than `RESEND_PAUSE` ago; another may be asked for at `from`.
    TooSoon {
        from: DateTime<Utc>,
    },
}

/// A new link for `customer`, at most one per `RESEND_PAUSE`: decided
/// under the account's row lock, so two requests at once send one link.
pub async fn resend(shop: &Shop, customer: CustomerId) -> Result<Resend, AppError> {
    db::run(&shop.pool, move |conn| {
        conn.transaction(|conn| {
            let confirmed_at: Option<DateTime<Utc>> = customers::table
                .find(customer.get())
                .select(customers::email_confirmed_at)
                .for_update()
                .first(conn)?;
            if confirmed_at.is_some() {
                return Ok(Resend::AlreadyConfirmed);
            }
            let last: Option<DateTime<Utc>> = mail_outbox::table
                .filter(mail_outbox::customer_id.eq(customer.get()))
                .filter(mail_outbox::kind.eq("confirm-address"))
                .select(diesel::dsl::max(mail_outbox::created_at))
                .first(conn)?;
            let now: DateTime<Utc> =
                diesel::select(diesel::dsl::sql::<diesel::sql_types::Timestamptz>("now()"))
                    .get_result(conn)?;
            if let Some(last) = last.filter(|last| *last + RESEND_PAUSE > now) {
                return Ok(Resend::TooSoon {
                    from: last + RESEND_PAUSE,
                });
            }
            if enqueue_link(conn, customer)? {
                Ok(Resend::Sent)
            } else {
                Ok(Resend::TooSoon {
                    from: now + RESEND_PAUSE,
                })
            }
        })
    })
    .await
}

/// Where an account's address stands, for its own pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressState {
    pub email: String,
    pub confirmed_at: Option<DateTime<Utc>>,
    /// When the latest link was issued.
    pub last_link_at: Option<DateTime<Utc>>,
}

pub async fn address_state(shop: &Shop, customer: CustomerId) -> Result<AddressState, AppError> {
    db::run(&shop.pool, move |conn| {
        let (email, confirmed_at) = customers::table
            .find(customer.get())
            .select((customers::email, customers::email_confirmed_at))
            .first::<(String, Option<DateTime<Utc>>)>(conn)?;
        let last_link_at = if confirmed_at.is_none() {
            mail_outbox::table
                .filter(mail_outbox::customer_id.eq(customer.get()))
                .filter(mail_outbox::kind.eq("confirm-address"))
                .select(diesel::dsl::max(mail_outbox::created_at))
                .first(conn)?
        } else {
            None
        };
        Ok(AddressState {
            email,
            confirmed_at,
            last_link_at,
        })
    })
    .await
}

/// Whether `customer`'s address is confirmed: from this process's memory
/// once seen, else one primary-key read.
pub async fn is_confirmed(shop: &Shop, customer: CustomerId) -> Result<bool, AppError> {
    if shop.confirmed.contains(customer) {
        return Ok(true);
    }
    let confirmed = db::run(&shop.pool, move |conn| {
        Ok(customers::table
            .find(customer.get())
            .select(customers::email_confirmed_at.is_not_null())
            .first::<bool>(conn)
            .optional()?
            .unwrap_or(false))
    })
    .await?;
    if confirmed {
        shop.confirmed.insert(customer);
    }
    Ok(confirmed)
}

/// What a signed-in session vouches for: an account whose session was made
/// after its address was confirmed needs no look in the database to be
/// known confirmed (a confirmation is never undone by the shop).
pub fn vouched_by_session(shop: &Shop, customer: CustomerId, confirmed: bool) {
    if confirmed && !shop.confirmed.contains(customer) {
        shop.confirmed.insert(customer);
    }
}

/// Customers this process has seen confirmed. Only ever a yes: a
/// confirmation is not undone by any page, and where it matters (a limited
/// sale's order) the transaction reads it again, so a stale yes sells
/// nothing. Losing it costs one read per customer.
#[derive(Debug, Default)]
pub struct ConfirmedCustomers(std::sync::RwLock<std::collections::HashSet<CustomerId>>);

impl ConfirmedCustomers {
    fn contains(&self, customer: CustomerId) -> bool {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&customer)
    }

    fn insert(&self, customer: CustomerId) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(customer);
    }
}

/// Confirms `email`'s account without a link: for accounts an operator
/// makes for people whose addresses they know (the demo's customers).
/// Refused, like a link, when another account of the same person is
/// confirmed.
pub async fn confirm_as_operator(pool: &crate::db::PgPool, email: &str) -> Result<(), AppError> {
    let email = email.trim().to_lowercase();
    db::run(pool, move |conn| {
        let updated = diesel::update(
            customers::table
                .filter(customers::email.eq(&email))
                .filter(customers::email_confirmed_at.is_null()),
        )
        .set(customers::email_confirmed_at.eq(Utc::now()))
        .execute(conn);
        match updated {
            Ok(_) => Ok(()),
            Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {
                Err(Conflict::AddressConfirmedElsewhere { email }.into())
            }
            Err(other) => Err(other.into()),
        }
    })
    .await
}
