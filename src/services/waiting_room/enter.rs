//! A join's transaction: each room of the batch decided by the database's
//! clock. Before the start a place goes to the pre-queue under the room's
//! lock held shared (the freeze at the start waits for it); once frozen, a
//! late place gets the next position under the room's row lock. A
//! customer's join passes the door in the same transaction (only once the
//! room can take them), so what the door spends commits with the place.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Int4, Nullable, Text, Timestamptz};

use super::places::{place_from_row, read_places, PlaceRow};
use super::ROOM_LOCK;
use crate::db::prepared::Prepared;
use crate::db::PgConn;
use crate::domain::draw::Ticket;
use crate::domain::Place;
use crate::domain::{CustomerId, ProductId};
use crate::error::{AppError, DoorRefusal, Missing};
use crate::services::catalog::queue_opening;
use crate::services::door::{Doorkeeper, Visit};

/// What a join's transaction found for one joiner.
#[derive(Debug, Clone)]
pub(super) enum Entered {
    Place(Place),
    /// The start has passed and the pre-queue is not frozen yet.
    DrawDue,
    /// The room has no seed committed yet.
    NoRoom,
    NotOpen(DateTime<Utc>),
    Ended,
    NotQueueMode,
    /// Turned away at the door; nothing of theirs was written.
    DoorRefused(DoorRefusal),
}

/// One join waiting for the writer.
#[derive(Debug, Clone)]
pub(super) struct Joiner {
    pub(super) product: ProductId,
    pub(super) customer: CustomerId,
    /// What the customer brings to the door; None for the shop's own joins.
    pub(super) visit: Option<Visit>,
}

#[derive(QueryableByName)]
struct RoomNow {
    #[diesel(sql_type = Bool)]
    queue_mode: bool,
    #[diesel(sql_type = Bool)]
    opened: bool,
    #[diesel(sql_type = Bool)]
    frozen: bool,
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    starts_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    opens_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    ends_at: Option<DateTime<Utc>>,
}

/// Every joiner's place, room by room in id order, in one transaction.
pub(super) fn enter_all(
    conn: &mut PgConn,
    joiners: &[Joiner],
    doorkeeper: &Doorkeeper,
) -> Result<HashMap<(ProductId, CustomerId), Entered>, AppError> {
    let mut by_room: Vec<ProductId> = joiners.iter().map(|j| j.product).collect();
    by_room.sort_unstable();
    by_room.dedup();
    let mut entered = HashMap::with_capacity(joiners.len());
    for product in by_room {
        // A customer twice in one batch (a second click) is one joiner.
        let mut seen = HashSet::new();
        let room_joiners: Vec<(CustomerId, Option<&Visit>)> = joiners
            .iter()
            .filter(|j| j.product == product && seen.insert(j.customer))
            .map(|j| (j.customer, j.visit.as_ref()))
            .collect();
        let outcome = enter_room(conn, product, &room_joiners, doorkeeper)?;
        for (customer, _) in room_joiners {
            let answer = match &outcome {
                Err(refused) => refused.clone(),
                Ok(seated) => match seated.get(&customer) {
                    Some(Ok(place)) => Entered::Place(place.clone()),
                    Some(Err(refusal)) => Entered::DoorRefused(*refusal),
                    None => {
                        return Err(AppError::Internal(anyhow::anyhow!(
                            "a joiner's place was not written"
                        )))
                    }
                },
            };
            entered.insert((product, customer), answer);
        }
    }
    Ok(entered)
}

/// Each joiner's place in one room (or why the door refused them), or why
/// none can be had now.
type Seated = HashMap<CustomerId, Result<Place, DoorRefusal>>;

fn enter_room(
    conn: &mut PgConn,
    product: ProductId,
    joiners: &[(CustomerId, Option<&Visit>)],
    doorkeeper: &Doorkeeper,
) -> Result<Result<Seated, Entered>, AppError> {
    Prepared::new("SELECT pg_advisory_xact_lock_shared($1, ($2 % 2147483647)::int)")
        .bind::<Int4, _>(ROOM_LOCK)
        .bind::<BigInt, _>(product.get())
        .execute(conn)?;
    let room: Option<RoomNow> = Prepared::new(
        "SELECT p.queue_mode, d.product_id IS NOT NULL AS opened,
                coalesce(d.frozen_at IS NOT NULL, false) AS frozen, clock_timestamp() AS now,
                p.sale_starts_at AS starts_at, p.queue_opens_at AS opens_at, p.sale_ends_at AS ends_at
         FROM products p LEFT JOIN queue_draws d ON d.product_id = p.id WHERE p.id = $1",
    )
    .bind::<BigInt, _>(product.get())
    .get_result(conn)
    .optional()?;
    let Some(room) = room else {
        return Err(AppError::NotFound(Missing::Product(product)));
    };
    let opens_at = queue_opening(room.starts_at, room.opens_at);
    if !room.queue_mode {
        return Ok(Err(Entered::NotQueueMode));
    }
    if room.now < opens_at {
        return Ok(Err(Entered::NotOpen(opens_at)));
    }
    if room.ends_at.is_some_and(|end| room.now >= end) {
        return Ok(Err(Entered::Ended));
    }
    if !room.opened {
        return Ok(Err(Entered::NoRoom));
    }
    if !room.frozen && room.now >= room.starts_at {
        return Ok(Err(Entered::DrawDue));
    }
    // The room takes them: now the door. Joining again keeps the place
    // already held, with nothing to pay for it.
    let customers: Vec<CustomerId> = joiners.iter().map(|(c, _)| *c).collect();
    let visitors: Vec<(CustomerId, &Visit)> = joiners
        .iter()
        .filter_map(|(customer, visit)| visit.map(|visit| (*customer, visit)))
        .collect();
    let refused = if visitors.is_empty() {
        HashMap::new()
    } else {
        let placed: HashSet<CustomerId> = read_places(conn, product, &customers)?
            .into_iter()
            .map(|(c, _)| c)
            .collect();
        let newcomers: Vec<(CustomerId, &Visit)> = visitors
            .into_iter()
            .filter(|(customer, _)| !placed.contains(customer))
            .collect();
        doorkeeper.let_join(conn, product, &newcomers)?
    };
    let admitted: Vec<CustomerId> = customers
        .into_iter()
        .filter(|c| !refused.contains_key(c))
        .collect();
    // A new place comes back from its insert; only the customers who had
    // one already (or joined late) need their row read.
    let mut places = Vec::new();
    if !admitted.is_empty() {
        if room.frozen {
            enter_late(conn, product, &admitted)?;
        } else {
            places = enter_pre_queue(conn, product, &admitted, room.now)?;
        }
    }
    let inserted: HashSet<CustomerId> = places.iter().map(|(c, _)| *c).collect();
    let unread: Vec<CustomerId> = admitted
        .into_iter()
        .filter(|c| !inserted.contains(c))
        .collect();
    if !unread.is_empty() {
        places.extend(read_places(conn, product, &unread)?);
    }
    let mut seated: Seated = places
        .into_iter()
        .map(|(customer, place)| (customer, Ok(place)))
        .collect();
    seated.extend(refused.into_iter().map(|(c, why)| (c, Err(why))));
    Ok(Ok(seated))
}

