//! The customer's mail (issue #41), sent exactly once per event.
//!
//! Every message is a row of `mail_outbox` written by `enqueue` in the same
//! transaction as the event it reports, so a message exists exactly when its
//! event committed. `event_key` names the event (unique), so code that runs
//! twice for one event writes one row. The mail job (`sender`) sends due rows
//! over SMTP outside any transaction, marks them sent, and retries the rest
//! with a growing pause; the Message-ID comes from the event key, so a
//! message sent again after a crash between the server's answer and the
//! mark is the same message to every mail client. Rendering (`render`) is
//! plain text, done when a message is sent or shown to an admin: a
//! confirmation link is computed then (`link`), never stored.

pub mod link;
pub mod render;
pub mod sender;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::{Deserialize, Serialize};

use super::Shop;
use crate::db::schema::{customers, mail_outbox};
use crate::db::{self, PgConn};
use crate::domain::CustomerId;
use crate::error::AppError;

pub use link::{ConfirmLink, LinkKey};
pub use render::{render, RenderedMail};

/// A message and the facts it needs to be written; what `payload` holds.
/// Never a secret, never a card number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Mail {
    /// The link that confirms the account's address, issued at `issued`
    /// (Unix seconds); the link itself is derived when rendered.
    ConfirmAddress {
        issued: i64,
    },
    /// A waiting room's pass was issued: the customer may buy until `deadline`.
    YourTurn {
        product_id: i64,
        number: i32,
        product: String,
        units: i32,
        deadline: DateTime<Utc>,
    },
    OrderPaid {
        order: i64,
        total_cents: i64,
    },
    /// One declined card; `tries_left` more cards may still pay the order.
    PaymentDeclined {
        payment: i64,
        order: i64,
        tries_left: i64,
    },
    Refund {
        order: i64,
        total_cents: i64,
    },
}

impl Mail {
    /// The event the message reports: one message per event.
    pub fn event_key(&self, customer: CustomerId) -> String {
        match self {
            Mail::ConfirmAddress { issued } => format!("confirm-address:{customer}:{issued}"),
            Mail::YourTurn {
                product_id, number, ..
            } => format!("your-turn:{product_id}-{number}"),
            Mail::OrderPaid { order, .. } => format!("order-paid:{order}"),
            Mail::PaymentDeclined { payment, .. } => format!("payment-declined:{payment}"),
            Mail::Refund { order, .. } => format!("refund:{order}"),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Mail::ConfirmAddress { .. } => "confirm-address",
            Mail::YourTurn { .. } => "your-turn",
            Mail::OrderPaid { .. } => "order-paid",
            Mail::PaymentDeclined { .. } => "payment-declined",
            Mail::Refund { .. } => "refund",
        }
    }
}

/// Writes `mail` for `customer` into the outbox, in the caller's
/// transaction; a second write for the same event is ignored. True when
/// this call wrote it.
pub fn enqueue(conn: &mut PgConn, customer: CustomerId, mail: &Mail) -> QueryResult<bool> {
    let payload = serde_json::to_value(mail)
        .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
    let written = diesel::insert_into(mail_outbox::table)
        .values((
            mail_outbox::event_key.eq(mail.event_key(customer)),
            mail_outbox::kind.eq(mail.kind()),
            mail_outbox::customer_id.eq(customer.get()),
            mail_outbox::payload.eq(payload),
        ))
        .on_conflict(mail_outbox::event_key)
        .do_nothing()
        .execute(conn)?;
    Ok(written == 1)
}

/// Where a message stands, in an admin's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// Not sent yet, never tried (or no mail server is configured).
    Waiting,
    Sent(DateTime<Utc>),
    /// Tried and refused or unreachable; tried again at `next_attempt`.
    Failing {
        attempts: i32,
        last_error: String,
        next_attempt: DateTime<Utc>,
    },
    /// Refused for good by the mail server; not tried again.
    Refused {
        at: DateTime<Utc>,
        last_error: String,
    },
}

/// One message of the outbox as the admin page shows it.
#[derive(Debug, Clone)]
pub struct OutboxEntry {
    pub id: i64,
    pub event_key: String,
    pub kind: String,
    pub to: String,
    pub created_at: DateTime<Utc>,
    pub delivery: Delivery,
    pub rendered: RenderedMail,
}

type OutboxRow = (
    i64,
    String,
    String,
    i64,
    serde_json::Value,
    DateTime<Utc>,
    i32,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<String>,
    Option<DateTime<Utc>>,
    String,
);

/// The newest `limit` messages, rendered, newest first.
pub async fn recent(shop: &Shop, limit: i64) -> Result<Vec<OutboxEntry>, AppError> {
    let rows: Vec<OutboxRow> = db::run(&shop.pool, move |conn| {
        Ok(mail_outbox::table
            .inner_join(customers::table)
            .order(mail_outbox::id.desc())
            .limit(limit)
            .select((
                mail_outbox::id,
                mail_outbox::event_key,
                mail_outbox::kind,
                mail_outbox::customer_id,
                mail_outbox::payload,
                mail_outbox::created_at,
                mail_outbox::attempts,
                mail_outbox::next_attempt_at,
                mail_outbox::sent_at,
                mail_outbox::last_error,
                mail_outbox::refused_at,
                customers::email,
            ))
            .load(conn)?)
    })
    .await?;
    let key = LinkKey::derive(&shop.settings.session_key);
    rows.into_iter()
        .map(
            |(
                id,
                event_key,
                kind,
                customer,
                payload,
                created_at,
                attempts,
                next,
                sent,
                error,
                refused,
                to,
            )| {
                let mail: Mail = serde_json::from_value(payload).map_err(|e| {
                    AppError::Internal(anyhow::anyhow!("outbox row {id}: payload: {e}"))
                })?;
                let delivery = match (sent, refused, error) {
                    (Some(at), _, _) => Delivery::Sent(at),
                    (None, Some(at), error) => Delivery::Refused {
                        at,
                        last_error: error.unwrap_or_default(),
                    },
                    (None, None, Some(last_error)) => Delivery::Failing {
                        attempts,
                        last_error,
                        next_attempt: next,
                    },
                    (None, None, None) => Delivery::Waiting,
                };
                let rendered = render(
                    &mail,
                    CustomerId(customer),
                    &to,
                    &key,
                    &shop.settings.shop_url,
                )
                .map_err(|e| AppError::Internal(anyhow::anyhow!("outbox row {id}: render: {e}")))?;
                Ok(OutboxEntry {
                    id,
                    event_key,
                    kind,
                    to,
                    created_at,
                    delivery,
                    rendered,
                })
            },
        )
        .collect()
}
