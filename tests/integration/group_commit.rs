//! Group commit: the batches of several products share one purchase
//! transaction, a row held elsewhere holds up only its own product, and a
//! refusal in a shared transaction reaches only the batch it belongs to.
//!
//! To line batches up behind busy committers, a test connection takes an
//! `EXCLUSIVE` lock on `stock_history`: a purchase transaction then waits
//! at its write (not at its row lock, which the committer never waits for)
//! until the test lets it go.

use std::time::{Duration, Instant};

use diesel::{PgConnection, RunQueryDsl};
use reqwest::StatusCode;

use crate::helpers::*;
use flashsale::services::checkout::PurchaseOutcome;

/// Holds every purchase transaction at its ledger write until dropped
/// (or `let_go`).
struct LedgerHold(Option<PgConnection>);

impl LedgerHold {
    fn take(app: &TestApp) -> LedgerHold {
        let mut conn = app.db.conn();
        diesel::sql_query("BEGIN").execute(&mut conn).unwrap();
        diesel::sql_query("LOCK TABLE stock_history IN EXCLUSIVE MODE")
            .execute(&mut conn)
            .unwrap();
        LedgerHold(Some(conn))
    }

    fn let_go(mut self) {
        if let Some(mut conn) = self.0.take() {
            diesel::sql_query("COMMIT").execute(&mut conn).unwrap();
        }
    }
}

/// Both committers of the app's process busy with one buyer each, held at
/// their write by `hold`.
async fn occupy_committers(app: &TestApp) -> Vec<tokio::task::JoinHandle<StatusCode>> {
    let mut busy = Vec::new();
    for (i, buyer) in app.customers(2, "decoy").await.into_iter().enumerate() {
        let product = app.product(1, None).await;
        busy.push(tokio::spawn(
            async move { buyer.buy(product, 1).await.status() },
        ));
        // In turn, so each committer has started its own transaction.
        tokio::time::sleep(Duration::from_millis(150 + 50 * i as u64)).await;
    }
    busy
}

/// How many transactions wrote the orders of `products`.
fn transactions_of(app: &TestApp, products: &[i64]) -> i64 {
    let ids = products
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    app.db.count(&format!(
        "SELECT count(DISTINCT o.xmin::text) AS n FROM orders o \
         JOIN order_items i ON i.order_id = o.id WHERE i.product_id IN ({ids})"
    ))
}

