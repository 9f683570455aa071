//! Combining: one lock hold sells to many buyers of the same product.
//!
//! A flash sale sends everyone to one product, and one purchase per lock hold
//! and per commit caps the shop at the database's commit rate on one row.
//! Here buyers of a product queue in arrival order; whoever finds nobody
//! serving the queue becomes its leader, takes the product's lock once, and
//! serves up to `max_batch` queued buyers in ONE transaction: one
//! `SELECT ... FOR UPDATE`, then for each buyer in arrival order the same
//! checks as a lone purchase, then every admitted buyer's own order, item and
//! ledger row and the stock update carrying the lock's fencing token, in one
//! statement, and one commit (`sell`), which other products' batches may
//! share (`group`). Should Postgres refuse some buyer's rows, the batch is
//! served again buyer by buyer under a savepoint each, so one buyer's
//! refusal or error touches nobody else.
//! Then it answers the batch's buyers, settles their admissions at the gate
//! (`Settling`: beside the next batch, but always before the lock goes), and
//! releases the lock (or keeps it for the next batch when nobody else here
//! waits for it), so restores, carts and other instances get their turn
//! between batches, and goes again while buyers are waiting.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::group::{serve, CommitGroup};
use super::order_rows::Buyer;
use super::outcome::PurchaseOutcome;
use super::sell::Answer;
use crate::domain::{CustomerId, ProductId, Quantity};
use crate::error::AppError;
use crate::gate::Settled;
use crate::lock::HeldLocks;
use crate::services::stock_gate::settle;
use crate::services::Shop;

struct Waiting {
    /// Tells this buyer's place in line from the others'.
    id: u64,
    buyer: Buyer,
    answer: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    leader_running: bool,
}

/// Per-product queues of buyers and their leaders, for one process, and
/// the transaction their batches share.
pub struct Combiner {
    queues: Mutex<HashMap<ProductId, Arc<Mutex<Queue>>>>,
    max_batch: usize,
    arrivals: AtomicU64,
    /// None when each batch commits alone (`COMBINE_PRODUCTS=1`).
    group: Option<Arc<CommitGroup>>,
}

impl Combiner {
    /// At most `max_batch` buyers of a product per batch, and at most
    /// `max_products` products' batches per transaction.
    pub fn new(max_batch: usize, max_products: usize) -> Combiner {
        Combiner {
            queues: Mutex::new(HashMap::new()),
            max_batch: max_batch.max(1),
            arrivals: AtomicU64::new(0),
            group: CommitGroup::new(max_products).map(Arc::new),
        }
    }

    fn queue(&self, product: ProductId) -> Arc<Mutex<Queue>> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.entry(product).or_default().clone()
    }
}

/// Queues `buyer` for `product` and waits for their own answer.
pub async fn buy_in_batch(shop: &Shop, product: ProductId, buyer: Buyer) -> Answer {
    let combiner = shop
        .combiner
        .as_ref()
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("combining is off")))?;
    let queue = combiner.queue(product);
    let (answer, answered) = oneshot::channel();
    let id = combiner.arrivals.fetch_add(1, Ordering::Relaxed);
    let must_lead = {
        let mut queue = lock(&queue);
        queue.waiting.push_back(Waiting { id, buyer, answer });
        !std::mem::replace(&mut queue.leader_running, true)
    };
    if must_lead {
        // Its own task: a buyer who disconnects cannot cancel a batch half way.
        crate::serial::spawn(lead(
            shop.clone(),
            product,
            queue.clone(),
            combiner.max_batch,
            combiner.group.clone(),
        ));
    }
    // A buyer still in line after the lock wait is told the shop is busy,
    // like one who waited that long for the lock itself: taken out of the
    // line under its lock, they are sure never to be served. One already
    // taken into a batch waits for it: every step of a batch is bounded (the
    // lock wait, the statement timeout, the lease), and its answer is the
    // only one that can say whether its order was written.
    let mut answered = answered;
    let waited = tokio::time::timeout(shop.settings.lock_wait, &mut answered).await;
    let answer = match waited {
        Ok(answer) => answer,
        Err(_) => {
            let still_in_line = {
                let mut line = lock(&queue);
                let at = line.waiting.iter().position(|w| w.id == id);
                at.and_then(|at| line.waiting.remove(at)).is_some()
            };
            if still_in_line {
                return Err(AppError::Busy);
            }
            answered.await
        }
    };
    // A leader that vanished mid-batch (a panic) may still have
    // committed this buyer's order: only a lookup can tell.
    answer.unwrap_or_else(|_| {
        Err(AppError::OutcomeUnknown(
            "the batch's answer was lost".into(),
        ))
    })
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

