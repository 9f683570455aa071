//! The waiting room's use cases (issue #16) against real Postgres and
//! Redis: joins, the draw, passes in order within the stock, buying with a
//! pass, hand-overs (a lapse, a decline), a Redis that lost the queue, and
//! the record `verify` checks. The services are called with the spawned
//! app's `Shop`, and the tick (`run_once`) directly, so nothing waits on
//! a timer; the app's own tick is set to an hour so it does not race them
//! (but for one test of that tick itself).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use diesel::prelude::*;
use flashsale::domain::draw::{
    draw_order, verify, DrawAdmission, DrawRecord, PassState as DrawnState, Ticket,
};
use flashsale::domain::{CustomerId, OrderStatus, ProductId, Quantity};
use flashsale::error::{AppError, PassRefusal};
use flashsale::queue::{Behind, Entry, PassRef, PassState, QueueState, Retire};
use flashsale::services::checkout::{purchase, purchase_with_pass, Line, PurchaseOutcome};
use flashsale::services::queue::{self, read_record, run_once, QueueStatus, Standing};
use flashsale::services::restore::restore_order;
use flashsale::services::sale_cache;

use crate::helpers::*;

async fn queue_app(pass: Duration) -> TestApp {
    spawn_app_with(|s| {
        s.queue_tick = Duration::from_secs(3600);
        s.queue_pass = pass;
    })
    .await
}

/// An app whose joins are over quickly: a join may take a connection wait
/// and a statement, so `longest_join` is 2 × (0.1 + 0.4) s.
async fn quick_join_app() -> TestApp {
    spawn_app_with(|s| {
        s.queue_tick = Duration::from_secs(3600);
        s.db_connect_timeout = Duration::from_millis(100);
        s.db_statement_timeout = Duration::from_millis(400);
    })
    .await
}

/// A join that got its place in Redis and whose process died before its
/// row was written.
async fn joined_in_redis_only(app: &TestApp, product: ProductId, customer: CustomerId) -> Entry {
    match app
        .shop
        .waiting_room
        .join(product, customer, &Ticket::generate())
        .await
        .unwrap()
    {
        flashsale::queue::Joined::New(entry) => entry,
        other => panic!("{other:?}"),
    }
}

/// The row of `entry`'s place commits (its joiner's insert, late).
fn commit_row(app: &TestApp, product: ProductId, entry: &Entry) {
    sql(
        app,
        &format!(
            "INSERT INTO queue_entries (product_id, customer_id, ticket, seq, joined_at, late) \
             VALUES ({product}, {}, '{}', {}, '{}', {})",
            entry.customer,
            entry.ticket,
            entry.seq,
            entry.joined_at.to_rfc3339(),
            entry.late
        ),
    );
}

/// `n` customers straight into the table (no password hashing): the
/// services take their ids.
fn customers(app: &TestApp, n: usize) -> Vec<CustomerId> {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        id: i64,
    }
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let ids: Vec<Id> = diesel::sql_query(format!(
        "INSERT INTO customers (email, password_hash) \
         SELECT 'q' || g || '-{}@example.com', 'not a hash' FROM generate_series(1, {n}) g \
         ORDER BY g RETURNING id",
        &tag[..8]
    ))
    .load(&mut app.db.conn())
    .unwrap();
    ids.into_iter().map(|i| CustomerId(i.id)).collect()
}

fn sql(app: &TestApp, statement: &str) {
    diesel::sql_query(statement)
        .execute(&mut app.db.conn())
        .unwrap();
    // Raw SQL bypasses the services: the shelf is told, as an edit would.
    sale_cache::invalidate();
}

/// A sale in queue mode whose waiting room is open and whose start is an
/// hour away (`start_now` brings it forward).
async fn queue_product(app: &TestApp, stock: i32, limit: i32) -> ProductId {
    let product = app.product(stock, Some(limit)).await;
    sql(
        app,
        &format!(
            "UPDATE products SET queue_mode = true, sale_starts_at = now() + interval '1 hour', \
             queue_opens_at = now() - interval '1 minute' WHERE id = {product}"
        ),
    );
    ProductId(product)
}

fn start_now(app: &TestApp, product: ProductId) {
    sql(
        app,
        &format!(
            "UPDATE products SET sale_starts_at = now(), queue_opens_at = now() - interval '1 hour' \
             WHERE id = {product}"
        ),
    );
}

async fn join_all(app: &TestApp, product: ProductId, who: &[CustomerId]) -> Vec<Ticket> {
    let mut tickets = Vec::new();
    for customer in who {
        tickets.push(queue::join(&app.shop, *customer, product).await.unwrap());
    }
    tickets
}

async fn tick(app: &TestApp) -> queue::TickReport {
    let report = run_once(&app.shop).await.unwrap();
    assert_eq!(report.failed, 0, "{report:?}");
    report
}

async fn status(app: &TestApp, customer: CustomerId, product: ProductId) -> QueueStatus {
    queue::status(&app.shop, Some(customer), product)
        .await
        .unwrap()
}

fn count(app: &TestApp, sql: &str) -> i64 {
    app.db.count(sql)
}

fn admissions(app: &TestApp, product: ProductId, state: &str) -> i64 {
    count(
        app,
        &format!(
            "SELECT count(*) AS n FROM queue_admissions WHERE product_id = {product} AND state = '{state}'"
        ),
    )
}

async fn buy(
    app: &TestApp,
    customer: CustomerId,
    product: ProductId,
    pass: Option<PassRef>,
) -> Result<PurchaseOutcome, AppError> {
    let line = Line {
        product,
        quantity: Quantity::new(1).unwrap(),
    };
    purchase_with_pass(&app.shop, customer, line, None, pass).await
}

fn refusal(result: Result<PurchaseOutcome, AppError>) -> PassRefusal {
    match result {
        Err(AppError::PassRefused(refusal)) => refusal,
        other => panic!("expected a pass refusal, got {other:?}"),
    }
}

/// The order as Redis has it: every entry's ticket by position.
async fn line_of(app: &TestApp, product: ProductId, who: &[CustomerId]) -> Vec<Ticket> {
    let mut placed = Vec::new();
    for customer in who {
        let status = status(app, *customer, product).await;
        placed.push((status.position.expect("drawn"), status.ticket.unwrap()));
    }
    placed.sort();
    placed.into_iter().map(|(_, t)| t).collect()
}

