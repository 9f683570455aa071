//! How an admin sets up and runs a sale in queue mode (issue #16): the
//! command line's `--queue`, the sale form's queue choice, edits that would
//! break a waiting room customers are in, and the waiting-room dashboard
//! with its pause and resume.

use std::process::Output;
use std::time::Duration;

use crate::helpers::*;
use crate::waiting_room_pages::{join, queue_json, state_is, wait_for};
use diesel::RunQueryDsl;
use reqwest::StatusCode;

/// `flashsale product create` against `db`, as an operator runs it.
fn product_create(db: &TestDb, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
        .args(["product", "create", "--name", "Drop", "--price", "25.00"])
        .args(["--stock", "100", "--starts-at", "2030-01-01T09:00:00Z"])
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

fn created_id(output: &Output) -> i64 {
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "product create failed: {printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    printed.trim().parse().unwrap()
}

fn refused(output: &Output, why: &str) {
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "accepted: {said}");
    assert!(said.contains(why), "expected {why:?} in: {said}");
}

fn sql(db: &TestDb, statement: &str) {
    diesel::sql_query(statement)
        .execute(&mut db.conn())
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

#[test]
fn the_command_line_creates_queue_mode_sales_and_refuses_bad_combinations() {
    let db = TestDb::new();

    let default_opening = created_id(&product_create(&db, &["--limit", "1", "--queue"]));
    assert_eq!(
        db.count(&format!("SELECT count(*) AS n FROM products WHERE id = {default_opening} AND queue_mode AND queue_opens_at IS NULL AND per_customer_limit = 1")),
        1,
        "--queue without an opening: queue mode, opening 15 minutes before the start"
    );
    let explicit = created_id(&product_create(
        &db,
        &[
            "--limit",
            "2",
            "--queue",
            "--queue-opens-at",
            "2030-01-01T08:30:00Z",
        ],
    ));
    assert_eq!(
        db.count(&format!("SELECT count(*) AS n FROM products WHERE id = {explicit} AND queue_mode AND queue_opens_at = '2030-01-01T08:30:00Z'")),
        1
    );
    let open = created_id(&product_create(&db, &[]));
    assert_eq!(
        db.count(&format!("SELECT count(*) AS n FROM products WHERE id = {open} AND NOT queue_mode AND queue_opens_at IS NULL")),
        1,
        "open mode stays the default"
    );

    refused(
        &product_create(&db, &["--queue"]),
        "queue mode needs a per-customer limit",
    );
    refused(
        &product_create(
            &db,
            &["--limit", "1", "--queue-opens-at", "2030-01-01T08:30:00Z"],
        ),
        "--queue",
    );
    refused(
        &product_create(
            &db,
            &[
                "--limit",
                "1",
                "--queue",
                "--queue-opens-at",
                "2030-01-01T09:00:01Z",
            ],
        ),
        "must open at or before the sale starts",
    );
    refused(
        &product_create(
            &db,
            &["--limit", "1", "--queue", "--queue-opens-at", "soon"],
        ),
        "queue-opens-at",
    );
    assert_eq!(
        db.count("SELECT count(*) AS n FROM products"),
        3,
        "refused commands write no row"
    );
}

fn queue_sale_form<'a>() -> Vec<(&'a str, &'a str)> {
    vec![
        ("name", "Console drop"),
        ("description", "One per customer"),
        ("price", "499.00"),
        ("stock", "100"),
        ("per_customer_limit", "1"),
        ("starts_at", "2030-01-01T09:00"),
        ("ends_at", ""),
        ("queue_mode", "on"),
        ("queue_opens_at", "2030-01-01T08:00"),
    ]
}

fn with<'a>(
    mut form: Vec<(&'a str, &'a str)>,
    key: &'a str,
    value: &'a str,
) -> Vec<(&'a str, &'a str)> {
    form.retain(|(k, _)| *k != key);
    form.push((key, value));
    form
}

fn without<'a>(mut form: Vec<(&'a str, &'a str)>, key: &str) -> Vec<(&'a str, &'a str)> {
    form.retain(|(k, _)| *k != key);
    form
}

