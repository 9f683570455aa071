//! The tests' browser: the QA harness's own, with a test's checks made at
//! each step (a failed request or a page without a form token fails the
//! test where it happened). Its client and base address are the harness
//! browser's, reached through `Deref`, for requests a test shapes by hand.

use std::future::Future;
use std::ops::Deref;
use std::time::Duration;

use flashsale::qa::harness;
use reqwest::{Response, StatusCode};

pub const PASSWORD: &str = "correct horse battery";

/// Extracts the CSRF token from a page's form.
pub fn csrf_from(html: &str) -> String {
    harness::csrf_token(html).unwrap_or_else(|| panic!("no csrf_token in page:\n{html}"))
}

/// One customer's (or admin's, or stranger's) browser session.
#[derive(Clone)]
pub struct Browser {
    /// For steps that may fail on purpose, e.g. while the server is killed.
    pub web: harness::Browser,
    pub email: String,
}

impl Deref for Browser {
    type Target = harness::Browser;

    fn deref(&self) -> &harness::Browser {
        &self.web
    }
}

impl Browser {
    pub fn new(base: &str) -> Browser {
        let client = harness::Browser::client_builder()
            .pool_max_idle_per_host(4)
            // Shorter than the server's 5 s keep-alive, so a pooled connection is
            // never reused at the instant the server closes it.
            .pool_idle_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        Browser::with_client(base, client)
    }

    pub fn with_client(base: &str, client: reqwest::Client) -> Browser {
        Browser {
            web: harness::Browser::new(base, client),
            email: String::new(),
        }
    }

    pub async fn get(&self, path: &str) -> Response {
        self.web.get(path).await.unwrap()
    }

    pub async fn get_text(&self, path: &str) -> (StatusCode, String) {
        let response = self.get(path).await;
        let status = response.status();
        (status, response.text().await.unwrap())
    }

    /// A CSRF token as a page of the shop would hand it out to this session.
    pub async fn csrf(&self) -> String {
        self.web.csrf().await.unwrap_or_else(|e| panic!("{e:#}"))
    }

    pub async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Response {
        self.web.post(path, fields).await.unwrap()
    }

    /// Posts a form with this session's CSRF token added.
    pub async fn post_form(&self, path: &str, fields: &[(&str, &str)]) -> Response {
        self.web
            .post_form(path, fields)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// The sign-up form with `fields`, its bot check solved as the page's
    /// widget solves it.
    pub async fn sign_up_form(&self, fields: &[(&str, &str)]) -> Response {
        self.web
            .post_sign_up(fields)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// A solved bot check for joining `product`'s waiting room, as its
    /// form's widget fills it in.
    pub async fn bot_check(&self, product: i64) -> String {
        self.web
            .solve_bot_check(Some(product))
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Joins `product`'s waiting room through its form, bot check solved.
    pub async fn join_waiting_room(&self, product: i64) -> Response {
        self.web
            .join_waiting_room(product)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    pub fn sign_up(base: &str, email: &str) -> impl Future<Output = Browser> + 'static {
        let mut browser = Browser::new(base);
        browser.email = email.to_string();
        async move {
            let email = browser.email.clone();
            let response = browser
                .web
                .sign_up(&email, PASSWORD)
                .await
                .unwrap_or_else(|e| panic!("{e:#}"));
            let status = response.status();
            let page = response.text().await.unwrap();
            let heading = page
                .split("<h1>")
                .nth(1)
                .and_then(|h| h.split("</h1>").next());
            assert_eq!(
                status,
                StatusCode::SEE_OTHER,
                "sign-up of {email} failed: {heading:?}"
            );
            browser
        }
    }

    pub async fn sign_in(base: &str, email: &str, password: &str) -> Browser {
        let mut browser = Browser::new(base);
        browser.email = email.to_string();
        browser
            .web
            .sign_in(email, password)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"));
        browser
    }

    pub async fn buy_with_token(&self, product: i64, quantity: &str, token: &str) -> Response {
        self.web.buy(product, quantity, token, None).await.unwrap()
    }

    /// A buy as the product page's form sends it, with its one-time key.
    pub async fn buy_with_key(&self, product: i64, quantity: &str, key: &str) -> Response {
        let token = self.csrf().await;
        self.post(
            &format!("/products/{product}/buy"),
            &[
                ("quantity", quantity),
                ("csrf_token", &token),
                ("idempotency_key", key),
            ],
        )
        .await
    }

    pub async fn buy(&self, product: i64, quantity: u32) -> Response {
        let token = self.csrf().await;
        self.buy_with_token(product, &quantity.to_string(), &token)
            .await
    }

    pub async fn pay(&self, order: i64, card: &str) -> Response {
        self.web
            .pay(order, card)
            .await
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Pays with the declined card until the order allows no more tries:
    /// the last decline gives its units back. The last answer.
    pub async fn decline_to_the_end(&self, order: i64) -> Response {
        self.decline_times(order, flashsale::services::payment::CARD_TRIES)
            .await
    }

    /// Pays with the declined card `times` times, each answered with the
    /// order page (303); the last answer.
    pub async fn decline_times(&self, order: i64, times: i64) -> Response {
        let mut last = None;
        for _ in 0..times {
            let response = self.pay(order, harness::DECLINED_CARD).await;
            assert_eq!(response.status(), StatusCode::SEE_OTHER, "a decline");
            last = Some(response);
        }
        last.expect("at least one decline")
    }
}

/// The order id a successful buy redirected to.
pub fn order_id_from(response: &Response) -> i64 {
    let location = response
        .headers()
        .get("location")
        .expect("a redirect")
        .to_str()
        .unwrap();
    location
        .trim_start_matches("/orders/")
        .parse()
        .unwrap_or_else(|_| panic!("unexpected location {location}"))
}
