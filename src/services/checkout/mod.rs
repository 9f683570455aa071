//! Checkout: how a purchase is served.
//!
//! `purchase` is the one entry point. It admits the buyer at the stock gate
//! (`admission`), then hands a single-product purchase to its product's
//! batch (`batch`: one lock hold and one commit for many buyers) or serves a
//! cart alone (`lone`). Both check every buyer against the same `rules` and
//! write with the same `order_rows`; every path that fails to write hands
//! the admitted units back to the gate.
//!
//! A batch goes to the process's next purchase transaction (`group`), which
//! may carry other products' batches too; `sell` is one product's batch as
//! (part of) a transaction.
//!
//! A sale in queue mode is bought with a waiting-room pass
//! (`purchase_with_pass`, in `pass`): the purchase goes the same way, and
//! the order's own transaction checks the buyer's pass against the locked
//! product row and uses it (`rules`, `order_rows`).
//!
//! A purchase's idempotency key, from its admission at the gate to its
//! answer, is `answer_key`'s; the order's transaction names the order on it.
//!
//! Within this module calls go one way: `pass` -> `mod` -> `answer_key`,
//! `admission`, `batch`, `lone`; `answer_key` -> `admission`; `batch` ->
//! `group` -> `sell` (and `batch` -> `sell` for a batch served alone); all
//! of them -> `rules`, `order_rows`, `outcome`.

mod admission;
mod answer_key;
mod batch;
mod group;
mod lone;
mod order_rows;
mod outcome;
mod pass;
mod rules;
mod sell;

use chrono::Utc;
use tracing::Instrument;

pub use answer_key::{keeps_answers_at_gate, AnswerKey};
// A batch is reachable on its own so tests can queue buyers that no form
// would produce (an account that does not exist).
pub use batch::{buy_in_batch, Combiner};
pub use order_rows::{Buyer, KeyRow};
pub use outcome::{Line, PurchaseOutcome};
pub use pass::purchase_with_pass;

use std::time::Duration;

use crate::domain::{CustomerId, ProductId};
use crate::error::{AppError, Conflict, Invalid};
use crate::gate::StockGate;
use crate::services::stock_gate::give_back_all;
use crate::services::Shop;
use admission::{admit_all, new_admission_key, refusal_before_locking, unconfirmed_for_a_limit};
use answer_key::{admit_under_key, resolve_key, settle_at_gate, Settling};
use lone::buy_alone;

/// Buys `lines` (one order, all lines or none) for `customer`. The order is
/// named on `answer_key` in the order's own transaction, so a replay finds it.
/// A sale in queue mode is refused: it is bought with a pass, one product
/// at a time (`purchase_with_pass`).
pub async fn purchase(
    shop: &Shop,
    customer: CustomerId,
    mut lines: Vec<Line>,
    answer_key: Option<AnswerKey>,
) -> Result<PurchaseOutcome, AppError> {
    // Lock order and row-lock order are both ascending product id.
    lines.sort_by_key(|l| l.product);
    check_lines(shop, &lines, answer_key.as_ref())?;
    if let Some(name) = pass::queue_mode_among(shop, &lines).await? {
        return Err(Conflict::SaleHasWaitingRoom { name }.into());
    }
    // From admission on, the purchase runs on a task of its own: a buyer who
    // hangs up cancels the request, and with it anything awaited there, but
    // not the give-back of what the gate admitted for them, nor the answer
    // recorded under their key.
    let served = shop.clone();
    let purchase = async move { admit_and_buy(&served, customer, lines, answer_key, None).await };
    crate::shutdown::spawn(purchase.instrument(tracing::Span::current()))
        .await
        .map_err(|e| AppError::Internal(anyhow::anyhow!("purchase task failed: {e}")))?
}

/// What every purchase's lines must be, whatever its path.
fn check_lines(
    shop: &Shop,
    lines: &[Line],
    answer_key: Option<&AnswerKey>,
) -> Result<(), AppError> {
    if lines.is_empty() || lines.windows(2).any(|w| w[0].product == w[1].product) {
        return Err(AppError::Invalid(Invalid::LinesNotDistinct));
    }
    if matches!(answer_key, Some(AnswerKey::AtGate { .. }))
        && (lines.len() != 1 || shop.gate.is_none())
    {
        return Err(AppError::Internal(anyhow::anyhow!(
            "a key kept at the gate needs the gate and one product"
        )));
    }
    Ok(())
}

/// How a purchase got past the gate.
enum Admitted {
    /// The gate admitted it under this admission key.
    Gate(String),
    /// There is no gate: the locked check decides alone.
    NoGate,
}

