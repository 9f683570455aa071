//! What taking or keeping a product lock can fail with, and the one place
//! that turns it into the shop's error. Each case's wording is the reason
//! the shop logs with its 503, so the conversion keeps it word for word.

use crate::domain::ProductId;
use crate::error::AppError;

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Someone else held the lock for the whole wait.
    #[error("the product lock was not obtained within the wait")]
    Busy,
    /// One attempt at the lock was still unanswered at the wait's deadline.
    #[error("Redis did not answer before the lock deadline")]
    Timeout,
    /// Fewer than a majority of the Redis servers answered.
    #[error("too few Redis servers answered the lock request")]
    NoQuorum,
    /// rslock failed for a reason other than the key being held.
    #[error("lock: {0}")]
    Redlock(rslock::LockError),
    /// A renewal failed, so another holder may be inside the same work.
    #[error("the product lock was lost before commit")]
    LeaseLost,
    /// Too little of the lease is left for the commit to finish inside it.
    #[error("the product lock's lease ran out before commit")]
    LeaseExpired,
    /// Locked work wrote a product it did not lock: a bug, not an outage.
    #[error("product {0} is written without holding its lock")]
    NotHeld(ProductId),
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        match error {
            LockError::Busy => AppError::Busy,
            LockError::Timeout
            | LockError::NoQuorum
            | LockError::Redlock(_)
            | LockError::LeaseLost
            | LockError::LeaseExpired => AppError::Unavailable(error.to_string()),
            LockError::NotHeld(_) => AppError::Internal(anyhow::Error::new(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages, status codes and the reasons logged with a 503 stay what they
    /// were before the lock had an error type of its own.
    #[test]
    fn each_case_becomes_the_error_and_reason_it_always_was() {
        assert!(matches!(AppError::from(LockError::Busy), AppError::Busy));
        for (error, reason) in [
            (
                LockError::Timeout,
                "Redis did not answer before the lock deadline",
            ),
            (
                LockError::NoQuorum,
                "too few Redis servers answered the lock request",
            ),
            (
                LockError::Redlock(rslock::LockError::TtlExceeded),
                "lock: TTL exceeded",
            ),
            (
                LockError::LeaseLost,
                "the product lock was lost before commit",
            ),
            (
                LockError::LeaseExpired,
                "the product lock's lease ran out before commit",
            ),
        ] {
            match AppError::from(error) {
                AppError::Unavailable(said) => assert_eq!(said, reason),
                other => panic!("{reason}: became {other:?}"),
            }
        }
        match AppError::from(LockError::NotHeld(ProductId(7))) {
            AppError::Internal(error) => assert_eq!(
                error.to_string(),
                "product 7 is written without holding its lock"
            ),
            other => panic!("became {other:?}"),
        }
    }
}
