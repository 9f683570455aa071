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

mod scripts;

use crate::domain::{CustomerId, ProductId, Quantity, Refusal};
use crate::error::AppError;
use crate::metrics;
use crate::redis_batch::{answer_of, Batches, Driver};
use crate::redis_node::{RedisConnection, RedisNode};

/// What a resync found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resynced {
    /// The gate's stock before; None when it had no stock key.
    pub before: Option<i64>,
    /// The gate's stock now: the database's less the pending units.
    pub after: i64,
    /// Units of admissions still on their way to Postgres.
    pub pending: i64,
    /// Customers whose holdings the gate had wrong (a lost give-back).
    pub customers_corrected: i64,
}

/// An admission whose order is now in Postgres.
#[derive(Debug, Clone, Copy)]
pub struct Settled<'a> {
    pub admission: &'a str,
    pub customer: CustomerId,
    pub quantity: Quantity,
}

#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The request's idempotency key was used for a different request.
    KeyReused,
    /// The request under this key was refused before: the same answer again.
    RefusedBefore(Refusal),
    /// The request under this key was admitted `age` ago as `admission`: its
    /// order is in Postgres, on its way there, or was abandoned.
    AdmittedBefore {
        admission: String,
        age: Duration,
    },
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
            Admission::KeyReused => "key_reused",
            Admission::RefusedBefore(_) => "refused_before",
            Admission::AdmittedBefore { .. } => "admitted_before",
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
    /// ADMIT, for the buyers of one product gathered by `redis_batch`.
    admit: Script,
    admissions: Batches<Buyer, AdmitReply>,
    record_refusal: Script,
    forget_admission: Script,
    give_back: Script,
    resync: Script,
    /// One lazy seeding at a time in this process, so a burst of buyers of an
    /// unseeded product queues here instead of on the product lock.
    seeding: tokio::sync::Mutex<()>,
}

const TIMEOUT: Duration = Duration::from_secs(1);
/// Admissions one script call takes at most: a few hundred microseconds of
/// Redis's time, so a batch never holds up other callers for long.
const MAX_BATCH: usize = 64;

/// One buyer's answer from ADMIT: code, two numbers and a text.
type AdmitReply = (i64, i64, i64, String);

