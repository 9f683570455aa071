//! Sessions verified from the signed cookie and each instance's list of
//! revoked sessions, told of each revocation as it commits: no Postgres read
//! per page and no poll, and still every sign-out, revocation, role change
//! and deleted account refuses the cookie on every instance within a second;
//! without a listener the list is polled, and when it is stale, the table
//! decides.

use std::time::{Duration, Instant};

use crate::helpers::*;
use flashsale::config::Settings;
use flashsale::domain::{Email, Password};
use flashsale::services::accounts::ensure_admin;
use flashsale::services::revocations::poll_revocations;
use reqwest::StatusCode;

/// The promise: a revoked cookie is refused everywhere within this.
const WITHIN: Duration = Duration::from_secs(1);

/// Scans (sequential and index) of the sessions table so far, as Postgres
/// counts them. A backend reports its counts when it goes idle, but at most
/// once a second; otherwise up to `STATS_LAG` later.
fn sessions_scans(db: &TestDb) -> i64 {
    db.count(
        "SELECT (coalesce(seq_scan, 0) + coalesce(idx_scan, 0))::int8 AS n \
         FROM pg_stat_user_tables WHERE relname = 'sessions'",
    )
}

/// PGSTAT_IDLE_INTERVAL (10 s), and a margin.
const STATS_LAG: Duration = Duration::from_secs(11);

/// Another instance of the same shop: same database, same cookie key.
async fn second_instance(app: &TestApp, customize: impl FnOnce(&mut Settings)) -> TestApp {
    let key = app.settings.session_key.clone();
    spawn_app_on(TestDb::attach(&app.db.url), move |s| {
        s.session_key = key;
        customize(s);
    })
    .await
}

/// Signs up `email` in a browser whose cookie the test copies.
async fn signed_up_cookie(app: &TestApp, email: &str) -> (Browser, String) {
    let (browser, jar) = browser_with_jar(app);
    let signed_up = browser
        .sign_up_form(&[("email", email), ("password", PASSWORD)])
        .await;
    expect_redirect(&signed_up, "/welcome");
    let cookie = cookie_header(&jar, app);
    (browser, cookie)
}

