//! How an admin sets up and runs a sale in queue mode (issue #16): the
//! command line's `--queue`, the sale form's queue choice, edits that would
//! break a waiting room customers are in, and the waiting-room dashboard
//! with its pause and resume.

use std::process::Output;
use std::time::Duration;

use crate::helpers::*;
use diesel::RunQueryDsl;
use flashsale::domain::ProductId;
use flashsale::queue::{QueueSetup, QueueState};
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
        "the audit log says the mode changed"
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
            "UPDATE queue_draws SET drawn_at = '2030-01-01T10:00:00Z' WHERE product_id = {id}"
        ),
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
        assert!(body.contains("draw is published"), "{body}");
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

    expect_redirect(&stranger.get("/admin/queues").await, "/login");
    expect_page(
        buyer.get("/admin/queues").await,
        StatusCode::FORBIDDEN,
        "administrators only",
    )
    .await;
    for action in ["pause", "resume"] {
        let path = format!("/admin/products/{id}/queue/{action}");
        expect_redirect(&stranger.post_form(&path, &[]).await, "/login");
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

/// The cells (live, recorded) of a count's row on the dashboard.
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

    sql(&app.db, &format!("INSERT INTO queue_draws (product_id, seed, seed_sha256, committed_at, drawn_at) VALUES ({id}, decode(repeat('11', 32), 'hex'), decode(repeat('ab', 32), 'hex'), '2030-01-01T08:00:00Z', '2030-01-01T09:00:00Z')"));
    // As the draw's reveal leaves them: the pre-queue places it took are
    // marked drawn, the late one is not.
    for (n, customer) in customers.iter().enumerate() {
        let late = n == 3;
        let drawn = !late;
        sql(&app.db, &format!("INSERT INTO queue_entries (product_id, customer_id, ticket, seq, joined_at, late, drawn) VALUES ({id}, {customer}, '000000000{n}', {}, '2030-01-01T08:1{n}:00Z', {late}, {drawn})", n + 1));
    }
    for (number, state, order_id, ended) in [
        (1, "used", order.to_string(), "now()"),
        (2, "lapsed", "NULL".to_string(), "now()"),
        (3, "issued", "NULL".to_string(), "NULL"),
    ] {
        sql(&app.db, &format!("INSERT INTO queue_admissions (product_id, number, ticket, issued_at, expires_at, state, order_id, ended_at) VALUES ({id}, {number}, '000000000{}', now(), now() + interval '2 minutes', '{state}', {order_id}, {ended})", number - 1));
    }

    let page = expect_page(
        admin.get("/admin/queues").await,
        StatusCode::OK,
        &"ab".repeat(32),
    )
    .await;
    let panel = page
        .split(&format!(r#"data-testid="queue-{id}""#))
        .nth(1)
        .expect("a panel for the queue-mode sale");
    // Redis runs no queue for it: no live counts, the recorded ones from Postgres.
    for (key, recorded) in [
        ("joined", "4"),
        ("admitted", "3"),
        ("outstanding", "1"),
        ("used", "1"),
        ("lapsed", "1"),
        ("late", "1"),
    ] {
        assert_eq!(cells(panel, key), ["—", recorded], "{key}");
    }
    // Conversion from Postgres too: 1 used of 3 admitted.
    assert_eq!(cells(panel, "conversion"), ["33%"]);
    assert!(panel.contains("Drawn at 2030-01-01 09:00 UTC"), "{panel}");
    assert!(
        panel.contains(&format!(r#"href="/products/{id}/draw""#)),
        "{panel}"
    );
    assert!(panel.contains("Not running"), "{panel}");
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

    // Nothing to pause yet: Redis runs no queue for the sale.
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
    assert_eq!(logged(&app.db, "queue_pause"), 0, "a refusal logs nothing");

    let room = &app.shop.waiting_room;
    let product = ProductId(id);
    let setup = QueueSetup {
        starts_at: chrono::Utc::now() - chrono::Duration::seconds(1),
        pass: Duration::from_secs(120),
        units: 1,
    };
    room.prepare(product, &setup).await.unwrap();
    room.draw(product, &[]).await.unwrap();
    let state = |view: flashsale::queue::QueueView| view.queue;
    let nobody = flashsale::domain::CustomerId(0);
    assert_eq!(
        state(room.status(product, nobody).await.unwrap()),
        QueueState::Open
    );

    // One late arrival, in Redis only (no Postgres row in this test).
    let ticket = flashsale::domain::draw::Ticket::generate();
    let joined = room
        .join(product, flashsale::domain::CustomerId(4242), &ticket)
        .await
        .unwrap();
    let flashsale::queue::Joined::New(entry) = joined else {
        panic!("a new place: {joined:?}")
    };
    room.confirm(product, &entry).await.unwrap();

    let page = expect_page(
        admin.get("/admin/queues").await,
        StatusCode::OK,
        "Admitting",
    )
    .await;
    assert!(page.contains(&format!(r#"action="{pause}""#)), "{page}");
    assert_eq!(cells(&page, "joined"), ["1", "0"], "live 1, recorded 0");
    assert_eq!(cells(&page, "waiting"), ["1", "—"]);
    expect_redirect(
        &admin.post_form(&pause, &[]).await,
        &format!("/admin/queues#queue-{id}"),
    );
    assert_eq!(
        state(room.status(product, nobody).await.unwrap()),
        QueueState::Paused
    );
    assert_eq!(logged(&app.db, "queue_pause"), 1);
    let page = expect_page(admin.get("/admin/queues").await, StatusCode::OK, "Paused").await;
    assert!(page.contains(&format!(r#"action="{resume}""#)), "{page}");
    assert!(page.contains("Last paused by admin@example.com"), "{page}");
    assert!(
        flashsale::services::queue_admin::paused_in_record(&app.shop.pool, product)
            .await
            .unwrap()
    );
    let (_, log) = admin.get_text("/admin/audit-log").await;
    assert!(log.contains("Waiting room paused"), "{log}");

    expect_redirect(
        &admin.post_form(&resume, &[]).await,
        &format!("/admin/queues#queue-{id}"),
    );
    assert_eq!(
        state(room.status(product, nobody).await.unwrap()),
        QueueState::Open
    );
    assert_eq!(logged(&app.db, "queue_resume"), 1);
    assert!(
        !flashsale::services::queue_admin::paused_in_record(&app.shop.pool, product)
            .await
            .unwrap()
    );
}

/// The log holds the admission state a rebuilt queue comes back with, so a
/// pause stands only as logged: one the log refuses is undone (and the
/// admin told), and one whose queue a rebuild from the record before it
/// reset meanwhile is put again once logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admission_change_stands_only_as_logged() {
    let app = spawn_app().await;
    let admin = app.admin().await;
    let id = id_from_saved(&admin.post_form("/admin/products", &queue_sale_form()).await);
    let product = ProductId(id);
    let room = &app.shop.waiting_room;
    let setup = QueueSetup {
        starts_at: chrono::Utc::now() - chrono::Duration::seconds(1),
        pass: Duration::from_secs(120),
        units: 1,
    };
    room.prepare(product, &setup).await.unwrap();
    room.draw(product, &[]).await.unwrap();
    let nobody = flashsale::domain::CustomerId(0);
    let state = || async { room.status(product, nobody).await.unwrap().queue };
    let pause = format!("/admin/products/{id}/queue/pause");
    let logged = || {
        app.db.count(&format!(
            "SELECT count(*) AS n FROM admin_actions WHERE product_id = {id} AND action = 'queue_pause'"
        ))
    };

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
    assert_eq!(
        state().await,
        QueueState::Open,
        "the unlogged pause is undone"
    );
    assert_eq!(logged(), 0);

    sql(&app.db, "DROP TRIGGER refuse_pause ON admin_actions");
    sql(
        &app.db,
        "CREATE FUNCTION slow_pause() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$",
    );
    sql(
        &app.db,
        "CREATE TRIGGER slow_pause BEFORE INSERT ON admin_actions FOR EACH ROW \
         WHEN (NEW.action = 'queue_pause') EXECUTE FUNCTION slow_pause()",
    );
    let rebuilt_meanwhile = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(state().await, QueueState::Paused, "Redis first");
        // As REBUILD puts it from a record without the pause.
        assert!(room
            .set_state_from(product, QueueState::Paused, QueueState::Open)
            .await
            .unwrap());
    };
    let (paused, ()) = tokio::join!(admin.post_form(&pause, &[]), rebuilt_meanwhile);
    expect_redirect(&paused, &format!("/admin/queues#queue-{id}"));
    assert_eq!(logged(), 1);
    assert_eq!(state().await, QueueState::Paused, "as logged");
    assert!(
        flashsale::services::queue_admin::paused_in_record(&app.shop.pool, product)
            .await
            .unwrap()
    );
}
