//! The mail job: sends what the outbox holds, over SMTP, never inside a
//! database transaction. One message at a time: claimed (a lease, so two
//! instances never send it at once, committed before the send), sent,
//! then marked sent, or its failure recorded with a pause that grows to
//! `MAX_PAUSE`. A crash between the server's answer and the mark sends the
//! message again once its lease ends, with the same Message-ID.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Int4, Jsonb, Text, Timestamptz};
use lettre::message::{header::ContentType, Mailbox, Message};
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};
use tokio::task::JoinHandle;

use super::link::LinkKey;
use super::{render, Mail};
use crate::config::SmtpServer;
use crate::db;
use crate::domain::CustomerId;
use crate::error::AppError;
use crate::services::jobs::next_tick;
use crate::services::Shop;
use crate::shutdown::StopSignal;

/// The longest one SMTP exchange may take (the whole send: lettre's own
/// timeout covers only the connect).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// A claimed message is left alone this long: three sends' worth, so only
/// a sender that died leaves a claim to run out, and a sender whose claim
/// ran out cannot mark the row another sender holds.
pub const LEASE: Duration = Duration::from_secs(30);
/// The longest pause between two tries of one message, so a mail server
/// that comes back is used within about a minute.
pub const MAX_PAUSE_SECS: i64 = 60;
/// At most this many messages per run; the next run takes the rest.
const RUN_MAX: usize = 200;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MailReport {
    pub sent: usize,
    /// Not taken this time; tried again later.
    pub failed: usize,
    /// Refused for good; not tried again.
    pub refused: usize,
}

#[derive(QueryableByName)]
struct Claimed {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    event_key: String,
    #[diesel(sql_type = BigInt)]
    customer_id: i64,
    #[diesel(sql_type = Jsonb)]
    payload: serde_json::Value,
    #[diesel(sql_type = Text)]
    email: String,
    /// The claim's end: its token, so a sender marks only its own claim.
    #[diesel(sql_type = Timestamptz)]
    claimed_until: DateTime<Utc>,
}

/// The pause before the next try of a message tried `attempts` times.
pub fn pause_after(attempts: i32) -> i64 {
    let doubled = 1i64 << attempts.clamp(1, 10);
    doubled.min(MAX_PAUSE_SECS)
}

/// The Message-ID of the message reporting `event_key`: the same for every
/// send of it.
pub fn message_id(event_key: &str, domain: &str) -> String {
    let local: String = event_key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '.'
            }
        })
        .collect();
    format!("<{local}@{domain}>")
}

/// Claims the oldest due message nobody holds, for `LEASE`. Its own
/// statement, so the claim is committed before anything is sent.
async fn claim_next(shop: &Shop) -> Result<Option<Claimed>, AppError> {
    let lease_secs = LEASE.as_secs() as i32;
    db::run(&shop.pool, move |conn| {
        Ok(diesel::sql_query(
            "UPDATE mail_outbox m SET claimed_until = now() + $1 * interval '1 second'
             FROM customers c
             WHERE c.id = m.customer_id AND m.id = (
                 SELECT id FROM mail_outbox
                 WHERE sent_at IS NULL AND refused_at IS NULL AND next_attempt_at <= now()
                   AND (claimed_until IS NULL OR claimed_until <= now())
                 ORDER BY next_attempt_at, id
                 LIMIT 1
                 FOR UPDATE SKIP LOCKED)
             RETURNING m.id, m.event_key, m.customer_id, m.payload, c.email, m.claimed_until",
        )
        .bind::<Int4, _>(lease_secs)
        .get_result::<Claimed>(conn)
        .optional()?)
    })
    .await
}

async fn mark_sent(shop: &Shop, id: i64, claim: DateTime<Utc>) -> Result<(), AppError> {
    db::run(&shop.pool, move |conn| {
        diesel::sql_query(
            "UPDATE mail_outbox SET sent_at = now(), claimed_until = NULL, last_error = NULL,
                attempts = attempts + 1
             WHERE id = $1 AND sent_at IS NULL AND claimed_until = $2",
        )
        .bind::<BigInt, _>(id)
        .bind::<Timestamptz, _>(claim)
        .execute(conn)?;
        Ok(())
    })
    .await
}

