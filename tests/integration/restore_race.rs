//! Restores (payment declined, refund) racing new purchases of the same
//! product: every unit is given back exactly once and the ledger holds.

use std::sync::Arc;

use crate::helpers::*;
use reqwest::StatusCode;
use tokio::sync::Barrier;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn declines_and_refunds_race_purchases_and_the_ledger_holds() {
    let app = spawn_app().await;
    let product = app.product(30, None).await;
    let admin = app.admin().await;

    // Ten earlier orders: five will be declined, five paid and then refunded.
    let early = app.customers(10, "early").await;
    let mut orders = Vec::new();
    for buyer in &early {
        let response = buyer.buy(product, 1).await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        orders.push(order_id_from(&response));
    }
    for (buyer, order) in early.iter().zip(&orders).skip(5) {
        assert_eq!(
            buyer.pay(*order, GOOD_CARD).await.status(),
            StatusCode::SEE_OTHER
        );
    }
    assert_eq!(app.db.stock(product), 20);

    let late = app.customers(40, "late").await;
    let participants = late.len() + 10;
    let barrier = Arc::new(Barrier::new(participants));
    let mut tasks = Vec::new();
    for buyer in late {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let token = buyer.csrf().await;
            barrier.wait().await;
            (
                "buy",
                checked_status(buyer.buy_with_token(product, "1", &token).await),
            )
        }));
    }
    // Each declined order's tries but the last keep its units: the last
    // decline, which restores them, is the one that races.
    for (buyer, order) in early.iter().zip(orders.iter().copied()).take(5) {
        for _ in 1..flashsale::services::payment::CARD_TRIES {
            assert_eq!(
                buyer.pay(order, DECLINED_CARD).await.status(),
                StatusCode::SEE_OTHER
            );
        }
    }
    for (buyer, order) in early.iter().cloned().zip(orders.clone()).take(5) {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let token = buyer.csrf().await;
            barrier.wait().await;
            let response = buyer
                .post(
                    &format!("/orders/{order}/pay"),
                    &[("card_number", DECLINED_CARD), ("csrf_token", &token)],
                )
                .await;
            ("decline", response.status())
        }));
    }
    for order in orders.iter().copied().skip(5) {
        let barrier = barrier.clone();
        let admin = admin.clone();
        tasks.push(tokio::spawn(async move {
            let token = admin.csrf().await;
            barrier.wait().await;
            let response = admin
                .post(
                    &format!("/admin/orders/{order}/refund"),
                    &[("csrf_token", &token)],
                )
                .await;
            ("refund", response.status())
        }));
    }
    let results: Vec<(&str, StatusCode)> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();

    for (kind, status) in &results {
        if *kind != "buy" {
            assert_eq!(*status, StatusCode::SEE_OTHER, "{kind} must succeed");
        }
    }
    let bought = results
        .iter()
        .filter(|(k, s)| *k == "buy" && *s == StatusCode::SEE_OTHER)
        .count() as i64;
    let sold_out = results
        .iter()
        .filter(|(k, s)| *k == "buy" && *s == StatusCode::CONFLICT)
        .count() as i64;
    assert_eq!(
        bought + sold_out,
        40,
        "every buyer got 303 or 409: {results:?}"
    );
    // 20 units were free, and 10 came back while the race ran: between 20 and 30 sold.
    assert!((20..=30).contains(&bought), "bought {bought}");

    let db = &app.db;
    let stock = db.stock(product);
    assert!(stock >= 0);
    assert_eq!(
        bought + stock,
        30,
        "every restored unit was sold or is on the shelf"
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM stock_history WHERE reason = 'payment_failed'"),
        5
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM stock_history WHERE reason = 'refund'"),
        5
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM orders WHERE status = 'payment_failed'"),
        5
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM orders WHERE status = 'refunded'"),
        5
    );
    assert_eq!(
        db.count(&format!("SELECT (30 + COALESCE(sum(delta), 0))::int8 AS n FROM stock_history WHERE product_id = {product}")),
        stock,
        "initial + sum(deltas) = stock"
    );
    assert_eq!(db.count("SELECT count(*) AS n FROM orders"), 10 + bought);
    db.assert_audit_clean();
}
