//! A Postgres server of a test's own: `initdb` into a temporary directory and
//! `postgres` on a free port, so a test can crash and restart it without
//! touching the machine's shared server.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use diesel::{Connection, PgConnection, RunQueryDsl};

use super::{die_with_parent, free_port, ChildGuard};

const DATABASE: &str = "flashsale";

pub struct PrivatePostgres {
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
    server: Option<ChildGuard>,
}

impl PrivatePostgres {
    /// A migrated, empty shop database on a new server.
    pub fn start() -> PrivatePostgres {
        let bin = server_bin_dir();
        let dir =
            std::env::temp_dir().join(format!("flashsale-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        if let Some((uid, gid)) = unprivileged_owner() {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        }
        let initdb = as_server_user(&mut Command::new(bin.join("initdb")))
            .current_dir(&dir)
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .expect("initdb runs (scripts/services installs postgresql)");
        assert!(
            initdb.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&initdb.stderr)
        );
        let mut postgres = PrivatePostgres {
            port: free_port(),
            dir,
            bin,
            server: None,
        };
        flashsale::db::init_libpq();
        postgres.restart();
        let mut admin = PgConnection::establish(&postgres.url_of("postgres")).unwrap();
        diesel::sql_query(format!("CREATE DATABASE {DATABASE}"))
            .execute(&mut admin)
            .unwrap();
        flashsale::db::run_migrations(&postgres.url()).unwrap();
        postgres
    }

    pub fn url(&self) -> String {
        self.url_of(DATABASE)
    }

    fn url_of(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The server's own log, kept with its data until the test ends.
    fn log(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    /// Immediate shutdown (SIGQUIT): every backend is dropped mid-statement and
    /// the next start replays the WAL, as after a crash.
    pub fn crash(&mut self) {
        if let Some(mut server) = self.server.take() {
            // SAFETY: kill(2) on the PID of a child this guard still owns and has not reaped.
            unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGQUIT) };
            let _ = server.0.wait();
        }
    }

    /// Starts the server on the same port and data directory and waits until
    /// it accepts connections (after crash recovery, if any).
    pub fn restart(&mut self) {
        assert!(self.server.is_none(), "the server is still running");
        let child = die_with_parent(as_server_user(&mut Command::new(self.bin.join("postgres"))))
            .current_dir(&self.dir)
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-p", &self.port.to_string(), "-k"])
            .arg(&self.dir)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=100",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.log()).unwrap())
            .spawn()
            .expect("postgres starts");
        self.server = Some(ChildGuard(child));
        let deadline = Instant::now() + Duration::from_secs(30);
        while PgConnection::establish(&self.url_of("postgres")).is_err() {
            assert!(
                Instant::now() < deadline,
                "the private Postgres on port {} did not come up:\n{}",
                self.port,
                std::fs::read_to_string(self.log()).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        self.crash();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The newest installed server's binaries (Debian keeps them off PATH).
fn server_bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, bin)) => bin,
        None => which_dir("postgres")
            .expect("the PostgreSQL server is installed (scripts/services installs it)"),
    }
}

fn which_dir(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).find(|dir| dir.join(program).is_file()))
}

/// Postgres refuses to run as root: as root, the server runs as the
/// `postgres` OS user the server package creates.
fn unprivileged_owner() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new("postgres").unwrap();
    // SAFETY: getpwnam returns a pointer to static storage or null; it is read at once.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !entry.is_null(),
        "running as root needs the `postgres` OS user"
    );
    // SAFETY: checked non-null above.
    let entry = unsafe { &*entry };
    Some((entry.pw_uid, entry.pw_gid))
}

fn as_server_user(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    if let Some((uid, gid)) = unprivileged_owner() {
        command.uid(uid).gid(gid);
    }
    command
}
