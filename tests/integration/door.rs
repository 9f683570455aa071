//! Issue #41, the door: sign-up and each waiting room's join take a solved
//! ALTCHA check of the size the admin set, each solution works once, and
//! one client address gets its limit and no more, exactly, however many
//! requests race. The admin sees what the door let through and turned
//! away. Everything through the real server; the shop is set up as a real
//! one is (these tests do not use the suite's one-try door).

use std::time::{Duration as StdDuration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use chrono::Duration;
use reqwest::StatusCode;

use crate::helpers::*;
use crate::waiting_room_pages::queue_sale;
use flashsale::config::{DoorSettings, Settings, TrustedProxies};
use flashsale::services::door::{DoorKeys, ROUNDS_PER_TRY};

/// The door as a real shop has it, with `per_address` for both limits.
fn real_door(per_address: u32) -> impl FnOnce(&mut Settings) {
    move |settings: &mut Settings| {
        settings.security.door = DoorSettings {
            signup_work: 2_000,
            join_work: 2_000,
            signups_per_address: per_address,
            joins_per_address: per_address,
            window: StdDuration::from_secs(3600),
        };
    }
}

fn customers(app: &TestApp) -> i64 {
    app.db.count("SELECT count(*) AS n FROM customers")
}

fn entries(app: &TestApp, product: i64) -> i64 {
    app.db.count(&format!(
        "SELECT count(*) AS n FROM queue_entries WHERE product_id = {product}"
    ))
}

fn door_rows(app: &TestApp) -> (i64, i64) {
    (
        app.db.count("SELECT count(*) AS n FROM door_passes"),
        app.db.count("SELECT count(*) AS n FROM spent_challenges"),
    )
}

/// A challenge as the shop hands it out, solved: (field value, counter found).
async fn solved(who: &Browser, sale: Option<i64>) -> (String, u32) {
    let path = match sale {
        Some(sale) => format!("/door/challenge?sale={sale}"),
        None => "/door/challenge".into(),
    };
    let response = who.get(&path).await;
    assert_eq!(response.status(), StatusCode::OK, "GET {path}");
    assert_eq!(response.headers()["cache-control"], "no-store");
    let challenge: altcha::Challenge =
        serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(challenge.parameters.algorithm, "PBKDF2/SHA-256");
    assert_eq!(challenge.parameters.cost, ROUNDS_PER_TRY);
    let solution = altcha::solve_challenge(altcha::SolveChallengeOptions::new(&challenge))
        .unwrap()
        .expect("solved");
    let counter = solution.counter;
    (encode(challenge, solution), counter)
}

fn encode(challenge: altcha::Challenge, solution: altcha::Solution) -> String {
    let payload = serde_json::to_vec(&altcha::Payload {
        challenge,
        solution,
    })
    .unwrap();
    base64::engine::general_purpose::STANDARD.encode(payload)
}

async fn sign_up(who: &Browser, email: &str, bot_check: &str) -> reqwest::Response {
    who.post_form(
        "/signup",
        &[
            ("email", email),
            ("password", PASSWORD),
            ("altcha", bot_check),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signing_up_takes_a_solved_check_and_each_check_works_once() {
    let app = spawn_app_with(real_door(100)).await;
    let visitor = app.browser();
    let (status, page) = visitor.get_text("/signup").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains(r#"<altcha-widget name="altcha" challenge="/door/challenge""#),
        "{page}"
    );
    // Without JavaScript the page says what is needed.
    assert!(page.contains("This form needs JavaScript"), "{page}");
    // The widget comes from the shop itself.
    let script = flashsale::web::assets::bot_check_script_url();
    assert!(page.contains(script), "{page}");
    assert_eq!(visitor.get(script).await.status(), StatusCode::OK);

    // Sent without solving (no JavaScript): nothing written.
    expect_page(
        sign_up(&visitor, "nojs@example.com", "").await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "solves a small puzzle before this form can be sent",
    )
    .await;
    // A forged answer: a real challenge with a made-up derived key.
    let (honest, _) = solved(&visitor, None).await;
    let mut payload: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(&honest)
            .unwrap(),
    )
    .unwrap();
    payload["solution"]["derivedKey"] = "00".repeat(32).into();
    let forged = base64::engine::general_purpose::STANDARD.encode(payload.to_string());
    expect_page(
        sign_up(&visitor, "forged@example.com", &forged).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "not one this shop can accept",
    )
    .await;
    // Garbage in the field.
    expect_page(
        sign_up(&visitor, "junk@example.com", "not base64 at all ✓").await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "not one this shop can accept",
    )
    .await;
    // A challenge signed by the shop but past its ten minutes.
    let expired = {
        let keys_secret = |purpose: &[u8]| {
            use hmac::Mac;
            let mut mac =
                hmac::Hmac::<sha2::Sha256>::new_from_slice(&app.settings.session_key).unwrap();
            mac.update(purpose);
            hex::encode(mac.finalize().into_bytes())
        };
        let challenge = altcha::create_challenge(altcha::CreateChallengeOptions {
            algorithm: "PBKDF2/SHA-256".into(),
            cost: ROUNDS_PER_TRY,
            counter: Some(3),
            data: Some([("door".to_string(), serde_json::Value::from("signup"))].into()),
            expires_at: Some(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_secs()
                    - 1,
            ),
            hmac_signature_secret: Some(keys_secret(b"flashsale door challenge")),
            hmac_key_signature_secret: Some(keys_secret(b"flashsale door solution")),
            ..Default::default()
        })
        .unwrap();
        let solution = altcha::solve_challenge(altcha::SolveChallengeOptions::new(&challenge))
            .unwrap()
            .unwrap();
        encode(challenge, solution)
    };
    let _ = DoorKeys::derive(&app.settings.session_key); // the shop derives the same secrets
    expect_page(
        sign_up(&visitor, "late@example.com", &expired).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "this one ran out",
    )
    .await;
    assert_eq!(customers(&app), 0);
    assert_eq!(door_rows(&app), (0, 0));

    // Solved: through, once.
    expect_redirect(
        &sign_up(&visitor, "first@example.com", &honest).await,
        "/welcome",
    );
    assert_eq!(customers(&app), 1);
    assert_eq!(door_rows(&app), (1, 1));
    let second = app.browser();
    expect_page(
        sign_up(&second, "second@example.com", &honest).await,
        StatusCode::CONFLICT,
        "already used",
    )
    .await;
    assert_eq!(customers(&app), 1);
    assert_eq!(door_rows(&app), (1, 1));

    // A taken address with a fresh check: refused, and the check is not spent.
    let (fresh, _) = solved(&second, None).await;
    expect_page(
        sign_up(&second, "FIRST@example.com", &fresh).await,
        StatusCode::CONFLICT,
        "already exists",
    )
    .await;
    assert_eq!(door_rows(&app), (1, 1));
    expect_redirect(
        &sign_up(&second, "second@example.com", &fresh).await,
        "/welcome",
    );
    assert_eq!(customers(&app), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn joining_takes_the_check_of_that_sale_at_the_size_its_admin_set() {
    let app = spawn_app_with(real_door(100)).await;
    let admin = app.admin().await;
    let (status, form) = admin.get_text("/admin/products/new").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        form.contains(r#"name="join_check_work" inputmode="numeric" value="2000""#),
        "{form}"
    );

    let room = queue_sale(&app, 5, 1, Duration::minutes(10), None).await;
    let other = queue_sale(&app, 5, 1, Duration::minutes(10), None).await;
    // The admin sets this sale's check to 6,000 tries; the edit is logged.
    let (_, edit) = admin
        .get_text(&format!("/admin/products/{room}/edit"))
        .await;
    assert!(
        edit.contains(r#"name="join_check_work" inputmode="numeric" value="1""#),
        "{edit}"
    );
    let fields = sale_form_fields(&edit, &[("join_check_work", "6,000")]);
    let fields: Vec<(&str, &str)> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let saved = admin
        .post_form(&format!("/admin/products/{room}/edit"), &fields)
        .await;
    assert_eq!(
        saved.status(),
        StatusCode::SEE_OTHER,
        "{}",
        saved.text().await.unwrap()
    );
    assert_eq!(
        app.db.count(&format!(
            "SELECT join_check_work::bigint AS n FROM products WHERE id = {room}"
        )),
        6_000
    );
    assert_eq!(
        app.db.count("SELECT count(*) AS n FROM admin_actions WHERE detail LIKE '%bot check 1 → 6000 tries%'"),
        1
    );
    let out_of_range = sale_form_fields(&edit, &[("join_check_work", "0")]);
    let out_of_range: Vec<(&str, &str)> = out_of_range
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    expect_page(
        admin
            .post_form(&format!("/admin/products/{room}/edit"), &out_of_range)
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "between 1 and 1000000",
    )
    .await;
    // The sale list's cache is at most a second old.
    tokio::time::sleep(StdDuration::from_millis(1_100)).await;

    let waiter = app.customer("waiter@example.com").await;
    let (page_status, page) = waiter.get_text(&format!("/products/{room}/queue")).await;
    assert_eq!(page_status, StatusCode::OK);
    assert!(
        page.contains(&format!(r#"challenge="/door/challenge?sale={room}""#)),
        "{page}"
    );
    let join = |who: &Browser, check: String| {
        let who = who.clone();
        async move {
            who.post_form(&format!("/products/{room}/queue"), &[("altcha", &check)])
                .await
        }
    };
    expect_page(
        join(&waiter, String::new()).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "not finished",
    )
    .await;
    // Another door's checks do not open this one.
    let (for_other, _) = solved(&waiter, Some(other)).await;
    expect_page(
        join(&waiter, for_other).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "did not pass",
    )
    .await;
    let (for_signup, _) = solved(&waiter, None).await;
    expect_page(
        join(&waiter, for_signup).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "did not pass",
    )
    .await;
    assert_eq!(entries(&app, room), 0);

    // This sale's check is as big as the admin set: the answer is drawn
    // below twice its 6,000 tries (the other sale's 1-try check: below 2).
    let (check, tries) = solved(&waiter, Some(room)).await;
    assert!(tries < 12_000, "{tries} tries");
    let (_, one_try) = solved(&waiter, Some(other)).await;
    assert!(one_try < 2, "{one_try} tries");
    expect_redirect(
        &join(&waiter, check.clone()).await,
        &format!("/products/{room}/queue"),
    );
    assert_eq!(entries(&app, room), 1);
    // Once only: another customer cannot use it.
    let second = app.customer("second@example.com").await;
    let spent = door_rows(&app);
    expect_page(
        join(&second, check).await,
        StatusCode::CONFLICT,
        "already used",
    )
    .await;
    assert_eq!((entries(&app, room), door_rows(&app)), (1, spent));
    // Joining again keeps the place and costs nothing at the door.
    expect_redirect(
        &join(&waiter, String::new()).await,
        &format!("/products/{room}/queue"),
    );
    assert_eq!((entries(&app, room), door_rows(&app)), (1, spent));
    // An address not yet confirmed gets no place, and spends nothing.
    let newcomer = Browser::sign_up(&app.address, "newcomer@example.com").await;
    let (check, _) = solved(&newcomer, Some(room)).await;
    let spent = door_rows(&app);
    expect_page(
        join(&newcomer, check.clone()).await,
        StatusCode::FORBIDDEN,
        "Confirm your email address first",
    )
    .await;
    assert_eq!((entries(&app, room), door_rows(&app)), (1, spent));
    app.confirm("newcomer@example.com");
    expect_redirect(
        &join(&newcomer, check).await,
        &format!("/products/{room}/queue"),
    );
    assert_eq!(entries(&app, room), 2);
    // A sale without a waiting room hands out no check.
    let open = app.product(3, None).await;
    assert_eq!(
        waiter
            .get(&format!("/door/challenge?sale={open}"))
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    let (_, spent_before) = door_rows(&app);
    expect_page(
        join_at(&waiter, open).await,
        StatusCode::CONFLICT,
        "has no waiting room",
    )
    .await;
    assert_eq!(
        door_rows(&app).1,
        spent_before,
        "a join refused for the sale's sake spends nothing"
    );
}

/// The door is passed in the transaction that writes the place, so a join
/// that gets no place (here: the room is not open yet) spends neither the
/// solution nor one of the address's joins; once the room opens, the same
/// solution gets the place, and is spent once across the room's first-join
/// retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_that_gets_no_place_spends_nothing_at_the_door() {
    let app = spawn_app_with(real_door(100)).await;
    let later = queue_sale(&app, 5, 1, Duration::hours(2), Some(Duration::minutes(15))).await;
    let waiter = app.customer("early@example.com").await;
    let (check, _) = solved(&waiter, Some(later)).await;
    let path = format!("/products/{later}/queue");
    let fields = [("altcha", check.as_str())];
    let join = || waiter.post_form(&path, &fields);
    // (Signing up passed the sign-up door.)
    let (passes, spent) = door_rows(&app);
    expect_page(
        join().await,
        StatusCode::CONFLICT,
        "The waiting room is not open yet",
    )
    .await;
    assert_eq!(
        (entries(&app, later), door_rows(&app)),
        (0, (passes, spent))
    );

    app.db.count(&format!(
        "WITH u AS (UPDATE products SET queue_opens_at = now() - interval '1 minute' \
         WHERE id = {later} RETURNING 1) SELECT count(*) AS n FROM u"
    ));
    flashsale::services::sale_cache::invalidate();
    expect_redirect(&join().await, &format!("/products/{later}/queue"));
    assert_eq!(
        (entries(&app, later), door_rows(&app)),
        (1, (passes + 1, spent + 1))
    );
}

async fn join_at(who: &Browser, product: i64) -> reqwest::Response {
    who.join_waiting_room(product).await
}

/// The edit form's fields as the page fills them, with `changes`.
fn sale_form_fields(page: &str, changes: &[(&str, &str)]) -> Vec<(String, String)> {
    let field =
        regex::Regex::new(r#"<input id="(\w+)" name="(\w+)"[^>]*?value="([^"]*)""#).unwrap();
    let mut fields: Vec<(String, String)> = field
        .captures_iter(page)
        .filter(|c| &c[2] != "queue_mode" && &c[2] != "csrf_token")
        .map(|c| (c[2].to_string(), html_unescape(&c[3])))
        .collect();
    if page.contains(r#"value="on" checked"#) {
        fields.push(("queue_mode".into(), "on".into()));
    }
    let description = page
        .split(r#"name="description""#)
        .nth(1)
        .and_then(|rest| rest.split_once('>'))
        .and_then(|(_, rest)| rest.split_once("</textarea>"))
        .map(|(text, _)| html_unescape(text))
        .unwrap_or_default();
    fields.push(("description".into(), description));
    for (name, value) in changes {
        fields.retain(|(k, _)| k != name);
        fields.push((name.to_string(), value.to_string()));
    }
    fields
}

fn html_unescape(text: &str) -> String {
    text.replace("&#x27;", "'")
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_address_gets_its_limit_and_no_more_however_many_race() {
    let app = spawn_app_with(|settings| {
        real_door(3)(settings);
        settings.security.trusted_proxies = TrustedProxies::parse("127.0.0.1").unwrap();
    })
    .await;
    // Eight sign-ups from one address at once, each with its own solved check.
    let visitors: Vec<Browser> = (0..8).map(|_| app.browser()).collect();
    let mut checks = Vec::new();
    for visitor in &visitors {
        checks.push(solved(visitor, None).await.0);
    }
    let attempts = visitors
        .iter()
        .zip(&checks)
        .enumerate()
        .map(|(i, (who, check))| async move {
            sign_up(who, &format!("racer{i}@example.com"), check).await
        });
    let answers = futures::future::join_all(attempts).await;
    let statuses: Vec<StatusCode> = answers.iter().map(|r| r.status()).collect();
    assert_eq!(
        tally(&statuses),
        [(303, 3), (429, 5)].into(),
        "{statuses:?}"
    );
    for refused in answers
        .iter()
        .filter(|r| r.status() == StatusCode::TOO_MANY_REQUESTS)
    {
        let wait: u64 = refused.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((3_000..=3_600).contains(&wait), "Retry-After {wait}");
    }
    assert_eq!(customers(&app), 3);
    assert_eq!(door_rows(&app), (3, 3));
    let refused = answers
        .into_iter()
        .find(|r| r.status() == StatusCode::TOO_MANY_REQUESTS)
        .unwrap();
    assert!(refused
        .text()
        .await
        .unwrap()
        .contains("Too many accounts were created from your network"));

    // Another client behind the trusted proxy is another address.
    let behind_proxy = app.browser();
    let (check, _) = solved(&behind_proxy, None).await;
    let token = behind_proxy.csrf().await;
    let response = behind_proxy
        .web
        .client
        .post(format!("{}/signup", app.address))
        .header("X-Forwarded-For", "203.0.113.9")
        .form(&[
            ("email", "elsewhere@example.com"),
            ("password", PASSWORD),
            ("altcha", &check),
            ("csrf_token", &token),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(customers(&app), 4);
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM door_passes WHERE client_ip = '203.0.113.9'"),
        1
    );

    // Joins: the same limit per sale, also when they race.
    let room = queue_sale(&app, 5, 1, Duration::minutes(10), None).await;
    // Their accounts come from elsewhere (this address's sign-ups are spent).
    let mut joiners = Vec::new();
    for i in 0..6 {
        let email = format!("joiner{i}@example.com");
        flashsale::services::accounts::sign_up(
            &app.shop.pool,
            flashsale::domain::Email::parse(&email).unwrap(),
            flashsale::domain::Password::parse(PASSWORD).unwrap(),
            flashsale::domain::Role::Customer,
        )
        .await
        .unwrap();
        app.confirm(&email);
        joiners.push(Browser::sign_in(&app.address, &email, PASSWORD).await);
    }
    let mut checks = Vec::new();
    for joiner in &joiners {
        checks.push(joiner.bot_check(room).await);
    }
    let joins = joiners.iter().zip(&checks).map(|(who, check)| async move {
        who.post_form(&format!("/products/{room}/queue"), &[("altcha", check)])
            .await
            .status()
    });
    let statuses = futures::future::join_all(joins).await;
    assert_eq!(
        tally(&statuses),
        [(303, 3), (429, 3)].into(),
        "{statuses:?}"
    );
    assert_eq!(entries(&app, room), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_sees_what_each_door_let_through_and_turned_away() {
    let app = spawn_app_with(real_door(2)).await;
    let room = queue_sale(&app, 5, 1, Duration::minutes(10), None).await;
    // Three sign-ups from one address: two through, one over the limit;
    // one more sent without solving.
    let mut through = Vec::new();
    for i in 0..3 {
        let who = app.browser();
        let (check, _) = solved(&who, None).await;
        let email = format!("door{i}@example.com");
        let answer = sign_up(&who, &email, &check).await;
        if answer.status() == StatusCode::SEE_OTHER {
            app.confirm(&email);
            through.push(who);
        }
    }
    assert_eq!(through.len(), 2);
    let _ = sign_up(&app.browser(), "nojs@example.com", "").await;
    // One joins; one sends a forged answer.
    expect_redirect(
        &through[0].join_waiting_room(room).await,
        &format!("/products/{room}/queue"),
    );
    let _ = through[1]
        .post_form(&format!("/products/{room}/queue"), &[("altcha", "eyJ9")])
        .await;

    let admin = app.admin().await;
    let (status, page) = admin.get_text("/admin/queues").await;
    assert_eq!(status, StatusCode::OK);
    let section = |key: &str| {
        page.split(&format!(r#"data-testid="door-{key}""#))
            .nth(1)
            .and_then(|rest| rest.split("</table>").next())
            .unwrap_or_else(|| panic!("no {key} door in {page}"))
            .to_string()
    };
    let signup = section("signup");
    // Three challenges were handed out for sign-up; the unsolved sign-up
    // and the forged join fetched none.
    assert!(
        signup.contains("Bot checks handed out</th><td>3<"),
        "{signup}"
    );
    assert!(
        signup.contains("Solved and let through</th><td>2<"),
        "{signup}"
    );
    assert!(
        signup.contains("Turned away: Too many from one address</th><td>1<"),
        "{signup}"
    );
    assert!(
        signup.contains("Turned away: Sent without solving the check</th><td>1<"),
        "{signup}"
    );
    let join = section("join");
    assert!(join.contains("Bot checks handed out</th><td>1<"), "{join}");
    assert!(join.contains("Solved and let through</th><td>1<"), "{join}");
    assert!(
        join.contains("Turned away: Wrong or forged answer</th><td>1<"),
        "{join}"
    );
    assert!(
        page.contains("Most from one address: 127.0.0.1 (2)"),
        "{page}"
    );
}

/// One request of the script's, from `address` (behind the shop's trusted
/// proxy, as a client on the internet is).
async fn post_from(
    who: &Browser,
    app: &TestApp,
    address: &str,
    path: &str,
    fields: &[(&str, &str)],
) -> StatusCode {
    let token = who.csrf().await;
    let mut fields = fields.to_vec();
    fields.push(("csrf_token", &token));
    who.web
        .client
        .post(format!("{}{path}", app.address))
        .header("X-Forwarded-For", address)
        .form(&fields)
        .send()
        .await
        .unwrap()
        .status()
}

/// Fetches and solves a check, timing the solving: the script's CPU.
async fn timed_check(who: &Browser, sale: Option<i64>) -> (String, StdDuration) {
    let path = match sale {
        Some(sale) => format!("/door/challenge?sale={sale}"),
        None => "/door/challenge".into(),
    };
    let challenge: altcha::Challenge =
        serde_json::from_str(&who.get(&path).await.text().await.unwrap()).unwrap();
    tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        let solution = altcha::solve_challenge(altcha::SolveChallengeOptions::new(&challenge))
            .unwrap()
            .unwrap();
        (encode(challenge, solution), started.elapsed())
    })
    .await
    .unwrap()
}

/// The scripted run the issue describes, repeated against the real door
/// with a real shop's settings: from one address, 200 accounts signed up,
/// confirmed from their links (the script reads the mailbox) and joined to
/// one waiting room, as fast as a script goes. Twice: 200 addresses on a
/// domain the script owns, then 200 `+tag` and dotted variants of one Gmail
/// address. It prints what each run got and the solving CPU per place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scripted_crowd_of_accounts_from_one_address_gets_almost_nothing() {
    let app = spawn_app_with(|settings| {
        settings.security.door = flashsale::config::SecuritySettings::default().door;
        settings.security.trusted_proxies = TrustedProxies::parse("127.0.0.1").unwrap();
    })
    .await;
    let room = queue_sale(&app, 100, 1, Duration::minutes(10), None).await;
    type Address = fn(usize) -> String;
    let runs: [(&str, &str, Address, i64); 2] = [
        (
            "200 addresses of the script's own domain",
            "198.51.100.7",
            |i| format!("bot{i}@bots.example"),
            10,
        ),
        (
            "200 variants of one Gmail address",
            "198.51.100.8",
            |i| {
                let dotted = if i % 2 == 0 { "s.cripter" } else { "scripter" };
                format!("{dotted}+drop{i}@gmail.com")
            },
            1,
        ),
    ];
    for (run, address, email_of, most) in runs {
        let mut cpu = StdDuration::ZERO;
        let mut made = Vec::new();
        let mut statuses = Vec::new();
        for i in 0..200 {
            let bot = app.browser();
            let (check, spent) = timed_check(&bot, None).await;
            cpu += spent;
            let email = email_of(i);
            let status = post_from(
                &bot,
                &app,
                address,
                "/signup",
                &[
                    ("email", &email),
                    ("password", PASSWORD),
                    ("altcha", &check),
                ],
            )
            .await;
            statuses.push(status);
            if status == StatusCode::SEE_OTHER {
                made.push((bot, email));
            }
        }
        let mut confirmed = 0;
        for (bot, email) in &made {
            let link = crate::mail::link_of(&app, email).await;
            if bot.get(&link).await.status() == StatusCode::OK {
                confirmed += 1;
            }
        }
        let mut joins = Vec::new();
        for (bot, _) in &made {
            let (check, spent) = timed_check(bot, Some(room)).await;
            cpu += spent;
            let path = format!("/products/{room}/queue");
            joins.push(post_from(bot, &app, address, &path, &[("altcha", &check)]).await);
        }
        let places =
            app.db.count(&format!(
            "SELECT count(*) AS n FROM queue_entries e JOIN customers c ON c.id = e.customer_id \
             WHERE e.product_id = {room} AND c.email IN ({})",
            made.iter().map(|(_, e)| format!("'{e}'")).collect::<Vec<_>>().join(",")
        ));
        println!(
            "door: {run} from {address}: sign-ups {:?}, {} accounts, {confirmed} confirmed, joins {:?}, {places} places; solving CPU {:.1} s in all, {:.1} s per place",
            tally(&statuses),
            made.len(),
            tally(&joins),
            cpu.as_secs_f64(),
            cpu.as_secs_f64() / places.max(1) as f64,
        );
        assert_eq!(made.len(), 10, "{run}: the address's sign-ups for the hour");
        assert_eq!(places, most, "{run}");
    }
}

/// The waiting room's writer lets a whole batch of newcomers through the
/// door in one go: each gets the answer they would get one at a time, in
/// the order they came, and only those let through count or spend.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_joins_gets_the_answers_one_at_a_time_would() {
    use diesel::Connection;
    use flashsale::domain::{CustomerId, ProductId};
    use flashsale::error::DoorRefusal;
    use flashsale::services::door::{Door, Doorkeeper, Visit};

    let app = spawn_app_with(|settings| {
        real_door(100)(settings);
        settings.security.door.joins_per_address = 2;
    })
    .await;
    let room = queue_sale(&app, 5, 1, Duration::minutes(10), None).await;
    let mut people = Vec::new();
    for i in 0..6 {
        let email = format!("batch{i}@example.com");
        let browser = match i {
            5 => app.unconfirmed_customer(&email).await,
            _ => app.customer(&email).await,
        };
        let id = app.db.count(&format!(
            "SELECT id AS n FROM customers WHERE email = '{email}'"
        ));
        let (check, _) = solved(&browser, Some(room)).await;
        people.push((CustomerId(id), check));
    }
    let (passes, spent) = door_rows(&app);
    let (a, b) = (
        "198.51.100.7".parse().unwrap(),
        "198.51.100.8".parse().unwrap(),
    );
    let door = Door::Join(ProductId(room));
    let keys = &app.shop.door_keys;
    // In this order: a pass; a replay of that solution; a second pass
    // (the address's limit); one over it; another address; unconfirmed.
    let visits = [
        (people[0].0, Visit::new(keys, door, &people[0].1, a)),
        (people[1].0, Visit::new(keys, door, &people[0].1, a)),
        (people[2].0, Visit::new(keys, door, &people[2].1, a)),
        (people[3].0, Visit::new(keys, door, &people[3].1, a)),
        (people[4].0, Visit::new(keys, door, &people[4].1, b)),
        (people[5].0, Visit::new(keys, door, &people[5].1, b)),
    ];
    let visitors: Vec<_> = visits.iter().map(|(c, v)| (*c, v)).collect();
    let doorkeeper = Doorkeeper::of(&app.shop);
    let mut conn = app.shop.pool.get().unwrap();
    let refused = conn
        .transaction(|conn| doorkeeper.let_join(conn, ProductId(room), &visitors))
        .unwrap();
    assert_eq!(refused.len(), 3, "{refused:?}");
    assert_eq!(refused[&people[1].0], DoorRefusal::Spent);
    assert!(
        matches!(refused[&people[3].0], DoorRefusal::TooMany { retry_after, .. }
            if (3_590..=3_600).contains(&retry_after.as_secs())),
        "{refused:?}"
    );
    assert_eq!(refused[&people[5].0], DoorRefusal::Unconfirmed);
    assert_eq!(door_rows(&app), (passes + 3, spent + 3));
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM door_passes WHERE door = 'join:{room}' AND client_ip = '198.51.100.7'"
        )),
        2
    );

    // The next batch counts what the first let through: the address is
    // full, and a solution spent there stays spent from anywhere.
    let (check, _) = solved(&app.customer("batch6@example.com").await, Some(room)).await;
    let late = CustomerId(
        app.db
            .count("SELECT id AS n FROM customers WHERE email = 'batch6@example.com'"),
    );
    // (Its sign-up went through the sign-up door.)
    let before = door_rows(&app);
    let visits = [
        (late, Visit::new(keys, door, &check, a)),
        (people[1].0, Visit::new(keys, door, &people[2].1, b)),
    ];
    let visitors: Vec<_> = visits.iter().map(|(c, v)| (*c, v)).collect();
    let refused = conn
        .transaction(|conn| doorkeeper.let_join(conn, ProductId(room), &visitors))
        .unwrap();
    // Counted from the rows the first batch wrote, a moment ago.
    assert!(
        matches!(refused[&late], DoorRefusal::TooMany { retry_after, .. }
            if (3_590..=3_600).contains(&retry_after.as_secs())),
        "{refused:?}"
    );
    assert_eq!(refused[&people[1].0], DoorRefusal::Spent);
    assert_eq!(door_rows(&app), before);
}
