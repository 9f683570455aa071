//! The order lifecycle beyond the happy path: idempotent POSTs, per-customer
//! limits under concurrency, quantities and multi-item carts, expiry.

use std::sync::Arc;
use std::time::Duration;

use crate::helpers::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use tokio::sync::Barrier;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replayed_buy_returns_the_same_order_and_changes_nothing() {
    let app = spawn_app().await;
    let product = app.product(10, None).await;
    let buyer = app.customer("replay@example.com").await;

    let first = buyer.buy_with_key(product, "2", "click-1").await;
    assert_eq!(first.status(), StatusCode::SEE_OTHER);
    let order = order_id_from(&first);
    let again = buyer.buy_with_key(product, "2", "click-1").await;
    assert_eq!(again.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        order_id_from(&again),
        order,
        "a replay answers with the original order"
    );
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 1);
    assert_eq!(app.db.stock(product), 8);

    let conflicting = buyer.buy_with_key(product, "3", "click-1").await;
    assert_eq!(conflicting.status(), StatusCode::CONFLICT);
    assert!(conflicting
        .text()
        .await
        .unwrap()
        .contains("Conflicting reuse of key"));
    for bad in ["", &"k".repeat(256)] {
        let response = buyer.buy_with_key(product, "1", bad).await;
        assert_eq!(
            response.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "key of {} chars",
            bad.len()
        );
    }
    // The header form of the key works the same way.
    let token = buyer.csrf().await;
    let send = || {
        buyer
            .client
            .post(format!("{}/products/{product}/buy", app.address))
            .header("Idempotency-Key", "header-key")
            .form(&[("quantity", "1"), ("csrf_token", token.as_str())])
            .send()
    };
    let first = send().await.unwrap();
    let second = send().await.unwrap();
    assert_eq!(order_id_from(&first), order_id_from(&second));
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 2);
    // A refusal is remembered too: the same key gets the same 409, even after stock returns.
    let refused = buyer.buy_with_key(product, "50", "too-many").await;
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    assert_eq!(
        buyer.buy_with_key(product, "50", "too-many").await.status(),
        StatusCode::CONFLICT
    );
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 2);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn double_click_on_buy_pay_and_refund_runs_each_once() {
    let app = spawn_app().await;
    let product = app.product(10, None).await;
    let buyer = app.customer("double@example.com").await;
    let token = buyer.csrf().await;

    // Two identical submissions at the same instant: one execution, one answer.
    let barrier = Arc::new(Barrier::new(2));
    let clicks = (0..2).map(|_| {
        let (buyer, token, barrier) = (buyer.clone(), token.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            let path = format!("/products/{product}/buy");
            buyer
                .post(
                    &path,
                    &[
                        ("quantity", "1"),
                        ("csrf_token", &token),
                        ("idempotency_key", "same-click"),
                    ],
                )
                .await
        })
    });
    let responses: Vec<_> = futures::future::join_all(clicks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    for response in &responses {
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
    }
    let order = order_id_from(&responses[0]);
    assert_eq!(order_id_from(&responses[1]), order);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 1);
    // The purchase named its order on the key in the order's own transaction;
    // a later replay is sent to that order, and nothing is bought again.
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM idempotency_keys WHERE key = 'same-click' AND order_id = {order}"
        )),
        1
    );
    let replay = buyer
        .post(
            &format!("/products/{product}/buy"),
            &[
                ("quantity", "1"),
                ("csrf_token", &token),
                ("idempotency_key", "same-click"),
            ],
        )
        .await;
    assert_eq!(replay.status(), StatusCode::SEE_OTHER);
    assert_eq!(order_id_from(&replay), order);
    assert_eq!(
        replay
            .headers()
            .get("Idempotent-Replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 1);
    assert_eq!(app.db.stock(product), 9);

    let pay = |key: &'static str| {
        let (buyer, token) = (buyer.clone(), token.clone());
        async move {
            buyer
                .post(
                    &format!("/orders/{order}/pay"),
                    &[
                        ("card_number", GOOD_CARD),
                        ("csrf_token", &token),
                        ("idempotency_key", key),
                    ],
                )
                .await
        }
    };
    let (a, b) = tokio::join!(pay("pay-once"), pay("pay-once"));
    assert_eq!(
        (a.status(), b.status()),
        (StatusCode::SEE_OTHER, StatusCode::SEE_OTHER)
    );
    assert_eq!(app.db.count("SELECT count(*) AS n FROM payments"), 1);
    card_number_cannot_be_read_back_from_the_key(&app.db, order);

    let admin = app.admin().await;
    let admin_token = admin.csrf().await;
    let refund = || {
        let (admin, token) = (admin.clone(), admin_token.clone());
        async move {
            admin
                .post(
                    &format!("/admin/orders/{order}/refund"),
                    &[("csrf_token", &token), ("idempotency_key", "refund-once")],
                )
                .await
        }
    };
    let (a, b) = tokio::join!(refund(), refund());
    assert_eq!(
        (a.status(), b.status()),
        (StatusCode::SEE_OTHER, StatusCode::SEE_OTHER)
    );
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM stock_history WHERE reason = 'refund'"),
        1
    );
    assert_eq!(app.db.stock(product), 10);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotency_keys_are_purged_after_retention() {
    let app = spawn_app().await;
    let product = app.product(10, None).await;
    let buyer = app.customer("purge@example.com").await;
    assert_eq!(
        buyer.buy_with_key(product, "1", "old").await.status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        buyer.buy_with_key(product, "1", "new").await.status(),
        StatusCode::SEE_OTHER
    );
    app.db.count("WITH u AS (UPDATE idempotency_keys SET created_at = now() - interval '25 hours' WHERE key = 'old' RETURNING 1) SELECT count(*) AS n FROM u");
    let report = flashsale::services::jobs::run_once(&app.shop)
        .await
        .unwrap();
    assert_eq!(report.purged_keys, 1);
    assert_eq!(
        app.db.count("SELECT count(*) AS n FROM idempotency_keys"),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_tabs_cannot_pass_the_per_customer_limit_together() {
    let app = spawn_app().await;
    let product = app.product(10, Some(1)).await;
    let buyer = app.customer("two-tabs@example.com").await;
    let token = buyer.csrf().await;
    let barrier = Arc::new(Barrier::new(4));
    let tabs = (0..4).map(|tab| {
        let (buyer, token, barrier) = (buyer.clone(), token.clone(), barrier.clone());
        tokio::spawn(async move {
            let key = format!("tab-{tab}");
            barrier.wait().await;
            let path = format!("/products/{product}/buy");
            buyer
                .post(
                    &path,
                    &[
                        ("quantity", "1"),
                        ("csrf_token", &token),
                        ("idempotency_key", &key),
                    ],
                )
                .await
                .status()
        })
    });
    let statuses: Vec<StatusCode> = futures::future::join_all(tabs)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let counts = tally(&statuses);
    assert_eq!(counts.get(&303), Some(&1), "{counts:?}");
    assert_eq!(counts.get(&409), Some(&3), "{counts:?}");
    assert_eq!(app.db.stock(product), 9);

    // A payment declined to its last try gives the allowance back.
    let order = app.db.count("SELECT max(id) AS n FROM orders");
    assert_eq!(
        buyer.decline_to_the_end(order).await.status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(buyer.buy(product, 1).await.status(), StatusCode::SEE_OTHER);
    assert_eq!(app.db.stock(product), 9);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cart_checkout_buys_all_lines_or_none() {
    let app = spawn_app().await;
    let a = app.product(5, None).await;
    let b = app.product(5, None).await;
    let scarce = app.product(1, None).await;
    let buyer = app.customer("cart@example.com").await;

    for (product, quantity) in [(a, "2"), (b, "1"), (a, "1")] {
        let response = buyer
            .post_form(
                "/cart/add",
                &[("product_id", &product.to_string()), ("quantity", quantity)],
            )
            .await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
    }
    let (status, page) = buyer.get_text("/cart").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("value=\"3\"") && page.contains("$30.00"),
        "{page}"
    );
    assert_eq!(
        buyer
            .post_form(
                "/cart/update",
                &[("product_id", &b.to_string()), ("quantity", "2")]
            )
            .await
            .status(),
        StatusCode::SEE_OTHER
    );
    let response = buyer
        .post_form("/cart/add", &[("product_id", "999999"), ("quantity", "1")])
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    let checkout = buyer
        .post_form("/cart/checkout", &[("idempotency_key", "cart-1")])
        .await;
    assert_eq!(checkout.status(), StatusCode::SEE_OTHER);
    let order = order_id_from(&checkout);
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM order_items WHERE order_id = {order}"
        )),
        2
    );
    assert_eq!((app.db.stock(a), app.db.stock(b)), (2, 3));
    let (_, page) = buyer.get_text("/cart").await;
    assert!(
        page.contains("Your cart is empty"),
        "the cart is emptied by checkout"
    );

    // One line cannot be served: nothing of the cart is bought.
    let rival = app.customer("rival@example.com").await;
    assert_eq!(rival.buy(scarce, 1).await.status(), StatusCode::SEE_OTHER);
    for (product, quantity) in [(a, "1"), (scarce, "1")] {
        buyer
            .post_form(
                "/cart/add",
                &[("product_id", &product.to_string()), ("quantity", quantity)],
            )
            .await;
    }
    let rows = app.db.ledger_rows();
    let refused = buyer
        .post_form("/cart/checkout", &[("idempotency_key", "cart-2")])
        .await;
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    assert_eq!(app.db.ledger_rows(), rows);
    assert_eq!(app.db.stock(a), 2);
    // Removing the unavailable line lets the rest through.
    assert_eq!(
        buyer
            .post_form("/cart/remove", &[("product_id", &scarce.to_string())])
            .await
            .status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        buyer
            .post_form("/cart/checkout", &[("idempotency_key", "cart-3")])
            .await
            .status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(app.db.stock(a), 1);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_carts_never_deadlock_or_oversell() {
    let app = spawn_app().await;
    let products = [
        app.product(12, None).await,
        app.product(12, None).await,
        app.product(12, None).await,
    ];
    let buyers = app.customers(30, "overlap").await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());

    // Each buyer fills a cart of two or three products, added in a random order.
    let mut carts = Vec::new();
    for buyer in &buyers {
        let size = rng.gen_range(2..=3);
        let mut picked: Vec<i64> = products.choose_multiple(&mut rng, size).copied().collect();
        picked.shuffle(&mut rng);
        let mut cart = Vec::new();
        for product in picked {
            let units: u32 = rng.gen_range(1..=2);
            let response = buyer
                .post_form(
                    "/cart/add",
                    &[
                        ("product_id", &product.to_string()),
                        ("quantity", &units.to_string()),
                    ],
                )
                .await;
            assert_eq!(response.status(), StatusCode::SEE_OTHER);
            cart.push((product, units as i64));
        }
        carts.push(cart);
    }
    let barrier = Arc::new(Barrier::new(buyers.len()));
    let tasks = buyers.iter().cloned().map(|buyer| {
        let barrier = barrier.clone();
        tokio::spawn(async move {
            let token = buyer.csrf().await;
            barrier.wait().await;
            buyer
                .post("/cart/checkout", &[("csrf_token", token.as_str())])
                .await
        })
    });
    let responses = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(tasks))
        .await
        .expect("checkouts finish: no deadlock");

    let mut sold = [0i64; 3];
    for (response, cart) in responses.into_iter().map(|r| r.unwrap()).zip(&carts) {
        match response.status() {
            StatusCode::SEE_OTHER => {
                let order = order_id_from(&response);
                // All of the cart, nothing else.
                assert_eq!(
                    app.db.count(&format!(
                        "SELECT count(*) AS n FROM order_items WHERE order_id = {order}"
                    )),
                    cart.len() as i64
                );
                for (product, units) in cart {
                    let stored = app.db.count(&format!("SELECT quantity::int8 AS n FROM order_items WHERE order_id = {order} AND product_id = {product}"));
                    assert_eq!(stored, *units);
                    sold[products.iter().position(|p| p == product).unwrap()] += units;
                }
            }
            StatusCode::CONFLICT => {}
            other => panic!(
                "unexpected answer {other}: {}",
                response.text().await.unwrap()
            ),
        }
    }
    for (i, product) in products.iter().enumerate() {
        let stock = app.db.stock(*product);
        assert!(stock >= 0);
        assert_eq!(
            sold[i] + stock,
            12,
            "product {product}: sold {} + stock {stock}",
            sold[i]
        );
    }
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders o WHERE NOT EXISTS (SELECT 1 FROM order_items i WHERE i.order_id = o.id)"), 0);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unpaid_orders_expire_once_and_late_payments_are_refused() {
    let app = spawn_app_with(|s| s.payment_timeout = Duration::from_secs(1)).await;
    let product = app.product(5, None).await;
    let buyer = app.customer("slow@example.com").await;
    let unpaid = order_id_from(&buyer.buy(product, 2).await);
    let paid = order_id_from(&buyer.buy(product, 1).await);
    assert_eq!(
        buyer.pay(paid, GOOD_CARD).await.status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        flashsale::services::jobs::run_once(&app.shop)
            .await
            .unwrap()
            .expired,
        0,
        "nothing is due yet"
    );
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    let late = buyer.pay(unpaid, GOOD_CARD).await;
    assert_eq!(late.status(), StatusCode::CONFLICT);
    assert!(late.text().await.unwrap().contains("time to pay"));

    let report = flashsale::services::jobs::run_once(&app.shop)
        .await
        .unwrap();
    assert_eq!(report.expired, 1);
    assert_eq!(app.db.stock(product), 4);
    assert_eq!(app.db.count(&format!("SELECT count(*) AS n FROM stock_history WHERE order_id = {unpaid} AND reason = 'expired' AND delta = 2")), 1);
    assert_eq!(
        flashsale::services::jobs::run_once(&app.shop)
            .await
            .unwrap()
            .expired,
        0,
        "never twice"
    );
    let (_, page) = buyer.get_text(&format!("/orders/{unpaid}")).await;
    assert!(page.contains("Expired"), "{page}");
    let admin = app.admin().await;
    let (_, page) = admin.get_text(&format!("/admin/orders/{unpaid}")).await;
    assert!(
        page.contains("expired") && page.contains("Expired"),
        "{page}"
    );
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_sweeping_together_restore_each_order_once() {
    let first = spawn_app_with(|s| s.payment_timeout = Duration::from_secs(1)).await;
    let product = first.product(40, None).await;
    let buyers = first.customers(20, "sweep").await;
    for buyer in &buyers {
        assert_eq!(buyer.buy(product, 1).await.status(), StatusCode::SEE_OTHER);
    }
    assert_eq!(first.db.stock(product), 20);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // A second instance of the shop on the same database and Redis namespace.
    let mut settings = first.settings.clone();
    settings.bind = "127.0.0.1:0".into();
    let second = flashsale::services::Shop::new(settings).await.unwrap();

    let (a, b) = tokio::join!(
        flashsale::services::jobs::run_once(&first.shop),
        flashsale::services::jobs::run_once(&second)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.expired + b.expired, 20, "{a:?} {b:?}");
    assert_eq!(a.failed + b.failed, 0);
    assert_eq!(
        first
            .db
            .count("SELECT count(*) AS n FROM stock_history WHERE reason = 'expired'"),
        20
    );
    assert_eq!(first.db.stock(product), 40);
    first.db.assert_audit_clean();
}

/// The payment's key row keeps a fingerprint of what was sent, card number
/// included: a plain hash of that text could be reversed by trying the few
/// billion card numbers a BIN leaves, so it must be keyed, and no column
/// may hold the digits.
fn card_number_cannot_be_read_back_from_the_key(db: &TestDb, order: i64) {
    use diesel::prelude::*;
    use sha2::{Digest, Sha256};
    #[derive(QueryableByName)]
    struct KeyRow {
        #[diesel(sql_type = diesel::sql_types::Text)]
        fingerprint: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        everything: String,
    }
    let row: KeyRow = diesel::sql_query(
        "SELECT fingerprint, k::text AS everything FROM idempotency_keys k WHERE key = 'pay-once'",
    )
    .get_result(&mut db.conn())
    .unwrap();
    let sent = format!("POST /orders/{order}/pay\ncard_number={GOOD_CARD}");
    let unkeyed = hex::encode(Sha256::digest(sent.as_bytes()));
    assert_ne!(row.fingerprint, unkeyed, "the fingerprint is a plain hash");
    let digits: String = GOOD_CARD.chars().filter(char::is_ascii_digit).collect();
    for stored in [GOOD_CARD, digits.as_str()] {
        assert!(!row.everything.contains(stored), "{}", row.everything);
    }
}

/// A decline is recorded before its units are restored. When the restore
/// cannot take the product's lock right away, the customer is still told
/// the decline (not a 503 that would free the form's key), a resend of the
/// same form is a replay that charges nothing, and the units come back as
/// soon as the lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recorded_decline_is_answered_even_when_its_restore_must_wait() {
    let app = spawn_app_with(|s| s.lock_wait = Duration::from_millis(300)).await;
    let product = app.product(5, None).await;
    let buyer = app.customer("declined-busy@example.com").await;
    let order = order_id_from(&buyer.buy(product, 2).await);
    assert_eq!(app.db.stock(product), 3);
    // The tries before the last keep the units, and take no lock.
    let tries = flashsale::services::payment::CARD_TRIES;
    for _ in 1..tries {
        buyer.pay(order, DECLINED_CARD).await;
    }
    assert_eq!(app.db.stock(product), 3);

    let elsewhere = app.other_instance(Duration::from_secs(3), Duration::from_secs(10));
    let held = elsewhere
        .acquire(vec![flashsale::domain::ProductId(product)])
        .await
        .unwrap();
    let token = buyer.csrf().await;
    let path = format!("/orders/{order}/pay");
    let fields = [
        ("card_number", DECLINED_CARD),
        ("csrf_token", token.as_str()),
        ("idempotency_key", "declined-while-busy"),
    ];
    let pay = || buyer.post(&path, &fields);
    let first = pay().await;
    assert_eq!(first.status(), StatusCode::SEE_OTHER);
    let resent = pay().await;
    assert_eq!(resent.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        resent
            .headers()
            .get("Idempotent-Replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );
    assert_eq!(app.db.count("SELECT count(*) AS n FROM payments"), tries);
    assert_eq!(app.db.stock(product), 3, "restore waits for the lock");

    // Another card for the declined order while its restore waits: a charge
    // approved now would pay for units the restore is about to put back.
    let other_card = buyer
        .post(
            &path,
            &[
                ("card_number", GOOD_CARD),
                ("csrf_token", token.as_str()),
                ("idempotency_key", "after-the-decline"),
            ],
        )
        .await;
    expect_page(other_card, StatusCode::CONFLICT, "were declined 3 times").await;
    assert_eq!(app.db.count("SELECT count(*) AS n FROM payments"), tries);
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM sandbox_charges WHERE approved"),
        0
    );

    held.release().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while app.db.stock(product) != 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "the units never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM orders WHERE id = {order} AND status = 'payment_failed'"
        )),
        1
    );
    assert_eq!(app.db.count("SELECT count(*) AS n FROM payments"), tries);
    app.db.assert_audit_clean();
}

