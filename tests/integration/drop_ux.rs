//! Issue #42 over plain HTTP: a declined card retried on the order page and
//! given up, a mistyped card answered on the order page, sign-in that
//! returns where it was asked for (and never to another site), the
//! waiting room's truthful wait and hold times, `HEAD /`, and static files
//! under content-hashed addresses. The same cases in Chromium are in
//! `e2e_drop_ux`.

use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use reqwest::StatusCode;

use crate::helpers::*;
use crate::waiting_room_pages::{join, queue_sale, wait_for};
use flashsale::services::payment::CARD_TRIES;

fn restores_of(app: &TestApp, order: i64) -> i64 {
    app.db.count(&format!(
        "SELECT count(*) AS n FROM stock_history WHERE order_id = {order} AND reason = 'payment_failed'"
    ))
}

fn status_of(app: &TestApp, order: i64) -> String {
    let rows = app.db.count(&format!(
        "SELECT count(*) AS n FROM orders WHERE id = {order} AND status = 'awaiting_payment'"
    ));
    if rows == 1 {
        return "awaiting_payment".into();
    }
    let failed = app.db.count(&format!(
        "SELECT count(*) AS n FROM orders WHERE id = {order} AND status = 'payment_failed'"
    ));
    if failed == 1 {
        "payment_failed".into()
    } else {
        "other".into()
    }
}

/// Each declined try but the last keeps the unit held and the order open;
/// the last gives the unit back, exactly once, and no further card is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_declined_card_can_be_retried_and_the_last_try_restores_once() {
    let app = spawn_app().await;
    let product = app.product(2, None).await;
    let buyer = app.customer("retry-card@example.com").await;
    let order = order_id_from(&buyer.buy(product, 1).await);
    assert_eq!(app.db.stock(product), 1);

    for tried in 1..CARD_TRIES {
        expect_redirect(
            &buyer.pay(order, DECLINED_CARD).await,
            &format!("/orders/{order}"),
        );
        assert_eq!(app.db.stock(product), 1, "held after decline {tried}");
        assert_eq!(status_of(&app, order), "awaiting_payment");
        assert_eq!(restores_of(&app, order), 0);
        let (_, page) = buyer.get_text(&format!("/orders/{order}")).await;
        let left = CARD_TRIES - tried;
        assert!(
            page.contains("Your card was declined")
                && page.contains(&format!("({left} tr"))
                && page.contains("form method=\"post\" action=\"/orders/"),
            "{page}"
        );
    }
    // The last try: the unit comes back once, and the page says why.
    expect_redirect(
        &buyer.pay(order, DECLINED_CARD).await,
        &format!("/orders/{order}"),
    );
    assert_eq!(app.db.stock(product), 2);
    assert_eq!(status_of(&app, order), "payment_failed");
    assert_eq!(restores_of(&app, order), 1);
    let (_, page) = buyer.get_text(&format!("/orders/{order}")).await;
    assert!(
        page.contains(&format!("declined {CARD_TRIES} times")),
        "{page}"
    );
    // A further card is refused before it reaches the provider.
    expect_page(
        buyer.pay(order, GOOD_CARD).await,
        StatusCode::CONFLICT,
        "declined",
    )
    .await;
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM payments WHERE order_id = {order}"
        )),
        CARD_TRIES
    );
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM sandbox_charges WHERE approved"),
        0
    );
    assert_eq!(restores_of(&app, order), 1);
    app.db.assert_audit_clean();
}

/// A decline, then another card that pays: the unit was held throughout
/// and nothing was given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_card_after_a_decline_pays_for_the_held_unit() {
    let app = spawn_app().await;
    let product = app.product(1, None).await;
    let buyer = app.customer("second-card@example.com").await;
    let rival = app.customer("rival-card@example.com").await;
    let order = order_id_from(&buyer.buy(product, 1).await);
    buyer.pay(order, DECLINED_CARD).await;
    // Nobody else can take the held unit meanwhile.
    expect_page(rival.buy(product, 1).await, StatusCode::CONFLICT, "").await;
    expect_redirect(
        &buyer.pay(order, GOOD_CARD).await,
        &format!("/orders/{order}"),
    );
    let (_, page) = buyer.get_text(&format!("/orders/{order}")).await;
    assert!(page.contains("Paid — thank you"), "{page}");
    assert_eq!(app.db.stock(product), 0);
    assert_eq!(restores_of(&app, order), 0);
    app.db.assert_audit_clean();
}

