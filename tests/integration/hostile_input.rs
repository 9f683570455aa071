//! Hostile input over HTTP, beyond bad_input's hand-picked cases:
//! every form field and every path id gets the same table of hostile values
//! (and, for a few fields, a few hundred generated ones), every POST route
//! gets oversized and non-form bodies. Each answer must be a 4xx page that
//! explains itself, never a 5xx; an answer may succeed only if the form's
//! own parser accepts the value; and the ledger and stock never move.

use crate::helpers::hostile::{hostile_text, hostile_values, SCRIPT};
use crate::helpers::*;
use flashsale::web::forms::{
    AdjustForm, BuyForm, CartForm, CredentialsForm, CsrfOnlyForm, OrderSearch, PayForm, SaleFields,
};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use reqwest::StatusCode;
use serde::de::DeserializeOwned;

/// Everything a refused request must leave as it was.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    orders: i64,
    order_items: i64,
    stock_history: i64,
    payments: i64,
    customers: i64,
    products: i64,
    /// Changes if any product's stock changes.
    stock_checksum: i64,
}

fn snapshot(db: &TestDb) -> Snapshot {
    let count = |table: &str| db.count(&format!("SELECT count(*) AS n FROM {table}"));
    Snapshot {
        orders: count("orders"),
        order_items: count("order_items"),
        stock_history: count("stock_history"),
        payments: count("payments"),
        customers: count("customers"),
        products: count("products"),
        stock_checksum: db
            .count("SELECT COALESCE(sum(id * 1000003 + stock), 0)::int8 AS n FROM products"),
    }
}

/// A shop with a customer, an admin and one of each kind of product and order.
struct Scene {
    app: TestApp,
    stranger: Browser,
    buyer: Browser,
    admin: Browser,
    /// On sale now, 5 units.
    open: i64,
    /// On sale from an hour from now: a well-formed buy of it is refused.
    upcoming: i64,
    /// The buyer's order of 1 unit of `open`, awaiting payment.
    order: i64,
}

const TAKEN_EMAIL: &str = "buyer@example.com";
/// A well-formed stock adjustment here is refused as "no such product".
const NO_SUCH_PRODUCT_STOCK: &str = "/admin/products/999999/stock";

impl Scene {
    async fn new() -> Scene {
        let app = spawn_app().await;
        let open = app.product(5, None).await;
        let upcoming = app.upcoming_product(5).await;
        let buyer = app.customer(TAKEN_EMAIL).await;
        let order = order_id_from(&buyer.buy(open, 1).await);
        let admin = app.admin().await;
        Scene {
            stranger: app.browser(),
            app,
            buyer,
            admin,
            open,
            upcoming,
            order,
        }
    }

    /// The sale form as an admin would fill it in for a valid upcoming sale.
    fn sale_fields(&self) -> Vec<(&'static str, String)> {
        let start = chrono::Utc::now() + chrono::Duration::hours(2);
        vec![
            ("name", "Lamp".into()),
            ("description", "A lamp.".into()),
            ("price", "12.50".into()),
            ("stock", "3".into()),
            ("per_customer_limit", "2".into()),
            ("starts_at", flashsale::web::forms::form_time(&start)),
            ("ends_at", String::new()),
        ]
    }
}

fn encode(fields: &[(&str, &str)]) -> String {
    serde_urlencoded::to_string(fields).unwrap()
}

async fn post_raw(
    browser: &Browser,
    path: &str,
    content_type: Option<&str>,
    body: String,
) -> reqwest::Response {
    let mut request = browser
        .client
        .post(format!("{}{}", browser.base, path))
        .body(body);
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    request.send().await.unwrap()
}

