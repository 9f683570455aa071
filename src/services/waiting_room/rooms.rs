//! This process's cache of the waiting rooms: what every poll reads, so a
//! crowd refreshing its waiting pages costs Postgres one read per room
//! every `FRESH_FOR`, not one per poll.
//!
//! Nothing here is a truth: a snapshot is one read-only transaction's view
//! of a room and can be dropped at any time (a miss reads Postgres again).
//! Customers' places and ended passes are kept beside it (`places`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Bytea, Int4, Nullable, Text, Timestamptz};

use crate::db::{self, PgConn};
use crate::domain::draw::{EntriesCommitment, SeedCommitment, Ticket};
use crate::domain::{CustomerId, ProductId};
use crate::domain::{PassRow, Place};
use crate::error::{AppError, Missing};
use crate::services::Shop;

/// How old a room's snapshot may be when a poll reads it.
pub const FRESH_FOR: Duration = Duration::from_millis(250);

/// How old a pre-queue's snapshot may be while its start is far.
const PRE_QUEUE_FRESH_FOR: Duration = Duration::from_secs(1);

/// Places kept per process before the cache starts again (a guard on
/// memory, not a limit on customers).
const MAX_PLACES: usize = 1_000_000;

/// One room as one read-only transaction saw it.
#[derive(Debug, Clone)]
pub struct RoomSnapshot {
    pub read_at: Instant,
    /// The database's clock when it was read: every time a room decides
    /// by is the database's, never an instance's.
    pub db_now: DateTime<Utc>,
    /// Whether the room is open (its seed is committed to).
    pub opened: bool,
    pub commitment: Option<SeedCommitment>,
    /// The frozen pre-queue's SHA-256, from the start on.
    pub entries_commitment: Option<EntriesCommitment>,
    pub frozen: bool,
    pub drawn: bool,
    pub starts_at: DateTime<Utc>,
    pub paused: bool,
    pub ended: bool,
    /// The last position handed out: the line's length.
    pub last_position: i64,
    /// Passes issued so far; pass n went to position n.
    pub admitted: i64,
    pub stock: i64,
    /// Open passes by customer.
    pub open_passes: HashMap<CustomerId, OpenPassView>,
    /// Units the open passes cover.
    pub open_units: i64,
    /// Units in this sale's orders still awaiting payment, and their last deadline.
    pub unpaid_units: i64,
    pub unpaid_until: Option<DateTime<Utc>>,
    /// When held units can come back if nobody buys or pays for them (each
    /// open pass at its deadline plus its grace, each unpaid order at its
    /// payment deadline), earliest first, each with the units released by
    /// then in all. Built once per read: every poll of the room asks when
    /// enough units come back, and answers it by a binary search here
    /// rather than gathering and sorting every pass and order again.
    releases: Vec<(DateTime<Utc>, i64)>,
    /// When the last open pass lapses, its grace included: a purchase the
    /// grace lets in starts an order then, with the whole time to pay.
    last_pass_end: Option<DateTime<Utc>>,
    /// Passes issued within the last 5 minutes (the admission rate).
    pub recent_admissions: i64,
    /// How long admission has been running, up to 5 minutes: a rate
    /// measured over the draw's first seconds would promise far too much.
    pub admitting_for: Duration,
}

fn grace() -> chrono::Duration {
    chrono::Duration::from_std(crate::domain::PASS_GRACE).unwrap_or_default()
}

/// The shortest span a rate is measured over: the passes issued at the
/// draw all at once are not a rate.
const SHORTEST_RATE_SPAN: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenPassView {
    pub number: i32,
    pub ticket: Ticket,
    pub units: i32,
    pub expires_at: DateTime<Utc>,
}

impl RoomSnapshot {
    /// How long this snapshot answers polls: `FRESH_FOR`, or a second for a
    /// pre-queue whose start is more than two seconds away (nothing a
    /// waiter sees changes there but the count of units, and a crowd
    /// polling the last minutes before a drop is the largest).
    fn fresh_for(&self) -> Duration {
        let quiet = !self.frozen && self.starts_at - self.db_now > chrono::Duration::seconds(2);
        if quiet {
            PRE_QUEUE_FRESH_FOR
        } else {
            FRESH_FOR
        }
    }

    /// Units nobody holds a pass for.
    pub fn units_free(&self) -> i64 {
        (self.stock - self.open_units).max(0)
    }

    /// Every unit is sold and none can come back but by a refund: no stock, no open pass,
    /// no unpaid order that could expire or be declined.
    pub fn sold_out(&self) -> bool {
        self.drawn && self.stock <= 0 && self.open_units == 0 && self.unpaid_units == 0
    }

