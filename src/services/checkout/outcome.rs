//! What a buyer asks for and what their purchase comes to.

use crate::domain::{OrderId, ProductId, Quantity, Refusal};
use crate::error::AppError;

/// One product and how many units of it, as the buyer asked.
#[derive(Debug, Clone, Copy)]
pub struct Line {
    pub product: ProductId,
    pub quantity: Quantity,
}

/// What a purchase attempt came to. Refusals are ordinary outcomes, not errors;
/// `into_result` turns them into the shop's one error type once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurchaseOutcome {
    Purchased(OrderId),
    Refused(Refusal),
    Busy,
    Unavailable(String),
    /// A repeat of a request that bought this order: nothing bought again.
    AlreadyOrdered(OrderId),
    /// A repeat of a request that was refused: the same refusal again.
    RefusedBefore(Refusal),
}

impl PurchaseOutcome {
    pub fn into_result(self) -> Result<OrderId, AppError> {
        match self {
            PurchaseOutcome::Purchased(order) | PurchaseOutcome::AlreadyOrdered(order) => Ok(order),
            PurchaseOutcome::Refused(refusal) | PurchaseOutcome::RefusedBefore(refusal) => {
                Err(AppError::Refused(refusal))
            }
            PurchaseOutcome::Busy => Err(AppError::Busy),
            PurchaseOutcome::Unavailable(reason) => Err(AppError::Unavailable(reason)),
        }
    }

    /// A stable name for counting outcomes by kind.
    pub fn kind(&self) -> &'static str {
        match self {
            PurchaseOutcome::Purchased(_) => "purchased",
            PurchaseOutcome::Refused(refusal) => refusal.kind(),
            PurchaseOutcome::Busy => "busy",
            PurchaseOutcome::Unavailable(_) => "unavailable",
            PurchaseOutcome::AlreadyOrdered(_) | PurchaseOutcome::RefusedBefore(_) => "replayed",
        }
    }

    /// Whether this answers a repeat with the first request's outcome.
    pub fn is_replay(&self) -> bool {
        matches!(
            self,
            PurchaseOutcome::AlreadyOrdered(_) | PurchaseOutcome::RefusedBefore(_)
        )
    }
}
