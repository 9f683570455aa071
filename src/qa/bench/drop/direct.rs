//! The drop without the waiting room: every customer presses Buy at the
//! opening, once, with an idempotency key of their own; the first units'
//! buyers get their order (303), the rest the sold-out answer (409).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::Serialize;

use super::crowd::{by_status, latency_of, Crowd, Event, Kind, Request};
use super::database::{check_sale, SaleChecked, Transactions};
use super::{sale_spec, CpuWindow, Shop};
use crate::qa::bench::probe::STATS_SETTLE;
use crate::qa::bench::CpuShare;
use crate::qa::Latency;
use crate::services::catalog::create_product;

/// What the drop without the waiting room came to.
#[derive(Debug, Clone, Serialize)]
pub struct DirectRun {
    pub product: i64,
    pub customers: usize,
    pub units: i32,
    pub connections: usize,
    /// The first buy on the wire to the last, and buys sent per second.
    pub send_seconds: f64,
    pub send_rate: f64,
    /// Answers by status (0: none).
    pub answers: Vec<(u16, u64)>,
    /// The opening to the last answer, by the driver's clock.
    pub last_answer_ms: f64,
    /// A buy on the wire to its answer: buyers who got an order, and all.
    pub wait_sent_buyers: Latency,
    pub wait_sent_all: Latency,
    /// The opening (when every customer pressed Buy) to the answer: the
    /// above plus the wait for one of the driver's connections.
    pub wait_opening_buyers: Latency,
    pub wait_opening_all: Latency,
    /// The opening's baseline (settled) to the counters settled after the
    /// last answer.
    pub transactions: Transactions,
    /// From the opening to the last answer.
    pub cpu: CpuShare,
    pub driver_cores: f64,
    pub checked: SaleChecked,
}

impl DirectRun {
    pub fn answered(&self) -> u64 {
        self.answers
            .iter()
            .filter(|(status, _)| *status != 0)
            .map(|(_, n)| n)
            .sum()
    }

    pub fn commits_per_answer(&self) -> f64 {
        self.transactions.commits as f64 / self.answered().max(1) as f64
    }
}

/// Seconds between the sale's creation and its opening beyond the counters'
/// settling: the shop's sale cache learns of the sale within one.
const LEAD_BEYOND_SETTLE: Duration = Duration::from_secs(3);

pub(super) async fn run_direct(
    shop: &mut Shop,
    units: i32,
    connections: usize,
) -> anyhow::Result<DirectRun> {
    let customers = &shop.customers;
    let lead = STATS_SETTLE + LEAD_BEYOND_SETTLE;
    let starts_at = Utc::now() + chrono::Duration::from_std(lead)?;
    let spec = super::SaleSpec {
        per_customer_limit: Some(1),
        starts_at,
        ..sale_spec("drop, no waiting room", units)
    };
    let product = create_product(&shop.pool, spec).await?.id;
    // The opening on this process's monotonic clock: the shop and Postgres
    // read the same machine's wall clock.
    let origin = Instant::now() + (starts_at - Utc::now()).to_std()?;
    shop.vacuum()?;
    tokio::time::sleep(STATS_SETTLE).await;
    let before = shop.counters.now()?;
    let crowd = Arc::new(Crowd::new(&shop.address(), connections, origin)?);
    let path = format!("/products/{product}/buy");
    let tasks: Vec<_> = customers
        .iter()
        .cloned()
        .map(|who| {
            let crowd = crowd.clone();
            let path = path.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(origin.into()).await;
                let key = uuid::Uuid::new_v4().simple().to_string();
                let form = [
                    ("quantity", "1"),
                    ("csrf_token", who.csrf.as_str()),
                    ("idempotency_key", key.as_str()),
                ];
                let buy = Request {
                    kind: Kind::Buy,
                    who: Some(&who),
                    path: &path,
                    form: Some(&form),
                    read_body: false,
                };
                crowd.send(buy, origin).await;
            })
        })
        .collect();
    anyhow::ensure!(
        Instant::now() < origin,
        "setting up {} buyers took past the opening",
        customers.len()
    );
    tokio::time::sleep_until(origin.into()).await;
    let cpu_window = CpuWindow::start(shop.pid());
    for task in tasks {
        task.await?;
    }
    let (cpu, driver_cores) = cpu_window.finish();
    tokio::time::sleep(STATS_SETTLE).await;
    let transactions = shop.counters.now()? - before;
    let checked = check_sale(&shop.db_url, product)?;
    let events = crowd.events();
    let mut run = summarize(
        product,
        units,
        connections,
        &events,
        transactions,
        cpu,
        checked,
    );
    run.driver_cores = driver_cores;
    eprintln!(
        "drop without the waiting room: {} customers, last unit sold {:.0} ms after the opening, \
         answers {:?}, buyers' wait p50 {:.0} / p99 {:.0} ms from the opening, {:.4} commits/answer",
        run.customers,
        run.checked.last_order_ms.unwrap_or(f64::NAN),
        run.answers,
        run.wait_opening_buyers.p50_ms,
        run.wait_opening_buyers.p99_ms,
        run.commits_per_answer(),
    );
    Ok(run)
}

fn summarize(
    product: i64,
    units: i32,
    connections: usize,
    events: &[Event],
    transactions: Transactions,
    cpu: CpuShare,
    checked: SaleChecked,
) -> DirectRun {
    let buyers = || events.iter().filter(|e| e.status == 303);
    let first_sent = events.iter().map(|e| e.sent_us).min().unwrap_or(0);
    let last_sent = events.iter().map(|e| e.sent_us).max().unwrap_or(0);
    let send_seconds = (last_sent - first_sent) as f64 / 1e6;
    let on_the_wire = |e: &Event| e.answered_us - e.sent_us;
    let since_opening = |e: &Event| e.answered_us - e.clicked_us;
    DirectRun {
        product,
        customers: events.len(),
        units,
        connections,
        send_seconds,
        send_rate: events.len() as f64 / send_seconds.max(1e-9),
        answers: by_status(events.iter()),
        last_answer_ms: events.iter().map(|e| e.answered_us).max().unwrap_or(0) as f64 / 1000.0,
        wait_sent_buyers: latency_of(buyers(), on_the_wire),
        wait_sent_all: latency_of(events.iter(), on_the_wire),
        wait_opening_buyers: latency_of(buyers(), since_opening),
        wait_opening_all: latency_of(events.iter(), since_opening),
        transactions,
        cpu,
        driver_cores: 0.0,
        checked,
    }
}
