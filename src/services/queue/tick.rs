//! The waiting rooms' tick: every process runs it every `QUEUE_TICK_MS`,
//! all at once (each Redis step is one atomic script, each Postgres write
//! idempotent), for every queue-mode sale from its opening until a while
//! after it ends:
//!
//! 1. the seed is committed and the queue is in Redis (prepared, or
//!    rebuilt from Postgres when Redis lost it);
//! 2. places whose joiner died before confirming get their rows and are
//!    confirmed;
//! 3. Redis learns the unpaid units (and, with the gate off, the stock);
//! 4. at the start, the draw: the pre-queue shuffled with the seed from
//!    Postgres, put in that order, and the seed revealed (`drawn_at`); a
//!    queue Redis has undrawn though its draw is revealed lost writes, and
//!    is dropped to be rebuilt from Postgres, never drawn again (so is one
//!    with fewer admissions than Postgres has recorded, at step 7);
//! 5. passes past their deadline lapse; claims past it and the gate's grace
//!    are settled by what Postgres says;
//! 6. the queue closes as sold out when nothing is left and nothing can
//!    come back, reopens when a unit does, and closes when the sale ends;
//! 7. passes are issued in line order within what can still be admitted,
//!    so a unit that came back admits the next waiter within a tick;
//! 8. the log of issues and lapses is recorded in `queue_admissions`.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Timestamptz};

use super::admissions::{drain_log, resolve_stale, settle_uses_a_rebuild_missed, Resolved};
use super::entries::{committed_entry, forget_entries, insert_entries};
use super::join::queue_sale;
use super::local::local;
use super::opening::{
    ensure_queue, has_open_admissions, places_after, read_record, rebuild, Readied,
};
use super::sale::QueueSale;
use crate::db;
use crate::db::schema::{queue_draws, queue_entries};
use crate::domain::draw::{shuffle, DrawSeed, Ticket};
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::queue::{
    Behind, Confirmed, Drawn, Issue, IssueBound, QueueState, QueueView, Reconcile, Retire,
};
use crate::services::stock_gate::seed_if_absent;
use crate::services::Shop;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TickReport {
    /// Queue-mode sales ticked.
    pub queues: usize,
    pub prepared: usize,
    pub rebuilt: usize,
    /// Places whose joiner died, written and confirmed here.
    pub confirmed: usize,
    /// Places whose row could not be written (the ticket was taken), or
    /// that a draw went ahead without: taken back.
    pub undone: usize,
    /// Committed places a rebuild's snapshot had missed, or Redis lost
    /// (`put_back_lost_joins`): put back.
    pub put_back: usize,
    pub drawn: usize,
    pub issued: usize,
    /// Log events recorded in Postgres.
    pub recorded: usize,
    /// Stale claims whose purchase had committed: used.
    pub settled: usize,
    /// Passes a rebuild reopened whose purchase Postgres has: used.
    pub settled_after_rebuild: usize,
    /// Stale claims whose purchase never committed: lapsed.
    pub lapsed_claims: usize,
    /// Stale claims that could not be settled either way (logged); tried
    /// again next tick.
    pub unsettled: usize,
    pub sold_out: usize,
    pub reopened: usize,
    pub closed: usize,
    /// Queues Redis had undrawn though their draw was revealed, or with
    /// fewer admissions than Postgres recorded (it lost writes): dropped,
    /// to be rebuilt from Postgres.
    pub discarded: usize,
    /// Finished queues freed from Redis (`QueueSale::has_retired`).
    pub retired: usize,
    /// Queues whose tick failed (Redis or Postgres down); tried again next tick.
    pub failed: usize,
}

/// One tick of every live waiting room, the sales and their units read afresh.
pub async fn run_once(shop: &Shop) -> Result<TickReport, AppError> {
    let sales = queue_sales(shop).await?;
    Ok(tick_all(shop, &sales, Utc::now(), &mut RecentNumbers::default()).await)
}

/// How long the running tick uses a sale's units as Postgres last told it
/// (with the stock gate on). Every process ticks four times a second, and a
/// read each time would be most of what an idle shop with a live waiting
/// room costs Postgres. Nothing that bounds admissions depends on it (the
/// gate's count does), and a change of state (sold out, reopened) is only
/// ever decided on a fresh read: what may trail Postgres by this much is
/// the units shown as held and until when.
const NUMBERS_SERVE: Duration = Duration::from_secs(1);

