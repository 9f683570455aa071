//! The waiting room's words, shared by the services that decide them and
//! the pages that show them: where a room stands, where one customer
//! stands, and the pass a buy form carries.

use chrono::{DateTime, Utc};

use super::draw::{PassState, Ticket};

/// Where a waiting room stands as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueState {
    /// Before the start: joins go to the pre-queue.
    Pre,
    /// Admitting in order.
    Open,
    /// An admin paused admission; joins still go to the back.
    Paused,
    /// Every unit is sold and nothing can come back: nobody else is admitted.
    SoldOut,
    /// The sale ended: nobody else joins or is admitted.
    Closed,
}

/// Where one customer stands (`queue.json`'s `state`).
///
/// `Closed` means nothing more can happen for this customer in this room:
/// the sale ended, or their own turn is over (their pass was used, or
/// lapsed and its units went to the next in line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    NotJoined,
    Waiting,
    Admitted,
    SoldOut,
    Closed,
}

/// A pass as a buy form carries it: the holder's ticket and the pass's
/// number (its place in the line), `TICKET-NUMBER`. It only names a pass;
/// whether it is this customer's, still open and for this sale is decided
/// in the order's own transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassRef {
    pub ticket: Ticket,
    pub number: i32,
}

impl PassRef {
    pub fn parse(raw: &str) -> Option<PassRef> {
        let (ticket, number) = raw.trim().split_once('-')?;
        let number: i32 = number.parse().ok().filter(|n| *n > 0)?;
        Some(PassRef {
            ticket: Ticket::parse(ticket).ok()?,
            number,
        })
    }
}

impl std::fmt::Display for PassRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ticket.as_str(), self.number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_reads_back_as_written() {
        let pass = PassRef::parse("H6FYS9KCTE-12").unwrap();
        assert_eq!(pass.number, 12);
        assert_eq!(pass.to_string(), "H6FYS9KCTE-12");
        assert!(PassRef::parse("H6FYS9KCTE-0").is_none());
        assert!(PassRef::parse("h6fys9kcte-1").is_none());
        assert!(PassRef::parse("H6FYS9KCTE").is_none());
    }
}

/// A customer's place as its row says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub ticket: Ticket,
    pub late: bool,
    /// None until the draw (pre-queue places).
    pub position: Option<i64>,
}

/// What became of a customer's pass once it is no longer open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassRow {
    pub number: i32,
    pub state: PassState,
    pub expires_at: DateTime<Utc>,
    pub units: i32,
}

/// How long after its deadline a pass still buys: a buy sent just before
/// the deadline may wait for the product's lock (`LOCK_WAIT_MS`, 3 s by
/// default) before its transaction checks the pass. Its units stay held
/// meanwhile, so the grace costs no other buyer a unit.
pub const PASS_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
