//! kill -9 of the real server binary in the middle of a burst of purchases,
//! payments and refunds; then a restart, the jobs, and the audit.

use std::time::{Duration, Instant};

use crate::helpers::*;
use reqwest::StatusCode;

fn status_summary(db: &TestDb) -> String {
    let count = |status: &str| {
        db.count(&format!(
            "SELECT count(*) AS n FROM orders WHERE status = '{status}'"
        ))
    };
    format!(
        "awaiting_payment={} paid={} payment_failed={} expired={} refunded={} history_rows={}",
        count("awaiting_payment"),
        count("paid"),
        count("payment_failed"),
        count("expired"),
        count("refunded"),
        db.count("SELECT count(*) AS n FROM stock_history")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_nine_mid_burst_then_restart_leaves_an_exact_ledger() {
    const STOCK: i64 = 300;
    let db = TestDb::new();
    let prefix = unique_prefix();
    let key = "cd".repeat(64);
    let binary = server_binary();
    // Short payment window and lease so recovery happens within the test.
    let env = [
        ("PAYMENT_TIMEOUT", "3"),
        ("LOCK_LEASE_MS", "3000"),
        ("DB_STATEMENT_TIMEOUT_MS", "1000"),
        ("JOBS_INTERVAL", "3600"),
    ];
    let mut first = start_server_process_from(&binary, &db.url, &prefix, &key, &env);
    let pool =
        flashsale::db::build_pool(&db.url, 2, Duration::from_secs(5), Duration::from_secs(3));
    let product = create_product(&pool, STOCK as i32, None).await;
    flashsale::services::accounts::ensure_admin(
        &pool,
        flashsale::domain::Email::parse("admin@example.com").unwrap(),
        flashsale::domain::Password::parse(PASSWORD).unwrap(),
    )
    .await
    .unwrap();
    let admin = Browser::sign_in(&first.address, "admin@example.com", PASSWORD).await;

    // Orders that the burst will pay, decline and refund.
    let customers = sign_up_customers(&first.address, 24, "crash").await;
    let mut open_orders = Vec::new();
    for buyer in &customers[..12] {
        open_orders.push((buyer.clone(), order_id_from(&buyer.buy(product, 1).await)));
    }
    let mut paid_orders = Vec::new();
    for (buyer, order) in open_orders.drain(6..) {
        assert_eq!(
            buyer.pay(order, GOOD_CARD).await.status(),
            StatusCode::SEE_OTHER
        );
        paid_orders.push(order);
    }

    // The burst: buyers, payers (good and declined cards) and refunds at once.
    let mut tasks = Vec::new();
    for buyer in customers[12..].iter().cloned() {
        tasks.push(tokio::spawn(async move {
            let Ok(page) = buyer.web.get("/login").await else {
                return;
            };
            let token = csrf_from(&page.text().await.unwrap_or_default());
            for _ in 0..40 {
                let sent = buyer.web.buy(product, "1", &token, None).await;
                if sent.is_err() {
                    break; // the server is gone
                }
            }
        }));
    }
    for (i, (buyer, order)) in open_orders.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30 * i as u64)).await;
            let card = if i % 2 == 0 { GOOD_CARD } else { DECLINED_CARD };
            let _ = buyer.web.get("/login").await;
            let Ok(page) = buyer.web.get(&format!("/orders/{order}")).await else {
                return;
            };
            let token = csrf_from(&page.text().await.unwrap_or_default());
            let form = [("card_number", card), ("csrf_token", token.as_str())];
            let _ = buyer.web.post(&format!("/orders/{order}/pay"), &form).await;
        }));
    }
    for (i, order) in paid_orders.into_iter().enumerate() {
        let admin = admin.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(40 * i as u64)).await;
            let Ok(page) = admin.web.get(&format!("/admin/orders/{order}")).await else {
                return;
            };
            let token = csrf_from(&page.text().await.unwrap_or_default());
            let form = [("csrf_token", token.as_str())];
            let _ = admin
                .web
                .post(&format!("/admin/orders/{order}/refund"), &form)
                .await;
        }));
    }

    // Let the burst get going, then kill -9 the server mid-flight.
    let started = Instant::now();
    while db.count("SELECT count(*) AS n FROM orders") < 40
        && started.elapsed() < Duration::from_secs(20)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.guard.kill();
    for task in tasks {
        let _ = task.await;
    }
    let at_crash = status_summary(&db);
    eprintln!("after kill -9: {at_crash}, stock {}", db.stock(product));
    // Every commit point leaves the ledger whole: nothing is half-written.
    db.assert_audit_clean();
    assert!(db.count("SELECT count(*) AS n FROM orders") >= 40);

    // Restart: the dead process's locks lapse by lease; the jobs expire what was never paid.
    let restart_env = [
        ("PAYMENT_TIMEOUT", "3"),
        ("LOCK_LEASE_MS", "3000"),
        ("DB_STATEMENT_TIMEOUT_MS", "1000"),
        ("JOBS_INTERVAL", "1"),
    ];
    let second = start_server_process_from(&binary, &db.url, &prefix, &key, &restart_env);
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.count("SELECT count(*) AS n FROM orders WHERE status = 'awaiting_payment'") > 0 {
        assert!(
            Instant::now() < deadline,
            "unpaid orders were not expired: {}",
            status_summary(&db)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = status_summary(&db);
    eprintln!(
        "after restart and jobs: {after}, stock {}",
        db.stock(product)
    );
    db.assert_audit_clean();
    let paid_units = db.count(
        "SELECT COALESCE(sum(i.quantity), 0)::int8 AS n FROM order_items i JOIN orders o ON o.id = i.order_id WHERE o.status = 'paid'",
    );
    assert_eq!(
        db.stock(product),
        STOCK - paid_units,
        "only paid units are gone; everything else came back"
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM stock_history WHERE reason IN ('payment_failed', 'expired', 'refund')"),
        db.count("SELECT count(*) AS n FROM orders WHERE status IN ('payment_failed', 'expired', 'refunded')"),
        "every restored order was restored exactly once"
    );

    // The restarted shop sells again.
    let buyer = Browser::sign_in(&second.address, "crash0@example.com", PASSWORD).await;
    assert_eq!(buyer.buy(product, 1).await.status(), StatusCode::SEE_OTHER);
    db.assert_audit_clean();
}

/// A buyer admitted by the gate whose server dies before writing the order
/// never gives their allowance back. Reconcile must hand it back, from what
/// Postgres says they hold, or a limit-1 customer is refused for a day.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_nine_between_admission_and_insert_leaves_no_customer_locked_out() {
    let db = TestDb::new();
    let prefix = unique_prefix();
    let key = "ef".repeat(64);
    let binary = server_binary();
    let env = [
        ("STOCK_GATE", "on"),
        ("LOCK_WAIT_MS", "5000"),
        ("JOBS_INTERVAL", "3600"),
        ("RECONCILE_INTERVAL", "3600"),
    ];
    let mut first = start_server_process_from(&binary, &db.url, &prefix, &key, &env);
    let pool =
        flashsale::db::build_pool(&db.url, 2, Duration::from_secs(5), Duration::from_secs(3));
    let product = create_product(&pool, 5, Some(1)).await;
    let alice = sign_up_customers(&first.address, 1, "lockout")
        .await
        .remove(0);
    // Confirmed, as from her link: the product has a limit (per person).
    db.count(&format!(
        "WITH u AS (UPDATE customers SET email_confirmed_at = now() WHERE email = '{}' \
         RETURNING 1) SELECT count(*) AS n FROM u",
        alice.email
    ));

    // This test's own view of the shop (same database, same Redis prefix):
    // it holds the product's lock, so the server admits alice at the gate
    // and then waits for the lock, with her admission in Redis only.
    let mut settings = flashsale::config::Settings::for_tests(&db.url, &prefix);
    settings.stock_gate = true;
    settings.gate_pending_ttl = Some(Duration::from_millis(200));
    let observer = flashsale::services::Shop::new(settings).await.unwrap();
    let gate = observer.gate.clone().unwrap();
    let pid = flashsale::domain::ProductId(product);
    flashsale::services::stock_gate::seed_if_absent(&observer, vec![pid])
        .await
        .unwrap();
    let held = observer.locks.acquire(vec![pid]).await.unwrap();
    let buying = {
        let alice = alice.clone();
        tokio::spawn(async move { alice.buy(product, 1).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while gate.stock(pid).await.unwrap() != Some(4) {
        assert!(Instant::now() < deadline, "the gate never admitted alice");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.guard.kill();
    held.release().await;
    let _ = buying.await;
    assert_eq!(db.count("SELECT count(*) AS n FROM orders"), 0);
    assert_eq!(db.stock(product), 5);

    // Restarted, and reconciled once her admission is past the longest a
    // live one can take.
    let second = start_server_process_from(&binary, &db.url, &prefix, &key, &env);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = flashsale::services::stock_gate::reconcile_once(&observer)
        .await
        .unwrap();
    assert_eq!(report.failed, 0);
    assert_eq!(gate.stock(pid).await.unwrap(), Some(5));

    let alice = Browser::sign_in(&second.address, "lockout0@example.com", PASSWORD).await;
    let bought = alice.buy(product, 1).await;
    assert_eq!(
        bought.status(),
        StatusCode::SEE_OTHER,
        "alice was locked out"
    );
    assert_eq!(db.count("SELECT count(*) AS n FROM orders"), 1);
    assert_eq!(db.stock(product), 4);
    // Her limit holds again: the second unit is refused.
    let again = alice.buy(product, 1).await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
    assert!(again
        .text()
        .await
        .unwrap()
        .contains("Purchase limit reached"));
    db.assert_audit_clean();
}

/// `flashsale audit` is what QA scripts run after a race: it must exit with
/// the audit's verdict, every time. It used to exit while the pool still
/// warmed a connection in the background, and crashed in OpenSSL's exit
/// handlers about one run in ten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_commands_exit_cleanly_every_time() {
    let db = TestDb::new();
    let binary = server_binary();
    for run in 0..40 {
        let output = std::process::Command::new(&binary)
            .arg("audit")
            .env("DATABASE_URL", &db.url)
            .env("RUST_LOG", "error")
            .output()
            .expect("the flashsale binary runs");
        assert!(
            output.status.success(),
            "run {run}: {:?}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(String::from_utf8_lossy(&output.stdout).contains("audit clean"));
    }
}
