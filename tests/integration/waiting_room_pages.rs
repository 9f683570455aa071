//! The waiting room as customers meet it, through the real HTTP server:
//! joining through the form, `queue.json`, the waiting page before and after
//! the start, buying with a pass (and every way of trying without one), and
//! the published draw checked by `flashsale draw verify`.

use std::time::{Duration as StdDuration, Instant};

use crate::helpers::*;
use chrono::{Duration, Utc};
use diesel::RunQueryDsl;
use flashsale::domain::Money;
use flashsale::services::catalog::{create_product, SaleSpec};
use reqwest::StatusCode;
use serde_json::Value;

/// A sale in queue mode of `stock` units, limit `limit`, starting in
/// `starts_in`; its waiting room opens `opens_before` the start (None: the
/// default 15 minutes).
pub async fn queue_sale(
    app: &TestApp,
    stock: i32,
    limit: i32,
    starts_in: Duration,
    opens_before: Option<Duration>,
) -> i64 {
    let starts_at = Utc::now() + starts_in;
    let id = create_product(
        &app.shop.pool,
        SaleSpec {
            name: "Queued qilin".into(),
            description: "Sold through the waiting room.".into(),
            price: Money::from_cents(2_500).unwrap(),
            stock,
            per_customer_limit: Some(limit),
            starts_at,
            ends_at: None,
            queue_mode: true,
            queue_opens_at: opens_before.map(|before| starts_at - before),
            join_check_work: 1,
        },
    )
    .await
    .unwrap()
    .id;
    // Once its opening has passed, the room opens (its seed committed)
    // within a tick: wait for that, as a customer arriving then would meet
    // it. (The first join may also open it: see
    // `the_first_joiner_sees_their_place_on_the_page_they_are_sent_to`.)
    if opens_before.is_none_or(|before| before >= starts_in) {
        let stranger = app.browser();
        let deadline = Instant::now() + StdDuration::from_secs(10);
        while !queue_json(&stranger, id).await["seed_sha256"].is_string() {
            assert!(Instant::now() < deadline, "the waiting room never opened");
            tokio::time::sleep(StdDuration::from_millis(50)).await;
        }
    }
    id
}

/// `queue.json` as `who` gets it; insists it is never cached.
pub async fn queue_json(who: &Browser, product: i64) -> Value {
    let response = who.get(&format!("/products/{product}/queue.json")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["cache-control"], "no-store");
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    serde_json::from_str(&response.text().await.unwrap()).unwrap()
}

/// Polls `queue.json` until `done` holds, for at most `within`.
pub async fn wait_for(
    who: &Browser,
    product: i64,
    within: StdDuration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let status = queue_json(who, product).await;
        if done(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "queue.json never got there: {status}"
        );
        tokio::time::sleep(StdDuration::from_millis(100)).await;
    }
}

pub fn state_is(state: &'static str) -> impl Fn(&Value) -> bool {
    move |status| status["state"] == state
}

pub async fn join(who: &Browser, product: i64) -> reqwest::Response {
    who.join_waiting_room(product).await
}

fn entries(app: &TestApp, product: i64) -> i64 {
    app.db.count(&format!(
        "SELECT count(*) AS n FROM queue_entries WHERE product_id = {product}"
    ))
}

fn orders_of(app: &TestApp, product: i64) -> i64 {
    app.db.count(&format!(
        "SELECT count(*) AS n FROM order_items WHERE product_id = {product}"
    ))
}

/// A buy as the waiting page's form sends it.
async fn buy_with_pass(
    who: &Browser,
    product: i64,
    quantity: &str,
    pass: Option<&str>,
) -> reqwest::Response {
    let token = who.csrf().await;
    let key = uuid::Uuid::new_v4().simple().to_string();
    let mut fields = vec![
        ("quantity", quantity),
        ("csrf_token", token.as_str()),
        ("idempotency_key", key.as_str()),
    ];
    fields.extend(pass.map(|pass| ("pass", pass)));
    who.post(&format!("/products/{product}/buy"), &fields).await
}