/// The units of each waiting room as the tick last read them. With the gate
/// off they are read every tick: they are the mirror that bounds passes.
#[derive(Default)]
struct RecentNumbers(HashMap<ProductId, (tokio::time::Instant, SaleNumbers)>);

impl RecentNumbers {
    /// A sale's units, read afresh (true) or as read within `NUMBERS_SERVE`
    /// (kept only while the next tick, too, would still find it that young).
    async fn get(
        &mut self,
        shop: &Shop,
        product: ProductId,
    ) -> Result<(SaleNumbers, bool), AppError> {
        if let Some((read_at, numbers)) = self.0.get(&product) {
            if read_at.elapsed() + shop.settings.queue_tick < NUMBERS_SERVE {
                return Ok((numbers.clone(), false));
            }
        }
        Ok((self.read(shop, product).await?, true))
    }

    /// A sale's units, read afresh, their unpaid units (shown as held)
    /// mirrored into Redis, and kept; a read whose mirror failed is not
    /// kept, so the next tick writes it.
    async fn read(&mut self, shop: &Shop, product: ProductId) -> Result<SaleNumbers, AppError> {
        self.forget(product);
        let read_at = tokio::time::Instant::now();
        let numbers = sale_numbers(shop, product).await?;
        shop.waiting_room
            .mirror_unpaid(product, numbers.unpaid)
            .await?;
        self.0.insert(product, (read_at, numbers.clone()));
        Ok(numbers)
    }

    fn forget(&mut self, product: ProductId) {
        self.0.remove(&product);
    }

    /// Passes this tick issued hold units until `until`, which the kept
    /// read (from before they were recorded) does not know.
    fn passes_until(&mut self, product: ProductId, until: DateTime<Utc>) {
        if let Some((_, numbers)) = self.0.get_mut(&product) {
            numbers.passes_until = numbers.passes_until.max(Some(until));
        }
    }
}

/// Every sale in queue mode, from the shelf.
async fn queue_sales(shop: &Shop) -> Result<Vec<QueueSale>, AppError> {
    let shelf = shop.sale_cache.shelf(&shop.pool).await?;
    Ok(shelf
        .products()
        .iter()
        .filter_map(|p| QueueSale::of(p))
        .collect())
}

/// From the opening until a while after the end: long enough for the last
/// passes and claims to be settled and the record to be complete.
fn is_live(shop: &Shop, sale: &QueueSale, now: DateTime<Utc>) -> bool {
    sale.is_open(now) && !sale.has_retired(&shop.settings, now)
}

async fn tick_all(
    shop: &Shop,
    sales: &[QueueSale],
    now: DateTime<Utc>,
    recent: &mut RecentNumbers,
) -> TickReport {
    let mut report = TickReport::default();
    recent.0.retain(|product, _| {
        sales
            .iter()
            .any(|s| s.product == *product && is_live(shop, s, now))
    });
    for sale in sales.iter().filter(|s| is_live(shop, s, now)) {
        report.queues += 1;
        // Live again (an admin moved the end): freed again when it ends.
        local(&shop.redis_prefix).retired.remove(&sale.product);
        if let Err(error) = tick_queue(shop, sale, recent, &mut report).await {
            tracing::warn!(product = %sale.product, %error, "waiting room tick failed; trying again next tick");
            report.failed += 1;
        }
    }
    let mut budget = RETIRE_PAGES_PER_TICK;
    for sale in sales.iter().filter(|s| s.has_retired(&shop.settings, now)) {
        if budget == 0 {
            break;
        }
        if local(&shop.redis_prefix).retired.contains(&sale.product) {
            continue;
        }
        match retire(shop, sale.product, recent, &mut budget, &mut report).await {
            Ok(true) => {
                local(&shop.redis_prefix).retired.insert(sale.product);
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(product = %sale.product, %error, "could not free a finished waiting room; trying again next tick");
                report.failed += 1;
            }
        }
    }
    report
}

/// Pages of the keyspace (`RETIRE_PAGE` keys looked at each) one tick
/// gives to freeing finished queues, all of them together: the keyspace
/// is the whole Redis's, and the same tick draws and admits for the live
/// sales.
const RETIRE_PAGES_PER_TICK: usize = 50;

