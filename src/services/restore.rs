//! Giving stock back: payment declined, order expired, order refunded.
//! One function for all three, under the same product locks and row locks as
//! a purchase, so a restore and a sale of the same unit can never interleave.
//! The customer's holdings shrink in the same transaction, so the units
//! count against their per-customer limit exactly while the order is live.

use chrono::Utc;
use diesel::prelude::*;

use super::mail::{self, Mail};
use super::Shop;
use crate::db::fence::change_stock;
use crate::db::models::NewStockChange;
use crate::db::schema::{order_items, orders, payments, products, stock_history};
use crate::db::{self, holdings, PgConn};
use crate::domain::{CustomerId, Order, OrderId, OrderItem, OrderStatus, ProductId};
use crate::error::{AppError, Conflict, Missing};
use crate::lock::Lease;
use crate::metrics;
use crate::services::action_log::{self, AdminAction};
use crate::services::stock_gate::give_back_all;

/// Moves `order` into `to` (a restoring status) and puts its units back.
/// The state machine refuses a second restore, and a unique index on the
/// ledger would refuse it again if the check were ever bypassed.
///
/// Expiry is a background sweep: it skips an order whose row another
/// transaction holds (a payment in flight, another instance's sweep) and
/// returns `Ok(false)`; it only expires orders whose deadline has passed.
///
/// `by_admin` (a refund) is recorded in the admin audit log in the same
/// transaction, so the log never misses a refund nor shows one that did not happen.
pub async fn restore_order(
    shop: &Shop,
    order: OrderId,
    to: OrderStatus,
    by_admin: Option<AdminAction>,
) -> Result<bool, AppError> {
    let reason = to
        .restore_reason()
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("{to:?} does not give stock back")))?;
    let items = order_items_of(shop, order).await?;
    let products: Vec<ProductId> = items.iter().map(|i| ProductId(i.product_id)).collect();
    let pool = shop.pool.clone();
    let gate = shop.gate.clone();
    shop.locks
        .with_locks(products.clone(), move |lease| async move {
            let started = std::time::Instant::now();
            let restored = db::run(&pool, move |conn| {
                conn.transaction(|conn| {
                    let query = orders::table.find(order.get()).select(Order::as_select());
                    let current: Order = if to == OrderStatus::Expired {
                        match query.for_update().skip_locked().first(conn).optional()? {
                            Some(current) => current,
                            None => return Ok(None),
                        }
                    } else {
                        query.for_update().first(conn)?
                    };
                    if to == OrderStatus::Expired && current.payment_deadline > Utc::now() {
                        return Ok(None);
                    }
                    // A charge still unanswered keeps the order: if the
                    // provider approved it, the customer paid for these units.
                    if to == OrderStatus::Expired && payment_unanswered(conn, order)? {
                        return Ok(None);
                    }
                    // The same for a customer giving up (a decline's own
                    // restore never meets one: a new charge waits for the
                    // last one's answer).
                    if to == OrderStatus::PaymentFailed && payment_unanswered(conn, order)? {
                        return Err(Conflict::CancelWhilePaymentPending(order).into());
                    }
                    current
                        .status()
                        .transition(to)
                        .map_err(|refused| refused_transition(order, refused.from, to))?;
                    let customer = CustomerId(current.customer_id);
                    for item in &items {
                        let stock_after = give_back(conn, &lease, item)?;
                        holdings::release(
                            conn,
                            ProductId(item.product_id),
                            customer,
                            item.quantity,
                        )?;
                        diesel::insert_into(stock_history::table)
                            .values(NewStockChange {
                                product_id: item.product_id,
                                order_id: Some(order.get()),
                                delta: item.quantity,
                                stock_after,
                                reason: reason.as_str(),
                                note: "",
                            })
                            .execute(conn)?;
                    }
                    set_status(conn, order, to)?;
                    if to == OrderStatus::Refunded {
                        mail::enqueue(
                            conn,
                            customer,
                            &Mail::Refund {
                                order: order.get(),
                                total_cents: current.total_cents,
                            },
                        )?;
                    }
                    if let Some(action) = &by_admin {
                        action_log::record(conn, action)?;
                    }
                    lease.ensure_valid()?;
                    Ok(Some(current))
                })
            })
            .await?;
            metrics::transaction_time("restore", started.elapsed());
            let Some(restored) = restored else {
                return Ok(false);
            };
            metrics::restored(to.as_str(), 1);
            // Still under the product locks: the gate gets the units back
            // before any buyer can be admitted against a stale count.
            if let (Some(gate), Some(admission)) = (&gate, &restored.gate_key) {
                give_back_all(gate, admission, &products).await;
            }
            Ok(true)
        })
        .await
}

/// The order's items in ascending product id: the order in which rows are locked.
pub async fn order_items_of(shop: &Shop, order: OrderId) -> Result<Vec<OrderItem>, AppError> {
    let items: Vec<OrderItem> = db::run(&shop.pool, move |conn| {
        Ok(order_items::table
            .filter(order_items::order_id.eq(order.get()))
            .order(order_items::product_id.asc())
            .select(OrderItem::as_select())
            .load(conn)?)
    })
    .await?;
    if items.is_empty() {
        return Err(AppError::NotFound(Missing::Order(order)));
    }
    Ok(items)
}

fn give_back(conn: &mut PgConn, lease: &Lease, item: &OrderItem) -> Result<i32, AppError> {
    // Re-read under the row lock, as every stock change does.
    products::table
        .find(item.product_id)
        .for_update()
        .select(products::stock)
        .first::<i32>(conn)?;
    change_stock(conn, lease, ProductId(item.product_id), item.quantity)
}

pub fn set_status(conn: &mut PgConn, order: OrderId, to: OrderStatus) -> Result<(), AppError> {
    diesel::update(orders::table.find(order.get()))
        .set((
            orders::status.eq(to.as_str()),
            orders::updated_at.eq(Utc::now()),
        ))
        .execute(conn)?;
    Ok(())
}

/// A move the state machine refuses.
pub fn refused_transition(order: OrderId, from: OrderStatus, to: OrderStatus) -> AppError {
    Conflict::Transition { order, from, to }.into()
}

fn payment_unanswered(conn: &mut PgConn, order: OrderId) -> Result<bool, AppError> {
    let pending: i64 = payments::table
        .filter(payments::order_id.eq(order.get()))
        .filter(payments::outcome.eq("pending"))
        .count()
        .get_result(conn)?;
    Ok(pending > 0)
}
