//! The stock gate keeps the answer of a one-product purchase under its
//! idempotency key: a refusal is recorded where it is decided, so a crowd's
//! refusals and their resends cost Postgres nothing, while an order names
//! its key in its own transaction.

use std::time::Duration;

use crate::helpers::*;
use flashsale::domain::{CustomerId, ProductId};
use flashsale::services::stock::{adjust_stock, Adjustment};
use reqwest::{Response, StatusCode};

fn replayed(response: &Response) -> bool {
    response
        .headers()
        .get("Idempotent-Replayed")
        .is_some_and(|v| v == "true")
}

fn customer_id(app: &TestApp, email: &str) -> i64 {
    app.db.count(&format!(
        "SELECT id AS n FROM customers WHERE email = '{email}'"
    ))
}

fn redis() -> redis::Connection {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    redis::Client::open(url.split(',').next().unwrap())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// The gate's record of `key`'s answer: its value and its time to live (ms).
fn answer_record(app: &TestApp, product: i64, customer: i64, key: &str) -> (Option<String>, i64) {
    let name = format!(
        "{}gate:{{product:{product}}}:ans:{customer}:{key}",
        app.shop.redis_prefix
    );
    let mut redis = redis();
    let value: Option<String> = redis::cmd("GET").arg(&name).query(&mut redis).unwrap();
    let ttl: i64 = redis::cmd("PTTL").arg(&name).query(&mut redis).unwrap();
    (value, ttl)
}

async fn gate_stock(app: &TestApp, product: i64) -> Option<i64> {
    app.shop
        .gate
        .as_ref()
        .unwrap()
        .stock(ProductId(product))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sold_out_answers_are_kept_at_the_gate_and_replayed_without_postgres() {
    let app = spawn_app().await;
    let product = app.product(1, None).await;
    let winner = app.customer("winner@example.com").await;
    assert_eq!(
        winner.buy_with_key(product, "1", "w").await.status(),
        StatusCode::SEE_OTHER
    );

    let late = app.customer("late@example.com").await;
    let late_id = customer_id(&app, "late@example.com");
    for i in 0..30 {
        let refused = late.buy_with_key(product, "1", &format!("late-{i}")).await;
        assert!(!replayed(&refused), "a first answer is not a replay");
        expect_page(refused, StatusCode::CONFLICT, "sold out").await;
    }
    assert_eq!(
        app.db.count("SELECT count(*) AS n FROM idempotency_keys"),
        1,
        "only the order's own transaction wrote a key"
    );
    let (record, ttl) = answer_record(&app, product, late_id, "late-0");
    assert!(
        record.is_some_and(|r| r.starts_with("R|h1:")),
        "a keyed fingerprint, refused"
    );
    assert!(
        ttl > 0 && ttl <= app.settings.refusal_retention.as_millis() as i64,
        "kept for the refusal retention, not for ever: {ttl} ms"
    );

    // A unit comes back: the resend still gets its first answer, a new
    // click is decided afresh.
    let admin_id = {
        app.admin().await;
        customer_id(&app, "admin@example.com")
    };
    adjust_stock(
        &app.shop,
        ProductId(product),
        Adjustment::parse("1", "found one").unwrap(),
        CustomerId(admin_id),
    )
    .await
    .unwrap();
    let resend = late.buy_with_key(product, "1", "late-0").await;
    assert!(replayed(&resend));
    expect_page(resend, StatusCode::CONFLICT, "sold out").await;
    let reused = late.buy_with_key(product, "2", "late-0").await;
    expect_page(reused, StatusCode::CONFLICT, "Conflicting reuse of key").await;
    let fresh = late.buy_with_key(product, "1", "late-fresh").await;
    assert_eq!(fresh.status(), StatusCode::SEE_OTHER);
    let order = order_id_from(&fresh);
    let replay = late.buy_with_key(product, "1", "late-fresh").await;
    assert!(replayed(&replay));
    assert_eq!(order_id_from(&replay), order);

    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 2);
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM idempotency_keys WHERE key = 'late-fresh' AND order_id = {order} AND fingerprint LIKE 'h1:%'"
        )),
        1,
        "the order named its key, with a keyed fingerprint, in its own transaction"
    );
    assert_eq!(app.db.stock(product), 0);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refusal_decided_in_postgres_is_kept_at_the_gate_too() {
    let app = spawn_app().await;
    let product = app.upcoming_product(5).await;
    let buyer = app.customer("early@example.com").await;
    let buyer_id = customer_id(&app, "early@example.com");

    // The gate knows stock, not the sale's window: it admits, the locked
    // check refuses, and the units go back.
    let early = buyer.buy_with_key(product, "1", "too-early").await;
    expect_page(early, StatusCode::CONFLICT, "has not started").await;
    assert_eq!(gate_stock(&app, product).await, Some(5));
    let (record, _) = answer_record(&app, product, buyer_id, "too-early");
    assert!(
        record.is_some_and(|r| r.starts_with("R|")),
        "recorded as refused"
    );

    app.db.count(&format!(
        "WITH u AS (UPDATE products SET sale_starts_at = now() - interval '1 minute' WHERE id = {product} RETURNING 1) SELECT count(*) AS n FROM u"
    ));
    let resend = buyer.buy_with_key(product, "1", "too-early").await;
    assert!(replayed(&resend));
    expect_page(resend, StatusCode::CONFLICT, "has not started").await;
    let now_open = buyer.buy_with_key(product, "1", "now-open").await;
    assert_eq!(now_open.status(), StatusCode::SEE_OTHER);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 1);
    assert_eq!(gate_stock(&app, product).await, Some(4));
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fail_closed_answer_frees_its_key_and_the_resend_buys_once() {
    let app = spawn_app_with(|s| s.lock_wait = Duration::from_millis(300)).await;
    let product = app.product(5, None).await;
    let buyer = app.customer("patient@example.com").await;
    let buyer_id = customer_id(&app, "patient@example.com");

    // The first buy seeds the gate (under the lock, which is about to be taken).
    let first = buyer.buy_with_key(product, "1", "first").await;
    assert_eq!(first.status(), StatusCode::SEE_OTHER);
    let other = app.other_instance(Duration::from_secs(5), Duration::from_secs(10));
    let held = other.acquire(vec![ProductId(product)]).await.unwrap();
    let busy = buyer.buy_with_key(product, "1", "k").await;
    expect_page(busy, StatusCode::SERVICE_UNAVAILABLE, "Too many buyers").await;
    assert_eq!(
        answer_record(&app, product, buyer_id, "k").0,
        None,
        "the key is free again"
    );
    assert_eq!(
        gate_stock(&app, product).await,
        Some(4),
        "the units came back"
    );
    held.release().await;

    let resend = buyer.buy_with_key(product, "1", "k").await;
    assert_eq!(resend.status(), StatusCode::SEE_OTHER);
    assert!(!replayed(&resend), "it ran");
    let order = order_id_from(&resend);
    let again = buyer.buy_with_key(product, "1", "k").await;
    assert!(replayed(&again));
    assert_eq!(order_id_from(&again), order);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 2);
    assert_eq!(app.db.stock(product), 3);
    assert_eq!(gate_stock(&app, product).await, Some(3));
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_an_order_named_is_not_reused_for_another_product() {
    let app = spawn_app().await;
    let (first, second) = (app.product(5, None).await, app.product(5, None).await);
    let buyer = app.customer("one-key@example.com").await;
    let bought = buyer.buy_with_key(first, "1", "one-key").await;
    assert_eq!(bought.status(), StatusCode::SEE_OTHER);

    // The second product's gate has never seen the key; the order's
    // transaction finds it taken and rolls back.
    let reused = buyer.buy_with_key(second, "1", "one-key").await;
    expect_page(reused, StatusCode::CONFLICT, "Conflicting reuse of key").await;
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 1);
    assert_eq!(app.db.stock(second), 5);
    assert_eq!(
        gate_stock(&app, second).await,
        Some(5),
        "its admission went back"
    );
    app.db.assert_audit_clean();
}