/// Frees a finished sale's queue from Redis (a crowd's sale leaves a
/// hundred thousand keys, and a shop runs sale after sale), once one last
/// tick has settled what it could and recorded its log, a bounded part of
/// the keyspace per tick. True once it is gone; false while it may not
/// begin yet or its pages are not all freed (tried again, or gone on with,
/// next tick).
async fn retire(
    shop: &Shop,
    product: ProductId,
    recent: &mut RecentNumbers,
    budget: &mut usize,
    report: &mut TickReport,
) -> Result<bool, AppError> {
    let room = &shop.waiting_room;
    // As the shelf has it now: the live ticks before this one may have
    // taken seconds, and an admin may have moved the end meanwhile.
    let sale = &queue_sale(shop, product).await?;
    if !sale.has_retired(&shop.settings, Utc::now()) {
        return Ok(false);
    }
    if !room.exists(product).await? {
        if has_open_admissions(shop, product).await? {
            // Dropped (found behind the record) after its last live tick:
            // rebuilt from the record so that its last tick ends its
            // passes, and then freed whole, its leftover hashes among them.
            rebuild(shop, sale).await?;
            return Ok(false);
        }
        if !room.is_retiring(product).await? {
            // Never rebuilt only to be freed: Postgres has it whole. (A
            // rebuild under way holds the mark, REBUILD_BEGIN sets it: one
            // begun just before the linger passed is waited for below.)
            return Ok(true);
        }
        // Part-way (another instance's, or a process's that stopped), a
        // drop's or a rebuilder's leftover hashes, or a rebuild under way
        // (RETIRE waits for it): paged on from the mark, with no last
        // tick over a half-freed queue. A drop keeps the places waiting to
        // be forgotten, which the pages would unlink: their rows go first.
        forget_entries(shop, product).await?;
    } else {
        let last_tick = tick_present_queue(shop, sale, recent, report).await;
        recent.forget(product);
        last_tick?;
        if !room.exists(product).await? {
            // Dropped by its last tick, or freed by another instance
            // meanwhile: the next tick sees which.
            return Ok(false);
        }
    }
    match room.retire(product, budget).await? {
        Retire::Retired => {
            tracing::info!(%product, "the sale's waiting room is over; freed its queue from Redis");
            report.retired += 1;
            Ok(true)
        }
        Retire::NotYet | Retire::MadeAgain | Retire::PartWay => Ok(false),
    }
}

/// Nobody's id: the queue's counts without a customer's place.
const NOBODY: CustomerId = CustomerId(0);

async fn tick_queue(
    shop: &Shop,
    sale: &QueueSale,
    recent: &mut RecentNumbers,
    report: &mut TickReport,
) -> Result<(), AppError> {
    let product = sale.product;
    match ensure_queue(shop, sale).await? {
        Readied::Present => {}
        // A queue new in Redis has no unpaid units mirrored yet (one made
        // new by a join or another instance gets them within a second).
        Readied::Prepared => {
            report.prepared += 1;
            recent.forget(product);
        }
        Readied::Rebuilt => {
            report.rebuilt += 1;
            recent.forget(product);
        }
        Readied::Rebuilding | Readied::Retired => return Ok(()),
    }
    tick_present_queue(shop, sale, recent, report).await
}

