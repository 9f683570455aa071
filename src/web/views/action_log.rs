//! The admin action log page: who refunded, adjusted, resynced, created or
//! edited what. (Not the stock-ledger audit, which the dashboard shows.)

use askama::Template;

use super::{Nav, Pager};
use crate::services::action_log::{ActionKind, RecordedAction};
use crate::web::format::{iso, timestamp};

/// One recorded admin action.
pub struct ActionRow {
    pub at_iso: String,
    pub at_text: String,
    pub admin_email: String,
    pub action: &'static str,
    pub product_id: Option<i64>,
    pub order_id: Option<i64>,
    pub detail: String,
}

impl From<RecordedAction> for ActionRow {
    fn from(recorded: RecordedAction) -> Self {
        ActionRow {
            at_iso: iso(&recorded.created_at),
            at_text: timestamp(recorded.created_at),
            admin_email: recorded.admin_email,
            action: ActionKind::parse(&recorded.action).map_or("Other", label),
            product_id: recorded.product_id,
            order_id: recorded.order_id,
            detail: recorded.detail,
        }
    }
}

/// What the log calls an action of this kind.
fn label(kind: ActionKind) -> &'static str {
    match kind {
        ActionKind::Refund => "Refund",
        ActionKind::StockAdjust => "Stock adjustment",
        ActionKind::GateResync => "Gate resync",
        ActionKind::SaleCreate => "Sale created",
        ActionKind::SaleEdit => "Sale edited",
        ActionKind::QueuePause => "Waiting room paused",
        ActionKind::QueueResume => "Waiting room resumed",
    }
}

#[derive(Template)]
#[template(path = "admin_action_log.html")]
pub struct ActionLogPage {
    pub nav: Nav,
    pub rows: Vec<ActionRow>,
    pub pager: Pager,
}
