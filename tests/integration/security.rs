//! Sign-in throttling, server-side sessions (rotated at sign-in, revoked at
//! sign-out), the admin action log, secure cookies, and secrets kept out of
//! logs and pages.

use std::time::{Duration, Instant};

use crate::helpers::*;
use flashsale::domain::{Email, Password, Role};
use flashsale::services::accounts::sign_up;
use flashsale::services::jobs::run_once;
use reqwest::redirect::Policy;
use reqwest::StatusCode;

const WRONG_PASSWORD: &str = "not the password";

async fn log_in(browser: &Browser, email: &str, password: &str) -> reqwest::Response {
    browser
        .post_form("/login", &[("email", email), ("password", password)])
        .await
}

fn retry_after(response: &reqwest::Response) -> u64 {
    response
        .headers()
        .get("retry-after")
        .expect("a Retry-After header")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Inserts `n` unsuccessful attempts `minutes_ago`, as earlier misses would have left them.
fn old_attempts(app: &TestApp, email: &str, n: usize, minutes_ago: i64) {
    use diesel::RunQueryDsl;
    diesel::sql_query(format!(
        "INSERT INTO login_attempts (email, ip, attempted_at) \
         SELECT '{email}', '127.0.0.1', now() - interval '{minutes_ago} minutes' \
         FROM generate_series(1, {n})"
    ))
    .execute(&mut app.db.conn())
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_wrong_passwords_then_the_right_one_gets_429_and_no_session() {
    let app = spawn_app().await;
    app.customer("victim@example.com").await;
    let attacker = app.browser();
    for _ in 0..5 {
        expect_page(
            log_in(&attacker, "victim@example.com", WRONG_PASSWORD).await,
            StatusCode::FORBIDDEN,
            "do not match",
        )
        .await;
    }

    let response = log_in(&attacker, "victim@example.com", PASSWORD).await;
    let wait = retry_after(&response);
    assert!((890..=900).contains(&wait), "Retry-After {wait}");
    expect_page(
        response,
        StatusCode::TOO_MANY_REQUESTS,
        "Try again in 15 minutes",
    )
    .await;
    // A wrong password gets the very same answer: while throttled nothing is checked.
    expect_page(
        log_in(&attacker, "victim@example.com", WRONG_PASSWORD).await,
        StatusCode::TOO_MANY_REQUESTS,
        "Too many sign-in attempts",
    )
    .await;

    expect_sign_in(&attacker.get("/orders").await);
    // Only the sign-up's own session exists, and refused attempts do not extend the wait.
    assert_eq!(app.db.count("SELECT count(*) AS n FROM sessions"), 1);
    assert_eq!(app.db.count("SELECT count(*) AS n FROM login_attempts"), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_account_from_the_same_address_signs_in_until_the_address_limit() {
    let app = spawn_app().await;
    app.customer("victim@example.com").await;
    app.customer("bystander@example.com").await;
    let attacker = app.browser();
    for _ in 0..5 {
        log_in(&attacker, "victim@example.com", WRONG_PASSWORD).await;
    }
    expect_page(
        log_in(&attacker, "victim@example.com", PASSWORD).await,
        StatusCode::TOO_MANY_REQUESTS,
        "Too many sign-in attempts",
    )
    .await;

    // Same address, another account: its own counter is clean.
    expect_redirect(
        &log_in(&app.browser(), "bystander@example.com", PASSWORD).await,
        "/",
    );

    // 15 more misses, spread over addresses that never reach their own limit,
    // bring this address to its limit of 20.
    for n in 0..15 {
        let email = format!("guess{}@example.com", n / 5);
        expect_page(
            log_in(&attacker, &email, WRONG_PASSWORD).await,
            StatusCode::FORBIDDEN,
            "do not match",
        )
        .await;
    }
    let bystander = app.browser();
    expect_page(
        log_in(&bystander, "bystander@example.com", PASSWORD).await,
        StatusCode::TOO_MANY_REQUESTS,
        "Too many sign-in attempts",
    )
    .await;

    // No proxy is trusted by default, so a forged X-Forwarded-For changes nothing.
    let token = bystander.csrf().await;
    let forged = bystander
        .client
        .post(format!("{}/login", app.address))
        .header("X-Forwarded-For", "203.0.113.9")
        .form(&[
            ("email", "bystander@example.com"),
            ("password", PASSWORD),
            ("csrf_token", &token),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), StatusCode::TOO_MANY_REQUESTS);
    expect_sign_in(&bystander.get("/orders").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn attempts_outside_the_window_stop_counting_and_are_purged() {
    let app = spawn_app().await;
    app.customer("late@example.com").await;
    app.customer("recent@example.com").await;
    old_attempts(&app, "late@example.com", 5, 16);
    old_attempts(&app, "recent@example.com", 5, 14);

    // Sixteen minutes ago is outside the 15-minute window.
    expect_redirect(
        &log_in(&app.browser(), "late@example.com", PASSWORD).await,
        "/",
    );
    // Fourteen minutes ago is inside it: about a minute to wait.
    let response = log_in(&app.browser(), "recent@example.com", PASSWORD).await;
    let wait = retry_after(&response);
    assert!((50..=60).contains(&wait), "Retry-After {wait}");
    expect_page(
        response,
        StatusCode::TOO_MANY_REQUESTS,
        &format!("Try again in {wait} seconds."),
    )
    .await;

    // The successful sign-in cleared late@'s rows; the job purges what the window no longer needs.
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM login_attempts WHERE email = 'late@example.com'"),
        0
    );
    old_attempts(&app, "gone@example.com", 20, 20);
    run_once(&app.shop).await.unwrap();
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM login_attempts WHERE email = 'gone@example.com'"),
        0
    );
    assert_eq!(app.db.count("SELECT count(*) AS n FROM login_attempts"), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signing_in_rotates_the_session() {
    let app = spawn_app().await;
    app.customer("rotate@example.com").await;
    let (browser, jar) = browser_with_jar(&app);
    let form_token_before = browser.csrf().await;
    let anonymous = cookie_header(&jar, &app);

    expect_redirect(&log_in(&browser, "rotate@example.com", PASSWORD).await, "/");
    let first = cookie_header(&jar, &app);
    assert_ne!(first, anonymous);
    assert_eq!(
        get_with_cookie(&app, "/orders", &first).await.status(),
        StatusCode::OK
    );
    // The cookie from before sign-in signs in no one, and its form token is void.
    expect_sign_in(&get_with_cookie(&app, "/orders", &anonymous).await);
    expect_page(
        browser
            .post("/logout", &[("csrf_token", &form_token_before)])
            .await,
        StatusCode::FORBIDDEN,
        "This form has expired",
    )
    .await;

    // Signing in again replaces the session: the first cookie is revoked.
    expect_redirect(&log_in(&browser, "rotate@example.com", PASSWORD).await, "/");
    let second = cookie_header(&jar, &app);
    expect_sign_in(&get_with_cookie(&app, "/orders", &first).await);
    assert_eq!(
        get_with_cookie(&app, "/orders", &second).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        app.db.count(
            "SELECT count(*) AS n FROM sessions s JOIN customers c ON c.id = s.customer_id \
             WHERE c.email = 'rotate@example.com' AND s.revoked_at IS NOT NULL"
        ),
        1,
        "the first sign-in's session is revoked; the sign-up browser's and the second stay"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copied_cookie_is_useless_after_sign_out() {
    let app = spawn_app().await;
    let (browser, jar) = browser_with_jar(&app);
    let signed_up = browser
        .sign_up_form(&[("email", "copied@example.com"), ("password", PASSWORD)])
        .await;
    expect_redirect(&signed_up, "/welcome");
    let copied = cookie_header(&jar, &app);
    assert_eq!(
        get_with_cookie(&app, "/orders", &copied).await.status(),
        StatusCode::OK
    );

    expect_redirect(&browser.post_form("/logout", &[]).await, "/");

    expect_sign_in(&get_with_cookie(&app, "/orders", &copied).await);
    // Nor does the copy show the account in the page header.
    let home = get_with_cookie(&app, "/", &copied).await;
    assert_eq!(home.status(), StatusCode::OK);
    let page = home.text().await.unwrap();
    assert!(!page.contains("copied@example.com"), "{page}");
    assert!(page.contains("Sign in"));
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM sessions WHERE revoked_at IS NOT NULL"),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_session_signs_in_no_one_and_is_purged() {
    // The cookie carries its session's expiry and is trusted without the
    // table, so the session must end on time by itself.
    let ttl = Duration::from_secs(3);
    let app = spawn_app_with(|s| s.security.session_ttl = ttl).await;
    let customer = app.customer("expiring@example.com").await;
    let started = Instant::now();
    assert_eq!(customer.get("/orders").await.status(), StatusCode::OK);

    tokio::time::sleep((ttl + Duration::from_millis(100)).saturating_sub(started.elapsed())).await;
    expect_sign_in(&customer.get("/orders").await);

    run_once(&app.shop).await.unwrap();
    assert_eq!(app.db.count("SELECT count(*) AS n FROM sessions"), 0);
}

fn sale_fields<'a>(name: &'a str, price: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("name", name),
        ("description", "Audited"),
        ("price", price),
        ("stock", "10"),
        ("per_customer_limit", ""),
        ("starts_at", "2030-01-01T09:00"),
        ("ends_at", ""),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_admin_action_is_recorded_and_listed_newest_first() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let buyer = app.customer("buyer@example.com").await;

    let created = admin
        .post_form("/admin/products", &sale_fields("Audit lamp", "120.00"))
        .await;
    assert_eq!(created.status(), StatusCode::SEE_OTHER);
    let sale: i64 = created.headers()["location"]
        .to_str()
        .unwrap()
        .trim_start_matches("/admin/products/")
        .trim_end_matches("/edit?saved=1")
        .parse()
        .unwrap();
    let edited = admin
        .post_form(
            &format!("/admin/products/{sale}/edit"),
            &sale_fields("Audit lamp", "99.00"),
        )
        .await;
    assert_eq!(edited.status(), StatusCode::SEE_OTHER);
    let adjusted = admin
        .post_form(
            &format!("/admin/products/{sale}/stock"),
            &[("delta", "3"), ("reason", "found a box")],
        )
        .await;
    assert_eq!(adjusted.status(), StatusCode::SEE_OTHER);
    // A refused adjustment records nothing: the record shares its transaction.
    expect_page(
        admin
            .post_form(
                &format!("/admin/products/{sale}/stock"),
                &[("delta", "-1000"), ("reason", "too many")],
            )
            .await,
        StatusCode::CONFLICT,
        "Nothing was changed",
    )
    .await;
    let resynced = admin
        .post_form(&format!("/admin/products/{sale}/resync-gate"), &[])
        .await;
    assert_eq!(resynced.status(), StatusCode::SEE_OTHER);
    let product = app.product(5, None).await;
    let order = order_id_from(&buyer.buy(product, 1).await);
    assert_eq!(
        buyer.pay(order, GOOD_CARD).await.status(),
        StatusCode::SEE_OTHER
    );
    let refunded = admin
        .post_form(&format!("/admin/orders/{order}/refund"), &[])
        .await;
    expect_redirect(&refunded, &format!("/admin/orders/{order}"));

    let by_admin = |action: &str, target: &str| {
        app.db.count(&format!(
            "SELECT count(*) AS n FROM admin_actions a JOIN customers c ON c.id = a.admin_id \
             WHERE c.email = 'admin@example.com' AND a.action = '{action}' AND {target}"
        ))
    };
    let on_sale = format!("a.product_id = {sale} AND a.order_id IS NULL");
    assert_eq!(by_admin("sale_create", &on_sale), 1);
    assert_eq!(by_admin("sale_edit", &on_sale), 1);
    assert_eq!(by_admin("stock_adjust", &on_sale), 1);
    assert_eq!(by_admin("gate_resync", &on_sale), 1);
    assert_eq!(
        by_admin(
            "refund",
            &format!("a.order_id = {order} AND a.product_id IS NULL")
        ),
        1
    );
    assert_eq!(app.db.count("SELECT count(*) AS n FROM admin_actions"), 5);

    let (status, page) = admin.get_text("/admin/audit-log").await;
    assert_eq!(status, StatusCode::OK);
    let rows: Vec<&str> = page.split("data-testid=\"action-row\"").skip(1).collect();
    assert_eq!(rows.len(), 5, "{page}");
    // Named for what it lists; "audit" is the ledger check's name.
    assert!(page.contains("<h1>Action log</h1>"), "{page}");
    assert!(!page.contains("Audit log"), "{page}");
    let expected = [
        ("Refund", format!("Order #{order}"), "refunded".to_string()),
        ("Gate resync", format!("Sale #{sale}"), String::new()),
        (
            "Stock adjustment",
            format!("Sale #{sale}"),
            "+3 units (10 → 13): found a box".into(),
        ),
        (
            "Sale edited",
            format!("Sale #{sale}"),
            "price $120.00 → $99.00".into(),
        ),
        (
            "Sale created",
            format!("Sale #{sale}"),
            "“Audit lamp”: 10 units at $120.00".into(),
        ),
    ];
    for (row, (action, target, detail)) in rows.iter().zip(&expected) {
        assert!(row.contains("admin@example.com"), "{row}");
        assert!(row.contains(action), "{action} in {row}");
        assert!(row.contains(target.as_str()), "{target} in {row}");
        assert!(row.contains(detail.as_str()), "{detail} in {row}");
    }

    // Linked from the admin pages; for admins only.
    let (_, dashboard) = admin.get_text("/admin").await;
    assert!(dashboard.contains("href=\"/admin/audit-log\">Action log</a>"));
    expect_page(
        buyer.get("/admin/audit-log").await,
        StatusCode::FORBIDDEN,
        "administrators only",
    )
    .await;
    expect_sign_in(&app.browser().get("/admin/audit-log").await);
}

/// The Set-Cookie headers of an anonymous page and of a sign-in, sent by hand
/// (a cookie store would not hand a `Secure` cookie back over plain HTTP).
async fn session_set_cookies(app: &TestApp) -> (String, String) {
    let email = "cookie@example.com";
    sign_up(
        &app.shop.pool,
        Email::parse(email).unwrap(),
        Password::parse(PASSWORD).unwrap(),
        Role::Customer,
    )
    .await
    .unwrap();
    let client = reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap();
    let set_cookie = |response: &reqwest::Response| {
        response.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .to_string()
    };
    let page = client
        .get(format!("{}/login", app.address))
        .send()
        .await
        .unwrap();
    let anonymous = set_cookie(&page);
    let token = csrf_from(&page.text().await.unwrap());
    let signed_in = client
        .post(format!("{}/login", app.address))
        .header("Cookie", anonymous.split(';').next().unwrap())
        .form(&[
            ("email", email),
            ("password", PASSWORD),
            ("csrf_token", &token),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    (anonymous, set_cookie(&signed_in))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_cookie_is_secure_only_when_configured_for_tls() {
    let tls = spawn_app_with(|settings| settings.cookie_secure = true).await;
    for cookie in <[String; 2]>::from(session_set_cookies(&tls).await) {
        assert!(cookie.contains("; Secure"), "{cookie}");
        assert!(cookie.contains("HttpOnly"), "{cookie}");
    }
    let plain = spawn_app().await;
    for cookie in <[String; 2]>::from(session_set_cookies(&plain).await) {
        assert!(!cookie.contains("Secure"), "{cookie}");
    }
}

/// Everything the process logs, at every level, from here on.
fn capture_the_log() -> CapturedLog {
    let log = CapturedLog::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        // The test's own HTTP client is not the shop: leave its internals out.
        .with_env_filter("trace,hyper=off,hyper_util=off,reqwest=off,h2=off,rustls=off")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn passwords_and_card_numbers_are_never_logged_or_echoed() {
    if !alone_in_process("security::passwords_and_card_numbers_are_never_logged_or_echoed") {
        return;
    }
    const SIGNUP_SECRET: &str = "Signup-Secret-4711";
    const WRONG_SECRET: &str = "Wrong-Secret-0815";
    const SHORT_SECRET: &str = "Sh0rt!";
    const TYPO_CARD: &str = "4242 4242 4242 4241";
    let log = capture_the_log();
    let app = spawn_app().await;
    let browser = app.browser();

    let short = browser
        .sign_up_form(&[("email", "short@example.com"), ("password", SHORT_SECRET)])
        .await;
    let page = expect_page(short, StatusCode::UNPROCESSABLE_ENTITY, "at least 8").await;
    assert!(!page.contains(SHORT_SECRET));
    let signed_up = browser
        .sign_up_form(&[("email", "logged@example.com"), ("password", SIGNUP_SECRET)])
        .await;
    expect_redirect(&signed_up, "/welcome");
    let page = expect_page(
        log_in(&app.browser(), "logged@example.com", WRONG_SECRET).await,
        StatusCode::FORBIDDEN,
        "do not match",
    )
    .await;
    assert!(!page.contains(WRONG_SECRET));

    let product = app.product(5, None).await;
    let order = order_id_from(&browser.buy(product, 1).await);
    let page = expect_page(
        browser.pay(order, TYPO_CARD).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "typo",
    )
    .await;
    assert!(!page.contains(TYPO_CARD) && !page.contains(&TYPO_CARD.replace(' ', "")));

    let logged = log.text();
    assert!(
        logged.contains("sign-in refused"),
        "the capture sees the shop's log: {logged}"
    );
    for secret in [
        SIGNUP_SECRET,
        WRONG_SECRET,
        SHORT_SECRET,
        TYPO_CARD,
        "4242424242424241",
    ] {
        assert!(!logged.contains(secret), "{secret} was logged");
    }
}
