//! Redis servers of a test's own, for tests that kill them or need a cluster,
//! and the keys a test leaves on the machine's Redis, removed when it ends.

use std::ffi::OsString;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{die_with_parent, free_port, wait_for_port, ChildGuard};

/// A Redis server of this test's own, on a free port, keeping nothing on disk.
pub fn start_redis() -> (ChildGuard, u16) {
    let port = free_port();
    (start_redis_on(port), port)
}

/// A Redis server on `port`: a fresh one, or one started again after it was killed.
pub fn start_redis_on(port: u16) -> ChildGuard {
    spawn_redis_server(port, &[])
}

/// Starts `redis-server` on `port` with `extra` arguments and waits until it listens.
fn spawn_redis_server(port: u16, extra: &[OsString]) -> ChildGuard {
    let child = die_with_parent(&mut Command::new("redis-server"))
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed (scripts/test installs it)");
    let guard = ChildGuard(child);
    wait_for_port(port);
    guard
}

/// A three-master Redis Cluster of this test's own, on free ports, made with
/// `redis-cli --cluster create`; its servers are stopped when it drops.
pub struct RedisCluster {
    pub urls: Vec<String>,
    _servers: Vec<ChildGuard>,
    dir: std::path::PathBuf,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let dir = std::env::temp_dir().join(format!(
            "flashsale-cluster-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut servers = Vec::new();
        let mut ports = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let extra: Vec<OsString> = vec![
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-node-timeout".into(),
                "2000".into(),
                "--cluster-config-file".into(),
                dir.join(format!("nodes-{port}.conf")).into(),
                "--dir".into(),
                dir.clone().into(),
            ];
            servers.push(spawn_redis_server(port, &extra));
            ports.push(port);
        }
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli is installed");
        assert!(
            created.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        // Wait until every node agrees the cluster is up.
        for port in &ports {
            let mut ok = false;
            for _ in 0..200 {
                let info = Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "cluster", "info"])
                    .output()
                    .unwrap();
                if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    ok = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(
                ok,
                "Redis Cluster node {port} did not reach cluster_state:ok"
            );
        }
        RedisCluster {
            urls: ports
                .iter()
                .map(|p| format!("redis://127.0.0.1:{p}"))
                .collect(),
            _servers: servers,
            dir,
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Keys of this test's own on the machine's Redis, removed (from each node
/// of `REDIS_URL`, by `SCAN` and `UNLINK`) when this is dropped, pass or
/// fail: the suite shares that Redis and never flushes it. Each pattern
/// holds a random id (a prefix's 32 hex digits, a namespace's 16), so it
/// matches nobody else's keys.
/// Best effort: a Redis that is down keeps nothing to remove.
#[derive(Default)]
pub struct OwnRedisKeys {
    patterns: std::sync::Mutex<Vec<String>>,
}

impl OwnRedisKeys {
    /// The keys under `prefix` (a `unique_prefix()`).
    pub fn under(prefix: &str) -> OwnRedisKeys {
        let keys = OwnRedisKeys::default();
        keys.add(format!("{prefix}*"));
        keys
    }

    /// The keys of a database's Redis namespace, whatever prefix they carry.
    pub fn of_namespace(&self, namespace: &str) {
        self.add(format!("*{namespace}:*"));
    }

    fn add(&self, pattern: String) {
        self.patterns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(pattern);
    }
}

impl Drop for OwnRedisKeys {
    fn drop(&mut self) {
        let patterns = self.patterns.lock().unwrap_or_else(|p| p.into_inner());
        let urls = std::env::var("REDIS_URL")
            .unwrap_or_else(|_| flashsale::config::Settings::DEFAULT_REDIS_URL.into());
        // Every Redlock node holds lock keys of its own.
        for url in urls.split(',').map(str::trim).filter(|url| !url.is_empty()) {
            remove_keys(url, &patterns);
        }
    }
}

fn remove_keys(url: &str, patterns: &[String]) {
    for pattern in patterns {
        if remove_keys_matching(url, pattern).is_err() {
            return;
        }
    }
}

/// Removes every key matching `pattern` from the Redis at `url` (SCAN pages
/// of 1,000 and UNLINK; never a FLUSH: the Redis is shared) and answers how
/// many it removed. Bounded: it gives up at the first error (redis-rs's own
/// scan iterator would send the same SCAN again forever) and after 10 s.
pub fn remove_keys_matching(url: &str, pattern: &str) -> Result<usize, String> {
    let failed = |e: redis::RedisError| e.to_string();
    let client = redis::Client::open(url).map_err(failed)?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(1))
        .map_err(failed)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(failed)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (mut cursor, mut removed) = (0_u64, 0_usize);
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1_000)
            .query(&mut conn)
            .map_err(failed)?;
        if !keys.is_empty() {
            removed += redis::cmd("UNLINK")
                .arg(&keys)
                .query::<usize>(&mut conn)
                .map_err(failed)?;
        }
        if next == 0 {
            return Ok(removed);
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("gave up removing {pattern} after 10 s"));
        }
        cursor = next;
    }
}
