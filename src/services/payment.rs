//! Paying for an order, in two steps around the provider's call, as payment
//! providers' own guides say: the attempt is recorded (with the key the
//! provider deduplicates on) and committed; the provider is asked outside
//! any transaction, within `PAYMENT_PROVIDER_TIMEOUT_MS`; its answer is
//! recorded in a second transaction. An approval marks the order paid. A
//! decline leaves the order waiting for another card, its units still
//! held, until its `CARD_TRIES`th decline (counted in that second
//! transaction, under the order's row lock), the customer giving up
//! (`give_up`) or the deadline: then the payment-failure restore gives the
//! units back. An attempt left without an answer (a slow or lost reply, a
//! crash) stays pending and `settle_pending` asks the provider about it;
//! until then the order cannot expire.

use chrono::Utc;
use diesel::prelude::*;
use tracing::Instrument;

use super::mail::{self, Mail};
use super::restore::{refused_transition, restore_order, set_status};
use super::Shop;
use crate::db::models::NewPayment;
use crate::db::schema::{orders, payments};
use crate::db::{self, PgConn};
use crate::domain::{CardNumber, CustomerId, Money, Order, OrderId, OrderStatus};
use crate::error::{AppError, Conflict, Missing};
use crate::payment::Charge;

/// Declined cards an order takes before its units go back: one typo must
/// not lose a hard-won unit, but an order cannot hold units for endless
/// guesses either (its deadline bounds the time, this the tries).
pub const CARD_TRIES: i64 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaymentOutcome {
    Paid,
    /// Declined; with `tries_left` > 0 the order still holds its units and
    /// may be paid with another card, at 0 its units are going back.
    /// `reason` is the provider's, as it gave it.
    Declined {
        reason: String,
        tries_left: i64,
    },
    /// The charge reached the provider after the settling job had voided
    /// it (this request was paused or slow): nothing was charged and
    /// nothing restored, so the order may be paid again.
    Voided {
        tries_left: i64,
    },
    /// The provider has not answered yet (or its answer was lost): the
    /// attempt is recorded and will be settled by asking the provider.
    Pending,
}

/// A recorded attempt, before the provider is asked.
struct Attempt {
    key: String,
    amount: Money,
}

/// Charges the card for `order`, at most once per attempt. Runs on a task of
/// its own, so a customer who hangs up mid-payment does not leave an
/// answered charge unrecorded.
pub async fn pay(
    shop: &Shop,
    customer: CustomerId,
    order: OrderId,
    card: CardNumber,
) -> Result<PaymentOutcome, AppError> {
    let shop = shop.clone();
    let payment = async move { pay_to_the_end(&shop, customer, order, card).await };
    crate::shutdown::spawn(payment.instrument(tracing::Span::current()))
        .await
        .map_err(|e| AppError::Internal(anyhow::anyhow!("payment task failed: {e}")))?
}

async fn pay_to_the_end(
    shop: &Shop,
    customer: CustomerId,
    order: OrderId,
    card: CardNumber,
) -> Result<PaymentOutcome, AppError> {
    let last4 = card.last4().to_string();
    let attempt = db::run(&shop.pool, move |conn| {
        conn.transaction(|conn| record_attempt(conn, customer, order, &last4))
    })
    .await?;
    let asked = shop
        .payment_provider
        .charge(&attempt.key, &card, attempt.amount);
    let charge = match tokio::time::timeout(shop.settings.payment_provider_timeout, asked).await {
        Ok(Ok(charge)) => charge,
        Ok(Err(no_answer)) => {
            tracing::warn!(%order, %no_answer, "no answer from the payment provider; the attempt stays pending");
            return Ok(PaymentOutcome::Pending);
        }
        Err(_) => {
            tracing::warn!(%order, "the payment provider did not answer in time; the attempt stays pending");
            return Ok(PaymentOutcome::Pending);
        }
    };
    settle(shop, order, attempt.key, charge).await
}