/// A mistyped number is answered on the order page (422, with the pay form,
/// the deadline and the account menu); nothing is sent or changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mistyped_card_is_answered_on_the_order_page() {
    let app = spawn_app().await;
    let product = app.product(2, None).await;
    let buyer = app.customer("typo-card@example.com").await;
    let order = order_id_from(&buyer.buy(product, 1).await);
    let page = expect_page(
        buyer
            .post_form(
                &format!("/orders/{order}/pay"),
                &[("card_number", "4242 4242 4242 4241")],
            )
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        &format!("Order {order}"),
    )
    .await;
    assert!(page.contains("data-testid=\"card-error\""), "{page}");
    assert!(page.contains("id=\"card_number\""), "{page}");
    assert!(page.contains(">My orders</a>"), "{page}");
    assert_eq!(app.db.count("SELECT count(*) AS n FROM payments"), 0);
    assert_eq!(app.db.stock(product), 1);
    // The order is still payable.
    expect_redirect(
        &buyer.pay(order, GOOD_CARD).await,
        &format!("/orders/{order}"),
    );
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM orders WHERE id = {order} AND status = 'paid'"
        )),
        1
    );
}

/// Giving up gives the units back through the payment-failure restore,
/// once; only the order's customer can, and only with the form's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn giving_up_restores_once_and_only_for_the_owner() {
    let app = spawn_app().await;
    let product = app.product(3, None).await;
    let buyer = app.customer("give-up@example.com").await;
    let other = app.customer("not-the-owner@example.com").await;
    let order = order_id_from(&buyer.buy(product, 2).await);
    buyer.pay(order, DECLINED_CARD).await;
    assert_eq!(app.db.stock(product), 1);
    let cancel = format!("/orders/{order}/cancel");

    expect_page(
        other.post_form(&cancel, &[]).await,
        StatusCode::NOT_FOUND,
        "",
    )
    .await;
    let no_token = buyer.post(&cancel, &[]).await;
    assert!(no_token.status().is_client_error(), "{}", no_token.status());
    assert_eq!(app.db.stock(product), 1);
    assert_eq!(restores_of(&app, order), 0);

    expect_redirect(
        &buyer.post_form(&cancel, &[]).await,
        &format!("/orders/{order}"),
    );
    assert_eq!(app.db.stock(product), 3);
    assert_eq!(restores_of(&app, order), 1);
    // A resend changes nothing; paying afterwards is refused.
    expect_redirect(
        &buyer.post_form(&cancel, &[]).await,
        &format!("/orders/{order}"),
    );
    assert_eq!(restores_of(&app, order), 1);
    expect_page(buyer.pay(order, GOOD_CARD).await, StatusCode::CONFLICT, "").await;
    let (_, page) = buyer.get_text(&format!("/orders/{order}")).await;
    assert!(page.contains("This order was cancelled"), "{page}");
    app.db.assert_audit_clean();
}

