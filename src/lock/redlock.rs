//! Taking a product's lock from Redis, for the head of the local queue: try
//! once, and when another process holds it, sleep until that process
//! announces its release, its lease would lapse, or the wait runs out.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rslock::LockError as RedlockError;
use tokio::sync::OwnedMutexGuard;
use tokio::time::{timeout_at, Instant};

use super::fifo::ProductQueue;
use super::held::HeldLock;
use super::lease::{self, LeaseState};
use super::quorum::Holder;
use super::{LockError, ProductLocks};
use crate::domain::ProductId;

impl ProductLocks {
    /// `local_turn` is the head of `product`'s local queue; it goes into the
    /// returned lock so the next local buyer waits until that is released.
    pub(super) async fn take_from_redis(
        &self,
        product: ProductId,
        queue: &ProductQueue,
        local_turn: OwnedMutexGuard<()>,
        deadline: Instant,
    ) -> Result<HeldLock, LockError> {
        if !self.inner.distributed {
            return Ok(self.without_redis(product, local_turn));
        }
        let key = self.key(product);
        // Times in a row rslock said "unavailable" while a quorum of the
        // same servers said nobody held the key.
        let mut refused_while_free = 0;
        loop {
            // Listen before trying, so a release between our attempt and our
            // wait still wakes us.
            let released = queue.released_elsewhere.notified();
            tokio::pin!(released);
            released.as_mut().enable();

            let started = Instant::now();
            let manager = self.manager();
            match timeout_at(deadline, manager.lock(key.as_bytes(), self.inner.lease)).await {
                Err(_) => return Err(LockError::Timeout),
                Ok(Ok(lock)) => {
                    let valid_until = started + Duration::from_millis(lock.validity_time as u64);
                    let token = match self.next_token(product).await {
                        Ok(token) => token,
                        Err(error) => {
                            manager.unlock(&lock).await;
                            return Err(error);
                        }
                    };
                    let lease = Arc::new(LeaseState::new(valid_until));
                    let watchdog = lease::spawn_watchdog(&lock, self.inner.lease, &lease);
                    return Ok(HeldLock {
                        product,
                        lock: Some(lock),
                        token,
                        passes: 0,
                        taken_at: Instant::now(),
                        lease,
                        watchdog,
                        locks: self.clone(),
                        _local_turn: local_turn,
                    });
                }
                // rslock says "unavailable" both when another holder has the key
                // and when no quorum of servers answered; only the first is worth
                // waiting for, and then only as long as the holder's lease.
                Ok(Err(RedlockError::Unavailable)) => {}
                Ok(Err(error)) => return Err(LockError::Redlock(error)),
            }
            let wake_at = match self.holder_lease(&key).await? {
                Holder::For(left) => {
                    refused_while_free = 0;
                    (Instant::now() + left).min(deadline)
                }
                Holder::Forever => deadline,
                Holder::Nobody => {
                    // Once can be a holder that released in between; twice
                    // in a row is rslock's connection: after a server
                    // restarts, some errors leave rslock on a dead
                    // connection it never replaces, and every buyer would
                    // wait out the deadline behind a free lock.
                    refused_while_free += 1;
                    if refused_while_free >= 2 {
                        self.reconnect_manager();
                        refused_while_free = 0;
                    }
                    Instant::now()
                }
            };
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(wake_at) => {}
            }
            if Instant::now() >= deadline {
                return Err(LockError::Busy);
            }
        }
    }

    fn manager(&self) -> rslock::LockManager {
        self.inner
            .manager
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A new manager with new connections, for acquisitions from now on.
    fn reconnect_manager(&self) {
        match super::quorum::manager(&self.inner.redis_urls, self.inner.cluster) {
            Ok(manager) => {
                tracing::warn!("replacing the Redlock manager: its connections stopped answering");
                *self
                    .inner
                    .manager
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) = manager;
            }
            Err(error) => tracing::warn!(%error, "could not replace the Redlock manager"),
        }
    }

    // The benchmark mode (`redis_lock` off) is this file's work switched off,
    // so it lives here: the local queue still orders this process's writers,
    // the Postgres row lock orders the rest, and a counter of this process
    // stands in for the fencing tokens. Nothing in Redis, so no watchdog.
    fn without_redis(&self, product: ProductId, local_turn: OwnedMutexGuard<()>) -> HeldLock {
        HeldLock {
            product,
            lock: None,
            token: self.inner.local_tokens.fetch_add(1, Ordering::Relaxed) + 1,
            passes: 0,
            taken_at: Instant::now(),
            lease: Arc::new(LeaseState::new(Instant::now() + self.inner.lease)),
            watchdog: tokio::spawn(async {}),
            locks: self.clone(),
            _local_turn: local_turn,
        }
    }
}