/// The first step: under the order's row lock (which serialises payments of
/// one order), check the order may be paid and record a pending attempt.
fn record_attempt(
    conn: &mut PgConn,
    customer: CustomerId,
    order: OrderId,
    card_last4: &str,
) -> Result<Attempt, AppError> {
    let current: Order = orders::table
        .find(order.get())
        .for_update()
        .select(Order::as_select())
        .first(conn)
        .optional()?
        .filter(|o| o.customer_id == customer.get())
        .ok_or_else(|| AppError::NotFound(Missing::YourOrder(order)))?;
    current
        .status()
        .transition(OrderStatus::Paid)
        .map_err(|refused| refused_transition(order, refused.from, OrderStatus::Paid))?;
    if Utc::now() >= current.payment_deadline {
        return Err(Conflict::PaymentWindowClosed(order).into());
    }
    let declined: i64 = payments::table
        .filter(payments::order_id.eq(order.get()))
        .filter(payments::outcome.eq("declined"))
        .count()
        .get_result(conn)?;
    // The last decline ends its order: its restore may still be on its way
    // (the lock was busy), and a charge approved after that restore would
    // pay for units already back on sale.
    if declined >= CARD_TRIES {
        return Err(Conflict::CardsDeclined { order, declined }.into());
    }
    let pending: i64 = payments::table
        .filter(payments::order_id.eq(order.get()))
        .filter(payments::outcome.eq("pending"))
        .count()
        .get_result(conn)?;
    if pending > 0 {
        return Err(Conflict::PaymentPending(order).into());
    }
    let key = uuid::Uuid::new_v4().to_string();
    diesel::insert_into(payments::table)
        .values(NewPayment {
            order_id: order.get(),
            outcome: "pending",
            amount_cents: current.total_cents,
            card_last4,
            attempt_key: &key,
        })
        .execute(conn)?;
    Ok(Attempt {
        key,
        amount: current.total(),
    })
}

/// The second step: records what the provider said about `attempt`, once.
/// Whoever settles it first (the paying request or the settling job) moves
/// the order; the other finds it settled and only reports.
async fn settle(
    shop: &Shop,
    order: OrderId,
    attempt: String,
    charge: Charge,
) -> Result<PaymentOutcome, AppError> {
    let recorded = charge.clone();
    let (settled_now, declines) = db::run(&shop.pool, move |conn| {
        conn.transaction(|conn| {
            let (customer, total_cents) = orders::table
                .find(order.get())
                .for_update()
                .select((orders::customer_id, orders::total_cents))
                .first::<(i64, i64)>(conn)?;
            let outcome = match &recorded {
                Charge::Approved => "approved",
                Charge::Declined(_) => "declined",
                Charge::Voided => "voided",
            };
            let settled: Option<i64> = diesel::update(
                payments::table
                    .filter(payments::attempt_key.eq(&attempt))
                    .filter(payments::outcome.eq("pending")),
            )
            .set((
                payments::outcome.eq(outcome),
                payments::settled_at.eq(Utc::now()),
            ))
            .returning(payments::id)
            .get_result(conn)
            .optional()?;
            if settled.is_some() && recorded == Charge::Approved {
                set_status(conn, order, OrderStatus::Paid)?;
                mail::enqueue(
                    conn,
                    CustomerId(customer),
                    &Mail::OrderPaid {
                        order: order.get(),
                        total_cents,
                    },
                )?;
            }
            // Counted under the order's row lock, with this decline in it:
            // exactly one settle sees the last try.
            let declines: i64 = payments::table
                .filter(payments::order_id.eq(order.get()))
                .filter(payments::outcome.eq("declined"))
                .count()
                .get_result(conn)?;
            if let (Some(payment), Charge::Declined(_)) = (settled, &recorded) {
                mail::enqueue(
                    conn,
                    CustomerId(customer),
                    &Mail::PaymentDeclined {
                        payment,
                        order: order.get(),
                        tries_left: (CARD_TRIES - declines).max(0),
                    },
                )?;
            }
            Ok((settled.is_some(), declines))
        })
    })
    .await?;
    match charge {
        Charge::Approved => Ok(PaymentOutcome::Paid),
        Charge::Declined(reason) => {
            let tries_left = (CARD_TRIES - declines).max(0);
            if settled_now && tries_left == 0 {
                restore_declined(shop, order).await;
            }
            Ok(PaymentOutcome::Declined { reason, tries_left })
        }
        // Its charge came after the settling job had voided it (this request
        // was paused or slow): nothing is restored, the order may be paid again.
        Charge::Voided => Ok(PaymentOutcome::Voided {
            tries_left: (CARD_TRIES - declines).max(0),
        }),
    }
}

/// The customer gives up paying for `order`: its units go back now rather
/// than at its deadline, through the same payment-failure restore (product
/// locks, row locks) as a last decline. A resend finds it done.
pub async fn give_up(shop: &Shop, customer: CustomerId, order: OrderId) -> Result<(), AppError> {
    let status: Option<String> = db::run(&shop.pool, move |conn| {
        Ok(orders::table
            .find(order.get())
            .filter(orders::customer_id.eq(customer.get()))
            .select(orders::status)
            .first(conn)
            .optional()?)
    })
    .await?;
    let status = status.ok_or_else(|| AppError::NotFound(Missing::YourOrder(order)))?;
    if status == OrderStatus::PaymentFailed.as_str() {
        return Ok(());
    }
    restore_order(shop, order, OrderStatus::PaymentFailed, None).await?;
    Ok(())
}