/// Sign-in comes back to the page that asked for it, and only to the
/// shop's own paths: another site's address, however spelled, goes home.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sign_in_returns_to_the_page_that_asked_and_never_elsewhere() {
    let app = spawn_app().await;
    let product = app.product(2, None).await;
    app.customer("returning@example.com").await;

    let stranger = app.browser();
    expect_redirect(&stranger.get("/orders").await, "/login?next=%2Forders");
    let (status, page) = stranger.get_text("/login?next=%2Forders").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("name=\"next\" value=\"/orders\"") && page.contains("sign-in-reason"),
        "{page}"
    );

    // A buy sent while signed out: back to the page the form was on, told why.
    let referer = format!("{}/products/{product}", app.address);
    let response = stranger
        .client
        .post(format!("{}/products/{product}/buy", app.address))
        .header("Referer", &referer)
        .form(&[("quantity", "1")])
        .send()
        .await
        .unwrap();
    expect_redirect(
        &response,
        &format!("/login?next=%2Fproducts%2F{product}&why=act"),
    );
    let (_, page) = stranger
        .get_text(&format!("/login?next=%2Fproducts%2F{product}&why=act"))
        .await;
    assert!(page.contains("nothing was done yet"), "{page}");
    // Another site's Referer is not followed.
    let response = stranger
        .client
        .post(format!("{}/products/{product}/buy", app.address))
        .header("Referer", "https://evil.example/products/1")
        .form(&[("quantity", "1")])
        .send()
        .await
        .unwrap();
    expect_redirect(&response, "/login?why=act");
    assert_eq!(app.db.stock(product), 2, "nothing was bought");

    let sign_in_to = |next: &'static str| {
        let base = app.address.clone();
        async move {
            let browser = Browser::new(&base);
            browser
                .post_form(
                    "/login",
                    &[
                        ("email", "returning@example.com"),
                        ("password", PASSWORD),
                        ("next", next),
                    ],
                )
                .await
        }
    };
    expect_redirect(&sign_in_to("/orders").await, "/orders");
    let product_path: &'static str = Box::leak(format!("/products/{product}").into_boxed_str());
    expect_redirect(&sign_in_to(product_path).await, product_path);
    for hostile in [
        "//evil.example",
        "https://evil.example",
        "/\\evil.example",
        "/\t/evil.example",
        "evil.example",
        "/login",
    ] {
        expect_redirect(&sign_in_to(hostile).await, "/");
    }
    // The login page does not carry a hostile `next` into its form either.
    let (_, page) = stranger.get_text("/login?next=%2F%2Fevil.example").await;
    assert!(!page.contains("evil.example"), "{page}");
}

/// Signing up confirms the new account and leads back where it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signing_up_confirms_and_returns_to_the_sale() {
    let app = spawn_app().await;
    let product = app.product(2, None).await;
    let newcomer = app.browser();
    let next = format!("/products/{product}");
    let response = newcomer
        .sign_up_form(&[
            ("email", "newcomer@example.com"),
            ("password", PASSWORD),
            ("next", &next),
        ])
        .await;
    let welcome = format!("/welcome?next=%2Fproducts%2F{product}");
    expect_redirect(&response, &welcome);
    let (status, page) = newcomer.get_text(&welcome).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("Your account is ready")
            && page.contains("newcomer@example.com")
            && page.contains(&format!("href=\"/products/{product}\"")),
        "{page}"
    );
    let (_, page) = newcomer.get_text("/welcome?next=%2F%2Fevil.example").await;
    assert!(
        !page.contains("evil.example") && page.contains("href=\"/\""),
        "{page}"
    );
}