/// `draw.json` as the tables have it.
async fn record_of(app: &TestApp, product: ProductId) -> DrawRecord {
    let shop = app.shop.clone();
    let record = flashsale::db::run(&shop.pool, move |conn| read_record(conn, product))
        .await
        .unwrap();
    #[derive(QueryableByName)]
    struct Draw {
        #[diesel(sql_type = diesel::sql_types::Timestamptz)]
        starts_at: chrono::DateTime<chrono::Utc>,
        #[diesel(sql_type = diesel::sql_types::Bytea)]
        seed_sha256: Vec<u8>,
    }
    let draw: Draw = diesel::sql_query(format!(
        "SELECT p.sale_starts_at AS starts_at, d.seed_sha256 FROM products p \
         JOIN queue_draws d ON d.product_id = p.id WHERE p.id = {product}"
    ))
    .get_result(&mut app.db.conn())
    .unwrap();
    let entries = record.draw_entries();
    let seed = record.seed.clone().filter(|_| record.drawn_at.is_some());
    let order = seed
        .as_ref()
        .map(|seed| draw_order(seed, &entries))
        .unwrap_or_default();
    DrawRecord {
        product,
        starts_at: draw.starts_at,
        seed_sha256: flashsale::domain::draw::SeedCommitment::parse_hex(&hex::encode(
            draw.seed_sha256,
        ))
        .unwrap(),
        seed,
        entries,
        order,
        admissions: record
            .admissions
            .iter()
            .map(|(issued, state)| DrawAdmission {
                ticket: issued.ticket.clone(),
                issued_at: issued.issued_at,
                state: match state {
                    PassState::Used => DrawnState::Used,
                    PassState::Lapsed => DrawnState::Lapsed,
                    _ => DrawnState::Issued,
                },
            })
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn joining_twice_keeps_one_place_and_one_row() {
    let app = queue_app(Duration::from_secs(120)).await;
    let product = queue_product(&app, 5, 1).await;
    let [alice, bob] = customers(&app, 2)[..] else {
        unreachable!()
    };
    let first = queue::join(&app.shop, alice, product).await.unwrap();
    let again = queue::join(&app.shop, alice, product).await.unwrap();
    assert_eq!(first, again, "joining again keeps the same ticket");
    queue::join(&app.shop, bob, product).await.unwrap();
    assert_eq!(
        count(
            &app,
            &format!("SELECT count(*) AS n FROM queue_entries WHERE product_id = {product}")
        ),
        2
    );
    assert_eq!(
        count(
            &app,
            &format!(
                "SELECT count(*) AS n FROM queue_entries WHERE customer_id = {alice} AND ticket = '{first}'"
            )
        ),
        1
    );
    // The commitment was there before the first ticket, and is not replaced.
    assert_eq!(
        count(
            &app,
            "SELECT count(*) AS n FROM queue_draws WHERE drawn_at IS NULL"
        ),
        1
    );

    let mine = status(&app, alice, product).await;
    assert_eq!(mine.standing, Standing::Waiting);
    assert_eq!(mine.ticket, Some(first));
    assert_eq!(mine.queue, QueueState::Pre);
    assert_eq!(mine.position, None, "no position before the draw");
    let stranger = queue::status(&app.shop, None, product).await.unwrap();
    assert_eq!(stranger.standing, Standing::NotJoined);
    assert_eq!(stranger.ticket, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn join_refusals_write_nothing() {
    let app = queue_app(Duration::from_secs(120)).await;
    let [customer] = customers(&app, 1)[..] else {
        unreachable!()
    };
    let nothing_written = |app: &TestApp| {
        count(app, "SELECT count(*) AS n FROM queue_entries")
            + count(app, "SELECT count(*) AS n FROM queue_admissions")
    };

    let open_mode = ProductId(app.product(5, Some(1)).await);
    let refused = queue::join(&app.shop, customer, open_mode)
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, AppError::Conflict { title, .. } if title.contains("no waiting room")),
        "{refused:?}"
    );
    let missing = queue::join(&app.shop, customer, ProductId(987_654))
        .await
        .unwrap_err();
    assert!(matches!(missing, AppError::NotFound(_)), "{missing:?}");

    let not_yet = queue_product(&app, 5, 1).await;
    sql(
        &app,
        &format!("UPDATE products SET queue_opens_at = now() + interval '10 minutes' WHERE id = {not_yet}"),
    );
    let refused = queue::join(&app.shop, customer, not_yet).await.unwrap_err();
    assert!(
        matches!(&refused, AppError::Conflict { title, .. } if title.contains("not open yet")),
        "{refused:?}"
    );

    let ended = queue_product(&app, 5, 1).await;
    sql(
        &app,
        &format!(
            "UPDATE products SET queue_opens_at = now() - interval '3 hours', \
             sale_starts_at = now() - interval '2 hours', sale_ends_at = now() - interval '1 hour' \
             WHERE id = {ended}"
        ),
    );
    let refused = queue::join(&app.shop, customer, ended).await.unwrap_err();
    assert!(
        matches!(&refused, AppError::Conflict { title, .. } if title.contains("closed")),
        "{refused:?}"
    );

    // A queue closed as sold out takes nobody.
    let sold_out = queue_product(&app, 1, 1).await;
    queue::ensure_queue(
        &app.shop,
        &queue::queue_sale(&app.shop, sold_out).await.unwrap(),
    )
    .await
    .unwrap();
    start_now(&app, sold_out);
    tick(&app).await;
    assert!(app
        .shop
        .waiting_room
        .set_state(sold_out, QueueState::SoldOut)
        .await
        .unwrap());
    let refused = queue::join(&app.shop, customer, sold_out)
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, AppError::Conflict { title, .. } if title.contains("Sold out")),
        "{refused:?}"
    );

    assert_eq!(nothing_written(&app), 0);
    let view = app
        .shop
        .waiting_room
        .status(sold_out, customer)
        .await
        .unwrap();
    assert_eq!(view.entry, None, "no place left in Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_draw_is_the_seeds_order_and_reveals_the_seed() {
    let app = queue_app(Duration::from_secs(120)).await;
    let product = queue_product(&app, 3, 1).await;
    let who = customers(&app, 20);
    let early = join_all(&app, product, &who[..19]).await;
    assert_eq!(tick(&app).await.drawn, 0, "no draw before the start");
    assert_eq!(
        count(
            &app,
            "SELECT count(*) AS n FROM queue_draws WHERE drawn_at IS NOT NULL"
        ),
        0
    );

    start_now(&app, product);
    let report = tick(&app).await;
    assert_eq!(report.drawn, 1, "{report:?}");
    assert_eq!(
        count(
            &app,
            "SELECT count(*) AS n FROM queue_draws WHERE drawn_at IS NOT NULL"
        ),
        1
    );
    let late = queue::join(&app.shop, who[19], product).await.unwrap();

    let record = record_of(&app, product).await;
    let seed = record.seed.clone().expect("revealed");
    assert_eq!(record.entries.iter().filter(|e| e.late).count(), 1);
    let mut expected = draw_order(&seed, &record.entries);
    assert_eq!(expected.pop(), Some(late), "the late one goes to the back");
    assert_eq!(line_of(&app, product, &who[..19]).await, expected);
    assert_ne!(
        expected, early,
        "the arrival order is not the draw (1 in 19! chance)"
    );
    assert_eq!(status(&app, who[19], product).await.position, Some(20));
    // A second tick (or instance) draws nothing again.
    assert_eq!(tick(&app).await.drawn, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn passes_go_in_line_order_and_never_cover_more_than_the_stock() {
    let app = queue_app(Duration::from_secs(120)).await;
    let product = queue_product(&app, 3, 1).await;
    let who = customers(&app, 10);
    join_all(&app, product, &who).await;
    start_now(&app, product);
    let report = tick(&app).await;
    assert_eq!(report.issued, 3, "{report:?}");
    assert_eq!(tick(&app).await.issued, 0, "no more passes than units");
    let line = line_of(&app, product, &who).await;
    #[derive(QueryableByName)]
    struct Admitted {
        #[diesel(sql_type = diesel::sql_types::Text)]
        ticket: String,
    }
    let admitted: Vec<String> = diesel::sql_query(format!(
        "SELECT ticket FROM queue_admissions WHERE product_id = {product} ORDER BY number"
    ))
    .load::<Admitted>(&mut app.db.conn())
    .unwrap()
    .into_iter()
    .map(|a| a.ticket)
    .collect();
    let first_three: Vec<String> = line[..3].iter().map(|t| t.to_string()).collect();
    assert_eq!(admitted, first_three, "recorded, in line order");
    let mut standings = HashMap::new();
    for customer in &who {
        let status = status(&app, *customer, product).await;
        let admitted = status.standing == Standing::Admitted;
        assert_eq!(admitted, status.position.unwrap() <= 3, "{status:?}");
        if admitted {
            assert!(status.pass.is_some() && status.pass_expires_at.is_some());
        } else {
            assert_eq!(
                status.ahead,
                Some(status.position.unwrap() - 4),
                "{status:?}"
            );
        }
        assert_eq!((status.units_left, status.held), (0, 3), "{status:?}");
        *standings.entry(status.standing).or_insert(0) += 1;
    }
    assert_eq!(standings[&Standing::Admitted], 3);
    assert_eq!(standings[&Standing::Waiting], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_buy_needs_the_buyers_own_open_pass() {
    let app = queue_app(Duration::from_secs(2)).await;
    let product = queue_product(&app, 2, 1).await;
    let who = customers(&app, 4);
    join_all(&app, product, &who).await;
    start_now(&app, product);
    tick(&app).await;
    let mut by_position: Vec<(i64, CustomerId, QueueStatus)> = Vec::new();
    for customer in &who {
        let status = status(&app, *customer, product).await;
        by_position.push((status.position.unwrap(), *customer, status));
    }
    by_position.sort_by_key(|(p, _, _)| *p);
    let (first, first_pass) = (by_position[0].1, by_position[0].2.pass.clone().unwrap());
    let (second, second_pass) = (by_position[1].1, by_position[1].2.pass.clone().unwrap());
    let (third, fourth) = (by_position[2].1, by_position[3].1);
    let stock = app.db.stock(product.get());

    assert_eq!(
        refusal(buy(&app, third, product, None).await),
        PassRefusal::NoPass
    );
    let not_issued = PassRef {
        ticket: by_position[2].2.ticket.clone().unwrap(),
        number: 3,
    };
    assert_eq!(
        refusal(buy(&app, third, product, Some(not_issued)).await),
        PassRefusal::NoPass
    );
    assert_eq!(
        refusal(buy(&app, third, product, Some(first_pass.clone())).await),
        PassRefusal::NotYours
    );
    let forged = PassRef {
        ticket: Ticket::generate(),
        number: 1,
    };
    assert_eq!(
        refusal(buy(&app, third, product, Some(forged)).await),
        PassRefusal::Forged
    );
    let wrong_number = PassRef {
        number: first_pass.number + 7,
        ..first_pass.clone()
    };
    assert_eq!(
        refusal(buy(&app, first, product, Some(wrong_number)).await),
        PassRefusal::Forged
    );
    // A cart (or any purchase but one with a pass) is turned away too.
    let cart = purchase(
        &app.shop,
        first,
        vec![Line {
            product,
            quantity: Quantity::new(1).unwrap(),
        }],
        None,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&cart, AppError::Conflict { title, .. } if title.contains("waiting room")),
        "{cart:?}"
    );
    assert_eq!(
        count(&app, "SELECT count(*) AS n FROM orders"),
        0,
        "refusals write nothing"
    );
    assert_eq!(app.db.stock(product.get()), stock);
    // ... and leave the passes as they were.
    assert_eq!(
        status(&app, first, product).await.pass_state,
        Some(PassState::Issued)
    );

    let bought = buy(&app, first, product, Some(first_pass.clone()))
        .await
        .unwrap();
    let PurchaseOutcome::Purchased(order) = bought else {
        panic!("{bought:?}")
    };
    assert_eq!(
        count(
            &app,
            &format!(
                "SELECT count(*) AS n FROM queue_admissions WHERE state = 'used' AND order_id = {order} \
                 AND ticket = '{}'",
                first_pass.ticket
            )
        ),
        1
    );
    assert_eq!(
        refusal(buy(&app, first, product, Some(first_pass)).await),
        PassRefusal::Used
    );
    assert_eq!(
        status(&app, first, product).await.standing,
        Standing::Closed
    );
    assert_eq!(
        status(&app, first, product).await.pass_state,
        Some(PassState::Used)
    );

    // The second pass runs out unused: its place goes to the third.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let report = tick(&app).await;
    assert_eq!(report.issued, 1, "{report:?}");
    assert_eq!(
        refusal(buy(&app, second, product, Some(second_pass)).await),
        PassRefusal::Lapsed
    );
    assert_eq!(admissions(&app, product, "lapsed"), 1);
    let third_status = status(&app, third, product).await;
    assert_eq!(third_status.standing, Standing::Admitted);
    let bought = buy(&app, third, product, third_status.pass).await.unwrap();
    assert!(
        matches!(bought, PurchaseOutcome::Purchased(_)),
        "{bought:?}"
    );
    tick(&app).await;

    assert_eq!(count(&app, "SELECT count(*) AS n FROM orders"), 2);
    assert_eq!(app.db.stock(product.get()), 0);
    assert_eq!(admissions(&app, product, "used"), 2);
    // Both orders are unpaid, so a unit may still come back: the last in
    // line keeps waiting, and is told nothing is left and what is held.
    let fourth_status = status(&app, fourth, product).await;
    assert_eq!(
        fourth_status.standing,
        Standing::Waiting,
        "{fourth_status:?}"
    );
    assert_eq!(
        (fourth_status.units_left, fourth_status.held),
        (0, 2),
        "{fourth_status:?}"
    );
    assert_eq!(count(&app, "SELECT count(*) AS n FROM queue_admissions"), 3);
    app.db.assert_audit_clean();
    assert!(verify(&record_of(&app, product).await).passed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_declined_payment_admits_the_next_waiter() {
    let app = queue_app(Duration::from_secs(120)).await;
    let product = queue_product(&app, 1, 1).await;
    let who = customers(&app, 2);
    join_all(&app, product, &who).await;
    start_now(&app, product);
    tick(&app).await;
    let line = line_of(&app, product, &who).await;
    let (first, second) = if status(&app, who[0], product).await.ticket.as_ref() == Some(&line[0]) {
        (who[0], who[1])
    } else {
        (who[1], who[0])
    };
    let pass = status(&app, first, product).await.pass;
    let PurchaseOutcome::Purchased(order) = buy(&app, first, product, pass).await.unwrap() else {
        panic!("the first in line buys")
    };
    tick(&app).await;
    let waiting = status(&app, second, product).await;
    assert_eq!(waiting.standing, Standing::Waiting, "{waiting:?}");
    assert_eq!(
        (waiting.units_left, waiting.held),
        (0, 1),
        "the unpaid order holds it: {waiting:?}"
    );
    assert!(waiting.held_until.is_some());

    assert!(
        restore_order(&app.shop, order, OrderStatus::PaymentFailed, None)
            .await
            .unwrap()
    );
    let started = Instant::now();
    assert_eq!(tick(&app).await.issued, 1);
    let admitted = status(&app, second, product).await;
    assert_eq!(admitted.standing, Standing::Admitted, "{admitted:?}");
    assert!(started.elapsed() < Duration::from_secs(1));
    let bought = buy(&app, second, product, admitted.pass).await.unwrap();
    assert!(
        matches!(bought, PurchaseOutcome::Purchased(_)),
        "{bought:?}"
    );
    assert_eq!(app.db.stock(product.get()), 0);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lapsed_passes_hand_over_in_line_order() {
    let app = queue_app(Duration::from_millis(1_000)).await;
    let product = queue_product(&app, 1, 1).await;
    let who = customers(&app, 4);
    join_all(&app, product, &who).await;
    start_now(&app, product);
    tick(&app).await;
    let line = line_of(&app, product, &who).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert_eq!(tick(&app).await.issued, 1);
    }
    let record = record_of(&app, product).await;
    let admitted: Vec<&Ticket> = record.admissions.iter().map(|a| &a.ticket).collect();
    assert_eq!(admitted, line.iter().take(4).collect::<Vec<_>>());
    assert_eq!(admissions(&app, product, "lapsed"), 3);
    assert_eq!(admissions(&app, product, "issued"), 1);
    let verdict = verify(&record);
    assert!(verdict.passed(), "{verdict:?}");
}

/// A plain connection to the suite's Redis, to take keys away.
async fn raw_redis() -> redis::aio::MultiplexedConnection {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redis::Client::open(url.split(',').next().unwrap()).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// Redis loses every key of the app's waiting rooms (not the gate's).
async fn lose_the_queues(app: &TestApp) {
    let mut redis = raw_redis().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}queue:*", app.shop.redis_prefix))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(!keys.is_empty());
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut redis)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_redis_lost_is_rebuilt_with_every_place_and_no_oversell() {
    let app = queue_app(Duration::from_secs(120)).await;
    let product = queue_product(&app, 2, 1).await;
    let who = customers(&app, 6);
    join_all(&app, product, &who).await;
    start_now(&app, product);
    tick(&app).await;
    let mut before = HashMap::new();
    for customer in &who {
        before.insert(*customer, status(&app, *customer, product).await);
    }
    let (buyer, pass) = before
        .iter()
        .find(|(_, s)| s.position == Some(1))
        .map(|(c, s)| (*c, s.pass.clone()))
        .unwrap();
    assert!(matches!(
        buy(&app, buyer, product, pass).await.unwrap(),
        PurchaseOutcome::Purchased(_)
    ));
    let late = customers(&app, 1)[0];
    let late_ticket = queue::join(&app.shop, late, product).await.unwrap();

    lose_the_queues(&app).await;
    assert!(!app.shop.waiting_room.exists(product).await.unwrap());

    let report = tick(&app).await;
    assert_eq!(report.rebuilt, 1, "{report:?}");
    for customer in &who {
        let after = status(&app, *customer, product).await;
        let was = &before[customer];
        assert_eq!(
            (&after.ticket, after.position),
            (&was.ticket, was.position),
            "{customer} keeps their place"
        );
        if *customer == buyer {
            assert_eq!(after.pass_state, Some(PassState::Used));
        } else {
            assert_eq!(after.pass_state, was.pass_state, "{after:?}");
        }
    }
    assert_eq!(status(&app, late, product).await.position, Some(7));
    assert_eq!(
        queue::join(&app.shop, late, product).await.unwrap(),
        late_ticket
    );
    // The second pass still buys the last unit; nobody else gets one.
    let (second, second_pass) = before
        .iter()
        .find(|(_, s)| s.position == Some(2))
        .map(|(c, s)| (*c, s.pass.clone()))
        .unwrap();
    assert!(matches!(
        buy(&app, second, product, second_pass).await.unwrap(),
        PurchaseOutcome::Purchased(_)
    ));
    assert_eq!(tick(&app).await.issued, 0);
    assert_eq!(count(&app, "SELECT count(*) AS n FROM orders"), 2);
    assert_eq!(app.db.stock(product.get()), 0);
    app.db.assert_audit_clean();
    assert!(verify(&record_of(&app, product).await).passed());
}

/// Moves a sale's times back so it is long over (its end and the linger
/// after it passed).
fn end_long_ago(app: &TestApp, product: ProductId) {
    sql(
        app,
        &format!(
            "UPDATE products SET queue_opens_at = now() - interval '3 hours', \
             sale_starts_at = now() - interval '2 hours', sale_ends_at = now() - interval '1 hour' \
             WHERE id = {product}"
        ),
    )
}

/// Ticks until a finished queue is freed (a tick looks at a bounded part of
/// the keyspace, and this Redis is shared with the other tests).
async fn tick_until_retired(app: &TestApp) {
    for _ in 0..500 {
        if tick(app).await.retired == 1 {
            return;
        }
    }
    panic!("never freed");
}

/// Each customer's position, in `who`'s order.
async fn positions(app: &TestApp, who: &[CustomerId], product: ProductId) -> Vec<Option<i64>> {
    let mut positions = Vec::new();
    for customer in who {
        positions.push(status(app, *customer, product).await.position);
    }
    positions
}

/// Every key Redis holds under the queue's base (its per-ticket hashes too).
async fn keys_of_the_queue(app: &TestApp, product: ProductId) -> Vec<String> {
    let mut redis = raw_redis().await;
    redis::cmd("KEYS")
        .arg(format!("{}*", app.shop.waiting_room.key_base(product)))
        .query_async(&mut redis)
        .await
        .unwrap()
}

/// A sale that is over for good (its end and the linger after it passed)
/// has its queue freed from Redis, every key of it, also a per-ticket hash
/// nothing reaches (what a discarded life of the queue leaves), but only
/// once no pass is open and its log is recorded. Polls then answer from the
/// sale and bring nothing back into Redis; a customer still sees their
/// ticket, and the record still verifies. A sale an admin extends comes
/// back from the record, every place where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_finished_queue_is_freed_from_redis_and_an_extended_sale_gets_it_back() {
    let pass = Duration::from_secs(3);
    let app = queue_app(pass).await;
    let product = queue_product(&app, 2, 1).await;
    let who = customers(&app, 4);
    join_all(&app, product, &who).await;
    start_now(&app, product);
    assert_eq!(tick(&app).await.issued, 2);
    let (buyer, before) = at_place(&app, &who, product, 1).await;
    assert!(matches!(
        buy(&app, buyer, product, before.pass.clone())
            .await
            .unwrap(),
        PurchaseOutcome::Purchased(_)
    ));
    let mut redis = raw_redis().await;
    let orphan = format!(
        "{}entry:ZZZZZZZZZZ",
        app.shop.waiting_room.key_base(product)
    );
    let _: () = redis::cmd("HSET")
        .arg(&orphan)
        .arg("customer")
        .arg(999_999)
        .query_async(&mut redis)
        .await
        .unwrap();
    // The record is checked against the start the draw had: the times are
    // moved back only so the sale is long over.
    let started = record_of(&app, product).await.starts_at;
    end_long_ago(&app, product);

    // The second place's pass is still open: nothing is freed.
    assert_eq!(tick(&app).await.retired, 0);
    assert!(app.shop.waiting_room.exists(product).await.unwrap());
    tokio::time::sleep(pass + Duration::from_millis(200)).await;
    tick_until_retired(&app).await;
    assert_eq!(keys_of_the_queue(&app, product).await, Vec::<String>::new());
    assert_eq!(admissions(&app, product, "used"), 1);
    assert_eq!(admissions(&app, product, "lapsed"), 1);
    assert_eq!(admissions(&app, product, "issued"), 0);
    let mut record = record_of(&app, product).await;
    record.starts_at = started;
    let verified = verify(&record);
    assert!(verified.passed(), "{verified:?}");

    for customer in &who {
        let after = status(&app, *customer, product).await;
        assert_eq!(after.standing, Standing::Closed);
        assert!(after.ticket.is_some(), "{customer} still sees their ticket");
    }
    assert_eq!(status(&app, buyer, product).await.ticket, before.ticket);
    let anonymous = queue::status(&app.shop, None, product).await.unwrap();
    assert_eq!(anonymous.standing, Standing::Closed);
    let paused =
        flashsale::services::queue_admin::set_admission_paused(&app.shop, product, true, who[0])
            .await
            .unwrap_err();
    assert!(paused.to_string().contains("is over"), "{paused}");
    // A buy from a tab left open finds the room closed and makes no queue.
    let late = buy(&app, buyer, product, before.pass.clone()).await;
    assert!(matches!(&late, Err(AppError::Conflict { .. })), "{late:?}");
    tick(&app).await;
    assert_eq!(
        keys_of_the_queue(&app, product).await,
        Vec::<String>::new(),
        "neither polls, a buy nor the tick bring it back"
    );

    sql(
        &app,
        &format!(
            "UPDATE products SET sale_ends_at = now() + interval '1 hour' WHERE id = {product}"
        ),
    );
    assert_eq!(tick(&app).await.rebuilt, 1);
    let back = status(&app, buyer, product).await;
    assert_eq!((back.ticket, back.position), (before.ticket, Some(1)));
    assert_eq!(back.pass_state, Some(PassState::Used));
    assert_eq!(count(&app, "SELECT count(*) AS n FROM orders"), 1);
}

/// A finished queue found behind the record after its last live tick
/// (dropped, its passes still open in the record) is rebuilt from the
/// record so that its last tick ends those passes, and then freed whole,
/// the hashes the drop left among it. One whose retirement another process
/// began and left part-way is freed on from where it stopped by the tick,
/// with no last tick over a half-freed queue; and a sale an admin extends
/// while its queue is part-way freed comes back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_finished_queue_dropped_or_left_part_way_is_still_freed_whole() {
    let pass = Duration::from_secs(2);
    let app = queue_app(pass).await;
    let room = &app.shop.waiting_room;
    let product = queue_product(&app, 2, 1).await;
    let who = customers(&app, 4);
    join_all(&app, product, &who).await;
    start_now(&app, product);
    assert_eq!(tick(&app).await.issued, 2);
    assert_eq!(admissions(&app, product, "issued"), 2);
    assert!(room
        .discard_behind(product, Behind::Admissions { recorded: 99 })
        .await
        .unwrap());
    assert!(!room.exists(product).await.unwrap());
    assert!(
        !keys_of_the_queue(&app, product).await.is_empty(),
        "a drop leaves the per-ticket hashes"
    );
    let started = record_of(&app, product).await.starts_at;
    end_long_ago(&app, product);
    tokio::time::sleep(pass + Duration::from_millis(200)).await;

    let first = tick(&app).await;
    assert_eq!(first.retired, 0, "{first:?}");
    assert!(
        room.exists(product).await.unwrap(),
        "rebuilt to end its passes"
    );
    tick_until_retired(&app).await;
    assert_eq!(keys_of_the_queue(&app, product).await, Vec::<String>::new());
    assert_eq!(admissions(&app, product, "issued"), 0);
    assert_eq!(admissions(&app, product, "lapsed"), 2);
    let mut record = record_of(&app, product).await;
    record.starts_at = started;
    let verified = verify(&record);
    assert!(verified.passed(), "{verified:?}");

    // Extended, rebuilt, over again: another process begins its retirement
    // and stops after one page (filler keys make sure one is not all).
    sql(
        &app,
        &format!("UPDATE products SET stock = 0, sale_ends_at = now() + interval '1 hour' WHERE id = {product}"),
    );
    assert_eq!(tick(&app).await.rebuilt, 1);
    let placed = positions(&app, &who, product).await;
    assert!(placed.iter().all(Option::is_some), "{placed:?}");
    end_long_ago(&app, product);
    let mut redis = raw_redis().await;
    let filler = format!("{}filler:", app.shop.redis_prefix);
    let mut fill = redis::cmd("MSET");
    for i in 0..3000 {
        fill.arg(format!("{filler}{i}")).arg(1);
    }
    let _: () = fill.query_async(&mut redis).await.unwrap();
    let mut one_page = 1;
    assert!(matches!(
        room.retire(product, &mut one_page).await.unwrap(),
        Retire::PartWay
    ));
    assert!(room.is_retiring(product).await.unwrap());

    // Extended while part-way: the queue comes back whole, every place
    // where it was.
    sql(
        &app,
        &format!(
            "UPDATE products SET sale_ends_at = now() + interval '1 hour' WHERE id = {product}"
        ),
    );
    assert_eq!(tick(&app).await.rebuilt, 1);
    assert_eq!(positions(&app, &who, product).await, placed);

    // Over again, and left part-way by a process that stopped: the tick
    // goes on from where it stopped and frees it.
    end_long_ago(&app, product);
    let mut one_page = 1;
    assert_eq!(
        room.retire(product, &mut one_page).await.unwrap(),
        Retire::PartWay
    );
    tick_until_retired(&app).await;
    assert_eq!(keys_of_the_queue(&app, product).await, Vec::<String>::new());
    assert!(!room.is_retiring(product).await.unwrap());
    let fillers: Vec<String> = (0..3000).map(|i| format!("{filler}{i}")).collect();
    let _: () = redis::cmd("DEL")
        .arg(&fillers)
        .query_async(&mut redis)
        .await
        .unwrap();
}

/// An ended sale whose queue Redis lost is made again only while the
/// record shows a pass open (its last tick must end it). Otherwise a poll
/// answers from the record and nothing comes back into Redis: an instance
/// whose clock is behind never remakes a queue another has just freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ended_sale_s_lost_queue_is_made_again_only_for_an_open_pass() {
    let app = queue_app(Duration::from_secs(60)).await;
    let room = &app.shop.waiting_room;
    let product = queue_product(&app, 1, 1).await;
    let who = customers(&app, 2);
    join_all(&app, product, &who).await;
    start_now(&app, product);
    assert_eq!(tick(&app).await.issued, 1);
    sql(
        &app,
        &format!("UPDATE products SET sale_ends_at = now() WHERE id = {product}"),
    );

    lose_the_queues(&app).await;
    let polled = status(&app, who[1], product).await;
    assert_eq!(polled.standing, Standing::Closed);
    assert!(
        room.exists(product).await.unwrap(),
        "rebuilt: a pass is open"
    );

    sql(
        &app,
        &format!("UPDATE queue_admissions SET state = 'lapsed', ended_at = now() WHERE product_id = {product}"),
    );
    lose_the_queues(&app).await;
    let polled = status(&app, who[1], product).await;
    assert_eq!(polled.standing, Standing::Closed);
    assert!(
        polled.ticket.is_some(),
        "the customer still sees their ticket"
    );
    assert!(!room.exists(product).await.unwrap(), "not made again");
    assert_eq!(keys_of_the_queue(&app, product).await, Vec::<String>::new());
}

/// An admin's pause outlives Redis: a queue rebuilt mid-pause stays paused
/// until the admin resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_survives_a_rebuild() {
    let app = queue_app(Duration::from_secs(120)).await;
    let product = queue_product(&app, 3, 1).await;
    let who = customers(&app, 4);
    join_all(&app, product, &who).await;
    let admin = app.admin().await;
    let admin_id = CustomerId(count(
        &app,
        "SELECT id AS n FROM customers WHERE role = 'admin' LIMIT 1",
    ));
    drop(admin);
    start_now(&app, product);
    tick(&app).await;
    flashsale::services::queue_admin::set_admission_paused(&app.shop, product, true, admin_id)
        .await
        .unwrap();
    lose_the_queues(&app).await;

    let report = tick(&app).await;
    assert_eq!(report.rebuilt, 1, "{report:?}");
    let view = status(&app, who[0], product).await;
    assert_eq!(view.queue, QueueState::Paused, "{view:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sold_out_crowd_hears_so_and_the_record_verifies() {
    let app = queue_app(Duration::from_millis(1_500)).await;
    let product = queue_product(&app, 3, 1).await;
    let who = customers(&app, 12);
    join_all(&app, product, &who).await;
    start_now(&app, product);
    // Some buy when admitted, the rest let their pass lapse, until nothing is left.
    let mut bought = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while bought < 3 {
        assert!(Instant::now() < deadline, "the sale never sold out");
        tick(&app).await;
        for (i, customer) in who.iter().enumerate() {
            let status = status(&app, *customer, product).await;
            if status.standing == Standing::Admitted
                && status.pass_state == Some(PassState::Issued)
                && i % 2 == 0
            {
                let outcome = buy(&app, *customer, product, status.pass).await.unwrap();
                assert!(
                    matches!(outcome, PurchaseOutcome::Purchased(_)),
                    "{outcome:?}"
                );
                bought += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Paid, so nothing can come back: the queue closes as sold out.
    sql(&app, "UPDATE orders SET status = 'paid'");
    let report = tick(&app).await;
    assert_eq!(report.sold_out, 1, "{report:?}");
    for customer in &who {
        let status = status(&app, *customer, product).await;
        assert!(
            matches!(status.standing, Standing::SoldOut | Standing::Closed),
            "{status:?}"
        );
    }
    assert_eq!(count(&app, "SELECT count(*) AS n FROM orders"), 3);
    assert_eq!(app.db.stock(product.get()), 0);
    let verdict = verify(&record_of(&app, product).await);
    assert!(verdict.passed(), "{verdict:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_joins_share_commits() {
    let app = queue_app(Duration::from_secs(120)).await;
    let product = queue_product(&app, 100, 1).await;
    let n = 2_000;
    let who = customers(&app, n);
    let started = Instant::now();
    let joins = who.iter().map(|customer| {
        let shop = app.shop.clone();
        let customer = *customer;
        tokio::spawn(async move { queue::join(&shop, customer, product).await })
    });
    let tickets: Vec<Ticket> = futures::future::join_all(joins)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let took = started.elapsed();
    eprintln!(
        "{n} joins in {took:?}: {:.0} joins/s (service calls, no HTTP)",
        n as f64 / took.as_secs_f64()
    );
    assert_eq!(
        count(
            &app,
            &format!("SELECT count(*) AS n FROM queue_entries WHERE product_id = {product}")
        ),
        n as i64
    );
    let distinct: std::collections::HashSet<&Ticket> = tickets.iter().collect();
    assert_eq!(distinct.len(), n);
    // Every place is confirmed: the draw goes ahead at once.
    start_now(&app, product);
    assert_eq!(tick(&app).await.drawn, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_place_whose_joiner_died_is_written_by_the_tick_and_the_draw_waits_for_it() {
    let app = quick_join_app().await;
    let product = queue_product(&app, 2, 1).await;
    let who = customers(&app, 3);
    join_all(&app, product, &who[..2]).await;
    // The third joiner's process dies between Redis and Postgres.
    let orphan = joined_in_redis_only(&app, product, who[2]).await;
    start_now(&app, product);
    let report = tick(&app).await;
    assert_eq!(
        (report.confirmed, report.drawn),
        (0, 0),
        "the draw waits: {report:?}"
    );
    tokio::time::sleep(app.shop.settings.longest_join() + Duration::from_millis(100)).await;
    let report = tick(&app).await;
    assert_eq!((report.confirmed, report.drawn), (1, 1), "{report:?}");
    assert_eq!(
        count(
            &app,
            &format!(
                "SELECT count(*) AS n FROM queue_entries WHERE customer_id = {} AND ticket = '{}' AND seq = {}",
                who[2], orphan.ticket, orphan.seq
            )
        ),
        1
    );
    let verdict = verify(&record_of(&app, product).await);
    assert!(verdict.passed(), "{verdict:?}");
    assert_eq!(line_of(&app, product, &who).await.len(), 3);
}

/// Two passes whose purchases stopped after their claim: one never reached
/// Postgres (`died`), the other's order committed, carrying the claim,
/// before its process died (`committed`). Passes last 800 ms, and a claim
/// is stale 200 ms after its deadline.
struct ClaimsLeftBehind {
    app: TestApp,
    product: ProductId,
    who: Vec<CustomerId>,
    died: CustomerId,
    committed: (CustomerId, PassRef),
    order: i64,
}

async fn claims_left_behind() -> ClaimsLeftBehind {
    let app = spawn_app_with(|s| {
        s.queue_tick = Duration::from_secs(3600);
        s.queue_pass = Duration::from_millis(800);
        s.gate_pending_ttl = Some(Duration::from_millis(200));
    })
    .await;
    let product = queue_product(&app, 2, 1).await;
    let who = customers(&app, 3);
    join_all(&app, product, &who).await;
    start_now(&app, product);
    tick(&app).await;
    let mut admitted = Vec::new();
    for customer in &who {
        if let Some(pass) = status(&app, *customer, product).await.pass {
            admitted.push((*customer, pass));
        }
    }
    let [(died, ref died_pass), (committed, ref committed_pass)] = admitted[..] else {
        panic!("two passes: {admitted:?}")
    };
    let room = &app.shop.waiting_room;
    for (customer, pass, key) in [
        (died, died_pass, "claim-never-committed"),
        (committed, committed_pass, "claim-committed"),
    ] {
        assert!(matches!(
            room.claim(product, customer, pass, key).await.unwrap(),
            flashsale::queue::Claim::Claimed { .. }
        ));
    }
    let other = ProductId(app.product(5, None).await);
    let line = Line {
        product: other,
        quantity: Quantity::new(1).unwrap(),
    };
    let PurchaseOutcome::Purchased(order) = purchase(&app.shop, committed, vec![line], None)
        .await
        .unwrap()
    else {
        panic!("an open sale sells")
    };
    sql(
        &app,
        &format!("UPDATE orders SET gate_key = 'claim-committed' WHERE id = {order}"),
    );
    let committed = (committed, committed_pass.clone());
    ClaimsLeftBehind {
        app,
        product,
        who,
        died,
        committed,
        order: order.get(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_left_behind_is_settled_by_what_postgres_says() {
    let ClaimsLeftBehind {
        app,
        product,
        died,
        order,
        ..
    } = claims_left_behind().await;

    assert_eq!(
        tick(&app).await.lapsed_claims,
        0,
        "a claim within its deadline stays"
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let report = tick(&app).await;
    assert_eq!((report.settled, report.lapsed_claims), (1, 1), "{report:?}");
    assert_eq!(
        count(
            &app,
            &format!(
                "SELECT count(*) AS n FROM queue_admissions WHERE state = 'used' AND order_id = {order}"
            )
        ),
        1
    );
    assert_eq!(admissions(&app, product, "lapsed"), 1);
    assert_eq!(
        status(&app, died, product).await.pass_state,
        Some(PassState::Lapsed)
    );
    // The lapsed claim's place goes to the one still waiting.
    assert_eq!(report.issued, 1, "{report:?}");
}

/// Redis lost the queue while a join was between Redis and Postgres: the
/// rebuild's snapshot has no row for it, the row commits just after, and
/// its joiner dies before confirming. The draw waits until no join can
/// still be in flight, the tick puts the place back from Postgres, and the
/// draw then has everyone its published record has.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_place_committed_after_a_rebuilds_snapshot_is_put_back_before_the_draw() {
    let app = quick_join_app().await;
    let product = queue_product(&app, 2, 1).await;
    let who = customers(&app, 3);
    join_all(&app, product, &who[..2]).await;
    tick(&app).await;
    let in_flight = joined_in_redis_only(&app, product, who[2]).await;
    lose_the_queues(&app).await;
    assert_eq!(tick(&app).await.rebuilt, 1);
    // The in-flight join's row commits; its process dies before confirming.
    commit_row(&app, product, &in_flight);
    start_now(&app, product);
    // Numbered past the rebuilt queue's last arrival, the row's place is
    // put back at once; the draw still waits out the joins that may be
    // in flight.
    let report = tick(&app).await;
    assert_eq!(
        (report.put_back, report.drawn),
        (1, 0),
        "the draw waits: {report:?}"
    );
    tokio::time::sleep(app.shop.settings.longest_join() + Duration::from_millis(100)).await;
    let report = tick(&app).await;
    assert_eq!((report.put_back, report.drawn), (0, 1), "{report:?}");
    assert_eq!(line_of(&app, product, &who).await.len(), 3);
    let verdict = verify(&record_of(&app, product).await);
    assert!(verdict.passed(), "{verdict:?}");
    // Both units are passes for the first two of that line.
    let mut holders = Vec::new();
    for customer in &who {
        let standing = status(&app, *customer, product).await;
        if standing.pass.is_some() {
            holders.push(standing.position);
        }
    }
    holders.sort();
    assert_eq!(holders, vec![Some(1), Some(2)]);
}

/// A waiting room prepared by its first join, before any tick counted the
/// stock in Redis, shows the shelf's stock: a fresh sale is not sold out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fresh_waiting_room_shows_the_stock_before_redis_counts_it() {
    let app = queue_app(Duration::from_secs(120)).await;
    let product = queue_product(&app, 5, 1).await;
    let who = customers(&app, 1);
    join_all(&app, product, &who).await;
    let mut redis = raw_redis().await;
    let _: i64 = redis::cmd("DEL")
        .arg(format!(
            "{}gate:{{product:{product}}}:stock",
            app.shop.redis_prefix
        ))
        .query_async(&mut redis)
        .await
        .unwrap();
    let waiting = status(&app, who[0], product).await;
    assert_eq!((waiting.units_left, waiting.held), (5, 0), "{waiting:?}");
    assert_eq!(waiting.standing, Standing::Waiting);
    tick(&app).await;
    assert_eq!(status(&app, who[0], product).await.units_left, 5);
}

/// Redis loses one pre-queue place (entry, customer's ticket, pre-queue
/// slot) and keeps the rest of the queue.
async fn lose_the_place(app: &TestApp, product: ProductId, customer: CustomerId, ticket: &Ticket) {
    let mut redis = raw_redis().await;
    let base = app.shop.waiting_room.key_base(product);
    let _: () = redis::pipe()
        .cmd("DEL")
        .arg(format!("{base}entry:{ticket}"))
        .cmd("HDEL")
        .arg(format!("{base}by_customer"))
        .arg(customer.get())
        .cmd("ZREM")
        .arg(format!("{base}pre"))
        .arg(ticket.as_str())
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(status(app, customer, product).await.ticket, None);
}

/// Redis lost a customer's place but not the queue (a rebuild from a
/// snapshot older than the row, with the confirm's answer lost): joining
/// again finds the row, puts that place back and answers its ticket; the
/// fresh place Redis made for the second join gives way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn joining_again_after_redis_lost_the_place_gets_the_committed_one_back() {
    let app = queue_app(Duration::from_secs(120)).await;
    let product = queue_product(&app, 2, 1).await;
    let who = customers(&app, 2);
    let tickets = join_all(&app, product, &who).await;
    lose_the_place(&app, product, who[1], &tickets[1]).await;

    let again = queue::join(&app.shop, who[1], product).await.unwrap();
    assert_eq!(again, tickets[1]);
    assert_eq!(status(&app, who[1], product).await.ticket, Some(again));
    let pre = app.shop.waiting_room.pre_queue(product).await.unwrap();
    assert_eq!(pre.tickets.len(), 2, "{pre:?}");
    assert_eq!(pre.unconfirmed, 0);
    assert_eq!(
        count(
            &app,
            &format!("SELECT count(*) AS n FROM queue_entries WHERE product_id = {product}")
        ),
        2
    );
    start_now(&app, product);
    assert_eq!(tick(&app).await.drawn, 1);
    assert!(verify(&record_of(&app, product).await).passed());
}

/// A drawn queue rebuilt while a late join was in flight: until that row
/// can have committed, nobody is admitted, or the one behind it in line
/// (whose row the snapshot had) would get the pass that is its.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_rebuild_admissions_wait_for_the_places_still_committing() {
    let app = quick_join_app().await;
    let product = queue_product(&app, 3, 1).await;
    let who = customers(&app, 4);
    join_all(&app, product, &who[..2]).await;
    start_now(&app, product);
    let report = tick(&app).await;
    assert_eq!((report.drawn, report.issued), (1, 2), "{report:?}");
    let in_flight = joined_in_redis_only(&app, product, who[2]).await;
    assert!(in_flight.late);
    join_all(&app, product, &who[3..]).await;
    lose_the_queues(&app).await;
    let report = tick(&app).await;
    assert_eq!((report.rebuilt, report.issued), (1, 0), "{report:?}");
    commit_row(&app, product, &in_flight);
    assert_eq!(tick(&app).await.issued, 0, "held");
    tokio::time::sleep(app.shop.settings.longest_join() + Duration::from_millis(100)).await;
    let report = tick(&app).await;
    assert_eq!((report.put_back, report.issued), (1, 1), "{report:?}");
    let third = status(&app, who[2], product).await;
    assert_eq!((third.position, third.pass.is_some()), (Some(3), true));
    let fourth = status(&app, who[3], product).await;
    assert_eq!((fourth.position, fourth.pass.is_some()), (Some(4), false));
    let verdict = verify(&record_of(&app, product).await);
    assert!(verdict.passed(), "{verdict:?}");
}

/// The same loss, and the second join's process dies after Redis gave it
/// a fresh place: the sweep finds that place's row blocked by the
/// customer's committed one, and puts the committed place back instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sweep_puts_back_the_committed_place_a_dead_second_join_stood_in_for() {
    let app = quick_join_app().await;
    let product = queue_product(&app, 2, 1).await;
    let who = customers(&app, 2);
    let tickets = join_all(&app, product, &who).await;
    lose_the_place(&app, product, who[1], &tickets[1]).await;
    let fresh = joined_in_redis_only(&app, product, who[1]).await;
    assert_ne!(fresh.ticket, tickets[1]);
    tokio::time::sleep(app.shop.settings.longest_join() + Duration::from_millis(100)).await;
    let report = tick(&app).await;
    assert_eq!((report.put_back, report.undone), (1, 1), "{report:?}");
    assert_eq!(
        status(&app, who[1], product).await.ticket,
        Some(tickets[1].clone())
    );
    let pre = app.shop.waiting_room.pre_queue(product).await.unwrap();
    assert_eq!(pre.tickets.len(), 2, "{pre:?}");
    assert_eq!(pre.unconfirmed, 0);
    start_now(&app, product);
    assert_eq!(tick(&app).await.drawn, 1);
    assert!(verify(&record_of(&app, product).await).passed());
}

/// Polls `customer`'s standing until `wanted` says yes, for at most `within`.
async fn standing_becomes(
    app: &TestApp,
    customer: CustomerId,
    product: ProductId,
    within: Duration,
    wanted: impl Fn(Standing) -> bool,
) -> QueueStatus {
    let deadline = Instant::now() + within;
    loop {
        let seen = status(app, customer, product).await;
        if wanted(seen.standing) {
            return seen;
        }
        assert!(Instant::now() < deadline, "still {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The shop's own tick, which keeps a sale's Postgres numbers for up to a
/// second: the sold-out close and the reopening still follow Postgres,
/// though nothing here tells this process's tick that anything changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_running_tick_closes_a_sold_out_queue_and_reopens_it_when_a_unit_comes_back() {
    let app = spawn_app_with(|s| {
        s.queue_tick = Duration::from_millis(100);
        s.queue_pass = Duration::from_secs(60);
    })
    .await;
    let product = queue_product(&app, 1, 1).await;
    let who = customers(&app, 2);
    join_all(&app, product, &who).await;
    start_now(&app, product);
    // One unit: the first in the draw's order gets the pass.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (buyer, waiter, pass) = loop {
        let first = status(&app, who[0], product).await;
        let second = status(&app, who[1], product).await;
        match (first.standing, second.standing) {
            (Standing::Admitted, _) => break (who[0], who[1], first.pass),
            (_, Standing::Admitted) => break (who[1], who[0], second.pass),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "nobody admitted: {first:?} {second:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let outcome = buy(&app, buyer, product, pass).await.unwrap();
    assert!(
        matches!(outcome, PurchaseOutcome::Purchased(_)),
        "{outcome:?}"
    );
    // Straight to Postgres, past every service: no edit this process hears of.
    let mut db = app.db.conn();
    diesel::sql_query("UPDATE orders SET status = 'paid'")
        .execute(&mut db)
        .unwrap();
    standing_becomes(&app, waiter, product, Duration::from_secs(5), |s| {
        s == Standing::SoldOut
    })
    .await;
    diesel::sql_query(format!(
        "UPDATE products SET stock = stock + 1 WHERE id = {product}"
    ))
    .execute(&mut db)
    .unwrap();
    let reopened = standing_becomes(&app, waiter, product, Duration::from_secs(5), |s| {
        s != Standing::SoldOut
    })
    .await;
    assert_eq!(reopened.queue, QueueState::Open, "{reopened:?}");
}

/// An app for the failover tests: passes of `pass`, and joins that are
/// over quickly (as `quick_join_app`'s), so a rebuild's hold is short.
async fn failover_app(pass: Duration) -> TestApp {
    spawn_app_with(|s| {
        s.queue_tick = Duration::from_secs(3600);
        s.queue_pass = pass;
        s.db_connect_timeout = Duration::from_millis(100);
        s.db_statement_timeout = Duration::from_millis(400);
    })
    .await
}

/// Which of `who` stands at `place` of the drawn line, and their status.
async fn at_place(
    app: &TestApp,
    who: &[CustomerId],
    product: ProductId,
    place: usize,
) -> (CustomerId, QueueStatus) {
    for customer in who {
        let status = status(app, *customer, product).await;
        if status.position == Some(place as i64) {
            return (*customer, status);
        }
    }
    panic!("nobody at place {place}")
}

/// Every key of the app's waiting rooms as Redis holds it now (`DUMP`).
async fn dump_the_queues(app: &TestApp) -> Vec<(String, Vec<u8>)> {
    let mut redis = raw_redis().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}queue:*", app.shop.redis_prefix))
        .query_async(&mut redis)
        .await
        .unwrap();
    let mut dumped = Vec::new();
    for key in keys {
        let bytes: Vec<u8> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut redis)
            .await
            .unwrap();
        dumped.push((key, bytes));
    }
    dumped
}

/// Redis as a replica that had seen only `dumped` (a failover to it): the
/// waiting rooms' keys are exactly those again.
async fn fail_over_to(app: &TestApp, dumped: &[(String, Vec<u8>)]) {
    lose_the_queues(app).await;
    let mut redis = raw_redis().await;
    for (key, bytes) in dumped {
        let _: () = redis::cmd("RESTORE")
            .arg(key)
            .arg(0)
            .arg(bytes.as_slice())
            .query_async(&mut redis)
            .await
            .unwrap();
    }
}

/// A failover to a replica from before the draw: Redis still has the queue
/// and its pre-queue, but not the draw, nor the pass the first in line
/// bought with, nor the lapse that handed the second's unit on. Drawing
/// again would admit the first again and the second again; the queue is
/// rebuilt from Postgres instead, with the same line and every pass as the
/// record has it, and admits the next waiter once no join can be in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draw_a_failover_took_back_is_rebuilt_from_the_record() {
    let app = failover_app(Duration::from_millis(600)).await;
    let product = queue_product(&app, 3, 1).await;
    let who = customers(&app, 5);
    join_all(&app, product, &who).await;
    tick(&app).await;
    let replica = dump_the_queues(&app).await;
    start_now(&app, product);
    let report = tick(&app).await;
    assert_eq!((report.drawn, report.issued), (1, 3), "{report:?}");
    let line = line_of(&app, product, &who).await;
    let at = |place: usize| at_place(&app, &who, product, place);
    let (first, first_status) = at(1).await;
    assert!(matches!(
        buy(&app, first, product, first_status.pass).await.unwrap(),
        PurchaseOutcome::Purchased(_)
    ));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(tick(&app).await.issued, 2, "places 2 and 3 lapsed");
    assert_eq!(admissions(&app, product, "lapsed"), 2);

    fail_over_to(&app, &replica).await;
    assert_eq!(
        status(&app, who[0], product).await.position,
        None,
        "undrawn"
    );
    let report = tick(&app).await;
    assert_eq!(
        (report.discarded, report.drawn, report.issued),
        (1, 0, 0),
        "{report:?}"
    );
    let report = tick(&app).await;
    assert_eq!((report.rebuilt, report.issued), (1, 0), "{report:?}");
    assert_eq!(line_of(&app, product, &who).await, line);
    let states = [PassState::Used, PassState::Lapsed, PassState::Lapsed];
    for (place, state) in (1..=3).zip(states) {
        assert_eq!(at(place).await.1.pass_state, Some(state), "place {place}");
    }
    tokio::time::sleep(app.shop.settings.longest_join() + Duration::from_millis(100)).await;
    assert_eq!(tick(&app).await.issued, 0, "nobody is admitted twice");
    assert_eq!(at(1).await.1.pass_state, Some(PassState::Used));
    assert_eq!(
        count(
            &app,
            &format!("SELECT count(*) AS n FROM queue_admissions WHERE product_id = {product}")
        ),
        5
    );
    assert_eq!(count(&app, "SELECT count(*) AS n FROM orders"), 1);
    let verdict = verify(&record_of(&app, product).await);
    assert!(verdict.passed(), "{verdict:?}");
}

/// A failover to a replica from after the draw but before the next
/// admissions: Redis has the line, and the first three passes as issued,
/// but not the purchase with the first, the lapses of the other two, nor
/// the passes that went to places 4 and 5. Its cursor would hand places 4
/// and 5 their numbers again (which the record already has, so they would
/// be dropped unrecorded) and lapse a used pass; the queue is rebuilt from
/// Postgres instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admissions_a_failover_took_back_are_rebuilt_from_the_record() {
    let app = failover_app(Duration::from_millis(600)).await;
    let product = queue_product(&app, 3, 1).await;
    let who = customers(&app, 5);
    join_all(&app, product, &who).await;
    tick(&app).await;
    start_now(&app, product);
    let report = tick(&app).await;
    assert_eq!((report.drawn, report.issued), (1, 3), "{report:?}");
    let replica = dump_the_queues(&app).await;
    let line = line_of(&app, product, &who).await;
    let at = |place: usize| at_place(&app, &who, product, place);
    let (first, first_status) = at(1).await;
    assert!(matches!(
        buy(&app, first, product, first_status.pass).await.unwrap(),
        PurchaseOutcome::Purchased(_)
    ));
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(tick(&app).await.issued, 2, "places 2 and 3 lapsed");
    assert_eq!(admissions(&app, product, "lapsed"), 2);
    assert_eq!(admissions(&app, product, "issued"), 2);

    fail_over_to(&app, &replica).await;
    let report = tick(&app).await;
    assert_eq!(
        (report.discarded, report.issued),
        (1, 0),
        "the replica's cursor hands out nothing: {report:?}"
    );
    let report = tick(&app).await;
    assert_eq!((report.rebuilt, report.issued), (1, 0), "{report:?}");
    assert_eq!(line_of(&app, product, &who).await, line);
    let states = [PassState::Used, PassState::Lapsed, PassState::Lapsed];
    for (place, state) in (1..=3).zip(states) {
        assert_eq!(at(place).await.1.pass_state, Some(state), "place {place}");
    }
    for place in 4..=5 {
        assert!(
            at(place).await.1.pass_state.is_some(),
            "place {place} keeps its pass"
        );
    }
    tokio::time::sleep(app.shop.settings.longest_join() + Duration::from_millis(100)).await;
    assert_eq!(tick(&app).await.issued, 0, "nobody is admitted twice");
    assert_eq!(at(1).await.1.pass_state, Some(PassState::Used));
    assert_eq!(
        count(
            &app,
            &format!("SELECT count(*) AS n FROM queue_admissions WHERE product_id = {product}")
        ),
        5
    );
    assert_eq!(admissions(&app, product, "used"), 1);
    assert_eq!(count(&app, "SELECT count(*) AS n FROM orders"), 1);
    let verdict = verify(&record_of(&app, product).await);
    assert!(verdict.passed(), "{verdict:?}");
}

/// A failover the count of admissions cannot see: the replica is two
/// admissions behind (the purchase with pass 4, the lapse of pass 5 and
/// pass 6 to the next waiter), and a tick whose kept read of the record
/// (at most a second old) still says 5 lets it lapse 4 and 5 and issue 6
/// again, to the same ticket, later. Redis then counts as many admissions
/// as Postgres, so the count never finds it; the record does: number 6 is
/// already another issue's, so the drain drops the queue and the rebuild
/// brings back pass 4 used and pass 6 with the deadline its holder was
/// given.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_the_count_of_admissions_misses_is_found_by_the_records_numbers() {
    let app = failover_app(Duration::from_millis(1500)).await;
    let product = queue_product(&app, 3, 1).await;
    let who = customers(&app, 7);
    join_all(&app, product, &who).await;
    tick(&app).await;
    start_now(&app, product);
    assert_eq!(tick(&app).await.issued, 3);
    let line = line_of(&app, product, &who).await;
    let at = |place: usize| at_place(&app, &who, product, place);
    let (first, first_status) = at(1).await;
    assert!(matches!(
        buy(&app, first, product, first_status.pass).await.unwrap(),
        PurchaseOutcome::Purchased(_)
    ));
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(tick(&app).await.issued, 2, "places 2 and 3 lapsed");
    let replica = dump_the_queues(&app).await;

    let (fourth, fourth_status) = at(4).await;
    assert!(matches!(
        buy(&app, fourth, product, fourth_status.pass)
            .await
            .unwrap(),
        PurchaseOutcome::Purchased(_)
    ));
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(tick(&app).await.issued, 1, "place 5 lapsed");
    let sixth = at(6).await.1;
    let recorded_deadline = sixth.pass_expires_at.expect("place 6 admitted");
    assert_eq!(
        (
            admissions(&app, product, "used"),
            admissions(&app, product, "lapsed"),
            admissions(&app, product, "issued")
        ),
        (2, 3, 1)
    );

    fail_over_to(&app, &replica).await;
    // A unit more (an admin's adjustment, which the gate has at once), so
    // the replica issues past number 6 too.
    app.admin().await;
    let admin = CustomerId(
        app.db
            .count("SELECT id AS n FROM customers WHERE email = 'admin@example.com'"),
    );
    flashsale::services::stock::adjust_stock(
        &app.shop,
        product,
        flashsale::services::stock::Adjustment::parse("1", "found one").unwrap(),
        admin,
    )
    .await
    .unwrap();
    // The tick whose kept read predates admissions 5 and 6 being
    // recorded: the replica's passes 4 and 5 are past their deadlines.
    let room = &app.shop.waiting_room;
    room.lapse_due(product, app.shop.settings.gate_pending_ttl())
        .await
        .unwrap();
    let flashsale::queue::Issue::Issued(again) = room
        .issue(product, flashsale::queue::IssueBound::Gate, 5)
        .await
        .unwrap()
    else {
        panic!("the replica has the 5 admissions the kept read counts");
    };
    assert_eq!(
        again.iter().map(|i| i.number).collect::<Vec<_>>(),
        vec![6, 7],
        "the replica hands number 6 out again, and 7"
    );
    assert_eq!(room.counts(product).await.unwrap().admitted, 7);

    let report = tick(&app).await;
    assert_eq!(
        (report.discarded, report.issued),
        (1, 0),
        "number 6 is already the record's: {report:?}"
    );
    assert_eq!(
        count(
            &app,
            &format!("SELECT count(*) AS n FROM queue_admissions WHERE product_id = {product}")
        ),
        6,
        "nothing the replica issued after its conflict is recorded"
    );
    let report = tick(&app).await;
    assert_eq!((report.rebuilt, report.issued), (1, 0), "{report:?}");
    assert_eq!(line_of(&app, product, &who).await, line);
    let states = [
        PassState::Used,
        PassState::Lapsed,
        PassState::Lapsed,
        PassState::Used,
        PassState::Lapsed,
        PassState::Issued,
    ];
    for (place, state) in (1..=6).zip(states) {
        assert_eq!(at(place).await.1.pass_state, Some(state), "place {place}");
    }
    assert_eq!(
        at(6).await.1.pass_expires_at,
        Some(recorded_deadline),
        "the pass the record has"
    );
    let (seventh, seventh_status) = at(7).await;
    assert_eq!(
        (seventh_status.standing, seventh_status.pass_state),
        (Standing::Waiting, None),
        "the pass the replica gave place 7 is in no record, and gone"
    );
    let forged = PassRef {
        ticket: line[6].clone(),
        number: 7,
    };
    assert_eq!(
        refusal(buy(&app, seventh, product, Some(forged)).await),
        PassRefusal::NoPass,
        "it buys nothing"
    );
    assert_eq!(
        count(
            &app,
            &format!("SELECT count(*) AS n FROM queue_admissions WHERE product_id = {product}")
        ),
        6
    );
    assert_eq!(admissions(&app, product, "used"), 2);
    assert_eq!(count(&app, "SELECT count(*) AS n FROM orders"), 2);
    let verdict = verify(&record_of(&app, product).await);
    assert!(verdict.passed(), "{verdict:?}");
}

/// A failover to a replica that lost a late join but no admission: nothing
/// the replica issues conflicts with the record, yet its line lacks the
/// place, so the unit that comes back would go to whoever joined behind
/// it, and the replica's next arrival number is the lost place's (a new
/// join's row cannot be written). The tick finds the record's place past
/// the queue's checked mark (which the replica lost with the join), puts
/// it back where the line has it, and takes the numbering past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_join_a_failover_took_back_is_put_back_in_its_place() {
    let app = failover_app(Duration::from_millis(1500)).await;
    let product = queue_product(&app, 3, 1).await;
    let who = customers(&app, 5);
    join_all(&app, product, &who[..3]).await;
    tick(&app).await;
    start_now(&app, product);
    assert_eq!(tick(&app).await.issued, 3);
    for place in 1..=2 {
        let (buyer, standing) = at_place(&app, &who, product, place).await;
        assert!(matches!(
            buy(&app, buyer, product, standing.pass).await.unwrap(),
            PurchaseOutcome::Purchased(_)
        ));
    }
    let replica = dump_the_queues(&app).await;
    let lost = who[3];
    join_all(&app, product, &[lost]).await;
    assert_eq!(status(&app, lost, product).await.position, Some(4));

    fail_over_to(&app, &replica).await;
    assert_eq!(
        status(&app, lost, product).await.standing,
        Standing::NotJoined,
        "the replica never saw the join"
    );
    // A join on the replica before the tick looks draws the lost place's
    // number, so its row is turned away; Redis's last number is then no
    // lower than the record's, and only the checked mark tells.
    let behind = who[4];
    assert!(matches!(
        queue::join(&app.shop, behind, product).await,
        Err(AppError::Unavailable(reason)) if reason.contains("number to another")
    ));
    let report = tick(&app).await;
    assert_eq!(report.put_back, 1, "{report:?}");
    let put_back = status(&app, lost, product).await;
    assert_eq!(
        (put_back.standing, put_back.position),
        (Standing::Waiting, Some(4))
    );
    join_all(&app, product, &[behind]).await;
    assert_eq!(
        status(&app, behind, product).await.position,
        Some(5),
        "a new join's number is past the record's"
    );

    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(tick(&app).await.issued, 1, "place 3 lapsed: one unit back");
    assert_eq!(
        status(&app, lost, product).await.standing,
        Standing::Admitted,
        "the place the replica lost is next, not the one behind it"
    );
    assert_eq!(
        status(&app, behind, product).await.standing,
        Standing::Waiting
    );
    let verdict = verify(&record_of(&app, product).await);
    assert!(verdict.passed(), "{verdict:?}");
}

/// The same before the start: a replica that lost a pre-queue join would
/// draw without it, and its customer would be told to join again at the
/// back. The place is put back before the draw, and drawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pre_queue_join_a_failover_took_back_is_in_the_draw() {
    let app = failover_app(Duration::from_secs(120)).await;
    let product = queue_product(&app, 2, 1).await;
    let who = customers(&app, 4);
    join_all(&app, product, &who[..3]).await;
    tick(&app).await;
    let replica = dump_the_queues(&app).await;
    join_all(&app, product, &who[3..]).await;
    fail_over_to(&app, &replica).await;
    start_now(&app, product);

    let report = tick(&app).await;
    assert_eq!((report.put_back, report.drawn), (1, 1), "{report:?}");
    assert_eq!(
        line_of(&app, product, &who).await.len(),
        4,
        "all four drawn"
    );
    assert_eq!(
        count(
            &app,
            &format!(
                "SELECT count(*) AS n FROM queue_entries WHERE product_id = {product} AND drawn"
            )
        ),
        4
    );
    let verdict = verify(&record_of(&app, product).await);
    assert!(verdict.passed(), "{verdict:?}");
}

/// A sale of 3 units and 6 waiters whose record, after the first three
/// admissions, holds one more: `number` to the ticket at place 5, as a
/// failover's conflict could once write. The queue is then lost, rebuilt
/// from that record and ticked four times.
struct OneMoreAdmission {
    app: TestApp,
    product: ProductId,
    who: Vec<CustomerId>,
    line: Vec<Ticket>,
    /// Times the queue was dropped or rebuilt over the four ticks.
    dropped: usize,
    issued: usize,
}

impl OneMoreAdmission {
    /// (number, ticket at that place of the line), as `admitted` reads.
    fn at_places(&self, numbers: &[(i32, usize)]) -> Vec<(i32, String)> {
        numbers
            .iter()
            .map(|&(n, place)| (n, self.line[place].as_str().to_string()))
            .collect()
    }
}

async fn rebuilt_with_one_more_admission(number: i32) -> OneMoreAdmission {
    let app = failover_app(Duration::from_millis(600)).await;
    let product = queue_product(&app, 3, 1).await;
    let who = customers(&app, 6);
    join_all(&app, product, &who).await;
    tick(&app).await;
    start_now(&app, product);
    assert_eq!(tick(&app).await.issued, 3);
    let line = line_of(&app, product, &who).await;
    sql(
        &app,
        &format!(
            "INSERT INTO queue_admissions (product_id, number, ticket, issued_at, expires_at, state) \
             VALUES ({product}, {number}, '{}', now(), now() + interval '600 milliseconds', 'issued')",
            line[4]
        ),
    );
    lose_the_queues(&app).await;
    assert_eq!(tick(&app).await.rebuilt, 1);
    tokio::time::sleep(app.shop.settings.longest_join() + Duration::from_millis(700)).await;
    let mut dropped = 0;
    let mut issued = 0;
    for _ in 0..4 {
        let report = tick(&app).await;
        dropped += report.discarded + report.rebuilt;
        issued += report.issued;
    }
    OneMoreAdmission {
        app,
        product,
        who,
        line,
        dropped,
        issued,
    }
}

/// The record's admissions as (number, ticket), by number.
fn admitted(app: &TestApp, product: ProductId) -> Vec<(i32, String)> {
    #[derive(QueryableByName)]
    struct Admitted {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        number: i32,
        #[diesel(sql_type = diesel::sql_types::Text)]
        ticket: String,
    }
    let rows: Vec<Admitted> = diesel::sql_query(format!(
        "SELECT number, ticket FROM queue_admissions WHERE product_id = {product} ORDER BY number"
    ))
    .load(&mut app.db.conn())
    .unwrap();
    rows.into_iter().map(|r| (r.number, r.ticket)).collect()
}

/// A record that already gave a ticket a number out of its place (here
/// number 4 to the ticket at place 5, as a replica that lost a late join
/// could once write): every queue rebuilt from it would reach that ticket
/// again at the cursor. The rebuilt cursor is the place that number
/// displaced, so its waiter is admitted next rather than left behind the
/// cursor; the ticket holding the number gets no second pass, so the drain
/// finds nothing conflicting and the queue is not dropped and rebuilt for
/// ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_with_a_number_out_of_place_does_not_drop_the_queue_for_ever() {
    let odd = rebuilt_with_one_more_admission(4).await;
    assert_eq!(odd.dropped, 0, "the queue stays");
    assert_eq!(
        odd.issued, 2,
        "places 4 and 6 are admitted; place 5 is not admitted again"
    );
    assert_eq!(
        admitted(&odd.app, odd.product),
        odd.at_places(&[(1, 0), (2, 1), (3, 2), (4, 4), (5, 3), (6, 5)])
    );
    let (app, who, product) = (&odd.app, &odd.who, odd.product);
    let fifth = at_place(app, who, product, 5).await.1;
    assert_eq!(
        fifth.pass.map(|p| p.number),
        Some(4),
        "one pass, the record's"
    );
    let fourth = at_place(app, who, product, 4).await.1;
    assert_eq!(
        fourth.pass.map(|p| p.number),
        Some(5),
        "the displaced place is admitted"
    );
}

/// A record whose numbers have a gap (3, then 5) is rebuilt to number on
/// from its highest: numbering on from how many it holds would give the
/// next waiter number 5 again, which the record holds, so every drain
/// would find the queue behind and drop it, for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_with_a_gap_in_its_numbers_numbers_on_from_its_highest() {
    let gap = rebuilt_with_one_more_admission(5).await;
    assert_eq!(gap.dropped, 0, "the queue stays");
    assert_eq!(gap.issued, 2, "places 4 and 6 are admitted");
    assert_eq!(
        admitted(&gap.app, gap.product),
        gap.at_places(&[(1, 0), (2, 1), (3, 2), (5, 4), (6, 3), (7, 5)])
    );
}

/// A rebuild whose read of Postgres outlasts the rebuild key's life keeps
/// the key (it renews it while it reads), so no second rebuilder begins
/// over it, and the queue comes back once, when the read ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebuild_that_reads_postgres_slowly_keeps_its_key() {
    let app = spawn_app_with(|s| {
        s.queue_tick = Duration::from_secs(3600);
        s.db_statement_timeout = Duration::from_secs(30);
    })
    .await;
    let product = queue_product(&app, 2, 1).await;
    let who = customers(&app, 3);
    join_all(&app, product, &who).await;
    start_now(&app, product);
    assert_eq!(tick(&app).await.issued, 2);
    lose_the_queues(&app).await;

    // The rebuild's snapshot writes to queue_admissions first: it waits.
    let mut holder = app.db.conn();
    diesel::sql_query("BEGIN").execute(&mut holder).unwrap();
    diesel::sql_query("LOCK TABLE queue_admissions IN ACCESS EXCLUSIVE MODE")
        .execute(&mut holder)
        .unwrap();
    let first = tokio::spawn({
        let shop = app.shop.clone();
        async move { run_once(&shop).await.unwrap() }
    });
    let room = &app.shop.waiting_room;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(room.is_rebuilding(product).await.unwrap(), "begun");
    tokio::time::sleep(Duration::from_millis(6_000)).await;
    assert!(
        room.is_rebuilding(product).await.unwrap(),
        "still its key, past the key's 5 s"
    );
    let meanwhile = tick(&app).await;
    assert_eq!(meanwhile.rebuilt, 0, "nobody begins over it: {meanwhile:?}");
    assert!(!room.exists(product).await.unwrap());

    diesel::sql_query("COMMIT").execute(&mut holder).unwrap();
    let report = first.await.unwrap();
    assert_eq!(report.rebuilt, 1, "{report:?}");
    assert!(!room.is_rebuilding(product).await.unwrap());
    for customer in &who {
        assert!(status(&app, *customer, product).await.position.is_some());
    }
    assert_eq!(room.counts(product).await.unwrap().admitted, 2);
}

/// A stale claim that cannot be settled (its admission row is gone) is
/// logged and tried again; it holds its own unit, not the line: the unit
/// another lapsed claim frees still goes to the next waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_that_cannot_be_settled_holds_up_only_its_own_unit() {
    // The committed claim's admission row goes, so it can be marked
    // neither used nor lapsed.
    let ClaimsLeftBehind {
        app,
        product,
        who,
        died,
        committed: (stuck, stuck_pass),
        ..
    } = claims_left_behind().await;
    tick(&app).await;
    sql(
        &app,
        &format!(
            "DELETE FROM queue_admissions WHERE product_id = {product} AND ticket = '{}'",
            stuck_pass.ticket.as_str()
        ),
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let report = tick(&app).await;
    assert_eq!(
        (report.unsettled, report.lapsed_claims),
        (1, 1),
        "{report:?}"
    );
    assert_eq!(report.issued, 1, "the lapsed claim's unit is handed on");
    let waiting = who.iter().find(|c| **c != died && **c != stuck).unwrap();
    assert!(status(&app, *waiting, product).await.pass.is_some());
}

/// The entries `/admin/queues` shows for `product`.
async fn dashboard_entries(app: &TestApp, product: ProductId) -> i64 {
    flashsale::services::queue_admin::queue_overviews(&app.shop)
        .await
        .unwrap()
        .into_iter()
        .find(|overview| overview.product.id == product.get())
        .expect("the sale is on the dashboard")
        .recorded
        .entries
}

/// A pre-queue join whose row commits only after the draw went ahead
/// without it: the draw's reveal recorded which places it took, so when
/// Redis then loses the queue (and its note to forget that row), the
/// rebuilt line is the drawn one, not one with the late row shuffled in,
/// and the row goes, so its customer can join again (late) at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_place_the_draw_went_without_stays_out_of_the_line_after_redis_is_lost() {
    let app = quick_join_app().await;
    let product = queue_product(&app, 1, 1).await;
    let who = customers(&app, 5);
    join_all(&app, product, &who[..4]).await;
    start_now(&app, product);
    let report = tick(&app).await;
    assert_eq!((report.drawn, report.issued), (1, 1), "{report:?}");
    let line = line_of(&app, product, &who[..4]).await;
    let too_late = who[4];
    sql(
        &app,
        &format!(
            "INSERT INTO queue_entries (product_id, customer_id, ticket, seq, joined_at, late) \
             SELECT {product}, {too_late}, '0000000000', max(seq) + 1, now(), false \
             FROM queue_entries WHERE product_id = {product}"
        ),
    );
    assert_eq!(
        record_of(&app, product).await.entries.len(),
        4,
        "the record leaves it out"
    );
    assert_eq!(
        dashboard_entries(&app, product).await,
        4,
        "the admin dashboard counts the record's entries, as draw.json lists them"
    );

    lose_the_queues(&app).await;
    assert_eq!(tick(&app).await.rebuilt, 1);
    tokio::time::sleep(app.shop.settings.longest_join() + Duration::from_millis(100)).await;
    tick(&app).await;
    assert_eq!(line_of(&app, product, &who[..4]).await, line);
    assert_eq!(status(&app, too_late, product).await.position, None);
    let verdict = verify(&record_of(&app, product).await);
    assert!(verdict.passed(), "{verdict:?}");
    assert_eq!(
        count(
            &app,
            &format!("SELECT count(*) AS n FROM queue_entries WHERE product_id = {product} AND customer_id = {too_late}")
        ),
        0,
        "the row the draw went without is gone with the rebuild"
    );
    let ticket = queue::join(&app.shop, too_late, product)
        .await
        .expect("its customer joins again at once");
    let joined = status(&app, too_late, product).await;
    assert_eq!(
        (joined.ticket, joined.position),
        (Some(ticket), Some(5)),
        "at the back, late"
    );
    let verdict = verify(&record_of(&app, product).await);
    assert!(verdict.passed(), "{verdict:?}");
}

