//! Per-product distributed locks (Redlock via rslock), Redisson-style.
//!
//! The Redis lock keeps instances from queueing on Postgres row locks; it is
//! not what prevents overselling (the `FOR UPDATE` re-read, the in-transaction
//! check and the fencing token written with the stock are).
//!
//! Waiting costs no polling: inside one process, buyers of a product queue on a
//! fair (FIFO) async mutex, so only the head of the queue talks to Redis and the
//! lock passes to the next local buyer the moment it is released. Across
//! processes, a release is published on a Redis channel; the head of each
//! other process's queue sleeps until that message arrives, or until the
//! holder's lease would lapse if the message is lost, or until its deadline.
//!
//! While a lock is held a watchdog renews its lease, so a slow transaction
//! keeps its lock; the renewal stops at release, or for good once a renewal
//! fails (the lock is then lost and the work must not commit).
//!
//! Every acquisition also takes a fencing token that grows with each
//! acquisition of that product's lock. The stock update is written only
//! `WHERE fence < token`, so a holder that lost its lock without noticing
//! (a paused process) cannot overwrite what a later holder wrote.
//!
//! One idea per file; an acquisition passes through them in this order:
//! `fifo` (the local FIFO, and the hand-over that skips Redis), `redlock`
//! (taking the lock from Redis or waiting for its release), `fencing` (the
//! token), `lease` (the watchdog, and the check before commit), `held` (the
//! locks until released, even on a panic), `release` (unlocking in Redis,
//! and hearing other processes do it). `quorum` asks every Redis server at
//! once for all of them; `error` is what they can fail with.

mod error;
mod fencing;
mod fifo;
mod held;
mod lease;
mod quorum;
mod redlock;
mod release;

pub use error::LockError;
pub use held::HeldLocks;
pub use lease::Lease;

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Script;
use rslock::LockManager;
use tokio::time::Instant;

use crate::domain::ProductId;
use crate::error::AppError;
use crate::metrics;
use crate::redis_node::RedisNode;
use fifo::ProductQueues;

#[derive(Clone)]
pub struct ProductLocks {
    inner: Arc<Inner>,
}

struct Inner {
    /// Replaced when its connections stop answering while the servers do
    /// (see `reconnect_manager`); a lock taken before keeps the manager it
    /// was taken with for its renewals and release.
    manager: std::sync::RwLock<LockManager>,
    redis_urls: Vec<String>,
    cluster: bool,
    nodes: Vec<RedisNode>,
    queues: Arc<ProductQueues>,
    key_prefix: String,
    wait: Duration,
    lease: Duration,
    /// Requests that queued for a lock: what the stock gate saves shows here.
    attempts: AtomicU64,
    next_token: Script,
    raise_token: Script,
    release: Script,
    /// Fault injection for the fencing test: after the next acquisition, stop
    /// its watchdog and sleep this long, like a process paused mid-purchase.
    stall_after_acquire: Mutex<Option<Duration>>,
    /// False only in benchmarks that measure what the Redis lock costs: then
    /// only the in-process queue and the Postgres row lock order writers, and
    /// tokens come from this process's own counter.
    distributed: bool,
    local_tokens: AtomicI64,
    /// Dropping this stops the release listener thread.
    _stop_listener: tokio::sync::watch::Sender<()>,
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
        distributed: bool,
    ) -> anyhow::Result<ProductLocks> {
        let (manager, nodes) = quorum::connect(redis_urls, cluster)?;
        let queues = Arc::new(ProductQueues::default());
        let channel = release::channel(key_prefix);
        let stop_listener = release::spawn_listener(redis_urls, &channel, &queues)?;
        Ok(ProductLocks {
            inner: Arc::new(Inner {
                manager: std::sync::RwLock::new(manager),
                redis_urls: redis_urls.to_vec(),
                cluster,
                nodes,
                queues,
                key_prefix: key_prefix.to_string(),
                wait,
                lease,
                attempts: AtomicU64::new(0),
                next_token: Script::new(fencing::NEXT_TOKEN),
                raise_token: Script::new(fencing::RAISE_TOKEN),
                release: Script::new(release::RELEASE),
                stall_after_acquire: Mutex::new(None),
                distributed,
                local_tokens: AtomicI64::new(chrono::Utc::now().timestamp_micros()),
                _stop_listener: stop_listener,
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
    pub async fn with_locks<T, W, Fut>(
        &self,
        products: Vec<ProductId>,
        work: W,
    ) -> Result<T, AppError>
    where
        W: FnOnce(Lease) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, AppError>> + Send + 'static,
        T: Send + 'static,
    {
        let locks = self.clone();
        crate::shutdown::spawn(async move {
            let held = locks.acquire(products).await?;
            let lease = held.lease();
            let result = work(lease.clone()).await;
            if let Err(AppError::Fenced { product, fence }) = &result {
                locks.after_refused_write(&lease, *product, *fence).await;
            }
            held.release().await;
            result
        })
        .await
        .map_err(|e| AppError::Internal(anyhow::anyhow!("locked task failed: {e}")))?
    }

    /// Takes every product's lock in ascending id order (so two carts never
    /// wait on each other in a cycle), within one shared wait deadline.
    pub async fn acquire(&self, mut products: Vec<ProductId>) -> Result<HeldLocks, LockError> {
        products.sort_unstable();
        products.dedup();
        self.inner.attempts.fetch_add(1, Ordering::Relaxed);
        let queued_at = Instant::now();
        let deadline = queued_at + self.inner.wait;
        let mut held = HeldLocks {
            locks: Vec::with_capacity(products.len()),
            acquired_at: Instant::now(),
        };
        for product in products {
            match self.acquire_one(product, deadline).await {
                Ok(lock) => held.locks.push(lock),
                Err(error) => {
                    metrics::lock_wait(queued_at.elapsed(), false);
                    held.release().await;
                    return Err(error);
                }
            }
        }
        held.acquired_at = Instant::now();
        metrics::lock_wait(held.acquired_at - queued_at, true);
        self.stall_if_asked(held.locks.iter().map(|lock| &lock.watchdog))
            .await;
        Ok(held)
    }
}