/// `HEAD /` answers like `GET /`, without a body.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn head_of_the_sale_list_answers_200() {
    let app = spawn_app().await;
    let response = app
        .browser()
        .client
        .head(format!("{}/", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
}

/// Pages link the stylesheet and script by content hash; those addresses
/// are cached for a year, immutable. Another build's hash (a rolling
/// deploy) gets this build's file, briefly and privately cached; a name that
/// is no hash of ours is a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn static_files_are_served_under_hashed_addresses_for_a_year() {
    let app = spawn_app().await;
    let stranger = app.browser();
    let (_, page) = stranger.get_text("/").await;
    let hashed = |extension: &str| -> String {
        let pattern =
            regex::Regex::new(&format!(r#""(/static/app\.[0-9a-f]{{16}}\.{extension})""#)).unwrap();
        pattern
            .captures(&page)
            .unwrap_or_else(|| panic!("no hashed .{extension} in the page:\n{page}"))[1]
            .to_string()
    };
    for (path, kind, content) in [
        (hashed("css"), "text/css", "--accent"),
        (hashed("js"), "text/javascript", "waitingRoom"),
    ] {
        let response = stranger.get(&path).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_eq!(
            response.headers()["cache-control"],
            "public, max-age=31536000, immutable"
        );
        assert!(response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with(kind));
        assert!(response.text().await.unwrap().contains(content));
    }
    let other_build = stranger.get("/static/app.0123456789abcdef.css").await;
    assert_eq!(other_build.status(), StatusCode::OK);
    assert_eq!(
        other_build.headers()["cache-control"],
        "private, max-age=60"
    );
    assert!(other_build.text().await.unwrap().contains("--accent"));
    let other_script = stranger.get("/static/app.0123456789abcdef.js").await;
    assert_eq!(
        other_script.headers()["cache-control"],
        "private, max-age=60"
    );
    assert!(other_script.text().await.unwrap().contains("waitingRoom"));
    for not_ours in [
        "/static/app.0123.css",
        "/static/other.0123456789abcdef.css",
        "/static/app.0123456789abcdeg.js",
    ] {
        assert_eq!(
            stranger.get(not_ours).await.status(),
            StatusCode::NOT_FOUND,
            "{not_ours}"
        );
    }
    let plain = stranger.get("/static/app.css").await;
    assert_eq!(plain.status(), StatusCode::OK);
    assert_eq!(plain.headers()["cache-control"], "public, max-age=300");
}

fn at(json: &serde_json::Value, field: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(
        json[field]
            .as_str()
            .unwrap_or_else(|| panic!("no {field}: {json}")),
    )
    .unwrap()
    .with_timezone(&Utc)
}

/// Number 2 for one unit, while number 1 holds it with a pass: not "0
/// waiting ahead" and "less than a minute", but "next in line", one
/// shopper admitted ahead, a wait of at least the pass's remaining time,
/// and held units that come back by the pass's end plus the time to pay
/// at the latest. Once the unit is sold for good the room says sold out,
/// and a refund admits number 2 after all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_waiting_room_tells_the_truth_about_time_and_sell_outs() {
    let app = spawn_app_with(|s| s.queue_pass = StdDuration::from_secs(120)).await;
    let product = queue_sale(&app, 1, 1, Duration::seconds(4), None).await;
    let line = app.customers(2, "truth").await;
    for customer in &line {
        join(customer, product).await;
    }
    let first = wait_for(&line[0], product, StdDuration::from_secs(20), |s| {
        s["position"].is_i64()
    })
    .await;
    let (first, second) = if first["position"] == 1 {
        (&line[0], &line[1])
    } else {
        (&line[1], &line[0])
    };
    let admitted = wait_for(first, product, StdDuration::from_secs(20), |s| {
        s["state"] == "admitted"
    })
    .await;
    let pass_ends = at(&admitted, "pass_expires_at");
    let waiting = wait_for(second, product, StdDuration::from_secs(10), |s| {
        s["availability"] == "all_held"
    })
    .await;
    assert_eq!(waiting["position"], 2);
    assert_eq!(waiting["ahead"], 0);
    assert_eq!(
        waiting["line_text"],
        "You are next in line. 1 shopper ahead of you has been admitted and is buying now."
    );
    let wait = waiting["estimated_wait_secs"].as_u64().unwrap();
    assert!(wait >= 100, "the pass has about 2 minutes left: {waiting}");
    assert!(
        waiting["estimated_wait_text"]
            .as_str()
            .unwrap()
            .starts_with("at least "),
        "{waiting}"
    );
    // The latest a held unit can come back: a pass used in the last second
    // of its grace (5 s past its deadline) starts an order with the whole
    // time to pay (600 s).
    let latest = at(&waiting, "held_until");
    let grace = Duration::from_std(flashsale::services::waiting_room::PASS_GRACE).unwrap();
    assert!(
        latest >= pass_ends + grace + Duration::seconds(600) - Duration::seconds(1),
        "held_until {latest} < pass end {pass_ends} + grace + time to pay"
    );
    assert!(at(&waiting, "next_release_at") <= latest);

    // The first buys and pays: sold out, but not final.
    let page = first
        .get_text(&format!("/products/{product}/queue"))
        .await
        .1;
    let pass = page
        .split("name=\"pass\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_string();
    let token = first.csrf().await;
    let bought = first
        .post(
            &format!("/products/{product}/buy"),
            &[("quantity", "1"), ("csrf_token", &token), ("pass", &pass)],
        )
        .await;
    let order = order_id_from(&bought);
    expect_redirect(
        &first.pay(order, GOOD_CARD).await,
        &format!("/orders/{order}"),
    );
    let sold_out = wait_for(second, product, StdDuration::from_secs(10), |s| {
        s["phase"] == "sold_out"
    })
    .await;
    assert_eq!(sold_out["title"], "Sold out for now");
    let (_, page) = second.get_text(&format!("/products/{product}/queue")).await;
    assert!(
        page.contains("keeps watching until the sale ends") && !page.contains("none can come back"),
        "{page}"
    );
    // A refund brings the unit back, and number 2 is admitted.
    let admin = app.admin().await;
    expect_redirect(
        &admin
            .post_form(&format!("/admin/orders/{order}/refund"), &[])
            .await,
        &format!("/admin/orders/{order}"),
    );
    let turn = wait_for(second, product, StdDuration::from_secs(20), |s| {
        s["phase"] == "admitted"
    })
    .await;
    assert_eq!(turn["title"], "It is your turn: buy now");
}

/// `scripts/run`'s seed meets a newcomer with a waiting-room drop: its room
/// open now, its sale a few minutes away; seeding again while it is still
/// ahead adds no second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_demo_seeds_a_waiting_room_drop_that_is_open_and_starts_soon() {
    let app = spawn_app().await;
    let open_and_soon = "SELECT count(*) AS n FROM products WHERE queue_mode \
         AND queue_opens_at <= now() AND sale_starts_at > now() + interval '3 minutes' \
         AND sale_starts_at <= now() + interval '6 minutes'";
    assert_eq!(app.db.count(open_and_soon), 0);
    let report = flashsale::services::seed::seed_demo(&app.shop.pool)
        .await
        .unwrap();
    assert!(
        report
            .iter()
            .any(|line| line.contains("waiting room open now")),
        "{report:?}"
    );
    assert_eq!(app.db.count(open_and_soon), 1);
    flashsale::services::seed::seed_demo(&app.shop.pool)
        .await
        .unwrap();
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM products WHERE queue_mode"),
        1
    );
    // Its waiting page offers to join now.
    let id = app
        .db
        .count("SELECT id AS n FROM products WHERE queue_mode");
    let visitor = app.customer("demo-visitor@example.com").await;
    let (_, page) = visitor.get_text(&format!("/products/{id}/queue")).await;
    assert!(page.contains("The waiting room is open"), "{page}");
}

