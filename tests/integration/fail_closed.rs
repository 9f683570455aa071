//! When Redis or Postgres is gone, or the lock cannot be had in time, the shop
//! answers 503 and writes nothing.

use std::time::Duration;

use crate::helpers::*;
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_stopped_mid_sale_answers_503_and_writes_nothing() {
    let (mut redis, port) = start_redis();
    let app = spawn_app_with(|s| s.redis_urls = vec![format!("redis://127.0.0.1:{port}")]).await;
    let product = app.product(5, None).await;
    let buyer = app.customer("redis-down@example.com").await;
    assert_eq!(buyer.buy(product, 1).await.status(), StatusCode::SEE_OTHER);
    let paid_order = app.db.count("SELECT max(id) AS n FROM orders");
    assert_eq!(
        buyer.pay(paid_order, GOOD_CARD).await.status(),
        StatusCode::SEE_OTHER
    );
    let admin = app.admin().await;
    let before = app.db.ledger_rows();

    redis.kill();

    let response = buyer.buy(product, 1).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let page = response.text().await.unwrap();
    assert!(page.contains("briefly unavailable"), "{page}");
    assert!(page.contains("nothing was reserved or charged"), "{page}");
    // A refund needs the lock as well: refused, nothing restored.
    let refund = admin
        .post_form(&format!("/admin/orders/{paid_order}/refund"), &[])
        .await;
    assert_eq!(refund.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        app.db.ledger_rows(),
        before,
        "nothing written while Redis is down"
    );
    assert_eq!(app.db.stock(product), 4);
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM orders WHERE status = 'paid'"),
        1
    );
    assert_eq!(
        buyer.get("/readyz").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_redis_url_answers_503() {
    let port = free_port();
    let app = spawn_app_with(|s| s.redis_urls = vec![format!("redis://127.0.0.1:{port}")]).await;
    let product = app.product(5, None).await;
    let buyer = app.customer("no-redis@example.com").await;
    let response = buyer.buy(product, 1).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.db.ledger_rows(), 0);
    assert_eq!(app.db.stock(product), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_held_elsewhere_past_the_deadline_answers_busy() {
    let app = spawn_app_with(|s| s.lock_wait = Duration::from_millis(1_000)).await;
    let product = app.product(5, None).await;
    let buyer = app.customer("busy@example.com").await;

    // Another instance (simulated) holds the product's lock for 10 s.
    let key = app.shop.locks.key(flashsale::domain::ProductId(product));
    assert!(key.ends_with(&format!("promotion-product:{product}")));
    let client = redis::Client::open(app.settings.redis_urls[0].as_str()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("another-holder")
        .arg("PX")
        .arg(10_000)
        .query_async(&mut redis)
        .await
        .unwrap();

    let started = std::time::Instant::now();
    let response = buyer.buy(product, 1).await;
    let waited = started.elapsed();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    let page = response.text().await.unwrap();
    assert!(page.contains("Too many buyers"), "{page}");
    assert!(
        waited < Duration::from_secs(3),
        "bounded wait, took {waited:?}"
    );
    assert_eq!(app.db.ledger_rows(), 0);

    // Once the other holder lets go, buying works again.
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(buyer.buy(product, 1).await.status(), StatusCode::SEE_OTHER);
    assert_eq!(app.db.stock(product), 4);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn database_unreachable_answers_503() {
    let app = spawn_app().await;
    let product = app.product(5, None).await;
    let buyer = app.customer("no-db@example.com").await;
    let token = buyer.csrf().await;
    let ledger_before = app.db.ledger_rows();
    assert_eq!(ledger_before, 0);

    // The database goes away under the running shop.
    app.db.vanish();
    let response = buyer.buy_with_token(product, "1", &token).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response
        .text()
        .await
        .unwrap()
        .contains("briefly unavailable"));
    assert_eq!(
        buyer.get("/readyz").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}
