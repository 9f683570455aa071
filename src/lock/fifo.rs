//! Inside one process, buyers of a product queue on a fair FIFO mutex, so
//! only the head of the queue talks to Redis. A holder that releases while
//! another local buyer waits hands its Redis lock straight over (no Redis
//! round trip), within bounds, so other instances still get their turn.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rslock::Lock;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{timeout_at, Instant};

use super::held::HeldLock;
use super::lease::LeaseState;
use super::{HeldLocks, LockError, ProductLocks};
use crate::domain::ProductId;
use crate::metrics;

/// A lock taken from Redis is passed from one local waiter to the next
/// without going back to Redis at most this many times in a row...
const MAX_LOCAL_PASSES: i64 = 256;
/// ... and for at most this long, so other instances get their turn.
const MAX_LOCAL_RUN: Duration = Duration::from_millis(50);
/// A lock parked for a local waiter that then gave up is released after this.
const PARKED_LIMIT: Duration = Duration::from_millis(100);

/// Per product: the in-process FIFO, and the doorbell rung when another
/// process publishes a release of the product's lock.
#[derive(Default)]
pub(super) struct ProductQueue {
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Local buyers waiting for `turn`: a releasing holder passes its Redis
    /// lock straight to the next of them (no Redis round trip) when there is one.
    waiting: AtomicUsize,
    /// The Redis lock, between a holder that passed it on and the next local
    /// holder taking it.
    parked: Mutex<Option<Passed>>,
    pub(super) released_elsewhere: Notify,
    /// When this process last released the product's lock (hand-over figures).
    last_release: Mutex<Option<Instant>>,
}

impl ProductQueue {
    pub(super) fn note_release(&self) {
        *self.last_release.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }
}

/// A Redis lock on its way from one local holder to the next.
struct Passed {
    lock: Lock,
    token: i64,
    passes: i64,
    taken_at: Instant,
    lease: Arc<LeaseState>,
    watchdog: JoinHandle<()>,
}

#[derive(Default)]
pub(super) struct ProductQueues(Mutex<HashMap<ProductId, Arc<ProductQueue>>>);

impl ProductQueues {
    pub(super) fn get(&self, product: ProductId) -> Arc<ProductQueue> {
        let mut queues = self.0.lock().unwrap_or_else(|p| p.into_inner());
        queues.entry(product).or_default().clone()
    }

    pub(super) fn ring(&self, product: ProductId) {
        let queues = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = queues.get(&product) {
            queue.released_elsewhere.notify_waiters();
        }
    }
}

impl ProductLocks {
    /// Waits for `product`'s local turn, then takes the lock the previous
    /// local holder parked, or else goes to Redis for it.
    pub(super) async fn acquire_one(
        &self,
        product: ProductId,
        deadline: Instant,
    ) -> Result<HeldLock, LockError> {
        let queue = self.inner.queues.get(product);
        let queued_at = Instant::now();
        queue.waiting.fetch_add(1, Ordering::SeqCst);
        let turn = timeout_at(deadline, queue.turn.clone().lock_owned()).await;
        queue.waiting.fetch_sub(1, Ordering::SeqCst);
        let local_turn = turn.map_err(|_| LockError::Busy)?;
        let parked = queue
            .parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(passed) = parked {
            if passed.lease.holds_for_commit() {
                return Ok(HeldLock {
                    product,
                    lock: Some(passed.lock),
                    token: passed.token + 1,
                    passes: passed.passes + 1,
                    taken_at: passed.taken_at,
                    lease: passed.lease,
                    watchdog: passed.watchdog,
                    locks: self.clone(),
                    _local_turn: local_turn,
                });
            }
            passed.watchdog.abort();
            self.release_and_announce(&passed.lock, product).await;
        }
        let released = *queue.last_release.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(released) = released.filter(|&r| r > queued_at) {
            // We waited behind a local holder: how long the lock sat between us.
            metrics::lock_handover(released.elapsed());
        }
        self.take_from_redis(product, &queue, local_turn, deadline)
            .await
    }
}

impl HeldLocks {
    /// Lets the same holder go on to another round of work without releasing:
    /// only while no one else in this process waits for these products and
    /// the run stays within the local-passing bounds. Each kept lock's token
    /// grows by one, as on a local hand-over. Returns false (nothing changed)
    /// when the locks should be released instead.
    pub fn hold_for_more(&mut self) -> bool {
        if !self.locks.iter().all(HeldLock::may_keep) {
            return false;
        }
        for held in &mut self.locks {
            held.token += 1;
            held.passes += 1;
        }
        true
    }
}

impl HeldLock {
    /// Whether this Redis acquisition may serve one more local holder.
    fn within_local_bounds(&self) -> bool {
        self.passes + 1 < MAX_LOCAL_PASSES
            && self.taken_at.elapsed() < MAX_LOCAL_RUN
            && self.lease.holds_for_commit()
    }

    fn may_keep(&self) -> bool {
        let queue = self.locks.inner.queues.get(self.product);
        self.lock.is_some()
            && queue.waiting.load(Ordering::SeqCst) == 0
            && self.within_local_bounds()
    }

    /// Parks the Redis lock for the next local waiter, if one is waiting and
    /// this acquisition has not been passed around too often or too long;
    /// otherwise hands it back to be released in Redis.
    pub(super) fn pass_on(&mut self, lock: Lock, queue: &Arc<ProductQueue>) -> Result<(), Lock> {
        let worth_passing = queue.waiting.load(Ordering::SeqCst) > 0 && self.within_local_bounds();
        if !worth_passing {
            return Err(lock);
        }
        let token = self.token;
        let watchdog = std::mem::replace(&mut self.watchdog, tokio::spawn(async {}));
        *queue.parked.lock().unwrap_or_else(|p| p.into_inner()) = Some(Passed {
            lock,
            token,
            passes: self.passes,
            taken_at: self.taken_at,
            lease: self.lease.clone(),
            watchdog,
        });
        // The waiter may give up before its turn comes: then nobody takes the
        // parked lock, and it is released here instead of renewed forever.
        let (locks, queue, product) = (self.locks.clone(), queue.clone(), self.product);
        crate::shutdown::spawn(async move {
            tokio::time::sleep(PARKED_LIMIT).await;
            let stranded = {
                let mut parked = queue.parked.lock().unwrap_or_else(|p| p.into_inner());
                match parked.as_ref() {
                    Some(passed) if passed.token == token => parked.take(),
                    _ => None,
                }
            };
            if let Some(passed) = stranded {
                passed.watchdog.abort();
                locks.release_and_announce(&passed.lock, product).await;
            }
        });
        Ok(())
    }
}
