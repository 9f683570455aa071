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

    fn old_money(cents: i64) -> String {
        Money::from_cents(cents).unwrap_or_default().to_string()
    }

    /// `mail` for the account `customer` whose address is `to`; `shop_url` is
    /// the shop as customers reach it (`SHOP_URL`).
    fn old_render(
        mail: &Mail,
        customer: CustomerId,
        to: &str,
        key: &LinkKey,
        shop_url: &str,
    ) -> RenderedMail {
        let (subject, body) = match mail {
            Mail::ConfirmAddress { issued } => {
                let link = ConfirmLink::issue(key, customer, to, *issued);
                (
                    "Confirm your email address".to_string(),
                    format!(
                        "Hello,\n\nPlease confirm that {to} is your email address by opening this link:\n\n{shop_url}{path}\n\nThe link works for {hours} hours. Until your address is confirmed you can browse and buy first-come sales, but not join a waiting room.\n\nIf you did not create an account at our shop, you can ignore this message.\n",
                        path = link.path(),
                        hours = LINK_VALIDITY.num_hours(),
                    ),
                )
            }
            Mail::YourTurn {
                product_id,
                product,
                units,
                deadline,
                ..
            } => (
                format!("It's your turn: {product}"),
                format!(
                    "Hello,\n\nIt's your turn in the waiting room for {product}. You may buy {units} now.\n\nYour turn lasts until {deadline} (UTC). After that your place goes to the next person in line.\n\nBuy here: {shop_url}/products/{product_id}\n",
                    units = if *units == 1 { "1 unit".to_string() } else { format!("up to {units} units") },
                    deadline = deadline.format("%Y-%m-%d %H:%M:%S"),
                ),
            ),
            Mail::OrderPaid { order, total_cents } => (
                format!("Order #{order} is paid"),
                format!(
                    "Hello,\n\nThank you: your payment of {total} for order #{order} went through, and the order is yours.\n\nSee your order: {shop_url}/orders/{order}\n",
                    total = old_money(*total_cents),
                ),
            ),
            Mail::PaymentDeclined {
                order, tries_left, ..
            } => (
                format!("Payment declined for order #{order}"),
                if *tries_left > 0 {
                    format!(
                        "Hello,\n\nThe card you used for order #{order} was declined, so you were not charged. Your order still holds its items: you can pay with another card on the order page before its deadline ({tries_left} more {tries}).\n\nPay for your order: {shop_url}/orders/{order}\n",
                        tries = if *tries_left == 1 { "try" } else { "tries" },
                    )
                } else {
                    format!(
                        "Hello,\n\nThe card you used for order #{order} was declined, so you were not charged. It was the last try for this order, so it is cancelled and its items are back on sale.\n\nYour orders: {shop_url}/orders\n"
                    )
                },
            ),
            Mail::Refund { order, total_cents } => (
                format!("Refund for order #{order}"),
                format!(
                    "Hello,\n\nWe have refunded order #{order}: {total} goes back to the card you paid with. Depending on your bank it can take a few days to appear.\n\nSee your order: {shop_url}/orders/{order}\n",
                    total = old_money(*total_cents),
                ),
            ),
        };
        RenderedMail { subject, body }
    }

    #[test]
    fn templates_say_what_the_code_said() {
        let key = LinkKey::derive(&[1u8; 64]);
        let deadline = chrono::DateTime::parse_from_rfc3339("2026-12-01T09:05:07Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let mails = vec![
            Mail::ConfirmAddress {
                issued: 1_700_000_000,
            },
            Mail::YourTurn {
                product_id: 7,
                number: 2,
                product: "Tea & <b>Cups</b>".into(),
                units: 1,
                deadline,
            },
            Mail::YourTurn {
                product_id: 7,
                number: 2,
                product: "Tea".into(),
                units: 3,
                deadline,
            },
            Mail::OrderPaid {
                order: 12,
                total_cents: 123_450,
            },
            Mail::PaymentDeclined {
                payment: 1,
                order: 9,
                tries_left: 0,
            },
            Mail::PaymentDeclined {
                payment: 1,
                order: 9,
                tries_left: 1,
            },
            Mail::PaymentDeclined {
                payment: 1,
                order: 9,
                tries_left: 2,
            },
            Mail::Refund {
                order: 12,
                total_cents: 5,
            },
        ];
        for mail in mails {
            let old = old_render(
                &mail,
                CustomerId(3),
                "a&b@example.com",
                &key,
                "https://shop.example",
            );
            let new = render(
                &mail,
                CustomerId(3),
                "a&b@example.com",
                &key,
                "https://shop.example",
            )
            .unwrap();
            assert_eq!(old, new, "{mail:?}");
        }
    }

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
