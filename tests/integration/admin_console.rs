//! The admin console's pages: who may see them, what they say, and that every
//! form that changes something checks its CSRF token and writes nothing when
//! refused.

use crate::helpers::*;
use reqwest::StatusCode;

fn sale_form<'a>(name: &'a str, price: &'a str, stock: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("name", name),
        ("description", "Noise-cancelling, 30h battery"),
        ("price", price),
        ("stock", stock),
        ("per_customer_limit", "2"),
        ("starts_at", "2030-01-01T09:00"),
        ("ends_at", "2030-01-02T09:00"),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_pages_are_for_admins_only() {
    let app = spawn_app().await;
    let product = app.product(5, None).await;
    let buyer = app.customer("shopper@example.com").await;
    let order = order_id_from(&buyer.buy(product, 1).await);
    let stranger = app.browser();
    let admin = app.admin().await;

    let pages = [
        ("/admin".to_string(), "Ledger audit: clean"),
        ("/admin/orders".to_string(), "shopper@example.com"),
        (format!("/admin/orders/{order}"), "Stock history"),
        (format!("/admin/orders/{order}/refund"), "Refund order"),
        ("/admin/products/new".to_string(), "New flash sale"),
        (format!("/admin/products/{product}/edit"), "Adjust stock"),
        (format!("/admin/products/{product}/history"), "Purchase"),
        ("/admin/queues".to_string(), "Waiting rooms"),
    ];
    for (path, text) in &pages {
        expect_sign_in(&stranger.get(path).await);
        expect_page(
            buyer.get(path).await,
            StatusCode::FORBIDDEN,
            "administrators only",
        )
        .await;
        expect_page(admin.get(path).await, StatusCode::OK, text).await;
    }

    let rows = app.db.ledger_rows();
    let products = app.db.count("SELECT count(*) AS n FROM products");
    let posts = [
        (
            "/admin/products".to_string(),
            sale_form("Headphones", "99.00", "3"),
        ),
        (
            format!("/admin/products/{product}/edit"),
            sale_form("Renamed", "1.00", ""),
        ),
        (
            format!("/admin/products/{product}/stock"),
            vec![("delta", "5"), ("reason", "found more")],
        ),
        (format!("/admin/orders/{order}/refund"), vec![]),
        (format!("/admin/products/{product}/queue/pause"), vec![]),
        (format!("/admin/products/{product}/queue/resume"), vec![]),
    ];
    for (path, fields) in &posts {
        // A stranger and a customer are refused before the token matters.
        expect_sign_in(&stranger.post_form(path, fields).await);
        expect_page(
            buyer.post_form(path, fields).await,
            StatusCode::FORBIDDEN,
            "administrators only",
        )
        .await;
        // An admin's form without this session's token is refused too.
        expect_page(
            admin.post(path, fields).await,
            StatusCode::FORBIDDEN,
            "form has expired",
        )
        .await;
        let mut forged = fields.clone();
        forged.push(("csrf_token", "forged"));
        expect_page(
            admin.post(path, &forged).await,
            StatusCode::FORBIDDEN,
            "form has expired",
        )
        .await;
    }
    assert_eq!(app.db.ledger_rows(), rows, "refused forms write nothing");
    assert_eq!(
        app.db.count("SELECT count(*) AS n FROM admin_actions"),
        0,
        "refused forms log nothing"
    );
    assert_eq!(app.db.count("SELECT count(*) AS n FROM products"), products);
    assert_eq!(app.db.count(&format!("SELECT count(*) AS n FROM products WHERE name = 'Renamed' OR id = {product} AND price_cents <> 1000")), 0);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_creates_and_edits_a_sale() {
    let app = spawn_app().await;
    let admin = app.admin().await;

    let response = admin
        .post_form("/admin/products", &sale_form("Headphones", "99.5", "3"))
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let location = response.headers()["location"].to_str().unwrap().to_string();
    let id: i64 = location
        .trim_start_matches("/admin/products/")
        .trim_end_matches("/edit?saved=1")
        .parse()
        .unwrap();
    let page = expect_page(admin.get(&location).await, StatusCode::OK, "Saved.").await;
    assert!(page.contains(r#"value="99.50""#), "{page}");
    assert!(page.contains(r#"value="2030-01-01T09:00""#), "{page}");
    assert_eq!(
        app.db.count(&format!("SELECT count(*) AS n FROM products WHERE id = {id} AND stock = 3 AND initial_stock = 3 AND price_cents = 9950 AND per_customer_limit = 2 AND sale_starts_at = '2030-01-01T09:00:00Z'")),
        1
    );
    let (_, list) = app.browser().get_text("/").await;
    assert!(
        list.contains("Headphones") && list.contains("$99.50") && list.contains("Upcoming"),
        "{list}"
    );

    // Refused forms come back filled in, with the reason, and save nothing.
    for (form, why) in [
        (sale_form("", "1", "3"), "name"),
        (sale_form("X", "ten", "3"), "not a price"),
        (sale_form("X", "1", "-4"), "Stock must be"),
        (sale_form("X", "1", "many"), "not a whole number"),
        (
            with(sale_form("X", "1", "3"), "per_customer_limit", "0"),
            "at least 1",
        ),
        (
            with(sale_form("X", "1", "3"), "ends_at", "2029-01-01T09:00"),
            "end after it starts",
        ),
        (
            with(sale_form("X", "1", "3"), "starts_at", "tomorrow"),
            "not a date",
        ),
    ] {
        let body = expect_page(
            admin.post_form("/admin/products", &form).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            why,
        )
        .await;
        assert!(body.contains("Nothing was saved"), "{body}");
    }
    assert_eq!(app.db.count("SELECT count(*) AS n FROM products"), 1);

    // Editing changes the terms; stock is not a field of the edit form.
    let edit = format!("/admin/products/{id}/edit");
    let mut changed = sale_form("Headphones Pro", "120", "999");
    changed.retain(|(k, _)| *k != "per_customer_limit" && *k != "ends_at");
    let changed = with(changed, "starts_at", "2020-01-01T00:00");
    expect_redirect(
        &admin.post_form(&edit, &changed).await,
        &format!("{edit}?saved=1"),
    );
    assert_eq!(
        app.db.count(&format!("SELECT count(*) AS n FROM products WHERE id = {id} AND name = 'Headphones Pro' AND price_cents = 12000 AND stock = 3 AND per_customer_limit IS NULL AND sale_ends_at IS NULL")),
        1
    );
    let (_, page) = app.browser().get_text(&format!("/products/{id}")).await;
    assert!(
        page.contains("Headphones Pro") && page.contains("$120.00") && page.contains("Live"),
        "{page}"
    );
    expect_page(
        admin
            .post_form(&edit, &sale_form("Headphones Pro", "-1", ""))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "not a price",
    )
    .await;
    expect_page(
        admin
            .post_form("/admin/products/999999/edit", &changed)
            .await,
        StatusCode::NOT_FOUND,
        "no product",
    )
    .await;
    assert_eq!(app.db.count("SELECT count(*) AS n FROM stock_history"), 0);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stock_adjustments_are_recorded_and_bounded() {
    let app = spawn_app().await;
    let product = app.product(3, None).await;
    let admin = app.admin().await;
    let buyer = app.customer("early@example.com").await;
    order_id_from(&buyer.buy(product, 2).await);
    let stock_path = format!("/admin/products/{product}/stock");
    let history = format!("/admin/products/{product}/history");

    expect_redirect(
        &admin
            .post_form(
                &stock_path,
                &[("delta", "+5"), ("reason", "found a box in the back")],
            )
            .await,
        &history,
    );
    assert_eq!(app.db.stock(product), 6);
    let page = expect_page(
        admin.get(&history).await,
        StatusCode::OK,
        "found a box in the back",
    )
    .await;
    assert!(
        page.contains("Admin adjustment") && page.contains("+5") && page.contains("Purchase"),
        "{page}"
    );

    // Units sold or reserved cannot be taken back: only what is in stock.
    let rows = app.db.ledger_rows();
    let body = expect_page(
        admin
            .post_form(&stock_path, &[("delta", "-7"), ("reason", "too many")])
            .await,
        StatusCode::CONFLICT,
        "Only 6 units are in stock",
    )
    .await;
    assert!(body.contains("Nothing was changed"), "{body}");
    for (delta, reason, why) in [
        ("0", "x", "not a stock change"),
        ("abc", "x", "not a stock change"),
        ("1.5", "x", "not a stock change"),
        ("99999999", "x", "not a stock change"),
        ("3", "  ", "Say why"),
    ] {
        expect_page(
            admin
                .post_form(&stock_path, &[("delta", delta), ("reason", reason)])
                .await,
            StatusCode::UNPROCESSABLE_ENTITY,
            why,
        )
        .await;
    }
    expect_page(
        admin
            .post_form(
                "/admin/products/999999/stock",
                &[("delta", "1"), ("reason", "x")],
            )
            .await,
        StatusCode::NOT_FOUND,
        "no product",
    )
    .await;
    assert_eq!(
        app.db.ledger_rows(),
        rows,
        "refused adjustments write nothing"
    );

    expect_redirect(
        &admin
            .post_form(
                &stock_path,
                &[("delta", "-6"), ("reason", "damaged in transit")],
            )
            .await,
        &history,
    );
    assert_eq!(app.db.stock(product), 0);
    let (_, page) = app
        .browser()
        .get_text(&format!("/products/{product}"))
        .await;
    assert!(page.contains("Sold out"), "{page}");
    let (_, dashboard) = admin.get_text("/admin").await;
    // Offered: 3 initial + 5 - 6 = 2, both held by the order awaiting payment.
    assert!(
        dashboard.contains("<td>2</td><td>0</td><td>2</td><td>0</td><td>0</td>"),
        "{dashboard}"
    );
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_are_searchable_and_paginated() {
    let app = spawn_app().await;
    let hats = app.product(100, None).await;
    let shoes = app.product(100, None).await;
    let ann = app.customer("ann@example.com").await;
    let bob = app.customer("bob_99@example.com").await;
    for _ in 0..27 {
        order_id_from(&ann.buy(hats, 1).await);
    }
    let bobs = order_id_from(&bob.buy(shoes, 1).await);
    bob.pay(bobs, GOOD_CARD).await;
    let admin = app.admin().await;

    let page = expect_page(
        admin.get("/admin/orders").await,
        StatusCode::OK,
        "28 orders.",
    )
    .await;
    assert!(
        page.contains("Page 1 of 2") && page.contains("bob_99@example.com"),
        "{page}"
    );
    assert_eq!(page.matches("href=\"/admin/orders/").count(), 25);
    let page = expect_page(
        admin.get("/admin/orders?page=2").await,
        StatusCode::OK,
        "Page 2 of 2",
    )
    .await;
    assert_eq!(page.matches("href=\"/admin/orders/").count(), 3);
    for odd in ["0", "-3", "x", "9223372036854775807"] {
        let path = format!("/admin/orders?page={odd}");
        expect_page(admin.get(&path).await, StatusCode::OK, "Page 1 of 2").await;
    }

    let page = expect_page(
        admin.get("/admin/orders?email=BOB").await,
        StatusCode::OK,
        "1 order matches.",
    )
    .await;
    assert!(
        page.contains(&format!("#{bobs}")) && !page.contains("ann@"),
        "{page}"
    );
    // LIKE wildcards in the search are taken literally.
    expect_page(
        admin.get("/admin/orders?email=b_b").await,
        StatusCode::OK,
        "0 orders match.",
    )
    .await;
    expect_page(
        admin.get("/admin/orders?email=b_9").await,
        StatusCode::OK,
        "1 order matches.",
    )
    .await;
    expect_page(
        admin.get("/admin/orders?status=paid").await,
        StatusCode::OK,
        "1 order matches.",
    )
    .await;
    expect_page(
        admin.get("/admin/orders?status=awaiting_payment").await,
        StatusCode::OK,
        "27 orders match.",
    )
    .await;
    let page = expect_page(
        admin
            .get(&format!("/admin/orders?product={hats}&email=ann"))
            .await,
        StatusCode::OK,
        "27 orders match.",
    )
    .await;
    // The next page keeps the search.
    assert!(
        page.contains(&format!(
            "/admin/orders?email=ann&#38;product={hats}&#38;page=2"
        )),
        "{page}"
    );
    expect_page(
        admin
            .get(&format!("/admin/orders?product={shoes}&status=paid"))
            .await,
        StatusCode::OK,
        "1 order matches.",
    )
    .await;
    expect_page(
        admin.get("/admin/orders?status=lost").await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "no order status",
    )
    .await;
    expect_page(
        admin.get("/admin/orders?product=x").await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refund_goes_through_a_confirmation_page() {
    let app = spawn_app().await;
    let product = app.product(1, None).await;
    let buyer = app.customer("refundee@example.com").await;
    let order = order_id_from(&buyer.buy(product, 1).await);
    let admin = app.admin().await;
    let confirm = format!("/admin/orders/{order}/refund");

    // Not paid yet: the confirmation page offers no button.
    let page = expect_page(
        admin.get(&confirm).await,
        StatusCode::OK,
        "Only a paid order can be refunded",
    )
    .await;
    assert!(!page.contains("Yes, refund"), "{page}");
    buyer.pay(order, GOOD_CARD).await;

    let detail = expect_page(
        admin.get(&format!("/admin/orders/{order}")).await,
        StatusCode::OK,
        &format!("href=\"{confirm}\""),
    )
    .await;
    assert!(
        detail.contains("approved") && detail.contains("…4242"),
        "{detail}"
    );
    let page = expect_page(
        admin.get(&confirm).await,
        StatusCode::OK,
        "Yes, refund $10.00",
    )
    .await;
    assert!(
        page.contains("refundee@example.com") && page.contains("puts 1 unit back"),
        "{page}"
    );
    assert_eq!(
        app.db.stock(product),
        0,
        "viewing the confirmation changes nothing"
    );

    let token = csrf_from(&page);
    expect_redirect(
        &admin.post(&confirm, &[("csrf_token", &token)]).await,
        &format!("/admin/orders/{order}"),
    );
    assert_eq!(app.db.stock(product), 1);
    expect_page(
        admin.post(&confirm, &[("csrf_token", &token)]).await,
        StatusCode::CONFLICT,
        "already been refunded",
    )
    .await;
    expect_page(
        admin.get(&confirm).await,
        StatusCode::OK,
        "already been refunded",
    )
    .await;
    let history = expect_page(
        admin
            .get(&format!("/admin/products/{product}/history"))
            .await,
        StatusCode::OK,
        "Refund",
    )
    .await;
    assert!(
        history.contains(&format!("href=\"/admin/orders/{order}\"")),
        "{history}"
    );
    expect_page(
        admin.get("/admin/orders/999999/refund").await,
        StatusCode::NOT_FOUND,
        "no order",
    )
    .await;
    app.db.assert_audit_clean();
}
