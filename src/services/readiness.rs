//! Whether this process can serve a purchase now: Postgres, a quorum of the
//! lock servers and (if on) the stock gate's Redis, each asked at once and
//! each given at most the same short wait. The web layer's `/readyz` words
//! the answer.

use std::future::Future;
use std::time::Duration;

use crate::db::{self, PgPool};
use crate::services::Shop;

/// What answered within the wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    pub postgres: bool,
    pub redis_locks: bool,
    /// None when the stock gate is off.
    pub stock_gate: Option<bool>,
}

impl Readiness {
    /// Asks every dependency at once; a check that has not answered within
    /// `wait` counts as down, so a hanging dependency cannot hold the answer.
    pub async fn check(shop: &Shop, wait: Duration) -> Readiness {
        let gate = async {
            match &shop.gate {
                Some(gate) => Some(within(wait, gate.reachable()).await),
                None => None,
            }
        };
        let (postgres, redis_locks, stock_gate) = futures::join!(
            database_answers(&shop.pool, wait),
            within(wait, shop.locks.quorum_reachable()),
            gate,
        );
        Readiness {
            postgres,
            redis_locks,
            stock_gate,
        }
    }
}

async fn within(wait: Duration, check: impl Future<Output = bool>) -> bool {
    tokio::time::timeout(wait, check).await.unwrap_or(false)
}

/// `SELECT 1` on a pooled connection, waiting at most `wait` for one (the
/// pool's own connect timeout is longer, sized for purchases).
async fn database_answers(pool: &PgPool, wait: Duration) -> bool {
    let pool = pool.clone();
    let select_one = tokio::task::spawn_blocking(move || db::answers_within(&pool, wait));
    within(wait, async { select_one.await.unwrap_or(false) }).await
}