/// Checks one answer: never a 5xx; a 4xx is a page that explains itself and
/// shows no markup it was sent; success only for input the parser accepts.
async fn check_answer(what: &str, response: reqwest::Response, parser_accepts: bool) -> StatusCode {
    let status = response.status();
    let body = response.text().await.unwrap();
    assert!(
        !status.is_server_error(),
        "{what}: answered {status}\n{body}"
    );
    if !parser_accepts {
        assert!(
            status.is_client_error(),
            "{what}: its parser refuses it, but the shop answered {status}"
        );
    }
    if status.is_client_error() {
        assert!(
            body.starts_with("<!doctype html>") && body.contains("role=\"alert\""),
            "{what}: {status} without an explanation page:\n{body}"
        );
    }
    assert!(!body.contains(SCRIPT), "{what}: markup echoed unescaped");
    status
}

/// Posts `base` with `field` set to `value` (urlencoded already) and checks
/// the answer against what the form's parser makes of the same body.
async fn post_field<F: DeserializeOwned>(
    browser: &Browser,
    path: &str,
    base: &[(&str, &str)],
    field: &str,
    value: &str,
    label: &str,
    parse: impl Fn(&F) -> bool,
) -> StatusCode {
    let token = browser.csrf().await;
    let others: Vec<(&str, &str)> = base
        .iter()
        .copied()
        .filter(|(name, _)| *name != field)
        .chain([("csrf_token", token.as_str())])
        .collect();
    let body = format!("{}&{field}={value}", encode(&others));
    let form: F = serde_urlencoded::from_str(&body).unwrap();
    let response = post_raw(
        browser,
        path,
        Some("application/x-www-form-urlencoded"),
        body,
    )
    .await;
    check_answer(
        &format!("POST {path} {field}={label}"),
        response,
        parse(&form),
    )
    .await
}

