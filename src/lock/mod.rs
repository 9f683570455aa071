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

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use redis::Script;
use rslock::{Lock, LockError, LockManager};
use tokio::sync::{Notify, OwnedMutexGuard};
use tokio::task::JoinHandle;
use tokio::time::{timeout, timeout_at, Instant};

use crate::domain::ProductId;
use crate::error::AppError;
use crate::metrics;
use crate::redis_node::RedisNode;

/// How long a single Redis round trip of the lock protocol may take.
const REDIS_CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// Commit only with at least this much lease left: the commit itself takes time.
const COMMIT_MARGIN: Duration = Duration::from_millis(200);

/// A lock taken from Redis is passed from one local waiter to the next
/// without going back to Redis at most this many times in a row...
const MAX_LOCAL_PASSES: i64 = 256;
/// ... and for at most this long, so other instances get their turn.
const MAX_LOCAL_RUN: Duration = Duration::from_millis(50);
/// A lock parked for a local waiter that then gave up is released after this.
const PARKED_LIMIT: Duration = Duration::from_millis(100);
/// Tokens of one Redis acquisition are `base + pass`: the next acquisition's
/// base is this much higher, above every pass of the one before.
const TOKEN_STEP: i64 = 1_000;

/// Next fencing token base. A missing counter (first use, or Redis lost its
/// data) restarts at the caller's clock in microseconds times the step, which
/// is above every token handed out before, unless acquisitions outran a
/// million per second.
const NEXT_TOKEN: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SET', KEYS[1], ARGV[1]) end
return redis.call('INCRBY', KEYS[1], ARGV[2])
";

/// Raises a fencing counter to at least ARGV[1]; never lowers it.
const RAISE_TOKEN: &str = r"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
";

/// Release: delete the key only if it still holds our value (what rslock's
/// unlock does) and, in the same round trip, wake waiters in other processes.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
";

#[derive(Clone)]
pub struct ProductLocks {
    inner: Arc<Inner>,
}

struct Inner {
    manager: LockManager,
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
    local_tokens: std::sync::atomic::AtomicI64,
    /// Dropping this stops the release listener thread.
    _stop_listener: tokio::sync::watch::Sender<()>,
}

/// Per product: the in-process FIFO, and the doorbell rung when another
/// process publishes a release of the product's lock.
#[derive(Default)]
struct ProductQueue {
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Local buyers waiting for `turn`: a releasing holder passes its Redis
    /// lock straight to the next of them (no Redis round trip) when there is one.
    waiting: std::sync::atomic::AtomicUsize,
    /// The Redis lock, between a holder that passed it on and the next local
    /// holder taking it.
    parked: Mutex<Option<Passed>>,
    released_elsewhere: Notify,
    /// When this process last released the product's lock (hand-over figures).
    last_release: Mutex<Option<Instant>>,
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
struct ProductQueues(Mutex<HashMap<ProductId, Arc<ProductQueue>>>);

impl ProductQueues {
    fn get(&self, product: ProductId) -> Arc<ProductQueue> {
        let mut queues = self.0.lock().unwrap_or_else(|p| p.into_inner());
        queues.entry(product).or_default().clone()
    }

    fn ring(&self, product: ProductId) {
        let queues = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = queues.get(&product) {
            queue.released_elsewhere.notify_waiters();
        }
    }
}

/// The locks on a set of products, held until `release`. Dropping it without
/// `release` (a panic, a cancelled future) still unlocks in the background.
pub struct HeldLocks {
    locks: Vec<HeldLock>,
    acquired_at: Instant,
}

struct HeldLock {
    product: ProductId,
    lock: Option<Lock>,
    token: i64,
    /// How many local holders had this Redis acquisition before this one,
    /// and when it was taken from Redis.
    passes: i64,
    taken_at: Instant,
    lease: Arc<LeaseState>,
    watchdog: JoinHandle<()>,
    locks: ProductLocks,
    _local_turn: OwnedMutexGuard<()>,
}

/// Until when a lock's lease is known to hold, kept current by its watchdog.
struct LeaseState {
    valid_until: Mutex<Instant>,
    lost: AtomicBool,
}

impl LeaseState {
    fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What locked work needs to know about its locks: each product's fencing
/// token, and whether every lease still holds.
#[derive(Clone)]
pub struct Lease {
    held: Arc<Vec<(ProductId, i64, Arc<LeaseState>)>>,
}

impl Lease {
    /// The fencing token of `product`'s lock; the stock write must carry it.
    pub fn token(&self, product: ProductId) -> Result<i64, AppError> {
        self.held
            .iter()
            .find(|(p, _, _)| *p == product)
            .map(|(_, token, _)| *token)
            .ok_or_else(|| {
                AppError::Internal(anyhow::anyhow!(
                    "product {product} is written without holding its lock"
                ))
            })
    }

