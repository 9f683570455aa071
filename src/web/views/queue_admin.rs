//! The admin's waiting-room dashboard: one panel per queue-mode sale.

use askama::Template;

use super::Nav;
use crate::queue::QueueState;
use crate::services::queue_admin::{LiveQueue, QueueOverview};
use crate::web::format::{iso, timestamp};

/// A count as Redis has it live and as Postgres has recorded it.
pub struct CountRow {
    pub what: &'static str,
    pub key: &'static str,
    /// None when Redis is not running the queue or did not answer.
    pub live: Option<i64>,
    /// None when Postgres records no such count.
    pub recorded: Option<i64>,
}

/// One sale's waiting room as the dashboard shows it.
pub struct QueuePanel {
    pub id: i64,
    pub name: String,
    pub opens_at_iso: String,
    pub opens_at_text: String,
    pub starts_at_iso: String,
    pub starts_at_text: String,
    /// "Open", "Paused", ... or why there is no live state.
    pub state_label: String,
    pub state_class: &'static str,
    pub redis_note: Option<String>,
    pub counts: Vec<CountRow>,
    pub conversion: String,
    pub commitment: Option<String>,
    pub committed_at_text: String,
    pub drawn_at_text: Option<String>,
    /// (paused, admin email, when)
    pub last_change: Option<(bool, String, String)>,
    pub can_pause: bool,
    pub can_resume: bool,
}

impl QueuePanel {
    pub fn new(overview: &QueueOverview) -> QueuePanel {
        let product = &overview.product;
        let (state_label, state_class, redis_note, live) = match &overview.live {
            LiveQueue::Running { state, counts } => {
                let (label, class) = match state {
                    QueueState::Pre => ("Pre-queue: waiting for the start", "upcoming"),
                    QueueState::Open => ("Admitting", "live"),
                    QueueState::Paused => ("Paused", "ended"),
                    QueueState::SoldOut => ("Sold out", "soldout"),
                    QueueState::Closed => ("Closed", "ended"),
                };
                (label.to_string(), class, None, Some(*counts))
            }
            LiveQueue::Absent => (
                "Not running".to_string(),
                "upcoming",
                Some("Redis holds no queue for this sale: it is set up when the waiting room opens (or rebuilt from Postgres after Redis lost it).".to_string()),
                None,
            ),
            LiveQueue::Retired => (
                "Over".to_string(),
                "ended",
                Some("The sale is over, so its queue was freed from Redis; the counts below are Postgres's record of it.".to_string()),
                None,
            ),
            LiveQueue::Unreadable(error) => (
                "Unknown".to_string(),
                "ended",
                Some(format!("Redis did not answer ({error}); the recorded counts below are from Postgres.")),
                None,
            ),
        };
        let recorded = overview.recorded;
        let row = |what, key, live: Option<i64>, recorded: Option<i64>| CountRow {
            what,
            key,
            live,
            recorded,
        };
        let counts = vec![
            row(
                "Joined",
                "joined",
                live.map(|c| c.joined),
                Some(recorded.entries),
            ),
            row("Waiting", "waiting", live.map(|c| c.waiting), None),
            row(
                "Admitted (passes issued)",
                "admitted",
                live.map(|c| c.admitted),
                Some(recorded.admitted),
            ),
            row(
                "Passes outstanding",
                "outstanding",
                live.map(|c| c.open_passes),
                Some(recorded.open),
            ),
            row(
                "Units held by passes",
                "outstanding-units",
                live.map(|c| c.outstanding_units),
                None,
            ),
            row("Used", "used", live.map(|c| c.used), Some(recorded.used)),
            row(
                "Lapsed",
                "lapsed",
                live.map(|c| c.lapsed),
                Some(recorded.lapsed),
            ),
            row("Late arrivals", "late", None, Some(recorded.late)),
        ];
        let state = match &overview.live {
            LiveQueue::Running { state, .. } => Some(*state),
            _ => None,
        };
        QueuePanel {
            id: product.id,
            name: product.name.clone(),
            opens_at_iso: iso(&overview.opens_at),
            opens_at_text: timestamp(overview.opens_at),
            starts_at_iso: iso(&product.sale_starts_at),
            starts_at_text: timestamp(product.sale_starts_at),
            state_label,
            state_class,
            redis_note,
            counts,
            conversion: overview
                .conversion()
                .map_or("—".to_string(), |c| format!("{:.0}%", c * 100.0)),
            commitment: overview.draw.as_ref().map(|d| d.seed_sha256.clone()),
            committed_at_text: overview
                .draw
                .as_ref()
                .map(|d| timestamp(d.committed_at))
                .unwrap_or_default(),
            drawn_at_text: overview
                .draw
                .as_ref()
                .and_then(|d| d.drawn_at)
                .map(timestamp),
            last_change: overview
                .last_admin_change
                .as_ref()
                .map(|(paused, who, at)| (*paused, who.clone(), timestamp(at))),
            can_pause: state == Some(QueueState::Open),
            can_resume: state == Some(QueueState::Paused),
        }
    }
}

#[derive(Template)]
#[template(path = "admin_queues.html")]
pub struct QueueDashboardPage {
    pub nav: Nav,
    pub queues: Vec<QueuePanel>,
}