/// Buys one unit with the pass the waiting page's form carries.
async fn buy_with_the_pass(who: &Browser, product: i64) -> i64 {
    let (_, page) = who.get_text(&format!("/products/{product}/queue")).await;
    let pass = page
        .split("name=\"pass\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no pass on the waiting page: {page}"))
        .to_string();
    let token = who.csrf().await;
    let bought = who
        .post(
            &format!("/products/{product}/buy"),
            &[("quantity", "1"), ("csrf_token", &token), ("pass", &pass)],
        )
        .await;
    order_id_from(&bought)
}

/// Item 6: two units, both held by admitted shoppers. The product page's
/// headline is the room's count (0 of 2 free to buy now, 2 held), as the
/// waiting page says, never "2 of 2 left" from the stock row; once one of
/// them buys (an unpaid order, the stock row down to 1) it still says 0
/// free and 2 held, and the sale is live, not sold out. Paid, it counts
/// one held; when the other pass is used and paid too, sold out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_product_page_counts_units_as_the_waiting_room_does() {
    let app = spawn_app_with(|s| s.queue_pass = StdDuration::from_secs(120)).await;
    let product = queue_sale(&app, 2, 1, Duration::seconds(3), None).await;
    let line = app.customers(3, "count").await;
    for customer in &line[..2] {
        join(customer, product).await;
    }
    for customer in &line[..2] {
        wait_for(customer, product, StdDuration::from_secs(20), |s| {
            s["state"] == "admitted"
        })
        .await;
    }
    // A late arrival waits at the back: the room tells it every unit is held.
    join(&line[2], product).await;
    let waiting = wait_for(&line[2], product, StdDuration::from_secs(10), |s| {
        s["availability"] == "all_held"
    })
    .await;
    assert_eq!(waiting["units_left"], 0);
    assert_eq!(waiting["held"], 2);
    let product_path = format!("/products/{product}");
    let queue_path = format!("/products/{product}/queue");
    let all_held = "Every unit is sold or held right now.";
    let both_held = ">0</span> of 2 free to buy now; <span data-testid=\"held\">2</span> held by shoppers with a pass or an unpaid order.";
    let join_for_them = "Join the waiting room to be in line for them.";
    for (reader, in_line) in [(&app.browser(), false), (&line[2], true)] {
        let (_, page) = reader.get_text(&product_path).await;
        assert!(page.contains(both_held), "{page}");
        assert!(page.contains(all_held), "{page}");
        assert!(!page.contains(" left</p>"), "the stock row's count: {page}");
        assert!(page.contains(">Live</span>"), "{page}");
        assert_eq!(page.contains(join_for_them), !in_line, "{page}");
    }
    // A shopper whose pass holds one of them reads that it is theirs.
    let (_, page) = line[0].get_text(&product_path).await;
    assert!(page.contains(both_held), "{page}");
    assert!(
        page.contains("It is your turn: your pass holds a unit for you.")
            && !page.contains(all_held),
        "{page}"
    );
    let (_, room) = line[2].get_text(&queue_path).await;
    assert!(room.contains(all_held), "{room}");
    // The sale list counts as the room does.
    let (_, list) = app.browser().get_text("/").await;
    assert!(
        list.contains(
            ">0</span> of 2 free to buy now; <span data-testid=\"held\">2</span> held by shoppers"
        ),
        "{list}"
    );
    assert!(!list.contains(">2</span> of 2 left"), "{list}");

    // One buys: the stock row says 1, the room still holds 2.
    let order = buy_with_the_pass(&line[0], product).await;
    assert_eq!(app.db.stock(product), 1);
    let (_, page) = line[2].get_text(&product_path).await;
    assert!(page.contains(both_held), "{page}");
    assert!(!page.contains("1</span> of 2"), "{page}");
    // Paid: one unit is gone for good, the other still held.
    expect_redirect(
        &line[0].pay(order, GOOD_CARD).await,
        &format!("/orders/{order}"),
    );
    wait_for(&line[2], product, StdDuration::from_secs(10), |s| {
        s["held"] == 1 && s["units_left"] == 0
    })
    .await;
    let (_, page) = line[2].get_text(&product_path).await;
    assert!(
        page.contains(">0</span> of 2 free to buy now; <span data-testid=\"held\">1</span> held"),
        "{page}"
    );
    // The other buys and pays: sold out, on both pages.
    let order = buy_with_the_pass(&line[1], product).await;
    expect_redirect(
        &line[1].pay(order, GOOD_CARD).await,
        &format!("/orders/{order}"),
    );
    wait_for(&line[2], product, StdDuration::from_secs(10), |s| {
        s["phase"] == "sold_out"
    })
    .await;
    let (_, page) = line[2].get_text(&product_path).await;
    assert!(
        page.contains(">0</span> of 2 left: every unit has been sold for now.")
            && page.contains(">Sold out</span>"),
        "{page}"
    );
}