/// The decline is committed, so it is the answer. Failing the request when
/// the restore cannot run now (lock busy, Redis down) would release its
/// idempotency key, and the customer's resend would charge again.
async fn restore_declined(shop: &Shop, order: OrderId) {
    match restore_order(shop, order, OrderStatus::PaymentFailed, None).await {
        Ok(_) => {}
        Err(error) if !worth_retrying(&error) => {
            tracing::info!(%order, %error, "a declined order left awaiting payment before its restore; nothing to retry");
        }
        Err(error) => {
            tracing::warn!(%order, %error, "could not restore a declined order now; retrying in the background");
            crate::shutdown::spawn(restore_declined_later(shop.clone(), order));
        }
    }
}

/// Whether a declined order's restore that failed with `error` is worth
/// retrying. A conflict is the order's state machine refusing: the order
/// has already left "awaiting payment" (the customer gave up, or it expired
/// or was restored meanwhile), and no retry changes that, so a background
/// retry would only sleep and be refused again. Anything else (a busy
/// lock, Redis or Postgres away for a moment) may pass on a later try.
fn worth_retrying(error: &AppError) -> bool {
    !matches!(error, AppError::Conflict(_))
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SettleReport {
    pub paid: usize,
    pub declined: usize,
    /// Attempts the provider had not decided: voided there, so nothing was
    /// or will be charged.
    pub never_charged: usize,
    /// Still without an answer; asked again next run.
    pub unanswered: usize,
}

/// One pass of the settling job: every attempt pending for longer than the
/// provider may take is settled by what the provider decided, or voided there
/// first if it decided nothing yet.
pub async fn settle_pending(shop: &Shop) -> Result<SettleReport, AppError> {
    let older_than = Utc::now()
        - chrono::Duration::from_std(shop.settings.payment_provider_timeout * 2)
            .unwrap_or_else(|_| chrono::Duration::seconds(60));
    let pending: Vec<(i64, String)> = db::run(&shop.pool, move |conn| {
        Ok(payments::table
            .filter(payments::outcome.eq("pending"))
            .filter(payments::created_at.lt(older_than))
            .order(payments::id.asc())
            .limit(200)
            .select((payments::order_id, payments::attempt_key))
            .load(conn)?)
    })
    .await?;
    let mut report = SettleReport::default();
    for (order, attempt) in pending {
        let order = OrderId(order);
        match shop.payment_provider.void_unless_decided(&attempt).await {
            Ok(Some(charge)) => match settle(shop, order, attempt, charge).await? {
                PaymentOutcome::Paid => report.paid += 1,
                PaymentOutcome::Declined { .. }
                | PaymentOutcome::Voided { .. }
                | PaymentOutcome::Pending => report.declined += 1,
            },
            Ok(None) => {
                // Void at the provider, so never charged: the order may
                // still be paid before its deadline.
                let attempt = attempt.clone();
                db::run(&shop.pool, move |conn| {
                    diesel::update(
                        payments::table
                            .filter(payments::attempt_key.eq(&attempt))
                            .filter(payments::outcome.eq("pending")),
                    )
                    .set((
                        payments::outcome.eq("voided"),
                        payments::settled_at.eq(Utc::now()),
                    ))
                    .execute(conn)?;
                    Ok(())
                })
                .await?;
                report.never_charged += 1;
            }
            Err(no_answer) => {
                tracing::warn!(%order, %no_answer, "payment provider still gives no answer; will ask again");
                report.unanswered += 1;
            }
        }
    }
    Ok(report)
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
            Err(error) if !worth_retrying(&error) => return,
            Err(error) => {
                tracing::warn!(%order, %error, "restore of a declined order failed again")
            }
        }
        wait *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_restore_is_not_retried_but_a_busy_one_is() {
        let refused = refused_transition(
            OrderId(7),
            OrderStatus::PaymentFailed,
            OrderStatus::PaymentFailed,
        );
        assert!(matches!(refused, AppError::Conflict(_)), "{refused:?}");
        assert!(!worth_retrying(&refused));
        assert!(worth_retrying(&AppError::Busy));
        assert!(worth_retrying(&AppError::Unavailable("redis".into())));
    }
}
