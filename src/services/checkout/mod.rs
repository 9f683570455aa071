//! Checkout: how a purchase is served.
//!
//! `purchase` is the one entry point. It admits the buyer at the stock gate
//! (`admission`), then hands a single-product purchase to its product's
//! batch (`batch`: one lock hold and one commit for many buyers) or serves a
//! cart alone (`lone`). Both check every buyer against the same `rules` and
//! write with the same `order_rows`; every path that fails to write hands
//! the admitted units back to the gate.
//!
//! Within this module calls go one way: `mod` -> `admission`, `batch`,
//! `lone` -> `rules`, `order_rows`, `outcome`.

mod admission;
mod batch;
mod lone;
mod order_rows;
mod outcome;
mod rules;

use chrono::Utc;
use tracing::Instrument;

// A batch is reachable on its own so tests can queue buyers that no form
// would produce (an account that does not exist).
pub use batch::{buy_in_batch, Combiner};
pub use order_rows::Buyer;
pub use outcome::{Line, PurchaseOutcome};

use crate::domain::{CustomerId, IdempotencyKey, ProductId};
use crate::error::AppError;
use crate::services::stock_gate::give_back_all;
use crate::services::Shop;
use admission::{admit_all, refusal_before_locking};
use lone::buy_alone;

/// Buys `lines` (one order, all lines or none) for `customer`. The order is
/// named on `answer_key` (an idempotency key this request has claimed) in
/// the order's own transaction, so a replay finds it.
pub async fn purchase(
    shop: &Shop,
    customer: CustomerId,
    mut lines: Vec<Line>,
    answer_key: Option<IdempotencyKey>,
) -> Result<PurchaseOutcome, AppError> {
    // Lock order and row-lock order are both ascending product id.
    lines.sort_by_key(|l| l.product);
    if lines.is_empty() || lines.windows(2).any(|w| w[0].product == w[1].product) {
        return Err(AppError::Invalid(
            "An order needs each product once, with a quantity.".into(),
        ));
    }
    // From admission on, the purchase runs on a task of its own: a buyer who
    // hangs up cancels the request, and with it anything awaited there, but
    // not the give-back of what the gate admitted for them.
    let served = shop.clone();
    let purchase = async move { admit_and_buy(&served, customer, lines, answer_key).await };
    tokio::spawn(purchase.instrument(tracing::Span::current()))
        .await
        .map_err(|e| AppError::Internal(anyhow::anyhow!("purchase task failed: {e}")))?
}

async fn admit_and_buy(
    shop: &Shop,
    customer: CustomerId,
    lines: Vec<Line>,
    answer_key: Option<IdempotencyKey>,
) -> Result<PurchaseOutcome, AppError> {
    let products: Vec<ProductId> = lines.iter().map(|l| l.product).collect();
    let admission = match &shop.gate {
        Some(gate) => match admit_all(shop, gate, customer, &lines).await? {
            Ok(admission) => Some(admission),
            Err(refusal) => return Ok(PurchaseOutcome::Refused(refusal)),
        },
        None => {
            if let Some(refusal) = refusal_before_locking(shop, &lines).await? {
                return Ok(PurchaseOutcome::Refused(refusal));
            }
            None
        }
    };
    let gate_key = admission.clone();
    let admitted_products = products.clone();
    let payment_deadline = Utc::now() + shop.settings.payment_timeout;
    let answer_key = answer_key.map(|key| key.as_str().to_string());
    let result = if shop.settings.inject_fault_after_admission {
        Err(AppError::Internal(anyhow::anyhow!(
            "injected fault between admission and the database"
        )))
    } else if let ([line], Some(_)) = (lines.as_slice(), &shop.combiner) {
        let buyer = Buyer {
            customer,
            quantity: line.quantity,
            payment_deadline,
            gate_key,
            answer_key,
        };
        buy_in_batch(shop, line.product, buyer).await
    } else {
        buy_alone(
            shop,
            customer,
            lines,
            payment_deadline,
            gate_key,
            answer_key,
        )
        .await
    };
    // Whatever kept the order from being written hands the admitted units back.
    if let (Some(gate), Some(admission)) = (&shop.gate, &admission) {
        if !matches!(result, Ok(PurchaseOutcome::Purchased(_))) {
            give_back_all(gate, admission, &admitted_products).await;
        }
    }
    match result {
        Err(AppError::Busy) => Ok(PurchaseOutcome::Busy),
        Err(AppError::Unavailable(reason)) => Ok(PurchaseOutcome::Unavailable(reason)),
        other => other,
    }
}