/// The tick of a queue Redis has (steps 2 to 8).
async fn tick_present_queue(
    shop: &Shop,
    sale: &QueueSale,
    recent: &mut RecentNumbers,
    report: &mut TickReport,
) -> Result<(), AppError> {
    let product = sale.product;
    let room = &shop.waiting_room;
    if shop.gate.is_some() {
        // Passes are bounded by the gate's stock: it must be there.
        seed_if_absent(shop, vec![product]).await?;
    }
    confirm_orphans(shop, product, report).await?;
    forget_entries(shop, product).await?;
    let settled_since_rebuild = put_back_after_rebuild(shop, product, report).await?;
    let (mut numbers, fresh) = match shop.gate {
        Some(_) => recent.get(shop, product).await?,
        None => {
            // Read before the stock, so a sale settled in between is not
            // taken off twice.
            let settled_before = room.settled_units(product).await?;
            let numbers = sale_numbers(shop, product).await?;
            room.mirror_stock(product, numbers.stock, settled_before)
                .await?;
            room.mirror_unpaid(product, numbers.unpaid).await?;
            (numbers, true)
        }
    };
    // On each read from Postgres (the draw asks afresh, below).
    if fresh {
        put_back_lost_joins(shop, product, numbers.last_seq, report).await?;
    }
    let now = Utc::now();
    let ended = sale.has_ended(now);
    if sale.has_started(now)
        && !ended
        && settled_since_rebuild
        && draw(shop, sale, report).await? == Drew::Discarded
    {
        return Ok(());
    }
    for stale in room
        .lapse_due(product, shop.settings.gate_pending_ttl())
        .await?
    {
        // One claim that cannot be settled holds its own units until it
        // can, not the whole line: admissions below still run.
        match resolve_stale(shop, product, &stale).await {
            Ok(Resolved::Used) => report.settled += 1,
            Ok(Resolved::Lapsed) => report.lapsed_claims += 1,
            Err(error) => {
                tracing::error!(%product, pass = %stale.pass, %error, "a stale claim could not be settled; trying again next tick");
                report.unsettled += 1;
            }
        }
    }
    let view = room.status(product, NOBODY).await?;
    if ended {
        if view.queue != QueueState::Closed && room.set_state(product, QueueState::Closed).await? {
            report.closed += 1;
        }
    } else if view.drawn {
        let mut change = state_change(&numbers, &view);
        if change.is_some() && !fresh {
            // Told "sold out", a waiter stops waiting: decided on what
            // Postgres says now, never on a kept read.
            numbers = recent.read(shop, product).await?;
            change = state_change(&numbers, &view);
        }
        // Only from the state read above: a pause made since stands.
        if let Some((from, to)) = change {
            if room.set_state_from(product, from, to).await? {
                match to {
                    QueueState::SoldOut => report.sold_out += 1,
                    _ => report.reopened += 1,
                }
            }
        }
    }
    let bound = match shop.gate {
        Some(_) => IssueBound::Gate,
        None => IssueBound::Mirror,
    };
    let issued = if settled_since_rebuild {
        match room.issue(product, bound, numbers.admissions).await? {
            Issue::Issued(issued) => issued,
            Issue::Behind => {
                // Redis lost writes (a failover to a replica that was
                // behind): its cursor would hand the record's numbers, and
                // places, out again, and its passes trail what was used or
                // lapsed. The queue is dropped and rebuilt from the record.
                let recorded = numbers.admissions;
                let drained = drain_log(shop, product).await?;
                report.recorded += drained.recorded;
                if drained.discarded
                    || room
                        .discard_behind(product, Behind::Admissions { recorded })
                        .await?
                {
                    tracing::warn!(%product, recorded, "Redis lost admissions of this queue; rebuilding the queue from Postgres");
                    report.discarded += 1;
                }
                recent.forget(product);
                return Ok(());
            }
        }
    } else {
        Vec::new()
    };
    report.issued += issued.len();
    let drained = drain_log(shop, product).await?;
    report.recorded += drained.recorded;
    if drained.discarded {
        // The kept read's count of admissions missed what this queue
        // lost; the record's numbers did not (`drain_log`).
        report.discarded += 1;
        recent.forget(product);
        return Ok(());
    }
    let counts = room.counts(product).await?;
    let passes_until = issued.iter().map(|i| i.expires_at).max();
    if let Some(until) = passes_until {
        recent.passes_until(product, until);
    }
    let held_until = [numbers.unpaid_until, numbers.passes_until, passes_until]
        .into_iter()
        .flatten()
        .max();
    local(&shop.redis_prefix).observe(product, counts.admitted, held_until);
    Ok(())
}

/// Places older than any live join whose row is still unconfirmed: their
/// joiner died between Redis and Postgres. Redis has every column, so the
/// row is written here (the same insert a join makes) and the place confirmed.
async fn confirm_orphans(
    shop: &Shop,
    product: ProductId,
    report: &mut TickReport,
) -> Result<(), AppError> {
    let room = &shop.waiting_room;
    let orphans = room
        .unconfirmed(product, shop.settings.longest_join())
        .await?;
    if orphans.is_empty() {
        return Ok(());
    }
    let rows: Vec<_> = orphans.iter().map(|e| (product, e.clone())).collect();
    let written = db::run(&shop.pool, move |conn| {
        db::transaction(conn, |conn| insert_entries(conn, &rows))
    })
    .await?;
    for (entry, written) in orphans.iter().zip(written) {
        if written {
            // Its joiner may have taken the place back meanwhile (its
            // insert failed, ours committed): confirming puts it back.
            match room.confirm(product, entry).await? {
                Confirmed::TooLate => report.undone += 1,
                _ => report.confirmed += 1,
            }
        } else if let Some(theirs) = committed_entry(shop, product, entry.customer)
            .await?
            .filter(|theirs| theirs.ticket != entry.ticket)
        {
            // The customer's row from before Redis lost that place (its
            // joiner's confirm never got through): that place is theirs,
            // and confirming it puts it back while this one gives way.
            if room.confirm(product, &theirs).await? == Confirmed::PutBack {
                report.put_back += 1;
            }
            // Gone already if the put-back took it out; otherwise it goes now.
            room.undo_swept(product, entry.customer, &entry.ticket)
                .await?;
            report.undone += 1;
        } else {
            // Its ticket or seq is another's in Postgres: the place can never
            // be recorded, and the line must not wait at it for ever.
            room.undo_swept(product, entry.customer, &entry.ticket)
                .await?;
            report.undone += 1;
        }
    }
    Ok(())
}

