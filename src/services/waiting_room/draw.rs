//! A room's draw, in the database's time. The room opens with a seed drawn
//! and its SHA-256 committed (`ensure_room`); at the start one transaction
//! freezes the pre-queue (every place committed before it, under the
//! room's lock, and the SHA-256 of their tickets published), and the next
//! reveals the seed and writes every pre-queue place's position from it.
//! Each step decides "is it time" by `clock_timestamp()`, so an instance
//! whose clock runs ahead or behind can neither draw early nor late.

use std::time::Duration;

use diesel::prelude::*;

use diesel::sql_types::{Array, BigInt, Bool, Bytea, Double, Int4, Text};

use super::ROOM_LOCK;
use crate::db::{self, PgConn};
use crate::domain::draw::{frozen_list_sha256, shuffle, DrawSeed, Ticket};
use crate::domain::ProductId;
use crate::error::AppError;
use crate::services::Shop;

/// What a call of `draw` found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drawn {
    /// Not a queue-mode sale, its room not open, or before its start.
    NotDue,
    /// Frozen and revealed now: this many pre-queue places were drawn.
    Now(usize),
    /// Drawn before.
    Already,
}

/// Opens `product`'s room if it is in queue mode and has none: a seed from
/// the OS's CSPRNG, its commitment published from now on. Doing it again
/// keeps the first seed.
pub async fn ensure_room(shop: &Shop, product: ProductId) -> Result<(), AppError> {
    let seed = DrawSeed::generate();
    db::run(&shop.pool, move |conn| {
        diesel::sql_query(
            "INSERT INTO queue_draws (product_id, seed, seed_sha256)
             SELECT id, $2, $3 FROM products WHERE id = $1 AND queue_mode
             ON CONFLICT (product_id) DO NOTHING",
        )
        .bind::<BigInt, _>(product.get())
        .bind::<Bytea, _>(seed.as_bytes().to_vec())
        .bind::<Bytea, _>(seed.commitment().as_bytes().to_vec())
        .execute(conn)?;
        Ok(())
    })
    .await
}

/// Freezes and reveals `product`'s draw if its start has passed by the
/// database's clock. Safe to call from every instance at once: the freeze
/// waits for the room's lock and finds the work done.
pub async fn draw(shop: &Shop, product: ProductId) -> Result<Drawn, AppError> {
    let turn = shop.waiting_room.drawing.of(product);
    let _turn = turn.lock().await;
    let reveal_in = db::run(&shop.pool, move |conn| {
        db::transaction(conn, |conn| freeze(conn, product))
    })
    .await?;
    let Some(reveal_in) = reveal_in else {
        return Ok(Drawn::NotDue);
    };
    // The frozen list's commitment is public (`queue.json`, `draw.json`)
    // for `REVEAL_AFTER` before the seed is.
    tokio::time::sleep(reveal_in).await;
    let drawn = db::run(&shop.pool, move |conn| {
        db::transaction(conn, |conn| reveal(conn, product))
    })
    .await?;
    shop.waiting_room.forget(product);
    Ok(drawn)
}

/// How long the frozen list's commitment is published before the seed is
/// revealed: short, so the first passes still go out within a second of
/// the start, but a separate commit anyone polling can see and keep.
pub const REVEAL_AFTER: Duration = Duration::from_millis(300);

#[derive(QueryableByName)]
struct RoomClock {
    #[diesel(sql_type = Bool)]
    frozen: bool,
    #[diesel(sql_type = Bool)]
    due: bool,
    /// Milliseconds until the seed may be revealed (negative: now).
    #[diesel(sql_type = Double)]
    reveal_in_ms: f64,
}

#[derive(QueryableByName)]
struct TicketRow {
    #[diesel(sql_type = Text)]
    ticket: String,
}

/// How long until the seed may be revealed, once the room is frozen (None:
/// not due). Takes the room's lock alone, so every join holding it shared
/// has committed (or rolled back) and no pre-queue join can commit after:
/// the list read here is final.
fn freeze(conn: &mut PgConn, product: ProductId) -> Result<Option<Duration>, AppError> {
    hold_room(conn, product)?;
    let room: Option<RoomClock> = diesel::sql_query(
        "SELECT d.frozen_at IS NOT NULL AS frozen,
                p.queue_mode AND p.sale_starts_at <= clock_timestamp() AS due,
                coalesce(extract(epoch FROM d.frozen_at + $2 * interval '1 millisecond'
                    - clock_timestamp())::float8 * 1000, 0) AS reveal_in_ms
         FROM queue_draws d JOIN products p ON p.id = d.product_id
         WHERE d.product_id = $1 FOR UPDATE OF d",
    )
    .bind::<BigInt, _>(product.get())
    .bind::<BigInt, _>(REVEAL_AFTER.as_millis() as i64)
    .get_result(conn)
    .optional()?;
    let Some(room) = room else {
        return Ok(None);
    };
    if room.frozen {
        return Ok(Some(Duration::from_secs_f64(
            room.reveal_in_ms.max(0.0) / 1000.0,
        )));
    }
    if !room.due {
        return Ok(None);
    }
    let tickets = pre_queue(conn, product)?;
    diesel::sql_query(
        "UPDATE queue_draws SET frozen_at = clock_timestamp(), entries_sha256 = $2, last_position = $3
         WHERE product_id = $1",
    )
    .bind::<BigInt, _>(product.get())
    .bind::<Bytea, _>(frozen_list_sha256(&tickets).as_bytes().to_vec())
    .bind::<Int4, _>(position(tickets.len())?)
    .execute(conn)?;
    Ok(Some(REVEAL_AFTER))
}