/// `flashsale_redis_batch_calls` for `script`: (calls, script calls).
async fn batched(app: &TestApp, script: &str) -> (f64, f64) {
    let (_, metrics) = app.browser().get_text("/metrics").await;
    redis_batches(&metrics, script)
}

/// A sold-out crowd's buys go to Redis together (`redis_batch`): fewer
/// script calls than buys, and still every buy its own answer, recorded
/// under its own key and replayed as such; a resend with another request is
/// still a reused key. Postgres hears of none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crowds_refusals_share_script_calls_and_keep_their_own_answers() {
    if !alone_in_process(
        "gate_answers::a_crowds_refusals_share_script_calls_and_keep_their_own_answers",
    ) {
        return;
    }
    const CROWD: usize = 64;
    let app = spawn_app().await;
    let product = app.product(1, None).await;
    let winner = app.customer("winner@example.com").await;
    assert_eq!(
        winner.buy_with_key(product, "1", "w").await.status(),
        StatusCode::SEE_OTHER
    );
    let late = app.customer("late@example.com").await;
    let late_id = customer_id(&app, "late@example.com");
    let token = late.csrf().await;
    let (calls_before, _) = batched(&app, "admit").await;

    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(CROWD));
    let buys: Vec<_> = (0..CROWD)
        .map(|i| {
            let (late, token, barrier) = (late.clone(), token.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                late.post(
                    &format!("/products/{product}/buy"),
                    &[
                        ("quantity", "1"),
                        ("csrf_token", &token),
                        ("idempotency_key", &format!("crowd-{i}")),
                    ],
                )
                .await
            })
        })
        .collect();
    for buy in buys {
        let refused = buy.await.unwrap();
        assert!(!replayed(&refused));
        expect_page(refused, StatusCode::CONFLICT, "sold out").await;
    }
    for i in 0..CROWD {
        let (record, _) = answer_record(&app, product, late_id, &format!("crowd-{i}"));
        assert!(
            record.as_deref().is_some_and(|r| r.starts_with("R|h1:")),
            "crowd-{i} has its own refusal: {record:?}"
        );
    }
    let (calls, script_calls) = batched(&app, "admit").await;
    assert_eq!(calls - calls_before, CROWD as f64, "one admission each");
    assert!(
        script_calls < calls,
        "{calls} admissions went to Redis in {script_calls} script calls"
    );

    let resend = late.buy_with_key(product, "1", "crowd-7").await;
    assert!(replayed(&resend));
    expect_page(resend, StatusCode::CONFLICT, "sold out").await;
    let reused = late.buy_with_key(product, "2", "crowd-8").await;
    expect_page(reused, StatusCode::CONFLICT, "Conflicting reuse of key").await;
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 1);
    assert_eq!(
        app.db.count("SELECT count(*) AS n FROM idempotency_keys"),
        1
    );
    assert_eq!(gate_stock(&app, product).await, Some(0));
    app.db.assert_audit_clean();
}
