//! pgbench's sweeps on a database of their own (same server, schema and
//! settings as the shop's, so its rows never show on the shop's pages).
//! Every point of a limited sweep buys from products of its own, made for
//! it: holdings are per product, so each point's customers are new to what
//! it sells, as the shop's distinct buyers are.

use std::path::{Path, PathBuf};

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};

use super::customers::seed;
use super::fixtures::{pool, products, BOTTOMLESS, SPREAD_PRODUCTS};
use super::pgbench::{batch_script, pgbench, write_purchase_script, Buyers, Rows};
use super::*;
use crate::db::PgPool;
use crate::qa::harness::ScratchDb;

/// Customers a point may buy as, per second of it: more than any sweep
/// sells in a second (a point that ran out would fail on the customer's
/// foreign key, and say so, rather than reuse a customer).
const CUSTOMERS_PER_SECOND: f64 = 20_000.0;

/// pgbench's database, its customers and where its scripts go.
pub(super) struct PgbenchDb {
    db: ScratchDb,
    pool: PgPool,
    customers: (i64, i64),
    scratch: PathBuf,
}

impl PgbenchDb {
    pub async fn create(config: &BenchConfig, scratch: &Path) -> anyhow::Result<PgbenchDb> {
        let db = ScratchDb::create(&config.database_url, "bench_pgbench")?;
        let pool = pool(&db.url);
        let count = (config.pgbench_seconds * CUSTOMERS_PER_SECOND).max(config.customers as f64);
        let mut conn = PgConnection::establish(&db.url)?;
        let customers = seed(&mut conn, count as usize)?;
        // A shop with a history of orders: pgbench's sessions keep the
        // generic plans they make (they never drop them, as the shop's
        // connections do each second: `db::PLANNER`), and a foreign-key
        // check planned on an empty `orders` scans the whole table ever
        // after, which would lower the ceilings the shop is measured by.
        conn.batch_execute(&format!(
            "INSERT INTO orders (customer_id, status, total_cents, payment_deadline) \
             SELECT {}, 'expired', 100, now() FROM generate_series(1, 100000)",
            customers.0
        ))?;
        conn.batch_execute("VACUUM ANALYZE orders")?;
        Ok(PgbenchDb {
            db,
            pool,
            customers,
            scratch: scratch.into(),
        })
    }

    /// `script` swept over `config.pgbench_clients`, each point on fresh
    /// products (`count` of them, `limit` each).
    async fn sweep(
        &self,
        config: &BenchConfig,
        key: &'static str,
        script: &Path,
        (count, limit): (usize, Option<i32>),
        buyers: Buyers,
        buyers_per_transaction: usize,
    ) -> anyhow::Result<Sweep> {
        let mut points = Vec::new();
        for &clients in &config.pgbench_clients {
            let ids = products(&self.pool, "pgbench", count, BOTTOMLESS, limit).await?;
            let (low, high) = (ids[0], ids[count - 1]);
            anyhow::ensure!(
                high - low + 1 == count as i64,
                "pgbench's rows are not contiguous"
            );
            let customers = match buyers {
                Buyers::Distinct { .. } => self.customers,
                Buyers::Rotating => (
                    self.customers.0,
                    self.customers.0 + config.customers as i64 - 1,
                ),
            };
            let rows = Rows {
                products: (low, high),
                customers,
                cap: limit,
            };
            let point = match pgbench(&self.db.url, script, rows, clients, config.pgbench_seconds) {
                Ok((tps, latency_ms)) => Ceiling {
                    clients,
                    tps: Some(tps),
                    latency_ms,
                    error: None,
                },
                Err(error) => Ceiling {
                    clients,
                    tps: None,
                    latency_ms: 0.0,
                    error: Some(format!("{error:#}")),
                },
            };
            match (&point.tps, &point.error) {
                (Some(tps), _) => eprintln!(
                    "pgbench c={clients:<3} {tps:>8.0} tps  avg {:.2} ms  {key}",
                    point.latency_ms
                ),
                (None, Some(error)) => eprintln!("pgbench c={clients} {key}: {error}"),
                _ => {}
            }
            points.push(point);
        }
        Ok(Sweep {
            key,
            buyers_per_transaction,
            points,
        })
    }

    /// One purchase per transaction, for each purchase scenario's SQL.
    pub async fn purchase_ceilings(&self, config: &BenchConfig) -> anyhow::Result<Vec<Sweep>> {
        let once = Buyers::Distinct { per: 1 };
        let twice = Buyers::Distinct { per: 2 };
        let mut sweeps = Vec::new();
        for (key, products, buyers) in [
            (PG_HOT_LIMIT_1, (1, Some(1)), once),
            (PG_HOT_LIMIT_2, (1, Some(2)), twice),
            (PG_HOT_NO_LIMIT, (1, None), Buyers::Rotating),
            (PG_SPREAD_LIMIT_1, (SPREAD_PRODUCTS, Some(1)), once),
        ] {
            let script = write_purchase_script(&self.scratch, buyers)?;
            sweeps.push(
                self.sweep(config, key, &script, products, buyers, 1)
                    .await?,
            );
        }
        Ok(sweeps)
    }

    /// The batch statement for `batch` new customers per transaction on one
    /// row, limit 1.
    pub async fn batch_ceiling(
        &self,
        config: &BenchConfig,
        key: &'static str,
        batch: usize,
    ) -> anyhow::Result<Sweep> {
        let script = self.scratch.join(format!("batch-{batch}.pgbench.sql"));
        std::fs::write(&script, batch_script(batch))?;
        self.sweep(
            config,
            key,
            &script,
            (1, Some(1)),
            Buyers::Distinct { per: 1 },
            batch,
        )
        .await
    }
}
