//! Joining a waiting room: one place per customer, answered once its row
//! is durably committed. A commit per join would cap joins at the disk's
//! flush rate, so a process's joins queue here and whichever finds fewer
//! than `WRITERS` writing becomes a writer: it takes everything queued (up
//! to `QUEUE_JOIN_MAX`) and writes it in one transaction; joins arriving
//! meanwhile go in the next.
//!
//! In that transaction each room is decided by the database's clock:
//! before the start a place goes to the pre-queue under the room's lock
//! held shared (the freeze at the start waits for it); once frozen, a
//! late place gets the next position under the room's row lock.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::oneshot;

use super::draw::{draw, ensure_room};
use super::enter::{enter_all, Entered, Joiner};
use super::places::remember_places;
use super::rooms::snapshot;
use super::sale::{closed, not_in_queue_mode, not_open_yet, queue_sale, sold_out, QueueSale};
use crate::db::{self, PgPool};
use crate::domain::draw::Ticket;
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::services::door::{Door, Doorkeeper, Visit};
use crate::services::Shop;

/// Join transactions a process runs at once: one's statements run while
/// the other waits for its commit to reach the disk.
const WRITERS: usize = 2;

/// A customer's own join, through the door (`services::door`): the bot
/// check (its cryptography checked here), spent once, the address's limit
/// and a confirmed address, decided in the transaction that writes the
/// place, so a join refused for the sale's sake, or one that fails, spends
/// nothing.
pub async fn join_at_door(
    shop: &Shop,
    customer: CustomerId,
    product: ProductId,
    bot_check: String,
    ip: IpAddr,
) -> Result<Ticket, AppError> {
    let visit = Visit::new(&shop.door_keys, Door::Join(product), &bot_check, ip);
    place(shop, customer, product, Some(visit)).await
}

/// Joins `customer` to `product`'s waiting room without the door: for the
/// shop's own tools and tests, never a customer's request. Joining again
/// returns the same ticket.
pub async fn join(
    shop: &Shop,
    customer: CustomerId,
    product: ProductId,
) -> Result<Ticket, AppError> {
    place(shop, customer, product, None).await
}

/// Refuses a sale without a waiting room, or whose room this process
/// already knows to be over.
async fn joinable(shop: &Shop, product: ProductId) -> Result<QueueSale, AppError> {
    let sale = queue_sale(shop, product).await?;
    // The cache may only refuse: a room it shows over is over.
    let room = snapshot(shop, product).await?;
    if room.ended {
        return Err(closed(&sale.name));
    }
    if room.sold_out() {
        return Err(sold_out(&sale.name));
    }
    Ok(sale)
}

/// The place, answered once its row has committed.
async fn place(
    shop: &Shop,
    customer: CustomerId,
    product: ProductId,
    visit: Option<Visit>,
) -> Result<Ticket, AppError> {
    let sale = joinable(shop, product).await?;
    for _ in 0..3 {
        match write_place(shop, product, customer, visit.clone()).await? {
            Entered::Place(place) => {
                remember_places(shop, product, &[(customer, place.clone())]);
                return Ok(place.ticket);
            }
            Entered::NoRoom => {
                ensure_room(shop, product).await?;
                // This process's snapshot said the room was not open.
                shop.waiting_room.forget(product);
            }
            Entered::DrawDue => {
                draw(shop, product).await?;
            }
            Entered::DoorRefused(refusal) => return Err(AppError::DoorRefused(refusal)),
            Entered::NotOpen(opens_at) => return Err(not_open_yet(&sale.name, opens_at)),
            Entered::Ended => return Err(closed(&sale.name)),
            Entered::NotQueueMode => return Err(not_in_queue_mode(&sale.name)),
        }
    }
    Err(AppError::Unavailable(
        "the waiting room is drawing its order; try again in a moment".into(),
    ))
}

struct Queued {
    joiner: Joiner,
    answer: oneshot::Sender<Result<Entered, AppError>>,
}