fn id_from_saved(response: &reqwest::Response) -> i64 {
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    response.headers()["location"]
        .to_str()
        .unwrap()
        .trim_start_matches("/admin/products/")
        .trim_end_matches("/edit?saved=1")
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sale_form_creates_and_edits_a_queue_mode_sale() {
    let app = spawn_app().await;
    let admin = app.admin().await;

    let id = id_from_saved(&admin.post_form("/admin/products", &queue_sale_form()).await);
    assert_eq!(
        app.db.count(&format!("SELECT count(*) AS n FROM products WHERE id = {id} AND queue_mode AND queue_opens_at = '2030-01-01T08:00:00Z'")),
        1
    );
    let edit = format!("/admin/products/{id}/edit");
    let page = expect_page(
        admin.get(&format!("{edit}?saved=1")).await,
        StatusCode::OK,
        "Saved.",
    )
    .await;
    assert!(
        page.contains(r#"name="queue_mode" type="checkbox" value="on" checked"#),
        "{page}"
    );
    assert!(
        page.contains(r#"name="queue_opens_at" type="datetime-local" value="2030-01-01T08:00""#),
        "{page}"
    );
    assert!(
        page.contains(&format!(r#"href="/admin/queues#queue-{id}""#)),
        "{page}"
    );

    // The form as shown saves the same sale back.
    let shown = without(queue_sale_form(), "stock");
    expect_redirect(
        &admin.post_form(&edit, &shown).await,
        &format!("{edit}?saved=1"),
    );
    assert_eq!(
        app.db.count(&format!("SELECT count(*) AS n FROM products WHERE id = {id} AND queue_mode AND queue_opens_at = '2030-01-01T08:00:00Z' AND per_customer_limit = 1")),
        1
    );
    // An empty opening means the default; an unticked box, open mode.
    expect_redirect(
        &admin
            .post_form(&edit, &with(shown.clone(), "queue_opens_at", ""))
            .await,
        &format!("{edit}?saved=1"),
    );
    assert_eq!(
        app.db.count(&format!("SELECT count(*) AS n FROM products WHERE id = {id} AND queue_mode AND queue_opens_at IS NULL")),
        1
    );
    let page = expect_page(admin.get(&edit).await, StatusCode::OK, "Queue mode").await;
    assert!(
        page.contains(r#"name="queue_opens_at" type="datetime-local" value="""#),
        "{page}"
    );
    let unticked = without(without(shown.clone(), "queue_mode"), "queue_opens_at");
    expect_redirect(
        &admin.post_form(&edit, &unticked).await,
        &format!("{edit}?saved=1"),
    );
    assert_eq!(
        app.db.count(&format!("SELECT count(*) AS n FROM products WHERE id = {id} AND NOT queue_mode AND queue_opens_at IS NULL")),
        1
    );
    let page = expect_page(admin.get(&edit).await, StatusCode::OK, "Queue mode").await;
    assert!(
        page.contains(r#"name="queue_mode" type="checkbox" value="on" aria"#),
        "unticked: {page}"
    );
    assert_eq!(
        app.db.count(&format!("SELECT count(*) AS n FROM admin_actions WHERE product_id = {id} AND action = 'sale_edit' AND detail LIKE '%mode queue → open%'")),
        1,
        "the action log says the mode changed"
    );

    // Refused: said why, the form comes back as typed, nothing is saved.
    let products = app.db.count("SELECT count(*) AS n FROM products");
    for (form, why) in [
        (
            with(queue_sale_form(), "per_customer_limit", ""),
            "needs a per-customer limit",
        ),
        (
            with(queue_sale_form(), "queue_opens_at", "2030-01-01T09:01"),
            "must open at or before the sale starts",
        ),
        (
            without(queue_sale_form(), "queue_mode"),
            "only applies to a sale in queue mode",
        ),
        (
            with(queue_sale_form(), "queue_opens_at", "soon"),
            "waiting-room opening",
        ),
        (with(queue_sale_form(), "queue_mode", "perhaps"), "checkbox"),
    ] {
        let body = expect_page(
            admin.post_form("/admin/products", &form).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            why,
        )
        .await;
        assert!(body.contains("Nothing was saved"), "{body}");
    }
    assert_eq!(app.db.count("SELECT count(*) AS n FROM products"), products);
    let body = expect_page(
        admin
            .post_form(&edit, &with(shown.clone(), "per_customer_limit", ""))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "needs a per-customer limit",
    )
    .await;
    assert!(body.contains(r#"value="on" checked"#), "as typed: {body}");
    assert_eq!(
        app.db.count(&format!("SELECT count(*) AS n FROM products WHERE id = {id} AND NOT queue_mode AND per_customer_limit = 1")),
        1,
        "a refused edit changes nothing"
    );
}

/// A customer's id by email.
fn customer_id(db: &TestDb, email: &str) -> i64 {
    db.count(&format!(
        "SELECT id AS n FROM customers WHERE email = '{email}'"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn edits_cannot_break_a_waiting_room_customers_are_in() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    app.customer("early@example.com").await;
    let early = customer_id(&app.db, "early@example.com");
    let id = id_from_saved(&admin.post_form("/admin/products", &queue_sale_form()).await);
    let edit = format!("/admin/products/{id}/edit");
    let shown = without(queue_sale_form(), "stock");
    let unchanged = |db: &TestDb| {
        db.count(&format!("SELECT count(*) AS n FROM products WHERE id = {id} AND queue_mode AND queue_opens_at = '2030-01-01T08:00:00Z' AND sale_starts_at = '2030-01-01T09:00:00Z' AND per_customer_limit = 1"))
    };

    // A customer joined the pre-queue at 08:10 (the seed is committed, not drawn).
    sql(&app.db, &format!("INSERT INTO queue_draws (product_id, seed, seed_sha256) VALUES ({id}, decode(repeat('11', 32), 'hex'), decode(repeat('ab', 32), 'hex'))"));
    sql(&app.db, &format!("INSERT INTO queue_entries (product_id, customer_id, ticket, seq, joined_at, late) VALUES ({id}, {early}, '0123456789', 1, '2030-01-01T08:10:00Z', false)"));
    for (form, why) in [
        (
            without(without(shown.clone(), "queue_mode"), "queue_opens_at"),
            "cannot leave queue mode",
        ),
        (
            with(shown.clone(), "queue_opens_at", "2030-01-01T08:20"),
            "cannot open later than that",
        ),
        (
            with(shown.clone(), "starts_at", "2030-01-01T08:05"),
            "the start must stay after that",
        ),
    ] {
        let body = expect_page(
            admin.post_form(&edit, &form).await,
            StatusCode::CONFLICT,
            why,
        )
        .await;
        assert!(body.contains("Nothing was saved"), "{body}");
        assert_eq!(unchanged(&app.db), 1, "{why}: nothing changed");
    }
    // Before the draw, the start may still move later (and the limit change).
    let later = with(
        with(shown.clone(), "starts_at", "2030-01-01T10:00"),
        "per_customer_limit",
        "2",
    );
    expect_redirect(
        &admin.post_form(&edit, &later).await,
        &format!("{edit}?saved=1"),
    );
    assert_eq!(
        app.db.count(&format!("SELECT count(*) AS n FROM products WHERE id = {id} AND sale_starts_at = '2030-01-01T10:00:00Z' AND per_customer_limit = 2")),
        1
    );

    // Drawn: mode, start, opening and limit are fixed; the rest still edits.
    sql(
        &app.db,
        &format!(
            "UPDATE queue_draws SET frozen_at = '2030-01-01T10:00:00Z', \
             entries_sha256 = decode(repeat('cd', 32), 'hex'), last_position = 1, \
             drawn_at = '2030-01-01T10:00:00Z' WHERE product_id = {id}"
        ),
    );
    sql(
        &app.db,
        &format!("UPDATE queue_entries SET position = 1, drawn = true WHERE product_id = {id}"),
    );
    let drawn_unchanged = |db: &TestDb| {
        db.count(&format!("SELECT count(*) AS n FROM products WHERE id = {id} AND queue_mode AND queue_opens_at = '2030-01-01T08:00:00Z' AND sale_starts_at = '2030-01-01T10:00:00Z' AND per_customer_limit = 2"))
    };
    for (form, why) in [
        (
            without(without(later.clone(), "queue_mode"), "queue_opens_at"),
            "take the sale out of queue mode",
        ),
        (
            with(later.clone(), "starts_at", "2030-01-01T11:00"),
            "move the start",
        ),
        (
            with(later.clone(), "queue_opens_at", "2030-01-01T07:00"),
            "move the opening of the waiting room",
        ),
        (
            with(later.clone(), "per_customer_limit", "3"),
            "change the per-customer limit",
        ),
    ] {
        let body = expect_page(
            admin.post_form(&edit, &form).await,
            StatusCode::CONFLICT,
            why,
        )
        .await;
        assert!(body.contains("frozen for its draw"), "{body}");
        assert_eq!(drawn_unchanged(&app.db), 1, "{why}: nothing changed");
    }
    expect_redirect(
        &admin
            .post_form(&edit, &with(later.clone(), "name", "Console drop (2)"))
            .await,
        &format!("{edit}?saved=1"),
    );
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM products WHERE id = {id} AND name = 'Console drop (2)'"
        )),
        1
    );
    assert_eq!(drawn_unchanged(&app.db), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_waiting_room_dashboard_is_for_admins_only() {
    let app = spawn_app().await;
    let buyer = app.customer("shopper@example.com").await;
    let stranger = app.browser();
    let admin = app.admin().await;
    let id = id_from_saved(&admin.post_form("/admin/products", &queue_sale_form()).await);

    expect_sign_in(&stranger.get("/admin/queues").await);
    expect_page(
        buyer.get("/admin/queues").await,
        StatusCode::FORBIDDEN,
        "administrators only",
    )
    .await;
    for action in ["pause", "resume"] {
        let path = format!("/admin/products/{id}/queue/{action}");
        expect_sign_in(&stranger.post_form(&path, &[]).await);
        expect_page(
            buyer.post_form(&path, &[]).await,
            StatusCode::FORBIDDEN,
            "administrators only",
        )
        .await;
        expect_page(
            admin.post(&path, &[("csrf_token", "forged")]).await,
            StatusCode::FORBIDDEN,
            "form has expired",
        )
        .await;
    }
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM admin_actions WHERE action LIKE 'queue_%'"),
        0,
        "refused requests log nothing"
    );
    let nav = expect_page(admin.get("/admin").await, StatusCode::OK, "Dashboard").await;
    assert!(nav.contains(r#"href="/admin/queues""#), "{nav}");
}

/// The cells of a count's row on the dashboard (one: now).
fn cells(page: &str, key: &str) -> Vec<String> {
    let row = page
        .split(&format!(r#"data-testid="count-{key}""#))
        .nth(1)
        .and_then(|row| row.split("</tr>").next())
        .unwrap_or_else(|| panic!("no {key} row: {page}"));
    row.split("<td")
        .skip(1)
        .map(|cell| {
            let text = cell.split_once('>').unwrap().1;
            text.split("</td>").next().unwrap().trim().to_string()
        })
        .collect()
}

/// The panel of sale `id` on the dashboard.
async fn panel(admin: &Browser, id: i64, wanted: &str) -> String {
    let page = expect_page(admin.get("/admin/queues").await, StatusCode::OK, wanted).await;
    page.split(&format!(r#"data-testid="queue-{id}""#))
        .nth(1)
        .unwrap_or_else(|| panic!("no panel for sale {id}: {page}"))
        .split("</section>")
        .next()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dashboard_shows_what_postgres_recorded_and_the_draw() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let id = id_from_saved(&admin.post_form("/admin/products", &queue_sale_form()).await);
    let open_sale = app.product(5, None).await;
    let mut customers = Vec::new();
    for n in 0..4 {
        let email = format!("waiter{n}@example.com");
        app.customer(&email).await;
        customers.push(customer_id(&app.db, &email));
    }
    let buyer = app.customer("buyer@example.com").await;
    let order = order_id_from(&buyer.buy(open_sale, 1).await);

    let (_, page) = admin.get_text("/admin/queues").await;
    assert!(page.contains("No seed committed yet"), "{page}");
    assert!(
        !page.contains(&format!("queue-{open_sale}")),
        "only queue-mode sales: {page}"
    );

    // As the draw leaves a room: frozen at the start with its list's
    // SHA-256, then drawn, every pre-queue place given its position; the
    // late one joined after.
    sql(&app.db, &format!("INSERT INTO queue_draws (product_id, seed, seed_sha256, committed_at, frozen_at, entries_sha256, drawn_at, last_position) VALUES ({id}, decode(repeat('11', 32), 'hex'), decode(repeat('ab', 32), 'hex'), '2030-01-01T08:00:00Z', '2030-01-01T09:00:00Z', decode(repeat('cd', 32), 'hex'), '2030-01-01T09:00:00Z', 4)"));
    for (n, customer) in customers.iter().enumerate() {
        let late = n == 3;
        let drawn = !late;
        sql(&app.db, &format!("INSERT INTO queue_entries (product_id, customer_id, ticket, seq, joined_at, late, drawn, position) VALUES ({id}, {customer}, '000000000{n}', {}, '2030-01-01T08:1{n}:00Z', {late}, {drawn}, {})", n + 1, n + 1));
    }
    for (number, state, order_id, ended) in [
        (1, "used", order.to_string(), "now()"),
        (2, "lapsed", "NULL".to_string(), "now()"),
        (3, "issued", "NULL".to_string(), "NULL"),
    ] {
        let customer = customers[number - 1];
        sql(&app.db, &format!("INSERT INTO queue_admissions (product_id, number, ticket, customer_id, units, issued_at, expires_at, state, order_id, ended_at) VALUES ({id}, {number}, '000000000{}', {customer}, 1, now(), now() + interval '2 minutes', '{state}', {order_id}, {ended})", number - 1));
    }

    let panel = panel(&admin, id, &"ab".repeat(32)).await;
    for (key, now) in [
        ("joined", "4"),
        ("waiting", "1"),
        ("admitted", "3"),
        ("outstanding", "1"),
        ("outstanding-units", "1"),
        ("used", "1"),
        ("lapsed", "1"),
        ("late", "1"),
        // 1 used of 3 admitted.
        ("conversion", "33%"),
    ] {
        assert_eq!(cells(&panel, key), [now], "{key}");
    }
    assert!(panel.contains(r#"data-testid="frozen""#), "{panel}");
    assert!(
        panel.contains(&format!(
            r#"data-testid="entries-commitment">{}<"#,
            "cd".repeat(32)
        )),
        "{panel}"
    );
    assert!(panel.contains("Drawn at 2030-01-01 09:00 UTC"), "{panel}");
    assert!(
        panel.contains(&format!(r#"href="/products/{id}/draw""#)),
        "{panel}"
    );
    // Drawn, started and not over: admitting, so it can be paused.
    assert!(panel.contains("Admitting"), "{panel}");
    assert!(
        panel.contains(&format!(r#"action="/admin/products/{id}/queue/pause""#)),
        "{panel}"
    );
}

/// Makes sale `id`'s waiting room open now and its sale start in an hour,
/// and waits for the tick to commit its seed.
async fn open_room(app: &TestApp, id: i64) {
    sql(
        &app.db,
        &format!(
            "UPDATE products SET queue_opens_at = now() - interval '1 minute', \
             sale_starts_at = now() + interval '1 hour' WHERE id = {id}"
        ),
    );
    flashsale::services::sale_cache::invalidate();
    until(
        app,
        &format!("SELECT count(*) AS n FROM queue_draws WHERE product_id = {id}"),
    )
    .await;
}

/// Starts sale `id` now and waits for the tick to draw its room.
async fn start_room(app: &TestApp, id: i64) {
    sql(
        &app.db,
        &format!("UPDATE products SET sale_starts_at = now() WHERE id = {id}"),
    );
    flashsale::services::sale_cache::invalidate();
    until(
        app,
        &format!(
            "SELECT count(*) AS n FROM queue_draws WHERE product_id = {id} AND drawn_at IS NOT NULL"
        ),
    )
    .await;
}

/// Waits until `count` counts 1.
async fn until(app: &TestApp, count: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while app.db.count(count) != 1 {
        assert!(std::time::Instant::now() < deadline, "never: {count}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn paused_in_postgres(db: &TestDb, id: i64) -> bool {
    db.count(&format!(
        "SELECT count(*) AS n FROM queue_draws WHERE product_id = {id} AND admission_paused"
    )) == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_and_resume_change_the_queue_and_are_logged() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let id = id_from_saved(&admin.post_form("/admin/products", &queue_sale_form()).await);
    let open_sale = app.product(5, None).await;
    let pause = format!("/admin/products/{id}/queue/pause");
    let resume = format!("/admin/products/{id}/queue/resume");
    let logged = |db: &TestDb, action: &str| {
        db.count(&format!("SELECT count(*) AS n FROM admin_actions WHERE product_id = {id} AND action = '{action}'"))
    };

    // Nothing to pause yet: the waiting room has not opened.
    expect_page(
        admin.post_form(&pause, &[]).await,
        StatusCode::CONFLICT,
        "not running yet",
    )
    .await;
    expect_page(
        admin
            .post_form(&format!("/admin/products/{open_sale}/queue/pause"), &[])
            .await,
        StatusCode::CONFLICT,
        "not in queue mode",
    )
    .await;
    // Open, before the start: nobody is admitted before the draw anyway.
    open_room(&app, id).await;
    let waiter = app.customer("waiter@example.com").await;
    expect_redirect(&join(&waiter, id).await, &format!("/products/{id}/queue"));
    for path in [&pause, &resume] {
        expect_page(
            admin.post_form(path, &[]).await,
            StatusCode::CONFLICT,
            "not admitting yet",
        )
        .await;
    }
    let panel_now = panel(&admin, id, "Pre-queue").await;
    assert!(!panel_now.contains(&pause), "{panel_now}");
    assert_eq!(logged(&app.db, "queue_pause"), 0, "a refusal logs nothing");
    assert_eq!(logged(&app.db, "queue_resume"), 0, "a refusal logs nothing");

    // Started: the draw admits the one waiter at once.
    start_room(&app, id).await;
    wait_for(&waiter, id, Duration::from_secs(15), state_is("admitted")).await;
    let panel_now = panel(&admin, id, "Admitting").await;
    assert!(
        panel_now.contains(&format!(r#"action="{pause}""#)),
        "{panel_now}"
    );
    assert_eq!(cells(&panel_now, "admitted"), ["1"]);

    expect_redirect(
        &admin.post_form(&pause, &[]).await,
        &format!("/admin/queues#queue-{id}"),
    );
    assert!(paused_in_postgres(&app.db, id));
    assert_eq!(logged(&app.db, "queue_pause"), 1);
    let panel_now = panel(&admin, id, "Paused").await;
    assert!(
        panel_now.contains(&format!(r#"action="{resume}""#)),
        "{panel_now}"
    );
    assert!(
        !panel_now.contains(&format!(r#"action="{pause}""#)),
        "{panel_now}"
    );
    assert!(
        panel_now.contains("Last paused by admin@example.com"),
        "{panel_now}"
    );
    let (_, log) = admin.get_text("/admin/audit-log").await;
    assert!(log.contains("Waiting room paused"), "{log}");
    // Pausing again changes and logs nothing.
    expect_redirect(
        &admin.post_form(&pause, &[]).await,
        &format!("/admin/queues#queue-{id}"),
    );
    assert_eq!(logged(&app.db, "queue_pause"), 1);

    // While paused a late arrival joins the back and keeps waiting: the
    // admitted waiter keeps their pass, and no pass is issued.
    let late = app.customer("paused-late@example.com").await;
    expect_redirect(&join(&late, id).await, &format!("/products/{id}/queue"));
    let status = wait_for(&late, id, Duration::from_secs(5), |s| {
        s["queue"] == "paused"
    })
    .await;
    assert_eq!(status["state"], "waiting", "{status}");
    assert_eq!(status["position"], 2, "{status}");
    assert_eq!(queue_json(&waiter, id).await["state"], "admitted");
    expect_page(
        late.get(&format!("/products/{id}/queue")).await,
        StatusCode::OK,
        "The shop has paused admission",
    )
    .await;
    // Several ticks later, still nobody else admitted.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(queue_json(&late, id).await["state"], "waiting");
    let panel_now = panel(&admin, id, "Paused").await;
    assert_eq!(cells(&panel_now, "admitted"), ["1"]);
    assert_eq!(cells(&panel_now, "waiting"), ["1"]);
    assert_eq!(cells(&panel_now, "late"), ["1"]);

    expect_redirect(
        &admin.post_form(&resume, &[]).await,
        &format!("/admin/queues#queue-{id}"),
    );
    assert!(!paused_in_postgres(&app.db, id));
    assert_eq!(logged(&app.db, "queue_resume"), 1);
    assert!(panel(&admin, id, "Admitting")
        .await
        .contains("Last resumed by admin@example.com"));
    // Resumed: the late arrival is admitted by the next tick.
    wait_for(&late, id, Duration::from_secs(10), state_is("admitted")).await;

    // Sold out (no stock, no pass open, no unpaid order): it may still be
    // paused and resumed.
    sql(
        &app.db,
        &format!(
            "UPDATE queue_admissions SET state = 'lapsed', ended_at = now() WHERE product_id = {id}"
        ),
    );
    sql(
        &app.db,
        &format!("UPDATE products SET stock = 0 WHERE id = {id}"),
    );
    flashsale::services::sale_cache::invalidate();
    app.shop
        .waiting_room
        .forget(flashsale::domain::ProductId(id));
    wait_for(&app.browser(), id, Duration::from_secs(5), |s| {
        s["queue"] == "sold_out"
    })
    .await;
    panel(&admin, id, "Sold out").await;
    expect_redirect(
        &admin.post_form(&pause, &[]).await,
        &format!("/admin/queues#queue-{id}"),
    );
    assert!(paused_in_postgres(&app.db, id));
    expect_redirect(
        &admin.post_form(&resume, &[]).await,
        &format!("/admin/queues#queue-{id}"),
    );
    assert!(!paused_in_postgres(&app.db, id));
    assert_eq!(logged(&app.db, "queue_pause"), 2);
    assert_eq!(logged(&app.db, "queue_resume"), 2);

    // Over: there is no admission left to pause or resume.
    sql(
        &app.db,
        &format!("UPDATE products SET sale_ends_at = now() - interval '1 second' WHERE id = {id}"),
    );
    flashsale::services::sale_cache::invalidate();
    for path in [&pause, &resume] {
        expect_page(
            admin.post_form(path, &[]).await,
            StatusCode::CONFLICT,
            "is over",
        )
        .await;
    }
    assert!(!paused_in_postgres(&app.db, id));
    assert_eq!(logged(&app.db, "queue_pause"), 2);
    assert_eq!(logged(&app.db, "queue_resume"), 2);
}

/// A pause and its line in the admin log are one transaction: a pause the
/// log refuses leaves admission running, and nothing is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_the_log_refuses_changes_nothing() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let id = id_from_saved(&admin.post_form("/admin/products", &queue_sale_form()).await);
    open_room(&app, id).await;
    start_room(&app, id).await;
    let pause = format!("/admin/products/{id}/queue/pause");
    let logged = || {
        app.db.count(&format!(
            "SELECT count(*) AS n FROM admin_actions WHERE product_id = {id} AND action = 'queue_pause'"
        ))
    };
    let stranger = app.browser();
    assert_eq!(queue_json(&stranger, id).await["queue"], "open");

    sql(
        &app.db,
        "CREATE FUNCTION refuse_pause() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'the log is down'; END $$",
    );
    sql(
        &app.db,
        "CREATE TRIGGER refuse_pause BEFORE INSERT ON admin_actions FOR EACH ROW \
         WHEN (NEW.action = 'queue_pause') EXECUTE FUNCTION refuse_pause()",
    );
    let refused = admin.post_form(&pause, &[]).await;
    assert!(refused.status().is_server_error(), "{}", refused.status());
    assert!(
        !paused_in_postgres(&app.db, id),
        "the unlogged pause is undone"
    );
    assert_eq!(logged(), 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(queue_json(&stranger, id).await["queue"], "open");
    panel(&admin, id, "Admitting").await;

    sql(&app.db, "DROP TRIGGER refuse_pause ON admin_actions");
    expect_redirect(
        &admin.post_form(&pause, &[]).await,
        &format!("/admin/queues#queue-{id}"),
    );
    assert_eq!(logged(), 1);
    assert!(paused_in_postgres(&app.db, id), "as logged");
    wait_for(&stranger, id, Duration::from_secs(5), |s| {
        s["queue"] == "paused"
    })
    .await;
}