/// A provider slower than the shop waits: the attempt was recorded and
/// committed before the call, so the shop answers "being confirmed" instead
/// of forgetting it, holds no transaction (nor the order's row lock) while
/// it waits, charges nothing again on a resend, and the settling job
/// records the provider's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_provider_leaves_a_pending_attempt_that_is_settled_once() {
    let app = spawn_app_with(|s| s.payment_provider_timeout = Duration::from_millis(300)).await;
    let product = app.product(5, None).await;
    let buyer = app.customer("slow-card@example.com").await;
    let order = order_id_from(&buyer.buy(product, 1).await);
    let token = buyer.csrf().await;
    let path = format!("/orders/{order}/pay");
    let fields = [
        ("card_number", SLOW_CARD),
        ("csrf_token", token.as_str()),
        ("idempotency_key", "slow-pay"),
    ];

    let paying = {
        let (buyer, path, fields) = (
            buyer.clone(),
            path.clone(),
            fields.map(|(k, v)| (k, v.to_string())),
        );
        tokio::spawn(async move {
            let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            buyer.post(&path, &fields).await
        })
    };
    // While the provider thinks, the order's row is not locked by the
    // payment: no transaction is open around the call.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM payments WHERE outcome = 'pending'"),
        1,
        "the attempt is committed before the provider is asked"
    );
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM (SELECT id FROM orders WHERE id = {order} FOR UPDATE NOWAIT) locked"
        )),
        1
    );
    let answered = paying.await.unwrap();
    assert_eq!(answered.status(), StatusCode::SEE_OTHER);
    let (_, page) = buyer.get_text(&format!("/orders/{order}")).await;
    assert!(page.contains("being confirmed"), "{page}");

    // The same form again: a replay, not a second charge.
    let resent = buyer.post(&path, &fields).await;
    assert_eq!(resent.status(), StatusCode::SEE_OTHER);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM payments"), 1);

    // The provider finishes; the job asks it and records the approval once.
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    assert_eq!(app.db.count("SELECT count(*) AS n FROM sandbox_charges"), 1);
    let report = flashsale::services::jobs::run_once(&app.shop)
        .await
        .unwrap();
    assert_eq!(report.settled_payments.paid, 1, "{report:?}");
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM orders WHERE id = {order} AND status = 'paid'"
        )),
        1
    );
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM payments WHERE outcome = 'approved'"),
        1
    );
    let again = flashsale::services::jobs::run_once(&app.shop)
        .await
        .unwrap();
    assert_eq!(again.settled_payments, Default::default());
    app.db.assert_audit_clean();
}