#[derive(Default)]
struct Pending {
    queued: Vec<Queued>,
    writers: usize,
}

type Writer = Arc<Mutex<Pending>>;

/// One writer queue per shop in the process (tests run several shops,
/// each with its own database, in one process).
fn writer_for(shop: &Shop) -> Writer {
    static ALL: OnceLock<Mutex<HashMap<String, Writer>>> = OnceLock::new();
    let mut all = ALL
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    all.entry(shop.redis_prefix.clone()).or_default().clone()
}

fn pending(writer: &Writer) -> std::sync::MutexGuard<'_, Pending> {
    writer.lock().unwrap_or_else(|p| p.into_inner())
}

async fn write_place(
    shop: &Shop,
    product: ProductId,
    customer: CustomerId,
    visit: Option<Visit>,
) -> Result<Entered, AppError> {
    let writer = writer_for(shop);
    let (answer, answered) = oneshot::channel();
    let start = {
        let mut pending = pending(&writer);
        pending.queued.push(Queued {
            joiner: Joiner {
                product,
                customer,
                visit,
            },
            answer,
        });
        (pending.writers < WRITERS).then(|| {
            pending.writers += 1;
            Writing {
                writer: writer.clone(),
                writing: true,
            }
        })
    };
    if let Some(writing) = start {
        // Its own task: a joiner who hangs up must not cancel a commit
        // other joiners wait for.
        crate::serial::spawn(write_queued(
            shop.pool.clone(),
            Doorkeeper::of(shop),
            writing,
            shop.settings.queue_join_max,
        ));
    }
    // A writer that vanished mid-commit may have written the place: joining
    // again finds it.
    answered.await.unwrap_or_else(|_| {
        Err(AppError::OutcomeUnknown(
            "the waiting room's insert lost its answer; join again to see your place".into(),
        ))
    })
}

/// One of the writers. Dropped any way but by finding nothing queued, the
/// last one tells the joiners still queued (none of them started) to try again.
struct Writing {
    writer: Writer,
    writing: bool,
}

impl Writing {
    fn next(&mut self, max: usize) -> Vec<Queued> {
        let mut pending = pending(&self.writer);
        let take = pending.queued.len().min(max);
        if take == 0 {
            pending.writers -= 1;
            self.writing = false;
        }
        pending.queued.drain(..take).collect()
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        if !self.writing {
            return;
        }
        let mut pending = pending(&self.writer);
        pending.writers -= 1;
        if pending.writers > 0 {
            return;
        }
        for queued in pending.queued.drain(..) {
            let _ = queued.answer.send(Err(AppError::Unavailable(
                "the waiting room's writer stopped".into(),
            )));
        }
    }
}

async fn write_queued(pool: PgPool, doorkeeper: Doorkeeper, mut writing: Writing, max: usize) {
    loop {
        let batch = writing.next(max.max(1));
        if batch.is_empty() {
            return;
        }
        let (joiners, answers): (Vec<Joiner>, Vec<_>) =
            batch.into_iter().map(|q| (q.joiner, q.answer)).unzip();
        let doorkeeper = doorkeeper.clone();
        let written = db::run(&pool, move |conn| {
            let entered = db::transaction(conn, |conn| enter_all(conn, &joiners, &doorkeeper))?;
            Ok((joiners, entered))
        })
        .await;
        match written {
            Ok((joiners, entered)) => {
                for (joiner, answer) in joiners.into_iter().zip(answers) {
                    let outcome = entered
                        .get(&(joiner.product, joiner.customer))
                        .cloned()
                        .ok_or_else(|| {
                            AppError::Internal(anyhow::anyhow!("a joiner's place is missing"))
                        });
                    let _ = answer.send(outcome);
                }
            }
            Err(error) => {
                for answer in answers {
                    let _ = answer.send(Err(error.duplicate()));
                }
            }
        }
    }
}