/// A rebuild reads Postgres once, and a join's row may commit just after:
/// the commit's writer then puts its place back (`confirm`), unless the
/// process died.
/// So once every join that could have been in flight has ended
/// (`longest_join` after the rebuild, on Redis's clock), every row is
/// confirmed in Redis, the missing ones put back. Until then the draw and
/// admissions wait: a place put back behind someone admitted after it, or
/// a draw without it, could never match the published record. Says
/// whether they may go on.
async fn put_back_after_rebuild(
    shop: &Shop,
    product: ProductId,
    report: &mut TickReport,
) -> Result<bool, AppError> {
    let room = &shop.waiting_room;
    let mark = match room
        .reconcile_due(product, shop.settings.longest_join())
        .await?
    {
        Reconcile::Nothing => return Ok(true),
        Reconcile::Holding => return Ok(false),
        Reconcile::Due(mark) => mark,
    };
    let record = db::run(&shop.pool, move |conn| read_record(conn, product)).await?;
    let answers = room.confirm_all(product, &record.entries).await?;
    let mut refused = false;
    for (entry, answer) in record.entries.into_iter().zip(answers) {
        match answer {
            Confirmed::PutBack => report.put_back += 1,
            Confirmed::TooLate => report.undone += 1,
            // Lost again meanwhile: the next rebuild starts over.
            Confirmed::Missing => return Ok(false),
            // Redis and Postgres disagree about this customer: admitting on
            // would go ahead without a committed place, so the queue holds
            // (failing closed, loudly) until someone looks.
            Confirmed::Refused => {
                tracing::error!(%product, customer = %entry.customer, "a committed place conflicts with another place of its customer in Redis; the waiting room holds admissions");
                refused = true;
            }
            Confirmed::Confirmed => {}
        }
    }
    if refused {
        return Ok(false);
    }
    if record.drawn_at.is_some() {
        report.undone += db::run(&shop.pool, move |conn| {
            delete_places_the_draw_went_without(conn, product)
        })
        .await?;
    }
    // The rows the draw went without are gone before anyone else is admitted.
    forget_entries(shop, product).await?;
    // Nor does a sold unit stay held by a pass the rebuild reopened (the
    // rebuilder settles them too, but may have died first).
    report.settled_after_rebuild += settle_uses_a_rebuild_missed(shop, product).await?;
    // False when rebuilt again since: that rebuild holds on its own.
    room.mark_reconciled(product, mark).await
}

/// Places one check for lost joins confirms at most; the next goes on.
const CHECK_PLACES: i64 = 5_000;

/// Puts back the places the record has that Redis lost: a failover to a
/// replica that was behind can lose joins without losing an admission, and
/// then nothing conflicts; its line would admit those behind a lost place
/// in its stead (against the published order), and its draw would go
/// without a lost pre-queue place. The queue keeps a mark (`checked_seq`)
/// of how far every place of the record has been confirmed in it: a
/// replica that lost joins lost the marks made after them too, so the
/// record's places past the mark are confirmed here, which puts back each
/// one Redis lacks where the line has it (a late one among the late places
/// not yet admitted) and takes `:seq` past it, then the mark moves. Not
/// Redis's `:seq` itself: on a replica every new join draws a number, also
/// one whose row is turned away, and soon passes the lost ones. `last` is
/// the record's highest arrival number when the caller has it (nothing to
/// do at or below the mark).
async fn put_back_lost_joins(
    shop: &Shop,
    product: ProductId,
    last: Option<i64>,
    report: &mut TickReport,
) -> Result<LostJoins, AppError> {
    let room = &shop.waiting_room;
    let Some(checked) = room.checked_seq(product).await? else {
        return Ok(LostJoins::Moved);
    };
    if last.is_some_and(|last| last <= checked.seq) {
        return Ok(LostJoins::Through);
    }
    let from = checked.seq;
    let places = db::run(&shop.pool, move |conn| {
        places_after(conn, product, from, CHECK_PLACES)
    })
    .await?;
    if places.is_empty() {
        return Ok(LostJoins::Through);
    }
    let full = places.len() as i64 == CHECK_PLACES;
    let Some(answers) = room.confirm_checked(product, &checked, &places).await? else {
        // A failover (or a rebuild) since the mark was read: that queue's
        // own mark is where its next check starts.
        return Ok(LostJoins::Moved);
    };
    let mut put_back = 0;
    for (place, answer) in places.iter().zip(&answers) {
        match answer {
            Confirmed::PutBack => put_back += 1,
            Confirmed::TooLate => report.undone += 1,
            Confirmed::Refused => {
                // The mark stops short of it: tried (and logged) again.
                tracing::error!(%product, customer = %place.customer, "a committed place conflicts with another place of its customer in Redis");
            }
            Confirmed::Confirmed | Confirmed::Missing => {}
        }
    }
    if put_back > 0 {
        tracing::warn!(%product, put_back, checked_from = from, "Redis lost joins the record has; put their places back");
    }
    report.put_back += put_back;
    Ok(if put_back > 0 || full {
        LostJoins::NotYet
    } else {
        LostJoins::Through
    })
}

