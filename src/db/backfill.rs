//! Data the schema's migrations cannot compute in SQL. Run after them, in
//! one transaction; each step finds nothing left to do on a second run.

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Bytea, Int4, Text, Timestamptz};

use crate::domain::draw::{draw_order, frozen_list_sha256, DrawEntry, DrawSeed, Ticket};

#[derive(QueryableByName)]
struct DrawnRoom {
    #[diesel(sql_type = BigInt)]
    product_id: i64,
    #[diesel(sql_type = Bytea)]
    seed: Vec<u8>,
}

#[derive(QueryableByName)]
struct EntryRow {
    #[diesel(sql_type = Text)]
    ticket: String,
    #[diesel(sql_type = BigInt)]
    seq: i64,
    #[diesel(sql_type = Timestamptz)]
    joined_at: chrono::DateTime<chrono::Utc>,
    #[diesel(sql_type = Bool)]
    late: bool,
}

/// Rooms drawn before places had positions (the Redis design, before
/// issue #37) get the positions their published order gives them, and
/// their line's length, so passes go on from where that design left off:
/// the order is recomputed from the revealed seed (HMAC-SHA256, which SQL
/// cannot do without an extension), over the entries the draw took and
/// the late ones.
pub fn place_rooms_drawn_without_positions(conn: &mut PgConnection) -> QueryResult<usize> {
    conn.transaction(|conn| {
        let rooms: Vec<DrawnRoom> = diesel::sql_query(
            "SELECT d.product_id, d.seed FROM queue_draws d
             WHERE d.drawn_at IS NOT NULL AND EXISTS (
                 SELECT 1 FROM queue_entries e WHERE e.product_id = d.product_id
                 AND e.position IS NULL AND (e.late OR e.drawn))
             FOR UPDATE",
        )
        .load(conn)?;
        for room in &rooms {
            let Ok(seed) = <[u8; 32]>::try_from(room.seed.as_slice()) else {
                continue;
            };
            let rows: Vec<EntryRow> = diesel::sql_query(
                "SELECT ticket, seq, joined_at, late FROM queue_entries
                 WHERE product_id = $1 AND (late OR drawn)",
            )
            .bind::<BigInt, _>(room.product_id)
            .load(conn)?;
            let entries: Vec<DrawEntry> = rows
                .into_iter()
                .filter_map(|row| {
                    Some(DrawEntry {
                        ticket: Ticket::parse(&row.ticket).ok()?,
                        seq: u64::try_from(row.seq).ok()?,
                        joined_at: row.joined_at,
                        late: row.late,
                    })
                })
                .collect();
            let order = draw_order(&DrawSeed::from_bytes(seed), &entries);
            let count = i32::try_from(order.len()).unwrap_or(i32::MAX);
            diesel::sql_query(
                "UPDATE queue_entries e SET position = placed.position
                 FROM unnest($2::text[], $3::int[]) AS placed(ticket, position)
                 WHERE e.product_id = $1 AND e.ticket = placed.ticket",
            )
            .bind::<BigInt, _>(room.product_id)
            .bind::<Array<Text>, _>(
                order
                    .iter()
                    .map(|t| t.as_str().to_string())
                    .collect::<Vec<_>>(),
            )
            .bind::<Array<Int4>, _>((1..=count).collect::<Vec<_>>())
            .execute(conn)?;
            // That design published no frozen list; the list its draw took
            // is the one its order was drawn from.
            let drawn: Vec<Ticket> = entries
                .iter()
                .filter(|e| !e.late)
                .map(|e| e.ticket.clone())
                .collect();
            diesel::sql_query(
                "UPDATE queue_draws SET last_position = $2,
                     entries_sha256 = coalesce(entries_sha256, $3)
                 WHERE product_id = $1",
            )
            .bind::<BigInt, _>(room.product_id)
            .bind::<Int4, _>(count)
            .bind::<Bytea, _>(frozen_list_sha256(&drawn).as_bytes().to_vec())
            .execute(conn)?;
        }
        Ok(rooms.len())
    })
}
