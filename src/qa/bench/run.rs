//! One benchmark run: the pgbench ceilings first (on a database of their
//! own, while no shop holds connections), then the shop served as its own
//! process under wrk: the crowd's cheap answers, the sales, the joins; and
//! last the ceiling of the shop's own batch statement at the batch sizes
//! the sales showed.

use diesel::{Connection, PgConnection};

use super::ceilings::PgbenchDb;
use super::crowd::{crowd_runs, join_runs};
use super::customers::Customer;
use super::customers::{seed, sign_in_all};
use super::fixtures::{pool, product, products, BOTTOMLESS, CATALOGUE};
use super::machine::{machine, pg_settings};
use super::measure::Bench;
use super::sales::{sale_runs, People};
use super::sign_in::{check_signed_in, sign_in_many};
use super::*;
use crate::qa::harness::ScratchDb;

/// Customers signed in besides the sell-out's: the distinct buyers of the
/// other limited runs are the same customers, each new to the product
/// made for that run.
const SPARE_CUSTOMERS: usize = 20_000;

pub async fn run_bench(config: &BenchConfig) -> anyhow::Result<BenchReport> {
    let scratch =
        std::env::temp_dir().join(format!("flashsale-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&scratch)?;
    eprintln!(
        "scratch files (scripts, shop logs) in {}",
        scratch.display()
    );
    let (pgbench_db, mut ceilings) = if config.crowd_only {
        (None, Vec::new())
    } else {
        let db = PgbenchDb::create(config, &scratch).await?;
        let sweeps = db.purchase_ceilings(config).await?;
        (Some(db), sweeps)
    };

    let db = ScratchDb::create(&config.database_url, "bench")?;
    let pool = pool(&db.url);
    let hot = product(&pool, "hot", BOTTOMLESS, None).await?;
    let sold_out = product(&pool, "gone", 0, None).await?;
    products(&pool, "catalogue", CATALOGUE, 1000, None).await?;
    let buyers = if config.crowd_only {
        0
    } else {
        config.sell_out_units + SPARE_CUSTOMERS
    };
    let accounts = config.join_customers.max(config.customers + buyers);
    seed(&mut PgConnection::establish(&db.url)?, accounts)?;

    let mut bench = Bench::new(config, &db.url, scratch.clone());
    bench.restart().await?;
    let customers: Vec<Customer> = sign_in_many(&db.url, &bench.session_key, accounts)?;
    check_signed_in(&bench.address(), &customers[accounts - 1], hot).await?;
    // A few through the shop's own form as well, as a browser would.
    for by_form in sign_in_all(&bench.address(), 2).await? {
        check_signed_in(&bench.address(), &by_form, hot).await?;
    }
    eprintln!("{} customers signed in", customers.len());
    // Accounts and sessions made in bulk a moment ago, as no live shop's
    // are: vacuumed and analyzed now, not by autovacuum in the middle of
    // the first runs (it once took the first sale's first two seconds).
    bench.set_up_done()?;
    let signed = &customers[..config.customers];
    let joiners = &customers[..config.join_customers];

    let mut runs = crowd_runs(&mut bench, &pool, signed, hot, sold_out).await?;
    if !config.crowd_only {
        let people = People {
            // Not the rotating ones: a warm-up's buys may have made them
            // holders of what a limited sale sells.
            customers: &customers[config.customers..],
            rotating: signed,
            sold_out,
        };
        runs.extend(sale_runs(config, &mut bench, &pool, &people).await?);
    }
    let (joins, first_passes) = join_runs(&mut bench, &pool, joiners).await?;
    runs.push(joins);
    drop(bench);

    let largest_batch = runs
        .iter()
        .filter(|r| r.scenario == HOT_LIMIT_1)
        .filter_map(|r| r.shape.map(|s| s.largest_transaction))
        .max();
    if let Some(pgbench_db) = &pgbench_db {
        // With no shop running: the batch's ceiling, for 32 buyers and for
        // the largest batch the shop formed.
        ceilings.push(pgbench_db.batch_ceiling(config, PG_BATCH_32, 32).await?);
        if let Some(largest) = largest_batch.filter(|&b| b > 1 && b != 32) {
            ceilings.push(
                pgbench_db
                    .batch_ceiling(config, PG_BATCH_LARGEST, largest as usize)
                    .await?,
            );
        }
    }

    let mut machine = machine();
    machine.extend(pg_settings(&db.url));
    Ok(BenchReport {
        machine,
        shop: shop_settings(config),
        ceilings,
        runs,
        largest_batch,
        first_passes,
    })
}

/// The settings the shop ran with: its defaults unless the environment
/// of `flashsale bench` changed them.
fn shop_settings(config: &BenchConfig) -> Vec<(String, String)> {
    let var = |name: &str, default: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| default.into())
    };
    vec![
        (
            "build".into(),
            if cfg!(debug_assertions) {
                "debug (figures not comparable)"
            } else {
                "release"
            }
            .into(),
        ),
        ("DB_POOL_SIZE".into(), var("DB_POOL_SIZE", "16 (default)")),
        ("STOCK_GATE".into(), var("STOCK_GATE", "on (default)")),
        ("COMBINING".into(), var("COMBINING", "on (default)")),
        ("COMBINE_MAX".into(), var("COMBINE_MAX", "32 (default)")),
        (
            "COMBINE_PRODUCTS".into(),
            var("COMBINE_PRODUCTS", "64 (default)"),
        ),
        (
            "customers a sale without a limit rotates over (and the crowd)".into(),
            config.customers.to_string(),
        ),
        (
            "units of the sale sold out whole".into(),
            config.sell_out_units.to_string(),
        ),
        (
            "headline runs (each in a fresh shop process)".into(),
            config.hot_repeats.to_string(),
        ),
        (
            "seconds per app run".into(),
            format!("{:.0}", config.seconds),
        ),
        (
            "seconds per pgbench point".into(),
            format!("{:.0}", config.pgbench_seconds),
        ),
    ]
}
