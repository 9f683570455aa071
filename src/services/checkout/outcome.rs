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
}

impl PurchaseOutcome {
    pub fn into_result(self) -> Result<OrderId, AppError> {
        match self {
            PurchaseOutcome::Purchased(order) => Ok(order),
            PurchaseOutcome::Refused(refusal) => Err(AppError::Refused(refusal)),
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
        }
    }
}
