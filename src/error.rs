//! The one error type of the shop. It says what went wrong in terms of the
//! shop; `web::error` decides how a person is told, `db::error` how Diesel's
//! errors become one of these.

use crate::domain::{InvalidInput, ProductId, Refusal};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The request's content does not parse: nothing was attempted.
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("sign in to continue")]
    SignInRequired,
    #[error("the form was not issued by this shop for this session")]
    BadCsrf,
    /// A purchase the sale's rules refuse (sold out, limit reached, not open).
    #[error("purchase refused: {}", .0.kind())]
    Refused(Refusal),
    /// A well-formed request that the shop's rules refuse (already paid, ...).
    #[error("{message}")]
    Conflict {
        title: &'static str,
        message: String,
    },
    /// The request's idempotency key was already used for a different request.
    #[error("idempotency key reused for a different request")]
    KeyReused,
    /// The first request under this idempotency key has not finished (or
    /// was interrupted and cannot be taken over yet).
    #[error("a request under this idempotency key is still in progress")]
    KeyInProgress,
    /// An order's transaction found its idempotency key already taken (by
    /// an earlier order, or a claim): it rolled back, and the purchase looks
    /// up what the key names.
    #[error("an order already names this idempotency key")]
    KeyTaken,
    /// Too many unsuccessful sign-ins for the account or from the address;
    /// refused before the password is looked at.
    #[error("too many sign-in attempts")]
    TooManyAttempts { retry_after: std::time::Duration },
    /// The product's lock was not obtained within the wait deadline.
    #[error("too many buyers at this moment")]
    Busy,
    /// Redis or Postgres did not answer: the shop fails closed.
    #[error("{0}")]
    Unavailable(String),
    /// The connection went while a COMMIT was on its way: the transaction
    /// may have landed or not, so this must never be read as "nothing
    /// changed". Answered like `Unavailable`, but an idempotency key it
    /// guards keeps its claim until the database says what happened.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// Postgres refused a stock write: the row carries a fencing token at or
    /// above this holder's, so a later lock holder has written since.
    #[error("stale lock holder: product {product} is fenced at {fence}")]
    Fenced { product: ProductId, fence: i64 },
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl AppError {
    pub fn conflict(title: &'static str, message: impl Into<String>) -> AppError {
        AppError::Conflict {
            title,
            message: message.into(),
        }
    }

    /// The same error for every buyer of a batch (or of a transaction) that
    /// failed as a whole: what they must hear alike is kept, the rest is
    /// internal.
    pub fn duplicate(&self) -> AppError {
        match self {
            AppError::Busy => AppError::Busy,
            AppError::Unavailable(reason) => AppError::Unavailable(reason.clone()),
            AppError::OutcomeUnknown(reason) => AppError::OutcomeUnknown(reason.clone()),
            AppError::Fenced { product, fence } => AppError::Fenced {
                product: *product,
                fence: *fence,
            },
            AppError::NotFound(message) => AppError::NotFound(message.clone()),
            other => AppError::Internal(anyhow::anyhow!("{other}")),
        }
    }
}

impl From<InvalidInput> for AppError {
    fn from(error: InvalidInput) -> Self {
        AppError::Invalid(error.0)
    }
}