    /// Admissions per second over the last 5 minutes (or since the draw,
    /// counted as at least a minute), if any.
    pub fn admission_rate(&self) -> Option<f64> {
        let span = self.admitting_for.max(SHORTEST_RATE_SPAN).as_secs_f64();
        (self.recent_admissions > 0).then(|| self.recent_admissions as f64 / span)
    }

    /// The earliest a held unit can come back, if its holder does not buy or pay.
    pub fn next_release(&self) -> Option<DateTime<Utc>> {
        self.releases.first().map(|(at, _)| *at)
    }

    /// The earliest moment by which `units` held units can have come back
    /// (None: fewer are held).
    pub fn released_by(&self, units: i64) -> Option<DateTime<Utc>> {
        let first = self.releases.partition_point(|(_, total)| *total < units);
        self.releases.get(first).map(|(at, _)| *at)
    }

    /// The latest a held unit can come back: a pass used in its grace's last
    /// second starts an order with the whole `time_to_pay`.
    pub fn held_until(&self, time_to_pay: chrono::Duration) -> Option<DateTime<Utc>> {
        self.last_pass_end
            .map(|end| end + time_to_pay)
            .into_iter()
            .chain(self.unpaid_until)
            .max()
    }
}

/// `releases`: each pass and order's release time and units, in any order;
/// sorted, with running totals.
fn running_totals(mut releases: Vec<(DateTime<Utc>, i64)>) -> Vec<(DateTime<Utc>, i64)> {
    releases.sort_unstable();
    let mut total = 0;
    for (_, units) in &mut releases {
        total += *units;
        *units = total;
    }
    releases
}

/// Every room this process has read, and the places and ended passes it
/// knows of. One per `Shop`.
#[derive(Default)]
pub struct Rooms {
    snapshots: Mutex<HashMap<ProductId, Arc<RoomSnapshot>>>,
    /// One snapshot read at a time per room and process: polls arriving
    /// while one is read wait for it rather than read again.
    reading: Turns,
    /// A room whose last read failed, and why: polls within `FRESH_FOR`
    /// are answered with that failure at once (Postgres down must be a
    /// quick 503 for everyone, not one connect timeout per waiter in turn).
    failed: Mutex<HashMap<ProductId, (Instant, String)>>,
    /// One draw at a time per room and process: joiners arriving at the
    /// start all ask for it, and the first does it.
    pub(super) drawing: Turns,
    pub(super) places: Mutex<HashMap<(ProductId, CustomerId), Place>>,
    pub(super) ended_passes: Mutex<HashMap<(ProductId, CustomerId), PassRow>>,
    /// Drawn rooms whose whole line this process has read (`places`).
    pub(super) lines_read: tokio::sync::Mutex<std::collections::HashSet<ProductId>>,
}

pub(super) fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A turn per room: one caller at a time does the room's work, the others
/// wait for it and usually find it done.
#[derive(Default)]
pub(super) struct Turns(Mutex<HashMap<ProductId, Arc<tokio::sync::Mutex<()>>>>);

impl Turns {
    pub(super) fn of(&self, product: ProductId) -> Arc<tokio::sync::Mutex<()>> {
        locked(&self.0).entry(product).or_default().clone()
    }
}

impl Rooms {
    pub fn new() -> Rooms {
        Rooms::default()
    }

    fn recent_failure(&self, product: ProductId) -> Option<String> {
        locked(&self.failed)
            .get(&product)
            .filter(|(at, _)| at.elapsed() < FRESH_FOR)
            .map(|(_, why)| why.clone())
    }

    fn fresh(&self, product: ProductId) -> Option<Arc<RoomSnapshot>> {
        locked(&self.snapshots)
            .get(&product)
            .filter(|s| s.read_at.elapsed() < s.fresh_for())
            .cloned()
    }

    /// Drops what this process knows of `product`'s room, so the next read
    /// is Postgres's (after this process changed it).
    pub fn forget(&self, product: ProductId) {
        locked(&self.snapshots).remove(&product);
    }

    pub(super) fn remember_place(&self, product: ProductId, customer: CustomerId, place: &Place) {
        let mut places = locked(&self.places);
        if places.len() >= MAX_PLACES {
            places.clear();
        }
        places.insert((product, customer), place.clone());
    }
}

