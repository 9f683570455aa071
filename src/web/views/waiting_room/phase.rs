//! Which section of the waiting page a customer is in, and how the units
//! stand: decided once per view, so the page and `queue.json` agree.

use chrono::{DateTime, Utc};

use crate::domain::draw::PassState;
use crate::domain::{QueueState, Standing};
use crate::services::waiting_room::QueueStatus;

/// What the page shows, in the order a customer meets it. One section of
/// the page per phase; the script swaps the section when the phase changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Signed out: sign in to join.
    SignIn,
    /// Signed in, not joined, the waiting room not open yet.
    NotOpenYet,
    /// Signed in, not joined, joining is open.
    CanJoin,
    /// Joined, before the start: the order is not drawn yet.
    PreQueue,
    /// Joined, the start has passed, the order is being drawn.
    Drawing,
    Waiting,
    /// A pass is issued: the Buy form.
    Admitted,
    /// The pass bought its units.
    Bought,
    /// The pass ran out without a purchase.
    Lapsed,
    SoldOut,
    Closed,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::SignIn => "sign_in",
            Phase::NotOpenYet => "not_open_yet",
            Phase::CanJoin => "can_join",
            Phase::PreQueue => "pre_queue",
            Phase::Drawing => "drawing",
            Phase::Waiting => "waiting",
            Phase::Admitted => "admitted",
            Phase::Bought => "bought",
            Phase::Lapsed => "lapsed",
            Phase::SoldOut => "sold_out",
            Phase::Closed => "closed",
        }
    }

    /// Nothing on the page can change by itself any more. A sell-out is
    /// not final: a refund brings units back and admits the next in line,
    /// so the page keeps listening until the sale ends.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Bought | Phase::Lapsed | Phase::Closed)
    }

    /// The tab's title: a turn must be noticed in a background tab too.
    pub fn title(self) -> &'static str {
        match self {
            Phase::Admitted => "It is your turn: buy now",
            Phase::Bought => "Pass used: pay for your order",
            Phase::SoldOut => "Sold out for now",
            _ => "Waiting room",
        }
    }
}

/// How the units stand, each with its own wording: the issue asks that
/// waiters hear at once when every unit is sold or held, and how many are
/// only held (and until when).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// Units left, none held.
    Free,
    /// Units left, and more held.
    SomeHeld,
    /// None left, some held: they may come back.
    AllHeld,
    /// None left, none held.
    AllSold,
}

impl Availability {
    pub fn of(units_left: i64, held: i64) -> Availability {
        match (units_left > 0, held > 0) {
            (true, false) => Availability::Free,
            (true, true) => Availability::SomeHeld,
            (false, true) => Availability::AllHeld,
            (false, false) => Availability::AllSold,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Availability::Free => "free",
            Availability::SomeHeld => "some_held",
            Availability::AllHeld => "all_held",
            Availability::AllSold => "all_sold",
        }
    }
}

pub(super) fn phase_of(status: &QueueStatus, signed_in: bool, now: DateTime<Utc>) -> Phase {
    // What the customer did with a pass outranks how the queue ended for
    // everyone else: someone who bought should read that they bought.
    match status.pass_state {
        Some(PassState::Used) => return Phase::Bought,
        // The service calls a spent turn `Closed`; its customer should read why.
        Some(PassState::Lapsed) => return Phase::Lapsed,
        _ => {}
    }
    match status.standing {
        Standing::SoldOut => return Phase::SoldOut,
        Standing::Closed => return Phase::Closed,
        _ => {}
    }
    match status.queue {
        QueueState::SoldOut => return Phase::SoldOut,
        QueueState::Closed => return Phase::Closed,
        _ => {}
    }
    match status.standing {
        Standing::Admitted => Phase::Admitted,
        Standing::NotJoined if !signed_in => Phase::SignIn,
        Standing::NotJoined if now < status.opens_at => Phase::NotOpenYet,
        Standing::NotJoined => Phase::CanJoin,
        Standing::Waiting if status.position.is_some() => Phase::Waiting,
        Standing::Waiting if now < status.starts_at => Phase::PreQueue,
        Standing::Waiting => Phase::Drawing,
        Standing::SoldOut => Phase::SoldOut,
        Standing::Closed => Phase::Closed,
    }
}

pub(super) fn seconds_until(now: DateTime<Utc>, at: DateTime<Utc>) -> i64 {
    (at - now).num_seconds()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sell_out_is_not_final_but_a_closed_room_is() {
        assert!(!Phase::SoldOut.is_final());
        assert!(Phase::Closed.is_final());
        assert_eq!(Phase::Admitted.title(), "It is your turn: buy now");
    }

    #[test]
    fn availability_names_each_case() {
        assert_eq!(Availability::of(3, 0), Availability::Free);
        assert_eq!(Availability::of(3, 2), Availability::SomeHeld);
        assert_eq!(Availability::of(0, 2), Availability::AllHeld);
        assert_eq!(Availability::of(0, 0), Availability::AllSold);
    }
}