/// Three units, one each, four customers: the first three in line hold
/// passes, the fourth waits. Statements may wait up to 2 s, so a test can
/// hold a purchase's commit while Redis loses the queue.
struct ThreePassesOneWaiting {
    app: TestApp,
    product: ProductId,
    buyer: CustomerId,
    pass: PassRef,
    waiting: CustomerId,
}

async fn three_passes_one_waiting(pass: Duration) -> ThreePassesOneWaiting {
    let app = spawn_app_with(|s| {
        s.queue_tick = Duration::from_secs(3600);
        s.queue_pass = pass;
        s.db_connect_timeout = Duration::from_millis(100);
        s.db_statement_timeout = Duration::from_millis(2_000);
    })
    .await;
    let product = queue_product(&app, 3, 1).await;
    let who = customers(&app, 4);
    join_all(&app, product, &who).await;
    start_now(&app, product);
    assert_eq!(tick(&app).await.issued, 3);
    let mut by_position = HashMap::new();
    for customer in &who {
        let status = status(&app, *customer, product).await;
        by_position.insert(status.position.unwrap(), (*customer, status.pass));
    }
    let (buyer, pass) = by_position[&1].clone();
    ThreePassesOneWaiting {
        app,
        product,
        buyer,
        pass: pass.expect("the first in line holds a pass"),
        waiting: by_position[&4].0,
    }
}