fn payments_of(app: &TestApp, order: i64) -> i64 {
    app.db.count(&format!(
        "SELECT count(*) AS n FROM payments WHERE order_id = {order}"
    ))
}

/// The last decline's restore cannot run yet (this test holds the product's
/// lock, as a busy sale or a slow instance would): the order is still
/// awaiting payment with `CARD_TRIES` declines. Its page says it is being
/// cancelled and offers no pay form (the `being_cancelled` state); another
/// card sent anyway (an old tab) is refused by the `CARD_TRIES` guard before
/// any charge: no payment row, nothing at the sandbox. Once the lock is
/// free, the background retry gives the unit back, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_the_last_decline_no_card_is_charged_while_the_order_is_being_cancelled() {
    let app = spawn_app_with(|s| s.lock_wait = StdDuration::from_millis(300)).await;
    let product = app.product(2, None).await;
    let buyer = app.customer("being-cancelled@example.com").await;
    let order = order_id_from(&buyer.buy(product, 1).await);
    let order_path = format!("/orders/{order}");
    // The pay form, as the page showed it before the last try.
    let pay_form = format!("action=\"/orders/{order}/pay\"");
    let (_, before) = buyer.get_text(&order_path).await;
    assert!(before.contains(&pay_form), "{before}");
    for _ in 1..CARD_TRIES {
        expect_redirect(&buyer.pay(order, DECLINED_CARD).await, &order_path);
    }

    let held = app
        .shop
        .locks
        .acquire(vec![flashsale::domain::ProductId(product)])
        .await
        .unwrap();
    // The last try: declined, and its restore finds the lock busy.
    expect_redirect(&buyer.pay(order, DECLINED_CARD).await, &order_path);
    assert_eq!(status_of(&app, order), "awaiting_payment");
    assert_eq!(restores_of(&app, order), 0);
    assert_eq!(app.db.stock(product), 1);

    let (_, page) = buyer.get_text(&order_path).await;
    assert!(
        page.contains(&format!(
            "Your payment was declined {CARD_TRIES} times, so this order is being cancelled"
        )),
        "{page}"
    );
    assert!(!page.contains(&pay_form), "no pay form: {page}");
    assert!(!page.contains("Cancel this order"), "{page}");

    // Another card from a tab still showing the form: refused before a charge.
    let charges = app.db.count("SELECT count(*) AS n FROM sandbox_charges");
    expect_page(
        buyer.pay(order, GOOD_CARD).await,
        StatusCode::CONFLICT,
        &format!("were declined {CARD_TRIES} times, so the order is being cancelled"),
    )
    .await;
    assert_eq!(payments_of(&app, order), CARD_TRIES, "no attempt recorded");
    assert_eq!(
        app.db.count("SELECT count(*) AS n FROM sandbox_charges"),
        charges,
        "nothing sent to the card's bank"
    );
    assert_eq!(status_of(&app, order), "awaiting_payment");

    // The lock comes free: the background retry restores the unit, once.
    held.release().await;
    let deadline = std::time::Instant::now() + StdDuration::from_secs(40);
    while restores_of(&app, order) == 0 {
        assert!(std::time::Instant::now() < deadline, "never restored");
        tokio::time::sleep(StdDuration::from_millis(200)).await;
    }
    assert_eq!(status_of(&app, order), "payment_failed");
    assert_eq!(app.db.stock(product), 2);
    tokio::time::sleep(StdDuration::from_secs(1)).await;
    assert_eq!(restores_of(&app, order), 1);
    app.db.assert_audit_clean();
}

