//! The drop through the waiting room. Every customer joins the pre-queue
//! before the start (the join form's POST, then the waiting page it
//! redirects to), and from then on does what the waiting page's script
//! (`templates/static/app.js`, `waitingRoom`) does: it polls `queue.json`
//! when the script would, fetches the page again whenever the phase (or,
//! while waiting, the availability) changes, and on the page that shows
//! the pass it presses Buy at once with the pass (no think time).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::Serialize;

use super::crowd::{by_status, latency_of, Crowd, Event, Kind, Request};
use super::database::{check_sale, SaleChecked, Transactions};
use super::{CpuWindow, Shop};
use crate::qa::bench::customers::Customer;
use crate::qa::bench::fixtures::queue_sale_starting;
use crate::qa::bench::joins::solved_bot_checks;
use crate::qa::bench::probe::STATS_SETTLE;
use crate::qa::bench::CpuShare;
use crate::qa::Latency;

/// What the drop through the waiting room came to. Times in ms are from
/// the start, by the driver's clock unless `checked` (Postgres's).
#[derive(Debug, Clone, Serialize)]
pub struct QueuedRun {
    pub product: i64,
    pub customers: usize,
    pub units: i32,
    pub connections: usize,
    /// The joins' POSTs by status, and the first one on the wire to the
    /// last answer; the waiting pages the joiners were sent to.
    pub joins: Vec<(u16, u64)>,
    pub joins_seconds: f64,
    pub join_latency: Latency,
    pub join_pages: u64,
    /// Last join answered, ms before the start (negative: after it).
    pub joins_done_before_start_ms: f64,
    /// `queue.json` answers before the start (the pre-queue's polls).
    pub prequeue_polls: u64,
    /// The start to the moment the run ended: the last unit's buy
    /// answered, or the time limit.
    pub drop_ms: f64,
    pub sold_out_in_time: bool,
    /// From the start to the run's end.
    pub polls: Vec<(u16, u64)>,
    pub polls_per_second: f64,
    pub peak_polls_per_second: f64,
    pub poll_latency: Latency,
    /// Waiting pages fetched by the script after the start (its swaps).
    pub pages: u64,
    pub page_latency: Latency,
    pub buys: Vec<(u16, u64)>,
    /// The start to a buyer's order answer (303), and a buy on the wire to its answer.
    pub buyer_wait: Latency,
    pub buy_latency: Latency,
    /// Answers of every kind from the start to the end, and the
    /// transactions between the counters read at the start and settled
    /// after the end.
    pub drop_answers: u64,
    pub drop_transactions: Transactions,
    /// The whole run: joins, the pre-queue and the drop.
    pub run_answers: u64,
    pub run_transactions: Transactions,
    /// From the start to the end.
    pub cpu: CpuShare,
    pub driver_cores: f64,
    pub checked: SaleChecked,
}

impl QueuedRun {
    pub fn drop_commits_per_answer(&self) -> f64 {
        self.drop_transactions.commits as f64 / self.drop_answers.max(1) as f64
    }

    pub fn run_commits_per_answer(&self) -> f64 {
        self.run_transactions.commits as f64 / self.run_answers.max(1) as f64
    }
}

/// Joins per second the start's lead is planned for: the crowd must be in
/// the pre-queue before the start.
const PLANNED_JOINS_PER_SECOND: f64 = 1_500.0;
const JOIN_MARGIN: Duration = Duration::from_secs(5);
/// Bot checks fetched and solved per second before the joins (one each,
/// as every browser solves its own before it can join).
const PLANNED_SOLVES_PER_SECOND: f64 = 2_000.0;

