//! The waiting room as a customer sees it (the waiting page, `queue.json`,
//! the product page's join button). The page and the
//! JSON are built from one `WaitingRoomView`, so the script that polls the
//! JSON and the page the server renders never disagree about which phase a
//! customer is in.

use askama::Template;
use chrono::{DateTime, SecondsFormat, Utc};

use super::sale::SaleView;
use super::Nav;
use crate::db::models::Product;
use crate::domain::draw::PassState;
use crate::domain::Quantity;
use crate::domain::{QueueState, Standing};
use crate::services::waiting_room::{QueueSale, QueueStatus};
use crate::web::format::timestamp;

mod phase;

use phase::{phase_of, seconds_until};
pub use phase::{Availability, Phase};

/// One customer's waiting room at one instant.
pub struct WaitingRoomView {
    pub status: QueueStatus,
    pub now: DateTime<Utc>,
    pub phase: Phase,
    pub availability: Availability,
}

impl WaitingRoomView {
    pub fn new(status: QueueStatus, signed_in: bool, now: DateTime<Utc>) -> WaitingRoomView {
        let phase = phase_of(&status, signed_in, now);
        let availability = Availability::of(status.units_left, status.held);
        WaitingRoomView {
            status,
            now,
            phase,
            availability,
        }
    }

    pub fn phase_name(&self) -> &'static str {
        self.phase.name()
    }

    pub fn availability_name(&self) -> &'static str {
        self.availability.name()
    }

    pub fn in_phase(&self, phase: &str) -> bool {
        self.phase.name() == phase
    }

    pub fn availability_is(&self, availability: &str) -> bool {
        self.availability.name() == availability
    }

    pub fn now_iso(&self) -> String {
        rfc3339(self.now)
    }

    pub fn opens_at_iso(&self) -> String {
        rfc3339(self.status.opens_at)
    }

    pub fn opens_at_text(&self) -> String {
        timestamp(self.status.opens_at)
    }

    pub fn starts_at_iso(&self) -> String {
        rfc3339(self.status.starts_at)
    }

    pub fn starts_at_text(&self) -> String {
        timestamp(self.status.starts_at)
    }

    /// "4:59" until `at`, as the script also writes it (the page's text
    /// when scripts are off).
    pub fn left_until(&self, at: &DateTime<Utc>) -> String {
        clock((*at - self.now).num_seconds().max(0))
    }

    pub fn until_opening(&self) -> String {
        self.left_until(&self.status.opens_at)
    }

    pub fn until_start(&self) -> String {
        self.left_until(&self.status.starts_at)
    }

    pub fn ticket(&self) -> String {
        self.status
            .ticket
            .as_ref()
            .map(|t| t.as_str().to_string())
            .unwrap_or_default()
    }

    pub fn position(&self) -> String {
        self.status
            .position
            .map(|p| p.to_string())
            .unwrap_or_else(|| "—".into())
    }

    pub fn ahead(&self) -> String {
        self.status
            .ahead
            .map(|a| a.to_string())
            .unwrap_or_else(|| "—".into())
    }

    pub fn held_until_iso(&self) -> String {
        self.status.held_until.map(rfc3339).unwrap_or_default()
    }

    pub fn held_until_text(&self) -> String {
        self.status
            .held_until
            .map(timestamp)
            .unwrap_or_else(|| "a few minutes from now".into())
    }

    pub fn estimated_wait_text(&self) -> String {
        wait_in_words(self.status.estimated_wait.map(|w| w.as_secs()))
    }

    /// The seed's SHA-256 as published when the room opened: a joiner
    /// saves it to hold the shop to its draw (`flashsale draw verify --commitment`).
    pub fn commitment(&self) -> String {
        self.status
            .commitment
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default()
    }

    /// The frozen pre-queue's SHA-256, published at the start before the seed.
    pub fn entries_commitment(&self) -> String {
        self.status
            .entries_commitment
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default()
    }

    pub fn pass(&self) -> String {
        self.status
            .pass
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default()
    }

    pub fn pass_expires_iso(&self) -> String {
        self.status.pass_expires_at.map(rfc3339).unwrap_or_default()
    }

    pub fn pass_expires_text(&self) -> String {
        self.status
            .pass_expires_at
            .map(timestamp)
            .unwrap_or_default()
    }

    pub fn pass_left(&self) -> String {
        self.status
            .pass_expires_at
            .map(|at| self.left_until(&at))
            .unwrap_or_default()
    }

    pub fn before_opening(&self) -> bool {
        self.now < self.status.opens_at
    }

    pub fn queue_sold_out(&self) -> bool {
        self.status.queue == QueueState::SoldOut || self.status.standing == Standing::SoldOut
    }

    pub fn is_paused(&self) -> bool {
        self.status.queue == QueueState::Paused
    }

    /// Seconds between plain refreshes when scripts are off; None where the
    /// page should stay put (a form to fill in, or nothing left to change).
    pub fn refresh_secs(&self) -> Option<i64> {
        match self.phase {
            Phase::NotOpenYet => Some(seconds_until(self.now, self.status.opens_at).clamp(1, 30)),
            Phase::PreQueue => Some(seconds_until(self.now, self.status.starts_at).clamp(1, 30)),
            Phase::Drawing => Some(1),
            Phase::Waiting => Some(5),
            Phase::SignIn | Phase::CanJoin | Phase::Admitted => None,
            Phase::Bought | Phase::Lapsed | Phase::SoldOut | Phase::Closed => None,
        }
    }

    pub fn json(&self) -> QueueJson {
        let status = &self.status;
        QueueJson {
            state: status.standing,
            position: status.position,
            ahead: status.ahead,
            units_left: status.units_left,
            held: status.held,
            ticket: status.ticket.as_ref().map(|t| t.as_str().to_string()),
            pass_expires_at: status.pass_expires_at.as_ref().map(rfc3339),
            queue: status.queue,
            opens_at: rfc3339(status.opens_at),
            starts_at: rfc3339(status.starts_at),
            held_until: status.held_until.as_ref().map(rfc3339),
            estimated_wait_secs: status.estimated_wait.map(|w| w.as_secs()),
            pass: status.pass.as_ref().map(ToString::to_string),
            pass_state: status.pass_state,
            pass_units: status.pass_units,
            seed_sha256: status.commitment.as_ref().map(ToString::to_string),
            entries_sha256: status.entries_commitment.as_ref().map(ToString::to_string),
            phase: self.phase.name(),
            availability: self.availability.name(),
            now: rfc3339(self.now),
        }
    }
}

