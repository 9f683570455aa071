//! What the benchmark sells: sales that opened a minute ago at one dollar a
//! unit, made through the shop's own catalogue service.

use std::time::Duration;

use chrono::Utc;

use crate::db::PgPool;
use crate::domain::Money;
use crate::services::catalog::{create_product, SaleSpec};

/// Stock no run can sell out.
pub(super) const BOTTOMLESS: i32 = 10_000_000;
/// Sales on the list besides the hot and the sold-out one, so the list
/// page is a list.
pub(super) const CATALOGUE: usize = 8;
pub(super) const SPREAD_PRODUCTS: usize = 100;
/// Units of the benchmark's waiting room: more than its customers, so the
/// room stays open for every poll.
pub(super) const QUEUE_UNITS: i32 = 1_000;

/// A sale that opened a minute ago, at one dollar a unit.
fn sale(name: String, stock: i32, limit: Option<i32>) -> SaleSpec {
    SaleSpec {
        name,
        description: "benchmark".into(),
        price: Money::from_cents(100).expect("valid price"),
        stock,
        per_customer_limit: limit,
        starts_at: Utc::now() - chrono::Duration::minutes(1),
        ends_at: None,
        queue_mode: false,
        queue_opens_at: None,
        join_check_work: 1,
    }
}

/// `count` sales of `stock` units each, `limit` per customer (None: none),
/// their ids in order.
pub(super) async fn products(
    pool: &PgPool,
    tag: &str,
    count: usize,
    stock: i32,
    limit: Option<i32>,
) -> anyhow::Result<Vec<i64>> {
    let mut ids = Vec::with_capacity(count);
    for n in 0..count {
        ids.push(
            create_product(pool, sale(format!("{tag} {n}"), stock, limit))
                .await?
                .id,
        );
    }
    Ok(ids)
}

/// One sale of `stock` units, `limit` per customer.
pub(super) async fn product(
    pool: &PgPool,
    tag: &str,
    stock: i32,
    limit: Option<i32>,
) -> anyhow::Result<i64> {
    Ok(products(pool, tag, 1, stock, limit).await?[0])
}

pub(super) fn pool(url: &str) -> PgPool {
    crate::db::build_one_shot_pool(url, Duration::from_secs(30), Duration::from_secs(5))
}

/// A sale in queue mode whose waiting room is open and whose start is an
/// hour away: every customer who joins waits in the pre-queue.
pub(super) async fn queue_sale(pool: &PgPool, name: &str, stock: i32) -> anyhow::Result<i64> {
    queue_sale_starting(pool, name, stock, Utc::now() + chrono::Duration::hours(1)).await
}

/// A sale in queue mode, limit 1, whose waiting room is open and which
/// starts at `starts_at`.
pub(super) async fn queue_sale_starting(
    pool: &PgPool,
    name: &str,
    stock: i32,
    starts_at: chrono::DateTime<Utc>,
) -> anyhow::Result<i64> {
    let spec = SaleSpec {
        starts_at,
        queue_mode: true,
        queue_opens_at: Some(Utc::now() - chrono::Duration::minutes(1)),
        join_check_work: 1,
        ..sale(name.into(), stock, Some(1))
    };
    Ok(create_product(pool, spec).await?.id)
}
