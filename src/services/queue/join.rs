//! Joining a waiting room: one place per customer, held in Redis (shared by
//! every instance) and answered once its row is committed in Postgres (what
//! a lost queue is rebuilt from, and the draw audited against).

use chrono::Utc;

use super::entries::{forget_entries, write_entry};
use super::opening::{ensure_queue, ensure_seed};
use super::sale::{closed, not_in_queue_mode, sold_out, QueueSale};
use crate::domain::draw::Ticket;
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::queue::{Confirmed, Joined, QueueState};
use crate::services::Shop;

/// The sale `product` in queue mode, from the shelf (no Postgres read
/// unless the shelf is due for its refresh).
pub async fn queue_sale(shop: &Shop, product: ProductId) -> Result<QueueSale, AppError> {
    let shelf = shop.sale_cache.shelf(&shop.pool).await?;
    let row = shelf
        .product(product)
        .ok_or_else(|| AppError::NotFound(format!("There is no product with id {product}.")))?;
    QueueSale::of(row).ok_or_else(|| not_in_queue_mode(&row.name))
}

/// Joins `customer` to `product`'s waiting room (one place per customer:
/// joining again returns the same ticket). Answered once the entry's row
/// has committed.
pub async fn join(
    shop: &Shop,
    customer: CustomerId,
    product: ProductId,
) -> Result<Ticket, AppError> {
    let sale = queue_sale(shop, product).await?;
    sale.refuse_join(Utc::now())?;
    // The commitment exists before the first ticket is issued under it.
    ensure_seed(shop, product).await?;
    let fresh = Ticket::generate();
    let mut joined = shop.waiting_room.join(product, customer, &fresh).await?;
    if joined == Joined::Missing {
        ensure_queue(shop, &sale).await?;
        joined = shop.waiting_room.join(product, customer, &fresh).await?;
    }
    let (entry, new) = match joined {
        Joined::Again(entry) if entry.confirmed => return Ok(entry.ticket),
        // Its first join may still be writing the row, or have died before
        // it could: writing it here is harmless either way, and this answer
        // too waits for the row.
        Joined::Again(entry) => (entry, false),
        Joined::New(entry) => (entry, true),
        Joined::Refused(QueueState::SoldOut) => return Err(sold_out(&sale.name)),
        Joined::Refused(_) => return Err(closed(&sale.name)),
        Joined::Missing => {
            return Err(AppError::Unavailable(
                "the waiting room is being rebuilt; try again".into(),
            ))
        }
    };
    let ticket = entry.ticket.clone();
    match write_entry(shop, product, entry.clone()).await {
        Ok(()) => {}
        // The row may stand: the place stays, unconfirmed, for the tick to
        // settle (it writes the row if absent, which keeps it either way).
        Err(error @ AppError::OutcomeUnknown(_)) => return Err(error),
        Err(error) => {
            // Only the join that made the place takes it back: another
            // request of the same customer may be writing it right now.
            if new {
                if let Err(undo) = shop
                    .waiting_room
                    .undo_join(product, customer, &ticket)
                    .await
                {
                    tracing::warn!(%product, error = %undo, "could not take back a place whose row was not written; the tick will write it");
                }
            }
            return Err(match error {
                AppError::Unavailable(reason) => AppError::Unavailable(reason),
                other => AppError::Unavailable(format!("joining the waiting room: {other}")),
            });
        }
    }
    match shop.waiting_room.confirm(product, &entry).await {
        Ok(Confirmed::Confirmed | Confirmed::PutBack | Confirmed::Missing) => {}
        Ok(Confirmed::TooLate) => {
            // The queue was rebuilt, then drawn, while this row committed:
            // the place cannot be put in a draw that went ahead without it.
            forget_entries(shop, product, vec![entry]).await?;
            return Err(AppError::Unavailable(
                "the waiting room was rebuilt while you joined; join again".into(),
            ));
        }
        // The row is committed, so the place is kept; until confirmed the
        // line waits at it, and the tick confirms it.
        Err(error) => {
            tracing::warn!(%product, %error, "could not confirm a written place; the tick will")
        }
    }
    Ok(ticket)
}