pub(super) async fn run_queued(
    shop: &mut Shop,
    units: i32,
    connections: usize,
    time_limit: Duration,
) -> anyhow::Result<QueuedRun> {
    let customers = &shop.customers;
    let joins_budget = Duration::from_secs_f64(customers.len() as f64 / PLANNED_JOINS_PER_SECOND)
        .max(JOIN_MARGIN)
        + JOIN_MARGIN;
    let solves_budget =
        Duration::from_secs_f64(customers.len() as f64 / PLANNED_SOLVES_PER_SECOND) + JOIN_MARGIN;
    // The sale cache learns of the sale in a second; every customer's bot
    // check is solved; the counters settle before the joins begin.
    let lead = Duration::from_secs(1) + solves_budget + STATS_SETTLE + joins_budget;
    let starts_at = Utc::now() + chrono::Duration::from_std(lead)?;
    let product = queue_sale_starting(&shop.pool, "drop, waiting room", units, starts_at).await?;
    let start = Instant::now() + (starts_at - Utc::now()).to_std()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let solved = solved_bot_checks(&shop.address(), customers.len(), &[product]).await?;
    shop.vacuum()?;
    tokio::time::sleep(STATS_SETTLE).await;
    let before_joins = shop.counters.now()?;
    let room = Arc::new(Room {
        crowd: Crowd::new(&shop.address(), connections, start)?,
        product,
        start,
        units: units as usize,
        bought: AtomicUsize::new(0),
    });
    let join_at = Instant::now();
    let mut tasks: Vec<_> = customers
        .iter()
        .cloned()
        .zip(solved)
        .map(|(who, solved)| tokio::spawn(waiter(room.clone(), who, solved, join_at)))
        .collect();
    tokio::time::sleep_until(start.into()).await;
    // Read on the beat, not settled: a busy backend reports its counts at
    // least once a second, so up to a second of the pre-queue's work may
    // be counted as the drop's.
    let at_start = shop.counters.now()?;
    let cpu_window = CpuWindow::start(shop.pid());
    let deadline = start + time_limit;
    let sold_out_in_time = loop {
        if room.bought.load(Ordering::Relaxed) >= room.units {
            break true;
        }
        tasks.retain(|task| !task.is_finished());
        if tasks.is_empty() || Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let end = Instant::now();
    // The drop is over: the waiters still polling leave.
    for task in &tasks {
        task.abort();
    }
    let (cpu, driver_cores) = cpu_window.finish();
    tokio::time::sleep(STATS_SETTLE).await;
    let after = shop.counters.now()?;
    let checked = check_sale(&shop.db_url, product)?;
    let events = room.crowd.events();
    let drop_us = room.crowd.micros(end);
    let run = summarize(Summary {
        product,
        units,
        connections,
        customers: customers.len(),
        events: &events,
        drop_us,
        sold_out_in_time,
        drop_transactions: after - at_start,
        run_transactions: after - before_joins,
        cpu,
        driver_cores,
        checked,
    });
    eprintln!(
        "drop through the waiting room: {} customers joined in {:.1} s ({:.0} ms before the start); \
         last unit sold {:.0} ms after the start; buyers' wait p50 {:.0} / p99 {:.0} ms; \
         {:.0} polls/s; {:.4} commits/answer in the drop",
        run.customers,
        run.joins_seconds,
        run.joins_done_before_start_ms,
        run.checked.last_order_ms.unwrap_or(f64::NAN),
        run.buyer_wait.p50_ms,
        run.buyer_wait.p99_ms,
        run.polls_per_second,
        run.drop_commits_per_answer(),
    );
    Ok(run)
}

struct Room {
    crowd: Crowd,
    product: i64,
    start: Instant,
    units: usize,
    /// Orders answered (303) so far: the run ends when it reaches `units`.
    bought: AtomicUsize,
}

/// The page's phases after which its script polls no more.
const FINAL: [&str; 4] = ["bought", "lapsed", "sold_out", "closed"];

/// The waiting page as loaded: its phase, its availability and, on the
/// pre-queue's page, when its start countdown reaches zero.
struct Page {
    phase: String,
    availability: String,
    loaded: Instant,
    /// The tick (every 250 ms from the page's load) that sees the start
    /// reached; the script then polls 150 ms later.
    countdown: Option<Instant>,
    /// The buy form's pass, on the admitted page.
    pass: Option<String>,
}

/// One customer: joins, loads the waiting page, and follows its script.
async fn waiter(room: Arc<Room>, who: Customer, solved: String, join_at: Instant) {
    let product = room.product;
    let form = [
        ("csrf_token", who.csrf.as_str()),
        ("altcha", solved.as_str()),
    ];
    let join_path = format!("/products/{product}/queue");
    let join = Request {
        kind: Kind::Join,
        who: Some(&who),
        path: &join_path,
        form: Some(&form),
        read_body: false,
    };
    if room.crowd.send(join, join_at).await.status != 303 {
        return;
    }
    // The browser follows the join's redirect to the waiting page.
    let Some(mut page) = load_page(&room, &who, Instant::now()).await else {
        return;
    };
    let poll_path = format!("/products/{product}/queue.json");
    let mut timer = page.loaded + first_poll(&page.phase);
    let (mut failures, mut swap_failures) = (0u32, 0u32);
    loop {
        if let Some(zero) = page.countdown.filter(|zero| *zero <= timer) {
            tokio::time::sleep_until(zero.into()).await;
            page.countdown = None;
            timer = zero + Duration::from_millis(150);
        }
        tokio::time::sleep_until(timer.into()).await;
        let poll = Request {
            kind: Kind::Poll,
            who: Some(&who),
            path: &poll_path,
            form: None,
            read_body: true,
        };
        let answer = room.crowd.send(poll, timer).await;
        let now = Instant::now();
        let status = (answer.status == 200)
            .then_some(answer.body)
            .flatten()
            .and_then(|body| serde_json::from_str::<Status>(&body).ok());
        let Some(status) = status else {
            failures += 1;
            timer = now + back_off(failures);
            continue;
        };
        failures = 0;
        let changed = status.phase != page.phase
            || (status.phase == "waiting" && status.availability != page.availability);
        if !changed {
            if FINAL.contains(&status.phase.as_str()) {
                return;
            }
            timer = now + next_poll(&status.phase, room.start, now);
            continue;
        }
        match load_page(&room, &who, now).await {
            Some(fresh) => {
                swap_failures = 0;
                page = fresh;
                // The form's pass, as the browser sends it: the poll that
                // led here may have said "waiting" a moment before the pass.
                if let (true, Some(pass)) = (page.phase == "admitted", &page.pass) {
                    buy(&room, &who, pass, page.loaded).await;
                    return;
                }
                if FINAL.contains(&page.phase.as_str()) {
                    return;
                }
                timer = page.loaded + first_poll(&page.phase);
            }
            None => {
                swap_failures += 1;
                timer = Instant::now() + back_off(swap_failures);
            }
        }
    }
}

/// The page's own first poll (`schedule(phase === "drawing" ? 300 : nextPoll(phase))`).
fn first_poll(phase: &str) -> Duration {
    if phase == "drawing" {
        Duration::from_millis(300)
    } else {
        next_poll_ms(phase, None)
    }
}

/// `nextPoll(phase, status)` of app.js.
fn next_poll(phase: &str, start: Instant, now: Instant) -> Duration {
    let left_ms = if start >= now {
        start.duration_since(now).as_millis() as i64
    } else {
        -(now.duration_since(start).as_millis() as i64)
    };
    next_poll_ms(phase, Some(left_ms))
}

fn next_poll_ms(phase: &str, start_left_ms: Option<i64>) -> Duration {
    if let (true, Some(left)) = (phase == "pre_queue", start_left_ms) {
        if left < 10_000 {
            return Duration::from_millis((left + 150).max(250) as u64);
        }
    }
    Duration::from_millis(match phase {
        "drawing" => 700,
        "waiting" | "buying" => 2_000,
        "admitted" => 3_000,
        "sign_in" => 30_000,
        _ => 5_000,
    })
}

/// The script's wait after a failed poll or swap.
fn back_off(failures: u32) -> Duration {
    Duration::from_millis((2_000u64 << failures.min(4)).min(30_000))
}

#[derive(serde::Deserialize)]
struct Status {
    phase: String,
    availability: String,
}

async fn load_page(room: &Room, who: &Customer, clicked: Instant) -> Option<Page> {
    let path = format!("/products/{}/queue", room.product);
    let request = Request {
        kind: Kind::Page,
        who: Some(who),
        path: &path,
        form: None,
        read_body: true,
    };
    let answer = room.crowd.send(request, clicked).await;
    let body = answer.body.filter(|_| answer.status == 200)?;
    let loaded = Instant::now();
    let phase = attribute(&body, "data-phase")?;
    let countdown = (phase == "pre_queue").then(|| {
        let tick = Duration::from_millis(250);
        let ticks = room
            .start
            .checked_duration_since(loaded)
            .map_or(0, |left| left.as_micros().div_ceil(tick.as_micros()));
        loaded + tick * ticks as u32
    });
    Some(Page {
        availability: attribute(&body, "data-availability").unwrap_or_default(),
        pass: attribute(&body, "name=\"pass\" value").filter(|pass| !pass.is_empty()),
        phase,
        loaded,
        countdown,
    })
}

fn attribute(html: &str, name: &str) -> Option<String> {
    let from = html.find(&format!("{name}=\""))? + name.len() + 2;
    let length = html[from..].find('"')?;
    Some(html[from..from + length].to_string())
}

/// The admitted page's form: quantity 1, the form's key, the pass.
async fn buy(room: &Room, who: &Customer, pass: &str, clicked: Instant) {
    let key = uuid::Uuid::new_v4().simple().to_string();
    let form = [
        ("idempotency_key", key.as_str()),
        ("csrf_token", who.csrf.as_str()),
        ("pass", pass),
        ("quantity", "1"),
    ];
    let path = format!("/products/{}/buy", room.product);
    let request = Request {
        kind: Kind::Buy,
        who: Some(who),
        path: &path,
        form: Some(&form),
        read_body: false,
    };
    if room.crowd.send(request, clicked).await.status == 303 {
        room.bought.fetch_add(1, Ordering::Relaxed);
    }
}

struct Summary<'a> {
    product: i64,
    units: i32,
    connections: usize,
    customers: usize,
    events: &'a [Event],
    drop_us: i64,
    sold_out_in_time: bool,
    drop_transactions: Transactions,
    run_transactions: Transactions,
    cpu: CpuShare,
    driver_cores: f64,
    checked: SaleChecked,
}

