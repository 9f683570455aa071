//! A purchase whose COMMIT landed but whose answer was lost (the connection
//! to Postgres cut in between, by a proxy in front of the real server): the
//! idempotency key keeps its claim, and the same form sent again answers
//! with the one order the database holds instead of buying a second time.

use std::time::Duration;

use crate::helpers::*;
use reqwest::StatusCode;

/// The app with every database connection (both pools) through a proxy.
async fn app_behind_proxy() -> (TestApp, PgProxy) {
    app_behind_proxy_with(|_| {}).await
}

async fn app_behind_proxy_with(
    customize: impl FnOnce(&mut flashsale::config::Settings),
) -> (TestApp, PgProxy) {
    let db = TestDb::new();
    let authority = db
        .url
        .split_once("://")
        .unwrap()
        .1
        .split('/')
        .next()
        .unwrap();
    let upstream = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let proxy = PgProxy::start(upstream).await;
    let proxied = proxy.url_for(&db.url);
    let app = spawn_app_on(db, |settings| {
        settings.database_url = proxied;
        // The lookups after a cut give up quickly while the proxy is down.
        settings.db_connect_timeout = Duration::from_millis(500);
        settings.db_pool_size = 4;
        customize(settings);
    })
    .await;
    (app, proxy)
}

/// Lets both pools find and drop the connections the outage cut, as they
/// would on the next requests of a running shop.
async fn heal(app: &TestApp) {
    for pool in [app.shop.pool.clone(), app.shop.bookkeeping.clone()] {
        tokio::task::spawn_blocking(move || {
            for _ in 0..20 {
                flashsale::db::answers_within(&pool, Duration::from_secs(1));
            }
        })
        .await
        .unwrap();
    }
}

fn orders_of(app: &TestApp, product: i64) -> i64 {
    app.db.count(&format!(
        "SELECT count(*) AS n FROM order_items WHERE product_id = {product}"
    ))
}