/// The provider charged but its answer never arrived: the order is neither
/// forgotten nor expired; the job looks the attempt up and records the
/// charge, so every charge has its payment row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_answer_is_looked_up_and_the_order_never_expires_under_it() {
    let app = spawn_app_with(|s| {
        s.payment_provider_timeout = Duration::from_millis(100);
        s.payment_timeout = Duration::from_secs(2);
    })
    .await;
    let product = app.product(5, None).await;
    let buyer = app.customer("lost-answer@example.com").await;
    let order = order_id_from(&buyer.buy(product, 1).await);
    let paid = buyer.pay(order, LOST_ANSWER_CARD).await;
    assert_eq!(paid.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM sandbox_charges WHERE approved"),
        1
    );
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM payments WHERE outcome = 'pending'"),
        1
    );

    // Past the payment deadline, with the charge still unanswered: the
    // expiry sweep must not hand the units of a charged order back.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    app.db.count("WITH u AS (UPDATE payments SET created_at = now() - interval '1 hour' WHERE 1 = 0 RETURNING 1) SELECT count(*) AS n FROM u");
    let report = flashsale::services::jobs::run_once(&app.shop)
        .await
        .unwrap();
    assert_eq!(report.settled_payments.paid, 1, "{report:?}");
    assert_eq!(report.expired, 0, "{report:?}");
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM orders WHERE id = {order} AND status = 'paid'"
        )),
        1
    );
    assert_eq!(app.db.stock(product), 4);
    app.db.assert_audit_clean();
}

