//! Buying a sale in queue mode: with a waiting-room pass of the buyer's own.
//!
//! The pass is claimed before anything else, under a fresh admission key,
//! so a refused pass costs nothing and holds nothing. The purchase then goes
//! the usual way under that same key (the gate's admission and the order's
//! `gate_key`). Afterwards the claim follows what the purchase came to:
//! an order committed, the pass is used (in Postgres, then in Redis); the
//! purchase wrote nothing, the pass is open again until its deadline; an
//! outcome unknown leaves the claim as it is, for the tick to settle once
//! no purchase can still commit under it (an order carries the key, or it
//! lapses).

use tracing::Instrument;

use super::{admission_key, admit_and_buy, check_lines, AnswerKey, Line, PurchaseOutcome};
use crate::domain::CustomerId;
use crate::error::{AppError, PassRefusal};
use crate::queue::PassRef;
use crate::services::idempotency::order_named;
use crate::services::queue::{claim, pass_admission, record_used, unclaim, QueueSale};
use crate::services::Shop;

/// Buys one product's `line`. A sale in open mode is `purchase` as ever
/// (`pass` is ignored); one in queue mode needs `pass`, this customer's
/// pass from the sale's waiting room, or is refused with nothing written
/// (`AppError::PassRefused`).
pub async fn purchase_with_pass(
    shop: &Shop,
    customer: CustomerId,
    line: Line,
    answer_key: Option<AnswerKey>,
    pass: Option<PassRef>,
) -> Result<PurchaseOutcome, AppError> {
    if queue_mode_among(shop, &[line]).await?.is_none() {
        return super::purchase(shop, customer, vec![line], answer_key).await;
    }
    check_lines(shop, &[line], answer_key.as_ref())?;
    let Some(pass) = pass else {
        return Err(AppError::PassRefused(PassRefusal::NoPass));
    };
    // Its own task, like every purchase: a buyer who hangs up must not
    // leave a claim neither used nor handed back.
    let served = shop.clone();
    let purchase = async move { buy_with_pass(&served, customer, line, answer_key, pass).await };
    tokio::spawn(purchase.instrument(tracing::Span::current()))
        .await
        .map_err(|e| AppError::Internal(anyhow::anyhow!("purchase task failed: {e}")))?
}

async fn buy_with_pass(
    shop: &Shop,
    customer: CustomerId,
    line: Line,
    answer_key: Option<AnswerKey>,
    pass: PassRef,
) -> Result<PurchaseOutcome, AppError> {
    let product = line.product;
    let admission = pass_admission(&pass, &admission_key());
    let claimed = match claim(shop, product, customer, &pass, &admission).await {
        Ok(claimed) => claimed,
        Err(error) => {
            // The claim may have landed with its answer lost: handed back
            // under this admission (a no-op if it never landed), or the
            // customer's resends would find their own pass "in use" until
            // the tick lapsed it.
            unclaim(shop, product, &pass, &admission).await;
            // A resend of a form whose purchase committed gets its order,
            // whatever the queue says now: freed once the sale is over
            // ("closed"), or unreachable. Only on this path, so a buy that
            // claims pays no extra read.
            if let Some(key) = &answer_key {
                if let Ok(Some(order)) = order_named(&shop.bookkeeping, customer, key.key()).await {
                    return Ok(PurchaseOutcome::AlreadyOrdered(order));
                }
            }
            return Err(error);
        }
    };
    let units = match claimed {
        Ok(units) => units,
        Err(refusal) => {
            // A resend of the form that bought with this pass gets its order.
            if let (PassRefusal::Used | PassRefusal::InUse, Some(key)) = (refusal, &answer_key) {
                if let Some(order) = order_named(&shop.bookkeeping, customer, key.key()).await? {
                    return Ok(PurchaseOutcome::AlreadyOrdered(order));
                }
            }
            return Err(AppError::PassRefused(refusal));
        }
    };
    // Passes were issued for `units` each; more would take units the next
    // holders' passes were issued for (an admin may have raised the limit).
    if i64::from(line.quantity.get()) > units {
        unclaim(shop, product, &pass, &admission).await;
        return Err(AppError::Invalid(format!(
            "Your pass covers {units} unit(s): buy at most that many."
        )));
    }
    let bought = admit_and_buy(
        shop,
        customer,
        vec![line],
        answer_key,
        Some(admission.clone()),
    )
    .await;
    match &bought {
        Ok(PurchaseOutcome::Purchased(order)) => {
            if let Err(error) = record_used(shop, product, &pass, &admission, *order).await {
                // The claim stays; the tick finds the order under it.
                tracing::warn!(%product, %pass, %error, "could not record a used pass; the tick will");
            }
        }
        Err(AppError::OutcomeUnknown(_)) => {}
        _ => unclaim(shop, product, &pass, &admission).await,
    }
    bought
}

/// The name of a sale in queue mode among `lines`, as the shelf has it
/// (at most a second old). Without the shelf (Postgres not answering), a
/// product whose waiting room Redis runs counts as in queue mode: saying
/// "open mode" there would let a buyer without a pass past the queue.
pub(super) async fn queue_mode_among(
    shop: &Shop,
    lines: &[Line],
) -> Result<Option<String>, AppError> {
    match shop.sale_cache.shelf(&shop.pool).await {
        Ok(shelf) => Ok(lines.iter().find_map(|line| {
            let product = shelf.product(line.product)?;
            QueueSale::of(product).map(|sale| sale.name)
        })),
        Err(_) => {
            for line in lines {
                if shop.waiting_room.exists(line.product).await? {
                    return Ok(Some(format!("Product {}", line.product)));
                }
            }
            Ok(None)
        }
    }
}
