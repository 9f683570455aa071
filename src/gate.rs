//! The Redis stock gate: a per-product counter in front of Postgres that
//! turns away sold-out and over-limit buyers in one Lua call, without the
//! product lock or a database connection. It may refuse early; it never
//! sells: every admitted buyer is still decided by the locked transaction.
//!
//! Every key of a product carries the hash tag `{product:ID}`, so each
//! script touches one slot and runs unchanged on Redis Cluster.

use std::sync::Arc;
use std::time::Duration;

use redis::Script;

use crate::domain::{CustomerId, ProductId, Quantity};
use crate::error::AppError;
use crate::metrics;
use crate::redis_node::{RedisConnection, RedisNode};

/// Admit, in this order: a repeat of an admitted key gets its earlier answer
/// (before any stock check, so a repeat never takes stock); the customer's
/// limit; an unknown stock key means no; too little stock means no; else take
/// the units, remember the admission with its fingerprint, and list it as
/// pending (admitted, not yet written to Postgres nor given back) with the
/// time it was admitted.
const ADMIT: &str = r#"
local qty = tonumber(ARGV[1])
local customer = ARGV[2]
local ttl = tonumber(ARGV[3])
local admission = ARGV[4]
if qty == nil or qty < 1 or qty ~= math.floor(qty) or ttl == nil or ttl < 1 or customer == nil or customer == '' or admission == nil or admission == '' then
  return {-1, 0}
end
local fingerprint = customer .. ':' .. qty
local earlier = redis.call('GET', KEYS[3])
if earlier then
  if earlier == fingerprint then return {1, 0, 0} end
  return {4, 0, 0}
end
local limit = tonumber(redis.call('GET', KEYS[2]) or '0')
if limit > 0 then
  local held = tonumber(redis.call('GET', KEYS[4]) or '0')
  if held + qty > limit then return {3, held, limit} end
end
local stock = redis.call('GET', KEYS[1])
if not stock then return {5, 0, 0} end
stock = tonumber(stock)
if stock < qty then return {2, stock, 0} end
redis.call('DECRBY', KEYS[1], qty)
redis.call('SET', KEYS[3], fingerprint, 'PX', ttl)
local now = redis.call('TIME')
redis.call('ZADD', KEYS[5], tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000), admission .. '|' .. qty)
redis.call('PEXPIRE', KEYS[5], ttl)
if limit > 0 then
  redis.call('INCRBY', KEYS[4], qty)
  redis.call('PEXPIRE', KEYS[4], ttl)
end
return {0, stock - qty, 0}
"#;

/// Give back an admission's units, once: only if the admission marker exists
/// and no return marker does. It is no longer pending.
const GIVE_BACK: &str = r#"
local ttl = tonumber(ARGV[1])
local admission = ARGV[2]
if ttl == nil or ttl < 1 or admission == nil then return -1 end
local admitted = redis.call('GET', KEYS[2])
if not admitted then return 0 end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local qty = tonumber(string.match(admitted, ':(%d+)$'))
if qty == nil then return -1 end
redis.call('SET', KEYS[3], '1', 'PX', ttl)
redis.call('ZREM', KEYS[5], admission .. '|' .. qty)
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], qty) end
local held = tonumber(redis.call('GET', KEYS[4]) or '0')
if held > 0 then redis.call('DECRBY', KEYS[4], math.min(held, qty)) end
return qty
"#;

/// Sets the gate from the database: the stock Postgres holds less the units
/// of admissions still pending, after dropping pending admissions older than
/// the longest a live one can take (their buyer is gone: a crash, a lost
/// give-back), so their units come back. Returns the stock before (-1 if
/// there was none), the stock now, and the pending units counted.
const RESYNC: &str = r#"
local stock = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local stale = tonumber(ARGV[3])
if stock == nil or limit == nil or stale == nil then return {-2, 0, 0} end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now_ms - stale))
local pending = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  pending = pending + (tonumber(string.match(member, '|(%d+)$')) or 0)
end
local before = tonumber(redis.call('GET', KEYS[1]) or '-1')
local now_stock = math.max(0, stock - pending)
redis.call('SET', KEYS[1], now_stock)
redis.call('SET', KEYS[2], limit)
return {before, now_stock, pending}
"#;

/// What a resync found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resynced {
    /// The gate's stock before; None when it had no stock key.
    pub before: Option<i64>,
    /// The gate's stock now: the database's less the pending units.
    pub after: i64,
    /// Units of admissions still on their way to Postgres.
    pub pending: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// This key was admitted before with the same request: no stock taken again.
    Repeat,
    SoldOut {
        available: i64,
    },
    LimitReached {
        held: i64,
        limit: i64,
    },
    /// This key was admitted before for a different request.
    Conflict,
    /// The gate has no stock key for the product (never seeded, or lost).
    Unknown,
}

