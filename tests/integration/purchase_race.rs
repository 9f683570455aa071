//! Many buyers, few units: exactly the stock is sold, through the real HTTP
//! server, real Postgres and real Redis, with every request released at once.

use std::sync::Arc;
use std::time::Instant;

use crate::helpers::*;
use reqwest::StatusCode;
use tokio::sync::Barrier;

/// Each buyer fetches its form token first, then all wait at the barrier and
/// press Buy at the same instant.
async fn race(buyers: &[Browser], product: i64) -> Vec<StatusCode> {
    let barrier = Arc::new(Barrier::new(buyers.len()));
    let tasks = buyers.iter().cloned().map(|buyer| {
        let barrier = barrier.clone();
        tokio::spawn(async move {
            let token = buyer.csrf().await;
            barrier.wait().await;
            checked_status(buyer.buy_with_token(product, "1", &token).await)
        })
    });
    futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_buyers_five_units_exactly_five_sold() {
    let app = spawn_app().await;
    let product = app.product(5, None).await;
    let buyers = app.customers(20, "buyer").await;

    let statuses = race(&buyers, product).await;

    let counts = tally(&statuses);
    assert_eq!(counts.get(&303), Some(&5), "answers: {counts:?}");
    assert_eq!(counts.get(&409), Some(&15), "answers: {counts:?}");
    let db = &app.db;
    assert_eq!(db.count("SELECT count(*) AS n FROM orders"), 5);
    assert_eq!(db.count("SELECT count(*) AS n FROM order_items"), 5);
    assert_eq!(
        db.count("SELECT count(*) AS n FROM stock_history WHERE reason = 'purchase'"),
        5
    );
    assert_eq!(db.stock(product), 0);
    let successes = counts[&303] as i64;
    assert_eq!(
        successes + db.stock(product),
        5,
        "successes + remaining = initial stock"
    );
    assert!(successes <= 5);
    db.assert_audit_clean();

    // The operator's command agrees.
    let audit = std::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
        .arg("audit")
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&audit.stdout);
    assert!(audit.status.success(), "flashsale audit failed: {printed}");
    assert!(printed.contains("audit clean"), "{printed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thousand_requests_hundred_units_on_32_workers() {
    const WORKERS: usize = 32;
    const REQUESTS: usize = 1_000;
    let app = spawn_app().await;
    let product = app.product(100, None).await;
    let buyers = app.customers(WORKERS, "worker").await;
    let started = Instant::now();
    let statuses = burst(buyers, product, REQUESTS).await;
    let elapsed = started.elapsed();

    let counts = tally(&statuses);
    eprintln!("1000 vs 100 on 32 workers: {counts:?} in {elapsed:?}");
    assert_eq!(statuses.len(), REQUESTS);
    assert_eq!(counts.get(&303), Some(&100), "answers: {counts:?}");
    assert_eq!(counts.get(&409), Some(&900), "answers: {counts:?}");
    assert_eq!(
        counts.get(&503),
        None,
        "no buyer may be turned away as busy: {counts:?}"
    );
    assert_eq!(app.db.stock(product), 0);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 100);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM stock_history"), 100);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_server_processes_share_the_stock() {
    let db = TestDb::new();
    let prefix = unique_prefix();
    let key = "ab".repeat(64);
    let first = start_server_process(&db.url, &prefix, &key, &[]);
    let second = start_server_process(&db.url, &prefix, &key, &[]);
    let product = create_product(
        &flashsale::db::build_pool(
            &db.url,
            2,
            std::time::Duration::from_secs(5),
            std::time::Duration::from_secs(3),
        ),
        7,
        None,
    )
    .await;

    let mut buyers = Vec::new();
    for i in 0..40 {
        let server = if i % 2 == 0 {
            &first.address
        } else {
            &second.address
        };
        buyers.push(Browser::sign_up(server, &format!("split{i}@example.com")));
    }
    let buyers = futures::future::join_all(buyers).await;
    let statuses = race(&buyers, product).await;

    let counts = tally(&statuses);
    assert_eq!(counts.get(&303), Some(&7), "answers: {counts:?}");
    assert_eq!(counts.get(&409), Some(&33), "answers: {counts:?}");
    // Both instances sold: neither was idle behind the other's lock.
    let per_instance: Vec<usize> = [0, 1]
        .iter()
        .map(|parity| {
            statuses
                .iter()
                .enumerate()
                .filter(|(i, s)| i % 2 == *parity && **s == StatusCode::SEE_OTHER)
                .count()
        })
        .collect();
    assert_eq!(per_instance.iter().sum::<usize>(), 7);
    assert_eq!(db.stock(product), 0);
    assert_eq!(db.count("SELECT count(*) AS n FROM orders"), 7);
    db.assert_audit_clean();
    drop(first);
    drop(second);
}