/// `queue.json`. The first seven fields are the contract; the rest
/// are what the waiting page's script needs.
#[derive(Debug, serde::Serialize)]
pub struct QueueJson {
    pub state: Standing,
    pub position: Option<i64>,
    pub ahead: Option<i64>,
    pub units_left: i64,
    pub held: i64,
    pub ticket: Option<String>,
    pub pass_expires_at: Option<String>,
    /// The queue as a whole: pre, open, paused, sold_out, closed.
    pub queue: QueueState,
    pub opens_at: String,
    pub starts_at: String,
    pub held_until: Option<String>,
    pub estimated_wait_secs: Option<u64>,
    pub pass: Option<String>,
    pub pass_state: Option<PassState>,
    /// Units the customer's pass covers.
    pub pass_units: Option<i32>,
    /// The draw's commitment (SHA-256 of its seed), from the room's opening.
    pub seed_sha256: Option<String>,
    /// The frozen pre-queue's commitment (SHA-256 of its sorted tickets), from the start.
    pub entries_sha256: Option<String>,
    /// Which section the page shows; the script swaps it when this changes.
    pub phase: &'static str,
    pub availability: &'static str,
    /// The server's clock, so countdowns do not depend on the reader's.
    pub now: String,
}

/// RFC 3339 with milliseconds: the script's countdowns are to the second,
/// and the server's clock is its reference.
pub fn rfc3339(at: impl std::borrow::Borrow<DateTime<Utc>>) -> String {
    at.borrow().to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// "1:02:03", "4:05", "0:09".
pub fn clock(seconds: i64) -> String {
    let (h, m, s) = (seconds / 3600, (seconds % 3600) / 60, seconds % 60);
    if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// The page script words it the same way (`waitInWords` in app.js).
pub fn wait_in_words(seconds: Option<u64>) -> String {
    match seconds {
        None => "not known yet (it is worked out from how fast places are admitted)".into(),
        Some(s) if s < 60 => "less than a minute".into(),
        Some(s) => {
            let minutes = s.div_ceil(60);
            format!(
                "about {minutes} minute{}",
                if minutes == 1 { "" } else { "s" }
            )
        }
    }
}

#[derive(Template)]
#[template(path = "queue.html")]
pub struct QueuePage {
    pub nav: Nav,
    pub sale: SaleView,
    pub room: WaitingRoomView,
    /// The most one purchase under the pass may ask for: what the pass
    /// covers (min(limit, units free when it was issued)).
    pub max_quantity: i32,
}

impl QueuePage {
    pub fn new(nav: Nav, product: &Product, units_left: i32, room: WaitingRoomView) -> QueuePage {
        let max_quantity = room
            .status
            .pass_units
            .or(product.per_customer_limit)
            .unwrap_or(1)
            .clamp(1, Quantity::MAX);
        QueuePage {
            nav,
            sale: SaleView::showing(product, units_left, room.now),
            room,
            max_quantity,
        }
    }
}

/// The product page's waiting-room part.
pub struct ProductQueue {
    pub opens_at: DateTime<Utc>,
    /// Joining has opened.
    pub open: bool,
    /// The customer's ticket, once joined.
    pub ticket: Option<String>,
}

impl ProductQueue {
    pub fn new(product: &Product, ticket: Option<String>, now: DateTime<Utc>) -> ProductQueue {
        let opens_at = QueueSale::of(product).map_or(product.sale_starts_at, |sale| sale.opens_at);
        ProductQueue {
            opens_at,
            open: now >= opens_at,
            ticket,
        }
    }

    pub fn opens_at_iso(&self) -> String {
        rfc3339(self.opens_at)
    }

    pub fn opens_at_text(&self) -> String {
        timestamp(self.opens_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_and_waits_read_as_people_say_them() {
        assert_eq!(clock(0), "0:00");
        assert_eq!(clock(65), "1:05");
        assert_eq!(clock(3_725), "1:02:05");
        assert_eq!(wait_in_words(Some(59)), "less than a minute");
        assert_eq!(wait_in_words(Some(60)), "about 1 minute");
        assert_eq!(wait_in_words(Some(61)), "about 2 minutes");
        assert!(wait_in_words(None).starts_with("not known yet"));
    }
}