/// What a check for lost joins found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LostJoins {
    /// Every place of the record is in the queue.
    Through,
    /// Places were put back, or more are past this check's window: a draw
    /// waits for the next tick.
    NotYet,
    /// The queue is not the one the mark was read from.
    Moved,
}

/// Deletes the pre-queue rows a revealed draw went without (not `drawn`).
/// Their joiners were told to join again, and undo the row, or the tick
/// forgets it by Redis's note; a rebuild lost that note, and a row left
/// behind would turn its customer's next join away. Only a revealed draw's:
/// before the reveal, every pre-queue row is a place.
fn delete_places_the_draw_went_without(
    conn: &mut db::PgConn,
    product: ProductId,
) -> Result<usize, AppError> {
    let revealed = queue_draws::table
        .find(product.get())
        .filter(queue_draws::drawn_at.is_not_null());
    Ok(diesel::delete(
        queue_entries::table
            .filter(queue_entries::product_id.eq(product.get()))
            .filter(diesel::dsl::not(queue_entries::late))
            .filter(diesel::dsl::not(queue_entries::drawn))
            .filter(diesel::dsl::exists(revealed)),
    )
    .execute(conn)?)
}

/// The state a drawn, unended queue moves to by these numbers, from the
/// state it is in: sold out when nothing is left and nothing could come
/// back but a refund or an adjustment (which reopen it).
fn state_change(numbers: &SaleNumbers, view: &QueueView) -> Option<(QueueState, QueueState)> {
    let nothing_left = numbers.stock <= 0 && view.outstanding <= 0 && numbers.unpaid <= 0;
    match view.queue {
        QueueState::Open if nothing_left => Some((QueueState::Open, QueueState::SoldOut)),
        QueueState::SoldOut if numbers.stock > 0 => Some((QueueState::SoldOut, QueueState::Open)),
        _ => None,
    }
}

/// What the draw step did with the queue.
#[derive(Debug, PartialEq, Eq)]
enum Drew {
    /// Drawn (now or before), or not yet drawable.
    Kept,
    /// Dropped from Redis, which had lost its draw: rebuilt next tick.
    Discarded,
}

