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
//! Within this module calls go one way: `pass` -> `mod` -> `admission`,
//! `batch`, `lone`; `batch` -> `group` -> `sell` (and `batch` -> `sell` for
//! a batch served alone); all of them -> `rules`, `order_rows`, `outcome`.

mod admission;
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

// A batch is reachable on its own so tests can queue buyers that no form
// would produce (an account that does not exist).
pub use batch::{buy_in_batch, Combiner};
pub use order_rows::{Buyer, KeyRow};
pub use outcome::{Line, PurchaseOutcome};
pub use pass::purchase_with_pass;

use std::time::Duration;

use crate::domain::{CustomerId, IdempotencyKey, OrderId, ProductId};
use crate::error::{AppError, Conflict, Invalid};
use crate::gate::{AnswerRecord, StockGate};
use crate::services::idempotency::{key_use, order_named, KeyUse};
use crate::services::stock_gate::give_back_all;
use crate::services::Shop;
use admission::{
    admit_all, admit_keyed, refusal_before_locking, unconfirmed_for_a_limit, KeyedAdmission,
};
use lone::buy_alone;

/// The idempotency key a purchase answers under, and who holds it.
#[derive(Debug, Clone)]
pub enum AnswerKey {
    /// Claimed in Postgres before the purchase (a cart, or the gate off):
    /// the order is named on that claim in its own transaction.
    Claimed(IdempotencyKey),
    /// Kept by the stock gate with the request's fingerprint: a refusal is
    /// recorded there, where it is decided, and the order's transaction
    /// writes the key's row. Only for one product (one gate slot).
    AtGate {
        key: IdempotencyKey,
        fingerprint: String,
    },
}

impl AnswerKey {
    fn key(&self) -> &IdempotencyKey {
        match self {
            AnswerKey::Claimed(key) | AnswerKey::AtGate { key, .. } => key,
        }
    }

    fn row(&self) -> KeyRow {
        match self {
            AnswerKey::Claimed(key) => KeyRow {
                key: key.as_str().to_string(),
                fingerprint: None,
            },
            AnswerKey::AtGate { key, fingerprint } => KeyRow {
                key: key.as_str().to_string(),
                fingerprint: Some(fingerprint.clone()),
            },
        }
    }
}

/// Whether a one-product purchase's key can be kept at the gate (so a
/// refusal costs no Postgres write at all).
pub fn keeps_answers_at_gate(shop: &Shop) -> bool {
    shop.gate.is_some()
}

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

/// A new admission's name at the gate. Random from the thread's CSPRNG, not
/// one system call per buyer: it needs to be unique, not secret.
fn admission_key() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .simple()
        .to_string()
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
        return admit_under_key(shop, gate, customer, line, key, fingerprint).await;
    }
    let admission = admission_key();
    Ok(
        match admit_all(shop, gate, customer, lines, admission).await? {
            Ok(admission) => Ok(Admitted::Gate(admission)),
            Err(refusal) => Err(PurchaseOutcome::Refused(refusal)),
        },
    )
}

/// How often a repeat looks again at a request still in flight under its key.
const POLL: Duration = Duration::from_millis(25);

/// The gate's answer for a purchase whose key it keeps. A repeat of a
/// request still in flight waits for it, about as long as that one can take
/// to get its lock; one whose first request can no longer commit (older than
/// any purchase runs) and bought nothing is taken over.
async fn admit_under_key(
    shop: &Shop,
    gate: &StockGate,
    customer: CustomerId,
    line: &Line,
    key: &IdempotencyKey,
    fingerprint: &str,
) -> Result<Result<Admitted, PurchaseOutcome>, AppError> {
    let record = AnswerRecord {
        key: key.as_str(),
        fingerprint,
        refusal_retention: shop.settings.refusal_retention,
    };
    let patience = tokio::time::Instant::now() + shop.settings.lock_wait * 2;
    loop {
        let admission = admission_key();
        match admit_keyed(shop, gate, customer, line, &admission, &record).await? {
            KeyedAdmission::Admitted => return Ok(Ok(Admitted::Gate(admission))),
            KeyedAdmission::Refused(refusal) => return Ok(Err(PurchaseOutcome::Refused(refusal))),
            KeyedAdmission::RefusedBefore(refusal) => {
                return Ok(Err(PurchaseOutcome::RefusedBefore(refusal)))
            }
            KeyedAdmission::AdmittedBefore { admission, age } => {
                if let Some(order) = order_named(&shop.bookkeeping, customer, key).await? {
                    return Ok(Err(PurchaseOutcome::AlreadyOrdered(order)));
                }
                if age > shop.settings.longest_purchase() {
                    // No request can still commit under it, and none did:
                    // its units come back (unless a resync already counted
                    // them back) and the key is free for this one.
                    give_back_all(gate, &admission, &[line.product]).await;
                    gate.forget_admission(line.product, customer, key.as_str(), &admission)
                        .await?;
                } else if tokio::time::Instant::now() < patience {
                    tokio::time::sleep(POLL).await;
                } else {
                    return Err(AppError::KeyInProgress);
                }
            }
        }
    }
}

