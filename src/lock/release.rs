//! Releasing a lock in Redis, and hearing other processes release theirs: a
//! release is published on a channel in the same round trip as the unlock,
//! and a listener thread rings the doorbell of the product's local queue.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use rslock::Lock;
use tokio::time::timeout;

use super::fifo::ProductQueues;
use super::quorum::REDIS_CALL_TIMEOUT;
use super::ProductLocks;
use crate::domain::ProductId;

/// Release: delete the key only if it still holds our value (what rslock's
/// unlock does) and, in the same round trip, wake waiters in other processes.
pub(super) const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
";

pub(super) fn channel(key_prefix: &str) -> String {
    format!("{key_prefix}promotion-product:released")
}

impl ProductLocks {
    /// Releases `lock` on every server and tells waiters in other processes
    /// that `product`'s lock is free. Best effort, like any Redlock unlock:
    /// a server that misses it lets the key expire with the lease.
    pub(super) async fn release_and_announce(&self, lock: &Lock, product: ProductId) {
        let channel = channel(&self.inner.key_prefix);
        let script = &self.inner.release;
        let _ = self
            .on_quorum(|mut connection| {
                let channel = channel.clone();
                async move {
                    script
                        .key(&*lock.resource)
                        .arg(&*lock.val)
                        .arg(channel)
                        .arg(product.get())
                        .invoke_async::<i64>(&mut connection)
                        .await
                }
            })
            .await;
    }
}

/// Subscribes to the release channel on every server (a cluster broadcasts
/// publishes to all its nodes, so any seed will do there) on a thread of its
/// own, so it outlives whichever request happened to create the locks.
/// Reconnects after errors; a lost message only costs a waiter the rest of
/// the holder's lease. Stops when the returned sender is dropped.
pub(super) fn spawn_listener(
    redis_urls: &[String],
    channel: &str,
    queues: &Arc<ProductQueues>,
) -> anyhow::Result<tokio::sync::watch::Sender<()>> {
    let clients = redis_urls
        .iter()
        .map(|url| redis::Client::open(url.as_str()))
        .collect::<Result<Vec<_>, _>>()?;
    let (stop, stopped) = tokio::sync::watch::channel(());
    let queues = Arc::downgrade(queues);
    let channel = channel.to_string();
    std::thread::Builder::new()
        .name("lock-release-listener".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    tracing::error!(%error, "no runtime for the lock release listener");
                    return;
                }
            };
            runtime.block_on(async move {
                let listeners = clients.into_iter().map(|client| {
                    let (queues, channel, mut stopped) =
                        (queues.clone(), channel.clone(), stopped.clone());
                    async move {
                        tokio::select! {
                            _ = stopped.changed() => {}
                            _ = listen(client, channel, queues) => {}
                        }
                    }
                });
                futures::future::join_all(listeners).await;
            });
        })?;
    Ok(stop)
}

async fn listen(client: redis::Client, channel: String, queues: Weak<ProductQueues>) {
    loop {
        let subscribed = async {
            let mut pubsub = timeout(REDIS_CALL_TIMEOUT, client.get_async_pubsub())
                .await
                .map_err(|_| anyhow::anyhow!("connect timed out"))??;
            pubsub.subscribe(&channel).await?;
            Ok::<_, anyhow::Error>(pubsub)
        }
        .await;
        if let Ok(pubsub) = subscribed {
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                let Some(queues) = queues.upgrade() else {
                    return;
                };
                if let Ok(product) = message.get_payload::<i64>() {
                    queues.ring(ProductId(product));
                }
            }
        }
        if queues.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
