//! The waiting room with a crowd, as a drop runs: thousands join the
//! pre-queue across two instances, the draw puts them in the published
//! order, and each buys and pays when admitted. Exactly the stock is sold,
//! to the first tickets of the published order; passes that lapse hand
//! their place to the next ticket; `flashsale draw verify` checks it all from
//! the outside. The waiting room lives in Postgres alone: a Redis restart
//! mid-queue loses no place and oversells nothing.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use flashsale::domain::Password;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use tokio::sync::Barrier;

use crate::helpers::*;

/// Another instance of the same shop: same database (so one waiting room),
/// cookie key and Redis keys (so one stock gate), its own server, cache of
/// the rooms and background state.
async fn second_instance(app: &TestApp) -> TestApp {
    let key = app.settings.session_key.clone();
    let prefix = app.settings.redis_key_prefix.clone();
    let urls = app.settings.redis_urls.clone();
    let pass = app.settings.queue_pass;
    spawn_app_on(TestDb::attach(&app.db.url), move |s| {
        s.session_key = key;
        s.redis_key_prefix = prefix;
        s.redis_urls = urls;
        s.queue_pass = pass;
    })
    .await
}

/// `n` customers, addresses confirmed, in one statement with one password
/// hash (argon2 is slow on purpose), signed in through the shop's form, alternately on each instance.
async fn signed_in_crowd(apps: &[&TestApp], n: usize, tag: &str) -> Vec<Browser> {
    let hash =
        flashsale::services::accounts::hash_password(&Password::parse(PASSWORD).unwrap()).unwrap();
    let mut conn = apps[0].db.conn();
    diesel::sql_query(
        "INSERT INTO customers (email, password_hash, role, email_canonical, email_confirmed_at) \
         SELECT $1 || n || '@example.com', $2, 'customer', $1 || n || '@example.com', now() \
         FROM generate_series(0, $3 - 1) AS n",
    )
    .bind::<Text, _>(tag)
    .bind::<Text, _>(hash)
    .bind::<BigInt, _>(n as i64)
    .execute(&mut conn)
    .unwrap();
    let addresses: Vec<String> = apps.iter().map(|a| a.address.clone()).collect();
    futures::stream::iter(0..n)
        .map(|i| {
            let base = addresses[i % addresses.len()].clone();
            let email = format!("{tag}{i}@example.com");
            async move { Browser::sign_in(&base, &email, PASSWORD).await }
        })
        .buffered(16)
        .collect()
        .await
}

/// A queue-mode sale of `units` (one per customer) whose waiting room is
/// open and whose start is an hour away, until `start_now`.
async fn queue_sale(app: &TestApp, units: i32) -> i64 {
    let product = app.product(units, Some(1)).await;
    app.db.count(&format!(
        "WITH u AS (UPDATE products SET queue_mode = true, \
           queue_opens_at = now() - interval '1 minute', sale_starts_at = now() + interval '1 hour' \
         WHERE id = {product} RETURNING 1) SELECT count(*) AS n FROM u"
    ));
    flashsale::services::sale_cache::invalidate();
    product
}

fn start_now(app: &TestApp, product: i64) {
    app.db.count(&format!(
        "WITH u AS (UPDATE products SET sale_starts_at = now() WHERE id = {product} RETURNING 1) \
         SELECT count(*) AS n FROM u"
    ));
    flashsale::services::sale_cache::invalidate();
}