async fn lead(
    shop: Shop,
    product: ProductId,
    queue: Arc<Mutex<Queue>>,
    max_batch: usize,
    group: Option<Arc<CommitGroup>>,
) {
    let mut leadership = Leadership {
        queue,
        leading: true,
    };
    let mut kept: Option<HeldLocks> = None;
    // Batches' settles at the gate: beside the next batch while the lock is
    // kept, all of them done before it is let go (see `Settling`).
    let mut settling = Settling::new(&shop, product);
    loop {
        let taken = match kept.take() {
            Some(held) => Ok(held),
            None => shop
                .locks
                .acquire(vec![product])
                .await
                .map_err(AppError::from),
        };
        let mut held = match taken {
            Ok(held) => held,
            Err(error) => {
                // Everyone queued has waited through this attempt: they all hear
                // the same (busy or unavailable), none of them was written.
                let batch: Vec<Waiting> = lock(&leadership.queue).waiting.drain(..).collect();
                for waiting in batch {
                    let _ = waiting.answer.send(Err(error.duplicate()));
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
        if batch.is_empty() {
            // Everyone in line gave up waiting while the lock was taken.
            if !leadership.still_needed() {
                settling.finish(Vec::new()).await;
                held.release().await;
                return;
            }
            kept = Some(held);
            continue;
        }
        let (buyers, answers): (Vec<Buyer>, Vec<_>) =
            batch.into_iter().map(|w| (w.buyer, w.answer)).unzip();
        let admissions: Vec<Option<(String, CustomerId, Quantity)>> = buyers
            .iter()
            .map(|b| b.gate_key.clone().map(|key| (key, b.customer, b.quantity)))
            .collect();
        let buyers = Arc::new(buyers);
        let mut outcomes = serve(&shop, group.as_ref(), &held, product, &buyers).await;
        if let Err(AppError::Fenced { product, fence }) = &outcomes {
            // Refused only because the fencing counter was behind the row (a
            // Redis that lost its data): nothing was written, so the batch is
            // served again under a fresh acquisition, whose token is past it.
            if shop
                .locks
                .after_refused_write(&held.lease(), *product, *fence)
                .await
            {
                settling.finish(Vec::new()).await;
                held.release().await;
                held = match shop.locks.acquire(vec![*product]).await {
                    Ok(held) => held,
                    Err(error) => {
                        let error = AppError::from(error);
                        for answer in answers {
                            let _ = answer.send(Err(error.duplicate()));
                        }
                        if !leadership.still_needed() {
                            return;
                        }
                        continue;
                    }
                };
                outcomes = serve(&shop, group.as_ref(), &held, *product, &buyers).await;
            }
        }
        let served = outcomes.is_ok();
        let mut written = Written::new();
        match outcomes {
            Ok(outcomes) => {
                written = admissions
                    .into_iter()
                    .zip(&outcomes)
                    .filter(|(_, outcome)| matches!(outcome, Ok(PurchaseOutcome::Purchased(_))))
                    .filter_map(|(admission, _)| admission)
                    .collect();
                // Answered as soon as the commit is: the gate's bookkeeping
                // below changes nothing a buyer is told.
                for (answer, outcome) in answers.into_iter().zip(outcomes) {
                    let _ = answer.send(outcome);
                }
            }
            Err(error) => {
                for answer in answers {
                    let _ = answer.send(Err(error.duplicate()));
                }
            }
        }
        if !leadership.still_needed() {
            settling.finish(written).await;
            held.release().await;
            return;
        }
        // More buyers queued: keep the lock for the next batch when nobody
        // else here waits for it and the run is short; else let others in.
        if served && held.hold_for_more() {
            settling.beside_next_batch(written);
            kept = Some(held);
        } else {
            settling.finish(written).await;
            held.release().await;
        }
    }
}

/// A batch's written admissions at the gate: (admission, customer, units).
type Written = Vec<(String, CustomerId, Quantity)>;

/// The batches' settles at the gate (`stock_gate::settle`), which must run
/// under the product lock, so that a resync (which takes the lock) never
/// counts a written order as pending too. A batch followed by another under
/// the same lock settles on a task of its own, beside that next batch (they
/// remove different entries, so their order does not matter); before the
/// lock is let go, the leader waits for those and settles the last batch
/// itself (a lock is kept for a bounded run of batches, see
/// `HeldLocks::hold_for_more`).
struct Settling {
    shop: Shop,
    product: ProductId,
    in_flight: Vec<tokio::task::JoinHandle<()>>,
}

impl Settling {
    fn new(shop: &Shop, product: ProductId) -> Settling {
        Settling {
            shop: shop.clone(),
            product,
            in_flight: Vec::new(),
        }
    }

    /// Settles `written` in the background, while the lock stays held.
    fn beside_next_batch(&mut self, written: Written) {
        if written.is_empty() {
            return;
        }
        let (shop, product) = (self.shop.clone(), self.product);
        // A tracked task: a graceful stop waits for it like for the batch.
        self.in_flight.push(crate::shutdown::spawn(async move {
            settle_written(&shop, product, &written).await;
        }));
    }

    /// Before the lock goes: waits for every settle in flight (each is best
    /// effort: one that failed was logged, and its entries age out), then
    /// settles `written`, the last batch's.
    async fn finish(&mut self, written: Written) {
        for task in self.in_flight.drain(..) {
            if let Err(error) = task.await {
                tracing::error!(%error, "a gate settle task failed; its entries will age out");
            }
        }
        settle_written(&self.shop, self.product, &written).await;
    }
}

async fn settle_written(shop: &Shop, product: ProductId, written: &Written) {
    let settled: Vec<Settled> = written
        .iter()
        .map(|(admission, customer, quantity)| Settled {
            admission,
            customer: *customer,
            quantity: *quantity,
        })
        .collect();
    settle(shop, product, &settled).await;
}