/// Ten products' buyers line up behind busy committers and are written by
/// one transaction, each checked against their own product's limit: one
/// buyer already holds their limit of another product (and may still buy
/// theirs), and buys that other product again (and is refused, by the gate
/// or, with the gate off, in the shared transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buyers_of_many_products_share_one_commit() {
    let app = spawn_app_with(|s| s.combining = true).await;
    let products: Vec<i64> = {
        let mut products = Vec::new();
        for _ in 0..10 {
            products.push(app.product(3, Some(1)).await);
        }
        products
    };
    let buyers = app.customers(10, "spread").await;
    // The gate is seeded by each product's first buy: do that now, so the
    // buys below reach their product's batch together.
    let seeder = app.customer("seeder@example.com").await;
    for &product in &products {
        assert_eq!(seeder.buy(product, 1).await.status(), StatusCode::SEE_OTHER);
    }
    let at_limit = buyers[0].clone();
    let held_before = order_id_from(&at_limit.buy(products[1], 1).await);

    let hold = LedgerHold::take(&app);
    let busy = occupy_committers(&app).await;
    let mut pending = Vec::new();
    for (buyer, &product) in buyers.into_iter().zip(&products) {
        pending.push(tokio::spawn(
            async move { buyer.buy(product, 1).await.status() },
        ));
    }
    let over_limit = tokio::spawn({
        let product = products[1];
        async move { at_limit.buy(product, 1).await.status() }
    });
    // Far longer than a buy takes to reach the committer.
    tokio::time::sleep(Duration::from_millis(400)).await;
    hold.let_go();
    for busy in busy {
        assert_eq!(busy.await.unwrap(), StatusCode::SEE_OTHER);
    }
    for buy in pending {
        assert_eq!(buy.await.unwrap(), StatusCode::SEE_OTHER);
    }
    assert_eq!(over_limit.await.unwrap(), StatusCode::CONFLICT);

    for (i, &product) in products.iter().enumerate() {
        let expected = if i == 1 { 0 } else { 1 };
        assert_eq!(app.db.stock(product), expected, "product {product}");
    }
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 23);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM order_items"), 23);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM stock_history"), 23);
    app.db.assert_audit_clean();
    // The ten buys that waited behind the busy committers went in one
    // transaction, or two if both committers came free at once; without
    // group commit, each product would have committed on its own.
    let written_by = app.db.count(&format!(
        "SELECT count(DISTINCT o.xmin::text) AS n FROM orders o \
         JOIN order_items i ON i.order_id = o.id \
         JOIN customers c ON c.id = o.customer_id \
         WHERE c.email LIKE 'spread%' AND o.id <> {held_before} AND i.product_id IN ({})",
        products
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    ));
    assert!(
        written_by <= 2,
        "ten products' buyers were written by {written_by} transactions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_row_held_elsewhere_holds_up_only_its_own_product() {
    let app = spawn_app_with(|s| {
        s.combining = true;
        s.db_statement_timeout = Duration::from_secs(4);
        s.lock_lease = Duration::from_secs(8);
    })
    .await;
    let stuck: Vec<i64> = vec![app.product(5, None).await, app.product(5, None).await];
    let free = app.product(5, None).await;
    let buyer = app.customer("buyer@example.com").await;
    for &product in stuck.iter().chain([&free]) {
        order_id_from(&buyer.buy(product, 1).await);
    }

    // Two products' rows are held by someone else (a paused process whose
    // lock lapsed, say): their buyers wait for them, on their own
    // connections, and may take both committers' places if they waited there.
    let mut holder = app.db.conn();
    diesel::sql_query("BEGIN").execute(&mut holder).unwrap();
    diesel::sql_query(format!(
        "SELECT 1 FROM products WHERE id IN ({}, {}) FOR UPDATE",
        stuck[0], stuck[1]
    ))
    .execute(&mut holder)
    .unwrap();
    let mut waiting = Vec::new();
    for &product in &stuck {
        let buyer = buyer.clone();
        waiting.push(tokio::spawn(
            async move { buyer.buy(product, 1).await.status() },
        ));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }

    for round in 0..3 {
        let started = Instant::now();
        let bought = buyer.buy(free, 1).await;
        let took = started.elapsed();
        assert_eq!(bought.status(), StatusCode::SEE_OTHER, "round {round}");
        assert!(
            took < Duration::from_secs(1),
            "the free product's buy took {took:?} behind the held rows"
        );
    }
    diesel::sql_query("COMMIT").execute(&mut holder).unwrap();
    drop(holder);
    for waited in waiting {
        assert_eq!(waited.await.unwrap(), StatusCode::SEE_OTHER);
    }
    assert_eq!(app.db.stock(free), 1);
    assert_eq!(app.db.stock(stuck[0]), 3);
    assert_eq!(app.db.stock(stuck[1]), 3);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 8);
    app.db.assert_audit_clean();
}

/// A buyer whose rows Postgres refuses (their account is gone) shares a
/// transaction with another product's buyer: the transaction rolls back,
/// each batch is served alone, and only the refused buyer hears of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refusal_in_a_shared_commit_reaches_only_its_own_batch() {
    let app = spawn_app_with(|s| s.combining = true).await;
    let (refused_product, other_product) = (app.product(5, None).await, app.product(5, None).await);
    let good = app.customer("good@example.com").await;
    let good_id = app
        .db
        .count("SELECT id AS n FROM customers WHERE email = 'good@example.com'");

    let hold = LedgerHold::take(&app);
    let busy = occupy_committers(&app).await;
    let mut pending = Vec::new();
    for (product, customer) in [(refused_product, -1), (other_product, good_id)] {
        let shop = app.shop.clone();
        pending.push(tokio::spawn(async move {
            one_unit_in_batch(&shop, product, customer).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    hold.let_go();
    for busy in busy {
        assert_eq!(busy.await.unwrap(), StatusCode::SEE_OTHER);
    }
    let answers: Vec<_> = futures::future::join_all(pending)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();

    assert!(answers[0].is_err(), "the unknown account: {answers:?}");
    assert!(
        matches!(answers[1], Ok(PurchaseOutcome::Purchased(_))),
        "{answers:?}"
    );
    assert_eq!(app.db.stock(refused_product), 5);
    assert_eq!(app.db.stock(other_product), 4);
    assert_eq!(transactions_of(&app, &[refused_product]), 0);
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM orders WHERE customer_id = {good_id}"
        )),
        1
    );
    drop(good);
    app.db.assert_audit_clean();
}
