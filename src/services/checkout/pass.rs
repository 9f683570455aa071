//! Buying a sale in queue mode: with a waiting-room pass of the buyer's own.
//!
//! The pass is decided in the order's own transaction (`rules::pass_refusal`
//! against the locked product row and the buyer's locked pass, then used by
//! the order's statement), so nothing here can let a buy through: it only
//! turns away early, from memory, a buy that cannot succeed (no pass, or
//! one that is not this customer's open pass), before the gate and the lock.

use tracing::Instrument;

use super::{admit_and_buy, check_lines, AnswerKey, Line, PurchaseOutcome};
use crate::domain::{CustomerId, PassRef};
use crate::error::{AppError, PassRefusal};
use crate::services::idempotency::order_named;
use crate::services::waiting_room::{check_presented, QueueSale};
use crate::services::Shop;

/// Buys one product's `line`. A sale in open mode is `purchase` as ever
/// (`pass` is ignored); one in queue mode needs `pass`, this customer's
/// open pass from the sale's waiting room, or is refused with nothing
/// written (`AppError::PassRefused`).
pub async fn purchase_with_pass(
    shop: &Shop,
    customer: CustomerId,
    line: Line,
    answer_key: Option<AnswerKey>,
    pass: Option<PassRef>,
) -> Result<PurchaseOutcome, AppError> {
    if queue_mode_among(shop, &[line]).await?.is_none() {
        // The shelf may be a second old: a sale switched to queue mode
        // meanwhile is refused by the order's transaction, which reads the
        // product row it locks.
        return super::purchase(shop, customer, vec![line], answer_key).await;
    }
    check_lines(shop, &[line], answer_key.as_ref())?;
    let Some(pass) = pass else {
        return Err(AppError::PassRefused(PassRefusal::NoPass));
    };
    if let Err(refused) =
        check_presented(shop, line.product, customer, &pass, line.quantity.get()).await
    {
        // A resend of the form that bought with this pass gets its order.
        if let (AppError::PassRefused(PassRefusal::Used), Some(key)) = (&refused, &answer_key) {
            if let Some(order) = order_named(&shop.bookkeeping, customer, key.key()).await? {
                return Ok(PurchaseOutcome::AlreadyOrdered(order));
            }
        }
        return Err(refused);
    }
    // Its own task, like every purchase: a buyer who hangs up must not
    // cancel what the gate admitted for them.
    let served = shop.clone();
    let number = pass.number;
    let purchase =
        async move { admit_and_buy(&served, customer, vec![line], answer_key, Some(number)).await };
    crate::shutdown::spawn(purchase.instrument(tracing::Span::current()))
        .await
        .map_err(|e| AppError::Internal(anyhow::anyhow!("purchase task failed: {e}")))?
}

/// The name of a sale in queue mode among `lines`, as the shelf has it (at
/// most a second old). Only a fast answer: the order's transaction reads
/// the mode from the row it locks.
pub(super) async fn queue_mode_among(
    shop: &Shop,
    lines: &[Line],
) -> Result<Option<String>, AppError> {
    let shelf = shop.sale_cache.shelf(&shop.pool).await?;
    Ok(lines.iter().find_map(|line| {
        let product = shelf.product(line.product)?;
        QueueSale::of(product).map(|sale| sale.name)
    }))
}
