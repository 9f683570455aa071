//! The waiting room as a customer sees it (the waiting page, `queue.json`,
//! the product page's join button). The page and the
//! JSON are built from one `WaitingRoomView`, so the script that polls the
//! JSON and the page the server renders never disagree about which phase a
//! customer is in.

use askama::Template;
use chrono::{DateTime, SecondsFormat, Utc};

use super::sale::SaleView;
use super::Nav;
use crate::domain::draw::PassState;
use crate::domain::{Product, Quantity, QueueState, SaleState, Standing};
use crate::services::waiting_room::{QueueSale, QueueStatus, WaitEstimate};
use crate::web::format::timestamp;

mod phase;

use phase::{phase_of, seconds_until};
pub use phase::{Availability, Phase};

/// When an admitted customer is warned that the pass is nearly over.
const LAST_SECONDS: i64 = 30;

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

    pub fn title(&self) -> &'static str {
        self.phase.title()
    }

    /// The pass has at most 30 seconds left (the page warns; the script
    /// shows the warning when the countdown gets there).
    pub fn pass_nearly_over(&self) -> bool {
        self.status
            .pass_expires_at
            .is_some_and(|at| (at - self.now).num_seconds() <= LAST_SECONDS)
    }

    pub fn last_seconds(&self) -> i64 {
        LAST_SECONDS
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

    /// Who is before this place: "nobody waiting ahead" alone reads as
    /// "your turn is now" while shoppers ahead still hold every unit.
    pub fn line_text(&self) -> String {
        let admitted = self.status.admitted_ahead.unwrap_or(0);
        let buying = match admitted {
            0 => String::new(),
            1 => " 1 shopper ahead of you has been admitted and is buying now.".into(),
            n => format!(" {n} shoppers ahead of you have been admitted and are buying now."),
        };
        match self.status.ahead {
            None => String::new(),
            Some(0) => format!("You are next in line.{buying}"),
            Some(ahead) => format!(
                "{ahead} {} still waiting ahead of you.{buying}",
                if ahead == 1 {
                    "shopper is"
                } else {
                    "shoppers are"
                }
            ),
        }
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

    pub fn next_release_iso(&self) -> String {
        self.status.next_release_at.map(rfc3339).unwrap_or_default()
    }

    pub fn next_release_text(&self) -> String {
        self.status
            .next_release_at
            .map(timestamp)
            .unwrap_or_else(|| "a few minutes from now".into())
    }

    pub fn estimated_wait_text(&self) -> String {
        estimate_in_words(&self.status.wait)
    }

    /// "2 minutes": how long a pass lets its holder buy.
    pub fn pass_length_text(&self) -> String {
        duration_in_words(self.status.pass_length.as_secs())
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

    pub fn before_start(&self) -> bool {
        self.now < self.status.starts_at
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
            // Refunds bring units back: a sold-out page keeps looking.
            Phase::SoldOut => Some(30),
            Phase::Bought | Phase::Lapsed | Phase::Closed => None,
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
            next_release_at: status.next_release_at.as_ref().map(rfc3339),
            estimated_wait_secs: status.wait.seconds(),
            estimated_wait_text: self.estimated_wait_text(),
            line_text: self.line_text(),
            pass: status.pass.as_ref().map(ToString::to_string),
            pass_state: status.pass_state,
            pass_units: status.pass_units,
            seed_sha256: status.commitment.as_ref().map(ToString::to_string),
            entries_sha256: status.entries_commitment.as_ref().map(ToString::to_string),
            phase: self.phase.name(),
            title: self.phase.title(),
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
    /// The latest a held unit comes back if nobody pays for it.
    pub held_until: Option<String>,
    /// The earliest a held unit can come back.
    pub next_release_at: Option<String>,
    pub estimated_wait_secs: Option<u64>,
    /// The page's words for the wait and the line, so the script writes
    /// exactly what the server renders.
    pub estimated_wait_text: String,
    pub line_text: String,
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
    /// The tab's title for this phase (without the sale's name).
    pub title: &'static str,
    pub availability: &'static str,
    /// The server's clock, so countdowns do not depend on the reader's.
    pub now: String,
}

/// RFC 3339 with milliseconds: the script's countdowns are to the second,
/// and the server's clock is its reference.
pub fn rfc3339(at: impl std::borrow::Borrow<DateTime<Utc>>) -> String {
    at.borrow().to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// "2 days 1:02:03", "1:02:03", "4:05", "0:09" (the page script's `clock`
/// writes the same).
pub fn clock(seconds: i64) -> String {
    let (d, h, m, s) = (
        seconds / 86_400,
        (seconds % 86_400) / 3600,
        (seconds % 3600) / 60,
        seconds % 60,
    );
    if d > 0 {
        format!("{d} day{} {h}:{m:02}:{s:02}", if d == 1 { "" } else { "s" })
    } else if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// "about 3 minutes", "less than a minute", "about 2 hours".
pub fn wait_in_words(seconds: u64) -> String {
    if seconds < 60 {
        return "less than a minute".into();
    }
    format!("about {}", span_in_words(seconds))
}

/// "1 minute", "3 minutes", "2 hours", rounded up.
fn span_in_words(seconds: u64) -> String {
    let minutes = seconds.div_ceil(60).max(1);
    match minutes {
        1 => "1 minute".into(),
        m if m < 120 => format!("{m} minutes"),
        m => format!("{} hours", m.div_ceil(60)),
    }
}

/// "2 minutes", "90 seconds", "1 minute".
pub fn duration_in_words(seconds: u64) -> String {
    match seconds {
        60 => "1 minute".into(),
        s if s % 60 == 0 => format!("{} minutes", s / 60),
        s => format!("{s} seconds"),
    }
}

/// What a waiter reads under "Estimated wait".
pub fn estimate_in_words(estimate: &WaitEstimate) -> String {
    match estimate {
        WaitEstimate::Unknown => "not known yet".into(),
        WaitEstimate::UnitsFree => {
            "less than a minute: there are units for you and everyone ahead of you".into()
        }
        WaitEstimate::AfterHeldReturn { wait, .. } => format!(
            "at least {}: every unit is held right now, and your turn comes only when shoppers ahead of you let theirs go (a pass runs out or an order goes unpaid)",
            span_in_words(wait.as_secs())
        ),
        WaitEstimate::OnlyIfReturned => "not known: more shoppers are ahead of you than there are units left or held, so your turn comes only if an order is refunded".into(),
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
    /// Units not bought but held for admitted shoppers (passes and unpaid
    /// orders), as the waiting room counts them.
    pub held: i64,
    /// Units neither bought nor held.
    pub free: i64,
    /// From the start until the sale ends, how the room counts its units
    /// (None before the start, after the end, or when the room could not be
    /// read). The product page's headline count is then the room's, from
    /// the same snapshot the waiting page shows, never the stock row's:
    /// the stock still counts units a pass holds, which made the page say
    /// "2 of 2 left" while the room said every unit was held.
    pub live: Option<Availability>,
    /// The earliest a held unit can come back, if nobody pays for it.
    pub next_release_at: Option<DateTime<Utc>>,
    /// Units the reader's own open pass holds: some of the held ones are
    /// theirs to buy, which the page says rather than "join the line".
    pub own_pass_units: Option<i32>,
}

impl ProductQueue {
    /// `status`: the room as the waiting page shows it, when it could be read.
    pub fn new(
        product: &Product,
        status: Option<&QueueStatus>,
        now: DateTime<Utc>,
    ) -> ProductQueue {
        let opens_at = QueueSale::of(product).map_or(product.sale_starts_at, |sale| sale.opens_at);
        let started = |s: &&QueueStatus| {
            matches!(
                s.queue,
                QueueState::Open | QueueState::Paused | QueueState::SoldOut
            )
        };
        ProductQueue {
            opens_at,
            open: now >= opens_at,
            ticket: status
                .and_then(|s| s.ticket.as_ref())
                .map(|t| t.as_str().to_string()),
            held: status.map_or(0, |s| s.held),
            free: status.map_or(0, |s| s.units_left),
            live: status
                .filter(started)
                .map(|s| Availability::of(s.units_left, s.held)),
            next_release_at: status.and_then(|s| s.next_release_at),
            own_pass_units: status
                .filter(|s| s.pass_state == Some(PassState::Issued))
                .and_then(|s| s.pass_units),
        }
    }

    /// Whether the room counts the units right now (see `live`).
    pub fn counts_units(&self) -> bool {
        self.live.is_some()
    }

    /// While the room counts the units, `sale` shows the room's count (free
    /// and held) and is sold out when the room says so, not when the stock
    /// row reaches 0: units in unpaid orders are held and may come back,
    /// and late arrivals can still join the back of the line meanwhile.
    pub fn count_into(&self, sale: &mut SaleView) {
        if let Some(live) = self.live {
            sale.state = if live == Availability::AllSold {
                SaleState::SoldOut
            } else {
                SaleState::Live
            };
            sale.room_count = Some((self.free, self.held));
        }
    }

    pub fn availability_name(&self) -> &'static str {
        self.live.map_or("", Availability::name)
    }

    pub fn availability_is(&self, availability: &str) -> bool {
        self.availability_name() == availability
    }

    pub fn next_release_iso(&self) -> String {
        self.next_release_at.map(rfc3339).unwrap_or_default()
    }

    pub fn next_release_text(&self) -> String {
        self.next_release_at
            .as_ref()
            .map(timestamp)
            .unwrap_or_default()
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
        assert_eq!(clock(167 * 3600 + 58 * 60 + 52), "6 days 23:58:52");
        assert_eq!(clock(86_400), "1 day 0:00:00");
        assert_eq!(wait_in_words(59), "less than a minute");
        assert_eq!(wait_in_words(60), "about 1 minute");
        assert_eq!(wait_in_words(61), "about 2 minutes");
        assert_eq!(wait_in_words(3 * 3600), "about 3 hours");
        assert_eq!(duration_in_words(120), "2 minutes");
        assert_eq!(duration_in_words(90), "90 seconds");
    }
}
