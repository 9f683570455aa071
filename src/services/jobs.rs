//! Background jobs. Each has a `run_once` that tests call directly; `spawn`
//! runs them on an interval inside `flashsale serve`.

use std::time::Duration;

use chrono::Utc;
use diesel::prelude::*;
use tokio::task::JoinHandle;

use super::payment::{settle_pending, SettleReport};
use super::restore::restore_order;
use super::Shop;
use crate::db;
use crate::db::schema::{orders, payments};
use crate::domain::{OrderId, OrderStatus};
use crate::error::AppError;
use crate::metrics;
use crate::services::idempotency::purge_expired;
use crate::services::{door, sessions, throttle};
use crate::shutdown::StopSignal;

/// How many due orders one sweep takes on; the next sweep takes the rest.
const SWEEP_BATCH: i64 = 200;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JobReport {
    /// Orders moved to `expired`, their units back on sale.
    pub expired: usize,
    /// Due orders another transaction or instance was already handling.
    pub skipped: usize,
    /// Due orders whose restore failed (Redis or Postgres down); retried next run.
    pub failed: usize,
    pub purged_keys: usize,
    /// Sign-in attempts older than the throttle window.
    pub purged_login_attempts: usize,
    /// Sessions that expired, or were revoked over a day ago.
    pub purged_sessions: usize,
    /// Spent bot checks past their expiry, and door passes past keeping.
    pub purged_door_rows: usize,
    /// Payment attempts whose answer was looked up at the provider.
    pub settled_payments: SettleReport,
}

/// One pass of every job: expire unpaid orders past their deadline, then
/// purge idempotency keys past their retention, stale sign-in attempts and
/// ended sessions.
pub async fn run_once(shop: &Shop) -> Result<JobReport, AppError> {
    let mut report = JobReport::default();
    // Payments first: an order whose charge is still unanswered must not
    // expire, and one that was paid meanwhile must be known as paid.
    match settle_pending(shop).await {
        Ok(settled) => report.settled_payments = settled,
        Err(error) => tracing::warn!(%error, "could not settle pending payments; will retry"),
    }
    // Claim with SKIP LOCKED: rows another transaction holds are left to it.
    let due: Vec<i64> = db::run(&shop.pool, |conn| {
        conn.transaction(|conn| {
            let unanswered = payments::table
                .filter(payments::order_id.eq(orders::id))
                .filter(payments::outcome.eq("pending"));
            Ok(orders::table
                .filter(orders::status.eq(OrderStatus::AwaitingPayment.as_str()))
                .filter(orders::payment_deadline.le(Utc::now()))
                .filter(diesel::dsl::not(diesel::dsl::exists(unanswered)))
                .order(orders::payment_deadline.asc())
                .limit(SWEEP_BATCH)
                .select(orders::id)
                .for_update()
                .skip_locked()
                .load(conn)?)
        })
    })
    .await?;
    for order in due {
        match restore_order(shop, OrderId(order), OrderStatus::Expired, None).await {
            Ok(true) => report.expired += 1,
            // Expired, paid or declined meanwhile by someone else: nothing to do.
            Ok(false) | Err(AppError::Conflict(_)) => report.skipped += 1,
            Err(error) => {
                tracing::warn!(order, %error, "could not expire order; will retry");
                report.failed += 1;
            }
        }
    }
    metrics::job_run("expire_unpaid_orders");
    let retention = shop.settings.idempotency_retention;
    report.purged_keys = db::run(&shop.pool, move |conn| purge_expired(conn, retention)).await?;
    metrics::job_run("purge_idempotency_keys");
    let window = shop.settings.security.login_limits.window;
    report.purged_login_attempts = db::run(&shop.pool, move |conn| {
        Ok(throttle::purge_expired(conn, window)?)
    })
    .await?;
    report.purged_sessions = db::run(&shop.pool, |conn| Ok(sessions::purge_ended(conn)?)).await?;
    let counts = shop.door_counts.clone();
    let window = shop.settings.security.door.window;
    report.purged_door_rows = db::run(&shop.pool, move |conn| {
        counts.flush(conn)?;
        Ok(door::purge_spent(conn)? + door::purge_passes(conn, window)?)
    })
    .await?;
    Ok(report)
}

/// Runs the reconcile job every `interval` until `stop` fires (none
/// without the stock gate). A stop waits for a reconcile under way: it is
/// only ever awaited in place of the next tick.
pub fn spawn_reconcile(
    shop: Shop,
    interval: Duration,
    mut stop: StopSignal,
) -> Option<JoinHandle<()>> {
    shop.gate.as_ref()?;
    Some(tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await; // start-up seeding just ran
        while next_tick(&mut ticker, &mut stop).await {
            if let Err(error) = crate::services::stock_gate::reconcile_once(&shop).await {
                tracing::warn!(%error, "reconcile failed; retrying next interval");
            }
        }
    }))
}

/// Runs the jobs every `interval`, and beside them the waiting rooms' tick
/// every `QUEUE_TICK_MS` (`services::waiting_room::run_until`), until `stop`
/// fires: both then finish the run they are in and end.
pub fn spawn(shop: Shop, interval: Duration, stop: StopSignal) -> JoinHandle<()> {
    tokio::spawn(async move {
        let queues = crate::services::waiting_room::run_until(shop.clone(), stop.clone());
        let mut stop = stop;
        let jobs = async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while next_tick(&mut ticker, &mut stop).await {
                match run_once(&shop).await {
                    Ok(report) if report != JobReport::default() => {
                        tracing::info!(?report, "jobs ran")
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "jobs failed; retrying next interval"),
                }
            }
        };
        tokio::join!(jobs, queues);
    })
}

/// Waits for the next tick; false once the stop is asked for. This is a
/// loop's only wait outside its run, so a stop lands between runs, never
/// in one (an expiry half done would leave its give-back to reconcile).
pub async fn next_tick(ticker: &mut tokio::time::Interval, stop: &mut StopSignal) -> bool {
    if stop.is_stopped() {
        return false;
    }
    tokio::select! {
        biased;
        _ = stop.stopped() => false,
        _ = ticker.tick() => true,
    }
}