/// An attempt the provider had not seen when the job settled it is voided
/// there first: its charge request, arriving late (a paused or slow
/// caller), charges nothing, so no card is charged for a payment the shop
/// recorded as declined. The order can still be paid.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_attempt_settled_as_never_charged_cannot_charge_later() {
    let app = spawn_app_with(|s| s.payment_provider_timeout = Duration::from_millis(100)).await;
    let product = app.product(5, None).await;
    let buyer = app.customer("late-charge@example.com").await;
    let order = order_id_from(&buyer.buy(product, 1).await);
    // As `pay` leaves it just before asking the provider, long enough ago
    // that the job settles it.
    app.db.count(&format!(
        "WITH i AS (INSERT INTO payments (order_id, outcome, amount_cents, card_last4, attempt_key, created_at) \
         SELECT id, 'pending', total_cents, '4242', 'late-attempt', now() - interval '1 hour' FROM orders WHERE id = {order} RETURNING 1) \
         SELECT count(*) AS n FROM i"
    ));
    let report = flashsale::services::jobs::run_once(&app.shop)
        .await
        .unwrap();
    assert_eq!(report.settled_payments.never_charged, 1, "{report:?}");

    let card = flashsale::domain::CardNumber::parse(GOOD_CARD).unwrap();
    let amount = flashsale::domain::Money::from_cents(100).unwrap();
    let late = app
        .shop
        .payment_provider
        .charge("late-attempt", &card, amount)
        .await
        .unwrap();
    assert!(
        late == flashsale::payment::Charge::Voided,
        "a voided attempt charged: {late:?}"
    );
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM sandbox_charges WHERE approved"),
        0
    );
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM payments WHERE outcome = 'voided'"),
        1
    );

    let paid = buyer.pay(order, GOOD_CARD).await;
    let status = paid.status();
    let page = paid.text().await.unwrap();
    assert_eq!(status, StatusCode::SEE_OTHER, "{page}");
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM orders WHERE id = {order} AND status = 'paid'"
        )),
        1
    );
    app.db.assert_audit_clean();
}

