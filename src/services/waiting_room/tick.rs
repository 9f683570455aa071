//! What every process does every `QUEUE_TICK_MS`: opens the rooms whose
//! opening has come (their seed committed), draws those whose start has
//! passed, and runs the issuer of every room with work (passes past their
//! deadline, or free units and someone waiting). One read finds the work,
//! by the database's clock; a room without work costs nothing more. Every
//! step is safe in every process at once: the draw and the issuer take the
//! room's locks, and the second finds the work done.

use chrono::{DateTime, Duration as TimeDelta, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool};

use super::draw::{draw, ensure_room, Drawn};
use super::passes::{grace_ms, issue};
use super::sale::QueueSale;
use crate::db::{self, PgConn};
use crate::domain::ProductId;
use crate::domain::PASS_GRACE;
use crate::error::AppError;
use crate::services::catalog::QUEUE_OPENS_BEFORE_START;
use crate::services::{sale_cache, Shop};

/// What one tick did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Rooms with work found.
    pub rooms: usize,
    pub opened: usize,
    pub drawn: usize,
    pub issued: usize,
    pub lapsed: usize,
    /// Rooms whose step failed (tried again next tick).
    pub failed: usize,
}

#[derive(QueryableByName)]
struct Work {
    #[diesel(sql_type = BigInt)]
    product_id: i64,
    #[diesel(sql_type = Bool)]
    to_open: bool,
    #[diesel(sql_type = Bool)]
    to_draw: bool,
    /// A pass past its deadline (and grace), or free units and someone
    /// waiting behind the last pass.
    #[diesel(sql_type = Bool)]
    to_issue: bool,
}

const WORK: &str = "
SELECT product_id, to_open, to_draw, to_issue FROM (
    SELECT p.id AS product_id,
        d.product_id IS NULL AND live AS to_open,
        d.product_id IS NOT NULL AND d.drawn_at IS NULL AND live
            AND p.sale_starts_at <= clock_timestamp() AS to_draw,
        EXISTS (SELECT 1 FROM queue_admissions a WHERE a.product_id = p.id AND a.state = 'issued'
                AND a.expires_at + $2 * interval '1 millisecond' <= clock_timestamp())
        OR coalesce(d.drawn_at IS NOT NULL AND NOT d.admission_paused AND live
            AND d.last_position > (SELECT coalesce(max(a.number), 0) FROM queue_admissions a
                                   WHERE a.product_id = p.id)
            AND p.stock > (SELECT coalesce(sum(a.units), 0) FROM queue_admissions a
                           WHERE a.product_id = p.id AND a.state = 'issued'), false) AS to_issue
    FROM products p LEFT JOIN queue_draws d ON d.product_id = p.id
    CROSS JOIN LATERAL (SELECT p.sale_ends_at IS NULL OR p.sale_ends_at > clock_timestamp() AS live) l
    WHERE p.queue_mode
      AND coalesce(p.queue_opens_at, p.sale_starts_at - $1 * interval '1 second') <= clock_timestamp()
) rooms
WHERE to_open OR to_draw OR to_issue
ORDER BY product_id";

fn rooms_with_work(conn: &mut PgConn) -> Result<Vec<Work>, AppError> {
    let opens_before = QUEUE_OPENS_BEFORE_START.num_seconds();
    Ok(diesel::sql_query(WORK)
        .bind::<BigInt, _>(opens_before)
        .bind::<BigInt, _>(grace_ms())
        .load(conn)?)
}

/// One tick over every room.
pub async fn run_once(shop: &Shop) -> Result<TickReport, AppError> {
    let work = db::run(&shop.pool, rooms_with_work).await?;
    let mut report = TickReport {
        rooms: work.len(),
        ..TickReport::default()
    };
    let pass_ms = TimeDelta::from_std(shop.settings.queue_pass)
        .map_or(i64::MAX, |pass| pass.num_milliseconds());
    for room in work {
        let product = ProductId(room.product_id);
        match step(shop, product, &room, pass_ms, &mut report).await {
            Ok(()) => {}
            Err(error) => {
                report.failed += 1;
                tracing::warn!(%product, %error, "a waiting room's tick failed; trying again next tick");
            }
        }
    }
    Ok(report)
}