    /// Refuses to commit work whose lease may already have lapsed or been lost:
    /// another holder could be inside the same critical section. Called as a
    /// transaction's last step.
    pub fn ensure_valid(&self) -> Result<(), AppError> {
        let now = Instant::now();
        for (_, _, state) in self.held.iter() {
            if state.lost.load(Ordering::Acquire) {
                return Err(AppError::Unavailable(
                    "the product lock was lost before commit".into(),
                ));
            }
            if now + COMMIT_MARGIN >= state.valid_until() {
                return Err(AppError::Unavailable(
                    "the product lock's lease ran out before commit".into(),
                ));
            }
        }
        Ok(())
    }
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
        // One attempt per call: the waiting policy (deadline, wake-up on release)
        // is ours, and rslock's own sleeps would idle buyers behind a free lock.
        manager.set_retry(1, Duration::from_millis(1));
        let queues = Arc::new(ProductQueues::default());
        let channel = release_channel(key_prefix);
        let stop_listener = spawn_release_listener(redis_urls, &channel, &queues)?;
        Ok(ProductLocks {
            inner: Arc::new(Inner {
                manager,
                nodes,
                queues,
                key_prefix: key_prefix.to_string(),
                wait,
                lease,
                attempts: AtomicU64::new(0),
                next_token: Script::new(NEXT_TOKEN),
                raise_token: Script::new(RAISE_TOKEN),
                release: Script::new(RELEASE),
                stall_after_acquire: Mutex::new(None),
                distributed,
                local_tokens: std::sync::atomic::AtomicI64::new(
                    chrono::Utc::now().timestamp_micros(),
                ),
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

    fn fence_key(&self, product: ProductId) -> String {
        format!(
            "{}promotion-product:{}:fence",
            self.inner.key_prefix, product
        )
    }

    /// Test hook: the next acquisition stops its watchdog and stalls for
    /// `pause` before the locked work starts, as a paused process would.
    pub fn stall_next_acquisition(&self, pause: Duration) {
        *self
            .inner
            .stall_after_acquire
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(pause);
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
        tokio::spawn(async move {
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

    /// Postgres refused a stock write because the row carries a fence at or
    /// above our token. If our lease still holds, nobody else took the lock
    /// since we did, so the counter in Redis is behind the database (it lost
    /// its data and restarted on a slow clock): move it past the database so
    /// the next holder's write goes through. Otherwise we are the stale holder
    /// and the refusal was the point.
    pub async fn after_refused_write(&self, lease: &Lease, product: ProductId, fence: i64) {
        if lease.ensure_valid().is_ok() {
            tracing::warn!(%product, fence, "fencing counter was behind the database; raising it");
            let key = self.fence_key(product);
            let _ = self.raise_token(&key, fence).await;
        } else {
            tracing::warn!(%product, fence, "a stale lock holder's stock write was refused by its fencing token");
        }
    }

    /// Takes every product's lock in ascending id order (so two carts never
    /// wait on each other in a cycle), within one shared wait deadline.
    pub async fn acquire(&self, mut products: Vec<ProductId>) -> Result<HeldLocks, AppError> {
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
        let stall = self
            .inner
            .stall_after_acquire
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(pause) = stall {
            for lock in &held.locks {
                lock.watchdog.abort();
            }
            tokio::time::sleep(pause).await;
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

    async fn acquire_one(
        &self,
        product: ProductId,
        deadline: Instant,
    ) -> Result<HeldLock, AppError> {
        let queue = self.inner.queues.get(product);
        let queued_at = Instant::now();
        queue.waiting.fetch_add(1, Ordering::SeqCst);
        let turn = timeout_at(deadline, queue.turn.clone().lock_owned()).await;
        queue.waiting.fetch_sub(1, Ordering::SeqCst);
        let local_turn = turn.map_err(|_| AppError::Busy)?;
        let parked = queue
            .parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(passed) = parked {
            if !passed.lease.lost.load(Ordering::Acquire)
                && Instant::now() + COMMIT_MARGIN < passed.lease.valid_until()
            {
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
        if !self.inner.distributed {
            return Ok(HeldLock {
                product,
                lock: None,
                token: self.inner.local_tokens.fetch_add(1, Ordering::Relaxed) + 1,
                passes: 0,
                taken_at: Instant::now(),
                lease: Arc::new(LeaseState {
                    valid_until: Mutex::new(Instant::now() + self.inner.lease),
                    lost: AtomicBool::new(false),
                }),
                watchdog: tokio::spawn(async {}),
                locks: self.clone(),
                _local_turn: local_turn,
            });
        }
        let key = self.key(product);
        loop {
            // Listen before trying, so a release between our attempt and our
            // wait still wakes us.
            let released = queue.released_elsewhere.notified();
            tokio::pin!(released);
            released.as_mut().enable();

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
                    let token = match self.next_token(product).await {
                        Ok(token) => token,
                        Err(error) => {
                            self.inner.manager.unlock(&lock).await;
                            return Err(error);
                        }
                    };
                    let lease = Arc::new(LeaseState {
                        valid_until: Mutex::new(valid_until),
                        lost: AtomicBool::new(false),
                    });
                    let watchdog =
                        tokio::spawn(renew_lease(copy_of(&lock), self.inner.lease, lease.clone()));
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
                Ok(Err(LockError::Unavailable)) => {}
                Ok(Err(error)) => return Err(AppError::Unavailable(format!("lock: {error}"))),
            }
            let wake_at = match self.holder_lease(&key).await? {
                Some(left) => (Instant::now() + left).min(deadline),
                // A key without expiry is not ours to outwait: only a release wakes us.
                None => deadline,
            };
            tokio::select! {
                _ = released => {}
                _ = tokio::time::sleep_until(wake_at) => {}
            }
            if Instant::now() >= deadline {
                return Err(AppError::Busy);
            }
        }
    }

    /// How long the current holder's lease has left (the longest any server
    /// reports; `None` for a key that never expires), or `Unavailable` when
    /// too few servers answer to form a quorum.
    async fn holder_lease(&self, key: &str) -> Result<Option<Duration>, AppError> {
        let ttls = self
            .on_quorum(|mut connection| {
                let key = key.to_string();
                async move {
                    redis::cmd("PTTL")
                        .arg(key)
                        .query_async::<i64>(&mut connection)
                        .await
                }
            })
            .await
            .map_err(|_| {
                AppError::Unavailable("too few Redis servers answered the lock request".into())
            })?;
        // PTTL answers -2 for a missing key and -1 for a key without expiry.
        Ok(match ttls.into_iter().max().unwrap_or(-2) {
            -1 => None,
            left => Some(Duration::from_millis(left.max(0) as u64)),
        })
    }

    /// The next fencing token of `product`. With several independent servers,
    /// a quorum's largest counter plus one is written back to a quorum, so the
    /// next holder's quorum (which overlaps ours) reads at least our token.
    async fn next_token(&self, product: ProductId) -> Result<i64, AppError> {
        let key = self.fence_key(product);
        let epoch = chrono::Utc::now().timestamp_micros() * TOKEN_STEP;
        let script = &self.inner.next_token;
        let token = self
            .on_quorum(|mut connection| {
                let key = key.clone();
                async move {
                    script
                        .key(key)
                        .arg(epoch)
                        .arg(TOKEN_STEP)
                        .invoke_async::<i64>(&mut connection)
                        .await
                }
            })
            .await?
            .into_iter()
            .max()
            .unwrap_or_default();
        if self.inner.nodes.len() > 1 {
            self.raise_token(&key, token).await?;
        }
        Ok(token)
    }

    /// Raises the fencing counter at `key` to at least `floor` on a quorum.
    async fn raise_token(&self, key: &str, floor: i64) -> Result<(), AppError> {
        let script = &self.inner.raise_token;
        self.on_quorum(|mut connection| {
            let key = key.to_string();
            async move {
                script
                    .key(key)
                    .arg(floor)
                    .invoke_async::<i64>(&mut connection)
                    .await
            }
        })
        .await
        .map(|_| ())
    }

    /// Runs `call` on every server at once and returns the answers, or
    /// `Unavailable` unless a majority answered.
    async fn on_quorum<T, C, Fut>(&self, call: C) -> Result<Vec<T>, AppError>
    where
        C: Fn(crate::redis_node::RedisConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let calls = self.inner.nodes.iter().map(|node| {
            let call = &call;
            async move {
                let answer = timeout(REDIS_CALL_TIMEOUT, async {
                    call(node.connection().await?).await
                })
                .await;
                match answer {
                    Ok(Ok(value)) => Some(value),
                    _ => {
                        node.reset().await;
                        None
                    }
                }
            }
        });
        let answers: Vec<T> = futures::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect();
        if answers.len() > self.inner.nodes.len() / 2 {
            Ok(answers)
        } else {
            Err(AppError::Unavailable(
                "too few Redis servers answered the lock request".into(),
            ))
        }
    }

    /// Releases `lock` on every server and tells waiters in other processes
    /// that `product`'s lock is free. Best effort, like any Redlock unlock:
    /// a server that misses it lets the key expire with the lease.
    async fn release_and_announce(&self, lock: &Lock, product: ProductId) {
        let channel = release_channel(&self.inner.key_prefix);
        let script = &self.inner.release;
        let _ = self
            .on_quorum(|mut connection| {
                let channel = channel.clone();
                async move {
                    script
                        .key(&*lock.resource)
                        .arg(&*lock.val)
                        .arg(channel)
                        .arg(product.get())
                        .invoke_async::<i64>(&mut connection)
                        .await
                }
            })
            .await;
    }
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

fn release_channel(key_prefix: &str) -> String {
    format!("{key_prefix}promotion-product:released")
}

/// Subscribes to the release channel on every server (a cluster broadcasts
/// publishes to all its nodes, so any seed will do there) on a thread of its
/// own, so it outlives whichever request happened to create the locks.
/// Reconnects after errors; a lost message only costs a waiter the rest of
/// the holder's lease. Stops when the returned sender is dropped.
fn spawn_release_listener(
    redis_urls: &[String],
    channel: &str,
    queues: &Arc<ProductQueues>,
) -> anyhow::Result<tokio::sync::watch::Sender<()>> {
    let clients = redis_urls
        .iter()
        .map(|url| redis::Client::open(url.as_str()))
        .collect::<Result<Vec<_>, _>>()?;
    let (stop, stopped) = tokio::sync::watch::channel(());
    let queues = Arc::downgrade(queues);
    let channel = channel.to_string();
    std::thread::Builder::new()
        .name("lock-release-listener".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    tracing::error!(%error, "no runtime for the lock release listener");
                    return;
                }
            };
            runtime.block_on(async move {
                let listeners = clients.into_iter().map(|client| {
                    let (queues, channel, mut stopped) =
                        (queues.clone(), channel.clone(), stopped.clone());
                    async move {
                        tokio::select! {
                            _ = stopped.changed() => {}
                            _ = listen(client, channel, queues) => {}
                        }
                    }
                });
                futures::future::join_all(listeners).await;
            });
        })?;
    Ok(stop)
}

async fn listen(client: redis::Client, channel: String, queues: std::sync::Weak<ProductQueues>) {
    loop {
        let subscribed = async {
            let mut pubsub = timeout(REDIS_CALL_TIMEOUT, client.get_async_pubsub())
                .await
                .map_err(|_| anyhow::anyhow!("connect timed out"))??;
            pubsub.subscribe(&channel).await?;
            Ok::<_, anyhow::Error>(pubsub)
        }
        .await;
        if let Ok(pubsub) = subscribed {
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                let Some(queues) = queues.upgrade() else {
                    return;
                };
                if let Ok(product) = message.get_payload::<i64>() {
                    queues.ring(ProductId(product));
                }
            }
        }
        if queues.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
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
            *queue.last_release.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
    }
}

impl HeldLock {
    /// Whether this Redis acquisition may serve one more local holder.
    fn within_local_bounds(&self) -> bool {
        self.passes + 1 < MAX_LOCAL_PASSES
            && self.taken_at.elapsed() < MAX_LOCAL_RUN
            && !self.lease.lost.load(Ordering::Acquire)
            && Instant::now() + COMMIT_MARGIN < self.lease.valid_until()
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
    fn pass_on(&mut self, lock: Lock, queue: &Arc<ProductQueue>) -> Result<(), Lock> {
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
        tokio::spawn(async move {
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
