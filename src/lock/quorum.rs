//! Talking to the Redis servers: rslock's manager takes and renews the lock
//! itself; everything else (tokens, the holder's lease, releases) goes to
//! every server at once and counts only when a majority answers.

use std::future::Future;
use std::time::Duration;

use rslock::LockManager;

use super::{LockError, ProductLocks};
use crate::redis_node::{RedisConnection, RedisNode};

/// How long a single Redis round trip of the lock protocol may take.
pub(super) const REDIS_CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// The lock manager and one kept connection per server: independent servers
/// for a Redlock quorum, or, with `cluster`, one Redis Cluster.
pub(super) fn connect(
    redis_urls: &[String],
    cluster: bool,
) -> anyhow::Result<(LockManager, Vec<RedisNode>)> {
    let nodes = if cluster {
        vec![RedisNode::cluster(redis_urls)?]
    } else {
        redis_urls
            .iter()
            .map(|url| RedisNode::single(url))
            .collect::<Result<Vec<_>, _>>()?
    };
    Ok((manager(redis_urls, cluster)?, nodes))
}

/// A lock manager with connections of its own, opened on first use.
pub(super) fn manager(redis_urls: &[String], cluster: bool) -> anyhow::Result<LockManager> {
    let mut manager = if cluster {
        LockManager::new_cluster(redis_urls.to_vec())?
    } else {
        let clients = redis_urls
            .iter()
            .map(|url| redis::Client::open(url.as_str()))
            .collect::<Result<Vec<_>, _>>()?;
        LockManager::from_clients(clients)
    };
    // One attempt per call: the waiting policy (deadline, wake-up on release)
    // is ours, and rslock's own sleeps would idle buyers behind a free lock.
    manager.set_retry(1, Duration::from_millis(1));
    Ok(manager)
}

/// Who holds a lock key, as a quorum of servers says.
pub(super) enum Holder {
    Nobody,
    /// A key without expiry: not ours to outwait, only a release frees it.
    Forever,
    For(Duration),
}

impl ProductLocks {
    /// Whether a majority of the Redis servers answer PING: the same quorum a lock needs.
    pub async fn quorum_reachable(&self) -> bool {
        let pings = self.inner.nodes.iter().map(|node| node.ping());
        let answered = futures::future::join_all(pings)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count();
        answered > self.inner.nodes.len() / 2
    }

    /// How long the current holder's lease has left (the longest any server
    /// reports), or `NoQuorum` when too few servers answer to form a quorum.
    pub(super) async fn holder_lease(&self, key: &str) -> Result<Holder, LockError> {
        let ttls = self
            .on_quorum(|mut connection| {
                let key = key.to_string();
                async move {
                    redis::cmd("PTTL")
                        .arg(key)
                        .query_async::<i64>(&mut connection)
                        .await
                }
            })
            .await?;
        // PTTL answers -2 for a missing key and -1 for a key without expiry.
        Ok(match ttls.into_iter().max().unwrap_or(-2) {
            -2 => Holder::Nobody,
            -1 => Holder::Forever,
            left => Holder::For(Duration::from_millis(left.max(0) as u64)),
        })
    }

    /// Runs `call` on every server at once and returns the answers, or
    /// `NoQuorum` unless a majority answered.
    pub(super) async fn on_quorum<T, C, Fut>(&self, call: C) -> Result<Vec<T>, LockError>
    where
        C: Fn(RedisConnection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let calls = self.inner.nodes.iter().map(|node| {
            let call = &call;
            async move {
                let answer = tokio::time::timeout(REDIS_CALL_TIMEOUT, async {
                    call(node.connection().await?).await
                })
                .await;
                match answer {
                    Ok(Ok(value)) => Some(value),
                    _ => {
                        node.reset().await;
                        None
                    }
                }
            }
        });
        let answers: Vec<T> = futures::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .collect();
        if answers.len() > self.inner.nodes.len() / 2 {
            Ok(answers)
        } else {
            Err(LockError::NoQuorum)
        }
    }
}
