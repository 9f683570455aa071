//! Keeping the Redis stock gate in step with Postgres: seeding, handing units
//! back, resync and the reconcile job. Postgres is always right; these only
//! ever move the gate towards it.

use chrono::Utc;
use diesel::prelude::*;

use super::Shop;
use crate::db::schema::products;
use crate::db::{self, holdings, PgPool};
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::gate::{Settled, StockGate};
use crate::metrics;

/// Best effort: a give-back that cannot reach Redis leaves the gate short,
/// which only turns buyers away early; the reconcile job corrects it.
pub async fn give_back_all(gate: &StockGate, admission: &str, products: &[ProductId]) {
    for product in products {
        if let Err(error) = gate.give_back(*product, admission).await {
            tracing::warn!(%product, %error, "could not hand units back to the stock gate; reconcile will correct it");
        }
    }
}

/// Best effort, under the product lock: the gate stops counting these
/// admissions as pending now that their orders are in Postgres. If Redis
/// cannot be told, the entries age out and reconcile counts them as given
/// back, which only admits a few buyers too many (Postgres refuses them).
pub async fn settle(shop: &Shop, product: ProductId, written: &[Settled<'_>]) {
    if let Some(gate) = &shop.gate {
        if let Err(error) = gate.settle(product, written).await {
            tracing::warn!(%product, %error, "could not settle gate admissions; they will age out");
        }
    }
}

async fn stock_and_limit(
    pool: &PgPool,
    product: ProductId,
) -> Result<Option<(i32, Option<i32>)>, AppError> {
    db::run(pool, move |conn| {
        Ok(products::table
            .find(product.get())
            .select((products::stock, products::per_customer_limit))
            .first(conn)
            .optional()?)
    })
    .await
}

/// Seeds each product's gate from the database's current stock unless it is
/// already there, so a restart or a second instance never resets what was
/// sold. Under the product lock, so no sale is mid-transaction.
pub async fn seed_if_absent(shop: &Shop, products: Vec<ProductId>) -> Result<(), AppError> {
    let Some(gate) = shop.gate.clone() else {
        return Ok(());
    };
    let _turn = gate.seeding_turn().await;
    for product in products {
        if gate.stock(product).await?.is_some() {
            continue; // seeded while this caller waited for its turn
        }
        // Products are never deleted, so one that is not there now never
        // will be: asking for it must not leave a lock queue or a fencing
        // counter behind (anyone can send any id).
        if stock_and_limit(&shop.pool, product).await?.is_none() {
            continue;
        }
        let (gate, pool) = (gate.clone(), shop.pool.clone());
        shop.locks
            .with_locks(vec![product], move |_| async move {
                if let Some((stock, limit)) = stock_and_limit(&pool, product).await? {
                    gate.seed_if_absent(product, stock, limit).await?;
                }
                Ok(())
            })
            .await?;
    }
    Ok(())
}

/// Seeds every product at start-up. Redis being down is not fatal: the shop
/// then answers 503 until it is back, and seeds lazily on first use.
pub async fn seed_all(shop: &Shop) {
    if shop.gate.is_none() {
        return;
    }
    let ids: Result<Vec<i64>, AppError> = db::run(&shop.pool, |conn| {
        Ok(products::table.select(products::id).load(conn)?)
    })
    .await;
    let seeded = match ids {
        Ok(ids) => seed_if_absent(shop, ids.into_iter().map(ProductId).collect()).await,
        Err(error) => Err(error),
    };
    if let Err(error) = seeded {
        tracing::warn!(%error, "could not seed the stock gate at start-up; products will be seeded on first purchase");
    }
}

/// How far the gate had drifted from the database for one product. The
/// gate should hold the database's stock less the units of admissions still
/// on their way to Postgres.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    pub product: ProductId,
    /// None when the gate had no stock key.
    pub gate: Option<i64>,
    pub database: i32,
    /// Units admitted by the gate and not yet written nor given back.
    pub pending: i64,
    /// What the gate holds now.
    pub corrected: i64,
    /// Customers whose holdings were wrong (and are now right).
    pub customers_corrected: i64,
}