/// `product`'s room, at most `FRESH_FOR` old.
pub async fn snapshot(shop: &Shop, product: ProductId) -> Result<Arc<RoomSnapshot>, AppError> {
    let rooms = &shop.waiting_room;
    if let Some(fresh) = rooms.fresh(product) {
        return Ok(fresh);
    }
    let turn = rooms.reading.of(product);
    let _turn = turn.lock().await;
    if let Some(fresh) = rooms.fresh(product) {
        return Ok(fresh);
    }
    if let Some(why) = rooms.recent_failure(product) {
        return Err(AppError::Unavailable(why));
    }
    match db::run(&shop.pool, move |conn| read_room(conn, product)).await {
        Ok(read) => {
            let read = Arc::new(read);
            locked(&rooms.failed).remove(&product);
            locked(&rooms.snapshots).insert(product, read.clone());
            Ok(read)
        }
        Err(error) => {
            // A failed read is remembered so that a crowd polling a room
            // while Postgres is down costs one read per product, not one per
            // poll; a product that does not exist is no failure, and is
            // answered 404 every time.
            if !matches!(error, AppError::NotFound(_)) {
                locked(&rooms.failed).insert(product, (Instant::now(), error.to_string()));
            }
            Err(error)
        }
    }
}

const READ_ROOM: &str = "
SELECT p.stock::bigint AS stock,
    d.product_id IS NOT NULL AS opened,
    d.seed_sha256,
    d.entries_sha256,
    d.frozen_at IS NOT NULL AS frozen,
    d.drawn_at IS NOT NULL AS drawn,
    coalesce(d.admission_paused, false) AS paused,
    coalesce(p.sale_ends_at <= clock_timestamp(), false) AS ended,
    p.sale_starts_at AS starts_at,
    coalesce(d.last_position, 0)::bigint AS last_position,
    (SELECT coalesce(max(a.number), 0)::bigint FROM queue_admissions a WHERE a.product_id = p.id) AS admitted,
    (SELECT count(*) FROM queue_admissions a
        WHERE a.product_id = p.id AND a.issued_at > clock_timestamp() - interval '300 seconds') AS recent_admissions,
    coalesce(extract(epoch FROM least(clock_timestamp() - d.drawn_at, interval '300 seconds')), 0)::float8 AS admitting_for_secs,
    unpaid.units AS unpaid_units,
    unpaid.until AS unpaid_until,
    clock_timestamp() AS db_now
FROM products p
LEFT JOIN queue_draws d ON d.product_id = p.id
CROSS JOIN LATERAL (
    SELECT coalesce(sum(i.quantity), 0)::bigint AS units, max(o.payment_deadline) AS until
    FROM orders o JOIN order_items i ON i.order_id = o.id AND i.product_id = p.id
    WHERE o.status = 'awaiting_payment'
) unpaid
WHERE p.id = $1";

#[derive(QueryableByName)]
struct RoomRow {
    #[diesel(sql_type = BigInt)]
    stock: i64,
    #[diesel(sql_type = Bool)]
    opened: bool,
    #[diesel(sql_type = Nullable<Bytea>)]
    seed_sha256: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Bytea>)]
    entries_sha256: Option<Vec<u8>>,
    #[diesel(sql_type = Bool)]
    frozen: bool,
    #[diesel(sql_type = Bool)]
    drawn: bool,
    #[diesel(sql_type = Bool)]
    paused: bool,
    #[diesel(sql_type = Bool)]
    ended: bool,
    #[diesel(sql_type = Timestamptz)]
    starts_at: DateTime<Utc>,
    #[diesel(sql_type = BigInt)]
    last_position: i64,
    #[diesel(sql_type = BigInt)]
    admitted: i64,
    #[diesel(sql_type = BigInt)]
    recent_admissions: i64,
    #[diesel(sql_type = diesel::sql_types::Double)]
    admitting_for_secs: f64,
    #[diesel(sql_type = BigInt)]
    unpaid_units: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    unpaid_until: Option<DateTime<Utc>>,
    #[diesel(sql_type = Timestamptz)]
    db_now: DateTime<Utc>,
}

#[derive(QueryableByName)]
struct UnpaidOrderRow {
    #[diesel(sql_type = Timestamptz)]
    deadline: DateTime<Utc>,
    #[diesel(sql_type = BigInt)]
    units: i64,
}

#[derive(QueryableByName)]
struct OpenPassRow {
    #[diesel(sql_type = BigInt)]
    customer_id: i64,
    #[diesel(sql_type = Int4)]
    number: i32,
    #[diesel(sql_type = Text)]
    ticket: String,
    #[diesel(sql_type = Int4)]
    units: i32,
    #[diesel(sql_type = Timestamptz)]
    expires_at: DateTime<Utc>,
}