/// "Cancel this order" while a charge is still unanswered (its answer was
/// lost on the way back): refused, since the bank may have approved it;
/// nothing is restored and the unit stays held for the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_is_refused_while_a_charge_is_unanswered() {
    let app = spawn_app().await;
    let product = app.product(2, None).await;
    let buyer = app.customer("cancel-pending@example.com").await;
    let order = order_id_from(&buyer.buy(product, 1).await);
    let order_path = format!("/orders/{order}");
    expect_redirect(&buyer.pay(order, LOST_ANSWER_CARD).await, &order_path);
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM payments WHERE order_id = {order} AND outcome = 'pending'"
        )),
        1
    );
    let (_, page) = buyer.get_text(&order_path).await;
    assert!(
        page.contains("being confirmed with your card's bank"),
        "{page}"
    );
    assert!(
        !page.contains("Cancel this order"),
        "no cancel offered: {page}"
    );

    // Sent anyway (an old tab's form).
    expect_page(
        buyer.post_form(&format!("{order_path}/cancel"), &[]).await,
        StatusCode::CONFLICT,
        "so the order was not cancelled",
    )
    .await;
    assert_eq!(status_of(&app, order), "awaiting_payment");
    assert_eq!(restores_of(&app, order), 0);
    assert_eq!(app.db.stock(product), 1, "the unit is still held");
    app.db.assert_audit_clean();
}
