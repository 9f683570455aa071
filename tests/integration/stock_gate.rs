//! The Redis stock gate in front of Postgres: it turns sold-out and repeat
//! buyers away without the lock or the database, and never sells.

use std::sync::Arc;
use std::time::Duration;

use crate::helpers::*;
use flashsale::domain::{CustomerId, ProductId, Quantity, Refusal, SaleState};
use flashsale::gate::{Admission, AnswerRecord, Settled, StockGate};
use flashsale::redis_node::RedisNode;
use flashsale::services::stock_gate::reconcile_once;
use reqwest::StatusCode;
use tokio::sync::Barrier;

fn gate_on(settings: &mut flashsale::config::Settings) {
    settings.stock_gate = true;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admit_and_give_back_scripts_follow_their_rules() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let node = RedisNode::single(url.split(',').next().unwrap()).unwrap();
    let prefix = unique_prefix();
    let _keys = OwnRedisKeys::under(&prefix);
    scripts_follow_their_rules(StockGate::new(
        node,
        &prefix,
        Duration::from_secs(60),
        Duration::from_secs(60),
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_redis_cluster_the_gate_and_locks_behave_the_same() {
    let cluster = RedisCluster::start();
    let node = RedisNode::cluster(&cluster.urls).unwrap();
    scripts_follow_their_rules(StockGate::new(
        node,
        &unique_prefix(),
        Duration::from_secs(60),
        Duration::from_secs(60),
    ))
    .await;
    let urls = cluster.urls.clone();
    let on_cluster = move |s: &mut flashsale::config::Settings| {
        s.stock_gate = true;
        s.redis_cluster = true;
        s.redis_urls = urls.clone();
    };
    five_thousand_requests_fifty_units(spawn_app_with(on_cluster.clone()).await, "cluster").await;
    a_repeat_buyer_of_a_limit_one_product(spawn_app_with(on_cluster.clone()).await).await;
    let app = spawn_app_with(on_cluster).await;
    assert!(app.shop.locks.quorum_reachable().await);
    let (status, ready) = app.browser().get_text("/readyz").await;
    assert_eq!(status, StatusCode::OK, "{ready}");
}

async fn scripts_follow_their_rules(gate: StockGate) {
    let (product, alice, bob) = (ProductId(7), CustomerId(1), CustomerId(2));
    let one = Quantity::new(1).unwrap();
    let two = Quantity::new(2).unwrap();

    // Unknown means no, never unlimited.
    assert_eq!(
        gate.admit(product, alice, one, "k0", None).await.unwrap(),
        Admission::Unknown
    );
    assert!(gate.seed_if_absent(product, 3, Some(2)).await.unwrap());
    assert!(
        !gate.seed_if_absent(product, 99, Some(2)).await.unwrap(),
        "seeding never overwrites"
    );
    assert_eq!(gate.stock(product).await.unwrap(), Some(3));

    assert_eq!(
        gate.admit(product, alice, one, "k1", None).await.unwrap(),
        Admission::Admitted
    );
    // A repeat is recognised before stock is looked at, and takes nothing.
    assert_eq!(
        gate.admit(product, alice, one, "k1", None).await.unwrap(),
        Admission::Repeat
    );
    assert_eq!(
        gate.admit(product, alice, two, "k1", None).await.unwrap(),
        Admission::Conflict
    );
    assert_eq!(gate.stock(product).await.unwrap(), Some(2));
    // Alice holds 1 of her limit of 2.
    assert_eq!(
        gate.admit(product, alice, two, "k2", None).await.unwrap(),
        Admission::LimitReached { held: 1, limit: 2 }
    );
    assert_eq!(
        gate.admit(product, bob, two, "k3", None).await.unwrap(),
        Admission::Admitted
    );
    assert_eq!(
        gate.admit(product, alice, one, "k4", None).await.unwrap(),
        Admission::SoldOut { available: 0 }
    );

    // Giving back is idempotent and frees the allowance.
    assert_eq!(gate.give_back(product, "k3").await.unwrap(), 2);
    assert_eq!(gate.give_back(product, "k3").await.unwrap(), 0);
    assert_eq!(gate.give_back(product, "never-admitted").await.unwrap(), 0);
    assert_eq!(gate.stock(product).await.unwrap(), Some(2));
    assert_eq!(
        gate.admit(product, bob, two, "k5", None).await.unwrap(),
        Admission::Admitted
    );
    assert_eq!(gate.stock(product).await.unwrap(), Some(0));

    // A resync while admissions are on their way to Postgres (k1 and k5, 3
    // units; Postgres still holds all 3) leaves their units taken.
    let resynced = gate.overwrite(product, 3, Some(2), &[]).await.unwrap();
    assert_eq!(
        (resynced.before, resynced.after, resynced.pending),
        (Some(0), 0, 3)
    );
    // Pending admissions count as their customers' holdings: nothing to correct.
    assert_eq!(resynced.customers_corrected, 0);
    // k1's order is written (Postgres now holds 2, alice's order 1) and
    // settled: still 0 free, and alice still holds 1 of her 2.
    let settled = Settled {
        admission: "k1",
        customer: alice,
        quantity: one,
    };
    gate.settle(product, &[settled]).await.unwrap();
    let resynced = gate
        .overwrite(product, 2, Some(2), &[(alice, 1)])
        .await
        .unwrap();
    assert_eq!((resynced.after, resynced.pending), (0, 2));
    assert_eq!(resynced.customers_corrected, 0);
    // Stock is checked before the limit, as Postgres checks them: with
    // nothing free, alice is told it is sold out, not that she is at her limit.
    assert_eq!(
        gate.admit(product, alice, two, "k6", None).await.unwrap(),
        Admission::SoldOut { available: 0 }
    );
    // k5 is given back: its 2 units are free, and nothing is pending.
    assert_eq!(gate.give_back(product, "k5").await.unwrap(), 2);
    let resynced = gate
        .overwrite(product, 2, Some(2), &[(alice, 1)])
        .await
        .unwrap();
    assert_eq!(
        (resynced.before, resynced.after, resynced.pending),
        (Some(2), 2, 0)
    );
    assert_eq!(resynced.customers_corrected, 0);
    // With units free, the limit speaks: alice still holds 1 of her 2.
    assert_eq!(
        gate.admit(product, alice, two, "k6b", None).await.unwrap(),
        Admission::LimitReached { held: 1, limit: 2 }
    );
    // While bob's admission may still be on its way, a resync keeps both
    // its units and his allowance taken.
    assert_eq!(
        gate.admit(product, bob, two, "k7", None).await.unwrap(),
        Admission::Admitted
    );
    // (Postgres holds 3 now, say, so a unit is free and the limit is what
    // refuses bob.)
    let resynced = gate
        .overwrite(product, 3, Some(2), &[(alice, 1)])
        .await
        .unwrap();
    assert_eq!((resynced.after, resynced.pending), (1, 2));
    assert_eq!(
        gate.admit(product, bob, one, "k8", None).await.unwrap(),
        Admission::LimitReached { held: 2, limit: 2 }
    );
    // Holdings the gate never saw (orders written while Redis had lost its
    // data) are learned from Postgres.
    let carol = CustomerId(3);
    let resynced = gate
        .overwrite(product, 3, Some(2), &[(alice, 1), (carol, 2)])
        .await
        .unwrap();
    assert_eq!(resynced.customers_corrected, 1);
    assert_eq!(
        gate.admit(product, carol, one, "k9", None).await.unwrap(),
        Admission::LimitReached { held: 2, limit: 2 }
    );

    // A give-back that overtakes its own admission (the admission's reply
    // timed out, the give-back went out on a fresh connection) leaves a
    // tombstone: the late admission is refused and takes nothing.
    let stock_before = gate.stock(product).await.unwrap();
    assert_eq!(gate.give_back(product, "k10").await.unwrap(), 0);
    assert_eq!(
        gate.admit(product, CustomerId(4), one, "k10", None)
            .await
            .unwrap(),
        Admission::Conflict
    );
    assert_eq!(gate.stock(product).await.unwrap(), stock_before);

    answer_records_follow_their_rules(&gate).await;
}

/// Buyers gathered into one ADMIT call are each answered as if they had been
/// sent alone: a customer's second unit counts the first, a refusal after
/// others took units records the stock they left, and the same admission
/// sent twice is a repeat that takes nothing.
#[tokio::test(flavor = "current_thread")]
async fn buyers_gathered_into_one_admit_call_are_answered_as_if_alone() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let node = RedisNode::single(url.split(',').next().unwrap()).unwrap();
    let minute = Duration::from_secs(60);
    let prefix = unique_prefix();
    let _keys = OwnRedisKeys::under(&prefix);
    let gate = StockGate::new(node, &prefix, minute, minute);
    let (product, alice, bob) = (ProductId(11), CustomerId(1), CustomerId(2));
    let (one, two) = (Quantity::new(1).unwrap(), Quantity::new(2).unwrap());
    assert!(gate.seed_if_absent(product, 3, Some(2)).await.unwrap());
    let bobs_click = AnswerRecord {
        key: "bobs-click",
        fingerprint: "h1:b2",
        refusal_retention: minute,
    };
    // One thread: the first call goes alone while the others queue behind
    // it, and they all go in the driver's first batch.
    let answers = tokio::join!(
        gate.admit(product, alice, one, "a1", None),
        gate.admit(product, alice, one, "a2", None),
        gate.admit(product, alice, one, "a3", None),
        gate.admit(product, bob, two, "b1", Some(&bobs_click)),
        gate.admit(product, bob, one, "b2", None),
        gate.admit(product, bob, one, "b2", None),
    );
    let (calls, script_calls) = redis_batches(&flashsale::metrics::render(), "admit");
    assert!(
        calls >= 6.0 && script_calls < calls,
        "{calls} admissions went in {script_calls} script calls"
    );
    assert_eq!(answers.0.unwrap(), Admission::Admitted);
    assert_eq!(answers.1.unwrap(), Admission::Admitted);
    assert_eq!(
        answers.2.unwrap(),
        Admission::LimitReached { held: 2, limit: 2 },
        "alice's third unit counts the two this batch gave her"
    );
    assert_eq!(
        answers.3.unwrap(),
        Admission::SoldOut { available: 1 },
        "bob's two units meet the one the batch left"
    );
    assert_eq!(answers.4.unwrap(), Admission::Admitted);
    assert_eq!(answers.5.unwrap(), Admission::Repeat);
    assert_eq!(gate.stock(product).await.unwrap(), Some(0));
    // Bob's click sent again (another admission, the same request) gets the
    // refusal with the stock it was refused at.
    assert_eq!(
        gate.admit(product, bob, two, "b3", Some(&bobs_click))
            .await
            .unwrap(),
        Admission::RefusedBefore(Refusal::SoldOut {
            product: None,
            available: 1
        })
    );
}

/// A request's answer record lives in its product's slot, beside the stock,
/// so this holds on a cluster too.
async fn answer_records_follow_their_rules(gate: &StockGate) {
    let (product, alice, bob) = (ProductId(8), CustomerId(1), CustomerId(2));
    let one = Quantity::new(1).unwrap();
    let minute = Duration::from_secs(60);
    let click = AnswerRecord {
        key: "click",
        fingerprint: "h1:aa",
        refusal_retention: minute,
    };
    assert!(gate.seed_if_absent(product, 1, None).await.unwrap());
    assert_eq!(
        gate.admit(product, alice, one, "a1", Some(&click))
            .await
            .unwrap(),
        Admission::Admitted
    );
    assert_eq!(
        gate.admit(product, alice, one, "a1", Some(&click))
            .await
            .unwrap(),
        Admission::Repeat,
        "the same admission sent again (its reply was lost) is a repeat"
    );
    match gate
        .admit(product, alice, one, "a2", Some(&click))
        .await
        .unwrap()
    {
        Admission::AdmittedBefore { admission, age } => {
            assert_eq!(admission, "a1", "the repeat learns the first admission");
            assert!(age < minute);
        }
        other => panic!("a repeat of an admitted key got {other:?}"),
    }
    let other_request = AnswerRecord {
        fingerprint: "h1:bb",
        ..click
    };
    assert_eq!(
        gate.admit(product, alice, one, "a3", Some(&other_request))
            .await
            .unwrap(),
        Admission::KeyReused
    );
    assert_eq!(
        gate.stock(product).await.unwrap(),
        Some(0),
        "repeats took nothing"
    );

    // Refused in Postgres after admission: the record becomes that refusal,
    // but only the admission it names can change it.
    let not_open = Refusal::SaleNotOpen {
        product: "Thing".into(),
        state: SaleState::Upcoming,
    };
    assert!(!gate
        .record_refusal(product, alice, &click, "a2", &not_open)
        .await
        .unwrap());
    assert!(gate
        .record_refusal(product, alice, &click, "a1", &not_open)
        .await
        .unwrap());
    assert_eq!(gate.give_back(product, "a1").await.unwrap(), 1);
    assert_eq!(
        gate.admit(product, alice, one, "a4", Some(&click))
            .await
            .unwrap(),
        Admission::RefusedBefore(not_open)
    );
    assert!(
        !gate
            .forget_admission(product, alice, "click", "a1")
            .await
            .unwrap(),
        "a refusal is an answer, not an admission to forget"
    );

    // The same key of another customer is another request; a refusal the
    // gate decides is recorded in the same step.
    assert_eq!(
        gate.admit(product, bob, Quantity::new(2).unwrap(), "b1", Some(&click))
            .await
            .unwrap(),
        Admission::SoldOut { available: 1 }
    );
    assert_eq!(
        gate.admit(product, bob, Quantity::new(2).unwrap(), "b2", Some(&click))
            .await
            .unwrap(),
        Admission::RefusedBefore(Refusal::SoldOut {
            product: None,
            available: 1
        })
    );

    // An admission that changed nothing is forgotten: the key runs again.
    let retry = AnswerRecord {
        key: "retry",
        ..click
    };
    assert_eq!(
        gate.admit(product, bob, one, "c1", Some(&retry))
            .await
            .unwrap(),
        Admission::Admitted
    );
    assert!(gate
        .forget_admission(product, bob, "retry", "c1")
        .await
        .unwrap());
    assert_eq!(gate.give_back(product, "c1").await.unwrap(), 1);
    assert_eq!(
        gate.admit(product, bob, one, "c2", Some(&retry))
            .await
            .unwrap(),
        Admission::Admitted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_thousand_requests_fifty_units_mostly_answered_by_redis() {
    five_thousand_requests_fifty_units(spawn_app_with(gate_on).await, "single Redis").await;
}

async fn five_thousand_requests_fifty_units(app: TestApp, redis: &str) {
    const WORKERS: usize = 32;
    const REQUESTS: usize = 5_000;
    let product = app.product(50, None).await;
    // As the admin's "new sale" does; a sale created elsewhere is seeded by its first buyer.
    flashsale::services::stock_gate::seed_if_absent(&app.shop, vec![ProductId(product)])
        .await
        .unwrap();
    let buyers = app.customers(WORKERS, "gate").await;
    let attempts_before = app.shop.locks.attempts();
    let statuses = burst(buyers, product, REQUESTS).await;
    let counts = tally(&statuses);
    let locked = app.shop.locks.attempts() - attempts_before;
    let without_postgres = REQUESTS as u64 - locked;
    eprintln!("5000 vs 50 with the gate on {redis}: {counts:?}; {locked} requests reached the lock, {without_postgres} answered by Redis alone");
    assert_eq!(counts.get(&303), Some(&50), "{counts:?}");
    assert_eq!(counts.get(&409), Some(&4_950), "{counts:?}");
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 50);
    assert_eq!(app.db.stock(product), 0);
    assert!(
        without_postgres >= 4_950,
        "only {without_postgres} of 5000 answered without the lock"
    );
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repeat_buyer_gets_one_unit_of_a_limit_one_product() {
    a_repeat_buyer_of_a_limit_one_product(spawn_app_with(gate_on).await).await;
}

async fn a_repeat_buyer_of_a_limit_one_product(app: TestApp) {
    let product = app.product(20, Some(1)).await;
    let buyer = app.customer("eager@example.com").await;
    let token = buyer.csrf().await;
    let barrier = Arc::new(Barrier::new(10));
    let clicks = (0..10).map(|_| {
        let (buyer, token, barrier) = (buyer.clone(), token.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            let response = buyer.buy_with_token(product, "1", &token).await;
            let status = response.status();
            (status, response.text().await.unwrap())
        })
    });
    let answers: Vec<(StatusCode, String)> = futures::future::join_all(clicks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(
        answers
            .iter()
            .filter(|(s, _)| *s == StatusCode::SEE_OTHER)
            .count(),
        1
    );
    let limited = answers
        .iter()
        .filter(|(s, page)| *s == StatusCode::CONFLICT && page.contains("Purchase limit reached"))
        .count();
    assert_eq!(limited, 9);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 1);
    assert_eq!(app.db.stock(product), 19);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restores_hand_units_back_to_the_gate_once() {
    let app = spawn_app_with(gate_on).await;
    let product = app.product(3, None).await;
    let gate = app.shop.gate.clone().unwrap();
    let buyer = app.customer("restore-gate@example.com").await;
    let declined = order_id_from(&buyer.buy(product, 1).await);
    let refunded = order_id_from(&buyer.buy(product, 1).await);
    assert_eq!(gate.stock(ProductId(product)).await.unwrap(), Some(1));
    assert_eq!(
        buyer.decline_to_the_end(declined).await.status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        buyer.pay(refunded, GOOD_CARD).await.status(),
        StatusCode::SEE_OTHER
    );
    let admin = app.admin().await;
    assert_eq!(
        admin
            .post_form(&format!("/admin/orders/{refunded}/refund"), &[])
            .await
            .status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        admin
            .post_form(&format!("/admin/orders/{refunded}/refund"), &[])
            .await
            .status(),
        StatusCode::CONFLICT
    );
    assert_eq!(
        gate.stock(ProductId(product)).await.unwrap(),
        Some(3),
        "gate agrees with the database"
    );
    assert_eq!(app.db.stock(product), 3);
    // An admin adjustment moves the gate with the database.
    let adjust = admin
        .post_form(
            &format!("/admin/products/{product}/stock"),
            &[("delta", "+4"), ("reason", "late delivery")],
        )
        .await;
    assert_eq!(adjust.status(), StatusCode::SEE_OTHER);
    assert_eq!(gate.stock(ProductId(product)).await.unwrap(), Some(7));
    app.db.assert_audit_clean();
}

/// Reconcile runs while buyers the gate admitted are still on their way to
/// Postgres: it counts them as pending instead of handing their units out
/// again, so the gate does not open wider than the stock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconcile_mid_burst_leaves_admitted_buyers_units_taken() {
    let app = spawn_app_with(gate_on).await;
    let product = app.product(5, None).await;
    let gate = app.shop.gate.clone().unwrap();
    let buyers = app.customers(3, "in-flight").await;
    let mut tokens = Vec::new();
    for buyer in &buyers {
        tokens.push(buyer.csrf().await);
    }
    flashsale::services::stock_gate::seed_if_absent(&app.shop, vec![ProductId(product)])
        .await
        .unwrap();
    // Another instance holds the product: reconcile queues for it first,
    // then three buyers are admitted by the gate and queue behind it.
    let elsewhere = app.other_instance(Duration::from_secs(3), Duration::from_secs(10));
    let held = elsewhere.acquire(vec![ProductId(product)]).await.unwrap();
    let shop = app.shop.clone();
    let reconcile = tokio::spawn(async move { reconcile_once(&shop).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut buying = Vec::new();
    for (buyer, token) in buyers.into_iter().zip(tokens) {
        buying.push(tokio::spawn(async move {
            checked_status(buyer.buy_with_token(product, "1", &token).await)
        }));
    }
    let admitted_deadline = std::time::Instant::now() + Duration::from_secs(3);
    while gate.stock(ProductId(product)).await.unwrap() != Some(2) {
        assert!(
            std::time::Instant::now() < admitted_deadline,
            "the gate never admitted all three"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await;

    let report = reconcile.await.unwrap().unwrap();
    assert!(
        report.drifts.is_empty(),
        "no drift while buyers are pending: {report:?}"
    );
    for purchase in buying {
        assert_eq!(purchase.await.unwrap(), StatusCode::SEE_OTHER);
    }
    assert_eq!(app.db.stock(product), 2);
    assert_eq!(gate.stock(ProductId(product)).await.unwrap(), Some(2));
    assert!(reconcile_once(&app.shop).await.unwrap().drifts.is_empty());
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failure_after_admission_gives_the_units_back() {
    let app = spawn_app_with(|s| {
        s.stock_gate = true;
        s.inject_fault_after_admission = true;
        s.gate_pending_ttl = Some(Duration::from_millis(500));
    })
    .await;
    let product = app.product(5, None).await;
    let gate = app.shop.gate.clone().unwrap();
    let buyer = app.customer("fault@example.com").await;
    let response = buyer.buy(product, 2).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        gate.stock(ProductId(product)).await.unwrap(),
        Some(5),
        "the admitted units came back"
    );
    assert_eq!(app.db.ledger_rows(), 0);

    // When the give-back itself is lost (Redis unreachable at that moment, or
    // the process died), the gate stays short until the reconcile job runs.
    let lost = gate
        .admit(
            ProductId(product),
            CustomerId(999),
            Quantity::new(2).unwrap(),
            "lost-admission",
            None,
        )
        .await
        .unwrap();
    assert_eq!(lost, Admission::Admitted);
    assert_eq!(gate.stock(ProductId(product)).await.unwrap(), Some(3));
    // While it could still be a buyer on their way to Postgres, reconcile
    // leaves it pending: no drift, the units stay taken.
    let report = reconcile_once(&app.shop).await.unwrap();
    assert!(report.drifts.is_empty(), "{report:?}");
    assert_eq!(gate.stock(ProductId(product)).await.unwrap(), Some(3));
    // Older than any live admission can be: its buyer is gone, the units come back.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let report = reconcile_once(&app.shop).await.unwrap();
    assert_eq!(report.drifts.len(), 1, "{report:?}");
    assert_eq!(
        (
            report.drifts[0].gate,
            report.drifts[0].database,
            report.drifts[0].pending
        ),
        (Some(3), 5, 0)
    );
    assert_eq!(gate.stock(ProductId(product)).await.unwrap(), Some(5));
    assert!(reconcile_once(&app.shop).await.unwrap().drifts.is_empty());
    let admin = app.admin().await;
    let (_, dashboard) = admin.get_text("/admin").await;
    assert!(
        dashboard.contains("Last reconcile") && dashboard.contains("no drift"),
        "{dashboard}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_keeps_what_the_gate_has_sold() {
    let db = TestDb::new();
    let prefix = unique_prefix();
    let mut settings = flashsale::config::Settings::for_tests(&db.url, &prefix);
    settings.stock_gate = true;
    let first = flashsale::startup::Application::build(settings.clone())
        .await
        .unwrap();
    let address = format!("http://127.0.0.1:{}", first.port());
    let shop = first.shop().clone();
    let handle = first.handle();
    tokio::spawn(first.run_until_stopped());
    let product = create_product(&shop.pool, 10, None).await;
    let buyer = Browser::sign_up(&address, "restart@example.com").await;
    for _ in 0..3 {
        assert_eq!(buyer.buy(product, 1).await.status(), StatusCode::SEE_OTHER);
    }
    // A buyer admitted but not yet written when the server stops.
    let gate = shop.gate.clone().unwrap();
    gate.admit(
        ProductId(product),
        CustomerId(1),
        Quantity::new(1).unwrap(),
        "in-flight",
        None,
    )
    .await
    .unwrap();
    assert_eq!(gate.stock(ProductId(product)).await.unwrap(), Some(6));
    handle.stop(true).await;

    let second = flashsale::startup::Application::build(settings)
        .await
        .unwrap();
    let address = format!("http://127.0.0.1:{}", second.port());
    let handle = second.handle();
    // Seeding on boot did not reset the gate to the database's 7 (nor to 10).
    let gate = second.shop().gate.clone().unwrap();
    assert_eq!(gate.stock(ProductId(product)).await.unwrap(), Some(6));
    tokio::spawn(second.run_until_stopped());
    let buyer = Browser::sign_in(&address, "restart@example.com", PASSWORD).await;
    assert_eq!(buyer.buy(product, 1).await.status(), StatusCode::SEE_OTHER);
    assert_eq!(db.stock(product), 6);
    db.assert_audit_clean();
    handle.stop(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gate_off_runs_the_plain_locked_path() {
    let app = spawn_app_with(|s| s.stock_gate = false).await;
    assert!(app.shop.gate.is_none());
    let product = app.product(2, None).await;
    let buyers = app.customers(4, "nogate").await;
    let mut statuses = Vec::new();
    for buyer in &buyers {
        statuses.push(buyer.buy(product, 1).await.status());
    }
    assert_eq!(tally(&statuses).get(&303), Some(&2));
    assert_eq!(app.db.stock(product), 0);
    let admin = app.admin().await;
    let (_, dashboard) = admin.get_text("/admin").await;
    assert!(dashboard.contains("STOCK_GATE=off"));
    app.db.assert_audit_clean();
}

/// A purchase whose caller goes away while it is queued for the lock (a
/// buyer hanging up cancels their request, and everything it awaits) still
/// ends on its own task: when it cannot be served, the units the gate
/// admitted for the buyer come back at once, not at the next reconcile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_buyer_who_hangs_up_while_queued_still_gives_the_units_back() {
    use flashsale::services::checkout::{purchase, Line};
    let app = spawn_app_with(|s| {
        s.stock_gate = true;
        s.lock_wait = Duration::from_millis(700);
    })
    .await;
    let product = app.product(5, None).await;
    let pid = ProductId(product);
    let gate = app.shop.gate.clone().unwrap();
    let buyer = app.customer("impatient@example.com").await;
    let customer = CustomerId(
        app.db
            .count("SELECT id AS n FROM customers WHERE email = 'impatient@example.com'"),
    );
    flashsale::services::stock_gate::seed_if_absent(&app.shop, vec![pid])
        .await
        .unwrap();

    // Another instance holds the lock past this buyer's wait.
    let elsewhere = app.other_instance(Duration::from_secs(3), Duration::from_secs(10));
    let held = elsewhere.acquire(vec![pid]).await.unwrap();
    let line = Line {
        product: pid,
        quantity: Quantity::new(2).unwrap(),
    };
    let cancelled = tokio::time::timeout(
        Duration::from_millis(250),
        purchase(&app.shop, customer, vec![line], None),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "the caller went away first: {cancelled:?}"
    );
    assert_eq!(gate.stock(pid).await.unwrap(), Some(3), "admitted, queued");

    // The wait runs out while the lock is still held elsewhere.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        gate.stock(pid).await.unwrap(),
        Some(5),
        "the cancelled buyer's units came back"
    );
    held.release().await;
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 0);
    assert_eq!(app.db.stock(product), 5);
    // And the buyer can still buy all they asked for.
    assert_eq!(buyer.buy(product, 2).await.status(), StatusCode::SEE_OTHER);
    app.db.assert_audit_clean();
}

/// Anyone can send any product id. Buying one that does not exist is a
/// clear 404 that takes no lock and leaves nothing behind in Redis: no
/// gate keys, no fencing counter, no lock queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buys_of_unknown_products_leave_nothing_behind() {
    let app = spawn_app_with(gate_on).await;
    let buyer = app.customer("nobody-sells-this@example.com").await;
    let token = buyer.csrf().await;
    let attempts_before = app.shop.locks.attempts();
    for i in 0..50 {
        let unknown = 900_000 + i;
        let refused = buyer.buy_with_token(unknown, "1", &token).await;
        expect_page(refused, StatusCode::NOT_FOUND, "no product").await;
    }
    assert_eq!(
        app.shop.locks.attempts(),
        attempts_before,
        "no product lock was queued for"
    );
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redis::Client::open(url.split(',').next().unwrap()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", app.shop.redis_prefix))
        .query_async(&mut redis)
        .await
        .unwrap();
    let left: Vec<&String> = keys.iter().filter(|k| k.contains("9000")).collect();
    assert!(left.is_empty(), "keys left behind: {left:?}");
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 0);
}

/// A cart admits its lines in product order; when a later line's product
/// cannot be seeded (its lock is held elsewhere), the lines admitted before
/// it go back to the gate, and nothing is bought.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cart_whose_later_product_cannot_be_seeded_hands_the_earlier_lines_back() {
    let app = spawn_app_with(|s| {
        s.stock_gate = true;
        s.lock_wait = Duration::from_millis(300);
    })
    .await;
    let (seeded, unseeded) = (app.product(5, None).await, app.product(5, None).await);
    let buyer = app.customer("half-seeded@example.com").await;
    order_id_from(&buyer.buy(seeded, 1).await);
    let gate = app.shop.gate.as_ref().unwrap();
    assert_eq!(gate.stock(ProductId(seeded)).await.unwrap(), Some(4));
    assert_eq!(gate.stock(ProductId(unseeded)).await.unwrap(), None);
    for product in [seeded, unseeded] {
        let added = buyer
            .post_form(
                "/cart/add",
                &[("product_id", &product.to_string()), ("quantity", "1")],
            )
            .await;
        assert_eq!(added.status(), StatusCode::SEE_OTHER);
    }

    let other = app.other_instance(Duration::from_secs(5), Duration::from_secs(10));
    let held = other.acquire(vec![ProductId(unseeded)]).await.unwrap();
    let checkout = buyer
        .post_form("/cart/checkout", &[("idempotency_key", "half-seeded")])
        .await;
    expect_page(checkout, StatusCode::SERVICE_UNAVAILABLE, "Too many buyers").await;
    assert_eq!(
        gate.stock(ProductId(seeded)).await.unwrap(),
        Some(4),
        "the first line's unit came back"
    );
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 1);
    held.release().await;

    let checkout = buyer
        .post_form("/cart/checkout", &[("idempotency_key", "half-seeded")])
        .await;
    assert_eq!(checkout.status(), StatusCode::SEE_OTHER, "the resend buys");
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 2);
    assert_eq!(gate.stock(ProductId(seeded)).await.unwrap(), Some(3));
    assert_eq!(gate.stock(ProductId(unseeded)).await.unwrap(), Some(4));
    app.db.assert_audit_clean();
}