/// The room in one read-only snapshot, so its counts and its open passes
/// belong to the same moment.
fn read_room(conn: &mut PgConn, product: ProductId) -> Result<RoomSnapshot, AppError> {
    conn.build_transaction()
        .repeatable_read()
        .read_only()
        .run(|conn| {
            let row: RoomRow = diesel::sql_query(READ_ROOM)
                .bind::<BigInt, _>(product.get())
                .get_result(conn)
                .optional()?
                .ok_or_else(|| AppError::NotFound(Missing::Product(product)))?;
            let passes: Vec<OpenPassRow> = diesel::sql_query(
                "SELECT customer_id, number, ticket, units, expires_at FROM queue_admissions
                 WHERE product_id = $1 AND state = 'issued'",
            )
            .bind::<BigInt, _>(product.get())
            .load(conn)?;
            let unpaid: Vec<UnpaidOrderRow> = diesel::sql_query(
                "SELECT o.payment_deadline AS deadline, sum(i.quantity)::bigint AS units
                 FROM orders o JOIN order_items i ON i.order_id = o.id AND i.product_id = $1
                 WHERE o.status = 'awaiting_payment'
                 GROUP BY o.id",
            )
            .bind::<BigInt, _>(product.get())
            .load(conn)?;
            let mut open_units = 0;
            let mut open_passes = HashMap::with_capacity(passes.len());
            let mut releases: Vec<(DateTime<Utc>, i64)> =
                unpaid.iter().map(|o| (o.deadline, o.units)).collect();
            let mut last_pass_end = None;
            for pass in passes {
                open_units += i64::from(pass.units);
                let end = pass.expires_at + grace();
                releases.push((end, i64::from(pass.units)));
                last_pass_end = last_pass_end.max(Some(end));
                open_passes.insert(
                    CustomerId(pass.customer_id),
                    OpenPassView {
                        number: pass.number,
                        ticket: corrupt_if_bad(Ticket::parse(&pass.ticket), product)?,
                        units: pass.units,
                        expires_at: pass.expires_at,
                    },
                );
            }
            let commitment = match row.seed_sha256 {
                Some(bytes) => Some(corrupt_if_bad(
                    SeedCommitment::parse_hex(&hex::encode(bytes)),
                    product,
                )?),
                None => None,
            };
            let entries_commitment = match row.entries_sha256 {
                Some(bytes) => Some(corrupt_if_bad(
                    EntriesCommitment::parse_hex(&hex::encode(bytes)),
                    product,
                )?),
                None => None,
            };
            Ok(RoomSnapshot {
                read_at: Instant::now(),
                db_now: row.db_now,
                opened: row.opened,
                commitment,
                entries_commitment,
                frozen: row.frozen,
                drawn: row.drawn,
                starts_at: row.starts_at,
                paused: row.paused,
                ended: row.ended,
                last_position: row.last_position,
                admitted: row.admitted,
                stock: row.stock,
                open_passes,
                open_units,
                unpaid_units: row.unpaid_units,
                unpaid_until: row.unpaid_until,
                releases: running_totals(releases),
                last_pass_end,
                recent_admissions: row.recent_admissions,
                admitting_for: Duration::from_secs_f64(row.admitting_for_secs.max(0.0)),
            })
        })
}

pub(super) fn corrupt_if_bad<T, E: std::fmt::Display>(
    parsed: Result<T, E>,
    product: ProductId,
) -> Result<T, AppError> {
    parsed.map_err(|e| AppError::Internal(anyhow::anyhow!("waiting room of {product}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_900_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn releases_are_found_by_the_units_they_bring_back() {
        let releases = running_totals(vec![(at(30), 2), (at(10), 1), (at(20), 3)]);
        assert_eq!(releases, vec![(at(10), 1), (at(20), 4), (at(30), 6)]);
        let room = |releases| RoomSnapshot {
            read_at: Instant::now(),
            db_now: at(0),
            opened: true,
            commitment: None,
            entries_commitment: None,
            frozen: true,
            drawn: true,
            starts_at: at(0),
            paused: false,
            ended: false,
            last_position: 0,
            admitted: 0,
            stock: 0,
            open_passes: HashMap::new(),
            open_units: 0,
            unpaid_units: 0,
            unpaid_until: Some(at(700)),
            releases,
            last_pass_end: Some(at(65)),
            recent_admissions: 0,
            admitting_for: Duration::ZERO,
        };
        let room = room(releases);
        assert_eq!(room.next_release(), Some(at(10)));
        assert_eq!(room.released_by(1), Some(at(10)));
        assert_eq!(room.released_by(2), Some(at(20)));
        assert_eq!(room.released_by(4), Some(at(20)));
        assert_eq!(room.released_by(6), Some(at(30)));
        assert_eq!(room.released_by(7), None);
        // The last pass ends at 65 s (its grace included): used then, its
        // order may go unpaid for the whole time to pay, unless an unpaid
        // order's deadline is later still.
        assert_eq!(
            room.held_until(chrono::Duration::seconds(600)),
            Some(at(700))
        );
        assert_eq!(
            room.held_until(chrono::Duration::seconds(660)),
            Some(at(725))
        );
    }
}
