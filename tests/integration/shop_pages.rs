//! The customer's pages: what each says to a stranger, a customer and an
//! admin, and that their forms refuse a missing or foreign CSRF token.

use crate::helpers::*;
use chrono::{Duration, Utc};
use flashsale::domain::Money;
use flashsale::services::catalog::{create_product, SaleSpec};
use reqwest::StatusCode;

async fn sale(
    app: &TestApp,
    name: &str,
    stock: i32,
    starts_in: Duration,
    ends_in: Option<Duration>,
) -> i64 {
    create_product(
        &app.shop.pool,
        SaleSpec {
            name: name.into(),
            description: format!("All about {name}."),
            price: Money::from_cents(123_456).unwrap(),
            stock,
            per_customer_limit: Some(3),
            starts_at: Utc::now() + starts_in,
            ends_at: ends_in.map(|d| Utc::now() + d),
        },
    )
    .await
    .unwrap()
    .id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sale_list_and_product_pages_show_every_state() {
    let app = spawn_app().await;
    let live = sale(
        &app,
        "Live lamp",
        10,
        Duration::minutes(-5),
        Some(Duration::hours(1)),
    )
    .await;
    let upcoming = sale(&app, "Upcoming urn", 4, Duration::hours(2), None).await;
    let ended = sale(
        &app,
        "Ended easel",
        4,
        Duration::hours(-2),
        Some(Duration::hours(-1)),
    )
    .await;
    let sold_out = sale(&app, "Sold sofa", 1, Duration::minutes(-5), None).await;
    let buyer = app.customer("looker@example.com").await;
    order_id_from(&buyer.buy(sold_out, 1).await);
    order_id_from(&buyer.buy(live, 2).await);

    for who in [app.browser(), buyer.clone()] {
        let page = expect_page(who.get("/").await, StatusCode::OK, "Flash sales").await;
        for text in [
            "Live lamp",
            "$1,234.56",
            ">8</span> of 10 left",
            r#"<progress max="10" value="8""#,
            "Upcoming urn",
            "Upcoming",
            "data-countdown",
            "Ended easel",
            "Ended",
            "Sold sofa",
            "Sold out",
            ">0</span> of 1 left",
        ] {
            assert!(page.contains(text), "sale list lacks {text:?}: {page}");
        }
    }
    // The product page bounds the quantity by the limit and the stock.
    let page = expect_page(
        buyer.get(&format!("/products/{live}")).await,
        StatusCode::OK,
        "Buy now",
    )
    .await;
    assert!(
        page.contains(r#"max="3""#) && page.contains("Limit: 3 per customer"),
        "{page}"
    );
    assert!(page.contains("All about Live lamp"), "{page}");
    for (id, label, banner) in [
        (upcoming, "Upcoming", "has not opened yet"),
        (ended, "Ended", "This sale has ended"),
        (sold_out, "Sold out", "every unit has been bought"),
    ] {
        let page = expect_page(
            buyer.get(&format!("/products/{id}")).await,
            StatusCode::OK,
            banner,
        )
        .await;
        assert!(
            page.contains("disabled") && page.contains(&format!("badge-{}", label_class(label))),
            "{page}"
        );
        assert!(!page.contains("Buy now"), "{page}");
    }
    // Strangers are asked to sign in instead of getting a buy form.
    let page = expect_page(
        app.browser().get(&format!("/products/{live}")).await,
        StatusCode::OK,
        "Sign in to buy",
    )
    .await;
    assert!(!page.contains("action=\"/products/"), "{page}");
    expect_page(
        app.browser().get("/products/999999").await,
        StatusCode::NOT_FOUND,
        "no product",
    )
    .await;
    expect_page(
        app.browser().get("/products/nope").await,
        StatusCode::NOT_FOUND,
        "",
    )
    .await;
    expect_page(
        app.browser().get("/no/such/page").await,
        StatusCode::NOT_FOUND,
        "no page at this address",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn account_pages_and_forms() {
    let app = spawn_app().await;
    let stranger = app.browser();
    let page = expect_page(
        stranger.get("/signup").await,
        StatusCode::OK,
        "Create your account",
    )
    .await;
    assert!(
        page.contains(r#"<label for="email">"#) && page.contains(r#"autocomplete="new-password""#),
        "{page}"
    );
    expect_page(stranger.get("/login").await, StatusCode::OK, "Sign in").await;
    expect_redirect(&stranger.get("/orders").await, "/login");
    expect_redirect(&stranger.get("/orders/1").await, "/login");

    // Sign-up, sign-in and sign-out all refuse a form without this session's token.
    let accounts = app.db.count("SELECT count(*) AS n FROM customers");
    for path in ["/signup", "/login", "/logout"] {
        expect_page(
            stranger
                .post(
                    path,
                    &[("email", "new@example.com"), ("password", PASSWORD)],
                )
                .await,
            StatusCode::FORBIDDEN,
            "form has expired",
        )
        .await;
    }
    assert_eq!(
        app.db.count("SELECT count(*) AS n FROM customers"),
        accounts
    );

    let customer = app.customer("fresh@example.com").await;
    let page = expect_page(
        customer.get("/orders").await,
        StatusCode::OK,
        "You have no orders yet",
    )
    .await;
    assert!(
        page.contains("fresh@example.com") && page.contains("Sign out"),
        "{page}"
    );
    assert!(
        !page.contains(r#"href="/admin""#),
        "customers get no admin link"
    );
    let admin = app.admin().await;
    let (_, page) = admin.get_text("/").await;
    assert!(page.contains(r#"href="/admin""#), "{page}");

    expect_page(
        customer.post("/logout", &[("csrf_token", "forged")]).await,
        StatusCode::FORBIDDEN,
        "form has expired",
    )
    .await;
    expect_redirect(&customer.post_form("/logout", &[]).await, "/");
    expect_redirect(&customer.get("/orders").await, "/login");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payment_page_and_outcomes() {
    let app = spawn_app().await;
    let product = app.product(3, None).await;
    let buyer = app.customer("checkout@example.com").await;
    let order = order_id_from(&buyer.buy(product, 2).await);

    let page = expect_page(
        buyer.get(&format!("/orders/{order}")).await,
        StatusCode::OK,
        "Pay $20.00",
    )
    .await;
    for text in [
        "Awaiting payment",
        "data-countdown",
        "4242 4242 4242 4242",
        "4000 0000 0000 0002",
        r#"name="idempotency_key""#,
        r#"name="csrf_token""#,
        r#"autocomplete="cc-number""#,
        "$10.00",
    ] {
        assert!(page.contains(text), "payment page lacks {text:?}: {page}");
    }
    // The pay form refuses a missing or forged token, and charges nothing.
    expect_page(
        buyer
            .post(
                &format!("/orders/{order}/pay"),
                &[("card_number", GOOD_CARD)],
            )
            .await,
        StatusCode::FORBIDDEN,
        "form has expired",
    )
    .await;
    expect_page(
        buyer
            .post(
                &format!("/orders/{order}/pay"),
                &[("card_number", GOOD_CARD), ("csrf_token", "forged")],
            )
            .await,
        StatusCode::FORBIDDEN,
        "form has expired",
    )
    .await;
    assert_eq!(app.db.count("SELECT count(*) AS n FROM payments"), 0);

    expect_redirect(
        &buyer.pay(order, GOOD_CARD).await,
        &format!("/orders/{order}"),
    );
    let page = expect_page(
        buyer.get(&format!("/orders/{order}")).await,
        StatusCode::OK,
        "Paid — thank you",
    )
    .await;
    assert!(
        !page.contains("card_number"),
        "a paid order offers no card form: {page}"
    );
    let list = expect_page(
        buyer.get("/orders").await,
        StatusCode::OK,
        &format!("#{order}"),
    )
    .await;
    assert!(list.contains("Paid") && list.contains("$20.00"), "{list}");

    let declined = order_id_from(&buyer.buy(product, 1).await);
    buyer.pay(declined, DECLINED_CARD).await;
    let page = expect_page(
        buyer.get(&format!("/orders/{declined}")).await,
        StatusCode::OK,
        "Your payment was declined",
    )
    .await;
    assert!(page.contains("you were not charged"), "{page}");
    let (_, product_page) = buyer.get_text(&format!("/products/{product}")).await;
    assert!(
        product_page.contains(">1</span> of 3 left"),
        "{product_page}"
    );
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pages_carry_security_headers_and_assets() {
    let app = spawn_app().await;
    let response = app.browser().get("/").await;
    let headers = response.headers();
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert!(headers.contains_key("referrer-policy"));
    let body = response.text().await.unwrap();
    assert!(
        !body.contains("<script>") && !body.contains("style=\""),
        "no inline script or style"
    );
    let css = app.browser().get("/static/app.css").await;
    assert_eq!(css.status(), StatusCode::OK);
    assert!(css.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/css"));
    let js = expect_page(
        app.browser().get("/static/app.js").await,
        StatusCode::OK,
        "data-countdown",
    )
    .await;
    assert!(js.contains("toLocaleString"));
}

fn label_class(label: &str) -> String {
    label.to_lowercase().replace(' ', "")
}