async fn step(
    shop: &Shop,
    product: ProductId,
    room: &Work,
    pass_ms: i64,
    report: &mut TickReport,
) -> Result<(), AppError> {
    if room.to_open {
        ensure_room(shop, product).await?;
        report.opened += 1;
    }
    let mut drawn = false;
    if room.to_draw || room.to_open {
        if let Drawn::Now(_) = draw(shop, product).await? {
            report.drawn += 1;
            drawn = true;
        }
    }
    if !(drawn || room.to_issue) {
        return Ok(());
    }
    // Right after the draw, in the same step: the first passes go out at
    // the start, with no wait for the next tick.
    let issued = issue(shop, product, pass_ms).await?;
    report.issued += issued.issued;
    report.lapsed += issued.lapsed;
    Ok(())
}

/// The tick every `QUEUE_TICK_MS`, until the task is aborted; only while
/// some room is live, so an idle shop's tick costs Postgres nothing.
pub async fn run_forever(shop: Shop) {
    run_until(shop, crate::shutdown::StopSignal::never()).await
}

/// `run_forever` until `stop` fires, between two ticks: a tick under way
/// (a draw, passes) is finished first.
pub async fn run_until(shop: Shop, mut stop: crate::shutdown::StopSignal) {
    let mut ticker = tokio::time::interval(shop.settings.queue_tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rooms = KnownRooms::default();
    while crate::services::jobs::next_tick(&mut ticker, &mut stop).await {
        if !rooms.any_live(&shop).await {
            continue;
        }
        match run_once(&shop).await {
            Ok(report) if report.issued + report.drawn + report.lapsed > 0 => {
                tracing::info!(?report, "waiting rooms ticked")
            }
            Ok(_) => {}
            Err(error) => tracing::debug!(%error, "the waiting rooms' tick could not run"),
        }
    }
}

/// The queue-mode sales as the shelf had them: as the pages last read it
/// (free), and read again every `JOBS_INTERVAL`, when this process changed
/// a sale, and every tick while a room is live (the shelf itself reads
/// Postgres at most once a second).
/// Only whether to tick is decided here, by this instance's clock and with
/// a margin; what a tick does is decided by the database's.
///
/// Between its opening and its start a room needs no tick (joins open it
/// and draw it themselves if they come first), only one to open it: each
/// room is ticked once after its opening, then from a little before its
/// start until its last passes can have lapsed after its end.
#[derive(Default)]
struct KnownRooms {
    sales: Vec<QueueSale>,
    read_at: Option<tokio::time::Instant>,
    writes_seen: u64,
    /// Rooms this process ticked after their opening.
    opened: std::collections::HashSet<ProductId>,
}

impl KnownRooms {
    async fn any_live(&mut self, shop: &Shop) -> bool {
        let now = Utc::now();
        let writes = sale_cache::writes();
        // What the pages read lately is free to look at: a sale another
        // process created is seen as soon as a page (a join, a poll, the
        // sale list) read the shelf.
        if let Some(shelf) = shop.sale_cache.peek() {
            self.sales = shelf
                .products()
                .iter()
                .filter_map(|p| QueueSale::of(p))
                .collect();
        }
        let due = self
            .read_at
            .is_none_or(|at| at.elapsed() >= shop.settings.jobs_interval)
            || writes != self.writes_seen
            || self.sales.iter().any(|sale| self.is_live(shop, sale, now));
        if due {
            match shop.sale_cache.shelf(&shop.pool).await {
                Ok(shelf) => {
                    self.sales = shelf
                        .products()
                        .iter()
                        .filter_map(|p| QueueSale::of(p))
                        .collect();
                    self.read_at = Some(tokio::time::Instant::now());
                    self.writes_seen = writes;
                }
                Err(error) => {
                    tracing::debug!(%error, "could not read the sales for the waiting rooms' tick");
                    return false;
                }
            }
        }
        let live = self.sales.iter().any(|sale| self.is_live(shop, sale, now));
        if live {
            // This tick opens every room whose opening has passed.
            let opened: Vec<ProductId> = self
                .sales
                .iter()
                .filter(|sale| sale.is_open(now))
                .map(|sale| sale.product)
                .collect();
            self.opened.extend(opened);
        }
        live
    }

    fn is_live(&self, shop: &Shop, sale: &QueueSale, now: DateTime<Utc>) -> bool {
        let margin = TimeDelta::seconds(5);
        let linger = TimeDelta::from_std(shop.settings.queue_pass + PASS_GRACE)
            .unwrap_or(TimeDelta::hours(1))
            + TimeDelta::minutes(1);
        let to_open = sale.is_open(now) && !self.opened.contains(&sale.product);
        let running =
            now + margin >= sale.starts_at && sale.ends_at.is_none_or(|end| now < end + linger);
        to_open || running
    }
}
