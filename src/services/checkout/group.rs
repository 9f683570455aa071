//! Group commit: one transaction for the batches of several products.
//!
//! Combining gives a hot product one commit per batch, but a crowd spread
//! over many products is one buyer per product at a time, and each of those
//! batches paid its own transaction: the shop then stops at the database's
//! commit rate however few buyers share a product. Here each product's
//! leader, still holding its product's lock, hands its batch to this
//! process's committer. Whatever batches arrive while one transaction runs
//! go together in the next: their rows are locked in id order (`FOR UPDATE
//! SKIP LOCKED`), every buyer gets the same checks as in its own batch, each
//! product's rows are written with that product's fencing token, every
//! lease is checked, and one commit answers them all.
//!
//! One product must not hold up the others, so the committer never waits
//! on a row: a row some other transaction still holds (a paused process
//! whose lock lapsed) is skipped, and its leader serves that batch alone, on
//! its own connection, waiting for the row there. Should anything refuse the
//! shared transaction (a buyer's rows, a fencing token, a lapsed lease), it
//! rolls back and every leader serves its batch alone, as it would have
//! without grouping, so a refusal reaches only the batch it belongs to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::Utc;
use diesel::prelude::*;
use tokio::sync::oneshot;

use super::order_rows::Buyer;
use super::sell::{sell_at_once, Answer, BatchError, Tally};
use crate::db::models::Product;
use crate::db::{self, holdings, schema::products, PgConn};
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::lock::Lease;
use crate::metrics;
use crate::services::Shop;

/// One product's batch, under that product's lock.
struct Batch {
    lease: Lease,
    product: ProductId,
    buyers: Arc<Vec<Buyer>>,
}

type BatchAnswer = Result<Vec<Answer>, AppError>;

/// What the committer did with a batch: its answers, or `None` for a batch
/// it left to be served alone (nothing of it was written).
pub(super) type Grouped = Option<BatchAnswer>;

struct Handed {
    batch: Batch,
    answer: oneshot::Sender<Grouped>,
}

/// Purchase transactions a process runs at once. Two, so one's statements
/// run while the other waits for its commit to reach the disk; more would
/// only split the batches that would otherwise share a commit.
const COMMITTERS: usize = 2;

#[derive(Default)]
struct Pending {
    batches: Vec<Handed>,
    committers: usize,
}

/// The batches waiting for this process's next purchase transaction.
pub struct CommitGroup {
    pending: Mutex<Pending>,
    /// Products per transaction at most: one statement each, all while
    /// their locks are held.
    max_products: usize,
}

impl CommitGroup {
    pub fn new(max_products: usize) -> CommitGroup {
        CommitGroup {
            pending: Mutex::new(Pending::default()),
            max_products: max_products.max(1),
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves `buyers` of `product` under `lease` in the next purchase
/// transaction of this process, and waits for its answers; `None` when the
/// batch must be served alone.
pub(super) async fn commit(
    shop: &Shop,
    group: &Arc<CommitGroup>,
    lease: Lease,
    product: ProductId,
    buyers: Arc<Vec<Buyer>>,
) -> Grouped {
    let (answer, answered) = oneshot::channel();
    let must_commit = {
        let mut pending = group.pending();
        pending.batches.push(Handed {
            batch: Batch {
                lease,
                product,
                buyers,
            },
            answer,
        });
        let idle = pending.committers < COMMITTERS;
        pending.committers += usize::from(idle);
        idle
    };
    if must_commit {
        // Its own task, like a batch's leader: nobody's disconnect can cancel
        // a transaction that serves others.
        tokio::spawn(run_commits(shop.clone(), group.clone()));
    }
    answered.await.unwrap_or_else(|_| {
        Some(Err(AppError::Internal(anyhow::anyhow!(
            "the commit was lost"
        ))))
    })
}

/// One of the (at most `COMMITTERS`) tasks running this process's purchase
/// transactions. Dropped any way but by finding nothing pending (a panic),
/// the last of them fails the batches left, so their leaders answer and
/// release instead of waiting forever.
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
            let _ = handed
                .answer
                .send(Some(Err(AppError::Internal(anyhow::anyhow!(
                    "the committer stopped"
                )))));
        }
    }
}

