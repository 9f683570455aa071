//! One Redis deployment as the shop talks to it: a single server or a
//! Redis Cluster, behind kept-open connections that are re-established
//! after an error.
//!
//! A multiplexed connection is driven by a task on the runtime that opened
//! it. Each actix worker is a runtime of its own on its own thread, so one
//! connection for the whole process would send every call across threads
//! twice (to the driver and back), two wake-ups and two context switches per
//! call that cost more than the call itself. Each thread keeps its own.

use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

enum Endpoint {
    Single(Box<redis::Client>),
    Cluster(Box<ClusterClient>),
}

/// A connection to either kind; commands and scripts route the same way
/// (on a cluster, by their keys' slot).
#[derive(Clone)]
pub enum RedisConnection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConnection::Single(c) => c.req_packed_command(cmd),
            RedisConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConnection::Single(c) => c.req_packed_commands(cmd, offset, count),
            RedisConnection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConnection::Single(c) => c.get_db(),
            RedisConnection::Cluster(c) => c.get_db(),
        }
    }
}

pub struct RedisNode {
    endpoint: Endpoint,
    /// Per calling thread; never held across an await.
    connections: Mutex<HashMap<ThreadId, RedisConnection>>,
    /// One connection attempt at a time, so a burst after a reset opens one
    /// connection per thread, not one per request.
    connecting: tokio::sync::Mutex<()>,
}

impl RedisNode {
    pub fn single(url: &str) -> RedisResult<RedisNode> {
        Ok(RedisNode::new(Endpoint::Single(Box::new(
            redis::Client::open(url)?,
        ))))
    }

    pub fn cluster(seed_urls: &[String]) -> RedisResult<RedisNode> {
        let client = ClusterClient::new(seed_urls.to_vec())?;
        Ok(RedisNode::new(Endpoint::Cluster(Box::new(client))))
    }

    fn new(endpoint: Endpoint) -> RedisNode {
        RedisNode {
            endpoint,
            connections: Mutex::new(HashMap::new()),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    fn kept(&self, thread: ThreadId) -> Option<RedisConnection> {
        self.connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&thread)
            .cloned()
    }

    /// This thread's kept connection, opened on first use or after `reset`.
    pub async fn connection(&self) -> RedisResult<RedisConnection> {
        let thread = std::thread::current().id();
        if let Some(connection) = self.kept(thread) {
            return Ok(connection);
        }
        let _turn = self.connecting.lock().await;
        if let Some(connection) = self.kept(thread) {
            return Ok(connection);
        }
        let connecting = async {
            Ok::<_, redis::RedisError>(match &self.endpoint {
                Endpoint::Single(client) => {
                    RedisConnection::Single(client.get_multiplexed_async_connection().await?)
                }
                Endpoint::Cluster(client) => {
                    RedisConnection::Cluster(client.get_async_connection().await?)
                }
            })
        };
        let connection = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| {
                redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connecting to Redis timed out",
                ))
            })??;
        self.connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(thread, connection.clone());
        Ok(connection)
    }

    /// Drops the kept connections after an error, so the next calls
    /// reconnect: whatever broke one (a Redis restart) broke them all.
    pub async fn reset(&self) {
        self.connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    pub async fn ping(&self) -> bool {
        let attempt = async {
            let mut connection = self.connection().await?;
            redis::cmd("PING")
                .query_async::<String>(&mut connection)
                .await
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, attempt).await {
            Ok(Ok(_)) => true,
            _ => {
                self.reset().await;
                false
            }
        }
    }
}
