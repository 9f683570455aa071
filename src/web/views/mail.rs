//! The admin's view of the customer's mail.

use askama::Template;

use super::Nav;
use crate::services::mail::{Delivery, OutboxEntry};
use crate::web::format::{iso, timestamp};

#[derive(Template)]
#[template(path = "admin_mail.html")]
pub struct MailPage {
    pub nav: Nav,
    /// A mail server is configured (`SMTP_URL`).
    pub sending: bool,
    pub rows: Vec<MailRow>,
}

pub struct MailRow {
    pub at_iso: String,
    pub at_text: String,
    pub to: String,
    pub subject: String,
    pub about: &'static str,
    pub state: &'static str,
    pub state_class: &'static str,
    pub detail: String,
    pub body: String,
}

fn about(kind: &str) -> &'static str {
    match kind {
        "confirm-address" => "Address confirmation",
        "your-turn" => "Waiting room: your turn",
        "order-paid" => "Order paid",
        "payment-declined" => "Card declined",
        "refund" => "Refund",
        _ => "Other",
    }
}

impl From<OutboxEntry> for MailRow {
    fn from(entry: OutboxEntry) -> Self {
        let (state, state_class, detail) = match entry.delivery {
            Delivery::Waiting => ("Waiting", "waiting", String::new()),
            Delivery::Sent(at) => ("Sent", "sent", format!("at {}", timestamp(at))),
            Delivery::Failing {
                attempts,
                last_error,
                next_attempt,
            } => (
                "Not delivered yet",
                "failing",
                format!(
                    "{attempts} {tries} so far; next at {}. The mail server said: {last_error}",
                    timestamp(next_attempt),
                    tries = if attempts == 1 { "try" } else { "tries" },
                ),
            ),
            Delivery::Refused { at, last_error } => (
                "Refused",
                "refused",
                format!(
                    "The mail server refused it for good at {}, so it is not tried again. It said: {last_error}",
                    timestamp(at)
                ),
            ),
        };
        MailRow {
            at_iso: iso(&entry.created_at),
            at_text: timestamp(entry.created_at),
            to: entry.to,
            subject: entry.rendered.subject,
            about: about(&entry.kind),
            state,
            state_class,
            detail,
            body: entry.rendered.body,
        }
    }
}

impl MailRow {
    /// The body with each confirmation link replaced by a word of why.
    pub fn without_confirmation_links(mut self) -> MailRow {
        self.body = self
            .body
            .split('\n')
            .map(|line| {
                if line.contains("/account/confirm?") {
                    "(the confirmation link: sent to the customer only)"
                } else {
                    line
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        self
    }
}