fn summarize(s: Summary<'_>) -> QueuedRun {
    let events = s.events;
    let of = |kind: Kind| events.iter().filter(move |e| e.kind == kind);
    let in_drop = |e: &&Event| e.answered_us >= 0 && e.answered_us <= s.drop_us;
    let joins: Vec<&Event> = of(Kind::Join).collect();
    let first_join = joins.iter().map(|e| e.sent_us).min().unwrap_or(0);
    let last_join = joins.iter().map(|e| e.answered_us).max().unwrap_or(0);
    let polls: Vec<Event> = of(Kind::Poll).filter(in_drop).copied().collect();
    let drop_seconds = s.drop_us as f64 / 1e6;
    let mut per_second = vec![0u64; (drop_seconds.ceil() as usize).max(1)];
    for poll in polls.iter().filter(|e| e.status == 200) {
        let second = (poll.answered_us / 1_000_000) as usize;
        if let Some(count) = per_second.get_mut(second) {
            *count += 1;
        }
    }
    let answered_polls = polls.iter().filter(|e| e.status == 200).count();
    let pages: Vec<Event> = of(Kind::Page).filter(in_drop).copied().collect();
    let buys: Vec<Event> = of(Kind::Buy).copied().collect();
    let answered = |e: &&Event| e.status != 0;
    QueuedRun {
        product: s.product,
        customers: s.customers,
        units: s.units,
        connections: s.connections,
        joins: by_status(joins.iter().copied()),
        joins_seconds: (last_join - first_join) as f64 / 1e6,
        join_latency: latency_of(joins.iter().copied(), |e| e.answered_us - e.sent_us),
        join_pages: of(Kind::Page).filter(|e| e.answered_us < 0).count() as u64,
        joins_done_before_start_ms: -(last_join as f64) / 1000.0,
        prequeue_polls: of(Kind::Poll)
            .filter(|e| e.answered_us < 0 && e.status == 200)
            .count() as u64,
        drop_ms: s.drop_us as f64 / 1000.0,
        sold_out_in_time: s.sold_out_in_time,
        polls: by_status(polls.iter()),
        polls_per_second: answered_polls as f64 / drop_seconds.max(1e-9),
        peak_polls_per_second: per_second.iter().copied().max().unwrap_or(0) as f64,
        poll_latency: latency_of(polls.iter(), |e| e.answered_us - e.sent_us),
        pages: pages.len() as u64,
        page_latency: latency_of(pages.iter(), |e| e.answered_us - e.sent_us),
        buys: by_status(buys.iter()),
        buyer_wait: latency_of(buys.iter().filter(|e| e.status == 303), |e| e.answered_us),
        buy_latency: latency_of(buys.iter(), |e| e.answered_us - e.sent_us),
        drop_answers: events.iter().filter(in_drop).filter(answered).count() as u64,
        drop_transactions: s.drop_transactions,
        run_answers: events.iter().filter(answered).count() as u64,
        run_transactions: s.run_transactions,
        cpu: s.cpu,
        driver_cores: s.driver_cores,
        checked: s.checked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_are_spaced_as_the_page_spaces_them() {
        let second = |ms: u64| Duration::from_millis(ms);
        assert_eq!(next_poll_ms("pre_queue", Some(60_000)), second(5_000));
        assert_eq!(next_poll_ms("pre_queue", Some(4_000)), second(4_150));
        assert_eq!(next_poll_ms("pre_queue", Some(-3_000)), second(250));
        assert_eq!(first_poll("pre_queue"), second(5_000));
        assert_eq!(first_poll("drawing"), second(300));
        assert_eq!(next_poll_ms("drawing", None), second(700));
        assert_eq!(next_poll_ms("waiting", None), second(2_000));
        assert_eq!(back_off(1), second(4_000));
        assert_eq!(back_off(9), second(30_000));
    }

    #[test]
    fn the_page_attributes_are_read() {
        let html = r#"<section id="waiting-room" data-phase="pre_queue" data-availability="free">
            <input type="hidden" name="pass" value="7KQ2M9XW3P-12">"#;
        assert_eq!(attribute(html, "data-phase").as_deref(), Some("pre_queue"));
        assert_eq!(
            attribute(html, "data-availability").as_deref(),
            Some("free")
        );
        assert_eq!(attribute(html, "data-missing"), None);
        assert_eq!(
            attribute(html, "name=\"pass\" value").as_deref(),
            Some("7KQ2M9XW3P-12")
        );
    }
}