/// What the key says when the purchase could not tell: after a COMMIT whose
/// answer was lost, the key's row says whether the order landed (it is
/// written in the order's transaction); a key an earlier order took names
/// that order, which is the answer to this repeat.
async fn resolve_key(
    shop: &Shop,
    customer: CustomerId,
    answer_key: Option<&AnswerKey>,
    result: Result<PurchaseOutcome, AppError>,
) -> Result<PurchaseOutcome, AppError> {
    let Some(answer_key) = answer_key else {
        return result;
    };
    match result {
        Err(AppError::KeyTaken) => {
            let used = key_use(&shop.bookkeeping, customer, answer_key.key()).await?;
            match (used, answer_key) {
                // The key was used for another request (another product, say).
                (Some(used), AnswerKey::AtGate { fingerprint, .. })
                    if &used.fingerprint != fingerprint =>
                {
                    Err(AppError::KeyReused)
                }
                (
                    Some(KeyUse {
                        order: Some(order), ..
                    }),
                    _,
                ) => Ok(PurchaseOutcome::AlreadyOrdered(order)),
                _ => Err(AppError::KeyInProgress),
            }
        }
        Err(AppError::OutcomeUnknown(reason)) => {
            match order_after_uncertain_commit(shop, customer, answer_key.key()).await {
                Some(Some(order)) => Ok(PurchaseOutcome::Purchased(order)),
                // Provably nothing committed.
                Some(None) => Err(AppError::Unavailable(reason)),
                None => Err(AppError::OutcomeUnknown(reason)),
            }
        }
        other => other,
    }
}

/// The order the key names after a COMMIT lost its answer: `Some(Some)`, none
/// (`Some(None)`: nothing was bought), or `None` when the database does not
/// answer either, and nobody can tell yet.
async fn order_after_uncertain_commit(
    shop: &Shop,
    customer: CustomerId,
    key: &IdempotencyKey,
) -> Option<Option<OrderId>> {
    for attempt in 0..3 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        match order_named(&shop.bookkeeping, customer, key).await {
            Ok(order) => return Some(order),
            Err(error) => tracing::warn!(%error, "looking up an uncertain purchase"),
        }
    }
    None
}

/// Whatever kept the order from being written hands the admitted units back,
/// and the key's record at the gate becomes the answer (a refusal) or goes
/// (nothing happened, so the same form may be sent again). An outcome still
/// unknown does neither: the order may stand, and the record keeps a resend
/// from buying again until the database can say.
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
    let (Some(AnswerKey::AtGate { key, fingerprint }), [product]) = (answer_key, products) else {
        return;
    };
    let kept = match result {
        Ok(PurchaseOutcome::Refused(refusal)) => {
            let record = AnswerRecord {
                key: key.as_str(),
                fingerprint,
                refusal_retention,
            };
            gate.record_refusal(*product, customer, &record, admission, refusal)
                .await
                .map(|_| ())
        }
        // The order a repeat found stands under its own admission.
        Ok(PurchaseOutcome::AlreadyOrdered(_) | PurchaseOutcome::RefusedBefore(_)) => Ok(()),
        _ => gate
            .forget_admission(*product, customer, key.as_str(), admission)
            .await
            .map(|_| ()),
    };
    if let Err(error) = kept {
        tracing::warn!(%error, %product, "could not update a purchase's answer record at the gate");
    }
}