/// Holds `product`'s room alone until the transaction ends: every join
/// holding it shared has committed, and none can start. The freeze takes it,
/// and so does a sale edit that checks the room's times.
pub fn hold_room(conn: &mut PgConn, product: ProductId) -> Result<(), AppError> {
    diesel::sql_query("SELECT pg_advisory_xact_lock($1, ($2 % 2147483647)::int)")
        .bind::<Int4, _>(ROOM_LOCK)
        .bind::<BigInt, _>(product.get())
        .execute(conn)?;
    Ok(())
}

/// Reveals the seed of a frozen room and writes the drawn positions.
fn reveal(conn: &mut PgConn, product: ProductId) -> Result<Drawn, AppError> {
    #[derive(QueryableByName)]
    struct Frozen {
        #[diesel(sql_type = Bytea)]
        seed: Vec<u8>,
        #[diesel(sql_type = Bytea)]
        entries_sha256: Vec<u8>,
        #[diesel(sql_type = Bool)]
        drawn: bool,
        #[diesel(sql_type = Bool)]
        due: bool,
    }
    let room: Frozen = diesel::sql_query(
        "SELECT seed, entries_sha256, drawn_at IS NOT NULL AS drawn,
                frozen_at + $2 * interval '1 millisecond' <= clock_timestamp() AS due
         FROM queue_draws WHERE product_id = $1 AND frozen_at IS NOT NULL FOR UPDATE",
    )
    .bind::<BigInt, _>(product.get())
    .bind::<BigInt, _>(REVEAL_AFTER.as_millis() as i64)
    .get_result(conn)?;
    if room.drawn {
        return Ok(Drawn::Already);
    }
    if !room.due {
        return Ok(Drawn::NotDue);
    }
    let tickets = pre_queue(conn, product)?;
    // Nothing may join the pre-queue once it is frozen; a list that does
    // not hash to what was published is a database someone wrote into.
    if frozen_list_sha256(&tickets).as_bytes().as_slice() != room.entries_sha256.as_slice() {
        return Err(AppError::Internal(anyhow::anyhow!(
            "the pre-queue of {product} changed after it was frozen; the draw is not revealed"
        )));
    }
    let seed: [u8; 32] = room.seed.try_into().map_err(|_| {
        AppError::Internal(anyhow::anyhow!("the seed of {product} is not 32 bytes"))
    })?;
    let order = shuffle(&DrawSeed::from_bytes(seed), &tickets);
    let positions: Vec<i32> = (1..=position(order.len())?).collect();
    let order: Vec<String> = order.iter().map(|t| t.as_str().to_string()).collect();
    diesel::sql_query(
        "UPDATE queue_entries e SET position = drawn.position, drawn = true
         FROM unnest($2::text[], $3::int[]) AS drawn(ticket, position)
         WHERE e.product_id = $1 AND e.ticket = drawn.ticket",
    )
    .bind::<BigInt, _>(product.get())
    .bind::<Array<Text>, _>(order)
    .bind::<Array<Int4>, _>(positions)
    .execute(conn)?;
    diesel::sql_query("UPDATE queue_draws SET drawn_at = clock_timestamp() WHERE product_id = $1")
        .bind::<BigInt, _>(product.get())
        .execute(conn)?;
    Ok(Drawn::Now(tickets.len()))
}

/// Every pre-queue ticket of the room.
fn pre_queue(conn: &mut PgConn, product: ProductId) -> Result<Vec<Ticket>, AppError> {
    let rows: Vec<TicketRow> =
        diesel::sql_query("SELECT ticket FROM queue_entries WHERE product_id = $1 AND NOT late")
            .bind::<BigInt, _>(product.get())
            .load(conn)?;
    rows.iter()
        .map(|row| {
            Ticket::parse(&row.ticket)
                .map_err(|e| AppError::Internal(anyhow::anyhow!("a ticket of {product}: {e}")))
        })
        .collect()
}

fn position(count: usize) -> Result<i32, AppError> {
    i32::try_from(count)
        .map_err(|_| AppError::Internal(anyhow::anyhow!("a line of {count} places")))
}
