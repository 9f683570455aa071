//! What the shop answered, checked the way every test checks it.

use std::collections::BTreeMap;
use std::sync::Arc;

use reqwest::{Response, StatusCode};

use super::{order_id_from, Browser};

/// A buy's status, insisting that every 303 is an order (not a sign-in redirect).
pub fn checked_status(response: Response) -> StatusCode {
    if response.status() == StatusCode::SEE_OTHER {
        order_id_from(&response);
    }
    response.status()
}

/// A burst: each buyer takes its form token, all wait at one barrier, then
/// buyer w sends requests w, w+n, w+2n, ... of `requests`, one unit each.
pub async fn burst(buyers: Vec<Browser>, product: i64, requests: usize) -> Vec<StatusCode> {
    burst_of(buyers, product, requests, false).await
}

/// A burst whose buyers answer a 503 *busy* (the lock not had in time, as a
/// loaded machine can make it) the way a customer does: the same form again,
/// under the same idempotency key, so a buy that was only slow still ends as
/// sold or sold out, and a buy that did commit is not bought twice. Any
/// other 503 (a part of the shop down) is counted as it came. Each buy
/// counts once, by its last answer.
pub async fn burst_resending(
    buyers: Vec<Browser>,
    product: i64,
    requests: usize,
) -> Vec<StatusCode> {
    burst_of(buyers, product, requests, true).await
}

async fn burst_of(
    buyers: Vec<Browser>,
    product: i64,
    requests: usize,
    resend_when_busy: bool,
) -> Vec<StatusCode> {
    let workers = buyers.len();
    let barrier = Arc::new(tokio::sync::Barrier::new(workers));
    let tasks = buyers.into_iter().enumerate().map(|(worker, buyer)| {
        let barrier = barrier.clone();
        tokio::spawn(async move {
            let token = buyer.csrf().await;
            barrier.wait().await;
            let mut statuses = Vec::new();
            for _ in (worker..requests).step_by(workers) {
                statuses.push(if resend_when_busy {
                    buy_until_served(&buyer, product, &token).await
                } else {
                    checked_status(buyer.buy_with_token(product, "1", &token).await)
                });
            }
            statuses
        })
    });
    futures::future::join_all(tasks)
        .await
        .into_iter()
        .flat_map(|r| r.unwrap())
        .collect()
}

/// The heading of the page a buyer gets when the product's lock was not
/// had in time (`AppError::Busy`).
const BUSY: &str = "Too many buyers right now";

/// One unit under a key of its own, sent again on a busy 503 (at most 20
/// times); every 503 is logged with its page's heading.
async fn buy_until_served(buyer: &Browser, product: i64, token: &str) -> StatusCode {
    let key = uuid::Uuid::new_v4().to_string();
    for attempt in 0.. {
        let response = buyer
            .web
            .buy(product, "1", token, Some(&key))
            .await
            .unwrap();
        if response.status() != StatusCode::SERVICE_UNAVAILABLE {
            return checked_status(response);
        }
        let page = response.text().await.unwrap_or_default();
        let heading = page_heading(&page);
        eprintln!("buy {key} answered 503 ({heading}), attempt {attempt}");
        if heading != BUSY || attempt == 20 {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    unreachable!("the loop returns")
}

/// The text of a page's first `<h1>`, or the page itself when it has none.
fn page_heading(page: &str) -> &str {
    page.split_once("<h1>")
        .and_then(|(_, rest)| rest.split_once("</h1>"))
        .map_or(page, |(heading, _)| heading.trim())
}

/// Counts answers by status code.
pub fn tally(statuses: &[StatusCode]) -> BTreeMap<u16, usize> {
    let mut counts = BTreeMap::new();
    for status in statuses {
        *counts.entry(status.as_u16()).or_insert(0) += 1;
    }
    counts
}

/// Asserts a response's status and that its body says `text`; returns the body.
pub async fn expect_page(response: Response, status: StatusCode, text: &str) -> String {
    let got = response.status();
    let body = response.text().await.unwrap();
    assert_eq!(got, status, "expected {status} with {text:?}, body: {body}");
    assert!(body.contains(text), "expected {text:?} in: {body}");
    body
}

/// Asserts a 303 to `location`.
pub fn expect_redirect(response: &Response, location: &str) {
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()["location"], location);
}

/// The value of one sample line of the Prometheus text format, e.g.
/// `flashsale_purchases_total{outcome="purchased"}`.
pub fn metric_sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// `flashsale_redis_batch_calls` of `script` in `metrics`: the calls sent,
/// and the script calls they went in.
pub fn redis_batches(metrics: &str, script: &str) -> (f64, f64) {
    let sample = |part: &str| {
        metric_sample(
            metrics,
            &format!("flashsale_redis_batch_calls_{part}{{script=\"{script}\"}}"),
        )
        .unwrap_or(0.0)
    };
    (sample("sum"), sample("count"))
}

/// A 303 to the sign-in page (which may carry where to come back to, and
/// whether a form was refused: `/login?next=%2Forders`, `/login?why=act`).
pub fn expect_sign_in(response: &Response) {
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let location = response.headers()["location"].to_str().unwrap();
    assert!(
        location == "/login" || location.starts_with("/login?"),
        "sent to {location}, not the sign-in page"
    );
}
