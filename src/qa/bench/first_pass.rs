//! How long a waiting room takes from its start to its first pass: the
//! moment a drop opens, as a customer waiting in the pre-queue lives it.
//! A sale in queue mode starts a few seconds ahead, `waiters` customers
//! join its pre-queue through the shop's form, and the figure is read from
//! Postgres: the first pass's `issued_at` less the sale's start, both on
//! the database's clock.

use std::time::Duration;

use chrono::Utc;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Double, Nullable};
use serde::Serialize;

use super::customers::Customer;
use super::fixtures::queue_sale_starting;
use super::joins::join_waiting_room;
use crate::db::PgPool;

/// The start to the first pass, for one room.
#[derive(Debug, Clone, Serialize)]
pub struct FirstPass {
    pub waiters: usize,
    /// None: no pass within the wait.
    pub ms: Option<f64>,
}

/// How long the shop may take, after its start, to issue a first pass
/// before the figure is reported as missing.
const WAIT: Duration = Duration::from_secs(10);

/// A room with `waiters` of `customers` in its pre-queue, timed from its
/// start to its first pass.
pub async fn time_to_first_pass(
    pool: &PgPool,
    address: &str,
    customers: &[Customer],
    waiters: usize,
) -> anyhow::Result<FirstPass> {
    let waiters = waiters.min(customers.len());
    // Long enough for the shop's sale cache to learn of the sale and for
    // every waiter to join at well under the joins' measured rate.
    let lead = Duration::from_secs(3) + Duration::from_millis(waiters as u64);
    let starts_at = Utc::now() + chrono::Duration::from_std(lead)?;
    let product = queue_sale_starting(pool, "first pass", 1_000, starts_at).await?;
    tokio::time::sleep(crate::services::sale_cache::SERVE_AT_MOST).await;
    join_waiting_room(address, &customers[..waiters], product).await?;
    anyhow::ensure!(
        Utc::now() < starts_at,
        "{waiters} joins took past the start; the figure would not be a pre-queue's"
    );
    let deadline = tokio::time::Instant::now() + lead + WAIT;
    loop {
        if let Some(ms) = first_pass_ms(pool, product).await? {
            return Ok(FirstPass {
                waiters,
                ms: Some(ms),
            });
        }
        if tokio::time::Instant::now() > deadline {
            return Ok(FirstPass { waiters, ms: None });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn first_pass_ms(pool: &PgPool, product: i64) -> anyhow::Result<Option<f64>> {
    #[derive(QueryableByName)]
    struct Gap {
        #[diesel(sql_type = Nullable<Double>)]
        ms: Option<f64>,
    }
    let gap: Gap = crate::db::run(pool, move |conn| {
        Ok(diesel::sql_query(
            "SELECT extract(epoch FROM min(a.issued_at) - p.sale_starts_at)::float8 * 1000 AS ms
             FROM products p LEFT JOIN queue_admissions a ON a.product_id = p.id
             WHERE p.id = $1 GROUP BY p.sale_starts_at",
        )
        .bind::<BigInt, _>(product)
        .get_result(conn)?)
    })
    .await?;
    Ok(gap.ms)
}