fn the_order(app: &TestApp, product: i64) -> i64 {
    app.db.count(&format!(
        "SELECT order_id AS n FROM order_items WHERE product_id = {product}"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resend_after_a_lost_commit_answer_shows_the_one_order_on_a_limit_one_sale() {
    let (app, proxy) = app_behind_proxy().await;
    let product = app.product(5, Some(1)).await;
    let buyer = app.customer("uncertain@example.com").await;

    proxy.cut_next_order_commit(false);
    let first = buyer.buy_with_key(product, "1", "lost-answer").await;
    let first_status = first.status();
    assert_eq!(
        proxy.cuts(),
        1,
        "the proxy cut the purchase's COMMIT (first answer {first_status}: {:?})",
        first.headers().get("location")
    );
    assert_eq!(orders_of(&app, product), 1, "the COMMIT landed");
    let order = the_order(&app, product);

    let resend = buyer.buy_with_key(product, "1", "lost-answer").await;
    let resend_status = resend.status();
    let resend_order = (resend_status == StatusCode::SEE_OTHER).then(|| order_id_from(&resend));
    let resend_body = resend.text().await.unwrap();
    assert!(
        !resend_body.contains("Purchase limit reached"),
        "the resend was told its own order is over the limit: {resend_status}\n{resend_body}"
    );
    assert_eq!(
        resend_status,
        StatusCode::SEE_OTHER,
        "the resend answers with the order: {resend_body}"
    );
    assert_eq!(resend_order, Some(order), "the resend shows THAT order");
    assert_eq!(orders_of(&app, product), 1, "one intent, one order");
    assert_eq!(app.db.stock(product), 4);
    // The shop could read the key after the cut, so the first answer already
    // named the order rather than a bare 503.
    assert_eq!(first_status, StatusCode::SEE_OTHER);
    assert_eq!(order_id_from(&first), order);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn when_the_outcome_cannot_be_looked_up_the_claim_is_kept_for_the_resend() {
    let (app, proxy) = app_behind_proxy().await;
    let product = app.product(5, None).await;
    let buyer = app.customer("unreachable@example.com").await;

    // The database stays unreachable after the cut: the shop cannot learn
    // what the COMMIT did, so it must neither claim success nor free the key.
    proxy.cut_next_order_commit(true);
    let first = buyer.buy_with_key(product, "1", "no-lookup").await;
    assert_eq!(proxy.cuts(), 1, "the proxy cut the purchase's COMMIT");
    expect_page(
        first,
        StatusCode::SERVICE_UNAVAILABLE,
        "could not confirm your order",
    )
    .await;
    assert_eq!(orders_of(&app, product), 1, "the COMMIT landed");
    let order = the_order(&app, product);

    proxy.restore();
    heal(&app).await;
    // The pools may still lend a connection the outage cut: a person would
    // press again after a 503 as well.
    let mut resend = buyer.buy_with_key(product, "1", "no-lookup").await;
    for _ in 0..10 {
        if resend.status() != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        resend = buyer.buy_with_key(product, "1", "no-lookup").await;
    }
    expect_redirect(&resend, &format!("/orders/{order}"));
    let again = buyer.buy_with_key(product, "1", "no-lookup").await;
    expect_redirect(&again, &format!("/orders/{order}"));
    assert_eq!(orders_of(&app, product), 1, "one intent, one order");
    assert_eq!(app.db.stock(product), 4);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kept_claim_that_bought_nothing_runs_again_once_no_request_can_still_commit() {
    let (app, proxy) = app_behind_proxy_with(|settings| {
        settings.lock_wait = Duration::from_millis(500);
        settings.db_statement_timeout = Duration::from_secs(1);
        settings.lock_lease = Duration::from_secs(2);
    })
    .await;
    let product = app.product(5, Some(1)).await;
    let buyer = app.customer("abandoned@example.com").await;

    // The transaction is rolled back, and the shop cannot look it up.
    proxy.drop_next_order_commit();
    let first = buyer.buy_with_key(product, "1", "rolled-back").await;
    assert_eq!(proxy.cuts(), 1, "the proxy cut the purchase's COMMIT");
    expect_page(
        first,
        StatusCode::SERVICE_UNAVAILABLE,
        "could not confirm your order",
    )
    .await;
    assert_eq!(orders_of(&app, product), 0, "the transaction rolled back");
    proxy.restore();
    heal(&app).await;

    // While a request might still commit under the claim, it stays held.
    let early = buyer.buy_with_key(product, "1", "rolled-back").await;
    expect_page(early, StatusCode::CONFLICT, "Already in progress").await;
    assert_eq!(orders_of(&app, product), 0);

    tokio::time::sleep(app.settings.longest_purchase()).await;
    let resend = buyer.buy_with_key(product, "1", "rolled-back").await;
    assert_eq!(resend.status(), StatusCode::SEE_OTHER, "the resend buys");
    let order = order_id_from(&resend);
    assert_eq!(orders_of(&app, product), 1);
    assert_eq!(the_order(&app, product), order);
    let again = buyer.buy_with_key(product, "1", "rolled-back").await;
    expect_redirect(&again, &format!("/orders/{order}"));
    assert_eq!(orders_of(&app, product), 1, "one intent, one order");
    assert_eq!(app.db.stock(product), 4);
    app.db.assert_audit_clean();
}

/// A payment's claim kept because its outcome was unknown (its COMMIT lost
/// its answer) is held while a request could still be running under it, then
/// taken over: the payment's own checks decide again, and it is paid once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kept_payment_claim_is_taken_over_once_no_request_can_still_run() {
    let app = spawn_app_with(|settings| {
        settings.lock_wait = Duration::from_millis(300);
        settings.payment_provider_timeout = Duration::from_secs(1);
    })
    .await;
    let product = app.product(5, None).await;
    let buyer = app.customer("kept-pay@example.com").await;
    let order = order_id_from(&buyer.buy(product, 1).await);
    let customer = app
        .db
        .count("SELECT id AS n FROM customers WHERE email = 'kept-pay@example.com'");
    let fingerprint = flashsale::services::idempotency::fingerprint(
        &app.shop.fingerprint_key,
        &format!("POST /orders/{order}/pay\ncard_number={GOOD_CARD}"),
    );
    app.db.count(&format!(
        "WITH k AS (INSERT INTO idempotency_keys (customer_id, key, fingerprint) VALUES ({customer}, 'pay-kept', '{fingerprint}') RETURNING 1) SELECT count(*) AS n FROM k"
    ));
    let pay = || {
        let buyer = buyer.clone();
        async move {
            let token = buyer.csrf().await;
            buyer
                .post(
                    &format!("/orders/{order}/pay"),
                    &[
                        ("card_number", GOOD_CARD),
                        ("csrf_token", &token),
                        ("idempotency_key", "pay-kept"),
                    ],
                )
                .await
        }
    };
    expect_page(pay().await, StatusCode::CONFLICT, "Already in progress").await;
    assert_eq!(app.db.count("SELECT count(*) AS n FROM payments"), 0);

    app.db.count(
        "WITH k AS (UPDATE idempotency_keys SET created_at = now() - interval '1 hour' WHERE key = 'pay-kept' RETURNING 1) SELECT count(*) AS n FROM k",
    );
    expect_redirect(&pay().await, &format!("/orders/{order}"));
    let again = pay().await;
    assert_eq!(
        again
            .headers()
            .get("Idempotent-Replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );
    expect_redirect(&again, &format!("/orders/{order}"));
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM payments WHERE outcome = 'approved'"),
        1
    );
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM orders WHERE id = {order} AND status = 'paid'"
        )),
        1
    );
}