/// Every instance's queue tick, a few times a second, until dropped (also
/// when the test fails).
struct Ticking {
    running: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Ticking {
    fn start(apps: &[&TestApp]) -> Ticking {
        let shops: Vec<_> = apps.iter().map(|a| a.shop.clone()).collect();
        let running = Arc::new(AtomicBool::new(true));
        let still = running.clone();
        let task = tokio::spawn(async move {
            while still.load(Ordering::Relaxed) {
                // Every instance at once, as in production: the draw and the
                // issuer take the room's locks, and the second finds the
                // work done.
                let ticks = shops
                    .iter()
                    .map(flashsale::services::waiting_room::run_once);
                for result in futures::future::join_all(ticks).await {
                    if let Err(error) = result {
                        eprintln!("queue tick: {error}");
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Ticking { running, task }
    }
}

impl Drop for Ticking {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Relaxed);
        self.task.abort();
    }
}

async fn queue_json(buyer: &Browser, product: i64) -> Option<serde_json::Value> {
    let response = buyer
        .web
        .get(&format!("/products/{product}/queue.json"))
        .await
        .ok()?;
    if response.status() != StatusCode::OK {
        return None;
    }
    serde_json::from_str(&response.text().await.ok()?).ok()
}

async fn join(buyer: &Browser, product: i64) -> StatusCode {
    buyer.join_waiting_room(product).await.status()
}

/// Everyone joins, `wave` at a time, each wave released at once.
async fn join_all(buyers: &[Browser], product: i64, wave: usize) {
    for group in buyers.chunks(wave) {
        let barrier = Arc::new(Barrier::new(group.len()));
        let joins = group.iter().cloned().map(|buyer| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let token = buyer.csrf().await;
                let solved = buyer.bot_check(product).await;
                barrier.wait().await;
                buyer
                    .post(
                        &format!("/products/{product}/queue"),
                        &[("csrf_token", token.as_str()), ("altcha", solved.as_str())],
                    )
                    .await
                    .status()
            })
        });
        for status in futures::future::join_all(joins).await {
            assert_eq!(status.unwrap(), StatusCode::SEE_OTHER, "a join");
        }
    }
}

/// What became of one customer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ending {
    Bought {
        ticket: String,
    },
    /// Admitted, let the pass lapse on purpose.
    NoShow {
        ticket: String,
    },
    /// Never admitted: the stock went to those before.
    Left {
        state: String,
    },
    /// Bought earlier (the pass is used).
    BoughtBefore {
        ticket: String,
    },
}

