//! A real SMTP server for the mail tests: Debian's aiosmtpd (installed by
//! `scripts/services`) on a loopback port, storing what it receives in a
//! maildir the test reads. Stopped by PID when the test ends, pass or fail.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{die_with_parent, free_port, ChildGuard};

/// One message as the server stored it.
#[derive(Debug, Clone)]
pub struct ReceivedMail {
    /// Header names in lower case, values unfolded.
    pub headers: HashMap<String, String>,
    /// Decoded from quoted-printable when sent so.
    pub body: String,
}

impl ReceivedMail {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
            .unwrap_or("")
    }

    pub fn subject(&self) -> &str {
        self.header("subject")
    }

    pub fn message_id(&self) -> &str {
        self.header("message-id")
    }

    /// The shop path of the first link to `prefix` (like `/account/confirm?`).
    pub fn link_path(&self, prefix: &str) -> Option<String> {
        let start = self.body.find(prefix)?;
        let rest = &self.body[start..];
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        Some(rest[..end].to_string())
    }
}

/// How the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answering {
    /// Stores and answers at once (`aiosmtpd.handlers.Mailbox`).
    AtOnce,
    /// Stores, then answers after `seconds` (`helpers/slow_mailbox.py`).
    After { seconds: u32 },
    /// Refuses for good (550) recipients named `refused-…`, stores the rest.
    RefusingSome,
}

pub struct SmtpServer {
    pub port: u16,
    pub maildir: PathBuf,
    guard: Option<ChildGuard>,
}

impl SmtpServer {
    /// A server on a free port with an empty maildir of its own.
    pub fn start() -> SmtpServer {
        let mut server = SmtpServer::stopped();
        server.resume(Answering::AtOnce);
        server
    }

    /// A port and maildir, with nothing listening yet (`resume` starts it).
    pub fn stopped() -> SmtpServer {
        let maildir =
            std::env::temp_dir().join(format!("flashsale-mail-{}", uuid::Uuid::new_v4().simple()));
        SmtpServer {
            port: free_port(),
            maildir,
            guard: None,
        }
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// Starts the server on its port and maildir (kept from before).
    pub fn resume(&mut self, answering: Answering) {
        assert!(self.guard.is_none(), "the SMTP server is already running");
        let helpers = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/helpers");
        let class = match answering {
            Answering::AtOnce => "aiosmtpd.handlers.Mailbox",
            Answering::After { .. } => "slow_mailbox.SlowMailbox",
            Answering::RefusingSome => "slow_mailbox.PickyMailbox",
        };
        let mut command = Command::new("/usr/bin/python3");
        die_with_parent(&mut command)
            .args(["-m", "aiosmtpd", "-n", "-l"])
            .arg(format!("127.0.0.1:{}", self.port))
            .args(["-c", class])
            .arg(&self.maildir)
            .env("PYTHONPATH", &helpers)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if let Answering::After { seconds } = answering {
            command.env("SLOW_MAILBOX_SECS", seconds.to_string());
        }
        let child = command.spawn().expect(
            "/usr/bin/python3 -m aiosmtpd starts (scripts/services installs python3-aiosmtpd)",
        );
        self.guard = Some(ChildGuard(child));
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "aiosmtpd did not listen on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server by its PID; what it stored stays.
    pub fn stop(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            guard.kill();
        }
    }

    /// Every message stored so far, oldest first.
    pub fn received(&self) -> Vec<ReceivedMail> {
        let Ok(entries) = std::fs::read_dir(self.maildir.join("new")) else {
            return Vec::new();
        };
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
            .filter_map(Result::ok)
            .map(|entry| {
                let at = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                (at, entry.path())
            })
            .collect();
        files.sort();
        files
            .into_iter()
            .map(|(_, path)| parse(&std::fs::read_to_string(&path).unwrap()))
            .collect()
    }

    /// Waits (polling the maildir) until at least `n` messages are stored,
    /// at most `timeout`; returns what is there.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<ReceivedMail> {
        let deadline = Instant::now() + timeout;
        loop {
            let received = self.received();
            if received.len() >= n || Instant::now() >= deadline {
                return received;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for SmtpServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.maildir);
    }
}

fn parse(raw: &str) -> ReceivedMail {
    let raw = raw.replace("\r\n", "\n");
    let (head, body) = raw.split_once("\n\n").unwrap_or((raw.as_str(), ""));
    let mut headers = HashMap::new();
    let mut last: Option<String> = None;
    for line in head.lines() {
        if line.starts_with([' ', '\t']) {
            if let Some(name) = &last {
                let value: &mut String = headers.get_mut(name).unwrap();
                value.push(' ');
                value.push_str(line.trim());
            }
            continue;
        }
        if let Some((name, value)) = line.split_once(':') {
            let name = name.trim().to_ascii_lowercase();
            headers.insert(name.clone(), value.trim().to_string());
            last = Some(name);
        }
    }
    let quoted_printable = headers
        .get("content-transfer-encoding")
        .is_some_and(|e| e.eq_ignore_ascii_case("quoted-printable"));
    let body = if quoted_printable {
        decode_quoted_printable(body)
    } else {
        body.to_string()
    };
    ReceivedMail { headers, body }
}

fn decode_quoted_printable(text: &str) -> String {
    let joined = text.replace("=\n", "");
    let bytes = joined.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' && i + 2 < bytes.len() {
            if let Ok(byte) = u8::from_str_radix(&joined[i + 1..i + 3], 16) {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
