//! A purchase's idempotency key, from admission to answer. Where the key is
//! kept (`AnswerKey`), how a repeat is answered at the gate while or after
//! its first request runs (`admit_under_key`), what the key says when a
//! purchase could not tell whether it committed (`resolve_key`), and what
//! becomes of its record at the gate when no order was written
//! (`settle_at_gate`). The order's transaction names the order on the key
//! (`order_rows`); the claims in Postgres are `services::idempotency`'s.

use std::time::Duration;

use super::admission::{admit_keyed, new_admission_key, KeyedAdmission};
use super::order_rows::KeyRow;
use super::outcome::{Line, PurchaseOutcome};
use crate::domain::{CustomerId, IdempotencyKey, OrderId, ProductId};
use crate::error::AppError;
use crate::gate::{AnswerRecord, StockGate};
use crate::services::idempotency::{key_use, order_named, KeyUse};
use crate::services::stock_gate::give_back_all;
use crate::services::Shop;

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
    pub(super) fn key(&self) -> &IdempotencyKey {
        match self {
            AnswerKey::Claimed(key) | AnswerKey::AtGate { key, .. } => key,
        }
    }

    pub(super) fn row(&self) -> KeyRow {
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

/// How often a repeat looks again at a request still in flight under its key.
const POLL: Duration = Duration::from_millis(25);

/// The gate's answer for a purchase whose key it keeps: its admission, or
/// the answer already decided. A repeat of a
/// request still in flight waits for it, about as long as that one can take
/// to get its lock; one whose first request can no longer commit (older than
/// any purchase runs) and bought nothing is taken over.
pub(super) async fn admit_under_key(
    shop: &Shop,
    gate: &StockGate,
    customer: CustomerId,
    line: &Line,
    key: &IdempotencyKey,
    fingerprint: &str,
) -> Result<Result<String, PurchaseOutcome>, AppError> {
    let record = AnswerRecord {
        key: key.as_str(),
        fingerprint,
        refusal_retention: shop.settings.refusal_retention,
    };
    let patience = tokio::time::Instant::now() + shop.settings.lock_wait * 2;
    loop {
        let admission = new_admission_key();
        match admit_keyed(shop, gate, customer, line, &admission, &record).await? {
            KeyedAdmission::Admitted => return Ok(Ok(admission)),
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
pub(super) async fn resolve_key(
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

/// A purchase that wrote no order, at its one product's gate slot.
pub(super) struct Settling<'a> {
    pub gate: &'a StockGate,
    pub customer: CustomerId,
    pub product: ProductId,
    pub admission: &'a str,
    pub refusal_retention: Duration,
}

/// The key's record at the gate becomes the answer (a refusal) or goes
/// (nothing happened, so the same form may be sent again). Its admitted
/// units were already handed back.
pub(super) async fn settle_at_gate(
    settling: &Settling<'_>,
    answer_key: &AnswerKey,
    result: &Result<PurchaseOutcome, AppError>,
) {
    let AnswerKey::AtGate { key, fingerprint } = answer_key else {
        return;
    };
    let Settling {
        gate,
        customer,
        product,
        admission,
        refusal_retention,
    } = *settling;
    let kept = match result {
        Ok(PurchaseOutcome::Refused(refusal)) => {
            let record = AnswerRecord {
                key: key.as_str(),
                fingerprint,
                refusal_retention,
            };
            gate.record_refusal(product, customer, &record, admission, refusal)
                .await
                .map(|_| ())
        }
        // The order a repeat found stands under its own admission.
        Ok(PurchaseOutcome::AlreadyOrdered(_) | PurchaseOutcome::RefusedBefore(_)) => Ok(()),
        _ => gate
            .forget_admission(product, customer, key.as_str(), admission)
            .await
            .map(|_| ()),
    };
    if let Err(error) = kept {
        tracing::warn!(%error, %product, "could not update a purchase's answer record at the gate");
    }
}