/// `pass`: the number of the waiting-room pass a one-product purchase
/// presents; the order's transaction checks and uses it.
async fn admit_and_buy(
    shop: &Shop,
    customer: CustomerId,
    lines: Vec<Line>,
    answer_key: Option<AnswerKey>,
    pass: Option<i32>,
) -> Result<PurchaseOutcome, AppError> {
    let admitted = match admit(shop, customer, &lines, answer_key.as_ref()).await? {
        Ok(admitted) => admitted,
        Err(answered) => return Ok(answered),
    };
    let gate_key = match &admitted {
        Admitted::Gate(key) => Some(key.clone()),
        Admitted::NoGate => None,
    };
    let products: Vec<ProductId> = lines.iter().map(|l| l.product).collect();
    let payment_deadline = Utc::now() + shop.settings.payment_timeout;
    let key_row = answer_key.as_ref().map(AnswerKey::row);
    let result = if shop.settings.inject_fault_after_admission {
        Err(AppError::Internal(anyhow::anyhow!(
            "injected fault between admission and the database"
        )))
    } else if let ([line], Some(_)) = (lines.as_slice(), &shop.combiner) {
        let buyer = Buyer {
            customer,
            quantity: line.quantity,
            payment_deadline,
            gate_key: gate_key.clone(),
            answer_key: key_row,
            pass,
        };
        buy_in_batch(shop, line.product, buyer).await
    } else {
        buy_alone(
            shop,
            customer,
            lines,
            payment_deadline,
            gate_key.clone(),
            key_row,
            pass,
        )
        .await
    };
    let result = resolve_key(shop, customer, answer_key.as_ref(), result).await;
    if let (Some(gate), Admitted::Gate(admission)) = (&shop.gate, &admitted) {
        let retention = shop.settings.refusal_retention;
        hand_back(
            gate,
            customer,
            &products,
            admission,
            answer_key.as_ref(),
            retention,
            &result,
        )
        .await;
    }
    match result {
        Err(AppError::Busy) => Ok(PurchaseOutcome::Busy),
        Err(AppError::Unavailable(reason)) => Ok(PurchaseOutcome::Unavailable(reason)),
        other => other,
    }
}

/// Gets the purchase past the gate: `Ok` to go on to the lock, or `Err`
/// with the answer already decided (a refusal, or a repeat's answer).
async fn admit(
    shop: &Shop,
    customer: CustomerId,
    lines: &[Line],
    answer_key: Option<&AnswerKey>,
) -> Result<Result<Admitted, PurchaseOutcome>, AppError> {
    if let Some(refusal) = unconfirmed_for_a_limit(shop, customer, lines).await? {
        return Ok(Err(PurchaseOutcome::Refused(refusal)));
    }
    let Some(gate) = &shop.gate else {
        return Ok(match refusal_before_locking(shop, lines).await? {
            Some(refusal) => Err(PurchaseOutcome::Refused(refusal)),
            None => Ok(Admitted::NoGate),
        });
    };
    if let (Some(AnswerKey::AtGate { key, fingerprint }), [line]) = (answer_key, lines) {
        return Ok(
            admit_under_key(shop, gate, customer, line, key, fingerprint)
                .await?
                .map(Admitted::Gate),
        );
    }
    let admission = new_admission_key();
    Ok(
        match admit_all(shop, gate, customer, lines, admission).await? {
            Ok(admission) => Ok(Admitted::Gate(admission)),
            Err(refusal) => Err(PurchaseOutcome::Refused(refusal)),
        },
    )
}

/// Whatever kept the order from being written hands the admitted units back,
/// and the key's record at the gate is settled (`answer_key::settle_at_gate`).
/// An outcome still unknown does neither: the order may stand, and the record
/// keeps a resend from buying again until the database can say.
async fn hand_back(
    gate: &StockGate,
    customer: CustomerId,
    products: &[ProductId],
    admission: &str,
    answer_key: Option<&AnswerKey>,
    refusal_retention: Duration,
    result: &Result<PurchaseOutcome, AppError>,
) {
    if matches!(
        result,
        Ok(PurchaseOutcome::Purchased(_)) | Err(AppError::OutcomeUnknown(_))
    ) {
        return;
    }
    give_back_all(gate, admission, products).await;
    if let (Some(answer_key), [product]) = (answer_key, products) {
        let settled = Settling {
            gate,
            customer,
            product: *product,
            admission,
            refusal_retention,
        };
        settle_at_gate(&settled, answer_key, result).await;
    }
}