/// One customer: polls the waiting room (often when near the front, rarely
/// when far back, as the page's script does), and when admitted buys one
/// unit with the pass and pays, unless told to let the pass lapse.
async fn wait_and_buy(
    buyer: Browser,
    product: i64,
    no_shows: Arc<HashSet<String>>,
    deadline: Instant,
) -> Ending {
    let mut rng = rand::rngs::StdRng::from_entropy();
    let mut admitted_ticket = None;
    while Instant::now() < deadline {
        let Some(status) = queue_json(&buyer, product).await else {
            // Redis or the instance is gone for a moment: ask again.
            tokio::time::sleep(Duration::from_millis(300)).await;
            continue;
        };
        let state = status["state"].as_str().unwrap_or_default().to_string();
        let ticket = status["ticket"].as_str().unwrap_or_default().to_string();
        if status["pass_state"] == "used" {
            return Ending::BoughtBefore { ticket };
        }
        match state.as_str() {
            "admitted" if no_shows.contains(&ticket) => {
                admitted_ticket = Some(ticket);
            }
            "admitted" => {
                let pass = status["pass"]
                    .as_str()
                    .expect("an admitted customer's pass");
                let token = buyer.csrf().await;
                let key = uuid::Uuid::new_v4().to_string();
                let fields = [
                    ("quantity", "1"),
                    ("csrf_token", token.as_str()),
                    ("idempotency_key", key.as_str()),
                    ("pass", pass),
                ];
                // A 503 (a Redis restart just now, a lock not had in time)
                // is what a customer answers by sending the same form again:
                // the same key, so it buys at most once.
                let mut bought = buyer
                    .post(&format!("/products/{product}/buy"), &fields)
                    .await;
                for _ in 0..20 {
                    if bought.status() != StatusCode::SERVICE_UNAVAILABLE {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    bought = buyer
                        .post(&format!("/products/{product}/buy"), &fields)
                        .await;
                }
                let status = bought.status();
                assert_eq!(
                    status,
                    StatusCode::SEE_OTHER,
                    "ticket {ticket} bought with its pass: {}",
                    bought.text().await.unwrap_or_default()
                );
                let order = order_id_from(&bought);
                let paid = buyer.pay(order, GOOD_CARD).await;
                assert_eq!(paid.status(), StatusCode::SEE_OTHER, "order {order} paid");
                return Ending::Bought { ticket };
            }
            "sold_out" | "closed" => {
                return match admitted_ticket {
                    Some(ticket) => Ending::NoShow { ticket },
                    None => Ending::Left { state },
                };
            }
            _ => {}
        }
        let far = status["ahead"].as_i64().unwrap_or(0) > 150;
        let pause = if far { 1_500 } else { 250 };
        tokio::time::sleep(Duration::from_millis(pause + rng.gen_range(0..100))).await;
    }
    panic!("customer still waiting at the deadline (ticket {admitted_ticket:?})");
}

async fn draw_json(buyer: &Browser, product: i64) -> serde_json::Value {
    let response = buyer.get(&format!("/products/{product}/draw.json")).await;
    assert_eq!(response.status(), StatusCode::OK);
    serde_json::from_str(&response.text().await.unwrap()).unwrap()
}

/// Waits until the draw's seed is revealed, and answers the published order.
async fn published_order(buyer: &Browser, product: i64) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let record = draw_json(buyer, product).await;
        if !record["seed"].is_null() {
            return record["order"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_string())
                .collect();
        }
        assert!(Instant::now() < deadline, "no draw 30 s after the start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn draw_verify(base: &str, product: i64) {
    let verified = std::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
        .args(["draw", "verify", "--base-url", base, "--product"])
        .arg(product.to_string())
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(
        verified.status.success(),
        "flashsale draw verify: {}{}",
        String::from_utf8_lossy(&verified.stdout),
        String::from_utf8_lossy(&verified.stderr)
    );
}

/// The tickets the stock must have gone to: the published order's first
/// tickets, each no-show's place passing to the next one.
fn expected_buyers(order: &[String], no_shows: &HashSet<String>, units: usize) -> Vec<String> {
    order
        .iter()
        .filter(|t| !no_shows.contains(*t))
        .take(units)
        .cloned()
        .collect()
}

fn admissions(app: &TestApp, product: i64) -> Vec<(i32, String, String)> {
    #[derive(QueryableByName)]
    struct Admission {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        number: i32,
        #[diesel(sql_type = Text)]
        ticket: String,
        #[diesel(sql_type = Text)]
        state: String,
    }
    let mut conn = app.db.conn();
    diesel::sql_query(format!(
        "SELECT number, ticket, state FROM queue_admissions WHERE product_id = {product} ORDER BY number"
    ))
    .load::<Admission>(&mut conn)
    .unwrap()
    .into_iter()
    .map(|a| (a.number, a.ticket, a.state))
    .collect()
}

/// Admissions went down the published order one by one: the n-th to the
/// n-th ticket, the no-shows' lapsed, the rest used.
fn assert_admitted_in_order(
    app: &TestApp,
    product: i64,
    order: &[String],
    no_shows: &HashSet<String>,
    units: usize,
) {
    let admitted = admissions(app, product);
    assert_eq!(admitted.len(), units + no_shows.len(), "{admitted:?}");
    for (n, (number, ticket, state)) in admitted.iter().enumerate() {
        assert_eq!(*number as usize, n + 1);
        assert_eq!(ticket, &order[n], "admission {number} went out of order");
        let expected = if no_shows.contains(ticket) {
            "lapsed"
        } else {
            "used"
        };
        assert_eq!(state, expected, "admission {number} ({ticket})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_join_across_two_instances_and_the_first_hundred_tickets_buy_the_hundred_units(
) {
    const CROWD: usize = 2_000;
    const UNITS: usize = 100;
    // Long enough for a buyer to see its pass and get through the 503s a
    // busy lock answers on a slow machine; short enough that the no-shows
    // lapse within the test.
    let a = spawn_app_with(|s| s.queue_pass = Duration::from_secs(60)).await;
    let b = second_instance(&a).await;
    let product = queue_sale(&a, UNITS as i32).await;
    let _ticking = Ticking::start(&[&a, &b]);
    let crowd = signed_in_crowd(&[&a, &b], CROWD, "crowd").await;

    join_all(&crowd, product, 500).await;
    assert_eq!(
        a.db.count(&format!(
            "SELECT count(*) AS n FROM queue_entries WHERE product_id = {product}"
        )),
        CROWD as i64
    );
    assert_eq!(
        a.db.count(&format!(
            "SELECT count(DISTINCT ticket) AS n FROM queue_entries WHERE product_id = {product} AND NOT late"
        )),
        CROWD as i64
    );
    // Joining again keeps the place: no row, the same ticket.
    let before = queue_json(&crowd[7], product).await.unwrap();
    assert_eq!(join(&crowd[7], product).await, StatusCode::SEE_OTHER);
    let again = queue_json(&crowd[7], product).await.unwrap();
    assert_eq!(before["ticket"], again["ticket"]);
    assert_eq!(again["state"], "waiting");
    assert_eq!(
        a.db.count("SELECT count(*) AS n FROM queue_entries"),
        CROWD as i64
    );
    assert_eq!(a.db.count("SELECT count(*) AS n FROM orders"), 0);

    start_now(&a, product);
    let order = published_order(&crowd[0], product).await;
    assert_eq!(order.len(), CROWD);
    // Five admitted customers never buy: their passes lapse, and each
    // place goes to the next ticket in the published order.
    let no_shows: Arc<HashSet<String>> = Arc::new(
        [3, 17, 42, 77, 99]
            .iter()
            .map(|&i| order[i].clone())
            .collect(),
    );

    let deadline = Instant::now() + Duration::from_secs(120);
    let endings = futures::future::join_all(
        crowd
            .iter()
            .cloned()
            .map(|buyer| tokio::spawn(wait_and_buy(buyer, product, no_shows.clone(), deadline))),
    )
    .await;
    let endings: Vec<Ending> = endings.into_iter().map(Result::unwrap).collect();

    let bought: HashSet<String> = endings
        .iter()
        .filter_map(|e| match e {
            Ending::Bought { ticket } => Some(ticket.clone()),
            _ => None,
        })
        .collect();
    let expected: HashSet<String> = expected_buyers(&order, &no_shows, UNITS)
        .into_iter()
        .collect();
    assert_eq!(bought.len(), UNITS);
    assert_eq!(
        bought, expected,
        "the units went to other tickets than the order's first"
    );
    let left: HashMap<String, usize> = endings.iter().fold(HashMap::new(), |mut m, e| {
        if let Ending::Left { state } = e {
            *m.entry(state.clone()).or_default() += 1;
        }
        m
    });
    assert_eq!(
        left.get("sold_out"),
        Some(&(CROWD - UNITS - no_shows.len())),
        "{left:?}"
    );

    assert_eq!(a.db.count("SELECT count(*) AS n FROM orders"), UNITS as i64);
    assert_eq!(
        a.db.count("SELECT count(*) AS n FROM orders WHERE status = 'paid'"),
        UNITS as i64
    );
    assert_eq!(a.db.stock(product), 0);
    assert_admitted_in_order(&a, product, &order, &no_shows, UNITS);
    a.db.assert_audit_clean();
    draw_verify(&a.address, product);
    draw_verify(&b.address, product);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_restart_mid_queue_loses_no_place_and_oversells_nothing() {
    const CROWD: usize = 300;
    const UNITS: usize = 30;
    let (redis, port) = start_redis();
    let mut redis = Some(redis);
    let a = spawn_app_with(|s| {
        s.redis_urls = vec![format!("redis://127.0.0.1:{port}")];
        // Long enough that no pass lapses here: lapses are the other test's.
        s.queue_pass = Duration::from_secs(90);
    })
    .await;
    let b = second_instance(&a).await;
    let product = queue_sale(&a, UNITS as i32).await;
    let ticking = Ticking::start(&[&a, &b]);
    let crowd = signed_in_crowd(&[&a, &b], CROWD, "restart").await;
    join_all(&crowd, product, 300).await;
    start_now(&a, product);
    let order = published_order(&crowd[0], product).await;

    // The first ten tickets buy and pay; then Redis dies mid-queue.
    let no_shows = Arc::new(HashSet::new());
    let ticket_of = |status: &serde_json::Value| status["ticket"].as_str().unwrap().to_string();
    let mut first = Vec::new();
    for buyer in &crowd {
        let status = queue_json(buyer, product).await.unwrap();
        if order[..10].contains(&ticket_of(&status)) {
            first.push(buyer.clone());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let endings = futures::future::join_all(
        first
            .into_iter()
            .map(|buyer| tokio::spawn(wait_and_buy(buyer, product, no_shows.clone(), deadline))),
    )
    .await;
    for ending in endings {
        let ending = ending.unwrap();
        assert!(matches!(ending, Ending::Bought { .. }), "{ending:?}");
    }
    // Wait for the tick to issue the next passes, so the places before and
    // after are compared at rest.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut before = HashMap::new();
    for buyer in &crowd {
        let status = queue_json(buyer, product).await.unwrap();
        before.insert(
            ticket_of(&status),
            (status["position"].clone(), status["state"].clone()),
        );
    }

    drop(ticking);
    drop(redis.take());
    // While Redis is down, every place still reads as it was: the waiting
    // room does not live there.
    for buyer in crowd.iter().step_by(10) {
        let status = queue_json(buyer, product)
            .await
            .expect("queue.json answers without Redis");
        assert_eq!(
            before[&ticket_of(&status)].0,
            status["position"],
            "{status}"
        );
    }
    // Restarted empty: no gate counts, no locks (and nothing of the line,
    // which was never there).
    let _redis = start_redis_on(port);
    let ticking = Ticking::start(&[&a, &b]);
    let rebuilt_by = Instant::now() + Duration::from_secs(20);
    for buyer in &crowd {
        let status = loop {
            if let Some(status) = queue_json(buyer, product).await {
                if status["ticket"].is_string() {
                    break status;
                }
            }
            assert!(Instant::now() < rebuilt_by, "a place was lost");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let ticket = ticket_of(&status);
        assert_eq!(
            before[&ticket].0, status["position"],
            "ticket {ticket} moved across the Redis restart"
        );
        let was = before[&ticket].1.as_str().unwrap();
        let is = status["state"].as_str().unwrap();
        assert!(
            was == is || (was == "waiting" && is == "admitted"),
            "ticket {ticket} was {was}, is {is} after the restart"
        );
    }

    // The rest of the sale, every customer buying when admitted.
    let endings = futures::future::join_all(
        crowd
            .iter()
            .cloned()
            .map(|buyer| tokio::spawn(wait_and_buy(buyer, product, no_shows.clone(), deadline))),
    )
    .await;
    drop(ticking);
    let bought: HashSet<String> = endings
        .into_iter()
        .filter_map(|e| match e.unwrap() {
            Ending::Bought { ticket } => Some(ticket),
            _ => None,
        })
        .collect();
    // The ten who bought before answer "closed" or "sold_out" now, so the
    // tickets bought in this second round are the order's next ones.
    let expected: HashSet<String> = order[10..UNITS].iter().cloned().collect();
    assert_eq!(bought, expected);
    assert_eq!(a.db.count("SELECT count(*) AS n FROM orders"), UNITS as i64);
    assert_eq!(a.db.stock(product), 0);
    assert_admitted_in_order(&a, product, &order, &no_shows, UNITS);
    a.db.assert_audit_clean();
    draw_verify(&a.address, product);
}
