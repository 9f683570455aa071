//! The waiting room's Redis side (issue #16, `docs/waiting-room.md`): one
//! queue per sale in queue mode, shared by every instance. Every key is
//! `{prefix}queue:{product:ID}:…`, the gate's hash tag, so each script runs
//! on one slot (Redis Cluster too) and may read the gate's stock in the same
//! atomic step. Postgres holds what the queue is rebuilt from
//! (`services::queue`); nothing here touches Postgres.
//!
//! The scripts (`scripts.rs`) are the rules; this module names the keys,
//! runs one script per call (bounded in time, once more on a dropped
//! connection) and reads the answers. Redis down means `Unavailable`, so
//! callers fail closed.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::Script;

mod scripts;

use crate::domain::draw::Ticket;
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::metrics;
use crate::redis_batch::{answer_of, Batches, Driver};
use crate::redis_node::{RedisConnection, RedisNode};

/// Where a queue stands as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueState {
    /// Before the start: joins go to the pre-queue.
    Pre,
    /// Admitting in order.
    Open,
    /// An admin paused admission; joins still go to the back.
    Paused,
    /// Every unit is sold and nothing can come back: nobody else is admitted.
    SoldOut,
    /// The sale ended (or was closed): nobody else joins or is admitted.
    Closed,
}

/// What a queue needs to know about its sale.
#[derive(Debug, Clone, Copy)]
pub struct QueueSetup {
    pub starts_at: DateTime<Utc>,
    /// How long a pass lasts (`QUEUE_PASS_SECS`).
    pub pass: Duration,
    /// Units a pass covers: the sale's per-customer limit.
    pub units: i64,
}

/// One customer's place, as Redis has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub customer: CustomerId,
    pub ticket: Ticket,
    /// Arrival order, from 1.
    pub seq: i64,
    pub joined_at: DateTime<Utc>,
    /// Joined at or after the start (or after the draw): goes behind the drawn.
    pub late: bool,
    /// Its Postgres row is committed.
    pub confirmed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// A new place: insert its row, then `confirm` (or `undo_join`).
    New(Entry),
    /// The customer's place from before (one place per customer).
    Again(Entry),
    /// Sold out or closed: nobody joins.
    Refused(QueueState),
    /// Redis has no such queue (never prepared, or lost): prepare or rebuild first.
    Missing,
}

/// What confirming a committed place did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmed {
    Confirmed,
    /// Redis had lost the place (a rebuild from an older snapshot, or a
    /// sweep that raced its joiner): it is back where the line has it.
    PutBack,
    /// A pre-queue place Redis lost before a draw that went ahead without
    /// it: it cannot be placed fairly, so its row must go (its joiner was
    /// never told it had a place); Redis keeps the ticket until it has
    /// (`to_forget`).
    TooLate,
    /// Redis has no such queue: a rebuild will read the row.
    Missing,
    /// The customer holds another place Redis has confirmed or admitted:
    /// Redis and Postgres disagree about them, and nothing was moved.
    Refused,
}

/// Which rebuild a reconcile was for (Redis's `rebuilt_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebuildMark(i64);

/// What a queue needs after a rebuild.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconcile {
    /// Not rebuilt, or reconciled since.
    Nothing,
    /// Joins in flight at the rebuild may still commit: hold the draw and
    /// admissions.
    Holding,
    /// Time to confirm every committed place, then `mark_reconciled`.
    Due(RebuildMark),
}

/// The pre-queue as the draw reads it.
#[derive(Debug, Clone)]
pub struct PreQueue {
    pub drawn: bool,
    /// Pre-queue tickets in arrival order.
    pub tickets: Vec<Ticket>,
    /// Entries (pre-queue or late) whose Postgres row is not yet confirmed.
    pub unconfirmed: usize,
    /// Another drawer holds the draw's lease: nothing was read (`tickets`
    /// is empty); its draw is done or taken over by a later tick.
    pub busy: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drawn {
    Done,
    /// Drawn before (by another caller): nothing changed.
    Already,
    /// The pre-queue is not the set the order was computed from (a join
    /// landed in between, or one is unconfirmed): read it again.
    Changed,
    Missing,
    /// Another caller is drawing (it holds the draw's lease).
    Busy,
}

/// Which count bounds the passes: the gate's stock key (the gate on), or
/// the queue's own mirror of the Postgres stock (`STOCK_GATE=off`, kept by
/// `mirror_stock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssueBound {
    Gate,
    Mirror,
}

/// ISSUE's reply for one pass: number, ticket, customer, issued and
/// expiry in Unix milliseconds.
type IssuedRow = (i64, String, String, i64, i64);

/// What `issue` did, told the admissions Postgres has recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Issue {
    /// Passes issued (perhaps none: nobody confirmed at the cursor, nothing
    /// left to admit, or the queue not open).
    Issued(Vec<Issued>),
    /// Postgres has recorded admissions this queue never made: Redis lost
    /// writes, and nothing was issued (`discard_behind`).
    Behind,
}

/// How a queue is behind the record, for `discard_behind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behind {
    /// Postgres has the draw revealed; Redis has the queue undrawn.
    Undrawn,
    /// Postgres has `recorded` admissions.
    Admissions { recorded: i64 },
    /// Passes this queue issued whose number or ticket the record already
    /// gave another admission: its cursor trails the record.
    Conflicting(Vec<Issued>),
}

/// A pass names its admission: `TICKET-NUMBER`. It is not a secret (a
/// claim also checks the customer); a form's pass that names no pass of
/// this queue is forged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PassRef {
    pub ticket: Ticket,
    pub number: i64,
}

impl PassRef {
    pub fn parse(raw: &str) -> Option<PassRef> {
        let (ticket, number) = raw.trim().split_once('-')?;
        let number: i64 = number.parse().ok().filter(|n| *n > 0)?;
        Some(PassRef {
            ticket: Ticket::parse(ticket).ok()?,
            number,
        })
    }
}

impl std::fmt::Display for PassRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ticket.as_str(), self.number)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PassState {
    Issued,
    /// A purchase under it is on its way (admitted at the gate).
    Claimed,
    Used,
    Lapsed,
}

/// One admission: a pass issued to the ticket at `cursor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    pub number: i64,
    pub ticket: Ticket,
    pub customer: CustomerId,
    pub issued_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// What the queue's log holds for Postgres (`queue_admissions`), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEvent {
    Issued(Issued),
    Lapsed {
        number: i64,
        ticket: Ticket,
        at: DateTime<Utc>,
    },
}

/// A buy's pass, checked and taken in one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Taken for this admission; `units` is what the pass covers.
    Claimed {
        units: i64,
    },
    /// The customer holds no pass (not joined, or still waiting).
    NoPass,
    /// The form's pass names no pass of this queue.
    Forged,
    /// The pass is another customer's.
    NotYours,
    Lapsed,
    Used,
    /// Claimed by another purchase still on its way.
    InUse,
    Missing,
}

/// A claimed pass past its deadline and grace: its purchase either
/// committed (settle it) or never will (lapse it); Postgres tells which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleClaim {
    pub pass: PassRef,
    pub customer: CustomerId,
    pub admission: String,
}

