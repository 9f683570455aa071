//! Customers' places and what became of their passes, as this process
//! last read them: a place is read once (one indexed row) and kept once it
//! has a position, which never changes; a pass that was used or lapsed is
//! kept too. Everything here can be dropped: the next read is Postgres's.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Int4, Nullable, Text};

use super::rooms::{corrupt_if_bad, locked, RoomSnapshot};
use crate::db::prepared::Prepared;
use crate::db::{self, PgConn};
use crate::domain::draw::{PassState, Ticket};
use crate::domain::{CustomerId, ProductId};
use crate::domain::{PassRow, Place};
use crate::error::AppError;
use crate::services::Shop;

/// `customer`'s place in `product`'s room, if they joined: from memory
/// when this process read it with its position (which never changes), or
/// from their row (one indexed read). Once `room` says it is drawn, the
/// first poll reads the whole line in one query, so the crowd's first
/// polls after the start do not each read their row.
pub async fn place_of(
    shop: &Shop,
    room: &RoomSnapshot,
    product: ProductId,
    customer: CustomerId,
) -> Result<Option<Place>, AppError> {
    let known = |shop: &Shop| {
        locked(&shop.waiting_room.places)
            .get(&(product, customer))
            .cloned()
            .filter(|place| place.position.is_some() || !room.drawn)
    };
    if let Some(place) = known(shop) {
        return Ok(Some(place));
    }
    if room.drawn && read_line_once(shop, product).await? {
        if let Some(place) = known(shop) {
            return Ok(Some(place));
        }
    }
    let read = db::run(&shop.pool, move |conn| {
        read_places(conn, product, &[customer])
    })
    .await?;
    let place = read.into_iter().next().map(|(_, place)| place);
    if let Some(place) = &place {
        shop.waiting_room.remember_place(product, customer, place);
    }
    Ok(place)
}

/// Reads every place of a drawn room into memory, the first time this
/// process is asked after the draw; whether it did.
async fn read_line_once(shop: &Shop, product: ProductId) -> Result<bool, AppError> {
    let mut read = shop.waiting_room.lines_read.lock().await;
    if read.contains(&product) {
        return Ok(false);
    }
    let line = db::run(&shop.pool, move |conn| {
        let rows: Vec<PlaceRow> = diesel::sql_query(
            "SELECT customer_id, ticket, late, position FROM queue_entries
             WHERE product_id = $1 AND position IS NOT NULL",
        )
        .bind::<BigInt, _>(product.get())
        .load(conn)?;
        rows.into_iter()
            .map(|row| place_from_row(row, product))
            .collect::<Result<Vec<_>, AppError>>()
    })
    .await?;
    remember_places(shop, product, &line);
    read.insert(product);
    Ok(true)
}

/// Places just committed by this process's joins.
pub(super) fn remember_places(shop: &Shop, product: ProductId, places: &[(CustomerId, Place)]) {
    for (customer, place) in places {
        shop.waiting_room.remember_place(product, *customer, place);
    }
}

#[derive(QueryableByName)]
pub(super) struct PlaceRow {
    #[diesel(sql_type = BigInt)]
    customer_id: i64,
    #[diesel(sql_type = Text)]
    ticket: String,
    #[diesel(sql_type = Bool)]
    late: bool,
    #[diesel(sql_type = Nullable<Int4>)]
    position: Option<i32>,
}

/// The rows of `customers`' places in `product`'s room.
pub(super) fn read_places(
    conn: &mut PgConn,
    product: ProductId,
    customers: &[CustomerId],
) -> Result<Vec<(CustomerId, Place)>, AppError> {
    let ids: Vec<i64> = customers.iter().map(|c| c.get()).collect();
    let rows: Vec<PlaceRow> = Prepared::new(
        "SELECT customer_id, ticket, late, position FROM queue_entries
         WHERE product_id = $1 AND customer_id = ANY($2)",
    )
    .bind::<BigInt, _>(product.get())
    .bind::<Array<BigInt>, _>(ids)
    .load(conn)?;
    rows.into_iter()
        .map(|row| place_from_row(row, product))
        .collect()
}

pub(super) fn place_from_row(
    row: PlaceRow,
    product: ProductId,
) -> Result<(CustomerId, Place), AppError> {
    Ok((
        CustomerId(row.customer_id),
        Place {
            ticket: corrupt_if_bad(Ticket::parse(&row.ticket), product)?,
            late: row.late,
            position: row.position.map(i64::from),
        },
    ))
}

/// What became of `customer`'s pass once `room` no longer shows it open:
/// kept once it is used or lapsed (neither changes again).
pub async fn ended_pass_of(
    shop: &Shop,
    product: ProductId,
    customer: CustomerId,
) -> Result<Option<PassRow>, AppError> {
    let known = locked(&shop.waiting_room.ended_passes)
        .get(&(product, customer))
        .cloned();
    if known.is_some() {
        return Ok(known);
    }
    let row: Option<(i32, String, DateTime<Utc>, i32)> = db::run(&shop.pool, move |conn| {
        use crate::db::schema::queue_admissions as a;
        Ok(a::table
            .filter(a::product_id.eq(product.get()))
            .filter(a::customer_id.eq(customer.get()))
            .select((a::number, a::state, a::expires_at, a::units))
            .first(conn)
            .optional()?)
    })
    .await?;
    let Some((number, state, expires_at, units)) = row else {
        return Ok(None);
    };
    let state = match state.as_str() {
        "used" => PassState::Used,
        "lapsed" => PassState::Lapsed,
        _ => PassState::Issued,
    };
    let pass = PassRow {
        number,
        state,
        expires_at,
        units,
    };
    if state != PassState::Issued {
        locked(&shop.waiting_room.ended_passes).insert((product, customer), pass.clone());
    }
    Ok(Some(pass))
}
