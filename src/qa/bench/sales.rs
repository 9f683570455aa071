//! The purchase scenarios of issue #38: drops of a hot product with a
//! per-customer limit, each customer new to it (limit 1: buying once;
//! limit 2: twice), the same with no limit as before, a drop over 100
//! products, and a whole stock sold out, each with the crowd's sold-out
//! buys and page views mixed in (`sale_script`). Every scenario sells
//! products made for it, so its buyers hold nothing of them yet.

use super::customers::Customer;
use super::fixtures::{product, products, BOTTOMLESS, SPREAD_PRODUCTS};
use super::measure::{Bench, Yardstick};
use super::sale_script::SaleRequests;
use super::wrk::Requests;
use super::*;
use crate::db::PgPool;

/// Connections of every purchase run but `HOT_256`.
const CONNECTIONS: usize = 64;
/// Distinct buyers a run at most needs per second of it: past this a
/// limited run's buyers would come back (and be refused at their limit).
const BUYERS_PER_SECOND: f64 = 15_000.0;
/// The sell-out run lasts this much longer than the headline's rate says
/// its stock takes (plus a few seconds), so it surely sells out.
const SELL_OUT_SLACK: f64 = 1.5;

fn tag(name: &str) -> String {
    format!("{name}-{}", uuid::Uuid::new_v4().simple())
}

/// Who takes part in the sales: `customers` are new to every product made
/// here; `rotating` are the few a sale without a limit goes round, and the
/// crowd of every sale.
pub(super) struct People<'c> {
    pub customers: &'c [Customer],
    pub rotating: &'c [Customer],
    pub sold_out: i64,
}

impl<'c> People<'c> {
    fn sale(
        &self,
        products: Vec<i64>,
        buyers: &'c [Customer],
        buys_per_buyer: usize,
        name: &str,
    ) -> Requests<'c> {
        Requests::Sale(SaleRequests {
            page: format!("/products/{}", products[0]),
            products,
            buyers,
            buys_per_buyer,
            sold_out: self.sold_out,
            crowd: self.rotating,
            tag: tag(name),
        })
    }

    /// Enough distinct buyers for `seconds` of selling.
    fn distinct(&self, seconds: f64) -> &'c [Customer] {
        let wanted = (seconds * BUYERS_PER_SECOND).ceil() as usize;
        &self.customers[..wanted.clamp(1, self.customers.len())]
    }
}

/// A purchase run of `requests`; warns when a limited run's buyers came
/// back (more orders than its buyers could place: the run ran out of them).
async fn sell(
    bench: &mut Bench<'_>,
    scenario: &'static str,
    requests: Requests<'_>,
    connections: usize,
    note: String,
    seconds: f64,
) -> anyhow::Result<Measured> {
    // The rows earlier runs wrote are vacuumed and analyzed before this
    // one, as a live shop's are between drops, so no run pays for the
    // autovacuum of another's rows. What this run writes, it pays for.
    bench.set_up_done()?;
    // Only a limited sale's buyers are each meant to come once.
    let capacity = match &requests {
        Requests::Sale(sale) if ceiling_of(scenario) != Some(PG_HOT_NO_LIMIT) => {
            Some(sale.buyers.len() * sale.buys_per_buyer)
        }
        _ => None,
    };
    let run = bench
        .measure_for(
            scenario,
            requests,
            connections,
            303,
            note,
            Yardstick::RunsOwn,
            seconds,
        )
        .await?;
    if let Some(capacity) = capacity {
        if run.expected as usize > capacity {
            eprintln!(
                "{scenario}: {} buys answered 303 for {capacity} buyers' turns: buyers came back",
                run.expected
            );
        }
    }
    Ok(run)
}