impl Admission {
    /// The `decision` label of `flashsale_gate_decisions_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Admission::Admitted => "admitted",
            Admission::Repeat => "repeat",
            Admission::SoldOut { .. } => "sold_out",
            Admission::LimitReached { .. } => "limit_reached",
            Admission::Conflict => "conflict",
            Admission::Unknown => "unknown",
        }
    }
}

#[derive(Clone)]
pub struct StockGate {
    inner: Arc<Inner>,
}

struct Inner {
    node: RedisNode,
    prefix: String,
    marker_ttl: Duration,
    /// Longer than any live admission can take to be written or given back.
    pending_ttl: Duration,
    admit: Script,
    give_back: Script,
    resync: Script,
    /// One lazy seeding at a time in this process, so a burst of buyers of an
    /// unseeded product queues here instead of on the product lock.
    seeding: tokio::sync::Mutex<()>,
}

const TIMEOUT: Duration = Duration::from_secs(1);

/// Runs one gate call, once more on a fresh connection if the first lost its connection.
macro_rules! with_retry {
    ($gate:expr, $connection:ident => $call:expr) => {{
        let mut answer = None;
        for attempt in 0..2 {
            let mut $connection = $gate.connection().await?;
            match $gate.guard($call).await {
                Err((true, _)) if attempt == 0 => continue,
                Err((_, error)) => {
                    answer = Some(Err(error));
                    break;
                }
                Ok(value) => {
                    answer = Some(Ok(value));
                    break;
                }
            }
        }
        answer.expect("the loop always answers")
    }};
}

impl StockGate {
    /// `marker_ttl` must outlive any order that may still give units back:
    /// the payment window plus how long replays are honoured. `pending_ttl`
    /// must outlast the longest a live admission takes to reach Postgres
    /// (lock wait plus transaction), so only abandoned ones count as lost.
    pub fn new(
        node: RedisNode,
        prefix: &str,
        marker_ttl: Duration,
        pending_ttl: Duration,
    ) -> StockGate {
        StockGate {
            inner: Arc::new(Inner {
                node,
                prefix: prefix.to_string(),
                marker_ttl,
                pending_ttl,
                admit: Script::new(ADMIT),
                give_back: Script::new(GIVE_BACK),
                resync: Script::new(RESYNC),
                seeding: tokio::sync::Mutex::new(()),
            }),
        }
    }

    fn key(&self, product: ProductId, part: &str) -> String {
        format!("{}gate:{{product:{}}}:{}", self.inner.prefix, product, part)
    }

