//! One error type for the whole shop, mapped to HTTP in exactly one place.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use askama::Template;
use diesel::result::{DatabaseErrorKind, Error as DieselError};

use crate::domain::{InvalidInput, ProductId};
use crate::web::pages::ErrorPage;

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
    /// A well-formed request that the shop's rules refuse (sold out, already paid, ...).
    #[error("{message}")]
    Conflict {
        title: &'static str,
        message: String,
    },
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

    fn title_and_message(&self) -> (&'static str, String) {
        match self {
            AppError::Invalid(message) => ("Please check what you entered", message.clone()),
            AppError::NotFound(message) => ("Not found", message.clone()),
            AppError::Forbidden(message) => ("Not allowed", message.clone()),
            AppError::SignInRequired => ("Sign in required", "Sign in to continue.".into()),
            AppError::BadCsrf => (
                "This form has expired",
                "The form you sent was not issued to this session (it may be old, or come from another site). Nothing was changed. Go back, reload the page and try again.".into(),
            ),
            AppError::Conflict { title, message } => (title, message.clone()),
            AppError::TooManyAttempts { retry_after } => (
                "Too many sign-in attempts",
                format!(
                    "There have been too many unsuccessful sign-in attempts for this account or from your network, so signing in is paused. Try again in {}.",
                    wait_in_words(*retry_after)
                ),
            ),
            AppError::Busy => (
                "Too many buyers right now",
                "So many people are buying this item at this moment that we could not serve you in time. Nothing was charged or reserved. Please try again in a moment.".into(),
            ),
            AppError::Unavailable(_) => (
                "The shop is briefly unavailable",
                "Part of the shop is not answering right now, so we did not take your order: nothing was reserved or charged. Please try again in a minute.".into(),
            ),
            AppError::Fenced { .. } => (
                "The shop is briefly unavailable",
                "Your checkout was paused so long that its hold on this product ran out and another checkout took over, so yours stopped before writing anything. Nothing was reserved or charged. Please try again.".into(),
            ),
            AppError::Internal(_) => (
                "Something went wrong",
                "An unexpected error stopped this request. Nothing was charged. Please try again; if it keeps happening, contact support.".into(),
            ),
        }
    }
}

/// "45 seconds", "1 minute", "15 minutes": rounded up, so waiting that long is enough.
fn wait_in_words(wait: std::time::Duration) -> String {
    let seconds = wait.as_secs().max(1);
    let (amount, unit) = if seconds < 60 {
        (seconds, "second")
    } else {
        (seconds.div_ceil(60), "minute")
    };
    format!("{amount} {unit}{}", if amount == 1 { "" } else { "s" })
}

impl From<InvalidInput> for AppError {
    fn from(error: InvalidInput) -> Self {
        AppError::Invalid(error.0)
    }
}

/// The server closed the connection, or it could not be written to.
/// What Postgres says while it shuts down, crashes or restarts (SQLSTATE
/// class 57, which Diesel reports as an unknown error and without its code).
const SERVER_GOING_AWAY: [&str; 4] = [
    "terminating connection",
    "the database system is",
    "server closed the connection",
    "no connection to the server",
];

fn connection_lost(error: &DieselError) -> bool {
    match error {
        DieselError::DatabaseError(
            DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand,
            _,
        ) => true,
        DieselError::DatabaseError(DatabaseErrorKind::Unknown, info) => {
            let message = info.message().to_ascii_lowercase();
            SERVER_GOING_AWAY.iter().any(|sign| message.contains(sign))
        }
        // Left behind on a connection whose server went away mid-transaction.
        DieselError::BrokenTransactionManager => true,
        _ => false,
    }
}

