//! Processes a test starts: each dies with the test, pass or fail.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A process this test started; killed by PID when the guard drops, pass or fail.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Children die with the test process even if it is killed before guards run.
/// The "parent" is the thread that spawned the child: one started from a
/// thread that ends (a `std::thread` that returns, an idle blocking-pool
/// thread) is killed then, so start children from a thread that lives as
/// long as they should.
pub fn die_with_parent(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    }
}

pub fn wait_for_port(port: u16) {
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on port {port}");
}

/// The release binary when `scripts/test` has built it (as production runs),
/// else the debug one this test was built with.
pub fn server_binary() -> PathBuf {
    let debug = PathBuf::from(env!("CARGO_BIN_EXE_flashsale"));
    let release = debug
        .parent()
        .and_then(|d| d.parent())
        .map(|t| t.join("release").join("flashsale"));
    match release {
        Some(path) if path.exists() => path,
        _ => {
            eprintln!("release binary not built; using {}", debug.display());
            debug
        }
    }
}

/// The real `flashsale serve` binary as a separate process on a free port.
pub struct ServerProcess {
    pub guard: ChildGuard,
    pub address: String,
}

pub fn start_server_process(
    db_url: &str,
    redis_prefix: &str,
    session_key_hex: &str,
    extra_env: &[(&str, &str)],
) -> ServerProcess {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_flashsale"));
    start_server_process_from(&binary, db_url, redis_prefix, session_key_hex, extra_env)
}

pub fn start_server_process_from(
    binary: &Path,
    db_url: &str,
    redis_prefix: &str,
    session_key_hex: &str,
    extra_env: &[(&str, &str)],
) -> ServerProcess {
    let mut command = Command::new(binary);
    die_with_parent(&mut command)
        .arg("serve")
        .env("DATABASE_URL", db_url)
        .env("REDIS_KEY_PREFIX", redis_prefix)
        .env("SESSION_KEY", session_key_hex)
        .env("BIND", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        // As `Settings::for_tests`: the suite's clients are many, from one
        // address; the door's own tests set it as a real shop has it.
        .env("SIGNUP_CHECK_WORK", "1")
        .env("JOIN_CHECK_WORK", "1")
        .env("SIGNUPS_PER_ADDRESS", "1000000000")
        .env("JOINS_PER_ADDRESS", "1000000000")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (key, value) in extra_env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("the flashsale binary starts");
    let stdout = child.stdout.take().unwrap();
    let guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let address = line
        .trim()
        .strip_prefix("flashsale listening on ")
        .unwrap_or_else(|| panic!("unexpected first line from flashsale serve: {line:?}"))
        .to_string();
    ServerProcess { guard, address }
}
