//! The per-customer limit kept as one `holdings` row per customer and
//! product: every purchase path adds to it, every restore (declined card,
//! expiry, refund) takes from it, in the order's own transaction; the
//! table's CHECK refuses a row over the limit; the audit names a row that
//! disagrees with the orders.

use std::sync::Arc;

use crate::helpers::*;
use reqwest::StatusCode;
use tokio::sync::Barrier;

fn held(db: &TestDb, product: i64, customer_email: &str) -> i64 {
    db.count(&format!(
        "SELECT COALESCE((SELECT units FROM holdings h JOIN customers c ON c.id = h.customer_id \
         WHERE h.product_id = {product} AND c.email = '{customer_email}'), -1)::bigint AS n"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_restore_gives_the_allowance_back_exactly_once() {
    let app = spawn_app().await;
    let product = app.product(20, Some(2)).await;
    let email = "holder@example.com";
    let buyer = app.customer(email).await;
    let admin = app.admin().await;

    let first = order_id_from(&buyer.buy(product, 2).await);
    assert_eq!(held(&app.db, product, email), 2);
    let over = buyer.buy(product, 1).await;
    expect_page(over, StatusCode::CONFLICT, "limit").await;
    assert_eq!(held(&app.db, product, email), 2);

    // Declined to the last try: both units come back to the customer's allowance.
    assert_eq!(
        buyer.pay(first, DECLINED_CARD).await.status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(held(&app.db, product, email), 2, "held for another card");
    assert_eq!(
        buyer
            .decline_times(first, flashsale::services::payment::CARD_TRIES - 1)
            .await
            .status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(held(&app.db, product, email), 0);

    // Expired: the same.
    let second = order_id_from(&buyer.buy(product, 1).await);
    let third = order_id_from(&buyer.buy(product, 1).await);
    assert_eq!(held(&app.db, product, email), 2);
    app.db.count(&format!(
        "WITH u AS (UPDATE orders SET payment_deadline = now() - interval '1 second' \
         WHERE id = {second} RETURNING 1) SELECT count(*) AS n FROM u"
    ));
    flashsale::services::jobs::run_once(&app.shop)
        .await
        .unwrap();
    assert_eq!(held(&app.db, product, email), 1);

    // Refunded: the same, once however often the admin clicks.
    assert_eq!(
        buyer.pay(third, GOOD_CARD).await.status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(held(&app.db, product, email), 1);
    let token = admin.csrf().await;
    let refund = format!("/admin/orders/{third}/refund");
    assert_eq!(
        admin
            .post(&refund, &[("csrf_token", &token)])
            .await
            .status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        admin
            .post(&refund, &[("csrf_token", &token)])
            .await
            .status(),
        StatusCode::CONFLICT
    );
    assert_eq!(held(&app.db, product, email), 0);

    // The whole allowance is there again, and no more.
    assert_eq!(buyer.buy(product, 2).await.status(), StatusCode::SEE_OTHER);
    assert_eq!(buyer.buy(product, 1).await.status(), StatusCode::CONFLICT);
    assert_eq!(held(&app.db, product, email), 2);
    assert_eq!(app.db.stock(product), 18);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cart_counts_against_the_limit_like_a_single_buy() {
    let app = spawn_app().await;
    let limited = app.product(10, Some(1)).await;
    let open = app.product(10, None).await;
    let email = "cart-holder@example.com";
    let buyer = app.customer(email).await;
    assert_eq!(buyer.buy(limited, 1).await.status(), StatusCode::SEE_OTHER);

    for product in [open, limited] {
        let added = buyer
            .post_form(
                "/cart/add",
                &[("product_id", &product.to_string()), ("quantity", "1")],
            )
            .await;
        assert_eq!(added.status(), StatusCode::SEE_OTHER);
    }
    let checkout = buyer
        .post_form("/cart/checkout", &[("idempotency_key", "cart-holder")])
        .await;
    expect_page(checkout, StatusCode::CONFLICT, "limit").await;
    // All or nothing: the unlimited line was not sold either.
    assert_eq!(app.db.stock(open), 10);
    assert_eq!(held(&app.db, open, email), -1);
    assert_eq!(held(&app.db, limited, email), 1);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_limit_is_per_person_so_only_confirmed_addresses_buy_a_limited_sale() {
    let app = spawn_app().await;
    let limited = app.product(10, Some(1)).await;
    let open = app.product(10, None).await;
    let person = app.customer("drop.fan@gmail.com").await;
    // The same Gmail mailbox written with a +tag and without the dot: the
    // account exists, but its address can never be confirmed beside the
    // first (one confirmed account per person), so it is not a second person.
    let twin_email = "dropfan+2@gmail.com";
    let twin = app.unconfirmed_customer(twin_email).await;

    assert_eq!(person.buy(limited, 1).await.status(), StatusCode::SEE_OTHER);
    let refused = twin.buy(limited, 1).await;
    let page = expect_page(
        refused,
        StatusCode::FORBIDDEN,
        "Confirm your email address first",
    )
    .await;
    assert!(page.contains("limited to 1 per person"), "{page}");
    // A cart is held to the same rule, and sells none of its lines.
    for product in [open, limited] {
        let added = twin
            .post_form(
                "/cart/add",
                &[("product_id", &product.to_string()), ("quantity", "1")],
            )
            .await;
        assert_eq!(added.status(), StatusCode::SEE_OTHER);
    }
    let checkout = twin
        .post_form("/cart/checkout", &[("idempotency_key", "twin-cart")])
        .await;
    expect_page(
        checkout,
        StatusCode::FORBIDDEN,
        "Confirm your email address first",
    )
    .await;
    assert_eq!(app.db.stock(open), 10);

    // Past the shop's early refusal, straight into the product's batch: the
    // order's transaction refuses the unconfirmed buyer too.
    let twin_id = app.db.count(&format!(
        "SELECT id AS n FROM customers WHERE email = '{twin_email}'"
    ));
    assert!(
        app.shop.combiner.is_none()
            || matches!(
                one_unit_in_batch(&app.shop, limited, twin_id).await,
                Ok(flashsale::services::checkout::PurchaseOutcome::Refused(
                    flashsale::domain::Refusal::AddressUnconfirmed { limit: 1, .. }
                ))
            ),
        "the batch sold to an unconfirmed address"
    );

    // A sale without a limit has no person to count: any account buys.
    assert_eq!(twin.buy(open, 1).await.status(), StatusCode::SEE_OTHER);

    assert_eq!(app.db.stock(limited), 9);
    assert_eq!(held(&app.db, limited, twin_email), -1);
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM order_items i JOIN orders o ON o.id = i.order_id \
             JOIN customers c ON c.id = o.customer_id \
             WHERE i.product_id = {limited} AND c.email = '{twin_email}'"
        )),
        0
    );
    // What the gate admitted for the refused buys came back to it.
    if let Some(gate) = &app.shop.gate {
        assert_eq!(
            gate.stock(flashsale::domain::ProductId(limited))
                .await
                .unwrap(),
            Some(9)
        );
    }
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn distinct_buyers_racing_in_batches_each_hold_at_most_the_limit() {
    let app = spawn_app().await;
    let product = app.product(1_000, Some(1)).await;
    let buyers = app.customers(24, "batch-holder").await;
    // Each buyer fires three buys at once with different keys: batches and
    // group commits carry several of one customer's buys together.
    let barrier = Arc::new(Barrier::new(buyers.len() * 3));
    let tasks = buyers.iter().flat_map(|buyer| {
        (0..3).map({
            let barrier = barrier.clone();
            move |tab| {
                let (buyer, barrier) = (buyer.clone(), barrier.clone());
                tokio::spawn(async move {
                    let key = uuid::Uuid::new_v4().to_string();
                    let token = buyer.csrf().await;
                    barrier.wait().await;
                    let _ = tab;
                    buyer
                        .post(
                            &format!("/products/{product}/buy"),
                            &[
                                ("quantity", "1"),
                                ("csrf_token", &token),
                                ("idempotency_key", &key),
                            ],
                        )
                        .await
                        .status()
                })
            }
        })
    });
    let statuses: Vec<StatusCode> = futures::future::join_all(tasks.collect::<Vec<_>>())
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let counts = tally(&statuses);
    assert_eq!(counts.get(&303), Some(&24), "{counts:?}");
    assert_eq!(counts.get(&409), Some(&48), "{counts:?}");
    assert_eq!(app.db.stock(product), 1_000 - 24);
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM holdings WHERE product_id = {product} AND units = 1"
        )),
        24
    );
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM holdings WHERE product_id = {product} AND units <> 1"
        )),
        0
    );
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lowered_limit_binds_the_next_purchase_and_the_table_fences_it() {
    let app = spawn_app().await;
    let product = app.product(10, Some(3)).await;
    let email = "lowered@example.com";
    let buyer = app.customer(email).await;
    assert_eq!(buyer.buy(product, 2).await.status(), StatusCode::SEE_OTHER);
    app.db.count(&format!(
        "WITH u AS (UPDATE products SET per_customer_limit = 1 WHERE id = {product} RETURNING 1) \
         SELECT count(*) AS n FROM u"
    ));
    expect_page(buyer.buy(product, 1).await, StatusCode::CONFLICT, "limit").await;
    assert_eq!(held(&app.db, product, email), 2);
    assert_eq!(app.db.stock(product), 8);

    // Postgres itself refuses a holding over the limit it was bought
    // under, whatever code writes it.
    use diesel::RunQueryDsl;
    let mut conn = app.db.conn();
    let over = diesel::sql_query(format!(
        "UPDATE holdings SET units = 3, cap = 2 WHERE product_id = {product}"
    ))
    .execute(&mut conn)
    .expect_err("a holding over its cap is refused");
    assert!(over.to_string().contains("holdings_within_limit"), "{over}");
    let negative = diesel::sql_query(format!(
        "UPDATE holdings SET units = -1 WHERE product_id = {product}"
    ))
    .execute(&mut conn)
    .expect_err("a negative holding is refused");
    assert!(
        negative.to_string().contains("holdings_not_negative"),
        "{negative}"
    );
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_audit_names_holdings_that_disagree_with_the_orders() {
    let app = spawn_app().await;
    let product = app.product(10, Some(2)).await;
    let buyer = app.customer("drifted@example.com").await;
    assert_eq!(buyer.buy(product, 1).await.status(), StatusCode::SEE_OTHER);
    app.db.assert_audit_clean();
    app.db.count(&format!(
        "WITH u AS (UPDATE holdings SET units = 2 WHERE product_id = {product} RETURNING 1) \
         SELECT count(*) AS n FROM u"
    ));
    let report = flashsale::db::run(&app.shop.pool, |conn| {
        flashsale::services::ledger_audit::run_audit(conn)
    })
    .await
    .unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("1 customers' holdings disagree")),
        "{:?}",
        report.problems
    );
}