/// The hidden `pass` of the page's Buy form.
fn pass_in(page: &str) -> String {
    let at = page
        .find(r#"name="pass" value=""#)
        .unwrap_or_else(|| panic!("no pass in the page: {page}"));
    let rest = &page[at + r#"name="pass" value=""#.len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

const CONTRACT: [&str; 7] = [
    "state",
    "position",
    "ahead",
    "units_left",
    "held",
    "ticket",
    "pass_expires_at",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn joining_through_the_form_keeps_one_place_and_the_page_counts_down() {
    let app = spawn_app().await;
    let product = queue_sale(&app, 5, 1, Duration::minutes(10), None).await;
    let customer = app.customer("early@example.com").await;

    let before = queue_json(&customer, product).await;
    for field in CONTRACT {
        assert!(
            before.get(field).is_some(),
            "queue.json lacks {field}: {before}"
        );
    }
    assert_eq!(before["state"], "not_joined");
    assert!(
        before["ticket"].is_null() && before["position"].is_null(),
        "{before}"
    );

    // The product page offers the waiting room, not Buy.
    let page = expect_page(
        customer.get(&format!("/products/{product}")).await,
        StatusCode::OK,
        "Join the waiting room",
    )
    .await;
    assert!(
        !page.contains(&format!("/products/{product}/buy")),
        "{page}"
    );
    assert!(!page.contains("Add to cart"), "{page}");

    let response = join(&customer, product).await;
    expect_redirect(&response, &format!("/products/{product}/queue"));
    assert_eq!(entries(&app, product), 1);
    let joined = queue_json(&customer, product).await;
    assert_eq!(joined["state"], "waiting", "{joined}");
    let ticket = joined["ticket"].as_str().expect("a ticket").to_string();
    assert_eq!(ticket.len(), 10, "{joined}");
    // Before the start there is no place yet: the order is drawn at the start.
    assert!(joined["position"].is_null(), "{joined}");
    assert!(joined["pass_expires_at"].is_null(), "{joined}");
    chrono::DateTime::parse_from_rfc3339(joined["starts_at"].as_str().unwrap()).unwrap();
    // The draw's commitment, fixed when the room opened: the joiner keeps it
    // to hold the shop to its draw, and it is the one the draw publishes.
    let commitment = joined["seed_sha256"]
        .as_str()
        .unwrap_or_else(|| panic!("no commitment: {joined}"))
        .to_string();
    assert!(
        commitment.len() == 64 && commitment.bytes().all(|b| b.is_ascii_hexdigit()),
        "{joined}"
    );
    let (status, body) = customer
        .get_text(&format!("/products/{product}/draw.json"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let record: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(record["seed_sha256"], commitment.as_str(), "{record}");

    // Joining again keeps the same place.
    expect_redirect(
        &join(&customer, product).await,
        &format!("/products/{product}/queue"),
    );
    assert_eq!(entries(&app, product), 1);
    assert_eq!(
        queue_json(&customer, product).await["ticket"],
        ticket.as_str()
    );

    let response = customer.get(&format!("/products/{product}/queue")).await;
    assert_eq!(response.headers()["cache-control"], "no-store");
    let page = expect_page(response, StatusCode::OK, "You are in the waiting room").await;
    for text in [
        ticket.as_str(),
        "The sale starts in",
        "data-until=",
        r#"data-phase="pre_queue""#,
        r#"http-equiv="refresh""#,
        "/products/",
        &format!(r#"data-testid="commitment">{commitment}<"#),
        &format!("--commitment {commitment} --ticket {ticket}"),
    ] {
        assert!(page.contains(text), "waiting page lacks {text:?}: {page}");
    }
    assert!(!page.contains(r#"name="pass""#), "{page}");

    // The product page now links to the waiting room.
    let page = expect_page(
        customer.get(&format!("/products/{product}")).await,
        StatusCode::OK,
        "Go to the waiting room",
    )
    .await;
    assert!(page.contains(&ticket), "{page}");
}

/// The join that opens the room (the first, before the tick has opened
/// it) sends its customer to a page that shows their place, not the Join
/// button again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_first_joiner_sees_their_place_on_the_page_they_are_sent_to() {
    // No tick after the first (at the server's start): the join itself
    // opens the room.
    let app = spawn_app_with(|s| s.queue_tick = StdDuration::from_secs(3_600)).await;
    let product = queue_sale(
        &app,
        5,
        1,
        Duration::minutes(10),
        Some(Duration::minutes(5)),
    )
    .await;
    let customer = app.customer("first-joiner@example.com").await;
    // The opening moved to a minute ago (as an admin's edit may).
    diesel::sql_query(format!(
        "UPDATE products SET queue_opens_at = now() - interval '1 minute' WHERE id = {product}"
    ))
    .execute(&mut app.db.conn())
    .unwrap();
    flashsale::services::sale_cache::invalidate();
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM queue_draws WHERE product_id = {product}"
        )),
        0,
        "the room is not open before the first join"
    );
    expect_redirect(
        &join(&customer, product).await,
        &format!("/products/{product}/queue"),
    );
    let page = customer.get(&format!("/products/{product}/queue")).await;
    let page = expect_page(page, StatusCode::OK, "Waiting room").await;
    assert!(
        page.contains("You are in the waiting room"),
        "the page the join sent them to: {page}"
    );
    let status = queue_json(&customer, product).await;
    assert_eq!(status["state"], "waiting", "{status}");
    assert!(
        status["ticket"].is_string() && status["seed_sha256"].is_string(),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_joins_write_nothing() {
    let app = spawn_app().await;
    let product = queue_sale(&app, 5, 1, Duration::minutes(10), None).await;
    let open_sale = app.product(5, Some(1)).await;
    let customer = app.customer("bad@example.com").await;

    // No CSRF token, or someone else's.
    let response = customer
        .post(&format!("/products/{product}/queue"), &[])
        .await;
    expect_page(response, StatusCode::FORBIDDEN, "This form has expired").await;
    let response = customer
        .post(
            &format!("/products/{product}/queue"),
            &[("csrf_token", "0123456789abcdef0123456789abcdef")],
        )
        .await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert_eq!(entries(&app, product), 0);

    // A stranger is sent to sign in.
    let stranger = app.browser();
    let response = join(&stranger, product).await;
    expect_sign_in(&response);
    assert_eq!(entries(&app, product), 0);
    let page = expect_page(
        stranger.get(&format!("/products/{product}")).await,
        StatusCode::OK,
        "Sign in to join the waiting room",
    )
    .await;
    assert!(!page.contains(r#"action="/products/"#), "{page}");
    let page = expect_page(
        stranger.get(&format!("/products/{product}/queue")).await,
        StatusCode::OK,
        "Sign in to join",
    )
    .await;
    assert!(page.contains(r#"data-phase="sign_in""#), "{page}");
    assert_eq!(queue_json(&stranger, product).await["state"], "not_joined");

    // A sale not in queue mode has no waiting room.
    let response = join(&customer, open_sale).await;
    let status = response.status();
    let page = response.text().await.unwrap();
    assert!(status.is_client_error(), "{status}: {page}");
    assert!(page.contains("waiting room"), "{page}");
    assert_eq!(app.db.count("SELECT count(*) AS n FROM queue_entries"), 0);
    for path in [
        format!("/products/{open_sale}/queue"),
        format!("/products/{open_sale}/queue.json"),
        format!("/products/{open_sale}/draw.json"),
        format!("/products/{open_sale}/draw"),
        "/products/999999/queue.json".to_string(),
        "/products/999999/draw.json".to_string(),
    ] {
        assert_eq!(
            customer.get(&path).await.status(),
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    // The open sale's page still sells as before.
    expect_page(
        customer.get(&format!("/products/{open_sale}")).await,
        StatusCode::OK,
        "Buy now",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn before_the_opening_the_join_button_waits_for_its_second() {
    let app = spawn_app().await;
    // Opens in 10 minutes, starts in 20.
    let product = queue_sale(
        &app,
        5,
        1,
        Duration::minutes(20),
        Some(Duration::minutes(10)),
    )
    .await;
    let customer = app.customer("tooearly@example.com").await;
    let page = expect_page(
        customer.get(&format!("/products/{product}")).await,
        StatusCode::OK,
        "The waiting room opens",
    )
    .await;
    assert!(page.contains("disabled data-enable-at="), "{page}");
    let page = expect_page(
        customer.get(&format!("/products/{product}/queue")).await,
        StatusCode::OK,
        "The waiting room opens in",
    )
    .await;
    assert!(page.contains(r#"data-phase="not_open_yet""#), "{page}");
    // The server decides, not the button.
    let response = join(&customer, product).await;
    assert!(response.status().is_client_error(), "{}", response.status());
    assert_eq!(entries(&app, product), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_the_start_the_page_shows_a_place_then_a_pass_that_buys() {
    let app = spawn_app().await;
    let product = queue_sale(&app, 1, 1, Duration::seconds(3), None).await;
    let first = app.customer("first-in@example.com").await;
    let second = app.customer("second-in@example.com").await;
    let late = app.customer("latecomer@example.com").await;
    for who in [&first, &second] {
        expect_redirect(
            &join(who, product).await,
            &format!("/products/{product}/queue"),
        );
    }
    // Buying without a pass is refused in queue mode, before and after the start.
    let rows = app.db.ledger_rows();
    expect_page(
        buy_with_pass(&first, product, "1", None).await,
        StatusCode::FORBIDDEN,
        "Wait for your turn",
    )
    .await;
    assert_eq!(app.db.ledger_rows(), rows);

    // After the start the draw puts both in line; the one unit admits one.
    let admitted = |status: &Value| status["state"] == "admitted";
    let placed = |status: &Value| !status["position"].is_null();
    let a = wait_for(&first, product, StdDuration::from_secs(15), placed).await;
    let b = wait_for(&second, product, StdDuration::from_secs(15), placed).await;
    let mut positions = [
        a["position"].as_i64().unwrap(),
        b["position"].as_i64().unwrap(),
    ];
    positions.sort();
    assert_eq!(positions, [1, 2], "{a} {b}");
    let (winner, loser) = if a["position"] == 1 {
        (&first, &second)
    } else {
        (&second, &first)
    };
    let won = wait_for(winner, product, StdDuration::from_secs(15), admitted).await;
    assert!(!won["pass_expires_at"].is_null(), "{won}");
    chrono::DateTime::parse_from_rfc3339(won["pass_expires_at"].as_str().unwrap()).unwrap();
    let waiting = queue_json(loser, product).await;
    assert_eq!(waiting["state"], "waiting", "{waiting}");
    // Nobody ahead still waits: the one before holds the pass.
    assert_eq!(waiting["ahead"], 0, "{waiting}");
    // The one unit is held by the pass: the loser is told so at once.
    assert_eq!(waiting["units_left"], 0, "{waiting}");
    assert_eq!(waiting["held"], 1, "{waiting}");
    let page = expect_page(
        loser.get(&format!("/products/{product}/queue")).await,
        StatusCode::OK,
        "Every unit is sold or held right now",
    )
    .await;
    assert!(
        page.contains("number <span data-field=\"position\">2</span>"),
        "{page}"
    );

    // A late arrival goes to the back.
    expect_redirect(
        &join(&late, product).await,
        &format!("/products/{product}/queue"),
    );
    let behind = queue_json(&late, product).await;
    assert_eq!(behind["position"], 3, "{behind}");

    // The winner's page has the Buy form with the pass.
    let page = expect_page(
        winner.get(&format!("/products/{product}/queue")).await,
        StatusCode::OK,
        "It is your turn",
    )
    .await;
    let pass = pass_in(&page);
    assert_eq!(Some(pass.as_str()), won["pass"].as_str(), "{won}");
    assert!(
        page.contains(r#"name="idempotency_key""#) && page.contains(r#"max="1""#),
        "{page}"
    );

    // Every way of buying without this customer's valid pass writes nothing.
    let rows = app.db.ledger_rows();
    let unknown_number = format!("{}-99", pass.split('-').next().unwrap());
    for (who, pass, words) in [
        (loser, None, "Wait for your turn"),
        (loser, Some(pass.as_str()), "This pass is someone else"),
        (winner, Some("not-a-pass"), "This pass is not valid"),
        (
            winner,
            Some(unknown_number.as_str()),
            "This pass is not valid",
        ),
        (winner, Some("ZZZZZZZZZZ-1"), "This pass is not valid"),
    ] {
        let response = buy_with_pass(who, product, "1", pass).await;
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(status.is_client_error(), "{pass:?}: {status} {text}");
        assert!(text.contains(words), "{pass:?}: {text}");
        assert_eq!(app.db.ledger_rows(), rows, "{pass:?} wrote rows");
    }
    assert_eq!(orders_of(&app, product), 0);

    // The pass buys.
    let response = buy_with_pass(winner, product, "1", Some(&pass)).await;
    let order = order_id_from(&response);
    assert_eq!(orders_of(&app, product), 1);
    let bought = wait_for(winner, product, StdDuration::from_secs(5), |s| {
        s["pass_state"] == "used"
    })
    .await;
    assert_eq!(bought["pass"], pass.as_str());
    expect_page(
        winner.get(&format!("/products/{product}/queue")).await,
        StatusCode::OK,
        "Your pass was used for an order",
    )
    .await;
    // A used pass buys nothing more.
    let response = buy_with_pass(winner, product, "1", Some(&pass)).await;
    let status = response.status();
    let text = response.text().await.unwrap();
    assert!(status.is_client_error(), "{status}: {text}");
    assert!(text.contains("Your pass has been used"), "{text}");
    assert_eq!(orders_of(&app, product), 1);

    // Until the order is paid its unit is held; once paid, nothing can come back.
    wait_for(loser, product, StdDuration::from_secs(5), |s| {
        s["units_left"] == 0 && s["held"] == 1
    })
    .await;
    winner.pay(order, GOOD_CARD).await;
    wait_for(
        loser,
        product,
        StdDuration::from_secs(15),
        state_is("sold_out"),
    )
    .await;
    expect_page(
        loser.get(&format!("/products/{product}/queue")).await,
        StatusCode::OK,
        "Sold out",
    )
    .await;
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_published_draw_passes_flashsale_draw_verify() {
    let app = spawn_app().await;
    let product = queue_sale(&app, 2, 1, Duration::seconds(3), None).await;
    let customers = app.customers(5, "drawn").await;
    for who in &customers {
        expect_redirect(
            &join(who, product).await,
            &format!("/products/{product}/queue"),
        );
    }
    // What a joiner saves on joining: the commitment and their ticket.
    let saved = queue_json(&customers[0], product).await;
    let (commitment, ticket) = (
        saved["seed_sha256"].as_str().unwrap().to_string(),
        saved["ticket"].as_str().unwrap().to_string(),
    );

    // Before the start: the commitment and the entries, no seed, no order.
    let stranger = app.browser();
    let response = stranger
        .get(&format!("/products/{product}/draw.json"))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    // The same for everyone: a CDN may keep it for its second.
    assert_eq!(response.headers()["cache-control"], "public, max-age=1");
    assert!(response.headers().get("set-cookie").is_none());
    let before: Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(before["product"], product);
    assert!(before["seed"].is_null(), "{before}");
    assert_eq!(before["seed_sha256"].as_str().unwrap().len(), 64);
    // Nothing is frozen before the start.
    assert!(
        before["entries_sha256"].is_null() && before["frozen_at"].is_null(),
        "{before}"
    );
    assert_eq!(before["entries"].as_array().unwrap().len(), 5);
    assert_eq!(before["order"].as_array().unwrap().len(), 0);
    for entry in before["entries"].as_array().unwrap() {
        let mut keys: Vec<&str> = entry
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort();
        assert_eq!(keys, ["joined_at", "late", "seq", "ticket"], "{entry}");
        assert_eq!(entry["late"], false);
    }
    assert!(!before.to_string().contains("@example.com"));
    let page = expect_page(
        stranger.get(&format!("/products/{product}/draw")).await,
        StatusCode::OK,
        "flashsale draw verify --base-url URL --product",
    )
    .await;
    for text in [
        "SHA-256",
        "HMAC-SHA256",
        "ascending",
        "knows the seed while it issues tickets",
        before["seed_sha256"].as_str().unwrap(),
        "not yet",
    ] {
        assert!(page.contains(text), "draw page lacks {text:?}: {page}");
    }

    // After the start: the seed, the order, the admissions (two units).
    let drawn = {
        let deadline = Instant::now() + StdDuration::from_secs(20);
        loop {
            let (_, body) = stranger
                .get_text(&format!("/products/{product}/draw.json"))
                .await;
            let record: Value = serde_json::from_str(&body).unwrap();
            if !record["seed"].is_null() && record["admissions"].as_array().unwrap().len() == 2 {
                break record;
            }
            assert!(Instant::now() < deadline, "never drawn: {record}");
            tokio::time::sleep(StdDuration::from_millis(200)).await;
        }
    };
    assert_eq!(drawn["order"].as_array().unwrap().len(), 5, "{drawn}");
    assert_eq!(drawn["seed_sha256"], before["seed_sha256"]);
    assert_eq!(drawn["seed_sha256"], commitment.as_str());
    // The pre-queue was frozen at the start, its list's SHA-256 published.
    assert_eq!(
        drawn["entries_sha256"].as_str().map(str::len),
        Some(64),
        "{drawn}"
    );
    let frozen_at =
        chrono::DateTime::parse_from_rfc3339(drawn["frozen_at"].as_str().unwrap()).unwrap();
    let starts_at =
        chrono::DateTime::parse_from_rfc3339(drawn["starts_at"].as_str().unwrap()).unwrap();
    assert!(frozen_at >= starts_at, "{drawn}");
    let first_two: Vec<&Value> = drawn["order"].as_array().unwrap()[..2].iter().collect();
    let admitted: Vec<&Value> = drawn["admissions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["ticket"])
        .collect();
    assert_eq!(admitted, first_two, "{drawn}");

    // The command anyone can run, against the served document.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
        .args([
            "draw",
            "verify",
            "--base-url",
            &app.address,
            "--product",
            &product.to_string(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "draw verify failed: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains("PASS: the order follows from the committed seed"),
        "{text}"
    );
    // Held to what the joiner saved, as the waiting page tells them to.
    let verify_saved = |commitment: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
            .args(["draw", "verify", "--base-url", &app.address, "--product"])
            .arg(product.to_string())
            .args(["--commitment", commitment, "--ticket", &ticket])
            .output()
            .unwrap()
    };
    let output = verify_saved(&commitment);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "draw verify with the saved commitment failed: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // A commitment other than the one saved fails the check.
    let output = verify_saved(&"ab".repeat(32));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{text}");
    assert!(text.contains("FAIL"), "{text}");
    let report =
        flashsale::qa::draw::fetch_and_check(&app.address, flashsale::domain::ProductId(product))
            .await
            .unwrap();
    assert!(report.passed(), "{}", report.render());

    let page = expect_page(
        stranger.get(&format!("/products/{product}/draw")).await,
        StatusCode::OK,
        drawn["seed"].as_str().unwrap(),
    )
    .await;
    assert!(page.contains("pass open"), "{page}");
}

/// The draw as the tables hold it, written straight into them: the
/// document is built from one snapshot, the order recomputed from the seed,
/// and `flashsale draw verify` passes it (and fails it once an admission
/// skips the order).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn draw_json_is_built_from_the_tables_and_verifies() {
    use flashsale::domain::draw::{draw_order, frozen_list_sha256, DrawEntry, DrawSeed, Ticket};
    // No tick: nothing but this test writes the queue's tables.
    let app = spawn_app_with(|s| s.queue_tick = StdDuration::from_secs(3_600)).await;
    let product = queue_sale(
        &app,
        3,
        1,
        Duration::minutes(10),
        Some(Duration::minutes(5)),
    )
    .await;
    let customers = app.customers(6, "tabled").await;
    let ids: Vec<i64> = customers
        .iter()
        .map(|c| {
            app.db.count(&format!(
                "SELECT id AS n FROM customers WHERE email = '{}'",
                c.email
            ))
        })
        .collect();
    let seed = DrawSeed::from_bytes(std::array::from_fn(|i| (i * 7) as u8));
    let starts_at = Utc::now() - Duration::seconds(30);
    let mut conn = app.db.conn();
    let sql = |conn: &mut diesel::PgConnection, text: String| {
        diesel::sql_query(text).execute(conn).unwrap();
    };
    sql(
        &mut conn,
        format!(
            "UPDATE products SET sale_starts_at = '{}', queue_opens_at = NULL WHERE id = {product}",
            starts_at.to_rfc3339()
        ),
    );
    sql(
        &mut conn,
        format!(
            "INSERT INTO queue_draws (product_id, seed, seed_sha256) VALUES ({product}, '\\x{}', '\\x{}')",
            seed.to_hex(),
            seed.commitment()
        ),
    );
    let mut entries = Vec::new();
    let mut customer_of = std::collections::HashMap::new();
    for (i, customer) in ids.iter().enumerate() {
        let ticket = Ticket::generate();
        // The last two joined after the start.
        let late = i >= 4;
        let joined_at = if late {
            starts_at + Duration::seconds(i as i64)
        } else {
            starts_at - Duration::seconds(60 - i as i64)
        };
        sql(
            &mut conn,
            format!(
                "INSERT INTO queue_entries (product_id, customer_id, ticket, seq, joined_at, late) \
                 VALUES ({product}, {customer}, '{}', {}, '{}', {late})",
                ticket.as_str(),
                i + 1,
                joined_at.to_rfc3339()
            ),
        );
        customer_of.insert(ticket.clone(), *customer);
        entries.push(DrawEntry {
            ticket,
            seq: i as u64 + 1,
            joined_at,
            late,
        });
    }
    flashsale::services::sale_cache::invalidate();
    let stranger = app.browser();

    // Not drawn yet: the commitment and the entries, no seed and no order.
    let (status, body) = stranger
        .get_text(&format!("/products/{product}/draw.json"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let before: Value = serde_json::from_str(&body).unwrap();
    assert!(
        before["seed"].is_null() && before["order"] == serde_json::json!([]),
        "{before}"
    );
    assert_eq!(before["seed_sha256"], seed.commitment().to_string());
    assert!(
        before["entries_sha256"].is_null() && before["frozen_at"].is_null(),
        "{before}"
    );
    assert_eq!(before["entries"].as_array().unwrap().len(), 6);
    assert!(!body.contains("tabled"), "customer data in {body}");

    // As the draw leaves them: the pre-queue frozen at the start (its
    // tickets' SHA-256 published), then the seed revealed with every
    // place's position, and the first three of the order admitted.
    let pre_queue: Vec<Ticket> = entries
        .iter()
        .filter(|e| !e.late)
        .map(|e| e.ticket.clone())
        .collect();
    let order = draw_order(&seed, &entries);
    sql(
        &mut conn,
        format!(
            "UPDATE queue_draws SET frozen_at = '{}', entries_sha256 = '\\x{}', \
             last_position = {}, drawn_at = now() WHERE product_id = {product}",
            (starts_at + Duration::milliseconds(20)).to_rfc3339(),
            frozen_list_sha256(&pre_queue),
            order.len()
        ),
    );
    for (n, ticket) in order.iter().enumerate() {
        sql(
            &mut conn,
            format!(
                "UPDATE queue_entries SET position = {}, drawn = NOT late \
                 WHERE product_id = {product} AND ticket = '{}'",
                n + 1,
                ticket.as_str()
            ),
        );
    }
    for (n, ticket) in order.iter().take(3).enumerate() {
        let issued_at = starts_at + Duration::seconds(n as i64 + 1);
        let state = ["lapsed", "issued", "issued"][n];
        sql(
            &mut conn,
            format!(
                "INSERT INTO queue_admissions (product_id, number, ticket, customer_id, units, issued_at, expires_at, state, ended_at) \
                 VALUES ({product}, {}, '{}', {}, 1, '{}', '{}', '{state}', {})",
                n + 1,
                ticket.as_str(),
                customer_of[ticket],
                issued_at.to_rfc3339(),
                (issued_at + Duration::minutes(2)).to_rfc3339(),
                if state == "lapsed" { "now()" } else { "NULL" }
            ),
        );
    }
    // The copy of a second ago may still be served; then the new snapshot.
    tokio::time::sleep(StdDuration::from_millis(1_100)).await;
    let (status, body) = stranger
        .get_text(&format!("/products/{product}/draw.json"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let drawn: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(drawn["seed"], seed.to_hex());
    let published: Vec<&str> = drawn["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let expected: Vec<&str> = order.iter().map(Ticket::as_str).collect();
    assert_eq!(published, expected);
    assert_eq!(drawn["admissions"][0]["state"], "lapsed");
    assert_eq!(drawn["admissions"][1]["state"], "issued");
    assert_eq!(
        drawn["entries_sha256"],
        frozen_list_sha256(&pre_queue).to_string()
    );

    let verify = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
            .args([
                "draw",
                "verify",
                "--base-url",
                &app.address,
                "--product",
                &product.to_string(),
            ])
            .output()
            .unwrap()
    };
    let output = verify();
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(text.contains("PASS admissions 3 issued"), "{text}");

    let page = expect_page(
        stranger.get(&format!("/products/{product}/draw")).await,
        StatusCode::OK,
        &seed.to_hex(),
    )
    .await;
    for text in [
        "HMAC-SHA256",
        "knows the seed while it issues tickets",
        &format!("flashsale draw verify --base-url URL --product {product}"),
        "lapsed (place passed on)",
        order[0].as_str(),
    ] {
        assert!(page.contains(text), "draw page lacks {text:?}: {page}");
    }

    // An admission that skips a place is caught by the verifier.
    sql(
        &mut conn,
        format!(
            "UPDATE queue_admissions SET ticket = '{}' WHERE product_id = {product} AND number = 3",
            order[4].as_str()
        ),
    );
    tokio::time::sleep(StdDuration::from_millis(1_100)).await;
    let output = verify();
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(!output.status.success(), "{text}");
    assert!(text.contains("FAIL admissions"), "{text}");
}

/// The server's own database, where reading the statistics of the test's
/// database costs that database nothing.
fn admin_conn(db: &TestDb) -> (diesel::PgConnection, String) {
    use diesel::Connection;
    let (server, name) = flashsale::db::split_database_url(&db.url).unwrap();
    (
        diesel::PgConnection::establish(&format!("{server}/postgres")).unwrap(),
        name.to_string(),
    )
}

/// Committed plus rolled-back transactions of `db` so far.
fn transactions(db: &TestDb) -> i64 {
    use diesel::prelude::*;
    let (mut admin, name) = admin_conn(db);
    diesel::sql_query(
        "SELECT (xact_commit + xact_rollback)::int8 AS n FROM pg_stat_database WHERE datname = $1",
    )
    .bind::<diesel::sql_types::Text, _>(name)
    .get_result::<flashsale::qa::harness::Count>(&mut admin)
    .unwrap()
    .n
}

/// Until nobody is connected to `db`: a backend reports its counts lazily
/// (an idle one up to ten seconds late) but always as it ends.
async fn until_alone(db: &TestDb) {
    use diesel::prelude::*;
    let (mut admin, name) = admin_conn(db);
    let started = Instant::now();
    loop {
        let _ = diesel::sql_query("SELECT pg_stat_clear_snapshot()").execute(&mut admin);
        let connected = diesel::sql_query(
            "SELECT count(*)::int8 AS n FROM pg_stat_activity WHERE datname = $1",
        )
        .bind::<diesel::sql_types::Text, _>(&name)
        .get_result::<flashsale::qa::harness::Count>(&mut admin)
        .unwrap()
        .n;
        if connected == 0 {
            break;
        }
        assert!(
            started.elapsed() < StdDuration::from_secs(15),
            "the stopped shop kept its database connections"
        );
        tokio::time::sleep(StdDuration::from_millis(20)).await;
    }
    // A leaving backend leaves pg_stat_activity just before it reports.
    tokio::time::sleep(StdDuration::from_millis(300)).await;
}

/// The transactions of a whole life of the shop: start, `work`, stop.
async fn transactions_over<F, Fut>(
    db: &TestDb,
    settings: &flashsale::config::Settings,
    work: F,
) -> i64
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    until_alone(db).await;
    let before = transactions(db);
    let served = flashsale::qa::harness::ServedShop::start(settings.clone())
        .await
        .unwrap();
    // Until then a session is checked against its table.
    let since = Instant::now();
    while !served.shop.revocations.is_listening() {
        assert!(since.elapsed() < StdDuration::from_secs(10));
        tokio::time::sleep(StdDuration::from_millis(20)).await;
    }
    work(served.address.clone()).await;
    served.server.stop(true).await;
    drop(served);
    until_alone(db).await;
    transactions(db) - before
}

/// `queue.json` is polled by every waiter every few seconds: it must cost
/// Postgres next to nothing per poll. The session comes from its cookie,
/// the sale from the sale cache, a customer's place is read once per
/// process, and the room from this process's snapshot, read at most once
/// per `FRESH_FOR` (250 ms) per room: a crowd polling at once costs Postgres
/// a few transactions a second, however many polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_polls_cost_postgres_one_snapshot_per_room_not_one_read_each() {
    use futures::StreamExt;
    let db = TestDb::new();
    let mut settings =
        flashsale::config::Settings::for_tests(&db.url, &crate::helpers::unique_prefix());
    // The tick and the jobs run once at each start, the same for both lives.
    settings.queue_tick = StdDuration::from_secs(3_600);
    settings.jobs_interval = StdDuration::from_secs(3_600);
    // Set-up in a life of its own: the sale, the waiter and their place.
    let (product, waiter) = {
        let app = spawn_app_on(TestDb::attach(&db.url), |s| *s = settings.clone()).await;
        let product = queue_sale(
            &app,
            5,
            1,
            Duration::minutes(10),
            Some(Duration::minutes(5)),
        )
        .await;
        diesel::sql_query(format!(
            "UPDATE products SET queue_opens_at = now() - interval '1 minute' WHERE id = {product}"
        ))
        .execute(&mut app.db.conn())
        .unwrap();
        flashsale::services::sale_cache::invalidate();
        let waiter = app.customer("poller@example.com").await;
        expect_redirect(
            &join(&waiter, product).await,
            &format!("/products/{product}/queue"),
        );
        // (Right after joining, see
        // `the_first_joiner_sees_their_place_on_the_page_they_are_sent_to`.)
        wait_for(
            &waiter,
            product,
            StdDuration::from_secs(2),
            state_is("waiting"),
        )
        .await;
        // Dropping the app stops its server; `transactions_over` waits for
        // its connections to close.
        drop(app);
        (product, waiter)
    };

    let idle = transactions_over(&db, &settings, |_| async {}).await;
    // Each of the waiter and a stranger, this many polls, as a crowd's
    // pages send them: many at once.
    const POLLS: usize = 1_000;
    const IN_FLIGHT: usize = 32;
    let mut took = StdDuration::ZERO;
    let polled = transactions_over(&db, &settings, |address| {
        let (waiter, took) = (&waiter, &mut took);
        async move {
            // The waiter's cookie is for 127.0.0.1 (any port), and the session key is shared.
            let waiter = Browser::with_client(&address, waiter.client.clone());
            let stranger = Browser::new(&address);
            let started = Instant::now();
            // The waiter's first poll in this life reads their place; the
            // rest find it in memory.
            assert_eq!(queue_json(&waiter, product).await["state"], "waiting");
            futures::stream::iter(0..2 * POLLS)
                .map(|n| {
                    let (waiter, stranger) = (&waiter, &stranger);
                    async move {
                        if n % 2 == 0 {
                            assert_eq!(queue_json(waiter, product).await["state"], "waiting");
                        } else {
                            assert_eq!(queue_json(stranger, product).await["state"], "not_joined");
                        }
                    }
                })
                .buffer_unordered(IN_FLIGHT)
                .collect::<Vec<()>>()
                .await;
            *took = started.elapsed();
        }
    })
    .await;
    // The room's snapshot: one read per `FRESH_FOR`, and the first. The
    // waiter's place: one read. The sale cache reads the sales at most about
    // twice a second, and the revocation list proves itself fresh on its
    // own clock. A read per poll would be thousands.
    // `waiting_room::rooms::FRESH_FOR`.
    let fresh_for = StdDuration::from_millis(250);
    let snapshots = (took.as_secs_f64() / fresh_for.as_secs_f64()).ceil() as i64 + 1;
    let allowed = idle + snapshots + 1 + 3 * took.as_secs_f64().ceil() as i64 + 5;
    eprintln!(
        "{polled} transactions in a life with {} polls in {took:?}; {idle} in an idle one",
        2 * POLLS
    );
    assert!(
        polled <= allowed,
        "{polled} Postgres transactions for {} polls in {took:?} (an idle life: {idle}; at most {allowed})",
        2 * POLLS
    );
    // Polls in quick succession: far fewer transactions than polls (a few
    // a second, whatever the rate of polls; here about one per 150).
    assert!(
        polled - idle < (2 * POLLS / 20) as i64,
        "{} transactions more than an idle life for {} polls",
        polled - idle,
        2 * POLLS
    );
}

/// A pass that runs out says so on its page, and its place goes to the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lapsed_pass_says_so_and_admits_the_next() {
    let app = spawn_app_with(|s| s.queue_pass = StdDuration::from_secs(2)).await;
    let product = queue_sale(&app, 1, 1, Duration::seconds(2), None).await;
    let customers = app.customers(2, "lapsing").await;
    for who in &customers {
        join(who, product).await;
    }
    let placed = |s: &Value| !s["position"].is_null();
    let mut first = None;
    for who in &customers {
        if wait_for(who, product, StdDuration::from_secs(15), placed).await["position"] == 1 {
            first = Some(who);
        }
    }
    let first = first.expect("someone is first");
    let second = customers.iter().find(|c| c.email != first.email).unwrap();
    let pass = wait_for(
        first,
        product,
        StdDuration::from_secs(10),
        state_is("admitted"),
    )
    .await;
    let pass = pass["pass"].as_str().unwrap().to_string();
    // The pass lapses unused; the next in line is admitted.
    wait_for(first, product, StdDuration::from_secs(15), |s| {
        s["pass_state"] == "lapsed"
    })
    .await;
    expect_page(
        first.get(&format!("/products/{product}/queue")).await,
        StatusCode::OK,
        "Your pass ran out before a purchase",
    )
    .await;
    wait_for(
        second,
        product,
        StdDuration::from_secs(10),
        state_is("admitted"),
    )
    .await;
    let rows = app.db.ledger_rows();
    expect_page(
        buy_with_pass(first, product, "1", Some(&pass)).await,
        StatusCode::CONFLICT,
        "Your pass has run out",
    )
    .await;
    assert_eq!(app.db.ledger_rows(), rows);
}

/// A buy whose reply was lost is sent again once the sale is over (its
/// waiting room closed): the resend gets its order, not "closed, nothing
/// was changed" (which would leave an order the customer thinks they never
/// made to expire unpaid), and buys nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resend_after_the_sale_ends_gets_its_order() {
    let app = spawn_app().await;
    let product = queue_sale(&app, 1, 1, Duration::seconds(1), None).await;
    let buyer = app.customer("resender@example.com").await;
    expect_redirect(
        &join(&buyer, product).await,
        &format!("/products/{product}/queue"),
    );
    wait_for(
        &buyer,
        product,
        StdDuration::from_secs(15),
        state_is("admitted"),
    )
    .await;
    let page = expect_page(
        buyer.get(&format!("/products/{product}/queue")).await,
        StatusCode::OK,
        "It is your turn",
    )
    .await;
    let pass = pass_in(&page);
    let token = buyer.csrf().await;
    let key = uuid::Uuid::new_v4().simple().to_string();
    let form = [
        ("quantity", "1"),
        ("csrf_token", token.as_str()),
        ("idempotency_key", key.as_str()),
        ("pass", pass.as_str()),
    ];
    let buy = format!("/products/{product}/buy");
    let order = order_id_from(&buyer.post(&buy, &form).await);

    diesel::sql_query(format!(
        "UPDATE products SET queue_opens_at = now() - interval '3 hours', \
         sale_starts_at = now() - interval '2 hours', sale_ends_at = now() - interval '1 hour' \
         WHERE id = {product}"
    ))
    .execute(&mut app.db.conn())
    .unwrap();
    flashsale::services::sale_cache::invalidate();
    app.shop
        .waiting_room
        .forget(flashsale::domain::ProductId(product));
    wait_for(&buyer, product, StdDuration::from_secs(15), |s| {
        s["queue"] == "closed"
    })
    .await;

    let again = buyer.post(&buy, &form).await;
    assert_eq!(order_id_from(&again), order);
    assert_eq!(orders_of(&app, product), 1);
    // A new form (a new key) with the spent pass buys nothing.
    let response = buy_with_pass(&buyer, product, "1", Some(&pass)).await;
    assert!(response.status().is_client_error(), "{}", response.status());
    assert_eq!(orders_of(&app, product), 1);
}

/// Once the sale ends the waiting room is closed for everyone in it, and
/// takes nobody else.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn when_the_sale_ends_the_waiting_room_says_it_is_closed() {
    let app = spawn_app().await;
    let starts_at = Utc::now() + Duration::seconds(2);
    let product = create_product(
        &app.shop.pool,
        SaleSpec {
            name: "Brief bittern".into(),
            description: "A short sale.".into(),
            price: Money::from_cents(900).unwrap(),
            stock: 3,
            per_customer_limit: Some(1),
            starts_at,
            ends_at: Some(starts_at + Duration::seconds(3)),
            queue_mode: true,
            queue_opens_at: None,
            join_check_work: 1,
        },
    )
    .await
    .unwrap()
    .id;
    let waiter = app.customer("closing@example.com").await;
    let latecomer = app.customer("toolate@example.com").await;
    let deadline = Instant::now() + StdDuration::from_secs(10);
    while join(&waiter, product).await.status() != StatusCode::SEE_OTHER {
        assert!(Instant::now() < deadline, "could not join");
        tokio::time::sleep(StdDuration::from_millis(100)).await;
    }
    wait_for(
        &waiter,
        product,
        StdDuration::from_secs(20),
        state_is("closed"),
    )
    .await;
    expect_page(
        waiter.get(&format!("/products/{product}/queue")).await,
        StatusCode::OK,
        "This waiting room is closed",
    )
    .await;
    let before = entries(&app, product);
    let response = join(&latecomer, product).await;
    let status = response.status();
    let text = response.text().await.unwrap();
    assert!(status.is_client_error(), "{status}: {text}");
    assert!(text.contains("waiting room is closed"), "{text}");
    assert_eq!(entries(&app, product), before);
}

/// Joins at the same moment (committed together, a process's joins
/// share a transaction) each get one place with a ticket of their own, and
/// joining again at once keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn joins_at_the_same_moment_each_get_a_place_of_their_own() {
    const JOINERS: usize = 32;
    let app = spawn_app().await;
    let product = queue_sale(&app, 1, 1, Duration::minutes(10), None).await;
    let mut joiners = Vec::new();
    for n in 0..JOINERS {
        joiners.push(app.customer(&format!("joiner-{n}@example.com")).await);
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2 * JOINERS));
    // Everyone twice at once: the second join of each finds the first.
    let joins: Vec<_> = joiners
        .iter()
        .chain(&joiners)
        .map(|who| {
            let (who, barrier) = (who.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                join(&who, product).await
            })
        })
        .collect();
    for joined in joins {
        expect_redirect(
            &joined.await.unwrap(),
            &format!("/products/{product}/queue"),
        );
    }

    assert_eq!(entries(&app, product), JOINERS as i64);
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(DISTINCT ticket) AS n FROM queue_entries WHERE product_id = {product} \
             AND NOT late AND position IS NULL"
        )),
        JOINERS as i64,
        "every place in the pre-queue, none placed before the draw"
    );
    let mut tickets = std::collections::HashSet::new();
    for who in &joiners {
        let status = queue_json(who, product).await;
        assert_eq!(status["state"], "waiting", "{status}");
        let ticket = status["ticket"].as_str().unwrap_or_default().to_string();
        assert!(!ticket.is_empty(), "{status}");
        tickets.insert(ticket);
    }
    assert_eq!(
        tickets.len(),
        JOINERS,
        "each joiner has a ticket of its own"
    );
    let (_, body) = app
        .browser()
        .get_text(&format!("/products/{product}/draw.json"))
        .await;
    let record: Value = serde_json::from_str(&body).unwrap();
    let published: std::collections::HashSet<String> = record["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["ticket"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(published, tickets, "draw.json lists every place once");
}