/// Whether the server's answer refuses this message's recipient for good
/// (no such mailbox, a disabled or full one: RFC 3463's 5.1.x and 5.2.x,
/// or 551 and 553), so no later try would deliver it. Any other 5xx (a
/// wrong password, 535; relaying or the sender refused, 5.7.x, 5.1.7-8)
/// would refuse every message until the operator fixes it: those are
/// retried like a server that is down.
fn refused_for_good(code: u16, said: &str) -> bool {
    if !(500..600).contains(&code) {
        return false;
    }
    let about_recipient = said
        .split(|c: char| c.is_whitespace() || c == ':' || c == '(' || c == ')')
        .any(|word| {
            (word.starts_with("5.1.") && word != "5.1.7" && word != "5.1.8")
                || word.starts_with("5.2.")
        });
    about_recipient || matches!(code, 551 | 553)
}

/// Whether a 5xx refuses every message from this shop, not one message:
/// authentication required or failed (530, 534, 535, 538).
fn refuses_the_sender(code: u16) -> bool {
    matches!(code, 530 | 534 | 535 | 538)
}

/// A try that did not deliver the message: tried again after a pause that
/// doubles (2, 4, 8 ... at most `MAX_PAUSE_SECS` seconds), or, when the
/// server refused its recipient for good, never again. Kept, with the
/// server's words, for the admin. Only the sender holding the claim marks it.
async fn mark_undelivered(
    shop: &Shop,
    id: i64,
    claim: DateTime<Utc>,
    error: String,
    for_good: bool,
) -> Result<(), AppError> {
    db::run(&shop.pool, move |conn| {
        diesel::sql_query(
            "UPDATE mail_outbox SET attempts = attempts + 1, last_error = $2, claimed_until = NULL,
                refused_at = CASE WHEN $5 THEN now() END,
                next_attempt_at = now() + least(power(2, least(attempts + 1, 10)), $3) * interval '1 second'
             WHERE id = $1 AND sent_at IS NULL AND claimed_until = $4",
        )
        .bind::<BigInt, _>(id)
        .bind::<Text, _>(error)
        .bind::<BigInt, _>(MAX_PAUSE_SECS)
        .bind::<Timestamptz, _>(claim)
        .bind::<Bool, _>(for_good)
        .execute(conn)?;
        Ok(())
    })
    .await
}

fn transport(server: &SmtpServer) -> AsyncSmtpTransport<Tokio1Executor> {
    let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&server.host)
        .port(server.port)
        .timeout(Some(SEND_TIMEOUT));
    if let Some((user, password)) = &server.credentials {
        builder = builder.credentials(Credentials::new(user.clone(), password.clone()));
    }
    builder.build()
}

fn message(shop: &Shop, key: &LinkKey, claimed: &Claimed) -> anyhow::Result<Message> {
    let mail: Mail = serde_json::from_value(claimed.payload.clone())?;
    let rendered = render(
        &mail,
        CustomerId(claimed.customer_id),
        &claimed.email,
        key,
        &shop.settings.shop_url,
    )?;
    let from: Mailbox = shop.settings.mail_from.parse()?;
    let to: Mailbox = claimed.email.parse()?;
    Ok(Message::builder()
        .from(from)
        .to(to)
        .subject(rendered.subject)
        .message_id(Some(message_id(
            &claimed.event_key,
            &shop.settings.mail_domain,
        )))
        .header(ContentType::TEXT_PLAIN)
        .body(rendered.body)?)
}

