//! The hot-product path: arrival order decides who gets the last units,
//! queued buyers share one lock hold, a waiting instance is woken by the
//! release (not by polling or the lease), a slow transaction keeps its lock
//! through the watchdog, and a stale holder's write is refused by its fencing
//! token. Real Postgres, real Redis, the real HTTP server.

use std::time::{Duration, Instant};

use crate::helpers::*;
use flashsale::domain::ProductId;
use flashsale::services::checkout::PurchaseOutcome;
use flashsale::services::stock_gate::seed_if_absent;
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn arrival_order_decides_who_gets_the_last_units() {
    let app = spawn_app().await;
    let product = app.product(3, None).await;
    let buyers = app.customers(8, "queued").await;
    let mut tokens = Vec::new();
    for buyer in &buyers {
        tokens.push(buyer.csrf().await);
    }

    seed_if_absent(&app.shop, vec![ProductId(product)])
        .await
        .unwrap();
    // Another instance holds the product while the buyers line up one by one.
    let elsewhere = app.other_instance(Duration::from_secs(3), Duration::from_secs(10));
    let held = elsewhere.acquire(vec![ProductId(product)]).await.unwrap();
    let mut pending = Vec::new();
    for (buyer, token) in buyers.iter().cloned().zip(tokens) {
        pending.push(tokio::spawn(async move {
            checked_status(buyer.buy_with_token(product, "1", &token).await)
        }));
        // Far longer than a request takes to reach the queue.
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    held.release().await;
    let statuses: Vec<StatusCode> = futures::future::join_all(pending)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();

    let expected: Vec<StatusCode> = (0..8)
        .map(|i| {
            if i < 3 {
                StatusCode::SEE_OTHER
            } else {
                StatusCode::CONFLICT
            }
        })
        .collect();
    assert_eq!(statuses, expected, "the first three to arrive buy");
    let winners: Vec<String> = buyers[..3].iter().map(|b| b.email.clone()).collect();
    let bought: i64 = app.db.count(&format!(
        "SELECT count(*) AS n FROM orders o JOIN customers c ON c.id = o.customer_id WHERE c.email IN ('{}')",
        winners.join("','")
    ));
    assert_eq!(bought, 3);
    assert_eq!(app.db.stock(product), 0);
    app.db.assert_audit_clean();

    // With combining, the buyers who queued behind the other instance were
    // served by one lock hold and one transaction: the orders, their items,
    // their ledger rows and the stock update all carry one transaction id.
    // Without it, each purchase commits on its own.
    let transactions = app.db.count(&format!(
        "SELECT count(DISTINCT xid) AS n FROM ( \
           SELECT xmin::text::int8 AS xid FROM products WHERE id = {product} \
           UNION ALL SELECT xmin::text::int8 FROM order_items WHERE product_id = {product} \
           UNION ALL SELECT xmin::text::int8 FROM stock_history WHERE product_id = {product} \
           UNION ALL SELECT o.xmin::text::int8 FROM orders o \
             JOIN order_items i ON i.order_id = o.id WHERE i.product_id = {product} \
         ) AS written"
    ));
    let expected = if app.settings.combining { 1 } else { 3 };
    assert_eq!(transactions, expected, "transactions that wrote the sale");
}

/// One queued buyer whose rows Postgres refuses (their account is gone, so
/// the order breaks a foreign key) gets the error; the buyers before and
/// after them in the same batch still get their orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_buyer_whose_rows_are_refused_does_not_sink_the_batch() {
    let app = spawn_app_with(|s| s.combining = true).await;
    let product = app.product(5, None).await;
    let buyers = app.customers(2, "batched").await;
    let id_of = |email: &str| {
        app.db.count(&format!(
            "SELECT id AS n FROM customers WHERE email = '{email}'"
        ))
    };
    // In arrival order: a real buyer, an account that does not exist, a real buyer.
    let customers = [id_of(&buyers[0].email), -1, id_of(&buyers[1].email)];
    let elsewhere = app.other_instance(Duration::from_secs(3), Duration::from_secs(10));
    let held = elsewhere.acquire(vec![ProductId(product)]).await.unwrap();
    let mut pending = Vec::new();
    for customer in customers {
        let shop = app.shop.clone();
        pending.push(tokio::spawn(async move {
            one_unit_in_batch(&shop, product, customer).await
        }));
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    held.release().await;
    let answers: Vec<_> = futures::future::join_all(pending)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();

    assert!(
        matches!(answers[0], Ok(PurchaseOutcome::Purchased(_))),
        "{answers:?}"
    );
    assert!(
        answers[1].is_err(),
        "the unknown account's order: {answers:?}"
    );
    assert!(
        matches!(answers[2], Ok(PurchaseOutcome::Purchased(_))),
        "{answers:?}"
    );
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 2);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM order_items"), 2);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM stock_history"), 2);
    assert_eq!(app.db.stock(product), 3);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_elsewhere_wakes_the_waiting_instance_at_once() {
    // A lease far longer than the wait: only the release message can let the
    // buyer through in time.
    let app = spawn_app_with(|s| s.lock_wait = Duration::from_secs(3)).await;
    let product = app.product(5, None).await;
    let buyer = app.customer("woken@example.com").await;
    let token = buyer.csrf().await;
    let elsewhere = app.other_instance(Duration::from_secs(3), Duration::from_secs(30));
    let held = elsewhere.acquire(vec![ProductId(product)]).await.unwrap();

    let started = Instant::now();
    let buying = tokio::spawn(async move { buyer.buy_with_token(product, "1", &token).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let released_at = started.elapsed();
    held.release().await;
    let response = buying.await.unwrap();
    let took = started.elapsed();

    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert!(
        took < released_at + Duration::from_millis(600),
        "woken by the release message: answered {took:?} after start, released at {released_at:?}"
    );
    assert_eq!(app.db.stock(product), 4);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_watchdog_keeps_the_lock_through_a_slow_transaction() {
    // A 1 s lease, and a purchase held up 2.5 s by a row lock taken from outside.
    let app = spawn_app_with(|s| s.lock_lease = Duration::from_secs(1)).await;
    let product = app.product(5, None).await;
    let buyer = app.customer("slow@example.com").await;
    let token = buyer.csrf().await;
    let db_url = app.db.url.clone();
    let blocker = std::thread::spawn(move || {
        use diesel::prelude::*;
        let mut conn = PgConnection::establish(&db_url).unwrap();
        conn.transaction::<_, diesel::result::Error, _>(|conn| {
            diesel::sql_query(format!(
                "SELECT id FROM products WHERE id = {product} FOR UPDATE"
            ))
            .execute(conn)?;
            std::thread::sleep(Duration::from_millis(2_500));
            Ok(())
        })
        .unwrap();
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let buying = tokio::spawn(async move { buyer.buy_with_token(product, "1", &token).await });
    // Past the lease, the lock must still be held: no other instance gets it.
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let elsewhere = app.other_instance(Duration::from_millis(200), Duration::from_secs(1));
    assert!(
        elsewhere.acquire(vec![ProductId(product)]).await.is_err(),
        "the renewed lease still holds the lock after 1.6 s"
    );
    let response = buying.await.unwrap();
    blocker.join().unwrap();

    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(app.db.stock(product), 4);
    app.db.assert_audit_clean();
    // Released at the end: the other instance gets it now.
    let held = elsewhere.acquire(vec![ProductId(product)]).await.unwrap();
    held.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_lock_holder_is_fenced_off_by_postgres() {
    // Instance A takes the lock, then stalls past its 1 s lease with its
    // watchdog stopped, as a paused process would; instance B takes the lock
    // and sells. When A wakes, its stock write carries the older token.
    let db = TestDb::new();
    let prefix = unique_prefix();
    let key = flashsale::config::random_session_key();
    let (db_url, key_a, prefix_a) = (db.url.clone(), key.clone(), prefix.clone());
    let stalled = spawn_app_on(TestDb::attach(&db_url), move |s| {
        s.redis_key_prefix = prefix_a;
        s.session_key = key_a;
        s.lock_lease = Duration::from_secs(1);
    })
    .await;
    let healthy = spawn_app_on(db, move |s| {
        s.redis_key_prefix = prefix;
        s.session_key = key;
    })
    .await;
    let product = healthy.product(5, None).await;
    seed_if_absent(&healthy.shop, vec![ProductId(product)])
        .await
        .unwrap();
    stalled
        .shop
        .locks
        .stall_next_acquisition(Duration::from_millis(2_500));
    let late = stalled.customer("paused@example.com").await;
    let late_token = late.csrf().await;
    let on_time = healthy.customer("on-time@example.com").await;

    let paused = tokio::spawn(async move { late.buy_with_token(product, "1", &late_token).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bought = on_time.buy(product, 1).await;
    assert_eq!(bought.status(), StatusCode::SEE_OTHER);
    let fence_after_b = healthy.db.count(&format!(
        "SELECT fence AS n FROM products WHERE id = {product}"
    ));
    assert!(fence_after_b > 0, "the sale wrote its token");

    let refused = paused.await.unwrap();
    expect_page(
        refused,
        StatusCode::SERVICE_UNAVAILABLE,
        "another checkout took over",
    )
    .await;
    let db = &healthy.db;
    assert_eq!(db.count("SELECT count(*) AS n FROM orders"), 1);
    assert_eq!(db.count("SELECT count(*) AS n FROM stock_history"), 1);
    assert_eq!(db.stock(product), 4);
    assert_eq!(
        db.count(&format!(
            "SELECT fence AS n FROM products WHERE id = {product}"
        )),
        fence_after_b,
        "the stale write changed nothing"
    );
    db.assert_audit_clean();
}

/// Redis lost the fencing counter while Postgres kept the row's token (a
/// restarted Redis without persistence): the first holder's token is behind
/// the row, its write is refused, and nothing is written. The batch must
/// not fail its buyers for that: the counter is raised past the row and the
/// batch is served again under a fresh acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fencing_counter_behind_the_row_is_stepped_past_not_failed() {
    let app = spawn_app_with(|s| s.combining = true).await;
    let product = app.product(5, None).await;
    let ahead: i64 = 5_000_000_000_000_000_000;
    app.db.count(&format!(
        "WITH u AS (UPDATE products SET fence = {ahead} WHERE id = {product} RETURNING 1) SELECT count(*) AS n FROM u"
    ));
    let buyer = app.customer("behind@example.com").await;
    let bought = buyer.buy(product, 1).await;
    assert_eq!(bought.status(), StatusCode::SEE_OTHER);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 1);
    assert_eq!(app.db.stock(product), 4);
    assert!(
        app.db.count(&format!(
            "SELECT fence AS n FROM products WHERE id = {product}"
        )) > ahead,
        "the write carried a token past the row's"
    );
    app.db.assert_audit_clean();
}

/// A combined buyer waits in line at most the lock wait: one still queued
/// then, behind a batch that is slow, is taken out of the line and told the
/// shop is busy, its units go back to the gate, and it is never served, so
/// its resend buys once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_combined_buyer_still_in_line_after_the_lock_wait_is_told_busy_and_never_served() {
    use diesel::RunQueryDsl;
    let app = spawn_app_with(|s| {
        s.lock_wait = Duration::from_millis(400);
        s.db_statement_timeout = Duration::from_secs(3);
        s.lock_lease = Duration::from_secs(6);
    })
    .await;
    let product = app.product(5, None).await;
    let (first, second) = (
        app.customer("in-batch@example.com").await,
        app.customer("in-line@example.com").await,
    );
    // Seeds the gate (when on), so neither buyer below waits for seeding.
    order_id_from(&first.buy(product, 1).await);

    // The product's row is held by someone else: the next batch blocks on it.
    let mut holder = app.db.conn();
    diesel::sql_query("BEGIN").execute(&mut holder).unwrap();
    diesel::sql_query(format!(
        "SELECT 1 FROM products WHERE id = {product} FOR UPDATE"
    ))
    .execute(&mut holder)
    .unwrap();
    let batch = tokio::spawn({
        let first = first.clone();
        async move { first.buy(product, 1).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let token = second.csrf().await;
    let started = Instant::now();
    let waited = second
        .post(
            &format!("/products/{product}/buy"),
            &[
                ("quantity", "1"),
                ("csrf_token", &token),
                ("idempotency_key", "in-line"),
            ],
        )
        .await;
    let in_line = started.elapsed();
    expect_page(waited, StatusCode::SERVICE_UNAVAILABLE, "Too many buyers").await;
    assert!(
        in_line < Duration::from_secs(2),
        "answered after {in_line:?}, not after the batch"
    );
    diesel::sql_query("COMMIT").execute(&mut holder).unwrap();
    drop(holder);
    assert_eq!(batch.await.unwrap().status(), StatusCode::SEE_OTHER);

    assert_eq!(
        app.db.count("SELECT count(*) AS n FROM orders"),
        2,
        "never served"
    );
    if let Some(gate) = &app.shop.gate {
        assert_eq!(
            gate.stock(ProductId(product)).await.unwrap(),
            Some(3),
            "its unit came back"
        );
    }
    let resend = second
        .post(
            &format!("/products/{product}/buy"),
            &[
                ("quantity", "1"),
                ("csrf_token", &token),
                ("idempotency_key", "in-line"),
            ],
        )
        .await;
    assert_eq!(resend.status(), StatusCode::SEE_OTHER, "the key was freed");
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 3);
    app.db.assert_audit_clean();
}