/// At the start: the pre-queue in the seed's order, then the seed revealed.
async fn draw(shop: &Shop, sale: &QueueSale, report: &mut TickReport) -> Result<Drew, AppError> {
    let product = sale.product;
    let room = &shop.waiting_room;
    if local(&shop.redis_prefix).revealed.contains(&product) {
        // Seen drawn here; Redis may have lost it since (below).
        if room.status(product, NOBODY).await?.drawn {
            return Ok(Drew::Kept);
        }
        local(&shop.redis_prefix).revealed.remove(&product);
    }
    let pre = room.pre_queue(product).await?;
    if pre.busy {
        // Another instance is drawing: reading the record and shuffling
        // here would only end in `Busy`.
        return Ok(Drew::Kept);
    }
    let drawn = if pre.drawn {
        pre
    } else {
        let (seed, revealed) = read_draw(shop, product).await?;
        if revealed {
            // Redis lost writes (a failover to a replica that was behind):
            // its line and passes trail the record, and drawing again would
            // hand out passes the record has as used or lapsed. The queue
            // is dropped and rebuilt from the record instead.
            let drained = drain_log(shop, product).await?;
            report.recorded += drained.recorded;
            let dropped =
                drained.discarded || room.discard_behind(product, Behind::Undrawn).await?;
            if !dropped {
                return Ok(Drew::Kept);
            }
            tracing::warn!(%product, "Redis lost this queue's draw; rebuilding the queue from Postgres");
            report.discarded += 1;
            return Ok(Drew::Discarded);
        }
        // A pre-queue place Redis lost would be drawn out: the record is
        // asked afresh right before the draw, which waits for the next
        // tick if one was put back, more are past this check, or the
        // queue moved.
        if put_back_lost_joins(shop, product, None, report).await? != LostJoins::Through {
            return Ok(Drew::Kept);
        }
        // DRAW itself refuses while a pre-queue place is unconfirmed (or the
        // set moved): then the next tick reads it again. Late arrivals still
        // confirming do not hold the draw up.
        let order = shuffle(&seed, &pre.tickets);
        match room.draw(product, &order).await? {
            Drawn::Done => report.drawn += 1,
            Drawn::Already => {}
            Drawn::Changed | Drawn::Missing | Drawn::Busy => return Ok(Drew::Kept),
        }
        // The places drawn, read after the draw: `Already` means another
        // instance drew, perhaps a pre-queue this read had not seen yet.
        // Once drawn, `:pre` no longer changes (a place confirmed later is
        // TooLate).
        let drawn = room.pre_queue(product).await?;
        if !drawn.drawn {
            return Ok(Drew::Kept);
        }
        drawn
    };
    reveal(shop, product, &drawn.tickets).await?;
    local(&shop.redis_prefix).revealed.insert(product);
    Ok(Drew::Kept)
}

/// The draw's seed, and whether it has been revealed.
async fn read_draw(shop: &Shop, product: ProductId) -> Result<(DrawSeed, bool), AppError> {
    let (bytes, drawn_at): (Vec<u8>, Option<DateTime<Utc>>) = db::run(&shop.pool, move |conn| {
        Ok(queue_draws::table
            .find(product.get())
            .select((queue_draws::seed, queue_draws::drawn_at))
            .first(conn)?)
    })
    .await?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| AppError::Internal(anyhow::anyhow!("a draw seed is not 32 bytes")))?;
    Ok((DrawSeed::from_bytes(bytes), drawn_at.is_some()))
}

/// The draw is done: from now on the seed is served, and the places it
/// took (`drawn`, the tickets of Redis's pre-queue, which nothing joins
/// once drawn) are marked in the same transaction, so a rebuild or the
/// published record never puts a place that committed too late into the
/// drawn line.
async fn reveal(shop: &Shop, product: ProductId, drawn: &[Ticket]) -> Result<(), AppError> {
    let tickets: Vec<String> = drawn.iter().map(|t| t.as_str().to_string()).collect();
    db::run(&shop.pool, move |conn| {
        db::transaction(conn, |conn| {
            let revealed = diesel::update(
                queue_draws::table
                    .find(product.get())
                    .filter(queue_draws::drawn_at.is_null()),
            )
            .set(queue_draws::drawn_at.eq(Utc::now()))
            .execute(conn)?;
            if revealed == 0 {
                return Ok(());
            }
            let marked = diesel::update(
                queue_entries::table
                    .filter(queue_entries::product_id.eq(product.get()))
                    .filter(queue_entries::ticket.eq_any(&tickets))
                    .filter(diesel::dsl::not(queue_entries::late)),
            )
            .set(queue_entries::drawn.eq(true))
            .execute(conn)?;
            if marked != tickets.len() {
                // DRAW takes only confirmed places, each confirmed after its
                // row committed: the record is broken, and `verify` will say
                // so. Holding the reveal back would not mend it.
                tracing::error!(%product, drawn = tickets.len(), marked, "the draw took places Postgres has no pre-queue row for");
            }
            Ok(())
        })
    })
    .await
}