impl Drift {
    pub fn describe(&self) -> String {
        format!(
            "gate {} → {} (database {}, {} pending; {} customers' holdings corrected)",
            self.gate.map_or("missing".into(), |g| g.to_string()),
            self.corrected,
            self.database,
            self.pending,
            self.customers_corrected
        )
    }
}

/// Units of `product` in each customer's live orders (awaiting payment or
/// paid): what the gate's per-customer holdings must be, less pending
/// admissions. Bounded by the units sold, so a sale of 100 has at most 100.
async fn held_by_every_customer(
    pool: &PgPool,
    product: ProductId,
) -> Result<Vec<(CustomerId, i64)>, AppError> {
    db::run(pool, move |conn| {
        Ok(holdings::live_units(conn, product)?.into_iter().collect())
    })
    .await
}

/// Sets the product's gate from the database's stock, limit and
/// per-customer holdings while holding the lock, which must already be held
/// by the caller's `with_locks`.
async fn overwrite_from_database(
    gate: &StockGate,
    pool: &PgPool,
    product: ProductId,
) -> Result<Option<Drift>, AppError> {
    let Some((stock, limit)) = stock_and_limit(pool, product).await? else {
        return Ok(None);
    };
    let held = match limit {
        Some(_) => held_by_every_customer(pool, product).await?,
        None => Vec::new(),
    };
    let resynced = gate.overwrite(product, stock, limit, &held).await?;
    let drifted = resynced.before != Some(resynced.after) || resynced.customers_corrected > 0;
    Ok(drifted.then_some(Drift {
        product,
        gate: resynced.before,
        database: stock,
        pending: resynced.pending,
        corrected: resynced.after,
        customers_corrected: resynced.customers_corrected,
    }))
}

/// The admin's "resync gate": the gate takes the database's stock and limit.
pub async fn resync(shop: &Shop, product: ProductId) -> Result<Option<Drift>, AppError> {
    let Some(gate) = shop.gate.clone() else {
        return Ok(None);
    };
    let pool = shop.pool.clone();
    shop.locks
        .with_locks(vec![product], move |_| async move {
            overwrite_from_database(&gate, &pool, product).await
        })
        .await
}

/// Same as `resync`, for callers already inside the product's lock.
pub async fn resync_locked(
    shop_gate: Option<&StockGate>,
    pool: &PgPool,
    product: ProductId,
) -> Result<(), AppError> {
    if let Some(gate) = shop_gate {
        if let Err(error) = overwrite_from_database(gate, pool, product).await {
            tracing::warn!(%product, %error, "could not resync the stock gate; reconcile will correct it");
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    pub checked: usize,
    pub drifts: Vec<Drift>,
    pub failed: usize,
}

/// One reconcile pass over the products still on sale.
pub async fn reconcile_once(shop: &Shop) -> Result<ReconcileReport, AppError> {
    let mut report = ReconcileReport::default();
    if shop.gate.is_none() {
        return Ok(report);
    }
    let live: Vec<i64> = db::run(&shop.pool, |conn| {
        Ok(products::table
            .filter(
                products::sale_ends_at
                    .is_null()
                    .or(products::sale_ends_at.gt(Utc::now())),
            )
            .select(products::id)
            .order(products::id)
            .load(conn)?)
    })
    .await?;
    for id in live {
        report.checked += 1;
        match resync(shop, ProductId(id)).await {
            Ok(Some(drift)) => {
                tracing::warn!(?drift, "stock gate drifted from the database; corrected");
                report.drifts.push(drift);
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(product = id, %error, "reconcile could not check the stock gate");
                report.failed += 1;
            }
        }
    }
    let units_drift = report
        .drifts
        .iter()
        .map(|drift| drift.gate.unwrap_or(0) - drift.corrected)
        .sum();
    metrics::reconcile(report.drifts.len(), units_drift);
    *shop
        .last_reconcile
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = Some((Utc::now(), report.clone()));
    Ok(report)
}