/// One customer's view (`queue.json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueView {
    pub queue: QueueState,
    pub drawn: bool,
    pub entry: Option<Entry>,
    /// 1-based place in the line, once drawn (late arrivals: at once).
    pub position: Option<i64>,
    /// Places before this one not yet admitted.
    pub ahead: Option<i64>,
    pub pass: Option<(PassRef, PassState, DateTime<Utc>)>,
    /// Stock the gate can still admit, less what open passes cover.
    pub units_left: i64,
    /// Whether Redis had a stock to count `units_left` from (the gate's, or
    /// the mirror): a queue prepared before its first tick has neither yet.
    pub counted: bool,
    /// Covered by open passes.
    pub outstanding: i64,
    /// Units in unpaid orders, as last mirrored (`mirror_unpaid`).
    pub unpaid: i64,
}

/// How far a queue has checked the record's places (`checked_seq`), in
/// which life of the queue (`life`: when it was made or rebuilt). A replica
/// that lost joins lost the marks made after them too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub life: String,
    pub seq: i64,
}

/// What `retire` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retire {
    /// Gone from Redis (or never there).
    Retired,
    /// Its log holds events Postgres has not recorded, a pass is open, a
    /// place waits to be confirmed or forgotten, or a rebuild runs:
    /// nothing was freed.
    NotYet,
    /// Made again meanwhile (an admin moved the end and it was rebuilt):
    /// what is there now is the new life's, and nothing more was freed.
    MadeAgain,
    /// The budget ran out part-way; the next call (anyone's) goes on.
    PartWay,
}

/// Counts for the admin dashboard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounts {
    pub joined: i64,
    /// In the line, not yet admitted.
    pub waiting: i64,
    pub admitted: i64,
    /// Passes issued or claimed, not yet used or lapsed.
    pub open_passes: i64,
    pub outstanding_units: i64,
    pub used: i64,
    pub lapsed: i64,
}

/// Everything Postgres knows, to rebuild a queue Redis lost.
#[derive(Debug, Clone)]
pub struct QueueSnapshot {
    pub setup: QueueSetup,
    pub state: QueueState,
    pub drawn: bool,
    /// Every confirmed entry.
    pub entries: Vec<Entry>,
    /// When drawn: the whole line in order (the draw's order), else empty.
    pub line: Vec<Ticket>,
    /// Every admission, by number, with its state (issued ones are open).
    pub admissions: Vec<(Issued, PassState)>,
}

/// The fixed keys of one queue, in the order every script takes them as KEYS.
struct QueueKeys {
    base: String,
    gate_stock: String,
}

impl QueueKeys {
    const PARTS: [&'static str; 10] = [
        "meta",
        "by_customer",
        "seq",
        "pre",
        "line",
        "cursor",
        "deadlines",
        "outstanding",
        "log",
        "unconfirmed",
    ];

    fn all(&self) -> Vec<String> {
        let mut keys: Vec<String> = Self::PARTS
            .iter()
            .map(|part| format!("{}{part}", self.base))
            .collect();
        keys.push(self.gate_stock.clone());
        for part in [
            "mirror_stock",
            "mirror_unpaid",
            "rebuilding",
            "forget",
            "drawing",
        ] {
            keys.push(format!("{}{part}", self.base));
        }
        keys
    }
}

#[derive(Clone)]
pub struct WaitingRoom {
    inner: Arc<Inner>,
}

struct Inner {
    node: RedisNode,
    prefix: String,
    prepare: Script,
    join: Script,
    confirm: Script,
    undo_join: Script,
    unconfirmed: Script,
    pre_queue: Script,
    draw_part: Script,
    draw: Script,
    issue: Script,
    ack_log: Script,
    claim: Script,
    unclaim: Script,
    settle: Script,
    settle_used: Script,
    confirm_checked: Script,
    lapse_due: Script,
    lapse_claim: Script,
    status: Script,
    set_state: Script,
    mirror_stock: Script,
    mirror_unpaid: Script,
    reconcile_due: Script,
    mark_reconciled: Script,
    counts: Script,
    rebuild_begin: Script,
    rebuild_part: Script,
    rebuild_finish: Script,
    rebuild_abandon: Script,
    discard_behind: Script,
    retire: Script,
    /// Polls of a product waiting to be sent together (`send_views`).
    views: Batches<CustomerId, redis::Value>,
}

const TIMEOUT: Duration = Duration::from_secs(1);
/// Views one STATUS call reads at most.
const MAX_VIEWS: usize = 64;
/// How long a rebuilder holds the rebuild key past its last part or
/// renewal: a rebuilder that died part-way keeps the queue missing this
/// long.
const REBUILD_LOCK: Duration = Duration::from_secs(5);
/// How often a rebuilder renews its key while it reads Postgres.
pub const REBUILD_RENEW: Duration = Duration::from_millis(1500);
/// Places, positions or passes one rebuild part writes: each part is one
/// script that holds Redis, and a queue may have a hundred thousand places.
pub const REBUILD_PART: usize = 1000;
/// Places of the order one DRAW_PART stages, and pre-queue tickets one
/// PRE_QUEUE reads: at 100,000 places one script for the whole draw held
/// Redis for over half a second, at the opening second.
pub const DRAW_PART: usize = 1000;
/// How long a drawer keeps the draw to itself past its last part: one
/// that stalls or dies this long is taken over.
const DRAW_LEASE: Duration = Duration::from_secs(2);
/// Passes one ISSUE call may hand out, so a script never runs long; callers
/// issue again on every give-back and sweep.
const ISSUE_BATCH: usize = 1000;
/// Places one CONFIRM call takes (a reconcile may hand it a whole queue).
pub const CONFIRM_BATCH: usize = 500;
/// Keys of the keyspace one RETIRE call looks at: each call is one script
/// that holds Redis, and the whole keyspace is paged through.
const RETIRE_PAGE: usize = 1000;