async fn run_commits(shop: Shop, group: Arc<CommitGroup>) {
    let mut committer = Committer {
        group,
        committing: true,
    };
    loop {
        let handed = committer.next();
        if handed.is_empty() {
            return;
        }
        let (batches, answers): (Vec<Batch>, Vec<_>) =
            handed.into_iter().map(|h| (h.batch, h.answer)).unzip();
        let started = Instant::now();
        let served = db::run(&shop.pool, move |conn| Ok(serve_batches(conn, &batches))).await;
        metrics::transaction_time("purchase_batch", started.elapsed());
        match served {
            Ok(served) => {
                let buyers = served.iter().flatten().flatten().map(Vec::len).sum();
                if buyers > 0 {
                    metrics::batch_size(buyers);
                }
                for (answer, grouped) in answers.into_iter().zip(served) {
                    let _ = answer.send(grouped);
                }
            }
            Err(error) => {
                for answer in answers {
                    let _ = answer.send(Some(Err(error.duplicate())));
                }
            }
        }
    }
}

/// Every batch's answers, in the order given, from one transaction; `None`
/// for each batch left to go alone.
fn serve_batches(conn: &mut PgConn, batches: &[Batch]) -> Vec<Grouped> {
    match db::transaction(conn, |conn| serve_together(conn, batches)) {
        Ok(served) => served.into_iter().map(|s| s.map(Ok)).collect(),
        Err(BatchError::Failed(AppError::OutcomeUnknown(reason))) => {
            // The COMMIT went out: every batch of it may stand, none may be
            // served again.
            batches
                .iter()
                .map(|_| Some(Err(AppError::OutcomeUnknown(reason.clone()))))
                .collect()
        }
        Err(error) => {
            // Rolled back: nothing of it stands, and each batch alone finds
            // out whether the refusal was its own.
            tracing::debug!(
                ?error,
                "a grouped purchase transaction was refused; its batches go alone"
            );
            batches.iter().map(|_| None).collect()
        }
    }
}

/// The batches whose rows could be locked now, served in one transaction;
/// `None` for a batch left to go alone (its row held elsewhere).
fn serve_together(
    conn: &mut PgConn,
    batches: &[Batch],
) -> Result<Vec<Option<Vec<Answer>>>, BatchError> {
    let mut ids: Vec<i64> = batches.iter().map(|b| b.product.get()).collect();
    ids.sort_unstable();
    ids.dedup();
    // Rows locked in id order, so two such transactions can never deadlock.
    let locked: Vec<Product> = products::table
        .filter(products::id.eq_any(&ids))
        .order(products::id)
        .for_update()
        .skip_locked()
        .select(Product::as_select())
        .load(conn)?;
    let mut rows: HashMap<i64, Product> = locked.into_iter().map(|p| (p.id, p)).collect();
    let mut held = live_units_of_limited(conn, rows.values(), batches)?;
    let now = Utc::now();
    let mut order: Vec<usize> = (0..batches.len()).collect();
    order.sort_by_key(|&i| batches[i].product);
    let mut served: Vec<Option<Vec<Answer>>> = batches.iter().map(|_| None).collect();
    for i in order {
        let batch = &batches[i];
        let Some(product) = rows.remove(&batch.product.get()) else {
            continue;
        };
        let tally = Tally {
            held: held.remove(&batch.product).unwrap_or_default(),
            product,
            now,
        };
        served[i] = Some(sell_at_once(conn, &batch.lease, tally, &batch.buyers)?);
    }
    for batch in batches {
        batch.lease.ensure_valid()?;
    }
    Ok(served)
}

/// What each buyer already holds of each locked product that has a
/// per-customer limit, in one query for the whole group.
fn live_units_of_limited<'a>(
    conn: &mut PgConn,
    locked: impl Iterator<Item = &'a Product>,
    batches: &[Batch],
) -> Result<HashMap<ProductId, HashMap<CustomerId, i64>>, BatchError> {
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
    Ok(holdings::live_units_of_products(
        conn, &limited, &customers,
    )?)
}