/// A purchase claimed before fingerprints were keyed (a plain SHA-256 of the
/// request) is still recognised: its resend is a replay to the same order,
/// not a "conflicting reuse" that would send the customer to buy again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_claimed_before_fingerprints_were_keyed_still_replays() {
    let app = spawn_app().await;
    let product = app.product(5, None).await;
    let buyer = app.customer("legacy-key@example.com").await;
    let token = buyer.csrf().await;
    let fields = [
        ("quantity", "1"),
        ("csrf_token", token.as_str()),
        ("idempotency_key", "from-before-the-upgrade"),
    ];
    let path = format!("/products/{product}/buy");
    let first = buyer.post(&path, &fields).await;
    assert_eq!(first.status(), StatusCode::SEE_OTHER);
    let order = order_id_from(&first);
    // As the previous version stored it.
    let plain = format!("POST {path}\nquantity=1");
    let rewritten = app.db.count(&format!(
        "WITH u AS (UPDATE idempotency_keys SET fingerprint = encode(sha256(convert_to('{}', 'UTF8')), 'hex') WHERE key = 'from-before-the-upgrade' RETURNING 1) SELECT count(*) AS n FROM u",
        plain.replace('\n', "' || chr(10) || '")
    ));
    assert_eq!(rewritten, 1);
    let resent = buyer.post(&path, &fields).await;
    assert_eq!(resent.status(), StatusCode::SEE_OTHER);
    assert_eq!(order_id_from(&resent), order);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 1);
    // A different request under that key is still a conflict.
    let other = buyer
        .post(
            &path,
            &[
                ("quantity", "2"),
                ("csrf_token", token.as_str()),
                ("idempotency_key", "from-before-the-upgrade"),
            ],
        )
        .await;
    assert_eq!(other.status(), StatusCode::CONFLICT);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 1);
}