/// One buyer's part of an ADMIT call: what is not the product's.
struct Buyer {
    marker_key: String,
    return_key: String,
    /// The request's answer record, with its fingerprint and how long a
    /// refusal is kept (ms); None for a request without an idempotency key.
    answer: Option<(String, String, u64)>,
    quantity: i32,
    customer: i64,
    admission: String,
}

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
                admit: Script::new(scripts::ADMIT),
                admissions: Batches::default(),
                record_refusal: Script::new(scripts::RECORD_REFUSAL),
                forget_admission: Script::new(scripts::FORGET_ADMISSION),
                give_back: Script::new(scripts::GIVE_BACK),
                resync: Script::new(scripts::RESYNC),
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
    /// one retry: every gate call is idempotent, the admit script by its
    /// admission key, which its answer record also names).
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

    /// Admits `quantity` units for `customer` as `admission`. With `answer`
    /// (the request's idempotency key), the gate also keeps the request's
    /// answer: a refusal is recorded in the same step, and a repeat of the
    /// key is answered from that record (see `ADMIT`).
    pub async fn admit(
        &self,
        product: ProductId,
        customer: CustomerId,
        quantity: Quantity,
        admission: &str,
        answer: Option<&AnswerRecord<'_>>,
    ) -> Result<Admission, AppError> {
        let buyer = Buyer {
            marker_key: self.key(product, &format!("adm:{admission}")),
            return_key: self.key(product, &format!("ret:{admission}")),
            answer: answer.map(|answer| {
                (
                    self.answer_key(product, customer, answer.key),
                    answer.fingerprint.to_string(),
                    answer.refusal_retention.as_millis().max(1) as u64,
                )
            }),
            quantity: quantity.get(),
            customer: customer.get(),
            admission: admission.to_string(),
        };
        let queued = self.inner.admissions.enqueue(product, buyer);
        if let Some(driver) = queued.drive {
            crate::shutdown::spawn(self.clone().send_admissions(driver));
        }
        let answer = answer_of(queued.answer, "stock gate").await;
        let admission = answer.and_then(|(code, value, limit, text)| match code {
            0 => Ok(Admission::Admitted),
            1 => Ok(Admission::Repeat),
            2 => Ok(Admission::SoldOut { available: value }),
            3 => Ok(Admission::LimitReached { held: value, limit }),
            4 => Ok(Admission::Conflict),
            5 => Ok(Admission::Unknown),
            6 => Ok(Admission::KeyReused),
            7 => recorded_refusal(&text).map(Admission::RefusedBefore),
            8 => Ok(Admission::AdmittedBefore {
                admission: text,
                age: Duration::from_millis(value.max(0) as u64),
            }),
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

    /// Sends a product's queued admissions, a batch at a time, until none
    /// wait (see `redis_batch`).
    async fn send_admissions(self, mut driver: Driver<Buyer, AdmitReply>) {
        let product = driver.product();
        while let Some(batch) = driver.next_batch(MAX_BATCH) {
            metrics::redis_batch("admit", batch.items.len());
            let invocation = self.admit_invocation(product, &batch.items);
            let answers = async {
                with_retry!(self, connection => invocation.invoke_async::<Vec<String>>(&mut connection))
            }
            .await
            .and_then(|texts| texts.iter().map(|text| admit_reply(text)).collect());
            batch.answer(answers);
        }
    }

    fn admit_invocation<'a>(
        &'a self,
        product: ProductId,
        buyers: &[Buyer],
    ) -> redis::ScriptInvocation<'a> {
        let mut invocation = self.inner.admit.prepare_invoke();
        invocation
            .key(self.key(product, "stock"))
            .key(self.key(product, "limit"))
            .key(self.key(product, "held"))
            .key(self.key(product, "pending"))
            .arg(buyers.len())
            .arg(self.inner.marker_ttl.as_millis() as u64)
            .arg(self.inner.marker_ttl.as_millis() as u64);
        for buyer in buyers {
            let (record_key, fingerprint, refusal_ttl) = match &buyer.answer {
                Some((key, fingerprint, ttl)) => (key, fingerprint.as_str(), *ttl),
                None => (&buyer.marker_key, "", 1),
            };
            invocation
                .key(&buyer.marker_key)
                .key(&buyer.return_key)
                .key(record_key)
                .arg(buyer.quantity)
                .arg(buyer.customer)
                .arg(&buyer.admission)
                .arg(fingerprint)
                .arg(refusal_ttl);
        }
        invocation
    }

    fn answer_key(&self, product: ProductId, customer: CustomerId, key: &str) -> String {
        self.key(product, &format!("ans:{customer}:{key}"))
    }

    /// The request admitted as `admission` under `answer` was refused in
    /// Postgres: its replays get `refusal` too. Does nothing once the record
    /// names another admission.
    pub async fn record_refusal(
        &self,
        product: ProductId,
        customer: CustomerId,
        answer: &AnswerRecord<'_>,
        admission: &str,
        refusal: &Refusal,
    ) -> Result<bool, AppError> {
        let json = serde_json::to_string(refusal)
            .map_err(|e| AppError::Internal(anyhow::anyhow!("refusal as JSON: {e}")))?;
        let mut invocation = self.inner.record_refusal.prepare_invoke();
        invocation
            .key(self.answer_key(product, customer, answer.key))
            .arg(admission)
            .arg(json)
            .arg(answer.refusal_retention.as_millis().max(1) as u64);
        let recorded: i64 =
            with_retry!(self, connection => invocation.invoke_async(&mut connection))?;
        Ok(recorded == 1)
    }

    /// The request admitted as `admission` under `key` changed nothing: its
    /// answer record goes, so the same form may be sent again. Does nothing
    /// once the record names another admission.
    pub async fn forget_admission(
        &self,
        product: ProductId,
        customer: CustomerId,
        key: &str,
        admission: &str,
    ) -> Result<bool, AppError> {
        let mut invocation = self.inner.forget_admission.prepare_invoke();
        invocation
            .key(self.answer_key(product, customer, key))
            .arg(admission);
        let forgotten: i64 =
            with_retry!(self, connection => invocation.invoke_async(&mut connection))?;
        Ok(forgotten == 1)
    }

    /// Gives an admission's units back, to the stock and from the holdings
    /// of the customer it admitted; idempotent, and an admission the gate
    /// never made gives nothing back. Returns how many units came back.
    pub async fn give_back(&self, product: ProductId, admission: &str) -> Result<i64, AppError> {
        let mut invocation = self.inner.give_back.prepare_invoke();
        invocation
            .key(self.key(product, "stock"))
            .key(self.key(product, &format!("adm:{admission}")))
            .key(self.key(product, &format!("ret:{admission}")))
            .key(self.key(product, "held"))
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
        admissions: &[Settled<'_>],
    ) -> Result<(), AppError> {
        if admissions.is_empty() {
            return Ok(());
        }
        let key = self.key(product, "pending");
        let mut command = redis::cmd("ZREM");
        command.arg(&key);
        for settled in admissions {
            command.arg(format!(
                "{}|{}|{}",
                settled.admission,
                settled.customer,
                settled.quantity.get()
            ));
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
    /// their way to Postgres; with a limit, each customer's holdings become
    /// `held` (what their live orders hold) plus their pending admissions.
    /// Call it under the product lock, so no purchase of the product is
    /// mid-transaction.
    pub async fn overwrite(
        &self,
        product: ProductId,
        stock: i32,
        limit: Option<i32>,
        held: &[(CustomerId, i64)],
    ) -> Result<Resynced, AppError> {
        let mut invocation = self.inner.resync.prepare_invoke();
        invocation
            .key(self.key(product, "stock"))
            .key(self.key(product, "limit"))
            .key(self.key(product, "pending"))
            .key(self.key(product, "held"))
            .arg(stock)
            .arg(limit.unwrap_or(0))
            .arg(self.inner.pending_ttl.as_millis() as u64)
            .arg(self.inner.marker_ttl.as_millis() as u64)
            .arg(self.key(product, "ret:"));
        for (customer, units) in held {
            invocation.arg(customer.get()).arg(*units);
        }
        let (before, after, pending, customers_corrected): (i64, i64, i64, i64) =
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
            customers_corrected,
        })
    }

    /// The gate's stock of each product, in the same order, in one round
    /// trip (for the shop pages); `None` where the gate holds no stock key.
    pub async fn stocks(&self, products: &[ProductId]) -> Result<Vec<Option<i64>>, AppError> {
        if products.is_empty() {
            return Ok(Vec::new());
        }
        let mut command = redis::cmd("MGET");
        for &product in products {
            command.arg(self.key(product, "stock"));
        }
        with_retry!(self, connection => command.query_async(&mut connection))
    }

    pub async fn stock(&self, product: ProductId) -> Result<Option<i64>, AppError> {
        let key = self.key(product, "stock");
        with_retry!(self, connection => redis::cmd("GET").arg(&key).query_async(&mut connection))
    }
}

/// A request's idempotency key as the gate keeps its answer: the key, the
/// request's fingerprint (keyed, see `services::idempotency`), and how long a
/// refusal is remembered.
#[derive(Debug, Clone, Copy)]
pub struct AnswerRecord<'a> {
    pub key: &'a str,
    pub fingerprint: &'a str,
    pub refusal_retention: Duration,
}

