//! Group commit: one transaction for the batches of several products.
//!
//! Combining gives a hot product one commit per batch, but a crowd spread
//! over many products is one buyer per product at a time, and each of those
//! batches paid its own transaction: the shop then stops at the database's
//! commit rate however few buyers share a product. Here each product's
//! leader, still holding its product's lock, hands its batch to this
//! process's committer. Whatever batches arrive while one transaction runs
//! go together in the next: their rows are locked in id order (`FOR UPDATE
//! SKIP LOCKED`), every buyer gets the same checks as in its own batch, one
//! statement writes every batch's rows, each product's stock under that
//! product's fencing token, every lease is checked, and one commit answers
//! them all. (A statement per product cost its parsing, planning and a
//! round trip with every row lock held: with one buyer per product that was
//! most of a purchase's time in Postgres.)
//!
//! One product must not hold up the others, so the committer never waits
//! on a product row: a row some other transaction still holds (a paused
//! process whose lock lapsed) is skipped, and its leader serves that batch
//! alone, on its own connection, waiting for the row there. Should one
//! batch refuse the shared transaction (a buyer's rows, a fencing token, a
//! lapsed lease), it rolls back, that batch is served alone (so the refusal
//! reaches only it) and the rest try again together; a constraint the one
//! statement broke names no batch, so the next try writes a statement per
//! batch to find out whose rows it was. Other waits (a key row
//! another transaction is inserting, a slow statement) do hold up the whole
//! transaction, within the statement timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::Utc;
use diesel::prelude::*;
use diesel::r2d2::R2D2Connection;
use tokio::sync::oneshot;

use super::order_rows::Buyer;
use super::order_rows::{write_sales, Sale};
use super::rules::passes_of;
use super::sell::{
    refused_or_failed, sell_at_once, serve_batch, Answer, BatchError, Checked, Tally,
};
use crate::db::holdings::{self, Holder};
use crate::db::{self, fence, schema::products, PgConn};
use crate::domain::{CustomerId, Product, ProductId};
use crate::error::AppError;
use crate::lock::{HeldLocks, Lease};
use crate::metrics;
use crate::services::Shop;

/// Purchase transactions a process runs at once. Two, so one's statements
/// run while the other waits for its commit to reach the disk; more would
/// only split the batches that would otherwise share a commit.
const COMMITTERS: usize = 2;

/// A shared transaction refused because of one batch is tried again
/// without it at most this many times; then the rest go alone too.
const RETRIES_WITHOUT_CULPRIT: usize = 3;

/// One product's batch, under that product's lock.
struct Batch {
    lease: Lease,
    product: ProductId,
    buyers: Arc<Vec<Buyer>>,
}

type BatchAnswer = Result<Vec<Answer>, AppError>;

/// What the committer did with a batch.
enum Grouped {
    Answered(BatchAnswer),
    /// Nothing of it was written: its leader serves it alone.
    Alone,
}

struct Handed {
    batch: Batch,
    answer: oneshot::Sender<Grouped>,
}

#[derive(Default)]
struct Pending {
    batches: Vec<Handed>,
    committers: usize,
}

/// The batches waiting for this process's next purchase transaction.
pub struct CommitGroup {
    pending: Mutex<Pending>,
    /// Products per transaction at most: every one of them holds its lock
    /// (and its row lock) until the shared commit, so a larger group makes
    /// each product wait on the others' checks and writes.
    max_products: usize,
}