/// A purchase commits its order and its process dies before it records
/// its pass used (Postgres refuses the mark).
fn purchases_die_before_marking_their_pass_used(app: &TestApp) {
    sql(
        app,
        "CREATE FUNCTION refuse_used() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'the purchase''s process died'; END $$",
    );
    sql(
        app,
        "CREATE TRIGGER refuse_used BEFORE UPDATE ON queue_admissions FOR EACH ROW \
         WHEN (NEW.state = 'used') EXECUTE FUNCTION refuse_used()",
    );
}

/// Orders commit only while nobody holds advisory lock 16 exclusively.
const ORDER_HOLD: i64 = 16;

fn hold_order_inserts_on_the_advisory_lock(app: &TestApp) {
    sql(
        app,
        &format!(
            "CREATE FUNCTION hold_order() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_advisory_xact_lock_shared({ORDER_HOLD}); RETURN NEW; END $$"
        ),
    );
    sql(
        app,
        "CREATE TRIGGER hold_order BEFORE INSERT ON orders FOR EACH ROW \
         EXECUTE FUNCTION hold_order()",
    );
}

/// A purchase with `pass` that is inside its transaction, waiting on the
/// advisory lock `holder` has, its claim in Redis.
async fn purchase_held_at_its_commit(
    f: &ThreePassesOneWaiting,
    holder: &mut PgConnection,
) -> tokio::task::JoinHandle<Result<PurchaseOutcome, AppError>> {
    diesel::sql_query(format!("SELECT pg_advisory_lock({ORDER_HOLD})"))
        .execute(holder)
        .unwrap();
    let shop = f.app.shop.clone();
    let (buyer, product, pass) = (f.buyer, f.product, f.pass.clone());
    let buying = tokio::spawn(async move {
        let line = Line {
            product,
            quantity: Quantity::new(1).unwrap(),
        };
        purchase_with_pass(&shop, buyer, line, None, Some(pass)).await
    });
    let started = Instant::now();
    while count(
        &f.app,
        "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    ) == 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the purchase never reached its insert"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        status(&f.app, f.buyer, f.product).await.pass_state,
        Some(PassState::Claimed)
    );
    buying
}