/// What Postgres says about a sale's units, in one read.
#[derive(Debug, Clone, QueryableByName)]
struct SaleNumbers {
    #[diesel(sql_type = BigInt)]
    stock: i64,
    /// Units in orders awaiting payment.
    #[diesel(sql_type = BigInt)]
    unpaid: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    unpaid_until: Option<DateTime<Utc>>,
    /// The latest deadline of an open pass.
    #[diesel(sql_type = Nullable<Timestamptz>)]
    passes_until: Option<DateTime<Utc>>,
    /// The highest admission number recorded: Redis, which numbers them
    /// (`:meta` `admissions`), never has a lower last one unless it lost
    /// writes. The highest, not how many: a record with a gap in its
    /// numbers (a failover's conflict) holds fewer than its last number.
    #[diesel(sql_type = BigInt)]
    admissions: i64,
    /// The highest arrival number among the record's places: Redis, which
    /// numbers them, never has a lower last one unless it lost joins.
    #[diesel(sql_type = Nullable<BigInt>)]
    last_seq: Option<i64>,
}

async fn sale_numbers(shop: &Shop, product: ProductId) -> Result<SaleNumbers, AppError> {
    db::run(&shop.pool, move |conn| {
        Ok(diesel::sql_query(
            "SELECT p.stock::bigint AS stock,
                    COALESCE(unpaid.units, 0)::bigint AS unpaid,
                    unpaid.until AS unpaid_until,
                    (SELECT max(a.expires_at) FROM queue_admissions a
                      WHERE a.product_id = p.id AND a.state = 'issued') AS passes_until,
                    -- The top of the primary key (product_id, number).
                    (SELECT COALESCE(max(a.number), 0) FROM queue_admissions a
                      WHERE a.product_id = p.id)::bigint AS admissions,
                    -- The places of the record (`entries_in_record`); the
                    -- (product_id, seq) index reads it from the top.
                    (SELECT max(e.seq) FROM queue_entries e
                      WHERE e.product_id = p.id
                        AND (e.late OR e.drawn OR NOT EXISTS (
                             SELECT 1 FROM queue_draws d
                              WHERE d.product_id = p.id AND d.drawn_at IS NOT NULL))) AS last_seq
             FROM products p
             LEFT JOIN LATERAL (
                 SELECT sum(i.quantity) AS units, max(o.payment_deadline) AS until
                 -- This sale's items first, by their product index, then
                 -- their orders by key: a waiting room's sale has at most
                 -- its stock's worth. OFFSET 0 keeps the planner from
                 -- starting at every awaiting order of the shop instead,
                 -- which statistics lagging a sale's burst of orders make
                 -- look cheap (a benchmark's hot sale made this read eat a
                 -- core, four times a second).
                 FROM (SELECT order_id, quantity FROM order_items
                        WHERE product_id = p.id OFFSET 0) i
                 JOIN orders o ON o.id = i.order_id
                 WHERE o.status = 'awaiting_payment'
             ) unpaid ON true
             WHERE p.id = $1",
        )
        .bind::<BigInt, _>(product.get())
        .get_result(conn)?)
    })
    .await
}

/// Runs the tick every `QUEUE_TICK_MS` until the task is aborted.
///
/// An idle shop must cost Postgres nothing, so the sales are not read every
/// tick: only while some waiting room is live (the tick reads Postgres
/// then anyway), after this process edited a sale, and otherwise every
/// `JOBS_INTERVAL`. A sale another instance switched to queue mode is seen
/// within that; joining it works at once regardless (a join prepares its
/// queue), and the draw waits for the tick.
pub async fn run_forever(shop: Shop) {
    let mut ticker = tokio::time::interval(shop.settings.queue_tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut known: Vec<QueueSale> = Vec::new();
    let mut read_at: Option<tokio::time::Instant> = None;
    let mut writes_seen = crate::services::sale_cache::writes();
    let mut recent = RecentNumbers::default();
    loop {
        ticker.tick().await;
        let now = Utc::now();
        let writes = crate::services::sale_cache::writes();
        if writes != writes_seen {
            // A stock adjustment made here counts from this tick on; a
            // refund (which can reopen a sold-out queue) within a second.
            recent = RecentNumbers::default();
        }
        let due = read_at.is_none_or(|at| at.elapsed() >= shop.settings.jobs_interval)
            || writes != writes_seen
            || known.iter().any(|s| is_live(&shop, s, now));
        if due {
            match queue_sales(&shop).await {
                Ok(sales) => {
                    known = sales;
                    read_at = Some(tokio::time::Instant::now());
                    writes_seen = writes;
                }
                Err(error) => {
                    tracing::debug!(%error, "could not read the sales for the waiting room tick");
                    continue;
                }
            }
        }
        let report = tick_all(&shop, &known, now, &mut recent).await;
        if report.failed > 0 {
            tracing::debug!(?report, "waiting room tick had failures");
        }
    }
}