pub(super) async fn sale_runs(
    config: &BenchConfig,
    bench: &mut Bench<'_>,
    pool: &PgPool,
    people: &People<'_>,
) -> anyhow::Result<Vec<Measured>> {
    let seconds = config.seconds;
    let mut runs = Vec::new();
    let learn = crate::services::sale_cache::SERVE_AT_MOST;
    let warm_product = product(pool, "warm", BOTTOMLESS, None).await?;

    // The headline, in fresh processes: a mode fixed at start-up shows as
    // runs that differ across processes.
    for process in 1..=config.hot_repeats.max(1) {
        if process > 1 {
            bench.restart().await?;
        }
        let hot = product(pool, "hot, limit 1", BOTTOMLESS, Some(1)).await?;
        let warm = people.sale(vec![warm_product], people.rotating, 1, "warm");
        bench.warm(&warm, CONNECTIONS).await?;
        tokio::time::sleep(learn).await;
        let buyers = people.distinct(seconds);
        let sale = people.sale(vec![hot], buyers, 1, "hot1");
        let note = format!("shop process {process}");
        runs.push(sell(bench, HOT_LIMIT_1, sale, CONNECTIONS, note, seconds).await?);
    }

    let hot = product(pool, "hot, limit 2", BOTTOMLESS, Some(2)).await?;
    tokio::time::sleep(learn).await;
    let sale = people.sale(vec![hot], people.distinct(seconds), 2, "hot2");
    runs.push(
        sell(
            bench,
            HOT_LIMIT_2,
            sale,
            CONNECTIONS,
            String::new(),
            seconds,
        )
        .await?,
    );

    let hot = product(pool, "hot, no limit", BOTTOMLESS, None).await?;
    tokio::time::sleep(learn).await;
    let sale = people.sale(vec![hot], people.rotating, 1, "hot");
    runs.push(
        sell(
            bench,
            HOT_NO_LIMIT,
            sale,
            CONNECTIONS,
            String::new(),
            seconds,
        )
        .await?,
    );
    let buys = Requests::Buy {
        products: vec![hot],
        customers: people.rotating,
        tag: tag("hot256"),
    };
    runs.push(sell(bench, HOT_256, buys, 256, String::new(), seconds).await?);

    let spread = products(pool, "spread", SPREAD_PRODUCTS, BOTTOMLESS, Some(1)).await?;
    let warm = people.sale(spread.clone(), people.rotating, 1, "warm");
    bench.warm(&warm, CONNECTIONS).await?;
    let sale = people.sale(spread, people.distinct(seconds), 1, "spread");
    runs.push(
        sell(
            bench,
            SPREAD_LIMIT_1,
            sale,
            CONNECTIONS,
            String::new(),
            seconds,
        )
        .await?,
    );

    runs.push(sell_out(config, bench, pool, people, &runs).await?);
    Ok(runs)
}

/// The whole stock of a limit-1 sale, to as many distinct buyers, its run
/// as long as the headline's rate says that takes (and then some).
async fn sell_out(
    config: &BenchConfig,
    bench: &mut Bench<'_>,
    pool: &PgPool,
    people: &People<'_>,
    runs: &[Measured],
) -> anyhow::Result<Measured> {
    let units = config.sell_out_units;
    anyhow::ensure!(
        people.customers.len() >= units + units / 5,
        "{units} units need a fifth more customers, {} signed in",
        people.customers.len()
    );
    let rate = runs
        .iter()
        .filter(|r| r.scenario == HOT_LIMIT_1)
        .map(Measured::orders_per_second)
        .fold(f64::INFINITY, f64::min)
        .max(100.0);
    let seconds = (units as f64 / rate * SELL_OUT_SLACK + 3.0).ceil();
    let stock = i32::try_from(units)?;
    let hot = product(pool, "sold out whole", stock, Some(1)).await?;
    tokio::time::sleep(crate::services::sale_cache::SERVE_AT_MOST).await;
    // More customers than units, as at a real drop: the stock runs out
    // while every connection still has new buyers to send, so the last
    // second is the shop's rate at the end of the stock, not the load
    // generator running out of buyers.
    let buyers = units + units / 5;
    let sale = people.sale(vec![hot], &people.customers[..buyers], 1, "whole");
    let note = format!("{units} units, {buyers} customers, {seconds:.0} s of load");
    let run = sell(bench, SELL_OUT, sale, CONNECTIONS, note, seconds).await?;
    if run.orders != units as u64 {
        eprintln!(
            "{SELL_OUT}: {} orders of {units} units: not sold out within {seconds:.0} s",
            run.orders
        );
    }
    Ok(run)
}
