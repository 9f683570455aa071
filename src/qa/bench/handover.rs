//! How long a product's lock sits free between holders, measured on the
//! lock clients alone (no database).

use std::sync::Arc;
use std::time::Duration;

use super::Handover;
use crate::qa::{new_histogram, record, summarize};

/// Release-to-next-holder gaps of one product's lock, with `instances`
/// separate lock clients (as separate processes would have) and `tasks`
/// contenders in each, all looping acquire → release for `seconds`.
/// With several instances only hand-overs between instances count.
pub(super) async fn handover(
    redis_urls: &[String],
    prefix: &str,
    instances: usize,
    tasks: usize,
    seconds: f64,
) -> anyhow::Result<Handover> {
    let product = crate::domain::ProductId(1);
    let prefix = format!("{prefix}handover{instances}:");
    let clients = (0..instances)
        .map(|_| {
            crate::lock::ProductLocks::new(
                redis_urls,
                false,
                &prefix,
                Duration::from_secs(10),
                Duration::from_secs(10),
                true,
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let holds = Arc::new(std::sync::Mutex::new(Vec::new()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(seconds);
    let mut contenders = Vec::new();
    for (instance, locks) in clients.iter().enumerate() {
        for _ in 0..tasks {
            let (locks, holds) = (locks.clone(), holds.clone());
            contenders.push(tokio::spawn(async move {
                while tokio::time::Instant::now() < deadline {
                    let Ok(held) = locks.acquire(vec![product]).await else {
                        continue;
                    };
                    let acquired = tokio::time::Instant::now();
                    let releasing = tokio::time::Instant::now();
                    held.release().await;
                    holds
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((acquired, releasing, instance));
                }
            }));
        }
    }
    for contender in contenders {
        contender.await?;
    }
    let mut holds = std::mem::take(&mut *holds.lock().unwrap_or_else(|p| p.into_inner()));
    holds.sort_by_key(|(acquired, _, _)| *acquired);
    let mut histogram = new_histogram();
    let mut handovers = 0;
    for pair in holds.windows(2) {
        let ((_, released, from), (acquired, _, to)) = (pair[0], pair[1]);
        if instances > 1 && from == to {
            continue;
        }
        record(&mut histogram, acquired.saturating_duration_since(released));
        handovers += 1;
    }
    Ok(Handover {
        scope: String::new(),
        handovers,
        holds: holds.len() as u64,
        gap: summarize(&histogram),
    })
}