/// Runs one call, once more on a fresh connection if the first lost its
/// connection: every script here is idempotent or, like ISSUE, only does
/// again what its caller asked for anyway.
macro_rules! with_retry {
    ($room:expr, $connection:ident => $call:expr) => {{
        let mut answer = None;
        for attempt in 0..2 {
            let mut $connection = $room.connection().await?;
            match $room.guard($call).await {
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

type EntryRow = (String, String, i64, i64, i64, i64);
type StatusRow = (
    i64,
    String,
    i64,
    i64,
    i64,
    i64,
    String,
    String,
    i64,
    Vec<redis::Value>,
    i64,
    Vec<redis::Value>,
);

impl WaitingRoom {
    pub fn new(node: RedisNode, prefix: &str) -> WaitingRoom {
        WaitingRoom {
            inner: Arc::new(Inner {
                node,
                prefix: prefix.to_string(),
                prepare: Script::new(scripts::PREPARE),
                join: Script::new(scripts::JOIN),
                confirm: Script::new(scripts::CONFIRM),
                undo_join: Script::new(scripts::UNDO_JOIN),
                unconfirmed: Script::new(scripts::UNCONFIRMED),
                pre_queue: Script::new(scripts::PRE_QUEUE),
                draw_part: Script::new(scripts::DRAW_PART),
                draw: Script::new(scripts::DRAW),
                issue: Script::new(scripts::ISSUE),
                ack_log: Script::new(scripts::ACK_LOG),
                claim: Script::new(scripts::CLAIM),
                unclaim: Script::new(scripts::UNCLAIM),
                settle: Script::new(scripts::SETTLE),
                settle_used: Script::new(scripts::SETTLE_USED),
                confirm_checked: Script::new(scripts::CONFIRM_CHECKED),
                lapse_due: Script::new(scripts::LAPSE_DUE),
                lapse_claim: Script::new(scripts::LAPSE_CLAIM),
                status: Script::new(scripts::STATUS),
                set_state: Script::new(scripts::SET_STATE),
                mirror_stock: Script::new(scripts::MIRROR_STOCK),
                mirror_unpaid: Script::new(scripts::MIRROR_UNPAID),
                reconcile_due: Script::new(scripts::RECONCILE_DUE),
                mark_reconciled: Script::new(scripts::MARK_RECONCILED),
                counts: Script::new(scripts::COUNTS),
                rebuild_begin: Script::new(scripts::REBUILD_BEGIN),
                rebuild_part: Script::new(scripts::REBUILD_PART),
                rebuild_finish: Script::new(scripts::REBUILD_FINISH),
                rebuild_abandon: Script::new(scripts::REBUILD_ABANDON),
                discard_behind: Script::new(scripts::DISCARD_BEHIND),
                retire: Script::new(scripts::RETIRE),
                views: Batches::default(),
            }),
        }
    }

    fn keys(&self, product: ProductId) -> QueueKeys {
        QueueKeys {
            base: self.key_base(product),
            gate_stock: format!("{}gate:{{product:{product}}}:stock", self.inner.prefix),
        }
    }

    /// `{prefix}queue:{product:ID}:`: every key of the queue starts so, the
    /// per-ticket ones (`entry:<ticket>`, `pass:<ticket>`) too.
    pub fn key_base(&self, product: ProductId) -> String {
        format!("{}queue:{{product:{product}}}:", self.inner.prefix)
    }

    /// Every fixed key a queue's scripts touch (the gate's stock among them),
    /// for tests and tools; per-ticket keys start with `key_base`.
    pub fn fixed_keys(&self, product: ProductId) -> Vec<String> {
        self.keys(product).all()
    }

    async fn connection(&self) -> Result<RedisConnection, AppError> {
        self.inner
            .node
            .connection()
            .await
            .map_err(|e| unavailable(&e.to_string()))
    }

    /// Bounds one call in time; a failed connection is dropped so the next
    /// call reconnects. Says whether the connection was lost (worth one retry).
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

    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        product: ProductId,
        args: &[String],
    ) -> Result<T, AppError> {
        let keys = self.keys(product);
        let mut invocation = script.prepare_invoke();
        for key in keys.all() {
            invocation.key(key);
        }
        invocation.arg(&keys.base);
        for arg in args {
            invocation.arg(arg);
        }
        with_retry!(self, connection => invocation.invoke_async(&mut connection))
    }

    /// Creates the queue (state `Pre`) unless it exists; before the draw an
    /// existing queue takes the new setup (an admin moved the start).
    /// Returns whether it was created.
    pub async fn prepare(&self, product: ProductId, setup: &QueueSetup) -> Result<bool, AppError> {
        self.prepare_with(product, setup, true).await
    }

    /// Gives a queue this process saw exists the sale's setup (an undrawn
    /// one takes it), and never creates one: a queue freed or dropped since
    /// is not made again empty.
    pub async fn give_setup(&self, product: ProductId, setup: &QueueSetup) -> Result<(), AppError> {
        self.prepare_with(product, setup, false).await.map(|_| ())
    }

    async fn prepare_with(
        &self,
        product: ProductId,
        setup: &QueueSetup,
        may_create: bool,
    ) -> Result<bool, AppError> {
        let created: i64 = self
            .run(
                &self.inner.prepare,
                product,
                &[
                    setup.starts_at.timestamp_millis().to_string(),
                    (setup.pass.as_millis().max(1) as u64).to_string(),
                    setup.units.max(1).to_string(),
                    if may_create { "1" } else { "0" }.to_string(),
                ],
            )
            .await?;
        Ok(created == 1)
    }

    /// Whether Redis has this queue (false after Redis lost it: rebuild).
    pub async fn exists(&self, product: ProductId) -> Result<bool, AppError> {
        self.has_key(product, "meta").await
    }

    async fn has_key(&self, product: ProductId, part: &str) -> Result<bool, AppError> {
        let key = format!("{}{part}", self.key_base(product));
        let found: i64 = with_retry!(self, connection => redis::cmd("EXISTS").arg(&key).query_async(&mut connection))?;
        Ok(found == 1)
    }

    /// A place for `customer`: theirs from before, or a new one with `fresh`.
    pub async fn join(
        &self,
        product: ProductId,
        customer: CustomerId,
        fresh: &Ticket,
    ) -> Result<Joined, AppError> {
        let mut ticket = fresh.clone();
        // Two entries sharing a ticket would share a place in the draw; the
        // odds are tiny, a new ticket costs nothing.
        for _ in 0..3 {
            let (code, state, t, who, seq, joined, late, confirmed): (
                i64,
                String,
                String,
                String,
                i64,
                i64,
                i64,
                i64,
            ) = self
                .run(
                    &self.inner.join,
                    product,
                    &[customer.get().to_string(), ticket.as_str().to_string()],
                )
                .await?;
            let entry = || entry_from((t.clone(), who.clone(), seq, joined, late, confirmed));
            return match code {
                0 => Ok(Joined::New(entry()?)),
                1 => Ok(Joined::Again(entry()?)),
                2 => Ok(Joined::Refused(state_from(&state)?)),
                3 => Ok(Joined::Missing),
                4 => {
                    ticket = Ticket::generate();
                    continue;
                }
                _ => Err(broken("join")),
            };
        }
        Err(broken("join: no free ticket"))
    }

    /// The entry's Postgres row committed.
    pub async fn confirm(&self, product: ProductId, entry: &Entry) -> Result<Confirmed, AppError> {
        let answers = self
            .confirm_all(product, std::slice::from_ref(entry))
            .await?;
        answers.into_iter().next().ok_or_else(|| broken("confirm"))
    }

    /// `confirm` for many committed entries, one script per batch.
    pub async fn confirm_all(
        &self,
        product: ProductId,
        entries: &[Entry],
    ) -> Result<Vec<Confirmed>, AppError> {
        let mut answers = Vec::with_capacity(entries.len());
        for batch in entries.chunks(CONFIRM_BATCH) {
            let args: Vec<String> = batch.iter().flat_map(entry_args).collect();
            crate::metrics::redis_batch("confirm", batch.len());
            let codes: Vec<i64> = self.run(&self.inner.confirm, product, &args).await?;
            match confirmed_from(&codes, batch.len())? {
                Some(batch_answers) => answers.extend(batch_answers),
                None => answers.extend(batch.iter().map(|_| Confirmed::Missing)),
            }
        }
        Ok(answers)
    }

    /// The tick's check for joins Redis lost: `confirm_all` of the record's
    /// places past the mark `checked` read (in arrival order), each batch
    /// moving the mark to its last place (short of a refused one) in the
    /// same step; the batches after one with a refused place are not sent
    /// (fewer answers than places). None when the queue is missing, another life, or its mark
    /// is below `checked` (a failover since): nothing confirmed here, and
    /// the next check starts from that queue's own mark.
    pub async fn confirm_checked(
        &self,
        product: ProductId,
        checked: &Checked,
        places: &[Entry],
    ) -> Result<Option<Vec<Confirmed>>, AppError> {
        let mut answers = Vec::with_capacity(places.len());
        for batch in places.chunks(CONFIRM_BATCH) {
            let args: Vec<String> = [checked.life.clone(), checked.seq.to_string()]
                .into_iter()
                .chain(batch.iter().flat_map(entry_args))
                .collect();
            let codes: Vec<i64> = self
                .run(&self.inner.confirm_checked, product, &args)
                .await?;
            if codes == [-2] {
                return Ok(None);
            }
            let Some(batch_answers) = confirmed_from(&codes, batch.len())? else {
                return Ok(None);
            };
            // The mark stopped short of a refused place: a later batch,
            // read from the same mark, must not move it past.
            let refused = batch_answers.contains(&Confirmed::Refused);
            answers.extend(batch_answers);
            if refused {
                break;
            }
        }
        Ok(Some(answers))
    }

    /// Tickets whose rows must be deleted (`Confirmed::TooLate`).
    pub async fn to_forget(&self, product: ProductId) -> Result<Vec<Ticket>, AppError> {
        let key = format!("{}forget", self.key_base(product));
        let raw: Vec<String> = with_retry!(self, connection => redis::cmd("SMEMBERS")
            .arg(&key)
            .query_async(&mut connection))?;
        raw.iter().map(|t| ticket_from(t)).collect()
    }

    /// Their rows are deleted.
    pub async fn forgotten(&self, product: ProductId, tickets: &[Ticket]) -> Result<(), AppError> {
        if tickets.is_empty() {
            return Ok(());
        }
        let key = format!("{}forget", self.key_base(product));
        let names: Vec<&str> = tickets.iter().map(|t| t.as_str()).collect();
        with_retry!(self, connection => redis::cmd("SREM")
            .arg(&key)
            .arg(&names)
            .query_async::<()>(&mut connection))
    }

    /// Where the queue stands after its last rebuild: the places of rows
    /// that committed after its snapshot may still be missing.
    pub async fn reconcile_due(
        &self,
        product: ProductId,
        hold: Duration,
    ) -> Result<Reconcile, AppError> {
        let (code, rebuilt): (i64, i64) = self
            .run(
                &self.inner.reconcile_due,
                product,
                &[(hold.as_millis() as u64).to_string()],
            )
            .await?;
        Ok(match code {
            -1 => Reconcile::Nothing,
            0 => Reconcile::Holding,
            1 => Reconcile::Due(RebuildMark(rebuilt)),
            _ => return Err(broken("reconcile_due")),
        })
    }

    /// Every committed place is back in Redis since the rebuild `mark`
    /// names; false if the queue was rebuilt again since, or is gone.
    pub async fn mark_reconciled(
        &self,
        product: ProductId,
        mark: RebuildMark,
    ) -> Result<bool, AppError> {
        let marked: i64 = self
            .run(&self.inner.mark_reconciled, product, &[mark.0.to_string()])
            .await?;
        Ok(marked == 1)
    }

    /// Takes back a place whose row could not be written (only while
    /// unconfirmed, and not once the sweep has taken it over: its insert
    /// may be committing).
    pub async fn undo_join(
        &self,
        product: ProductId,
        customer: CustomerId,
        ticket: &Ticket,
    ) -> Result<(), AppError> {
        self.take_back(product, customer, ticket, false).await
    }

    /// `undo_join` by the sweep, for a place whose row it could not write.
    pub async fn undo_swept(
        &self,
        product: ProductId,
        customer: CustomerId,
        ticket: &Ticket,
    ) -> Result<(), AppError> {
        self.take_back(product, customer, ticket, true).await
    }

    async fn take_back(
        &self,
        product: ProductId,
        customer: CustomerId,
        ticket: &Ticket,
        by_sweep: bool,
    ) -> Result<(), AppError> {
        let _: i64 = self
            .run(
                &self.inner.undo_join,
                product,
                &[
                    customer.get().to_string(),
                    ticket.as_str().to_string(),
                    if by_sweep { "1" } else { "0" }.to_string(),
                ],
            )
            .await?;
        Ok(())
    }

    /// Unconfirmed entries older than `age` (their joiner died): the jobs
    /// insert their rows and confirm them.
    pub async fn unconfirmed(
        &self,
        product: ProductId,
        age: Duration,
    ) -> Result<Vec<Entry>, AppError> {
        let rows: Vec<EntryRow> = self
            .run(
                &self.inner.unconfirmed,
                product,
                &[(age.as_millis() as u64).to_string()],
            )
            .await?;
        rows.into_iter().map(entry_from).collect()
    }

    /// An absent queue reads as undrawn and empty (`draw` then says
    /// `Missing`), and an undrawn one another drawer is drawing as `busy`.
    /// Read in pages of `DRAW_PART`: before the draw the set may move
    /// between pages, which `draw` finds.
    pub async fn pre_queue(&self, product: ProductId) -> Result<PreQueue, AppError> {
        let mut read = PreQueue {
            drawn: false,
            tickets: Vec::new(),
            unconfirmed: 0,
            busy: false,
        };
        let mut rank = 0i64;
        while rank >= 0 {
            let values: Vec<redis::Value> = self
                .run(&self.inner.pre_queue, product, &[rank.to_string()])
                .await?;
            let number = |i: usize| -> Result<i64, AppError> {
                values
                    .get(i)
                    .and_then(|v| redis::from_redis_value_ref::<i64>(v).ok())
                    .ok_or_else(|| broken("pre_queue"))
            };
            read.drawn = number(1)? == 1;
            read.unconfirmed = number(2)?.max(0) as usize;
            rank = number(3)?;
            read.busy = number(4)? == 1;
            for value in &values[5..] {
                let ticket = redis::from_redis_value_ref::<String>(value)
                    .ok()
                    .and_then(|t| Ticket::parse(&t).ok())
                    .ok_or_else(|| broken("pre_queue ticket"))?;
                read.tickets.push(ticket);
            }
        }
        Ok(read)
    }

    /// Puts the pre-queue in `order` (positions 1..n; late arrivals already
    /// in the line move behind), opens admission (state `Open`, cursor 1).
    /// A queue an admin paused or closed before the draw stays so. Staged
    /// in parts of `DRAW_PART`, then completed in one step; `Changed` when
    /// `order` is not exactly the pre-queue (every place confirmed), or the
    /// pre-queue changed while the parts were written.
    pub async fn draw(&self, product: ProductId, order: &[Ticket]) -> Result<Drawn, AppError> {
        let drawer = Ticket::generate().as_str().to_string();
        let mut version = String::new();
        for (index, part) in order.chunks(DRAW_PART).enumerate() {
            let args: Vec<String> = [
                drawer.clone(),
                (DRAW_LEASE.as_millis() as u64).to_string(),
                version.clone(),
                (index * DRAW_PART + 1).to_string(),
            ]
            .into_iter()
            .chain(part.iter().map(|t| t.as_str().to_string()))
            .collect();
            let (code, answered): (i64, String) =
                self.run(&self.inner.draw_part, product, &args).await?;
            if code != 0 {
                return drawn_from(code);
            }
            version = answered;
        }
        let code: i64 = self
            .run(
                &self.inner.draw,
                product,
                &[drawer, version, order.len().to_string()],
            )
            .await?;
        drawn_from(code)
    }

    /// Issues passes in line order while the queue is open, the next entry
    /// is confirmed, and open passes plus one more pass's units fit in what
    /// `bound` says can still be admitted. Each is appended to the log.
    /// A missing bound key issues nothing.
    pub async fn issue(
        &self,
        product: ProductId,
        bound: IssueBound,
        recorded: i64,
    ) -> Result<Issue, AppError> {
        let which = match bound {
            IssueBound::Gate => "gate",
            IssueBound::Mirror => "mirror",
        };
        let (behind, rows): (i64, Vec<IssuedRow>) = self
            .run(
                &self.inner.issue,
                product,
                &[
                    which.to_string(),
                    ISSUE_BATCH.to_string(),
                    recorded.to_string(),
                ],
            )
            .await?;
        if behind == 1 {
            return Ok(Issue::Behind);
        }
        let issued = rows
            .into_iter()
            .map(|(number, ticket, customer, issued, expires)| {
                Ok(Issued {
                    number,
                    ticket: ticket_from(&ticket)?,
                    customer: customer_from(&customer)?,
                    issued_at: time_from(issued)?,
                    expires_at: time_from(expires)?,
                })
            })
            .collect::<Result<_, AppError>>()?;
        Ok(Issue::Issued(issued))
    }

    /// The log's oldest events (at most `max`), not removed.
    pub async fn log(&self, product: ProductId, max: usize) -> Result<Vec<LogEvent>, AppError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let key = format!("{}log", self.key_base(product));
        let raw: Vec<String> = with_retry!(self, connection => redis::cmd("LRANGE")
            .arg(&key)
            .arg(0)
            .arg(max as i64 - 1)
            .query_async(&mut connection))?;
        raw.iter().map(|line| log_event_from(line)).collect()
    }

    /// Removes the log's leading events up to and including `through`
    /// (an event equal to it), once Postgres has them; concurrent drainers
    /// never remove an event another has not recorded.
    pub async fn ack_log(&self, product: ProductId, through: &LogEvent) -> Result<(), AppError> {
        let _: i64 = self
            .run(&self.inner.ack_log, product, &[log_line(through)])
            .await?;
        Ok(())
    }

    /// Checks and takes `customer`'s pass for the purchase `admission`.
    pub async fn claim(
        &self,
        product: ProductId,
        customer: CustomerId,
        pass: &PassRef,
        admission: &str,
    ) -> Result<Claim, AppError> {
        let (code, units): (i64, i64) = self
            .run(
                &self.inner.claim,
                product,
                &[
                    customer.get().to_string(),
                    pass.ticket.as_str().to_string(),
                    pass.number.to_string(),
                    admission.to_string(),
                ],
            )
            .await?;
        Ok(match code {
            0 => Claim::Claimed { units },
            1 => Claim::NoPass,
            2 => Claim::Forged,
            3 => Claim::NotYours,
            4 => Claim::Lapsed,
            5 => Claim::Used,
            6 => Claim::InUse,
            7 => Claim::Missing,
            _ => return Err(broken("claim")),
        })
    }

    async fn pass_step(
        &self,
        script: &Script,
        product: ProductId,
        pass: &PassRef,
        admission: &str,
    ) -> Result<i64, AppError> {
        self.run(
            script,
            product,
            &[
                pass.ticket.as_str().to_string(),
                pass.number.to_string(),
                admission.to_string(),
            ],
        )
        .await
    }

    /// The purchase under the claim wrote nothing: the pass is `Issued`
    /// again until its deadline (only while `admission` holds it); past the
    /// deadline it lapses (logged).
    pub async fn unclaim(
        &self,
        product: ProductId,
        pass: &PassRef,
        admission: &str,
    ) -> Result<(), AppError> {
        self.pass_step(&self.inner.unclaim, product, pass, admission)
            .await
            .map(|_| ())
    }

    /// The purchase under the claim committed: `Used`, its units no longer
    /// outstanding; also when a rebuild reopened the pass (issued) before
    /// that commit. Returns false when another admission holds the pass or
    /// it lapsed; a repeat for the same admission answers true and hands
    /// back nothing more.
    pub async fn settle(
        &self,
        product: ProductId,
        pass: &PassRef,
        admission: &str,
    ) -> Result<bool, AppError> {
        Ok(self
            .pass_step(&self.inner.settle, product, pass, admission)
            .await?
            == 1)
    }

    /// SETTLE for each `(pass, admission)` Postgres has used: a pass a
    /// rebuild reopened (found issued) is used by it. Returns how many
    /// were settled here; repeats settle nothing.
    pub async fn settle_used(
        &self,
        product: ProductId,
        used: &[(PassRef, String)],
    ) -> Result<usize, AppError> {
        let mut settled = 0;
        for part in used.chunks(CONFIRM_BATCH) {
            let args: Vec<String> = part
                .iter()
                .flat_map(|(pass, admission)| {
                    [
                        pass.ticket.as_str().to_string(),
                        pass.number.to_string(),
                        admission.clone(),
                    ]
                })
                .collect();
            let count: i64 = self.run(&self.inner.settle_used, product, &args).await?;
            settled += count.max(0) as usize;
        }
        Ok(settled)
    }

    /// The highest admission number the queue's last rebuild wrote (every
    /// admission up to it is the record's); None when it was never rebuilt
    /// (or is missing).
    pub async fn rebuilt_admissions(&self, product: ProductId) -> Result<Option<i64>, AppError> {
        let key = format!("{}meta", self.key_base(product));
        with_retry!(self, connection => redis::cmd("HGET")
            .arg(&key)
            .arg("rebuilt_admissions")
            .query_async(&mut connection))
    }

    /// Lapses every issued pass past its deadline (logged), and returns the
    /// claimed ones past deadline plus `grace`, for the caller to settle or
    /// `lapse_claim` by what Postgres says.
    pub async fn lapse_due(
        &self,
        product: ProductId,
        grace: Duration,
    ) -> Result<Vec<StaleClaim>, AppError> {
        let rows: Vec<(String, i64, String, String)> = self
            .run(
                &self.inner.lapse_due,
                product,
                &[(grace.as_millis() as u64).to_string()],
            )
            .await?;
        rows.into_iter()
            .map(|(ticket, number, customer, admission)| {
                Ok(StaleClaim {
                    pass: PassRef {
                        ticket: ticket_from(&ticket)?,
                        number,
                    },
                    customer: customer_from(&customer)?,
                    admission,
                })
            })
            .collect()
    }

    /// A stale claim whose purchase never committed: `Lapsed` (logged).
    /// False when `admission` does not hold it; a repeat answers true.
    pub async fn lapse_claim(
        &self,
        product: ProductId,
        pass: &PassRef,
        admission: &str,
    ) -> Result<bool, AppError> {
        Ok(self
            .pass_step(&self.inner.lapse_claim, product, pass, admission)
            .await?
            == 1)
    }

    /// One customer's view; a queue Redis does not have is `Unavailable`
    /// (use `view` to tell it apart and rebuild).
    pub async fn status(
        &self,
        product: ProductId,
        customer: CustomerId,
    ) -> Result<QueueView, AppError> {
        self.view(product, customer).await?.ok_or_else(|| {
            AppError::Unavailable(format!(
                "waiting room: Redis has no queue for product {product}"
            ))
        })
    }

    /// Sends a product's queued views, a batch at a time, until none wait
    /// (see `redis_batch`): a crowd's polls cost Redis one script each batch.
    async fn send_views(self, mut driver: Driver<CustomerId, redis::Value>) {
        while let Some(batch) = driver.next_batch(MAX_VIEWS) {
            metrics::redis_batch("status", batch.items.len());
            let customers: Vec<String> = batch.items.iter().map(|c| c.get().to_string()).collect();
            let answers = self
                .run(&self.inner.status, driver.product(), &customers)
                .await;
            batch.answer(answers);
        }
    }

    /// `status`, with None for a queue Redis does not have (never
    /// prepared, or lost): one read-only round trip, shared with the other
    /// polls of the product in flight.
    pub async fn view(
        &self,
        product: ProductId,
        customer: CustomerId,
    ) -> Result<Option<QueueView>, AppError> {
        let queued = self.inner.views.enqueue(product, customer);
        if let Some(driver) = queued.drive {
            tokio::spawn(self.clone().send_views(driver));
        }
        let values: Vec<redis::Value> =
            redis::from_redis_value(answer_of(queued.answer, "waiting room").await?)
                .map_err(|_| broken("status"))?;
        if values.len() == 1 {
            return Ok(None);
        }
        let row: StatusRow =
            redis::from_redis_value(redis::Value::Array(values)).map_err(|_| broken("status"))?;
        let (
            _,
            state,
            drawn,
            pre_count,
            cursor,
            outstanding,
            gate_stock,
            mirror_stock,
            unpaid,
            entry,
            line_position,
            pass,
        ) = row;
        let drawn = drawn == 1;
        let entry = if entry.is_empty() {
            None
        } else {
            let row: EntryRow = redis::from_redis_value(redis::Value::Array(entry))
                .map_err(|_| broken("status entry"))?;
            Some(entry_from(row)?)
        };
        // Before the draw a late arrival's place is behind the whole
        // pre-queue, as the draw will put it.
        let position = match (&entry, line_position) {
            (Some(_), p) if p > 0 => Some(if drawn { p } else { pre_count + p }),
            _ => None,
        };
        let ahead = position.map(|p| (p - cursor).max(0));
        let pass = match (&entry, pass.is_empty()) {
            (Some(entry), false) => {
                let (number, state, expires): (i64, String, i64) =
                    redis::from_redis_value(redis::Value::Array(pass))
                        .map_err(|_| broken("status pass"))?;
                Some((
                    PassRef {
                        ticket: entry.ticket.clone(),
                        number,
                    },
                    pass_state_from(&state)?,
                    time_from(expires)?,
                ))
            }
            _ => None,
        };
        let bound = gate_stock
            .parse::<i64>()
            .ok()
            .or_else(|| mirror_stock.parse::<i64>().ok());
        Ok(Some(QueueView {
            queue: state_from(&state)?,
            drawn,
            entry,
            position,
            ahead,
            pass,
            units_left: (bound.unwrap_or(0) - outstanding).max(0),
            counted: bound.is_some(),
            outstanding,
            unpaid,
        }))
    }

    /// Pause, resume (`Open`), `SoldOut` or `Closed`. Resuming before the
    /// draw is refused (false), and so is `Pre`; a missing queue is false too.
    pub async fn set_state(&self, product: ProductId, state: QueueState) -> Result<bool, AppError> {
        self.change_state(product, None, state).await
    }

    /// `set_state`, only from `from`: false if the queue is in another
    /// state now (an admin paused it since the caller looked).
    pub async fn set_state_from(
        &self,
        product: ProductId,
        from: QueueState,
        state: QueueState,
    ) -> Result<bool, AppError> {
        self.change_state(product, Some(from), state).await
    }

    async fn change_state(
        &self,
        product: ProductId,
        from: Option<QueueState>,
        state: QueueState,
    ) -> Result<bool, AppError> {
        let set: i64 = self
            .run(
                &self.inner.set_state,
                product,
                &[
                    state_name(state).to_string(),
                    from.map(state_name).unwrap_or_default().to_string(),
                ],
            )
            .await?;
        Ok(set == 1)
    }

    /// Zeros for a queue Redis does not have.
    pub async fn counts(&self, product: ProductId) -> Result<QueueCounts, AppError> {
        let (_, joined, waiting, admitted, open_passes, outstanding_units, used, lapsed): (
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
        ) = self.run(&self.inner.counts, product, &[]).await?;
        Ok(QueueCounts {
            joined,
            waiting,
            admitted,
            open_passes,
            outstanding_units,
            used,
            lapsed,
        })
    }

    /// How far the record's places are known to be in this queue: its
    /// `life` and `checked_seq` (see `confirm_checked`); None when missing.
    pub async fn checked_seq(&self, product: ProductId) -> Result<Option<Checked>, AppError> {
        let key = format!("{}meta", self.key_base(product));
        let (state, life, seq): (Option<String>, Option<String>, Option<i64>) = with_retry!(self, connection => redis::cmd("HMGET")
            .arg(&key)
            .arg("state")
            .arg("life")
            .arg("checked_seq")
            .query_async(&mut connection))?;
        Ok(state.map(|_| Checked {
            life: life.unwrap_or_default(),
            seq: seq.unwrap_or(0),
        }))
    }

    /// Units sold under passes so far, to read before the Postgres stock
    /// handed to `mirror_stock`.
    pub async fn settled_units(&self, product: ProductId) -> Result<i64, AppError> {
        let key = format!("{}meta", self.key_base(product));
        let settled: Option<i64> = with_retry!(self, connection => redis::cmd("HGET")
            .arg(&key)
            .arg("settled_units")
            .query_async(&mut connection))?;
        Ok(settled.unwrap_or(0))
    }

    /// The Postgres `stock`, for `IssueBound::Mirror`, read after
    /// `settled_units` answered `settled_before`: what passes sold since may
    /// be missing from it, and is taken off. Returns the mirror.
    pub async fn mirror_stock(
        &self,
        product: ProductId,
        stock: i64,
        settled_before: i64,
    ) -> Result<i64, AppError> {
        self.run(
            &self.inner.mirror_stock,
            product,
            &[stock.to_string(), settled_before.to_string()],
        )
        .await
    }

    /// Units in unpaid orders (shown as held).
    pub async fn mirror_unpaid(&self, product: ProductId, units: i64) -> Result<(), AppError> {
        let _: i64 = self
            .run(&self.inner.mirror_unpaid, product, &[units.to_string()])
            .await?;
        Ok(())
    }

    /// Drops a queue that is behind the record (Redis lost writes): undrawn
    /// while Postgres has its draw revealed (`Behind::Undrawn`), with fewer
    /// admissions than Postgres has recorded, or still holding a pass that
    /// conflicts with the record, so the next tick rebuilds it from the
    /// record; its unrecorded log must be drained first. False if it is not
    /// behind after all.
    pub async fn discard_behind(
        &self,
        product: ProductId,
        behind: Behind,
    ) -> Result<bool, AppError> {
        let args = match behind {
            Behind::Undrawn => vec!["undrawn".to_string()],
            Behind::Admissions { recorded } => vec!["admissions".to_string(), recorded.to_string()],
            Behind::Conflicting(passes) => std::iter::once("passes".to_string())
                .chain(passes.iter().flat_map(|pass| {
                    [
                        pass.ticket.as_str().to_string(),
                        pass.number.to_string(),
                        pass.issued_at.timestamp_millis().to_string(),
                        pass.expires_at.timestamp_millis().to_string(),
                    ]
                }))
                .collect(),
        };
        let dropped: i64 = self.run(&self.inner.discard_behind, product, &args).await?;
        Ok(dropped == 1)
    }

    /// Rebuilds a queue Redis lost, from Postgres alone, once (under a
    /// `SET NX` key, so two instances do not both rebuild), in parts of at
    /// most `REBUILD_PART` places, positions or passes (the queue exists
    /// only once the last is written). Returns false when the queue exists
    /// or another caller is rebuilding. Every entry comes back confirmed;
    /// before the draw the line is the late entries in `(joined_at, seq)`
    /// order; a `Claimed` admission comes back `Issued` (Postgres does not
    /// know its purchase), and the log starts empty.
    pub async fn rebuild(
        &self,
        product: ProductId,
        snapshot: &QueueSnapshot,
    ) -> Result<bool, AppError> {
        match Rebuilder::begin(self, product).await? {
            Some(rebuilder) => rebuilder.complete(snapshot).await,
            None => Ok(false),
        }
    }

    /// Starts a rebuild of a missing queue (`rebuild` is the whole of it):
    /// None when the queue exists or another caller is rebuilding. Read
    /// the snapshot after this, so no later rebuilder writes an older one
    /// than a rebuilder that died part-way.
    pub async fn begin_rebuild(&self, product: ProductId) -> Result<Option<Rebuilder>, AppError> {
        Rebuilder::begin(self, product).await
    }

    /// Frees a finished queue from Redis, every key of it (RETIRE), going
    /// on where the last call stopped (anyone's): Postgres has its whole
    /// record, and nothing asks Redis for it again
    /// (`QueueSale::has_retired`, which the caller has just seen). A page
    /// of the keyspace (`RETIRE_PAGE` keys looked at) is one call, taken
    /// from `budget`: the keyspace is the whole Redis's, so a caller that
    /// ticks live sales too spends a bounded share of each tick on it.
    pub async fn retire(&self, product: ProductId, budget: &mut usize) -> Result<Retire, AppError> {
        // Only the first call may begin a retirement: a later one that
        // finds no mark finds it finished, or the queue made again.
        let mut may_begin = "1";
        while *budget > 0 {
            *budget -= 1;
            let next: Vec<String> = self
                .run(
                    &self.inner.retire,
                    product,
                    &[RETIRE_PAGE.to_string(), may_begin.to_string()],
                )
                .await?;
            may_begin = "0";
            match next.first().map(String::as_str) {
                Some("-1") => return Ok(Retire::NotYet),
                Some("-2") => return Ok(Retire::MadeAgain),
                Some("0") | None => return Ok(Retire::Retired),
                Some(_) => {}
            }
        }
        Ok(Retire::PartWay)
    }

    /// Whether a retirement has begun and not finished (its fixed keys are
    /// gone, its pages not all freed), or a dropped queue left its hashes:
    /// the next `retire` goes on from the mark.
    pub async fn is_retiring(&self, product: ProductId) -> Result<bool, AppError> {
        self.has_key(product, "retiring").await
    }

    /// Whether some caller is rebuilding the queue now.
    pub async fn is_rebuilding(&self, product: ProductId) -> Result<bool, AppError> {
        self.has_key(product, "rebuilding").await
    }
}

/// A rebuild under way, holding the rebuild key with its own token.
pub struct Rebuilder {
    room: WaitingRoom,
    product: ProductId,
    token: String,
}

impl Rebuilder {
    async fn begin(room: &WaitingRoom, product: ProductId) -> Result<Option<Rebuilder>, AppError> {
        let token = Ticket::generate().as_str().to_string();
        let begun: i64 = room
            .run(
                &room.inner.rebuild_begin,
                product,
                &[token.clone(), lock_ms().to_string()],
            )
            .await?;
        Ok((begun == 1).then(|| Rebuilder {
            room: room.clone(),
            product,
            token,
        }))
    }

    /// Writes `snapshot` in parts and completes the rebuild; one that
    /// fails lets go of the key at once. False when another rebuilder took
    /// over (this one's key expired) or the queue exists.
    pub async fn complete(self, snapshot: &QueueSnapshot) -> Result<bool, AppError> {
        let built = self.write(snapshot).await;
        if !matches!(built, Ok(true)) {
            self.abandon().await;
        }
        built
    }

    async fn write(&self, snapshot: &QueueSnapshot) -> Result<bool, AppError> {
        let units = snapshot.setup.units.max(1);
        for part in snapshot.entries.chunks(REBUILD_PART) {
            let places = part.iter().flat_map(entry_args);
            if !self.part(units, "entries", places).await? {
                return Ok(false);
            }
        }
        let line: Vec<&Ticket> = if snapshot.drawn {
            snapshot.line.iter().collect()
        } else {
            let mut late: Vec<&Entry> = snapshot.entries.iter().filter(|e| e.late).collect();
            late.sort_by_key(|e| (e.joined_at, e.seq));
            late.into_iter().map(|e| &e.ticket).collect()
        };
        for (index, part) in line.chunks(REBUILD_PART).enumerate() {
            let first = (index * REBUILD_PART + 1).to_string();
            let tickets = part.iter().map(|t| t.as_str().to_string());
            if !self
                .part(units, "line", std::iter::once(first).chain(tickets))
                .await?
            {
                return Ok(false);
            }
        }
        let mut admissions: Vec<&(Issued, PassState)> = snapshot.admissions.iter().collect();
        admissions.sort_by_key(|(issued, _)| issued.number);
        for part in admissions.chunks(REBUILD_PART) {
            let passes = part.iter().flat_map(|(issued, state)| {
                [
                    issued.number.to_string(),
                    issued.ticket.as_str().to_string(),
                    issued.customer.get().to_string(),
                    issued.issued_at.timestamp_millis().to_string(),
                    issued.expires_at.timestamp_millis().to_string(),
                    rebuilt_state(*state).to_string(),
                ]
            });
            if !self.part(units, "passes", passes).await? {
                return Ok(false);
            }
        }
        let open = |state: &PassState| matches!(state, PassState::Issued | PassState::Claimed);
        let count = |wanted: PassState| {
            admissions
                .iter()
                .filter(|(_, state)| *state == wanted)
                .count()
                .to_string()
        };
        let outstanding = admissions.iter().filter(|(_, state)| open(state)).count() as i64 * units;
        let highest_number = admissions
            .iter()
            .map(|(issued, _)| issued.number)
            .max()
            .unwrap_or(0);
        let setup = &snapshot.setup;
        let finish = [
            self.token.clone(),
            setup.starts_at.timestamp_millis().to_string(),
            (setup.pass.as_millis().max(1) as u64).to_string(),
            units.to_string(),
            state_name(snapshot.state).to_string(),
            if snapshot.drawn { "1" } else { "0" }.to_string(),
            snapshot
                .entries
                .iter()
                .map(|e| e.seq)
                .max()
                .unwrap_or(0)
                .to_string(),
            snapshot
                .entries
                .iter()
                .map(|e| e.joined_at.timestamp_millis())
                .max()
                .unwrap_or(0)
                .to_string(),
            line.len().to_string(),
            // The highest number, not how many: ISSUE numbers the next
            // admission one past this, and a record with a gap in its
            // numbers would have it give out one the record holds (every
            // drain would then find the queue behind, and drop it again).
            highest_number.to_string(),
            outstanding.to_string(),
            count(PassState::Used),
            count(PassState::Lapsed),
            admissions
                .iter()
                .map(|(issued, _)| issued.issued_at.timestamp_millis())
                .max()
                .unwrap_or(0)
                .to_string(),
            first_unadmitted(&line, &admissions).to_string(),
            highest_number.to_string(),
        ];
        let finished: i64 = self
            .room
            .run(&self.room.inner.rebuild_finish, self.product, &finish)
            .await?;
        Ok(finished == 1)
    }

    /// Keeps the rebuild key while the rebuilder reads Postgres; false when
    /// the rebuild is no longer this rebuilder's.
    pub async fn renew(&self) -> Result<bool, AppError> {
        self.part(1, "renew", std::iter::empty()).await
    }

    /// Writes one part (see REBUILD_PART); false when the rebuild is no
    /// longer this rebuilder's.
    pub async fn part(
        &self,
        units: i64,
        kind: &str,
        part: impl Iterator<Item = String>,
    ) -> Result<bool, AppError> {
        let args: Vec<String> = [
            self.token.clone(),
            lock_ms().to_string(),
            units.to_string(),
            kind.to_string(),
        ]
        .into_iter()
        .chain(part)
        .collect();
        let written: i64 = self
            .room
            .run(&self.room.inner.rebuild_part, self.product, &args)
            .await?;
        Ok(written == 1)
    }

    /// Lets go of the rebuild key at once (if still this rebuilder's), so
    /// the next caller starts over without waiting out the key.
    pub async fn abandon(&self) {
        let released: Result<i64, AppError> = self
            .room
            .run(
                &self.room.inner.rebuild_abandon,
                self.product,
                std::slice::from_ref(&self.token),
            )
            .await;
        if let Err(error) = released {
            tracing::warn!(product = %self.product, %error, "could not let go of a waiting room's rebuild key; it expires");
        }
    }
}

/// The cursor of a rebuilt queue: the first place in `line` (1-based)
/// whose ticket the record has not admitted. In a sound record that is one
/// past the admissions; in one that gave a number out of place, the place
/// it displaced is admitted next rather than left behind the cursor (and
/// ISSUE steps past the ticket that holds that number).
fn first_unadmitted(line: &[&Ticket], admissions: &[&(Issued, PassState)]) -> usize {
    let admitted: std::collections::HashSet<&Ticket> = admissions
        .iter()
        .map(|(issued, _)| &issued.ticket)
        .collect();
    line.iter()
        .position(|ticket| !admitted.contains(ticket))
        .unwrap_or(line.len())
        + 1
}

fn lock_ms() -> u64 {
    REBUILD_LOCK.as_millis() as u64
}

/// A pass as a rebuild writes it: a claim Postgres cannot know of is open.
fn rebuilt_state(state: PassState) -> &'static str {
    match state {
        PassState::Issued | PassState::Claimed => "issued",
        PassState::Used => "used",
        PassState::Lapsed => "lapsed",
    }
}

/// An entry as CONFIRM and REBUILD_PART take it: ticket, customer, seq,
/// joined_ms, late.
fn entry_args(entry: &Entry) -> [String; 5] {
    [
        entry.ticket.as_str().to_string(),
        entry.customer.get().to_string(),
        entry.seq.to_string(),
        entry.joined_at.timestamp_millis().to_string(),
        if entry.late { "1" } else { "0" }.to_string(),
    ]
}

fn state_name(state: QueueState) -> &'static str {
    match state {
        QueueState::Pre => "pre",
        QueueState::Open => "open",
        QueueState::Paused => "paused",
        QueueState::SoldOut => "sold_out",
        QueueState::Closed => "closed",
    }
}

fn state_from(name: &str) -> Result<QueueState, AppError> {
    Ok(match name {
        "pre" => QueueState::Pre,
        "open" => QueueState::Open,
        "paused" => QueueState::Paused,
        "sold_out" => QueueState::SoldOut,
        "closed" => QueueState::Closed,
        _ => return Err(broken("queue state")),
    })
}

fn pass_state_from(name: &str) -> Result<PassState, AppError> {
    Ok(match name {
        "issued" => PassState::Issued,
        "claimed" => PassState::Claimed,
        "used" => PassState::Used,
        "lapsed" => PassState::Lapsed,
        _ => return Err(broken("pass state")),
    })
}

/// CONFIRM's codes for a batch of `n`: None for a missing queue.
fn confirmed_from(codes: &[i64], n: usize) -> Result<Option<Vec<Confirmed>>, AppError> {
    if codes == [-1] {
        return Ok(None);
    }
    if codes.len() != n {
        return Err(broken("confirm"));
    }
    codes
        .iter()
        .map(|code| match code {
            1 => Ok(Confirmed::Confirmed),
            2 => Ok(Confirmed::PutBack),
            0 => Ok(Confirmed::TooLate),
            3 => Ok(Confirmed::Refused),
            _ => Err(broken("confirm")),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn drawn_from(code: i64) -> Result<Drawn, AppError> {
    match code {
        0 => Ok(Drawn::Done),
        1 => Ok(Drawn::Already),
        2 => Ok(Drawn::Changed),
        3 => Ok(Drawn::Missing),
        4 => Ok(Drawn::Busy),
        _ => Err(broken("draw")),
    }
}

fn ticket_from(raw: &str) -> Result<Ticket, AppError> {
    Ticket::parse(raw).map_err(|_| broken("ticket"))
}

fn customer_from(raw: &str) -> Result<CustomerId, AppError> {
    raw.parse::<i64>()
        .map(CustomerId)
        .map_err(|_| broken("customer"))
}

fn time_from(ms: i64) -> Result<DateTime<Utc>, AppError> {
    DateTime::from_timestamp_millis(ms).ok_or_else(|| broken("time"))
}

fn entry_from(
    (ticket, customer, seq, joined, late, confirmed): EntryRow,
) -> Result<Entry, AppError> {
    Ok(Entry {
        customer: customer_from(&customer)?,
        ticket: ticket_from(&ticket)?,
        seq,
        joined_at: time_from(joined)?,
        late: late == 1,
        confirmed: confirmed == 1,
    })
}

/// The event as the scripts log it (see `scripts`).
fn log_line(event: &LogEvent) -> String {
    match event {
        LogEvent::Issued(issued) => format!(
            "I|{}|{}|{}|{}|{}",
            issued.number,
            issued.ticket.as_str(),
            issued.customer.get(),
            issued.issued_at.timestamp_millis(),
            issued.expires_at.timestamp_millis()
        ),
        LogEvent::Lapsed { number, ticket, at } => {
            format!("L|{number}|{}|{}", ticket.as_str(), at.timestamp_millis())
        }
    }
}

fn log_event_from(line: &str) -> Result<LogEvent, AppError> {
    let fields: Vec<&str> = line.split('|').collect();
    let number = |i: usize| -> Result<i64, AppError> {
        fields
            .get(i)
            .and_then(|f| f.parse::<i64>().ok())
            .ok_or_else(|| broken("log event"))
    };
    match fields.first() {
        Some(&"I") if fields.len() == 6 => Ok(LogEvent::Issued(Issued {
            number: number(1)?,
            ticket: ticket_from(fields[2])?,
            customer: customer_from(fields[3])?,
            issued_at: time_from(number(4)?)?,
            expires_at: time_from(number(5)?)?,
        })),
        Some(&"L") if fields.len() == 4 => Ok(LogEvent::Lapsed {
            number: number(1)?,
            ticket: ticket_from(fields[2])?,
            at: time_from(number(3)?)?,
        }),
        _ => Err(broken("log event")),
    }
}

fn broken(what: &str) -> AppError {
    AppError::Internal(anyhow::anyhow!("waiting room: unreadable answer ({what})"))
}

fn unavailable(reason: &str) -> AppError {
    AppError::Unavailable(format!("waiting room: {reason}"))
}
