//! One product's batch as a transaction: the row re-read `FOR UPDATE`, every
//! buyer checked in arrival order against it, every admitted buyer's rows
//! and the new stock written in one statement under the lock's fencing
//! token. A batch's leader runs it alone (`serve_batch`); the group
//! committer checks several products' batches the same way (`check_all`)
//! and writes them all in one statement.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;

use super::order_rows::{write_order, write_sales, Buyer, Sale, WrittenBuyer};
use super::outcome::PurchaseOutcome;
use super::rules::{check_buyer, holders_of, lock_product, pass_refusal, passes_of};
use crate::db::fence::{self, change_stock};
use crate::db::holdings::Holder;
use crate::db::{self, PgConn};
use crate::domain::{CustomerId, OrderId, Product, ProductId};
use crate::error::AppError;
use crate::lock::{Lease, LockError};
use crate::services::waiting_room::OpenPass;

/// One buyer's answer.
pub(super) type Answer = Result<PurchaseOutcome, AppError>;

/// The batch's transactions. Each buyer's answer is their own; an `Err`
/// from here (database gone, lease lost, fenced) means nothing was committed,
/// except `OutcomeUnknown`: the COMMIT went out and its answer was lost.
///
/// The usual case costs a handful of round trips however big the batch: the
/// checks run here in arrival order against the locked row, then one
/// statement writes every admitted buyer's order, item and ledger row and the
/// new stock. If Postgres refuses that statement (a constraint some buyer's
/// rows break), the transaction rolls back and the batch is served again
/// buyer by buyer, each under a savepoint, so only that buyer hears of it.
pub(super) fn serve_batch(
    conn: &mut PgConn,
    lease: &Lease,
    product: ProductId,
    buyers: &[Buyer],
) -> Result<Vec<Answer>, AppError> {
    match db::transaction(conn, |conn| serve_at_once(conn, lease, product, buyers)) {
        Ok(answers) => Ok(answers),
        Err(BatchError::RowsRefused(error)) => {
            tracing::warn!(%error, %product, "a batch's rows were refused; serving its buyers one by one");
            db::transaction(conn, |conn| serve_one_by_one(conn, lease, product, buyers))
        }
        Err(BatchError::KeyTaken) => {
            // A resend whose first request's order already stands: only that
            // buyer is refused, one by one finds out which.
            db::transaction(conn, |conn| serve_one_by_one(conn, lease, product, buyers))
        }
        Err(BatchError::Failed(error)) => Err(error),
    }
}

#[derive(Debug)]
pub(super) enum BatchError {
    /// The combined write broke a constraint: some buyer's rows are at fault.
    RowsRefused(diesel::result::Error),
    /// Some buyer's idempotency key was already taken by an earlier order.
    KeyTaken,
    /// Anything else fails the whole batch.
    Failed(AppError),
}

impl From<diesel::result::Error> for BatchError {
    fn from(error: diesel::result::Error) -> Self {
        BatchError::Failed(error.into())
    }
}

impl From<LockError> for BatchError {
    fn from(error: LockError) -> Self {
        BatchError::Failed(error.into())
    }
}

impl From<AppError> for BatchError {
    fn from(error: AppError) -> Self {
        BatchError::Failed(error)
    }
}

/// The locked product and what each customer of the batch already holds,
/// updated as buyers are served in arrival order.
pub(super) struct Tally {
    pub(super) product: Product,
    pub(super) held: HashMap<CustomerId, Holder>,
    /// The buyers' waiting-room passes, locked (queue mode only).
    pub(super) passes: HashMap<CustomerId, OpenPass>,
    pub(super) now: DateTime<Utc>,
}

impl Tally {
    fn lock(conn: &mut PgConn, product: ProductId, buyers: &[Buyer]) -> Result<Tally, AppError> {
        let locked = lock_product(conn, product)?;
        let customers: Vec<CustomerId> = buyers.iter().map(|b| b.customer).collect();
        let held = match locked.per_customer_limit {
            Some(_) => holders_of(conn, &customers, product)?,
            None => HashMap::new(),
        };
        let passes = passes_of(conn, &locked, &customers)?;
        Ok(Tally {
            product: locked,
            held,
            passes,
            now: Utc::now(),
        })
    }

    /// The same checks as a lone purchase: the stock left after this buyer,
    /// or their answer (a refusal).
    fn check(&self, buyer: &Buyer) -> Result<i32, Answer> {
        pass_refusal(
            &self.product,
            buyer.quantity,
            buyer.pass,
            self.passes.get(&buyer.customer),
        )
        .map_err(Err)?;
        check_buyer(&self.product, buyer.quantity, self.holder(buyer), self.now)
            .map_err(|refusal| Ok(PurchaseOutcome::Refused(refusal)))
    }

    fn holder(&self, buyer: &Buyer) -> Holder {
        self.held.get(&buyer.customer).copied().unwrap_or_default()
    }

    fn take(&mut self, buyer: &Buyer, stock_after: i32) {
        self.product.stock = stock_after;
        let mut holder = self.holder(buyer);
        holder.units += i64::from(buyer.quantity.get());
        self.held.insert(buyer.customer, holder);
        // A pass buys once: the same customer later in the batch (a second
        // form sent at once) finds it used.
        if let Some(pass) = self.passes.get_mut(&buyer.customer) {
            *pass = OpenPass::Used {
                number: pass.number(),
            };
        }
    }

