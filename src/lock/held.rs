//! Locks held until `release`, which passes each to the next local waiter or
//! unlocks it in Redis. Dropping them without `release` (a panic, a cancelled
//! future) still unlocks in the background. `hold_for_more`, which keeps them
//! under the hand-over rules, is in `queue`.

use std::sync::Arc;

use rslock::Lock;
use tokio::sync::OwnedMutexGuard;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::lease::LeaseState;
use super::{Lease, ProductLocks};
use crate::domain::ProductId;
use crate::metrics;

/// The locks on a set of products, held until `release`. Dropping it without
/// `release` (a panic, a cancelled future) still unlocks in the background.
pub struct HeldLocks {
    pub(super) locks: Vec<HeldLock>,
    pub(super) acquired_at: Instant,
}

pub(super) struct HeldLock {
    pub(super) product: ProductId,
    pub(super) lock: Option<Lock>,
    pub(super) token: i64,
    /// How many local holders had this Redis acquisition before this one,
    /// and when it was taken from Redis.
    pub(super) passes: i64,
    pub(super) taken_at: Instant,
    pub(super) lease: Arc<LeaseState>,
    pub(super) watchdog: JoinHandle<()>,
    pub(super) locks: ProductLocks,
    pub(super) _local_turn: OwnedMutexGuard<()>,
}

impl HeldLocks {
    pub fn lease(&self) -> Lease {
        Lease {
            held: Arc::new(
                self.locks
                    .iter()
                    .map(|l| (l.product, l.token, l.lease.clone()))
                    .collect(),
            ),
        }
    }

    pub async fn release(mut self) {
        if !self.locks.is_empty() {
            metrics::lock_hold(self.acquired_at.elapsed());
        }
        for held in self.locks.iter_mut().rev() {
            let queue = held.locks.inner.queues.get(held.product);
            if let Some(lock) = held.lock.take() {
                match held.pass_on(lock, &queue) {
                    Ok(()) => {}
                    Err(lock) => {
                        held.watchdog.abort();
                        held.locks.release_and_announce(&lock, held.product).await;
                    }
                }
            }
            queue.note_release();
        }
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        self.watchdog.abort();
        if let Some(lock) = self.lock.take() {
            let (locks, product) = (self.locks.clone(), self.product);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { locks.release_and_announce(&lock, product).await });
            }
        }
    }
}