/// One run: sends due messages until none is left, `RUN_MAX` were taken,
/// or the server fails to take one (it is likely down: the next run tries
/// again). Without `SMTP_URL` it does nothing and messages wait.
pub async fn run_once(shop: &Shop) -> Result<MailReport, AppError> {
    let mut report = MailReport::default();
    let Some(url) = &shop.settings.smtp_url else {
        return Ok(report);
    };
    let server = SmtpServer::parse(url)?;
    let key = LinkKey::derive(&shop.settings.session_key);
    let mut mailer = None;
    for _ in 0..RUN_MAX {
        let Some(claimed) = claim_next(shop).await? else {
            break;
        };
        let message = match message(shop, &key, &claimed) {
            Ok(message) => message,
            Err(error) => {
                // Cannot be written (an address the mail library refuses,
                // or a kind a newer instance wrote during a rolling deploy):
                // kept, failing, for an admin to see, and tried again.
                tracing::warn!(id = claimed.id, %error, "a message could not be written");
                let error = format!("could not be written: {error}");
                mark_undelivered(shop, claimed.id, claimed.claimed_until, error, false).await?;
                report.failed += 1;
                continue;
            }
        };
        let mailer = mailer.get_or_insert_with(|| transport(&server));
        let sent = tokio::time::timeout(SEND_TIMEOUT, mailer.send(message)).await;
        match sent {
            Ok(Ok(_)) => {
                mark_sent(shop, claimed.id, claimed.claimed_until).await?;
                report.sent += 1;
            }
            Err(_) => {
                // The server may have taken it: the next try carries the
                // same Message-ID.
                tracing::warn!(
                    id = claimed.id,
                    event = claimed.event_key,
                    "the mail server did not answer in time; will retry"
                );
                let error = format!("no answer within {} s", SEND_TIMEOUT.as_secs());
                mark_undelivered(shop, claimed.id, claimed.claimed_until, error, false).await?;
                report.failed += 1;
                break;
            }
            Ok(Err(error))
                if error
                    .status()
                    .is_some_and(|code| refused_for_good(code.into(), &error.to_string())) =>
            {
                // About this message's recipient: the server is up and
                // taking other mail, so the run goes on.
                tracing::warn!(id = claimed.id, event = claimed.event_key, %error, "the mail server refused a message for good");
                mark_undelivered(
                    shop,
                    claimed.id,
                    claimed.claimed_until,
                    error.to_string(),
                    true,
                )
                .await?;
                report.refused += 1;
            }
            Ok(Err(error)) => {
                tracing::warn!(id = claimed.id, event = claimed.event_key, %error, "the mail server did not take a message; will retry");
                let about_the_server = !error.is_permanent()
                    || error
                        .status()
                        .is_some_and(|code| refuses_the_sender(code.into()));
                mark_undelivered(
                    shop,
                    claimed.id,
                    claimed.claimed_until,
                    error.to_string(),
                    false,
                )
                .await?;
                report.failed += 1;
                // The server is away, busy or refuses us: the next run tries
                // again. Another 5xx may be about this message alone (a bare
                // "550 no such user"), so the others still go out.
                if about_the_server {
                    break;
                }
            }
        }
    }
    Ok(report)
}

/// Runs the mail job every `MAIL_INTERVAL_MS` until `stop` fires; none
/// without `SMTP_URL`. A stop lets the run under way finish.
pub fn spawn(shop: Shop, mut stop: StopSignal) -> Option<JoinHandle<()>> {
    shop.settings.smtp_url.as_ref()?;
    Some(tokio::spawn(async move {
        let mut ticker = tokio::time::interval(shop.settings.mail_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while next_tick(&mut ticker, &mut stop).await {
            match run_once(&shop).await {
                Ok(report) if report != MailReport::default() => {
                    tracing::info!(?report, "mail job ran")
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "mail job failed; retrying next interval"),
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_grows_to_a_minute() {
        let pauses: Vec<i64> = (1..=8).map(pause_after).collect();
        assert_eq!(pauses, vec![2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn only_a_refusal_of_the_recipient_gives_a_message_up() {
        assert!(refused_for_good(
            550,
            "permanent error (550): 5.1.1 No such mailbox here"
        ));
        assert!(refused_for_good(
            552,
            "permanent error (552): 5.2.2 Mailbox full"
        ));
        assert!(refused_for_good(
            553,
            "permanent error (553): mailbox name not allowed"
        ));
        assert!(!refused_for_good(
            535,
            "permanent error (535): 5.7.8 Authentication failed"
        ));
        assert!(!refused_for_good(
            530,
            "permanent error (530): 5.7.0 Authentication required"
        ));
        assert!(!refused_for_good(
            550,
            "permanent error (550): 5.7.1 Relaying denied"
        ));
        assert!(!refused_for_good(
            550,
            "permanent error (550): 5.1.7 Bad sender address"
        ));
        assert!(!refused_for_good(
            550,
            "permanent error (550): Requested action not taken"
        ));
        assert!(!refused_for_good(
            450,
            "transient error (450): 4.2.1 Mailbox busy"
        ));
        // A bare 5xx is retried later, and only an authentication refusal
        // (every message alike) ends the run.
        assert!(refuses_the_sender(535) && refuses_the_sender(530));
        assert!(!refuses_the_sender(550) && !refuses_the_sender(554));
    }

    #[test]
    fn the_message_id_is_one_per_event() {
        assert_eq!(
            message_id("order-paid:12", "shop.example"),
            "<order-paid.12@shop.example>"
        );
        assert_eq!(
            message_id("confirm-address:3:1700000000", "shop.example"),
            "<confirm-address.3.1700000000@shop.example>"
        );
    }
}
