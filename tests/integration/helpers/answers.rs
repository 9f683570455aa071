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
    let workers = buyers.len();
    let barrier = Arc::new(tokio::sync::Barrier::new(workers));
    let tasks = buyers.into_iter().enumerate().map(|(worker, buyer)| {
        let barrier = barrier.clone();
        tokio::spawn(async move {
            let token = buyer.csrf().await;
            barrier.wait().await;
            let mut statuses = Vec::new();
            for _ in (worker..requests).step_by(workers) {
                statuses.push(checked_status(
                    buyer.buy_with_token(product, "1", &token).await,
                ));
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
