//! Combining: one lock hold sells to many buyers of the same product.
//!
//! A flash sale sends everyone to one product, and one purchase per lock hold
//! and per commit caps the shop at the database's commit rate on one row.
//! Here buyers of a product queue in arrival order; whoever finds nobody
//! serving the queue becomes its leader, takes the product's lock once, and
//! serves up to `max_batch` queued buyers in ONE transaction: one
//! `SELECT ... FOR UPDATE`, then for each buyer in arrival order the same
//! checks as a lone purchase and that buyer's own order, item and ledger row
//! under a savepoint (so one buyer's refusal or error touches nobody else),
//! then one stock update carrying the lock's fencing token and one commit.
//! Then it releases the lock, so restores, carts and other instances get
//! their turn between batches, and goes again while buyers are waiting.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use tokio::sync::oneshot;

use super::purchase::{held_by_customers, refusal_for, write_order, PurchaseOutcome};
use super::Shop;
use crate::db::fence::change_stock;
use crate::db::models::Product;
use crate::db::schema::products;
use crate::db::{self, PgConn};
use crate::domain::{CustomerId, ProductId, Quantity};
use crate::error::AppError;
use crate::lock::{HeldLocks, Lease};
use crate::metrics;

/// One buyer waiting for a batch: what they asked for and where the answer goes.
pub struct BatchBuyer {
    pub customer: CustomerId,
    pub quantity: Quantity,
    pub payment_deadline: DateTime<Utc>,
    /// The stock gate's admission key, kept on the order for give-backs.
    pub gate_key: Option<String>,
}

type Answer = Result<PurchaseOutcome, AppError>;

struct Waiting {
    buyer: BatchBuyer,
    answer: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    leader_running: bool,
}

/// Per-product queues of buyers and their leaders, for one process.
pub struct Combiner {
    queues: Mutex<HashMap<ProductId, Arc<Mutex<Queue>>>>,
    max_batch: usize,
}

impl Combiner {
    pub fn new(max_batch: usize) -> Combiner {
        Combiner {
            queues: Mutex::new(HashMap::new()),
            max_batch: max_batch.max(1),
        }
    }

    fn queue(&self, product: ProductId) -> Arc<Mutex<Queue>> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.entry(product).or_default().clone()
    }
}

/// Queues `buyer` for `product` and waits for their own answer.
pub async fn buy_in_batch(shop: &Shop, product: ProductId, buyer: BatchBuyer) -> Answer {
    let combiner = shop
        .combiner
        .as_ref()
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("combining is off")))?;
    let queue = combiner.queue(product);
    let (answer, answered) = oneshot::channel();
    let must_lead = {
        let mut queue = lock(&queue);
        queue.waiting.push_back(Waiting { buyer, answer });
        !std::mem::replace(&mut queue.leader_running, true)
    };
    if must_lead {
        // Its own task: a buyer who disconnects cannot cancel a batch half way.
        tokio::spawn(lead(shop.clone(), product, queue, combiner.max_batch));
    }
    answered
        .await
        .unwrap_or_else(|_| Err(AppError::Internal(anyhow::anyhow!("the batch was lost"))))
}

fn lock(queue: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    queue.lock().unwrap_or_else(|p| p.into_inner())
}

/// The right to serve a product's queue. Stepping down happens under the
/// queue's lock when it is empty; if the leader stops any other way (a panic),
/// dropping this hands the queue back, so the next buyer to arrive leads
/// instead of waiting forever.
struct Leadership {
    queue: Arc<Mutex<Queue>>,
    leading: bool,
}

impl Leadership {
    /// Whether buyers are waiting; if not, steps down under the same lock that
    /// buyers queue under, so a buyer arriving now is sure to find no leader.
    fn still_needed(&mut self) -> bool {
        let mut queue = lock(&self.queue);
        if queue.waiting.is_empty() {
            queue.leader_running = false;
            self.leading = false;
        }
        self.leading
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if !self.leading {
            return;
        }
        let mut queue = lock(&self.queue);
        queue.leader_running = false;
        // Buyers left behind by a failed leader hear so instead of hanging.
        for waiting in queue.waiting.drain(..) {
            let _ = waiting.answer.send(Err(AppError::Internal(anyhow::anyhow!(
                "the batch leader stopped"
            ))));
        }
    }
}