    /// Every buyer checked in arrival order, each against the stock and
    /// holdings the ones before them left.
    pub(super) fn check_all(mut self, buyers: &[Buyer]) -> Checked<'_> {
        let mut answers = Vec::with_capacity(buyers.len());
        let mut taking = Vec::with_capacity(buyers.len());
        for buyer in buyers {
            match self.check(buyer) {
                Ok(stock_after) => {
                    self.take(buyer, stock_after);
                    taking.push((buyer, stock_after));
                    answers.push(None);
                }
                Err(answer) => answers.push(Some(answer)),
            }
        }
        Checked {
            product: self.product,
            answers,
            taking,
        }
    }
}

fn serve_at_once(
    conn: &mut PgConn,
    lease: &Lease,
    product_id: ProductId,
    buyers: &[Buyer],
) -> Result<Vec<Answer>, BatchError> {
    let tally = Tally::lock(conn, product_id, buyers)?;
    let answers = sell_at_once(conn, lease, tally, buyers)?;
    lease.ensure_valid()?;
    Ok(answers)
}

/// Every buyer checked in arrival order against the locked row, then one
/// statement for all the admitted ones. The lease is the caller's to check,
/// as the transaction's last step.
pub(super) fn sell_at_once(
    conn: &mut PgConn,
    lease: &Lease,
    tally: Tally,
    buyers: &[Buyer],
) -> Result<Vec<Answer>, BatchError> {
    let checked = tally.check_all(buyers);
    if checked.taking.is_empty() {
        return checked.answered(&[]);
    }
    let product_id = ProductId(checked.product.id);
    let sale = Sale {
        product: &checked.product,
        token: lease.token(product_id)?,
        taking: &checked.taking,
    };
    let written = write_sales(conn, &[sale]).map_err(refused_or_failed)?;
    if written.first().and_then(|w| w.stock).is_none() {
        return Err(fence::refused(conn, product_id)?.into());
    }
    checked.answered(&written)
}

/// One batch's buyers checked against its locked row: the refused ones'
/// answers, and the admitted ones with the stock left after each.
pub(super) struct Checked<'a> {
    pub(super) product: Product,
    /// In arrival order; `None` for an admitted buyer, answered once written.
    answers: Vec<Option<Answer>>,
    pub(super) taking: Vec<(&'a Buyer, i32)>,
}

impl Checked<'_> {
    /// Every buyer's answer, given the admitted buyers' rows as written, in
    /// their order. A key some earlier order took refuses the whole write.
    pub(super) fn answered(self, written: &[WrittenBuyer]) -> Result<Vec<Answer>, BatchError> {
        if written.iter().any(|w| !w.named) {
            return Err(BatchError::KeyTaken);
        }
        let mut orders = written.iter();
        self.answers
            .into_iter()
            .map(|answer| match answer {
                Some(answer) => Ok(answer),
                None => orders
                    .next()
                    .map(|order| Ok(PurchaseOutcome::Purchased(OrderId(order.order_id))))
                    .ok_or_else(|| {
                        AppError::Internal(anyhow::anyhow!("a batch buyer's order is missing"))
                            .into()
                    }),
            })
            .collect()
    }
}

/// A constraint broken by the combined write is some buyer's fault; the
/// rest (connection lost, timeout) is the batch's.
pub(super) fn refused_or_failed(error: diesel::result::Error) -> BatchError {
    use diesel::result::{DatabaseErrorKind as Kind, Error};
    match error {
        Error::DatabaseError(
            Kind::UniqueViolation
            | Kind::ForeignKeyViolation
            | Kind::CheckViolation
            | Kind::NotNullViolation,
            _,
        ) => BatchError::RowsRefused(error),
        other => BatchError::Failed(other.into()),
    }
}

/// The batch again, one buyer at a time, each under a savepoint: if writing
/// a buyer's rows fails, only they get the error and the rest go on.
fn serve_one_by_one(
    conn: &mut PgConn,
    lease: &Lease,
    product_id: ProductId,
    buyers: &[Buyer],
) -> Result<Vec<Answer>, AppError> {
    let mut tally = Tally::lock(conn, product_id, buyers)?;
    let stock_before = tally.product.stock;
    let mut answers = Vec::with_capacity(buyers.len());
    for buyer in buyers {
        let stock_after = match tally.check(buyer) {
            Ok(stock_after) => stock_after,
            Err(answer) => {
                answers.push(answer);
                continue;
            }
        };
        let written = conn.transaction(|conn| {
            write_order(
                conn,
                buyer.customer,
                &[(&tally.product, buyer.quantity, stock_after)],
                buyer.payment_deadline,
                buyer.gate_key.as_deref(),
                buyer.answer_key.as_ref(),
                buyer.pass,
            )
        });
        match written {
            Ok(order) => {
                tally.take(buyer, stock_after);
                answers.push(Ok(PurchaseOutcome::Purchased(order)));
            }
            Err(error) => answers.push(Err(error)),
        }
    }
    if tally.product.stock != stock_before {
        change_stock(conn, lease, product_id, tally.product.stock - stock_before)?;
    }
    lease.ensure_valid()?;
    Ok(answers)
}
