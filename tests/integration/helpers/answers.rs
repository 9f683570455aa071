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

/// A burst whose buyers answer a 503 the way a customer answers its
/// Retry-After: the same form again, under the same idempotency key, so a
/// buy that was only slow (a lock not had in time on a loaded machine)
/// still ends as sold or sold out, and a buy that did commit is not bought
/// twice. Each buy's statuses end in the last answer it got.
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
    resend_on_503: bool,
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
                let response = if resend_on_503 {
                    buy_until_answered(&buyer, product, &token).await
                } else {
                    buyer.buy_with_token(product, "1", &token).await
                };
                statuses.push(checked_status(response));
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

/// One unit under a key of its own, sent again on each 503 (at most 20
/// times); every 503 is logged with what its page said, so a run that
/// needed resends shows whether the shop was busy or a part was down.
async fn buy_until_answered(buyer: &Browser, product: i64, token: &str) -> Response {
    let key = uuid::Uuid::new_v4().to_string();
    let path = format!("/products/{product}/buy");
    let fields = [
        ("quantity", "1"),
        ("csrf_token", token),
        ("idempotency_key", key.as_str()),
    ];
    let mut response = buyer.post(&path, &fields).await;
    for _ in 0..20 {
        if response.status() != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        let page = response.text().await.unwrap_or_default();
        eprintln!(
            "buy {key} answered 503, sent again: {}",
            page_heading(&page)
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        response = buyer.post(&path, &fields).await;
    }
    response
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