/// Every hostile value in `field`; returns how many were answered with success.
async fn fuzz_field<F: DeserializeOwned>(
    browser: &Browser,
    path: &str,
    base: &[(&str, &str)],
    field: &str,
    parse: impl Fn(&F) -> bool + Copy,
) -> usize {
    let mut succeeded = 0;
    for (label, value) in hostile_values() {
        let status = post_field(browser, path, base, field, &value, label, parse).await;
        succeeded += usize::from(!status.is_client_error());
    }
    succeeded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_form_field_refuses_hostile_values_and_writes_nothing() {
    let scene = Scene::new().await;
    let before = snapshot(&scene.app.db);
    let (buyer, admin, stranger) = (&scene.buyer, &scene.admin, &scene.stranger);

    // Well-formed values meet a rule that refuses them (a taken address, a
    // sale not started, a product that does not exist), so nothing is written.
    for field in ["email", "password"] {
        let base = [("email", TAKEN_EMAIL), ("password", PASSWORD)];
        let signup = |f: &CredentialsForm| f.sign_up().is_ok();
        let login = |f: &CredentialsForm| f.sign_in().is_ok();
        assert_eq!(
            fuzz_field(stranger, "/signup", &base, field, signup).await,
            0
        );
        let base = [("email", TAKEN_EMAIL), ("password", "not the password")];
        assert_eq!(fuzz_field(stranger, "/login", &base, field, login).await, 0);
    }
    let upcoming_buy = format!("/products/{}/buy", scene.upcoming);
    let quantity = |f: &BuyForm| f.quantity().is_ok();
    assert_eq!(
        fuzz_field(buyer, &upcoming_buy, &[], "quantity", quantity).await,
        0
    );
    let base = [("quantity", "1")];
    assert_eq!(
        fuzz_field(buyer, &upcoming_buy, &base, "idempotency_key", quantity).await,
        0
    );
    let add = |f: &CartForm| f.addition().is_ok();
    let change = |f: &CartForm| f.change().is_ok();
    let removal = |f: &CartForm| f.removal().is_ok();
    let open = scene.open.to_string();
    let no_such_product = [("product_id", "999999"), ("quantity", "1")];
    let open_product = [("product_id", open.as_str()), ("quantity", "1")];
    assert_eq!(
        fuzz_field(buyer, "/cart/add", &open_product, "product_id", add).await,
        0
    );
    assert_eq!(
        fuzz_field(buyer, "/cart/add", &no_such_product, "quantity", add).await,
        0
    );
    assert_eq!(
        fuzz_field(buyer, "/cart/update", &open_product, "product_id", change).await,
        0
    );
    // "0" removes a line, and removing an absent line is a harmless no-op.
    assert_eq!(
        fuzz_field(buyer, "/cart/update", &no_such_product, "quantity", change).await,
        1
    );
    assert_eq!(
        fuzz_field(buyer, "/cart/remove", &open_product, "product_id", removal).await,
        0
    );
    let any = |_: &CsrfOnlyForm| true;
    // The cart is empty, so even a valid key meets "your cart is empty".
    assert_eq!(
        fuzz_field(buyer, "/cart/checkout", &[], "idempotency_key", any).await,
        0
    );
    let card = |f: &PayForm| f.card().is_ok();
    let pay = format!("/orders/{}/pay", scene.order);
    assert_eq!(fuzz_field(buyer, &pay, &[], "card_number", card).await, 0);

    let adjustment = |f: &AdjustForm| f.adjustment().is_ok();
    let base = [("delta", "-1"), ("reason", "counted")];
    for field in ["delta", "reason"] {
        assert_eq!(
            fuzz_field(admin, NO_SUCH_PRODUCT_STOCK, &base, field, adjustment).await,
            0
        );
    }

    // A sale's name and description are free text: a valid one is saved (and
    // shown escaped); the rest of the form must be refused as typed.
    let fields = scene.sale_fields();
    let base: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let spec = |f: &SaleFields| f.spec(1).is_ok();
    let terms = |f: &SaleFields| f.terms(1).is_ok();
    let edit = format!("/admin/products/{}/edit", scene.upcoming);
    let mut created = 0;
    for (field, _) in &fields {
        created += fuzz_field(admin, "/admin/products", &base, field, spec).await;
        fuzz_field(admin, &edit, &base, field, terms).await;
    }
    let after = snapshot(&scene.app.db);
    assert_eq!(after.products, before.products + created as i64);
    assert_eq!(
        Snapshot {
            products: before.products,
            stock_checksum: before.stock_checksum,
            ..after
        },
        before,
        "only valid sale forms wrote anything"
    );
    let (_, list) = stranger.get_text("/").await;
    assert!(
        list.contains("&#60;script&#62;alert(1)&#60;/script&#62;") && !list.contains(SCRIPT),
        "a sale named like markup is listed escaped"
    );
    assert_eq!(scene.app.db.stock(scene.open), 4);
    assert_eq!(scene.app.db.stock(scene.upcoming), 5);
    scene.app.db.assert_audit_clean();
}

/// A form's fields as (name, value).
type OwnedFields = Vec<(&'static str, String)>;
type Fields<'a> = Vec<(&'a str, &'a str)>;

/// Each POST route with its valid fields, for the signed-in role it needs.
fn post_routes(scene: &Scene) -> Vec<(&Browser, String, OwnedFields)> {
    let (buyer, admin, stranger) = (&scene.buyer, &scene.admin, &scene.stranger);
    let fields = |pairs: &[(&'static str, &str)]| -> OwnedFields {
        pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
    };
    let (open, order) = (scene.open, scene.order);
    vec![
        (
            stranger,
            "/signup".into(),
            fields(&[("email", "new@example.com"), ("password", PASSWORD)]),
        ),
        (
            stranger,
            "/login".into(),
            fields(&[("email", TAKEN_EMAIL), ("password", PASSWORD)]),
        ),
        (
            buyer,
            format!("/products/{open}/buy"),
            fields(&[("quantity", "1")]),
        ),
        (
            buyer,
            "/cart/add".into(),
            fields(&[("product_id", &open.to_string()), ("quantity", "1")]),
        ),
        (
            buyer,
            "/cart/update".into(),
            fields(&[("product_id", &open.to_string()), ("quantity", "0")]),
        ),
        (
            buyer,
            "/cart/remove".into(),
            fields(&[("product_id", &open.to_string())]),
        ),
        (buyer, "/cart/checkout".into(), fields(&[])),
        (
            buyer,
            format!("/orders/{order}/pay"),
            fields(&[("card_number", GOOD_CARD)]),
        ),
        (admin, "/admin/products".into(), scene.sale_fields()),
        (
            admin,
            format!("/admin/products/{open}/edit"),
            scene.sale_fields(),
        ),
        (
            admin,
            format!("/admin/products/{open}/stock"),
            fields(&[("delta", "-1"), ("reason", "counted")]),
        ),
        (admin, format!("/admin/orders/{order}/refund"), fields(&[])),
        (
            admin,
            format!("/admin/products/{open}/resync-gate"),
            fields(&[]),
        ),
        (buyer, "/logout".into(), fields(&[])),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_csrf_tokens_and_bodies_are_refused_on_every_post_route() {
    let scene = Scene::new().await;
    let before = snapshot(&scene.app.db);
    let huge = "9".repeat(100 * 1024);
    for (browser, path, fields) in post_routes(&scene) {
        let pairs: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        // A forged token fails even when everything else would succeed.
        for (label, value) in hostile_values() {
            let body = format!("{}&csrf_token={value}", encode(&pairs));
            let response = post_raw(
                browser,
                &path,
                Some("application/x-www-form-urlencoded"),
                body,
            )
            .await;
            let status =
                check_answer(&format!("POST {path} csrf_token={label}"), response, false).await;
            assert_eq!(
                status,
                StatusCode::FORBIDDEN,
                "POST {path} csrf_token={label}"
            );
        }
        let token = browser.csrf().await;
        let mut with_token = pairs.clone();
        with_token.push(("csrf_token", &token));
        let form = encode(&with_token);
        let json = serde_json::to_string(&serde_json::Map::from_iter(
            with_token
                .iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v))),
        ))
        .unwrap();
        let multipart = format!(
            "--XyZ\r\nContent-Disposition: form-data; name=\"csrf_token\"\r\n\r\n{token}\r\n--XyZ--\r\n"
        );
        let wrong_types = [
            (Some("application/json"), json),
            (Some("multipart/form-data; boundary=XyZ"), multipart),
            (Some("text/plain"), form.clone()),
            (None, form.clone()),
        ];
        for (content_type, body) in wrong_types {
            let what = format!("POST {path} as {content_type:?}");
            let status = check_answer(
                &what,
                post_raw(browser, &path, content_type, body).await,
                false,
            )
            .await;
            assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{what}");
        }
        let oversized = format!("{form}&padding={huge}");
        let what = format!("POST {path} with a 100 KiB body");
        let response = post_raw(
            browser,
            &path,
            Some("application/x-www-form-urlencoded"),
            oversized,
        )
        .await;
        assert_eq!(
            check_answer(&what, response, false).await,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{what}"
        );
    }
    assert_eq!(snapshot(&scene.app.db), before);
}

/// Percent-encodes every byte of a path segment but letters and digits.
fn path_segment(label: &str, value: &str) -> String {
    if label == "invalid UTF-8" {
        return value.to_string();
    }
    let raw: String = serde_urlencoded::from_str::<Vec<(String, String)>>(&format!("v={value}"))
        .unwrap()
        .remove(0)
        .1;
    raw.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_path_id_refuses_hostile_values() {
    let scene = Scene::new().await;
    let before = snapshot(&scene.app.db);
    let (buyer, admin, stranger) = (&scene.buyer, &scene.admin, &scene.stranger);
    let pages: [(&Browser, &str); 6] = [
        (stranger, "/products/{}"),
        (buyer, "/orders/{}"),
        (admin, "/admin/orders/{}"),
        (admin, "/admin/orders/{}/refund"),
        (admin, "/admin/products/{}/edit"),
        (admin, "/admin/products/{}/history"),
    ];
    let sale = scene.sale_fields();
    let sale: Vec<(&str, &str)> = sale.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let actions: [(&Browser, &str, Fields); 6] = [
        (buyer, "/products/{}/buy", vec![("quantity", "1")]),
        (buyer, "/orders/{}/pay", vec![("card_number", GOOD_CARD)]),
        (admin, "/admin/orders/{}/refund", vec![]),
        (admin, "/admin/products/{}/edit", sale),
        (
            admin,
            "/admin/products/{}/stock",
            vec![("delta", "5"), ("reason", "counted")],
        ),
        (admin, "/admin/products/{}/resync-gate", vec![]),
    ];
    for (label, value) in hostile_values() {
        let id = path_segment(label, &value);
        for (browser, pattern) in pages {
            let path = pattern.replace("{}", &id);
            let what = format!("GET {pattern} with id {label}");
            let status = check_answer(&what, browser.get(&path).await, false).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{what}");
        }
        for (browser, pattern, fields) in &actions {
            let path = pattern.replace("{}", &id);
            let what = format!("POST {pattern} with id {label}");
            let response = browser.post_form(&path, fields).await;
            let status = check_answer(&what, response, false).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{what}");
        }
    }
    assert_eq!(snapshot(&scene.app.db), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_query_field_is_searched_or_refused() {
    let scene = Scene::new().await;
    let before = snapshot(&scene.app.db);
    let history = format!("/admin/products/{}/history", scene.open);
    for field in ["email", "status", "product", "page"] {
        for (label, value) in hostile_values() {
            let query = format!("{field}={value}");
            let search: OrderSearch = serde_urlencoded::from_str(&query).unwrap();
            let what = format!("GET /admin/orders?{field}={label}");
            let response = scene.admin.get(&format!("/admin/orders?{query}")).await;
            check_answer(&what, response, search.filter().is_ok()).await;
        }
    }
    for (label, value) in hostile_values() {
        // Any page number that is not one is the first page.
        let what = format!("GET {history}?page={label}");
        let response = scene.admin.get(&format!("{history}?page={value}")).await;
        assert_eq!(
            check_answer(&what, response, true).await,
            StatusCode::OK,
            "{what}"
        );
    }
    assert_eq!(snapshot(&scene.app.db), before);
}

/// A few hundred generated values, where hand-picked tables stop: the shop's
/// answer agrees with the parser for each, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn generated_values_get_the_answer_their_parser_gives() {
    let scene = Scene::new().await;
    let before = snapshot(&scene.app.db);
    let mut runner = TestRunner::deterministic();
    // Short enough that a few hundred requests stay quick; the table above covers huge.
    let strategy = hostile_text().prop_filter("fits a URL comfortably", |s| s.len() <= 2_000);
    let encode_value =
        |raw: &str| serde_urlencoded::to_string([("v", raw)]).unwrap()[2..].to_string();
    let upcoming_buy = format!("/products/{}/buy", scene.upcoming);
    for case in 0..100 {
        let raw = strategy.new_tree(&mut runner).unwrap().current();
        let value = encode_value(&raw);
        let label = format!(
            "generated #{case} {:?}",
            raw.chars().take(30).collect::<String>()
        );
        let quantity = |f: &BuyForm| f.quantity().is_ok();
        let base = [("quantity", "1")];
        post_field(
            &scene.buyer,
            &upcoming_buy,
            &base,
            "quantity",
            &value,
            &label,
            quantity,
        )
        .await;
        let add = |f: &CartForm| f.addition().is_ok();
        let base = [("product_id", "999999"), ("quantity", "1")];
        post_field(
            &scene.buyer,
            "/cart/add",
            &base,
            "quantity",
            &value,
            &label,
            add,
        )
        .await;
        let adjustment = |f: &AdjustForm| f.adjustment().is_ok();
        let base = [("delta", "-1"), ("reason", "counted")];
        post_field(
            &scene.admin,
            NO_SUCH_PRODUCT_STOCK,
            &base,
            "delta",
            &value,
            &label,
            adjustment,
        )
        .await;
    }
    assert_eq!(snapshot(&scene.app.db), before);
}
