//! Paying for an order: the provider chosen by `PAYMENT_PROVIDER` charges
//! the card; an approval marks the order paid, a decline restores its units.

use chrono::Utc;
use diesel::prelude::*;

use super::restore::{refused_transition, restore_order, set_status};
use super::Shop;
use crate::db::models::{NewPayment, Order};
use crate::db::schema::{orders, payments};
use crate::db::{self};
use crate::domain::{CardNumber, CustomerId, OrderId, OrderStatus};
use crate::error::AppError;
use crate::payment::Charge;

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
    let provider = shop.payment_provider.clone();
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
            let charge = provider.charge(&card, current.total());
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
            // The decline is committed, so it is the answer. Failing the
            // request here (lock busy, Redis down) would release its
            // idempotency key, and the customer's resend would charge again.
            if let Err(error) = restore_order(shop, order, OrderStatus::PaymentFailed, None).await {
                tracing::warn!(%order, %error, "could not restore a declined order now; retrying in the background");
                tokio::spawn(restore_declined_later(shop.clone(), order));
            }
            Ok(PaymentOutcome::Declined(reason))
        }
    }
}

/// Retries a declined order's restore a few times, backing off; if it still
/// cannot run (Redis down for long), the order stays awaiting payment and
/// the expiry job restores it at its deadline. Restoring twice is refused by
/// the order's state machine, so a retry racing the job is harmless.
async fn restore_declined_later(shop: Shop, order: OrderId) {
    let mut wait = std::time::Duration::from_millis(500);
    for _ in 0..6 {
        tokio::time::sleep(wait).await;
        match restore_order(&shop, order, OrderStatus::PaymentFailed, None).await {
            Ok(_) => return,
            // Paid, expired or restored meanwhile: nothing left to do.
            Err(AppError::Conflict { .. }) => return,
            Err(error) => {
                tracing::warn!(%order, %error, "restore of a declined order failed again")
            }
        }
        wait *= 2;
    }
}