/// One buyer's `code|a|b|text` from ADMIT.
fn admit_reply(text: &str) -> Result<AdmitReply, AppError> {
    let broken = || AppError::Internal(anyhow::anyhow!("unreadable gate answer {text:?}"));
    let mut parts = text.splitn(4, '|');
    let mut number = || -> Result<i64, AppError> {
        parts
            .next()
            .and_then(|part| part.parse().ok())
            .ok_or_else(broken)
    };
    let (code, a, b) = (number()?, number()?, number()?);
    let text = parts.next().ok_or_else(broken)?;
    Ok((code, a, b, text.to_string()))
}

/// The refusal part of an answer record, as `ADMIT` and `RECORD_REFUSAL` write it.
fn recorded_refusal(text: &str) -> Result<Refusal, AppError> {
    let broken = || AppError::Internal(anyhow::anyhow!("unreadable answer record {text:?}"));
    let (kind, rest) = text.split_once('|').ok_or_else(broken)?;
    match kind {
        "S" => Ok(Refusal::SoldOut {
            product: None,
            available: rest.parse().map_err(|_| broken())?,
        }),
        "L" => {
            let (held, limit) = rest.split_once('|').ok_or_else(broken)?;
            Ok(Refusal::LimitReached {
                product: None,
                limit: limit.parse().map_err(|_| broken())?,
                already: held.parse().map_err(|_| broken())?,
            })
        }
        "J" => serde_json::from_str(rest).map_err(|_| broken()),
        _ => Err(broken()),
    }
}

fn unavailable(reason: &str) -> AppError {
    AppError::Unavailable(format!("stock gate: {reason}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admit_replies_keep_the_bars_of_their_text() {
        assert_eq!(admit_reply("2|0|0|").unwrap(), (2, 0, 0, String::new()));
        assert_eq!(admit_reply("3|1|2|").unwrap(), (3, 1, 2, String::new()));
        assert_eq!(admit_reply("-1|0|0|").unwrap(), (-1, 0, 0, String::new()));
        assert_eq!(
            admit_reply(r#"7|0|0|J|{"why":"a|b"}"#).unwrap(),
            (7, 0, 0, r#"J|{"why":"a|b"}"#.to_string())
        );
        assert_eq!(
            admit_reply("8|1500|0|adm-1").unwrap(),
            (8, 1500, 0, "adm-1".to_string())
        );
    }

    #[test]
    fn a_short_or_unreadable_admit_reply_is_an_error() {
        for broken in ["2|1", "", "x|0|0|", "2|0|0"] {
            assert!(admit_reply(broken).is_err(), "{broken:?}");
        }
    }
}