/// Asks `path` with `cookie` until it is sent to the sign-in page; how long that took.
async fn until_refused(app: &TestApp, path: &str, cookie: &str) -> Duration {
    let since = Instant::now();
    loop {
        let response = get_with_cookie(app, path, cookie).await;
        if response.status() == StatusCode::SEE_OTHER
            && response.headers()["location"]
                .to_str()
                .unwrap()
                .starts_with("/login")
        {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < 3 * WITHIN,
            "{path} still answers {} to a revoked cookie",
            response.status()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signed_in_pages_read_nothing_from_the_sessions_table() {
    // The jobs run once at start-up; their purge must not run mid-measurement.
    let app = spawn_app_with(|s| s.jobs_interval = Duration::from_secs(3600)).await;
    let customer = app.customer("reader@example.com").await;

    const PAGES: usize = 400;
    let measured = Instant::now();
    let before = sessions_scans(&app.db);
    for n in 0..PAGES {
        let path = if n % 2 == 0 { "/orders" } else { "/" };
        let (status, page) = customer.get_text(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(page.contains("reader@example.com"), "signed in on {path}");
    }
    assert!(app.shop.revocations.is_fresh());
    tokio::time::sleep(STATS_LAG).await;
    let scans = sessions_scans(&app.db) - before;
    let elapsed = measured.elapsed();

    // Revocations arrive by notification, so nothing polls the table: the
    // scans that may land in the measurement are those of this instance's
    // whole life so far (the start-up read, the listener's whole read once
    // it listens, the jobs' one purge, the customer's sign-up), one spare.
    // A poller would add one per interval: about 90 here.
    assert!(app.shop.revocations.is_listening());
    let allowed = 5;
    eprintln!(
        "{scans} scans of sessions (at most {allowed} allowed) for {PAGES} pages in {elapsed:?}"
    );
    assert!(
        scans <= allowed,
        "{scans} scans of sessions for {PAGES} signed-in pages in {elapsed:?}; at most {allowed} without a poller"
    );
}

/// Committed plus rolled-back transactions of `db` so far, read from the
/// server's `postgres` database so that reading costs `db` nothing.
fn transactions(db: &TestDb) -> i64 {
    use diesel::prelude::*;
    let (server, name) = flashsale::db::split_database_url(&db.url).unwrap();
    let mut admin = diesel::PgConnection::establish(&format!("{server}/postgres")).unwrap();
    diesel::sql_query(
        "SELECT (xact_commit + xact_rollback)::int8 AS n FROM pg_stat_database WHERE datname = $1",
    )
    .bind::<diesel::sql_types::Text, _>(name)
    .get_result::<flashsale::qa::harness::Count>(&mut admin)
    .unwrap()
    .n
}

/// Until `instance` listens for revocations; panics after `within`.
async fn until_listening(instance: &TestApp, within: Duration) {
    let since = Instant::now();
    while !instance.shop.revocations.is_listening() {
        assert!(
            since.elapsed() < within,
            "not listening for revocations after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_shop_keeps_its_revocation_list_fresh_without_postgres_transactions() {
    // The jobs run once at start-up; reconcile not before a minute.
    let app = spawn_app_with(|s| s.jobs_interval = Duration::from_secs(3600)).await;
    until_listening(&app, Duration::from_secs(5)).await;
    // Start-up's transactions are all counted once its backends report.
    tokio::time::sleep(STATS_LAG).await;
    let before = transactions(&app.db);
    let idle = Instant::now();
    while idle.elapsed() < Duration::from_secs(4) {
        assert!(
            app.shop.revocations.is_fresh(),
            "the revocation list went stale while idle"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(STATS_LAG).await;
    let spent = transactions(&app.db) - before;
    let polls = (idle.elapsed().as_millis()
        / app.settings.security.session_poll_interval.as_millis()) as i64;
    eprintln!(
        "{spent} transactions in {:?} idle (a poller: {polls})",
        idle.elapsed()
    );
    assert!(
        spent <= 1,
        "{spent} Postgres transactions in {:?} of an idle shop",
        idle.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_listener_is_replaced_and_revocations_still_reach_every_instance_within_a_second() {
    let a = spawn_app().await;
    let b = second_instance(&a, |_| {}).await;
    until_listening(&a, Duration::from_secs(5)).await;
    until_listening(&b, Duration::from_secs(5)).await;
    let (first, first_cookie) = signed_up_cookie(&a, "cut-off@example.com").await;
    let (second, second_cookie) = signed_up_cookie(&a, "reconnected@example.com").await;

    // Both instances' listening connections cut, as a Postgres restart would.
    let cut = a.db.count(
        "SELECT count(pg_terminate_backend(pid))::int8 AS n FROM pg_stat_activity \
         WHERE datname = current_database() AND application_name = 'flashsale revocation listener'",
    );
    assert_eq!(cut, 2, "one listener per instance");
    expect_redirect(&first.post_form("/logout", &[]).await, "/");
    let there = until_refused(&b, "/orders", &first_cookie).await;
    assert!(there < WITHIN, "refused after {there:?} without a listener");

    // Listening again after a few seconds of polling; notified as before.
    until_listening(&b, Duration::from_secs(10)).await;
    expect_redirect(&second.post_form("/logout", &[]).await, "/");
    let there = until_refused(&b, "/orders", &second_cookie).await;
    assert!(
        there < WITHIN,
        "refused after {there:?} once listening again"
    );
    assert!(b.shop.revocations.is_fresh() && b.shop.revocations.is_listening());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sign_out_on_one_instance_refuses_the_copied_cookie_on_another_within_a_second() {
    let a = spawn_app().await;
    let b = second_instance(&a, |_| {}).await;
    let (browser, copied) = signed_up_cookie(&a, "roaming@example.com").await;
    assert_eq!(
        get_with_cookie(&b, "/orders", &copied).await.status(),
        StatusCode::OK,
        "the cookie works on the other instance too"
    );
    // Told by its listener, not found by a poll while the listener is down.
    until_listening(&b, Duration::from_secs(5)).await;

    expect_redirect(&browser.post_form("/logout", &[]).await, "/");
    // Where it signed out, at once; on the other instance by its next poll.
    let here = until_refused(&a, "/orders", &copied).await;
    let there = until_refused(&b, "/orders", &copied).await;
    eprintln!("refused after {here:?} here, {there:?} on the other instance");
    assert!(
        here < Duration::from_millis(100),
        "{here:?} on the same instance"
    );
    assert!(
        there < WITHIN,
        "refused on the other instance after {there:?}"
    );
    let page = get_with_cookie(&b, "/", &copied)
        .await
        .text()
        .await
        .unwrap();
    assert!(!page.contains("roaming@example.com"), "{page}");
    // Refused by its list, not by asking the table because the list was stale.
    assert!(b.shop.revocations.is_fresh());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_instance_knows_sessions_revoked_before_it_started() {
    let a = spawn_app().await;
    let (browser, copied) = signed_up_cookie(&a, "before@example.com").await;
    expect_redirect(&browser.post_form("/logout", &[]).await, "/");
    // The purge keeps a revoked session's row while its cookie is unexpired.
    flashsale::services::jobs::run_once(&a.shop).await.unwrap();

    // It polls only at start-up, and answers within the second that poll is trusted.
    let b = second_instance(&a, |s| {
        s.security.session_poll_interval = Duration::from_secs(3600)
    })
    .await;
    expect_sign_in(&get_with_cookie(&b, "/orders", &copied).await);
    assert!(
        b.shop.revocations.is_fresh(),
        "refused by the start-up load, not by the table"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoked_cookie_is_refused_while_the_revocation_list_is_stale() {
    // After the start-up poll, none: a second later the list proves nothing.
    let app =
        spawn_app_with(|s| s.security.session_poll_interval = Duration::from_secs(3600)).await;
    let (_browser, copied) = signed_up_cookie(&app, "stale@example.com").await;
    let stale_by = Instant::now() + WITHIN + Duration::from_millis(100);
    tokio::time::sleep_until(stale_by.into()).await;
    assert!(!app.shop.revocations.is_fresh());

    let before = sessions_scans(&app.db);
    assert_eq!(
        get_with_cookie(&app, "/orders", &copied).await.status(),
        StatusCode::OK,
        "a live cookie still works, checked against the table"
    );
    // Revoked by hand, as an operator would: no poller will tell this instance.
    assert_eq!(
        app.db.count(
            "WITH revoked AS (UPDATE sessions SET revoked_at = now() RETURNING 1) \
             SELECT count(*) AS n FROM revoked"
        ),
        1
    );
    expect_sign_in(&get_with_cookie(&app, "/orders", &copied).await);
    tokio::time::sleep(STATS_LAG).await;
    assert!(
        sessions_scans(&app.db) - before >= 2,
        "each of the two pages asked the sessions table"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_role_change_applies_at_once_on_every_instance() {
    let a = spawn_app().await;
    let b = second_instance(&a, |_| {}).await;
    ensure_admin(
        &a.shop.pool,
        Email::parse("boss@example.com").unwrap(),
        Password::parse(PASSWORD).unwrap(),
    )
    .await
    .unwrap();
    let (browser, jar) = browser_with_jar(&a);
    let signed_in = browser
        .post_form(
            "/login",
            &[("email", "boss@example.com"), ("password", PASSWORD)],
        )
        .await;
    expect_redirect(&signed_in, "/admin");
    let admin = cookie_header(&jar, &a);
    for instance in [&a, &b] {
        assert_eq!(
            get_with_cookie(instance, "/admin", &admin).await.status(),
            StatusCode::OK
        );
    }

    // Demoted by hand: the shop has no page for it.
    a.db.count(
        "WITH changed AS (UPDATE customers SET role = 'customer' \
         WHERE email = 'boss@example.com' RETURNING 1) SELECT count(*) AS n FROM changed",
    );
    for instance in [&a, &b] {
        let took = until_refused(instance, "/admin", &admin).await;
        assert!(took < WITHIN, "the admin cookie still worked for {took:?}");
        assert!(instance.shop.revocations.is_fresh());
    }
    // Signed in again, the account is what the table says now.
    let demoted = Browser::sign_in(&b.address, "boss@example.com", PASSWORD).await;
    expect_page(
        demoted.get("/admin").await,
        StatusCode::FORBIDDEN,
        "administrators only",
    )
    .await;

    // Promoted through the shop's own command: the customer's cookie is refused too.
    let (_, customer) = signed_up_cookie(&a, "rising@example.com").await;
    assert_eq!(
        get_with_cookie(&b, "/admin", &customer).await.status(),
        StatusCode::FORBIDDEN
    );
    ensure_admin(
        &a.shop.pool,
        Email::parse("rising@example.com").unwrap(),
        Password::parse(PASSWORD).unwrap(),
    )
    .await
    .unwrap();
    poll_revocations(&b.shop).await.unwrap();
    expect_sign_in(&get_with_cookie(&b, "/admin", &customer).await);
    let promoted = Browser::sign_in(&b.address, "rising@example.com", PASSWORD).await;
    assert_eq!(promoted.get("/admin").await.status(), StatusCode::OK);
    // Setting the same role again (a password reset) leaves sessions alone.
    ensure_admin(
        &a.shop.pool,
        Email::parse("rising@example.com").unwrap(),
        Password::parse(PASSWORD).unwrap(),
    )
    .await
    .unwrap();
    poll_revocations(&b.shop).await.unwrap();
    assert_eq!(promoted.get("/admin").await.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_account_signs_in_no_one() {
    let app = spawn_app().await;
    let (_, copied) = signed_up_cookie(&app, "leaving@example.com").await;
    assert_eq!(
        get_with_cookie(&app, "/orders", &copied).await.status(),
        StatusCode::OK
    );

    app.db.count(
        "WITH gone AS (DELETE FROM customers WHERE email = 'leaving@example.com' RETURNING 1) \
         SELECT count(*) AS n FROM gone",
    );
    let took = until_refused(&app, "/orders", &copied).await;
    assert!(
        took < WITHIN,
        "the deleted account's cookie worked for {took:?}"
    );
    // Its session stays, detached and revoked, until it expires.
    assert_eq!(
        app.db.count(
            "SELECT count(*) AS n FROM sessions \
             WHERE customer_id IS NULL AND revoked_at IS NOT NULL"
        ),
        1
    );
}

/// A cookie as the shop wrote it before cookies carried their session's
/// expiry: the token and the account only, sealed with the shop's key.
fn cookie_without_expiry(app: &TestApp, token: &str, account: serde_json::Value) -> String {
    use actix_web::cookie::{Cookie, CookieJar, Key};
    let state: std::collections::HashMap<&str, String> = [
        ("session_token", serde_json::to_string(token).unwrap()),
        ("account", account.to_string()),
    ]
    .into();
    let mut jar = CookieJar::new();
    jar.private_mut(&Key::from(&app.settings.session_key))
        .add(Cookie::new(
            "flashsale_session",
            serde_json::to_string(&state).unwrap(),
        ));
    format!(
        "flashsale_session={}",
        jar.get("flashsale_session").unwrap().value()
    )
}

/// What a session cookie holds, opened with the shop's key.
fn sealed_state(app: &TestApp, cookie: &str) -> std::collections::HashMap<String, String> {
    use actix_web::cookie::{Cookie, CookieJar, Key};
    // Set-Cookie percent-encodes the sealed value.
    let sealed = Cookie::parse_encoded(cookie.to_string()).unwrap();
    let name = sealed.name().to_string();
    let mut jar = CookieJar::new();
    jar.add_original(sealed);
    let opened = jar
        .private(&Key::from(&app.settings.session_key))
        .get(&name)
        .expect("a cookie sealed with the shop's key");
    serde_json::from_str(opened.value()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cookie_from_before_the_expiry_was_kept_in_it_still_signs_in_until_revoked() {
    let app = spawn_app().await;
    let account = flashsale::services::accounts::sign_up(
        &app.shop.pool,
        Email::parse("veteran@example.com").unwrap(),
        Password::parse(PASSWORD).unwrap(),
        flashsale::domain::Role::Customer,
    )
    .await
    .unwrap();
    let (token, _) = flashsale::services::sessions::start(
        &app.shop.pool,
        account.id,
        app.settings.security.session_ttl,
    )
    .await
    .unwrap();
    let old = cookie_without_expiry(
        &app,
        token.as_str(),
        serde_json::json!({"id": account.id.get(), "email": "veteran@example.com", "role": "customer"}),
    );

    // Checked against the table once, and given its expiry for next time.
    let first = get_with_cookie(&app, "/orders", &old).await;
    assert_eq!(first.status(), StatusCode::OK);
    let upgraded = first
        .headers()
        .get("set-cookie")
        .expect("the cookie is rewritten with its expiry")
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let expires = sealed_state(&app, &upgraded)["session_expires"].clone();
    assert_eq!(
        expires.parse::<i64>().unwrap(),
        app.db
            .count("SELECT (extract(epoch FROM expires_at) * 1000000)::int8 AS n FROM sessions"),
        "the rewritten cookie carries the session's expiry"
    );
    let again = get_with_cookie(&app, "/orders", &upgraded).await;
    assert_eq!(again.status(), StatusCode::OK);
    assert!(
        again.headers().get("set-cookie").is_none(),
        "an upgraded cookie is not rewritten again"
    );

    app.db.count(
        "WITH revoked AS (UPDATE sessions SET revoked_at = now() RETURNING 1) \
         SELECT count(*) AS n FROM revoked",
    );
    poll_revocations(&app.shop).await.unwrap();
    for cookie in [&old, &upgraded] {
        expect_sign_in(&get_with_cookie(&app, "/orders", cookie).await);
    }
}

/// A revocation whose transaction was open longer than the polls look back
/// (a hand edit left open, say) commits with an old `revoked_at`: the
/// periodic full read still finds it, within seconds of its commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revocation_committed_long_after_it_began_is_still_found() {
    let app = spawn_app().await;
    let (_browser, copied) = signed_up_cookie(&app, "late-commit@example.com").await;
    assert_eq!(
        get_with_cookie(&app, "/orders", &copied).await.status(),
        StatusCode::OK
    );
    // As a transaction that began an hour ago and commits now would leave it.
    assert_eq!(
        app.db.count(
            "WITH revoked AS (UPDATE sessions SET revoked_at = now() - interval '1 hour' RETURNING 1) \
             SELECT count(*) AS n FROM revoked"
        ),
        1
    );
    let started = Instant::now();
    loop {
        let response = get_with_cookie(&app, "/orders", &copied).await;
        if response.status() == StatusCode::SEE_OTHER {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(7),
            "the late revocation was never found"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("refused {:?} after the late commit", started.elapsed());
    assert!(app.shop.revocations.is_fresh(), "refused by the list");
}

/// Each worker keeps the cookies it opened (`web::session_cookie`): a kept
/// copy must never answer for a cookie that differs from it, however
/// slightly, nor outlive the session's sign-out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_altered_copy_of_a_served_cookie_signs_in_no_one() {
    let app = spawn_app().await;
    let (browser, cookie) = signed_up_cookie(&app, "kept@example.com").await;
    for _ in 0..20 {
        assert_eq!(
            get_with_cookie(&app, "/orders", &cookie).await.status(),
            StatusCode::OK
        );
    }
    let value_starts = "flashsale_session=".len();
    let mut altered = Vec::new();
    for at in [value_starts + 5, cookie.len() / 2, cookie.len() - 5] {
        let mut bytes = cookie.clone().into_bytes();
        bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
        altered.push(String::from_utf8(bytes).unwrap());
    }
    altered.push(cookie[..cookie.len() - 1].to_string());
    altered.push(format!("{cookie}A"));
    for forged in &altered {
        let refused = get_with_cookie(&app, "/orders", forged).await;
        assert_eq!(refused.status(), StatusCode::SEE_OTHER, "{forged}");
        assert_eq!(refused.headers()["location"], "/login?next=%2Forders");
        let page = get_with_cookie(&app, "/", forged)
            .await
            .text()
            .await
            .unwrap();
        assert!(!page.contains("kept@example.com"), "{forged}: {page}");
    }
    assert_eq!(
        get_with_cookie(&app, "/orders", &cookie).await.status(),
        StatusCode::OK,
        "the real cookie still works"
    );

    let signed_out = browser.post_form("/logout", &[]).await;
    expect_redirect(&signed_out, "/");
    let removal = signed_out
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .find(|v| v.starts_with("flashsale_session="))
        .expect("signing out removes the cookie");
    assert!(removal.contains("Max-Age=0"), "{removal}");
    until_refused(&app, "/orders", &cookie).await;
}
