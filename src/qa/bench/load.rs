//! The buyers' load: signed-up sessions sending requests back to back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use reqwest::StatusCode;

use crate::qa::harness::Browser;
use crate::qa::{new_histogram, record, summarize, Latency};

const PASSWORD: &str = "bench-buyer-password";

/// A signed-in buyer and the form token of its session.
#[derive(Clone)]
pub(super) struct Buyer {
    browser: Browser,
    token: String,
}

pub(super) async fn sign_up(base: &str, email: &str) -> anyhow::Result<Buyer> {
    let client = Browser::client_builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let browser = Browser::new(base, client);
    let response = browser.sign_up(email, PASSWORD).await?;
    if response.status() != StatusCode::SEE_OTHER {
        bail!("sign-up of {email} answered {}", response.status());
    }
    // Signing in starts a new session, with a CSRF token of its own.
    let token = browser.csrf().await?;
    Ok(Buyer { browser, token })
}

pub(super) enum Load {
    Buy { products: Vec<i64> },
    Get { path: String },
}

/// `concurrency` loops send requests back to back for `seconds`; `ok` counts answers with `expect`.
pub(super) async fn closed_loop(
    buyers: &[Buyer],
    load: Arc<Load>,
    concurrency: usize,
    seconds: f64,
    expect: StatusCode,
) -> (u64, u64, f64, Latency) {
    let ok = Arc::new(AtomicU64::new(0));
    let other = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut loops = Vec::with_capacity(concurrency);
    for n in 0..concurrency {
        let buyer = buyers[n % buyers.len()].clone();
        let (ok, other, load) = (ok.clone(), other.clone(), load.clone());
        loops.push(tokio::spawn(async move {
            let mut histogram = new_histogram();
            let mut i = n;
            while Instant::now() < deadline {
                let began = Instant::now();
                let request = match &*load {
                    Load::Buy { products } => {
                        let product = products[i % products.len()];
                        let key = uuid::Uuid::new_v4().to_string();
                        buyer
                            .browser
                            .buy(product, "1", &buyer.token, Some(&key))
                            .await
                    }
                    Load::Get { path } => buyer.browser.get(path).await,
                };
                let status = match request {
                    Ok(response) => {
                        let status = response.status();
                        let _ = response.bytes().await;
                        Some(status)
                    }
                    Err(_) => None,
                };
                record(&mut histogram, began.elapsed());
                if status == Some(expect) {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    other.fetch_add(1, Ordering::Relaxed);
                }
                i += concurrency;
            }
            histogram
        }));
    }
    let began = Instant::now();
    let mut histogram = new_histogram();
    for handle in loops {
        if let Ok(h) = handle.await {
            let _ = histogram.add(&h);
        }
    }
    let elapsed = began.elapsed().as_secs_f64();
    let ok = ok.load(Ordering::Relaxed);
    (
        ok,
        other.load(Ordering::Relaxed),
        ok as f64 / elapsed,
        summarize(&histogram),
    )
}
