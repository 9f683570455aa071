//! Wrong input gets a clear 4xx page and changes nothing.

use crate::helpers::*;
use reqwest::StatusCode;

async fn expect(response: reqwest::Response, status: StatusCode, text: &str) {
    let got = response.status();
    let body = response.text().await.unwrap();
    assert_eq!(got, status, "body: {body}");
    assert!(body.contains(text), "expected {text:?} in: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_buy_requests_are_refused_and_write_nothing() {
    let app = spawn_app().await;
    let product = app.product(5, None).await;
    let buyer = app.customer("careless@example.com").await;
    let token = buyer.csrf().await;

    for quantity in ["0", "-1", "abc", "1000000000000", "", "1.5"] {
        let response = buyer.buy_with_token(product, quantity, &token).await;
        expect(response, StatusCode::UNPROCESSABLE_ENTITY, "quantity").await;
    }
    expect(
        buyer.buy_with_token(999_999, "1", &token).await,
        StatusCode::NOT_FOUND,
        "no product",
    )
    .await;
    expect(
        buyer
            .post(
                "/products/abc/buy",
                &[("quantity", "1"), ("csrf_token", &token)],
            )
            .await,
        StatusCode::NOT_FOUND,
        "no product",
    )
    .await;
    expect(
        buyer
            .post(&format!("/products/{product}/buy"), &[("quantity", "1")])
            .await,
        StatusCode::FORBIDDEN,
        "form has expired",
    )
    .await;
    expect(
        buyer.buy_with_token(product, "1", "forged-token").await,
        StatusCode::FORBIDDEN,
        "form has expired",
    )
    .await;
    // Asking for more than is left is a refusal, not a partial sale.
    expect(
        buyer.buy_with_token(product, "6", &token).await,
        StatusCode::CONFLICT,
        "Only 5",
    )
    .await;
    // A form from another site (no session at all) is refused too.
    let stranger = app.browser();
    let response = stranger
        .post(
            &format!("/products/{product}/buy"),
            &[("quantity", "1"), ("csrf_token", &token)],
        )
        .await;
    // Sent to sign in, told that nothing was done.
    expect_redirect(&response, "/login?why=act");
    // Wrong content type and an oversized body.
    let response = buyer
        .client
        .post(format!("{}/products/{product}/buy", app.address))
        .header("content-type", "application/json")
        .body(format!("{{\"quantity\":1,\"csrf_token\":\"{token}\"}}"))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_client_error(), "{}", response.status());
    let huge = "9".repeat(100 * 1024);
    let response = buyer.buy_with_token(product, &huge, &token).await;
    assert!(response.status().is_client_error(), "{}", response.status());

    assert_eq!(app.db.ledger_rows(), 0, "no rows written");
    assert_eq!(app.db.stock(product), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sale_window_and_per_customer_limit_are_enforced() {
    let app = spawn_app().await;
    let limited = app.product(10, Some(2)).await;
    let buyer = app.customer("limit@example.com").await;
    assert_eq!(buyer.buy(limited, 2).await.status(), StatusCode::SEE_OTHER);
    expect(
        buyer.buy(limited, 1).await,
        StatusCode::CONFLICT,
        "limited to 2 per customer",
    )
    .await;

    let upcoming = app.upcoming_product(3).await;
    expect(
        buyer.buy(upcoming, 1).await,
        StatusCode::CONFLICT,
        "has not started",
    )
    .await;
    assert_eq!(app.db.count("SELECT count(*) AS n FROM orders"), 1);
    assert_eq!(app.db.stock(upcoming), 3);
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orders_belong_to_their_customer() {
    let app = spawn_app().await;
    let product = app.product(5, None).await;
    let owner = app.customer("owner@example.com").await;
    let other = app.customer("other@example.com").await;
    let order = order_id_from(&owner.buy(product, 1).await);

    let (status, page) = owner.get_text(&format!("/orders/{order}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains("Awaiting payment") && page.contains("Pay $10.00"),
        "{page}"
    );
    let before = app.db.ledger_rows();
    expect(
        other.get(&format!("/orders/{order}")).await,
        StatusCode::NOT_FOUND,
        "no order",
    )
    .await;
    expect(
        other.pay(order, GOOD_CARD).await,
        StatusCode::NOT_FOUND,
        "no order",
    )
    .await;
    expect(
        other.get("/orders/abc").await,
        StatusCode::NOT_FOUND,
        "no order",
    )
    .await;
    let (_, list) = other.get_text("/orders").await;
    assert!(
        !list.contains(&format!("#{order}")),
        "another customer's order is listed"
    );
    assert_eq!(app.db.ledger_rows(), before);
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM orders WHERE status = 'awaiting_payment'"),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payment_outcomes_and_refunds() {
    let app = spawn_app().await;
    let product = app.product(5, None).await;
    let buyer = app.customer("payer@example.com").await;

    // Approved: paid once; paying again is refused and charges nothing.
    let paid = order_id_from(&buyer.buy(product, 2).await);
    expect(
        buyer.pay(paid, "1234").await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "card number",
    )
    .await;
    assert_eq!(
        buyer.pay(paid, GOOD_CARD).await.status(),
        StatusCode::SEE_OTHER
    );
    expect(
        buyer.pay(paid, GOOD_CARD).await,
        StatusCode::CONFLICT,
        "already paid",
    )
    .await;
    assert_eq!(app.db.count("SELECT count(*) AS n FROM payments"), 1);
    let (_, page) = buyer.get_text(&format!("/orders/{paid}")).await;
    assert!(page.contains("Paid"), "{page}");

    // Declined: the units stay held for another card; at the last try they
    // come back, and the order cannot be paid later.
    let declined = order_id_from(&buyer.buy(product, 1).await);
    assert_eq!(app.db.stock(product), 2);
    assert_eq!(
        buyer.pay(declined, DECLINED_CARD).await.status(),
        StatusCode::SEE_OTHER
    );
    let (_, page) = buyer.get_text(&format!("/orders/{declined}")).await;
    assert!(page.contains("Your card was declined"), "{page}");
    assert_eq!(app.db.stock(product), 2);
    assert_eq!(
        buyer
            .decline_times(declined, flashsale::services::payment::CARD_TRIES - 1)
            .await
            .status(),
        StatusCode::SEE_OTHER
    );
    let (_, page) = buyer.get_text(&format!("/orders/{declined}")).await;
    assert!(page.contains("payment was declined 3 times"), "{page}");
    assert_eq!(app.db.stock(product), 3);
    expect(
        buyer.pay(declined, GOOD_CARD).await,
        StatusCode::CONFLICT,
        "declined",
    )
    .await;
    assert_eq!(app.db.count(&format!("SELECT count(*) AS n FROM stock_history WHERE order_id = {declined} AND reason = 'payment_failed'")), 1);

    // Past its deadline an order cannot be paid.
    let late = order_id_from(&buyer.buy(product, 1).await);
    app.db.count(&format!("WITH u AS (UPDATE orders SET payment_deadline = now() - interval '1 second' WHERE id = {late} RETURNING 1) SELECT count(*) AS n FROM u"));
    expect(
        buyer.pay(late, GOOD_CARD).await,
        StatusCode::CONFLICT,
        "time to pay",
    )
    .await;
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM payments WHERE order_id = {late}"
        )),
        0
    );

    // Refunds: admins only, paid orders only, once.
    let admin = app.admin().await;
    let stranger = app.browser();
    expect(
        buyer
            .post_form(&format!("/admin/orders/{paid}/refund"), &[])
            .await,
        StatusCode::FORBIDDEN,
        "administrators only",
    )
    .await;
    let response = stranger
        .post_form(&format!("/admin/orders/{paid}/refund"), &[])
        .await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(buyer.get("/admin").await.status(), StatusCode::FORBIDDEN);
    assert_eq!(stranger.get("/admin").await.status(), StatusCode::SEE_OTHER);
    expect(
        admin
            .post_form(&format!("/admin/orders/{late}/refund"), &[])
            .await,
        StatusCode::CONFLICT,
        "only a paid order",
    )
    .await;
    expect(
        admin
            .post(
                &format!("/admin/orders/{paid}/refund"),
                &[("csrf_token", "forged")],
            )
            .await,
        StatusCode::FORBIDDEN,
        "form has expired",
    )
    .await;
    let stock_before_refund = app.db.stock(product);
    assert_eq!(
        admin
            .post_form(&format!("/admin/orders/{paid}/refund"), &[])
            .await
            .status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(app.db.stock(product), stock_before_refund + 2);
    let rows = app.db.ledger_rows();
    expect(
        admin
            .post_form(&format!("/admin/orders/{paid}/refund"), &[])
            .await,
        StatusCode::CONFLICT,
        "already been refunded",
    )
    .await;
    assert_eq!(
        app.db.ledger_rows(),
        rows,
        "a second refund changes nothing"
    );
    assert_eq!(app.db.stock(product), stock_before_refund + 2);
    let (status, detail) = admin.get_text(&format!("/admin/orders/{paid}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        detail.contains("refund") && detail.contains("Refunded"),
        "{detail}"
    );
    let (_, dashboard) = admin.get_text("/admin").await;
    assert!(dashboard.contains("Ledger audit: clean"), "{dashboard}");
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn accounts_give_clear_answers() {
    let app = spawn_app().await;
    let first = app.customer("taken@example.com").await;
    let _ = first;
    let again = app.browser();
    expect(
        again
            .sign_up_form(&[("email", "Taken@Example.com"), ("password", PASSWORD)])
            .await,
        StatusCode::CONFLICT,
        "already exists",
    )
    .await;
    expect(
        again
            .sign_up_form(&[("email", "not-an-email"), ("password", PASSWORD)])
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "email address",
    )
    .await;
    expect(
        again
            .sign_up_form(&[("email", "new@example.com"), ("password", "short")])
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "at least 8",
    )
    .await;
    expect(
        again
            .post_form(
                "/login",
                &[
                    ("email", "taken@example.com"),
                    ("password", "wrong password"),
                ],
            )
            .await,
        StatusCode::FORBIDDEN,
        "do not match",
    )
    .await;
    expect(
        again
            .post_form(
                "/login",
                &[("email", "nobody@example.com"), ("password", PASSWORD)],
            )
            .await,
        StatusCode::FORBIDDEN,
        "do not match",
    )
    .await;
    expect(
        again
            .post(
                "/login",
                &[("email", "taken@example.com"), ("password", PASSWORD)],
            )
            .await,
        StatusCode::FORBIDDEN,
        "form has expired",
    )
    .await;
    assert_eq!(app.db.count("SELECT count(*) AS n FROM customers"), 1);

    let signed_in = Browser::sign_in(&app.address, "taken@example.com", PASSWORD).await;
    assert_eq!(signed_in.get("/orders").await.status(), StatusCode::OK);
    assert_eq!(
        signed_in.post_form("/logout", &[]).await.status(),
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        signed_in.get("/orders").await.status(),
        StatusCode::SEE_OTHER
    );

    let (status, health) = app.browser().get_text("/healthz").await;
    assert_eq!(status, StatusCode::OK, "{health}");
    let home = app.browser().get("/").await;
    assert_eq!(home.headers()["x-content-type-options"], "nosniff");
    assert!(home.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("frame-ancestors 'none'"));
}