fn release_the_commit(holder: &mut PgConnection) {
    diesel::sql_query(format!("SELECT pg_advisory_unlock({ORDER_HOLD})"))
        .execute(holder)
        .unwrap();
}

fn used_by(app: &TestApp, order: flashsale::domain::OrderId) -> i64 {
    count(
        app,
        &format!(
            "SELECT count(*) AS n FROM queue_admissions WHERE state = 'used' AND order_id = {order}"
        ),
    )
}

/// The buyer's unit comes back (a declined payment): with only the two
/// other passes open, it admits the one waiting. A sold unit still held
/// by the buyer's pass would keep them waiting until its deadline.
async fn the_unit_that_comes_back_admits_the_waiter(
    f: &ThreePassesOneWaiting,
    order: flashsale::domain::OrderId,
) {
    let app = &f.app;
    assert_eq!(
        app.shop
            .waiting_room
            .counts(f.product)
            .await
            .unwrap()
            .outstanding_units,
        2,
        "only the two passes not used hold units"
    );
    tokio::time::sleep(app.shop.settings.longest_join() + Duration::from_millis(100)).await;
    assert_eq!(tick(app).await.issued, 0, "two units left, two passes open");
    assert!(
        restore_order(&app.shop, order, OrderStatus::PaymentFailed, None)
            .await
            .unwrap()
    );
    assert_eq!(tick(app).await.issued, 1);
    let admitted = status(app, f.waiting, f.product).await;
    assert_eq!(admitted.standing, Standing::Admitted, "{admitted:?}");
    app.db.assert_audit_clean();
    let verdict = verify(&record_of(app, f.product).await);
    assert!(verdict.passed(), "{verdict:?}");
}