impl From<DieselError> for AppError {
    fn from(error: DieselError) -> Self {
        match &error {
            DieselError::NotFound => AppError::NotFound("We could not find that.".into()),
            DieselError::DatabaseError(_, info) if connection_lost(&error) => {
                AppError::Unavailable(format!("database: {}", info.message()))
            }
            DieselError::BrokenTransactionManager => {
                AppError::Unavailable("database: the connection broke mid-transaction".into())
            }
            // The server went away during COMMIT, so the rollback failed too.
            DieselError::RollbackErrorOnCommit { commit_error, .. }
                if connection_lost(commit_error) =>
            {
                AppError::Unavailable(format!("database: commit: {commit_error}"))
            }
            DieselError::DatabaseError(_, info) if info.message().contains("statement timeout") => {
                AppError::Unavailable(format!("database: {}", info.message()))
            }
            _ => AppError::Internal(anyhow::Error::new(error)),
        }
    }
}

impl ResponseError for AppError {
    fn status_code(&self) -> StatusCode {
        match self {
            AppError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AppError::NotFound(_) => StatusCode::NOT_FOUND,
            AppError::Forbidden(_) | AppError::BadCsrf => StatusCode::FORBIDDEN,
            AppError::SignInRequired => StatusCode::SEE_OTHER,
            AppError::Conflict { .. } => StatusCode::CONFLICT,
            AppError::TooManyAttempts { .. } => StatusCode::TOO_MANY_REQUESTS,
            AppError::Busy | AppError::Unavailable(_) | AppError::Fenced { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        match self {
            AppError::Internal(error) => tracing::error!(error = ?error, "request failed"),
            AppError::Unavailable(reason) => tracing::warn!(%reason, "dependency unavailable"),
            AppError::Fenced { product, fence } => {
                tracing::warn!(%product, fence, "stock write refused by its fencing token")
            }
            _ => {}
        }
        let status = self.status_code();
        if let AppError::SignInRequired = self {
            return HttpResponse::SeeOther()
                .insert_header((header::LOCATION, "/login"))
                .finish();
        }
        let (title, message) = self.title_and_message();
        let mut response = HttpResponse::build(status);
        match self {
            AppError::TooManyAttempts { retry_after } => {
                response.insert_header((header::RETRY_AFTER, retry_after.as_secs().max(1)));
            }
            _ if status == StatusCode::SERVICE_UNAVAILABLE => {
                response.insert_header((header::RETRY_AFTER, "2"));
            }
            _ => {}
        }
        let page = ErrorPage {
            status: status.as_u16(),
            title,
            message: &message,
        };
        match page.render() {
            Ok(html) => response.content_type("text/html; charset=utf-8").body(html),
            Err(_) => response
                .content_type("text/plain; charset=utf-8")
                .body(format!("{title}\n\n{message}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database_error(kind: DatabaseErrorKind) -> Box<DieselError> {
        Box::new(DieselError::DatabaseError(
            kind,
            Box::new("server closed the connection unexpectedly".to_string()),
        ))
    }

    #[test]
    fn a_commit_cut_off_by_the_server_going_away_is_unavailable() {
        let error = AppError::from(DieselError::RollbackErrorOnCommit {
            rollback_error: database_error(DatabaseErrorKind::ClosedConnection),
            commit_error: database_error(DatabaseErrorKind::ClosedConnection),
        });
        assert_eq!(error.status_code(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn a_server_shutting_down_is_unavailable_not_a_bug() {
        for message in [
            "terminating connection due to administrator command",
            "terminating connection because of crash of another server process",
            "FATAL:  the database system is in recovery mode",
        ] {
            let error = AppError::from(DieselError::DatabaseError(
                DatabaseErrorKind::Unknown,
                Box::new(message.to_string()),
            ));
            assert_eq!(
                error.status_code(),
                StatusCode::SERVICE_UNAVAILABLE,
                "{message}"
            );
        }
        let bug = AppError::from(DieselError::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new("column \"nope\" does not exist".to_string()),
        ));
        assert_eq!(bug.status_code(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn a_commit_refused_by_a_constraint_stays_internal() {
        let error = AppError::from(DieselError::RollbackErrorOnCommit {
            rollback_error: database_error(DatabaseErrorKind::ClosedConnection),
            commit_error: database_error(DatabaseErrorKind::UniqueViolation),
        });
        assert_eq!(error.status_code(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
