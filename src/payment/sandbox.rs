//! The sandbox provider behaves like a payment provider's test mode: fixed
//! card numbers decide the outcome, and no money moves. It keeps its books
//! (`sandbox_charges`) in its own transactions, never the shop's, so a
//! lookup after a lost answer or a restart finds what it did.

use std::time::Duration;

use diesel::prelude::*;
use futures::future::BoxFuture;
use futures::FutureExt;

use super::{Charge, NoAnswer, PaymentProvider};
use crate::db::schema::sandbox_charges;
use crate::db::{self, PgPool};
use crate::domain::{CardNumber, Money};
use crate::error::AppError;

/// Test mode: 4242 4242 4242 4242 pays, 4000 0000 0000 0002 is declined,
/// 4000 0000 0000 0077 pays after `SLOW_ANSWER` (longer than the shop waits),
/// 4000 0000 0000 0093 pays and its answer is lost on the way back; any other
/// number is declined as unknown to the sandbox.
pub struct SandboxProvider {
    books: PgPool,
}

impl SandboxProvider {
    pub const APPROVED_CARD: &'static str = "4242424242424242";
    pub const DECLINED_CARD: &'static str = "4000000000000002";
    pub const SLOW_CARD: &'static str = "4000000000000077";
    pub const LOST_ANSWER_CARD: &'static str = "4000000000000093";
    pub const SLOW_ANSWER: Duration = Duration::from_secs(3);

    pub fn new(books: PgPool) -> SandboxProvider {
        SandboxProvider { books }
    }

    /// What the card decides, before any books are kept.
    pub fn decide(card: &CardNumber) -> Charge {
        match card.digits() {
            Self::APPROVED_CARD | Self::SLOW_CARD | Self::LOST_ANSWER_CARD => Charge::Approved,
            Self::DECLINED_CARD => Charge::Declined("The card was declined by the issuer.".into()),
            _ => Charge::Declined("This sandbox only accepts its test cards.".into()),
        }
    }
}

/// Records `charge` for `attempt` unless an earlier call did; answers what
/// is on the books.
async fn book(
    books: PgPool,
    attempt: String,
    charge: Charge,
    amount: Money,
) -> Result<Charge, AppError> {
    db::run(&books, move |conn| {
        let (approved, reason) = match &charge {
            Charge::Approved => (true, String::new()),
            Charge::Declined(reason) => (false, reason.clone()),
            Charge::Voided => (false, VOIDED.to_string()),
        };
        diesel::insert_into(sandbox_charges::table)
            .values((
                sandbox_charges::attempt_key.eq(&attempt),
                sandbox_charges::approved.eq(approved),
                sandbox_charges::reason.eq(&reason),
                sandbox_charges::amount_cents.eq(amount.cents()),
            ))
            .on_conflict_do_nothing()
            .execute(conn)?;
        Ok(read(conn, &attempt)?.unwrap_or(charge))
    })
    .await
}

fn read(conn: &mut db::PgConn, attempt: &str) -> QueryResult<Option<Charge>> {
    let found: Option<(bool, String)> = sandbox_charges::table
        .find(attempt)
        .select((sandbox_charges::approved, sandbox_charges::reason))
        .first(conn)
        .optional()?;
    Ok(found.map(|(approved, reason)| {
        if approved {
            Charge::Approved
        } else if reason == VOIDED {
            Charge::Voided
        } else {
            Charge::Declined(reason)
        }
    }))
}

impl PaymentProvider for SandboxProvider {
    fn charge<'a>(
        &'a self,
        attempt: &'a str,
        card: &'a CardNumber,
        amount: Money,
    ) -> BoxFuture<'a, Result<Charge, NoAnswer>> {
        // The provider's side runs on its own: a shop that stops waiting
        // for the answer does not stop the charge, as with a real provider.
        let slow = card.digits() == Self::SLOW_CARD;
        let booking = crate::shutdown::spawn(book(
            self.books.clone(),
            attempt.to_string(),
            Self::decide(card),
            amount,
        ));
        async move {
            if slow {
                tokio::time::sleep(Self::SLOW_ANSWER).await;
            }
            let booked = booking
                .await
                .map_err(|e| NoAnswer(e.to_string()))?
                .map_err(|e| NoAnswer(e.to_string()))?;
            if card.digits() == Self::LOST_ANSWER_CARD {
                return Err(NoAnswer("the answer was lost on the way back".into()));
            }
            Ok(booked)
        }
        .boxed()
    }

    fn void_unless_decided<'a>(
        &'a self,
        attempt: &'a str,
    ) -> BoxFuture<'a, Result<Option<Charge>, NoAnswer>> {
        async move {
            let attempt = attempt.to_string();
            // The void is a booking like a charge's, on the same key: whichever
            // commits first is the attempt's outcome, so a charge arriving
            // after it finds the attempt void and charges nothing.
            db::run(&self.books, move |conn| {
                diesel::insert_into(sandbox_charges::table)
                    .values((
                        sandbox_charges::attempt_key.eq(&attempt),
                        sandbox_charges::approved.eq(false),
                        sandbox_charges::reason.eq(VOIDED),
                        sandbox_charges::amount_cents.eq(0),
                    ))
                    .on_conflict_do_nothing()
                    .execute(conn)?;
                Ok(read(conn, &attempt)?.filter(|charge| *charge != Charge::Voided))
            })
            .await
            .map_err(|e| NoAnswer(e.to_string()))
        }
        .boxed()
    }
}

/// The reason on the books of an attempt the shop voided before it charged.
const VOIDED: &str = "Voided by the shop before any charge.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_decides_by_test_card() {
        let ok = CardNumber::parse(SandboxProvider::APPROVED_CARD).unwrap();
        let declined = CardNumber::parse(SandboxProvider::DECLINED_CARD).unwrap();
        assert_eq!(SandboxProvider::decide(&ok), Charge::Approved);
        assert!(matches!(
            SandboxProvider::decide(&declined),
            Charge::Declined(_)
        ));
        for card in [
            SandboxProvider::SLOW_CARD,
            SandboxProvider::LOST_ANSWER_CARD,
        ] {
            let card = CardNumber::parse(card).unwrap();
            assert_eq!(SandboxProvider::decide(&card), Charge::Approved);
        }
        assert!(!format!("{ok:?}").contains("42424242"));
    }
}
