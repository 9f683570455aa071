//! Which message a mail is and the facts it says: the words are the
//! templates under `templates/mail/` (plain text, a subject block and a
//! body block each).

use askama::Template;
use chrono::{DateTime, Utc};

use crate::domain::{CustomerId, Money};

use super::link::{ConfirmLink, LinkKey, LINK_VALIDITY};
use super::Mail;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedMail {
    pub subject: String,
    pub body: String,
}

fn money(cents: i64) -> Money {
    Money::from_cents(cents).unwrap_or_default()
}

#[derive(Template)]
#[template(path = "mail/confirm_address.txt", blocks = ["subject", "body"])]
struct ConfirmAddress<'a> {
    to: &'a str,
    link: String,
    hours: i64,
}

#[derive(Template)]
#[template(path = "mail/your_turn.txt", blocks = ["subject", "body"])]
struct YourTurn<'a> {
    shop_url: &'a str,
    product_id: i64,
    product: &'a str,
    units: i32,
    deadline: DateTime<Utc>,
}

#[derive(Template)]
#[template(path = "mail/order_paid.txt", blocks = ["subject", "body"])]
struct OrderPaid<'a> {
    shop_url: &'a str,
    order: i64,
    total: Money,
}

#[derive(Template)]
#[template(path = "mail/payment_declined.txt", blocks = ["subject", "body"])]
struct PaymentDeclined<'a> {
    shop_url: &'a str,
    order: i64,
    tries_left: i64,
}

#[derive(Template)]
#[template(path = "mail/refund.txt", blocks = ["subject", "body"])]
struct Refund<'a> {
    shop_url: &'a str,
    order: i64,
    total: Money,
}

/// A message's subject and body, each its template's block.
macro_rules! rendered {
    ($message:expr) => {{
        let message = $message;
        let subject = message.as_subject().render()?;
        let body = message.as_body().render()?;
        RenderedMail { subject, body }
    }};
}

/// `mail` for the account `customer` whose address is `to`; `shop_url` is
/// the shop as customers reach it (`SHOP_URL`).
pub fn render(
    mail: &Mail,
    customer: CustomerId,
    to: &str,
    key: &LinkKey,
    shop_url: &str,
) -> Result<RenderedMail, askama::Error> {
    Ok(match mail {
        Mail::ConfirmAddress { issued } => rendered!(ConfirmAddress {
            to,
            link: format!(
                "{shop_url}{}",
                ConfirmLink::issue(key, customer, to, *issued).path()
            ),
            hours: LINK_VALIDITY.num_hours(),
        }),
        Mail::YourTurn {
            product_id,
            product,
            units,
            deadline,
            ..
        } => rendered!(YourTurn {
            shop_url,
            product_id: *product_id,
            product,
            units: *units,
            deadline: *deadline,
        }),
        Mail::OrderPaid { order, total_cents } => rendered!(OrderPaid {
            shop_url,
            order: *order,
            total: money(*total_cents),
        }),
        Mail::PaymentDeclined {
            order, tries_left, ..
        } => rendered!(PaymentDeclined {
            shop_url,
            order: *order,
            tries_left: *tries_left,
        }),
        Mail::Refund { order, total_cents } => rendered!(Refund {
            shop_url,
            order: *order,
            total: money(*total_cents),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_confirmation_carries_a_link_that_checks_out() {
        let key = LinkKey::derive(&[1u8; 64]);
        let issued = chrono::Utc::now().timestamp();
        let mail = render(
            &Mail::ConfirmAddress { issued },
            CustomerId(3),
            "ada@example.com",
            &key,
            "https://shop.example",
        )
        .unwrap();
        let line = mail
            .body
            .lines()
            .find(|line| line.starts_with("https://shop.example/account/confirm?"))
            .unwrap();
        assert_eq!(
            line,
            format!(
                "https://shop.example{}",
                ConfirmLink::issue(&key, CustomerId(3), "ada@example.com", issued).path()
            )
        );
    }

    /// The template's blocks, exactly: no stray blank line, one final newline.
    #[test]
    fn a_message_is_its_templates_blocks_with_the_facts_filled_in() {
        let key = LinkKey::derive(&[1u8; 64]);
        let last = Mail::PaymentDeclined {
            payment: 1,
            order: 9,
            tries_left: 0,
        };
        let mail = render(&last, CustomerId(3), "a@b.c", &key, "http://x").unwrap();
        assert_eq!(mail.subject, "Payment declined for order #9");
        assert_eq!(
            mail.body,
            "Hello,\n\nThe card you used for order #9 was declined, so you were not charged. It was the last try for this order, so it is cancelled and its items are back on sale.\n\nYour orders: http://x/orders\n"
        );
    }

    #[test]
    fn a_last_decline_says_the_order_is_cancelled() {
        let key = LinkKey::derive(&[1u8; 64]);
        let last = Mail::PaymentDeclined {
            payment: 1,
            order: 9,
            tries_left: 0,
        };
        let body = render(&last, CustomerId(3), "a@b.c", &key, "http://x")
            .unwrap()
            .body;
        assert!(body.contains("cancelled"), "{body}");
        let more = Mail::PaymentDeclined {
            payment: 1,
            order: 9,
            tries_left: 2,
        };
        let body = render(&more, CustomerId(3), "a@b.c", &key, "http://x")
            .unwrap()
            .body;
        assert!(body.contains("2 more tries"), "{body}");
    }
}