async fn lead(shop: Shop, product: ProductId, queue: Arc<Mutex<Queue>>, max_batch: usize) {
    let mut leadership = Leadership {
        queue,
        leading: true,
    };
    let mut kept: Option<HeldLocks> = None;
    loop {
        let taken = match kept.take() {
            Some(held) => Ok(held),
            None => shop.locks.acquire(vec![product]).await,
        };
        let mut held = match taken {
            Ok(held) => held,
            Err(error) => {
                // Everyone queued has waited through this attempt: they all hear
                // the same (busy or unavailable), none of them was written.
                let batch: Vec<Waiting> = lock(&leadership.queue).waiting.drain(..).collect();
                for waiting in batch {
                    let _ = waiting.answer.send(Err(duplicate(&error)));
                }
                if !leadership.still_needed() {
                    return;
                }
                continue;
            }
        };
        let batch: Vec<Waiting> = {
            let mut queue = lock(&leadership.queue);
            let take = queue.waiting.len().min(max_batch);
            queue.waiting.drain(..take).collect()
        };
        let lease = held.lease();
        let (buyers, answers): (Vec<BatchBuyer>, Vec<_>) =
            batch.into_iter().map(|w| (w.buyer, w.answer)).unzip();
        let started = Instant::now();
        let pool = shop.pool.clone();
        let served_lease = lease.clone();
        let outcomes = db::run(&pool, move |conn| {
            conn.transaction(|conn| serve_batch(conn, &served_lease, product, &buyers))
        })
        .await;
        metrics::batch_size(answers.len());
        metrics::transaction_time("purchase_batch", started.elapsed());
        if let Err(AppError::Fenced { product, fence }) = &outcomes {
            shop.locks
                .after_refused_write(&lease, *product, *fence)
                .await;
        }
        let served = outcomes.is_ok();
        match outcomes {
            Ok(outcomes) => {
                for (answer, outcome) in answers.into_iter().zip(outcomes) {
                    let _ = answer.send(outcome);
                }
            }
            Err(error) => {
                for answer in answers {
                    let _ = answer.send(Err(duplicate(&error)));
                }
            }
        }
        if !leadership.still_needed() {
            held.release().await;
            return;
        }
        // More buyers queued: keep the lock for the next batch when nobody
        // else here waits for it and the run is short; else let others in.
        if served && held.hold_for_more() {
            kept = Some(held);
        } else {
            held.release().await;
        }
    }
}

/// The batch's transaction. Each buyer's answer is their own; an `Err` from
/// here (database gone, lease lost, fenced) means nothing was committed.
fn serve_batch(
    conn: &mut PgConn,
    lease: &Lease,
    product_id: ProductId,
    buyers: &[BatchBuyer],
) -> Result<Vec<Answer>, AppError> {
    let mut product: Product = products::table
        .find(product_id.get())
        .for_update()
        .select(Product::as_select())
        .first(conn)
        .optional()?
        .ok_or_else(|| AppError::NotFound(format!("There is no product with id {product_id}.")))?;
    let stock_before = product.stock;
    let now = Utc::now();
    let mut held: HashMap<CustomerId, i64> = match product.per_customer_limit {
        Some(_) => {
            let customers: Vec<CustomerId> = buyers.iter().map(|b| b.customer).collect();
            held_by_customers(conn, &customers, product_id)?
        }
        None => HashMap::new(),
    };
    let mut answers = Vec::with_capacity(buyers.len());
    for buyer in buyers {
        if let Some(refusal) = refusal_for(&product, buyer.quantity, now) {
            answers.push(Ok(refusal));
            continue;
        }
        let units = i64::from(buyer.quantity.get());
        let already = held.get(&buyer.customer).copied().unwrap_or(0);
        if let Some(limit) = product.per_customer_limit {
            if already + units > i64::from(limit) {
                answers.push(Ok(PurchaseOutcome::LimitReached {
                    product: product.name.clone(),
                    limit,
                    already,
                }));
                continue;
            }
        }
        let stock_after = product.stock - buyer.quantity.get();
        // A savepoint per buyer: if writing this buyer's rows fails, only they
        // get the error and the batch goes on without them.
        let written = conn.transaction(|conn| {
            write_order(
                conn,
                buyer.customer,
                &[(&product, buyer.quantity, stock_after)],
                buyer.payment_deadline,
                buyer.gate_key.as_deref(),
            )
        });
        match written {
            Ok(order) => {
                product.stock = stock_after;
                held.insert(buyer.customer, already + units);
                answers.push(Ok(PurchaseOutcome::Purchased(order)));
            }
            Err(error) => answers.push(Err(error)),
        }
    }
    if product.stock != stock_before {
        change_stock(conn, lease, product_id, product.stock - stock_before)?;
    }
    lease.ensure_valid()?;
    Ok(answers)
}

/// The same error for every buyer of a batch that failed as a whole.
fn duplicate(error: &AppError) -> AppError {
    match error {
        AppError::Busy => AppError::Busy,
        AppError::Unavailable(reason) => AppError::Unavailable(reason.clone()),
        AppError::Fenced { product, fence } => AppError::Fenced {
            product: *product,
            fence: *fence,
        },
        AppError::NotFound(message) => AppError::NotFound(message.clone()),
        other => AppError::Internal(anyhow::anyhow!("{other}")),
    }
}
