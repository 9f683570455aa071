//! Joining a waiting room: one place per customer, held in Redis (shared by
//! every instance) and answered once its row is committed in Postgres (what
//! a lost queue is rebuilt from, and the draw audited against).

use chrono::Utc;

use super::entries::{committed_entry, forget_entries, write_entry, Written};
use super::opening::{ensure_queue, ensure_seed};
use super::sale::{closed, not_in_queue_mode, sold_out, QueueSale};
use crate::domain::draw::Ticket;
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::queue::{Confirmed, Entry, Joined, QueueState};
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
        Ok(Written::Written(confirmed)) => settle(shop, product, entry, confirmed).await,
        Ok(Written::Blocked) => {
            // The customer's row from before Redis lost their place is
            // their place: confirming it puts it back (this fresh one gives way).
            // (Should Redis not answer now, the sweep finds this fresh one
            // blocked by that row in turn, and puts the row's place back.)
            if let Some(theirs) = committed_entry(shop, product, customer).await? {
                let answer = confirm_written(shop, product, theirs).await;
                if answer.is_err() && new {
                    take_back(shop, product, customer, &ticket).await;
                }
                return answer;
            }
            if new {
                take_back(shop, product, customer, &ticket).await;
            }
            Err(AppError::Unavailable(
                "the waiting room gave your place's number to another as it was rebuilt; join again"
                    .into(),
            ))
        }
        // The row may stand: the place stays, unconfirmed, for the tick to
        // settle (it writes the row if absent, which keeps it either way).
        Err(error @ AppError::OutcomeUnknown(_)) => Err(error),
        Err(error) => {
            // Only the join that made the place takes it back: another
            // request of the same customer may be writing it right now.
            if new {
                take_back(shop, product, customer, &ticket).await;
            }
            Err(match error {
                AppError::Unavailable(reason) => AppError::Unavailable(reason),
                other => AppError::Unavailable(format!("joining the waiting room: {other}")),
            })
        }
    }
}

async fn take_back(shop: &Shop, product: ProductId, customer: CustomerId, ticket: &Ticket) {
    if let Err(undo) = shop.waiting_room.undo_join(product, customer, ticket).await {
        tracing::warn!(%product, error = %undo, "could not take back a place whose row was not written; the tick will write it");
    }
}

/// The place's row is committed: Redis confirms it (putting it back if it
/// had lost it) and the customer is answered.
async fn confirm_written(
    shop: &Shop,
    product: ProductId,
    entry: Entry,
) -> Result<Ticket, AppError> {
    let confirmed = shop.waiting_room.confirm(product, &entry).await;
    settle(shop, product, entry, confirmed).await
}

/// The answer to a joiner whose place's row is committed, from what Redis
/// said when told so.
async fn settle(
    shop: &Shop,
    product: ProductId,
    entry: Entry,
    confirmed: Result<Confirmed, AppError>,
) -> Result<Ticket, AppError> {
    match confirmed {
        Ok(Confirmed::Confirmed | Confirmed::PutBack | Confirmed::Missing) => Ok(entry.ticket),
        Ok(Confirmed::TooLate) => {
            // The queue was rebuilt, then drawn, while this row committed:
            // the place cannot be put in a draw that went ahead without it.
            // Redis keeps the ticket until the row is gone, so a failure
            // here leaves it to the tick.
            if let Err(error) = forget_entries(shop, product).await {
                tracing::warn!(%product, %error, "could not delete a place the draw went without; the tick will");
            }
            Err(AppError::Unavailable(
                "the waiting room was rebuilt while you joined; join again".into(),
            ))
        }
        Ok(Confirmed::Refused) => {
            tracing::error!(%product, customer = %entry.customer, "a committed place conflicts with another place of its customer in Redis");
            Err(AppError::Unavailable(
                "the waiting room holds another place of yours; try again".into(),
            ))
        }
        // The row is committed, so the place is kept; until confirmed the
        // line waits at it, and the tick confirms it.
        Err(error) => {
            tracing::warn!(%product, %error, "could not confirm a written place; the tick will");
            Ok(entry.ticket)
        }
    }
}
