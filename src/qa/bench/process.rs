//! The shop as its own process (`flashsale serve` of this same binary), so
//! the load generator and the shop never share a runtime, and the shop runs
//! exactly as it is deployed.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context};

pub(super) struct ShopProcess {
    child: Child,
    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub address: String,
}

impl ShopProcess {
    /// Serves the shop on `database_url` (migrated) under `redis_prefix`, on
    /// a port the OS picks; its log goes to `log`. Settings not given here
    /// come from the environment, as for `flashsale serve` itself.
    pub fn start(
        database_url: &str,
        redis_prefix: &str,
        session_key: &str,
        log: &Path,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("locating the flashsale binary")?;
        let log_file = std::fs::File::create(log)
            .with_context(|| format!("creating the shop's log {}", log.display()))?;
        let mut child = Command::new(exe)
            .arg("serve")
            .env("DATABASE_URL", database_url)
            .env("REDIS_KEY_PREFIX", redis_prefix)
            .env("BIND", "127.0.0.1:0")
            .env("SESSION_KEY", session_key)
            .env("METRICS", "on")
            // The crowd says where each customer comes from
            // (`Customer::address`), through this machine's loopback as a
            // load balancer would: the door's per-address join limit is
            // the shop's default, as in a real drop. (No one signs up.)
            .env("TRUSTED_PROXY", "127.0.0.1")
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .context("starting `flashsale serve`")?;
        let stdout = child.stdout.take().context("the shop's stdout")?;
        let (found, address) = mpsc::channel();
        // Reads the announced address, then keeps draining stdout so the shop
        // never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut found = Some(found);
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(address) = line.strip_prefix("flashsale listening on ") {
                    if let Some(found) = found.take() {
                        let _ = found.send(address.trim().to_string());
                    }
                }
            }
        });
        match address.recv_timeout(Duration::from_secs(60)) {
            Ok(address) => Ok(ShopProcess { child, address }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "`flashsale serve` announced no address within a minute; see {}",
                    log.display()
                )
            }
        }
    }
}

impl ShopProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ShopProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Removes a run's Redis keys (the answer records of every sold-out buy,
/// the admission markers of every order): the machine's Redis is shared,
/// and a benchmark leaves nothing of its own there. Only keys under the
/// run's own `prefix`; the rest of the server is never touched. Answers
/// how many keys went.
pub(super) fn forget_redis_keys(prefix: &str) -> redis::RedisResult<usize> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redis::Client::open(url.split(',').next().unwrap_or_default())?;
    let mut redis = client.get_connection()?;
    let keys: Vec<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg(format!("{prefix}*"))
        .arg("COUNT")
        .arg(10_000)
        .clone()
        .iter(&mut redis)?
        .collect::<Result<_, _>>()?;
    for chunk in keys.chunks(1_000) {
        redis::cmd("UNLINK").arg(chunk).exec(&mut redis)?;
    }
    Ok(keys.len())
}
