//! The lease of a held lock: until when it is known to hold, the watchdog
//! that keeps renewing it, and the check locked work makes before it commits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rslock::Lock;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

use super::{LockError, ProductLocks};
use crate::domain::ProductId;

/// Commit only with at least this much lease left: the commit itself takes time.
pub(super) const COMMIT_MARGIN: Duration = Duration::from_millis(200);

/// Until when a lock's lease is known to hold, kept current by its watchdog.
pub(super) struct LeaseState {
    valid_until: Mutex<Instant>,
    lost: AtomicBool,
}

impl LeaseState {
    pub(super) fn new(valid_until: Instant) -> LeaseState {
        LeaseState {
            valid_until: Mutex::new(valid_until),
            lost: AtomicBool::new(false),
        }
    }

    pub(super) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Whether work started now could still commit under this lease.
    pub(super) fn holds_for_commit(&self) -> bool {
        !self.is_lost() && Instant::now() + COMMIT_MARGIN < self.valid_until()
    }
}

/// What locked work needs to know about its locks: each product's fencing
/// token, and whether every lease still holds.
#[derive(Clone)]
pub struct Lease {
    pub(super) held: Arc<Vec<(ProductId, i64, Arc<LeaseState>)>>,
}

impl Lease {
    /// The fencing token of `product`'s lock; the stock write must carry it.
    pub fn token(&self, product: ProductId) -> Result<i64, LockError> {
        self.held
            .iter()
            .find(|(p, _, _)| *p == product)
            .map(|(_, token, _)| *token)
            .ok_or(LockError::NotHeld(product))
    }

    /// Refuses to commit work whose lease may already have lapsed or been lost:
    /// another holder could be inside the same critical section. Called as a
    /// transaction's last step.
    pub fn ensure_valid(&self) -> Result<(), LockError> {
        self.check()
    }

    pub(super) fn check(&self) -> Result<(), LockError> {
        let now = Instant::now();
        for (_, _, state) in self.held.iter() {
            if state.is_lost() {
                return Err(LockError::LeaseLost);
            }
            if now + COMMIT_MARGIN >= state.valid_until() {
                return Err(LockError::LeaseExpired);
            }
        }
        Ok(())
    }
}

/// Starts the watchdog of a lock just taken from Redis; aborting the handle
/// stops it.
pub(super) fn spawn_watchdog(
    lock: &Lock,
    lease: Duration,
    state: &Arc<LeaseState>,
) -> JoinHandle<()> {
    tokio::spawn(renew_lease(copy_of(lock), lease, state.clone()))
}

/// Keeps a held lock's lease from lapsing: renews it every third of the lease
/// until aborted at release. A failed renewal means the lock may be gone
/// (rslock also clears it from the servers that did answer), so the lease is
/// marked lost and renewal stops for good.
async fn renew_lease(lock: Lock, lease: Duration, state: Arc<LeaseState>) {
    let manager = lock.lock_manager.clone();
    loop {
        tokio::time::sleep(lease / 3).await;
        let started = Instant::now();
        match timeout(lease / 3, manager.extend(&lock, lease)).await {
            Ok(Ok(renewed)) => {
                *state.valid_until.lock().unwrap_or_else(|p| p.into_inner()) =
                    started + Duration::from_millis(renewed.validity_time as u64);
            }
            _ => {
                state.lost.store(true, Ordering::Release);
                tracing::warn!("lost a product lock: its lease could not be renewed");
                return;
            }
        }
    }
}

fn copy_of(lock: &Lock) -> Lock {
    Lock {
        resource: lock.resource.clone(),
        val: lock.val.clone(),
        validity_time: lock.validity_time,
        lock_manager: lock.lock_manager.clone(),
    }
}

// The fencing test's pause lives beside the watchdog because what it fakes is
// a watchdog that stopped: a process paused mid-purchase, whose lease lapses
// while it still believes it holds the lock.
impl ProductLocks {
    /// Test hook: the next acquisition stops its watchdog and stalls for
    /// `pause` before the locked work starts, as a paused process would.
    pub fn stall_next_acquisition(&self, pause: Duration) {
        *self
            .inner
            .stall_after_acquire
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(pause);
    }

    /// Plays the pause `stall_next_acquisition` asked for, once.
    pub(super) async fn stall_if_asked<'a>(
        &self,
        watchdogs: impl Iterator<Item = &'a tokio::task::JoinHandle<()>>,
    ) {
        let stall = self
            .inner
            .stall_after_acquire
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(pause) = stall {
            for watchdog in watchdogs {
                watchdog.abort();
            }
            tokio::time::sleep(pause).await;
        }
    }
}
