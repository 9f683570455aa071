//! Paying for an order through a gateway. The sandbox behaves like a payment
//! provider's test mode: fixed card numbers decide the outcome.

use chrono::Utc;
use diesel::prelude::*;

use super::restore::{refused_transition, restore_order, set_status};
use super::Shop;
use crate::db::models::{NewPayment, Order};
use crate::db::schema::{orders, payments};
use crate::db::{self};
use crate::domain::{CustomerId, InvalidInput, Money, OrderId, OrderStatus};
use crate::error::AppError;

/// A card number that passed the Luhn check; only its last four digits are ever stored.
#[derive(Clone)]
pub struct CardNumber(String);

impl CardNumber {
    pub fn parse(raw: &str) -> Result<CardNumber, InvalidInput> {
        let digits: String = raw.chars().filter(|c| !matches!(c, ' ' | '-')).collect();
        let refuse = || {
            InvalidInput("Enter the card number as printed on the card (12 to 19 digits).".into())
        };
        if !(12..=19).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(refuse());
        }
        let luhn_sum: u32 = digits
            .bytes()
            .rev()
            .enumerate()
            .map(|(i, b)| {
                let d = u32::from(b - b'0');
                if i % 2 == 1 {
                    if d * 2 > 9 {
                        d * 2 - 9
                    } else {
                        d * 2
                    }
                } else {
                    d
                }
            })
            .sum();
        if !luhn_sum.is_multiple_of(10) {
            return Err(InvalidInput(
                "That card number has a typo (its check digit does not match).".into(),
            ));
        }
        Ok(CardNumber(digits))
    }

    pub fn last4(&self) -> &str {
        &self.0[self.0.len() - 4..]
    }
}

impl std::fmt::Debug for CardNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CardNumber(…{})", self.last4())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Charge {
    Approved,
    Declined(String),
}

pub trait PaymentGateway: Send + Sync {
    fn charge(&self, card: &CardNumber, amount: Money) -> Charge;
}

/// Test mode: 4242 4242 4242 4242 pays, 4000 0000 0000 0002 is declined,
/// and any other number is declined as unknown to the sandbox.
pub struct SandboxGateway;

impl SandboxGateway {
    pub const APPROVED_CARD: &'static str = "4242424242424242";
    pub const DECLINED_CARD: &'static str = "4000000000000002";
}

impl PaymentGateway for SandboxGateway {
    fn charge(&self, card: &CardNumber, _amount: Money) -> Charge {
        match card.0.as_str() {
            Self::APPROVED_CARD => Charge::Approved,
            Self::DECLINED_CARD => Charge::Declined("The card was declined by the issuer.".into()),
            _ => Charge::Declined("This sandbox only accepts its test cards.".into()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaymentOutcome {
    Paid,
    Declined(String),
}

/// Charges the card for `order`. An approval marks the order paid; a decline
/// marks it `payment_failed` and puts its units back under the product locks.
pub async fn pay(
    shop: &Shop,
    customer: CustomerId,
    order: OrderId,
    card: CardNumber,
) -> Result<PaymentOutcome, AppError> {
    let gateway = shop.gateway.clone();
    // The order row lock serialises payments of one order, so a double click
    // can never charge twice. Paying changes no stock, so no product lock here.
    let charge = db::run(&shop.pool, move |conn| {
        conn.transaction(|conn| {
            let current: Order = orders::table
                .find(order.get())
                .for_update()
                .select(Order::as_select())
                .first(conn)
                .optional()?
                .filter(|o| o.customer_id == customer.get())
                .ok_or_else(|| AppError::NotFound(format!("You have no order {order}.")))?;
            current
                .status()
                .transition(OrderStatus::Paid)
                .map_err(|refused| refused_transition(order, refused.from, OrderStatus::Paid))?;
            if Utc::now() >= current.payment_deadline {
                return Err(AppError::conflict(
                    "Payment window closed",
                    format!("The time to pay for order {order} has run out, so its units may already belong to someone else. You were not charged."),
                ));
            }
            let charge = gateway.charge(&card, current.total());
            let outcome = match charge {
                Charge::Approved => "approved",
                Charge::Declined(_) => "declined",
            };
            diesel::insert_into(payments::table)
                .values(NewPayment {
                    order_id: order.get(),
                    outcome,
                    amount_cents: current.total_cents,
                    card_last4: card.last4(),
                })
                .execute(conn)?;
            if charge == Charge::Approved {
                set_status(conn, order, OrderStatus::Paid)?;
            }
            Ok(charge)
        })
    })
    .await?;
    match charge {
        Charge::Approved => Ok(PaymentOutcome::Paid),
        Charge::Declined(reason) => {
            // If this restore cannot run now (Redis down), the order stays
            // awaiting payment and the expiry job releases it at its deadline.
            restore_order(shop, order, OrderStatus::PaymentFailed, None).await?;
            Ok(PaymentOutcome::Declined(reason))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_numbers_are_luhn_checked() {
        assert_eq!(
            CardNumber::parse("4242 4242 4242 4242").unwrap().last4(),
            "4242"
        );
        assert_eq!(
            CardNumber::parse("4000-0000-0000-0002").unwrap().last4(),
            "0002"
        );
        for bad in [
            "",
            "4242",
            "4242 4242 4242 4241",
            "abcd abcd abcd abcd",
            "4242424242424242424242",
        ] {
            assert!(CardNumber::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn sandbox_decides_by_test_card() {
        let amount = Money::from_cents(100).unwrap();
        let ok = CardNumber::parse(SandboxGateway::APPROVED_CARD).unwrap();
        let declined = CardNumber::parse(SandboxGateway::DECLINED_CARD).unwrap();
        assert_eq!(SandboxGateway.charge(&ok, amount), Charge::Approved);
        assert!(matches!(
            SandboxGateway.charge(&declined, amount),
            Charge::Declined(_)
        ));
        assert!(!format!("{ok:?}").contains("42424242"));
    }
}
