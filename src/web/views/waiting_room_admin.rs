//! The admin's waiting-room dashboard: one panel per queue-mode sale.

use askama::Template;

use super::Nav;
use crate::domain::QueueState;
use crate::services::door::DoorStats;
use crate::services::waiting_room::QueueOverview;
use crate::web::format::{iso, timestamp};

/// One count of a room, as Postgres holds it.
pub struct CountRow {
    pub what: &'static str,
    pub key: &'static str,
    pub value: i64,
}

/// One sale's waiting room as the dashboard shows it.
pub struct QueuePanel {
    pub id: i64,
    pub name: String,
    pub opens_at_iso: String,
    pub opens_at_text: String,
    pub starts_at_iso: String,
    pub starts_at_text: String,
    /// "Admitting", "Paused", ... or "Not open yet".
    pub state_label: String,
    pub state_class: &'static str,
    pub counts: Vec<CountRow>,
    pub conversion: String,
    pub commitment: Option<String>,
    pub committed_at_text: String,
    pub entries_commitment: Option<String>,
    pub frozen_at_text: Option<String>,
    pub drawn_at_text: Option<String>,
    /// (paused, admin email, when)
    pub last_change: Option<(bool, String, String)>,
    pub can_pause: bool,
    pub can_resume: bool,
    pub door: DoorPanel,
}

impl QueuePanel {
    pub fn new(overview: &QueueOverview, door: &DoorStats) -> QueuePanel {
        let product = &overview.product;
        let (state_label, state_class) = match overview.state {
            None => ("Not open yet", "upcoming"),
            Some(QueueState::Pre) => ("Pre-queue: waiting for the start", "upcoming"),
            Some(QueueState::Open) => ("Admitting", "live"),
            Some(QueueState::Paused) => ("Paused", "ended"),
            Some(QueueState::SoldOut) => ("Sold out", "soldout"),
            Some(QueueState::Closed) => ("Closed", "ended"),
        };
        let c = overview.counts;
        let row = |what, key, value| CountRow { what, key, value };
        let counts = vec![
            row("Joined", "joined", c.entries),
            row("Waiting", "waiting", (c.entries - c.admitted).max(0)),
            row("Admitted (passes issued)", "admitted", c.admitted),
            row("Passes outstanding", "outstanding", c.open),
            row("Units held by passes", "outstanding-units", c.open_units),
            row("Used", "used", c.used),
            row("Lapsed", "lapsed", c.lapsed),
            row("Late arrivals", "late", c.late),
        ];
        let draw = overview.draw.as_ref();
        QueuePanel {
            id: product.id,
            name: product.name.clone(),
            opens_at_iso: iso(&overview.opens_at),
            opens_at_text: timestamp(overview.opens_at),
            starts_at_iso: iso(&product.sale_starts_at),
            starts_at_text: timestamp(product.sale_starts_at),
            state_label: state_label.to_string(),
            state_class,
            counts,
            conversion: overview
                .conversion()
                .map_or("—".to_string(), |c| format!("{:.0}%", c * 100.0)),
            commitment: draw.map(|d| d.seed_sha256.clone()),
            committed_at_text: draw.map(|d| timestamp(d.committed_at)).unwrap_or_default(),
            entries_commitment: draw.and_then(|d| d.entries_sha256.clone()),
            frozen_at_text: draw.and_then(|d| d.frozen_at).map(timestamp),
            drawn_at_text: draw.and_then(|d| d.drawn_at).map(timestamp),
            last_change: overview
                .last_admin_change
                .as_ref()
                .map(|(paused, who, at)| (*paused, who.clone(), timestamp(at))),
            can_pause: overview.state == Some(QueueState::Open),
            can_resume: overview.state == Some(QueueState::Paused),
            door: DoorPanel::new(door),
        }
    }
}

#[derive(Template)]
#[template(path = "admin_queues.html")]
pub struct QueueDashboardPage {
    pub nav: Nav,
    pub queues: Vec<QueuePanel>,
    /// The sign-up door, above the rooms.
    pub signup_door: DoorPanel,
}

/// What the door in front of sign-up or a waiting room let through and
/// turned away.
pub struct DoorPanel {
    pub challenges_issued: i64,
    pub passed: i64,
    /// (reason in words, count)
    pub refused: Vec<(&'static str, i64)>,
    /// (address, times through)
    pub busiest_addresses: Vec<(String, i64)>,
}

impl DoorPanel {
    pub fn new(stats: &DoorStats) -> DoorPanel {
        let reason = |kind: &str| match kind {
            "not solved" => "Sent without solving the check",
            "invalid solution" => "Wrong or forged answer",
            "expired challenge" => "Check ran out (10 minutes)",
            "solution reused" => "Answer used twice",
            "address limit" => "Too many from one address",
            "address not confirmed" => "Email address not confirmed",
            _ => "Other",
        };
        DoorPanel {
            challenges_issued: stats.challenges_issued,
            passed: stats.passed,
            refused: stats
                .refused
                .iter()
                .map(|(kind, n)| (reason(kind), *n))
                .collect(),
            busiest_addresses: stats.busiest_addresses.clone(),
        }
    }
}

/// The rooms an admin watches during a drop come first: admitting, paused
/// and sold out (a refund may still admit), then those not started yet,
/// then closed ones; the service's order (latest start first) within each.
pub fn panels_live_first(overviews: &[(QueueOverview, DoorStats)]) -> Vec<QueuePanel> {
    let rank = |state: Option<QueueState>| match state {
        Some(QueueState::Open | QueueState::Paused | QueueState::SoldOut) => 0,
        None | Some(QueueState::Pre) => 1,
        Some(QueueState::Closed) => 2,
    };
    let mut ranked: Vec<&(QueueOverview, DoorStats)> = overviews.iter().collect();
    ranked.sort_by_key(|(overview, _)| rank(overview.state));
    ranked
        .into_iter()
        .map(|(overview, door)| QueuePanel::new(overview, door))
        .collect()
}
