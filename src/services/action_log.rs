//! Who did what in the admin console, and when. Actions that are one
//! database transaction write their row inside it (`record`), so the action
//! and its record commit or vanish together.

use chrono::{DateTime, Utc};
use diesel::prelude::*;

use crate::db::schema::{admin_actions, customers};
use crate::db::{self, PgConn, PgPool};
use crate::domain::{CustomerId, OrderId, ProductId};
use crate::error::AppError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionKind {
    Refund,
    StockAdjust,
    GateResync,
    SaleCreate,
    SaleEdit,
    /// A waiting room's admission paused (issue #16).
    QueuePause,
    QueueResume,
}

impl ActionKind {
    pub const ALL: [ActionKind; 7] = [
        ActionKind::Refund,
        ActionKind::StockAdjust,
        ActionKind::GateResync,
        ActionKind::SaleCreate,
        ActionKind::SaleEdit,
        ActionKind::QueuePause,
        ActionKind::QueueResume,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Refund => "refund",
            ActionKind::StockAdjust => "stock_adjust",
            ActionKind::GateResync => "gate_resync",
            ActionKind::SaleCreate => "sale_create",
            ActionKind::SaleEdit => "sale_edit",
            ActionKind::QueuePause => "queue_pause",
            ActionKind::QueueResume => "queue_resume",
        }
    }

    pub fn parse(raw: &str) -> Option<ActionKind> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == raw)
    }
}

/// One admin action about to be recorded.
#[derive(Debug, Clone)]
pub struct AdminAction {
    pub admin: CustomerId,
    pub kind: ActionKind,
    pub product: Option<ProductId>,
    pub order: Option<OrderId>,
    pub detail: String,
}

impl AdminAction {
    pub fn on_product(
        admin: CustomerId,
        kind: ActionKind,
        product: ProductId,
        detail: String,
    ) -> Self {
        AdminAction {
            admin,
            kind,
            product: Some(product),
            order: None,
            detail,
        }
    }

    pub fn on_order(admin: CustomerId, kind: ActionKind, order: OrderId, detail: String) -> Self {
        AdminAction {
            admin,
            kind,
            product: None,
            order: Some(order),
            detail,
        }
    }
}

/// Writes `action` on `conn`: call it inside the action's own transaction.
pub fn record(conn: &mut PgConn, action: &AdminAction) -> QueryResult<()> {
    diesel::insert_into(admin_actions::table)
        .values((
            admin_actions::admin_id.eq(action.admin.get()),
            admin_actions::action.eq(action.kind.as_str()),
            admin_actions::product_id.eq(action.product.map(ProductId::get)),
            admin_actions::order_id.eq(action.order.map(OrderId::get)),
            admin_actions::detail.eq(&action.detail),
        ))
        .execute(conn)
        .map(drop)
}

/// Records an action whose own commit happened elsewhere (a refund, a gate
/// resync): written right after it succeeded.
pub async fn record_done(pool: &PgPool, action: AdminAction) -> Result<(), AppError> {
    db::run(pool, move |conn| Ok(record(conn, &action)?)).await
}

/// A recorded action as the action log page lists it.
#[derive(Debug, Clone, Queryable)]
pub struct RecordedAction {
    pub id: i64,
    pub created_at: DateTime<Utc>,
    pub admin_email: String,
    pub action: String,
    pub product_id: Option<i64>,
    pub order_id: Option<i64>,
    pub detail: String,
}

/// One page of the log, newest first, and how many actions there are in all.
pub async fn recent_actions(
    pool: &PgPool,
    offset: i64,
    limit: i64,
) -> Result<(Vec<RecordedAction>, i64), AppError> {
    db::run(pool, move |conn| {
        let rows = admin_actions::table
            .inner_join(customers::table)
            .order((admin_actions::created_at.desc(), admin_actions::id.desc()))
            .offset(offset)
            .limit(limit)
            .select((
                admin_actions::id,
                admin_actions::created_at,
                customers::email,
                admin_actions::action,
                admin_actions::product_id,
                admin_actions::order_id,
                admin_actions::detail,
            ))
            .load(conn)?;
        let total = admin_actions::table.count().get_result(conn)?;
        Ok((rows, total))
    })
    .await
}
