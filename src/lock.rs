//! Per-product distributed locks (Redlock via rslock).
//!
//! The Redis lock keeps instances from queueing on Postgres row locks; it is
//! not what prevents overselling (the `FOR UPDATE` re-read and the in-transaction
//! check are). Inside one process, buyers of a product first queue on a fair
//! (FIFO) async mutex, so only the head of the queue talks to Redis and the
//! lock passes to the next local buyer the moment it is released.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rslock::{LockError, LockManager};
use tokio::sync::OwnedMutexGuard;
use tokio::time::{timeout_at, Instant};

use crate::domain::ProductId;
use crate::error::AppError;
use crate::redis_node::RedisNode;

/// Re-poll Redis at most this often while another instance holds the lock.
const MAX_BACKOFF: Duration = Duration::from_millis(20);

#[derive(Clone)]
pub struct ProductLocks {
    inner: Arc<Inner>,
}

struct Inner {
    manager: LockManager,
    nodes: Vec<RedisNode>,
    local_queues: Mutex<HashMap<ProductId, Arc<tokio::sync::Mutex<()>>>>,
    key_prefix: String,
    wait: Duration,
    lease: Duration,
    /// Requests that queued for a lock: what the stock gate saves shows here.
    attempts: AtomicU64,
}

/// The locks on a set of products, held until `release`. Dropping it without
/// `release` (a panic, a cancelled future) still unlocks in the background.
pub struct HeldLocks {
    locks: Vec<HeldLock>,
}

struct HeldLock {
    lock: Option<rslock::Lock>,
    valid_until: Instant,
    manager: LockManager,
    _local_turn: OwnedMutexGuard<()>,
}

impl ProductLocks {
    /// `redis_urls` are independent servers for a Redlock quorum, or, with
    /// `cluster`, the seed nodes of one Redis Cluster (one lock per key there).
    pub fn new(
        redis_urls: &[String],
        cluster: bool,
        key_prefix: &str,
        wait: Duration,
        lease: Duration,
    ) -> anyhow::Result<ProductLocks> {
        let (mut manager, nodes) = if cluster {
            (
                LockManager::new_cluster(redis_urls.to_vec())?,
                vec![RedisNode::cluster(redis_urls)?],
            )
        } else {
            let clients = redis_urls
                .iter()
                .map(|url| redis::Client::open(url.as_str()))
                .collect::<Result<Vec<_>, _>>()?;
            let nodes = redis_urls
                .iter()
                .map(|url| RedisNode::single(url))
                .collect::<Result<Vec<_>, _>>()?;
            (LockManager::from_clients(clients), nodes)
        };
        // One attempt per call: the waiting policy (deadline, back-off) is ours,
        // and rslock's own sleeps of up to 200 ms would idle buyers behind a free lock.
        manager.set_retry(1, Duration::from_millis(1));
        Ok(ProductLocks {
            inner: Arc::new(Inner {
                manager,
                nodes,
                local_queues: Mutex::new(HashMap::new()),
                key_prefix: key_prefix.to_string(),
                wait,
                lease,
                attempts: AtomicU64::new(0),
            }),
        })
    }

    /// How many times this process has queued for product locks.
    pub fn attempts(&self) -> u64 {
        self.inner.attempts.load(Ordering::Relaxed)
    }

    pub fn key(&self, product: ProductId) -> String {
        format!("{}promotion-product:{}", self.inner.key_prefix, product)
    }

    /// Runs `work` while holding the locks of `products`, and releases them
    /// whatever `work` returns. The work runs on its own task, so a client
    /// that disconnects mid-purchase cannot cancel it between lock and unlock.
    /// `work` receives the instant at which the lease may lapse.
    pub async fn with_locks<T, W, Fut>(
        &self,
        products: Vec<ProductId>,
        work: W,
    ) -> Result<T, AppError>
    where
        W: FnOnce(Instant) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, AppError>> + Send + 'static,
        T: Send + 'static,
    {
        let locks = self.clone();
        tokio::spawn(async move {
            let held = locks.acquire(products).await?;
            let result = work(held.valid_until()).await;
            held.release().await;
            result
        })
        .await
        .map_err(|e| AppError::Internal(anyhow::anyhow!("locked task failed: {e}")))?
    }

