//! Metrics, probes, request ids and logs.
//!
//! The metrics registry and the log subscriber are process-wide: the tests
//! that read them run `alone_in_process`, so the counts asserted here are
//! exact under any runner.

use crate::helpers::*;
use reqwest::StatusCode;

async fn scrape(app: &TestApp) -> String {
    let response = app.browser().get("/metrics").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/plain; version=0.0.4"
    );
    response.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_count_each_purchase_outcome() {
    if !alone_in_process("observability::metrics_count_each_purchase_outcome") {
        return;
    }
    let app = spawn_app().await;
    let product = app.product(1, None).await;
    let first = app.customer("first@example.com").await;
    let second = app.customer("second@example.com").await;

    assert_eq!(first.buy(product, 1).await.status(), StatusCode::SEE_OTHER);
    expect_page(
        second.buy(product, 1).await,
        StatusCode::CONFLICT,
        "sold out",
    )
    .await;
    let token = second.csrf().await;
    let refused = second.buy_with_token(product, "lots", &token).await;
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);

    let metrics = scrape(&app).await;
    let outcome = |label: &str| {
        metric_sample(
            &metrics,
            &format!("flashsale_purchases_total{{outcome=\"{label}\"}}"),
        )
    };
    assert_eq!(outcome("purchased"), Some(1.0), "{metrics}");
    assert_eq!(outcome("sold_out"), Some(1.0), "{metrics}");
    assert_eq!(outcome("invalid"), Some(1.0), "{metrics}");
    assert_eq!(outcome("busy"), None, "never counted, so not exported");
    if app.settings.stock_gate {
        let decision = |label: &str| {
            metric_sample(
                &metrics,
                &format!("flashsale_gate_decisions_total{{decision=\"{label}\"}}"),
            )
        };
        assert_eq!(decision("admitted"), Some(1.0), "{metrics}");
        assert_eq!(decision("sold_out"), Some(1.0), "{metrics}");
    }
    // Every metric is described even before it has samples of its own.
    for name in [
        "flashsale_lock_hold_seconds",
        "flashsale_purchase_batch_size",
        "flashsale_gate_drift_units",
        "flashsale_reconcile_runs_total",
        "flashsale_lock_handover_seconds",
    ] {
        assert!(metrics.contains(&format!("# TYPE {name} ")), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconcile_drift_is_exported() {
    if !alone_in_process("observability::reconcile_drift_is_exported") {
        return;
    }
    let app = spawn_app().await;
    let Some(gate) = app.shop.gate.clone() else {
        return; // nothing to reconcile with the gate off
    };
    let product = app.product(5, None).await;
    // The gate believes in 2 more units than Postgres holds.
    gate.overwrite(flashsale::domain::ProductId(product), 7, None, &[])
        .await
        .unwrap();
    flashsale::services::stock_gate::reconcile_once(&app.shop)
        .await
        .unwrap();

    let metrics = scrape(&app).await;
    assert_eq!(
        metric_sample(&metrics, "flashsale_gate_drift_products"),
        Some(1.0)
    );
    assert_eq!(
        metric_sample(&metrics, "flashsale_gate_drift_units"),
        Some(2.0)
    );
    assert_eq!(
        metric_sample(&metrics, "flashsale_reconcile_runs_total"),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_endpoint_can_be_switched_off() {
    let app = spawn_app_with(|settings| settings.metrics = false).await;
    assert_eq!(
        app.browser().get("/metrics").await.status(),
        StatusCode::NOT_FOUND
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ready_when_postgres_and_redis_answer() {
    let app = spawn_app().await;
    assert_eq!(
        app.browser().get_text("/readyz").await,
        (StatusCode::OK, "ready".to_string())
    );
    assert_eq!(
        app.browser().get_text("/healthz").await,
        (StatusCode::OK, "alive".to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn not_ready_names_an_unreachable_redis() {
    let port = free_port();
    let app = spawn_app_with(|s| s.redis_urls = vec![format!("redis://127.0.0.1:{port}")]).await;
    let (status, body) = app.browser().get_text("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("redis lock quorum"), "{body}");
    assert!(!body.contains("postgres"), "{body}");
    if app.settings.stock_gate {
        assert!(body.contains("stock gate redis"), "{body}");
    }
    // Liveness asks nothing of Redis.
    assert_eq!(app.browser().get("/healthz").await.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn not_ready_names_an_unreachable_database() {
    let app = spawn_app().await;
    // The database goes away under the running shop.
    app.db.vanish();
    let started = std::time::Instant::now();
    let (status, body) = app.browser().get_text("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, "not ready: postgres unreachable");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "the probe is bounded by its own short timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_response_carries_a_request_id() {
    let app = spawn_app().await;
    let client = app.browser().client.clone();
    let get = |id: Option<&str>, path: &str| {
        let mut request = client.get(format!("{}{path}", app.address));
        if let Some(id) = id {
            request = request.header("X-Request-Id", id);
        }
        request.send()
    };
    let id_of = |response: &reqwest::Response| {
        response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_string()
    };

    let generated = get(None, "/").await.unwrap();
    let first = id_of(&generated);
    assert!(uuid::Uuid::parse_str(&first).is_ok(), "{first}");
    let second = id_of(&get(None, "/").await.unwrap());
    assert_ne!(first, second, "a fresh id per request");

    let echoed = get(Some("checkout-7f3a-0001"), "/no/such/page")
        .await
        .unwrap();
    assert_eq!(echoed.status(), StatusCode::NOT_FOUND);
    assert_eq!(id_of(&echoed), "checkout-7f3a-0001");

    for unsafe_id in ["two words", "quote\"brace}", &"a".repeat(65)] {
        let replaced = id_of(&get(Some(unsafe_id), "/").await.unwrap());
        assert!(
            uuid::Uuid::parse_str(&replaced).is_ok(),
            "{unsafe_id:?} -> {replaced}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn json_log_lines_carry_the_request_id_and_no_secrets() {
    if !alone_in_process("observability::json_log_lines_carry_the_request_id_and_no_secrets") {
        return;
    }
    use flashsale::config::LogFormat;
    use flashsale::logging::subscriber;
    let captured = CapturedLog::default();
    let writer = captured.clone();
    tracing::subscriber::set_global_default(subscriber(
        LogFormat::Json,
        tracing_subscriber::EnvFilter::new("debug,h2=info,hyper=info,reqwest=info"),
        move || writer.clone(),
    ))
    .expect("the only subscriber of this process");
    let app = spawn_app().await;
    let buyer = app.customer("logged@example.com").await;
    let response = buyer
        .client
        .get(format!("{}/cart", app.address))
        .header("X-Request-Id", "log-test-42")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // The request-finished line is written after the response leaves.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;

    let text = captured.text();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let of_request: Vec<_> = lines
        .iter()
        .filter(|line| line["span"]["request_id"] == "log-test-42")
        .collect();
    assert!(!of_request.is_empty(), "{text}");
    let finished = of_request
        .iter()
        .find(|line| line["fields"]["message"] == "request finished")
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(finished["fields"]["status"], 200);
    assert_eq!(finished["span"]["path"], "/cart");
    assert!(!text.contains(PASSWORD), "the sign-up password was logged");
    assert!(
        !text.contains("flashsale_session"),
        "a session cookie was logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operations_page_is_for_admins_and_shows_the_figures() {
    if !alone_in_process("observability::operations_page_is_for_admins_and_shows_the_figures") {
        return;
    }
    let app = spawn_app().await;
    let product = app.product(5, None).await;
    let buyer = app.customer("operations@example.com").await;
    assert_eq!(buyer.buy(product, 2).await.status(), StatusCode::SEE_OTHER);

    expect_sign_in(&app.browser().get("/admin/operations").await);
    expect_page(
        buyer.get("/admin/operations").await,
        StatusCode::FORBIDDEN,
        "administrators only",
    )
    .await;
    let admin = app.admin().await;
    let dashboard = expect_page(admin.get("/admin").await, StatusCode::OK, "Dashboard").await;
    assert!(dashboard.contains(r#"href="/admin/operations""#));
    let page = expect_page(
        admin.get("/admin/operations").await,
        StatusCode::OK,
        "Purchases by outcome",
    )
    .await;
    assert!(
        page.contains(r#"<tr><th scope="row">purchased</th><td>1</td></tr>"#),
        "{page}"
    );
    assert!(page.contains(r#"<tr><th scope="row">sold_out</th><td>0</td></tr>"#));
    if app.settings.stock_gate {
        assert!(page.contains(r#"<tr><th scope="row">admitted</th><td>1</td></tr>"#));
    }
    for section in [
        "Product locks",
        "Database transactions by kind",
        "Buyers per combined purchase transaction",
        "Last reconcile",
        "Background job passes",
        "Orders whose stock was restored",
    ] {
        assert!(page.contains(section), "{section}");
    }
}