/// A purchase committed and its process died before recording its pass
/// used; then Redis lost the queue, and with it the claim. The rebuild
/// finds the order under the pass (its admission key names the ticket) and
/// records the pass used, instead of reopening it over a sold unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebuild_finds_the_order_a_lost_claim_committed_and_keeps_its_pass_used() {
    let f = three_passes_one_waiting(Duration::from_secs(120)).await;
    let app = &f.app;
    purchases_die_before_marking_their_pass_used(app);
    let PurchaseOutcome::Purchased(order) = buy(app, f.buyer, f.product, Some(f.pass.clone()))
        .await
        .unwrap()
    else {
        panic!("the first in line buys")
    };
    assert_eq!(
        status(app, f.buyer, f.product).await.pass_state,
        Some(PassState::Claimed),
        "only Redis's claim knows the pass was used"
    );
    assert_eq!(used_by(app, order), 0);
    sql(app, "DROP TRIGGER refuse_used ON queue_admissions");

    lose_the_queues(app).await;
    assert_eq!(tick(app).await.rebuilt, 1);
    assert_eq!(
        used_by(app, order),
        1,
        "the record has the pass used by the order"
    );
    assert_eq!(
        status(app, f.buyer, f.product).await.pass_state,
        Some(PassState::Used)
    );
    the_unit_that_comes_back_admits_the_waiter(&f, order).await;
}

