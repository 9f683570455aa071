//! What each message says: plain text, in the customer's words.

use crate::domain::{CustomerId, Money};

use super::link::{ConfirmLink, LinkKey, LINK_VALIDITY};
use super::Mail;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedMail {
    pub subject: String,
    pub body: String,
}

fn money(cents: i64) -> String {
    Money::from_cents(cents).unwrap_or_default().to_string()
}

/// `mail` for the account `customer` whose address is `to`; `shop_url` is
/// the shop as customers reach it (`SHOP_URL`).
pub fn render(
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
                total = money(*total_cents),
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
                total = money(*total_cents),
            ),
        ),
    };
    RenderedMail { subject, body }
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
        );
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
        let body = render(&last, CustomerId(3), "a@b.c", &key, "http://x").body;
        assert!(body.contains("cancelled"), "{body}");
        let more = Mail::PaymentDeclined {
            payment: 1,
            order: 9,
            tries_left: 2,
        };
        let body = render(&more, CustomerId(3), "a@b.c", &key, "http://x").body;
        assert!(body.contains("2 more tries"), "{body}");
    }
}