    /// Serialises lazy seeding within this process.
    pub async fn seeding_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.inner.seeding.lock().await
    }

    /// Whether the gate's Redis answers a PING (readiness probe).
    pub async fn reachable(&self) -> bool {
        self.inner.node.ping().await
    }

    pub fn stock_key(&self, product: ProductId) -> String {
        self.key(product, "stock")
    }

    async fn connection(&self) -> Result<RedisConnection, AppError> {
        self.inner
            .node
            .connection()
            .await
            .map_err(|e| unavailable(&e.to_string()))
    }

    /// Bounds one command or script in time; a failed connection is dropped
    /// so the next call reconnects. Says whether the connection was lost (worth
    /// one retry: every gate call is idempotent, the admit script by its key).
    async fn guard<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, (bool, AppError)> {
        match tokio::time::timeout(TIMEOUT, call).await {
            Ok(Ok(value)) => Ok(value),
            failure => {
                self.inner.node.reset().await;
                Err(match failure {
                    Ok(Err(e)) => (
                        e.is_io_error() || e.is_connection_dropped(),
                        unavailable(&e.to_string()),
                    ),
                    _ => (false, unavailable("no answer in time")),
                })
            }
        }
    }

    pub async fn admit(
        &self,
        product: ProductId,
        customer: CustomerId,
        quantity: Quantity,
        admission: &str,
    ) -> Result<Admission, AppError> {
        let mut invocation = self.inner.admit.prepare_invoke();
        invocation
            .key(self.key(product, "stock"))
            .key(self.key(product, "limit"))
            .key(self.key(product, &format!("adm:{admission}")))
            .key(self.key(product, &format!("cust:{customer}")))
            .key(self.key(product, "pending"))
            .arg(quantity.get())
            .arg(customer.get())
            .arg(self.inner.marker_ttl.as_millis() as u64)
            .arg(admission);
        let answer: Result<(i64, i64, i64), AppError> =
            with_retry!(self, connection => invocation.invoke_async(&mut connection));
        let admission = answer.and_then(|(code, value, limit)| match code {
            0 => Ok(Admission::Admitted),
            1 => Ok(Admission::Repeat),
            2 => Ok(Admission::SoldOut { available: value }),
            3 => Ok(Admission::LimitReached { held: value, limit }),
            4 => Ok(Admission::Conflict),
            5 => Ok(Admission::Unknown),
            _ => Err(AppError::Internal(anyhow::anyhow!(
                "the gate refused its arguments"
            ))),
        });
        metrics::gate_decision(match &admission {
            Ok(admission) => admission.metric_label(),
            Err(_) => "error",
        });
        admission
    }

    /// Gives an admission's units back; idempotent. Returns how many came back.
    pub async fn give_back(
        &self,
        product: ProductId,
        customer: CustomerId,
        admission: &str,
    ) -> Result<i64, AppError> {
        let mut invocation = self.inner.give_back.prepare_invoke();
        invocation
            .key(self.key(product, "stock"))
            .key(self.key(product, &format!("adm:{admission}")))
            .key(self.key(product, &format!("ret:{admission}")))
            .key(self.key(product, &format!("cust:{customer}")))
            .key(self.key(product, "pending"))
            .arg(self.inner.marker_ttl.as_millis() as u64)
            .arg(admission);
        with_retry!(self, connection => invocation.invoke_async(&mut connection))
    }

    /// Admissions whose orders are now in Postgres are no longer pending.
    /// Call it under the product lock, before releasing it, so a resync
    /// (which takes the lock) never counts a written order as pending too.
    pub async fn settle(
        &self,
        product: ProductId,
        admissions: &[(&str, Quantity)],
    ) -> Result<(), AppError> {
        if admissions.is_empty() {
            return Ok(());
        }
        let key = self.key(product, "pending");
        let mut command = redis::cmd("ZREM");
        command.arg(&key);
        for (admission, quantity) in admissions {
            command.arg(format!("{admission}|{}", quantity.get()));
        }
        with_retry!(self, connection => command.query_async::<i64>(&mut connection)).map(|_| ())
    }

    /// Seeds a product's gate from the database's current stock unless it is
    /// already there: a restart or a second instance never resets what was sold.
    /// The limit is always refreshed (an admin may have changed it).
    pub async fn seed_if_absent(
        &self,
        product: ProductId,
        stock: i32,
        limit: Option<i32>,
    ) -> Result<bool, AppError> {
        let (stock_key, limit_key) = (self.key(product, "stock"), self.key(product, "limit"));
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("SET")
            .arg(&stock_key)
            .arg(stock)
            .arg("NX");
        pipe.cmd("SET")
            .arg(&limit_key)
            .arg(limit.unwrap_or(0))
            .ignore();
        let (created,): (Option<String>,) =
            with_retry!(self, connection => pipe.query_async(&mut connection))?;
        Ok(created.is_some())
    }

    /// Sets the gate from the database's stock and limit (admin resync,
    /// reconcile, admin adjustments), less the units of admissions still on
    /// their way to Postgres. Call it under the product lock, so no purchase
    /// of the product is mid-transaction.
    pub async fn overwrite(
        &self,
        product: ProductId,
        stock: i32,
        limit: Option<i32>,
    ) -> Result<Resynced, AppError> {
        let mut invocation = self.inner.resync.prepare_invoke();
        invocation
            .key(self.key(product, "stock"))
            .key(self.key(product, "limit"))
            .key(self.key(product, "pending"))
            .arg(stock)
            .arg(limit.unwrap_or(0))
            .arg(self.inner.pending_ttl.as_millis() as u64);
        let (before, after, pending): (i64, i64, i64) =
            with_retry!(self, connection => invocation.invoke_async(&mut connection))?;
        if before < -1 {
            return Err(AppError::Internal(anyhow::anyhow!(
                "the gate refused its resync arguments"
            )));
        }
        Ok(Resynced {
            before: (before >= 0).then_some(before),
            after,
            pending,
        })
    }

    pub async fn stock(&self, product: ProductId) -> Result<Option<i64>, AppError> {
        let key = self.key(product, "stock");
        with_retry!(self, connection => redis::cmd("GET").arg(&key).query_async(&mut connection))
    }
}

fn unavailable(reason: &str) -> AppError {
    AppError::Unavailable(format!("stock gate: {reason}"))
}
