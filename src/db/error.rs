//! How Diesel's errors become the shop's: a lost connection or a server
//! going away is `Unavailable` (fail closed, 503), a missing row `NotFound`,
//! anything else a bug.

use diesel::result::{DatabaseErrorKind, Error as DieselError};

use crate::error::{AppError, Missing};

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
            DieselError::NotFound => AppError::NotFound(Missing::Row),
            DieselError::DatabaseError(_, info) if connection_lost(&error) => {
                AppError::Unavailable(format!("database: {}", info.message()))
            }
            DieselError::BrokenTransactionManager => {
                AppError::Unavailable("database: the connection broke mid-transaction".into())
            }
            // The server went away during COMMIT, so the rollback failed too:
            // the COMMIT may have been carried out before the answer was lost.
            DieselError::RollbackErrorOnCommit { commit_error, .. }
                if connection_lost(commit_error) =>
            {
                AppError::OutcomeUnknown(format!("database: commit: {commit_error}"))
            }
            DieselError::DatabaseError(_, info) if info.message().contains("statement timeout") => {
                AppError::Unavailable(format!("database: {}", info.message()))
            }
            _ => AppError::Internal(anyhow::Error::new(error)),
        }
    }
}

/// What a failed COMMIT means. An error the server sent (a deferred
/// constraint, a serialization failure) is its answer: nothing committed.
/// A connection lost on the way is no answer: the server may have committed
/// before the reply was cut, so the outcome is unknown.
pub fn commit_failed(error: DieselError) -> AppError {
    let lost = match &error {
        DieselError::RollbackErrorOnCommit { commit_error, .. } => connection_lost(commit_error),
        other => connection_lost(other),
    };
    if lost {
        AppError::OutcomeUnknown(format!("database: commit: {error}"))
    } else {
        error.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable(error: &AppError) -> bool {
        matches!(error, AppError::Unavailable(_))
    }

    fn database_error(kind: DatabaseErrorKind) -> Box<DieselError> {
        Box::new(DieselError::DatabaseError(
            kind,
            Box::new("server closed the connection unexpectedly".to_string()),
        ))
    }

    #[test]
    fn a_commit_cut_off_by_the_server_going_away_has_an_unknown_outcome() {
        let error = AppError::from(DieselError::RollbackErrorOnCommit {
            rollback_error: database_error(DatabaseErrorKind::ClosedConnection),
            commit_error: database_error(DatabaseErrorKind::ClosedConnection),
        });
        assert!(matches!(error, AppError::OutcomeUnknown(_)), "{error:?}");
        // Diesel reports a COMMIT on a connection that died as the plain
        // error (libpq no longer knows the transaction's state).
        let error = commit_failed(*database_error(DatabaseErrorKind::Unknown));
        assert!(matches!(error, AppError::OutcomeUnknown(_)), "{error:?}");
    }

    #[test]
    fn a_commit_the_server_refused_did_nothing() {
        let error = commit_failed(DieselError::DatabaseError(
            DatabaseErrorKind::SerializationFailure,
            Box::new("could not serialize access".to_string()),
        ));
        assert!(matches!(error, AppError::Internal(_)), "{error:?}");
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
            assert!(unavailable(&error), "{message}: {error:?}");
        }
        let bug = AppError::from(DieselError::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new("column \"nope\" does not exist".to_string()),
        ));
        assert!(matches!(bug, AppError::Internal(_)), "{bug:?}");
    }

    #[test]
    fn a_commit_refused_by_a_constraint_stays_internal() {
        let error = AppError::from(DieselError::RollbackErrorOnCommit {
            rollback_error: database_error(DatabaseErrorKind::ClosedConnection),
            commit_error: database_error(DatabaseErrorKind::UniqueViolation),
        });
        assert!(matches!(error, AppError::Internal(_)), "{error:?}");
    }
}