    /// Takes every product's lock in ascending id order (so two carts never
    /// wait on each other in a cycle), within one shared wait deadline.
    pub async fn acquire(&self, mut products: Vec<ProductId>) -> Result<HeldLocks, AppError> {
        products.sort_unstable();
        products.dedup();
        self.inner.attempts.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + self.inner.wait;
        let mut held = HeldLocks {
            locks: Vec::with_capacity(products.len()),
        };
        for product in products {
            match self.acquire_one(product, deadline).await {
                Ok(lock) => held.locks.push(lock),
                Err(error) => {
                    held.release().await;
                    return Err(error);
                }
            }
        }
        Ok(held)
    }

    /// Whether a majority of the Redis servers answer PING: the same quorum a lock needs.
    pub async fn quorum_reachable(&self) -> bool {
        let pings = self.inner.nodes.iter().map(|node| node.ping());
        let answered = futures::future::join_all(pings)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count();
        answered > self.inner.nodes.len() / 2
    }

    fn local_queue(&self, product: ProductId) -> Arc<tokio::sync::Mutex<()>> {
        let mut queues = self
            .inner
            .local_queues
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        queues.entry(product).or_default().clone()
    }

    async fn acquire_one(
        &self,
        product: ProductId,
        deadline: Instant,
    ) -> Result<HeldLock, AppError> {
        let local_turn = timeout_at(deadline, self.local_queue(product).lock_owned())
            .await
            .map_err(|_| AppError::Busy)?;
        let key = self.key(product);
        let mut backoff = Duration::from_millis(1);
        loop {
            let started = Instant::now();
            match timeout_at(
                deadline,
                self.inner.manager.lock(key.as_bytes(), self.inner.lease),
            )
            .await
            {
                Err(_) => {
                    return Err(AppError::Unavailable(
                        "Redis did not answer before the lock deadline".into(),
                    ))
                }
                Ok(Ok(lock)) => {
                    let valid_until = started + Duration::from_millis(lock.validity_time as u64);
                    return Ok(HeldLock {
                        lock: Some(lock),
                        valid_until,
                        manager: self.inner.manager.clone(),
                        _local_turn: local_turn,
                    });
                }
                // rslock says "unavailable" both when another holder has the key and when
                // no quorum of servers answered; only the first is worth waiting for.
                Ok(Err(LockError::Unavailable)) => {
                    if !self.quorum_reachable().await {
                        return Err(AppError::Unavailable(
                            "too few Redis servers answered the lock request".into(),
                        ));
                    }
                }
                Ok(Err(error)) => return Err(AppError::Unavailable(format!("lock: {error}"))),
            }
            let jitter = Duration::from_micros(rand::random::<u64>() % 1000);
            if Instant::now() + backoff + jitter >= deadline {
                return Err(AppError::Busy);
            }
            tokio::time::sleep(backoff + jitter).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

impl HeldLocks {
    /// The earliest instant at which one of the leases may have lapsed.
    pub fn valid_until(&self) -> Instant {
        self.locks
            .iter()
            .map(|l| l.valid_until)
            .min()
            .unwrap_or_else(Instant::now)
    }

    pub async fn release(mut self) {
        for held in self.locks.iter_mut().rev() {
            if let Some(lock) = held.lock.take() {
                held.manager.unlock(&lock).await;
            }
        }
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            let manager = self.manager.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { manager.unlock(&lock).await });
            }
        }
    }
}

/// Refuses to commit work whose lease may already have lapsed: another holder
/// could be inside the same critical section. Called as the transaction's last step.
pub fn ensure_lease_valid(valid_until: Instant) -> Result<(), AppError> {
    const SAFETY_MARGIN: Duration = Duration::from_millis(200);
    if Instant::now() + SAFETY_MARGIN >= valid_until {
        return Err(AppError::Unavailable(
            "the product lock's lease ran out before commit".into(),
        ));
    }
    Ok(())
}