/// A purchase whose claim Redis lost while its transaction ran: the
/// rebuild's snapshot predates the commit and reopens the pass; the
/// purchase, once committed, records the pass used and settles it in the
/// rebuilt queue, so the sold unit is not held until the pass's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purchase_that_commits_after_a_rebuild_reopened_its_pass_settles_it() {
    let f = three_passes_one_waiting(Duration::from_secs(120)).await;
    let app = &f.app;
    hold_order_inserts_on_the_advisory_lock(app);
    let mut holder = app.db.conn();
    let buying = purchase_held_at_its_commit(&f, &mut holder).await;

    lose_the_queues(app).await;
    assert_eq!(tick(app).await.rebuilt, 1);
    assert_eq!(
        status(app, f.buyer, f.product).await.pass_state,
        Some(PassState::Issued),
        "the snapshot had no order: the pass is open again"
    );
    release_the_commit(&mut holder);
    let PurchaseOutcome::Purchased(order) = buying.await.unwrap().unwrap() else {
        panic!("the held purchase commits")
    };
    assert_eq!(used_by(app, order), 1);
    assert_eq!(
        status(app, f.buyer, f.product).await.pass_state,
        Some(PassState::Used),
        "settled in the rebuilt queue"
    );
    the_unit_that_comes_back_admits_the_waiter(&f, order).await;
}

