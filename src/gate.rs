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
/// the units and remember the admission with its fingerprint.
const ADMIT: &str = r#"
local qty = tonumber(ARGV[1])
local customer = ARGV[2]
local ttl = tonumber(ARGV[3])
if qty == nil or qty < 1 or qty ~= math.floor(qty) or ttl == nil or ttl < 1 or customer == nil or customer == '' then
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
if limit > 0 then
  redis.call('INCRBY', KEYS[4], qty)
  redis.call('PEXPIRE', KEYS[4], ttl)
end
return {0, stock - qty, 0}
"#;

/// Give back an admission's units, once: only if the admission marker exists
/// and no return marker does.
const GIVE_BACK: &str = r#"
local ttl = tonumber(ARGV[1])
if ttl == nil or ttl < 1 then return -1 end
local admitted = redis.call('GET', KEYS[2])
if not admitted then return 0 end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local qty = tonumber(string.match(admitted, ':(%d+)$'))
if qty == nil then return -1 end
redis.call('SET', KEYS[3], '1', 'PX', ttl)
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], qty) end
local held = tonumber(redis.call('GET', KEYS[4]) or '0')
if held > 0 then redis.call('DECRBY', KEYS[4], math.min(held, qty)) end
return qty
"#;

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
    admit: Script,
    give_back: Script,
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
    /// the payment window plus how long replays are honoured.
    pub fn new(node: RedisNode, prefix: &str, marker_ttl: Duration) -> StockGate {
        StockGate {
            inner: Arc::new(Inner {
                node,
                prefix: prefix.to_string(),
                marker_ttl,
                admit: Script::new(ADMIT),
                give_back: Script::new(GIVE_BACK),
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
            .arg(quantity.get())
            .arg(customer.get())
            .arg(self.inner.marker_ttl.as_millis() as u64);
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
            .arg(self.inner.marker_ttl.as_millis() as u64);
        with_retry!(self, connection => invocation.invoke_async(&mut connection))
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

    /// Overwrites the gate from the database (admin resync, reconcile). Call it
    /// under the product lock, so no purchase of the product is mid-transaction.
    pub async fn overwrite(
        &self,
        product: ProductId,
        stock: i32,
        limit: Option<i32>,
    ) -> Result<(), AppError> {
        let (stock_key, limit_key) = (self.key(product, "stock"), self.key(product, "limit"));
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("SET").arg(&stock_key).arg(stock).ignore();
        pipe.cmd("SET")
            .arg(&limit_key)
            .arg(limit.unwrap_or(0))
            .ignore();
        with_retry!(self, connection => pipe.query_async::<()>(&mut connection))
    }

    pub async fn stock(&self, product: ProductId) -> Result<Option<i64>, AppError> {
        let key = self.key(product, "stock");
        with_retry!(self, connection => redis::cmd("GET").arg(&key).query_async(&mut connection))
    }
}

fn unavailable(reason: &str) -> AppError {
    AppError::Unavailable(format!("stock gate: {reason}"))
}