/// Places in the pre-queue, joined at `now` (before the start, by the
/// database's clock), as written. A customer already in the room keeps
/// their place, and is not among them.
fn enter_pre_queue(
    conn: &mut PgConn,
    product: ProductId,
    customers: &[CustomerId],
    now: DateTime<Utc>,
) -> Result<Vec<(CustomerId, Place)>, AppError> {
    let ids: Vec<i64> = customers.iter().map(|c| c.get()).collect();
    let tickets: Vec<String> = customers
        .iter()
        .map(|_| Ticket::generate().as_str().to_string())
        .collect();
    Prepared::new(
        "INSERT INTO queue_entries (product_id, customer_id, ticket, seq, joined_at, late)
         SELECT $1, j.customer_id, j.ticket, nextval('queue_entry_seq'), $4, false
         FROM unnest($2::bigint[], $3::text[]) AS j(customer_id, ticket)
         ON CONFLICT (product_id, customer_id) DO NOTHING
         RETURNING customer_id, ticket, late, position",
    )
    .bind::<BigInt, _>(product.get())
    .bind::<Array<BigInt>, _>(ids)
    .bind::<Array<Text>, _>(tickets)
    .bind::<Timestamptz, _>(now)
    .load::<PlaceRow>(conn)?
    .into_iter()
    .map(|row| place_from_row(row, product))
    .collect()
}

/// Places behind the drawn line, in arrival order: the room's row is
/// locked, so positions, join times and arrival numbers all rise together
/// (the published order puts late places by join time, then number).
fn enter_late(
    conn: &mut PgConn,
    product: ProductId,
    customers: &[CustomerId],
) -> Result<(), AppError> {
    #[derive(QueryableByName)]
    struct Line {
        #[diesel(sql_type = Int4)]
        last_position: i32,
        #[diesel(sql_type = Timestamptz)]
        now: DateTime<Utc>,
    }
    #[derive(QueryableByName)]
    struct Seq {
        #[diesel(sql_type = BigInt)]
        seq: i64,
    }
    let line: Line = Prepared::new(
        "SELECT last_position, clock_timestamp() AS now FROM queue_draws
         WHERE product_id = $1 FOR UPDATE",
    )
    .bind::<BigInt, _>(product.get())
    .get_result(conn)?;
    let present: HashSet<CustomerId> = read_places(conn, product, customers)?
        .into_iter()
        .map(|(c, _)| c)
        .collect();
    let newcomers: Vec<i64> = customers
        .iter()
        .filter(|c| !present.contains(c))
        .map(|c| c.get())
        .collect();
    if newcomers.is_empty() {
        return Ok(());
    }
    let count = i32::try_from(newcomers.len()).unwrap_or(i32::MAX);
    let mut seqs: Vec<i64> =
        Prepared::new("SELECT nextval('queue_entry_seq') AS seq FROM generate_series(1, $1)")
            .bind::<Int4, _>(count)
            .load::<Seq>(conn)?
            .into_iter()
            .map(|s| s.seq)
            .collect();
    seqs.sort_unstable();
    let positions: Vec<i32> = (1..=count).map(|i| line.last_position + i).collect();
    let tickets: Vec<String> = newcomers
        .iter()
        .map(|_| Ticket::generate().as_str().to_string())
        .collect();
    Prepared::new(
        "INSERT INTO queue_entries (product_id, customer_id, ticket, seq, joined_at, late, position)
         SELECT $1, j.customer_id, j.ticket, j.seq, $6, true, j.position
         FROM unnest($2::bigint[], $3::text[], $4::bigint[], $5::int[]) AS j(customer_id, ticket, seq, position)",
    )
    .bind::<BigInt, _>(product.get())
    .bind::<Array<BigInt>, _>(newcomers)
    .bind::<Array<Text>, _>(tickets)
    .bind::<Array<BigInt>, _>(seqs)
    .bind::<Array<Int4>, _>(positions)
    .bind::<Timestamptz, _>(line.now)
    .execute(conn)?;
    Prepared::new(
        "UPDATE queue_draws SET last_position = last_position + $2 WHERE product_id = $1",
    )
    .bind::<BigInt, _>(product.get())
    .bind::<Int4, _>(count)
    .execute(conn)?;
    Ok(())
}