/// A purchase that commits while a rebuild is part-way: the snapshot was
/// read before the commit, and the purchase's settle found the queue half
/// built (which takes no change), so the finished queue has the pass open
/// over a sold unit. The rebuild's reconciliation settles it (here the
/// rebuilder stops after its last part, as one that dies there does)
/// before anyone else is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purchase_that_settles_while_a_rebuild_is_part_way_is_settled_once_the_queue_is_whole() {
    let f = three_passes_one_waiting(Duration::from_secs(120)).await;
    let app = &f.app;
    hold_order_inserts_on_the_advisory_lock(app);
    let mut holder = app.db.conn();
    let buying = purchase_held_at_its_commit(&f, &mut holder).await;

    lose_the_queues(app).await;
    let room = &app.shop.waiting_room;
    let rebuilder = room.begin_rebuild(f.product).await.unwrap().expect("begun");
    let sale = queue::queue_sale(&app.shop, f.product).await.unwrap();
    let snapshot = queue::snapshot(&app.shop, &sale).await.unwrap();
    release_the_commit(&mut holder);
    let PurchaseOutcome::Purchased(order) = buying.await.unwrap().unwrap() else {
        panic!("the held purchase commits")
    };
    assert_eq!(used_by(app, order), 1, "Postgres has the pass used");
    assert!(rebuilder.complete(&snapshot).await.unwrap());
    assert_eq!(
        status(app, f.buyer, f.product).await.pass_state,
        Some(PassState::Issued),
        "the snapshot predates the order, and the settle found no queue"
    );
    assert_eq!(room.counts(f.product).await.unwrap().outstanding_units, 3);

    tokio::time::sleep(app.shop.settings.longest_join() + Duration::from_millis(100)).await;
    let reconciled = tick(app).await;
    assert_eq!(reconciled.settled_after_rebuild, 1, "{reconciled:?}");
    assert_eq!(
        status(app, f.buyer, f.product).await.pass_state,
        Some(PassState::Used)
    );
    assert_eq!(used_by(app, order), 1);
    assert_eq!(
        queue::settle_uses_a_rebuild_missed(&app.shop, f.product)
            .await
            .unwrap(),
        0,
        "settled once: a second look finds nothing to settle"
    );
    the_unit_that_comes_back_admits_the_waiter(&f, order).await;
}

/// As above, and the purchase's process dies after its commit, before it
/// says so: the reopened pass lapses at its deadline, and the record
/// still has it used by the order (a lapse never hides a sale).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reopened_pass_whose_purchase_committed_is_recorded_used_when_it_lapses() {
    let pass = Duration::from_secs(3);
    let f = three_passes_one_waiting(pass).await;
    let app = &f.app;
    let admitted_at = Instant::now();
    hold_order_inserts_on_the_advisory_lock(app);
    purchases_die_before_marking_their_pass_used(app);
    let mut holder = app.db.conn();
    let buying = purchase_held_at_its_commit(&f, &mut holder).await;
    lose_the_queues(app).await;
    assert_eq!(tick(app).await.rebuilt, 1);
    release_the_commit(&mut holder);
    let PurchaseOutcome::Purchased(order) = buying.await.unwrap().unwrap() else {
        panic!("the held purchase commits")
    };
    assert!(
        admitted_at.elapsed() < pass,
        "the pass was still open when its purchase committed"
    );
    assert_eq!(used_by(app, order), 0);
    sql(app, "DROP TRIGGER refuse_used ON queue_admissions");

    tokio::time::sleep(pass.saturating_sub(admitted_at.elapsed()) + Duration::from_millis(200))
        .await;
    tick(app).await;
    assert_eq!(
        status(app, f.buyer, f.product).await.pass_state,
        Some(PassState::Lapsed),
        "Redis never heard of the sale"
    );
    assert_eq!(
        used_by(app, order),
        1,
        "the record has the pass used, not lapsed"
    );
    assert_eq!(
        admissions(app, f.product, "lapsed"),
        2,
        "only the two passes nobody bought with"
    );
    app.db.assert_audit_clean();
    let verdict = verify(&record_of(app, f.product).await);
    assert!(verdict.passed(), "{verdict:?}");
}