impl CommitGroup {
    /// `None` for one product per transaction: each batch commits alone,
    /// on its leader's own connection, as without grouping.
    pub fn new(max_products: usize) -> Option<CommitGroup> {
        (max_products > 1).then(|| CommitGroup {
            pending: Mutex::new(Pending::default()),
            max_products,
        })
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `buyers` of `product` under `held`: in this process's next purchase
/// transaction, or else in one of their own, on their own connection (a row
/// held elsewhere, a refusal to sort out, or grouping off).
pub(super) async fn serve(
    shop: &Shop,
    group: Option<&Arc<CommitGroup>>,
    held: &HeldLocks,
    product: ProductId,
    buyers: &Arc<Vec<Buyer>>,
) -> BatchAnswer {
    if let Some(group) = group {
        if let Grouped::Answered(answers) =
            commit(shop, group, held.lease(), product, buyers.clone()).await
        {
            return answers;
        }
    }
    let started = Instant::now();
    let (lease, buyers) = (held.lease(), buyers.clone());
    metrics::batch_size(buyers.len());
    let outcomes = db::run(&shop.pool, move |conn| {
        serve_batch(conn, &lease, product, &buyers)
    })
    .await;
    metrics::transaction_time("purchase_batch", started.elapsed());
    outcomes
}

/// Hands the batch to this process's next purchase transaction and waits
/// for what became of it.
async fn commit(
    shop: &Shop,
    group: &Arc<CommitGroup>,
    lease: Lease,
    product: ProductId,
    buyers: Arc<Vec<Buyer>>,
) -> Grouped {
    let (answer, answered) = oneshot::channel();
    let committer = {
        let mut pending = group.pending();
        pending.batches.push(Handed {
            batch: Batch {
                lease,
                product,
                buyers,
            },
            answer,
        });
        (pending.committers < COMMITTERS).then(|| {
            pending.committers += 1;
            // Made here, not in the task: a task dropped before it first
            // runs still hands its place back.
            Committer {
                group: group.clone(),
                committing: true,
            }
        })
    };
    if let Some(committer) = committer {
        // Its own task, like a batch's leader: nobody's disconnect can cancel
        // a transaction that serves others.
        crate::serial::spawn(run_commits(shop.pool.clone(), committer));
    }
    // A committer that vanished mid-transaction (a panic) may
    // still have committed this batch: only a lookup can tell.
    answered.await.unwrap_or_else(|_| {
        Grouped::Answered(Err(AppError::OutcomeUnknown(
            "the purchase transaction's answer was lost".into(),
        )))
    })
}

/// One of the (at most `COMMITTERS`) tasks running this process's purchase
/// transactions. Dropped any way but by finding nothing pending (a panic, a
/// stopping runtime), the last of them sends the batches still pending
/// (none of them started) back to their leaders to be served alone.
struct Committer {
    group: Arc<CommitGroup>,
    committing: bool,
}

impl Committer {
    /// The next transaction's batches; none means it stepped down, under the
    /// same lock batches are handed in under.
    fn next(&mut self) -> Vec<Handed> {
        let mut pending = self.group.pending();
        let take = pending.batches.len().min(self.group.max_products);
        if take == 0 {
            pending.committers -= 1;
            self.committing = false;
        }
        pending.batches.drain(..take).collect()
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        if !self.committing {
            return;
        }
        let mut pending = self.group.pending();
        pending.committers -= 1;
        if pending.committers > 0 {
            return;
        }
        for handed in pending.batches.drain(..) {
            let _ = handed.answer.send(Grouped::Alone);
        }
    }
}

async fn run_commits(pool: db::PgPool, mut committer: Committer) {
    loop {
        let handed = committer.next();
        if handed.is_empty() {
            return;
        }
        let (batches, answers): (Vec<Batch>, Vec<_>) =
            handed.into_iter().map(|h| (h.batch, h.answer)).unzip();
        let started = Instant::now();
        let served = db::run(&pool, move |conn| serve_batches(conn, &batches)).await;
        metrics::transaction_time("purchase_batch", started.elapsed());
        let served = match served {
            Ok(served) => served,
            // The connection failed as a whole: each batch goes alone, unless
            // a COMMIT may have gone out.
            Err(AppError::OutcomeUnknown(reason)) => answers
                .iter()
                .map(|_| Grouped::Answered(Err(AppError::OutcomeUnknown(reason.clone()))))
                .collect(),
            Err(_) => answers.iter().map(|_| Grouped::Alone).collect(),
        };
        let buyers: usize = served
            .iter()
            .filter_map(|g| match g {
                Grouped::Answered(Ok(answers)) => Some(answers.len()),
                _ => None,
            })
            .sum();
        if buyers > 0 {
            metrics::batch_size(buyers);
        }
        for (answer, grouped) in answers.into_iter().zip(served) {
            let _ = answer.send(grouped);
        }
    }
}

/// What became of each batch, in the order given, after one transaction
/// (or a few, when one batch's refusal had to be left out).
fn serve_batches(conn: &mut PgConn, batches: &[Batch]) -> Result<Vec<Grouped>, AppError> {
    // A lease that could not see a commit through is not worth starting.
    let mut candidates: Vec<bool> = batches
        .iter()
        .map(|b| b.lease.ensure_valid().is_ok())
        .collect();
    let mut write = Write::Combined;
    for _ in 0..=RETRIES_WITHOUT_CULPRIT {
        let mut attempt = Attempt::new(batches.len());
        let together = db::transaction(conn, |conn| {
            serve_together(conn, batches, &candidates, write, &mut attempt)
        });
        let error = match together {
            Ok(served) => {
                return Ok(served
                    .into_iter()
                    .map(|s| s.map_or(Grouped::Alone, |a| Grouped::Answered(Ok(a))))
                    .collect())
            }
            Err(error) => error,
        };
        if let BatchError::Failed(AppError::OutcomeUnknown(reason)) = &error {
            // The COMMIT went out: what it wrote may stand, and none of that
            // may be served again; what it skipped was never written.
            return Ok(attempt
                .written
                .iter()
                .map(|&written| match written {
                    true => Grouped::Answered(Err(AppError::OutcomeUnknown(reason.clone()))),
                    false => Grouped::Alone,
                })
                .collect());
        }
        tracing::debug!(?error, culprit = ?attempt.culprit, "a grouped purchase transaction was refused");
        if conn.ping().is_err() {
            // Lets the pool drop the connection; the batches go alone.
            return Err(AppError::Unavailable(
                "the database connection was lost".into(),
            ));
        }
        match attempt.culprit {
            // Rolled back because of one batch: it goes alone (and finds out
            // whether the refusal was its own), the rest try again together.
            Some(culprit) => candidates[culprit] = false,
            // The combined statement broke a constraint: a statement per
            // batch finds out whose rows did.
            None if write == Write::Combined && matches!(error, BatchError::RowsRefused(_)) => {
                write = Write::PerBatch
            }
            None => break,
        }
    }
    Ok(batches.iter().map(|_| Grouped::Alone).collect())
}

/// What one try at the shared transaction got to.
struct Attempt {
    /// Batches whose rows went into the transaction.
    written: Vec<bool>,
    /// The batch whose own checks or writes refused the transaction.
    culprit: Option<usize>,
}

impl Attempt {
    fn new(batches: usize) -> Attempt {
        Attempt {
            written: vec![false; batches],
            culprit: None,
        }
    }
}

/// How a group transaction writes its batches' rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    /// Every batch in one statement: the usual case.
    Combined,
    /// A statement per batch, so a constraint the rows break names the
    /// batch at fault.
    PerBatch,
}

/// The candidate batches whose rows could be locked now, served in one
/// transaction; `None` for a batch left to go alone.
fn serve_together(
    conn: &mut PgConn,
    batches: &[Batch],
    candidates: &[bool],
    write: Write,
    attempt: &mut Attempt,
) -> Result<Vec<Option<Vec<Answer>>>, BatchError> {
    let mut ids: Vec<i64> = batches
        .iter()
        .zip(candidates)
        .filter(|(_, &candidate)| candidate)
        .map(|(b, _)| b.product.get())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    // SKIP LOCKED: the committer never waits for a product row, so a row
    // another transaction holds delays only its own batch, served alone.
    let locked: Vec<Product> = products::table
        .filter(products::id.eq_any(&ids))
        .order(products::id)
        .for_update()
        .skip_locked()
        .select(Product::as_select())
        .load(conn)?;
    let mut rows: HashMap<i64, Product> = locked.into_iter().map(|p| (p.id, p)).collect();
    let mut held = holders_of_limited(conn, rows.values(), batches)?;
    let now = Utc::now();
    let mut order: Vec<usize> = (0..batches.len()).filter(|&i| candidates[i]).collect();
    order.sort_by_key(|&i| batches[i].product);
    let mut served: Vec<Option<Vec<Answer>>> = batches.iter().map(|_| None).collect();
    let mut checked = Vec::with_capacity(order.len());
    for i in order {
        let batch = &batches[i];
        let Some(product) = rows.remove(&batch.product.get()) else {
            continue;
        };
        let customers: Vec<CustomerId> = batch.buyers.iter().map(|b| b.customer).collect();
        let tally = Tally {
            held: held.remove(&batch.product).unwrap_or_default(),
            passes: passes_of(conn, &product, &customers)?,
            product,
            now,
        };
        attempt.written[i] = true;
        if write == Write::Combined {
            checked.push((i, tally.check_all(&batch.buyers)));
            continue;
        }
        match sell_at_once(conn, &batch.lease, tally, &batch.buyers) {
            Ok(answers) => served[i] = Some(answers),
            Err(error) => {
                attempt.culprit = Some(i);
                return Err(error);
            }
        }
    }
    if write == Write::Combined {
        for (i, answers) in sell_combined(conn, batches, checked, attempt)? {
            served[i] = Some(answers);
        }
    }
    for (i, batch) in batches.iter().enumerate() {
        if served[i].is_some() {
            if let Err(error) = batch.lease.ensure_valid() {
                attempt.culprit = Some(i);
                return Err(error.into());
            }
        }
    }
    Ok(served)
}

/// The checked batches' admitted buyers written in one statement, and each
/// batch's answers. A refusal one batch can be named for (its fencing
/// token, a key an earlier order took) makes it the culprit; a constraint
/// the statement broke names none.
fn sell_combined(
    conn: &mut PgConn,
    batches: &[Batch],
    checked: Vec<(usize, Checked<'_>)>,
    attempt: &mut Attempt,
) -> Result<Vec<(usize, Vec<Answer>)>, BatchError> {
    let mut sales = Vec::with_capacity(checked.len());
    for (i, batch) in checked.iter().filter(|(_, c)| !c.taking.is_empty()) {
        let token = batches[*i]
            .lease
            .token(batches[*i].product)
            .map_err(|error| {
                attempt.culprit = Some(*i);
                BatchError::from(error)
            })?;
        sales.push(Sale {
            product: &batch.product,
            token,
            taking: &batch.taking,
        });
    }
    let written = match sales.is_empty() {
        true => Vec::new(),
        false => write_sales(conn, &sales).map_err(refused_or_failed)?,
    };
    let mut rows = written.into_iter().peekable();
    let mut answered = Vec::with_capacity(checked.len());
    for (i, batch) in checked {
        let product = batch.product.id;
        let mut own = Vec::with_capacity(batch.taking.len());
        while let Some(row) = rows.next_if(|row| row.product_id == product) {
            own.push(row);
        }
        if own.iter().any(|row| row.stock.is_none()) {
            attempt.culprit = Some(i);
            return Err(fence::refused(conn, ProductId(product))?.into());
        }
        match batch.answered(&own) {
            Ok(answers) => answered.push((i, answers)),
            Err(error) => {
                attempt.culprit = Some(i);
                return Err(error);
            }
        }
    }
    Ok(answered)
}

/// Each buyer as a holder of each locked product that has a per-customer
/// limit, in one query for the whole group.
fn holders_of_limited<'a>(
    conn: &mut PgConn,
    locked: impl Iterator<Item = &'a Product>,
    batches: &[Batch],
) -> Result<HashMap<ProductId, HashMap<CustomerId, Holder>>, BatchError> {
    let limited: Vec<ProductId> = locked
        .filter(|p| p.per_customer_limit.is_some())
        .map(|p| ProductId(p.id))
        .collect();
    if limited.is_empty() {
        return Ok(HashMap::new());
    }
    let customers: Vec<CustomerId> = batches
        .iter()
        .filter(|b| limited.contains(&b.product))
        .flat_map(|b| b.buyers.iter().map(|buyer| buyer.customer))
        .collect();
    Ok(holdings::holders(conn, &limited, &customers)?)
}
