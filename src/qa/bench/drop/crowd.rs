//! The drop's load generator: a tokio driver in this process (the shop
//! runs as its own process), every request timed on its own so a buyer's
//! wait can be told apart from a refused customer's. At most `connections`
//! requests are on the wire at once, over as many keep-alive connections;
//! the rest of a crowd waits its turn in the driver, and that queue is
//! part of the time a customer waits from the moment they clicked.
//!
//! It speaks HTTP/1.1 itself over tokio's sockets (a request is one write
//! of preformatted bytes, an answer one buffered read): built on reqwest
//! it answered 17,000 `/healthz`/s on the 2-core test machine where this
//! does 35,000 to 39,000 (same connections, minutes apart), slower than
//! the shop's sold-out answers it has to stand for.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use super::super::customers::Customer;
use crate::qa::{new_histogram, record, summarize, Latency};

/// What a request was, for sorting the log afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Buy,
    Join,
    /// The waiting page (after a join, and the script's swaps).
    Page,
    Poll,
    Healthz,
}

/// One request as the driver lived it. Times are microseconds from the
/// run's origin (the sale's opening), so negative before it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Event {
    pub kind: Kind,
    /// 0: no answer (connection error or timeout).
    pub status: u16,
    /// When the customer acted: the opening for a crowd's buy, the timer's
    /// due time for a poll.
    pub clicked_us: i64,
    /// When it got a connection and went on the wire.
    pub sent_us: i64,
    pub answered_us: i64,
}

/// An answer with the body when asked for.
pub(super) struct Answer {
    pub status: u16,
    pub body: Option<String>,
}

/// One request: what it is, as whom, where, with which form.
pub(super) struct Request<'a> {
    pub kind: Kind,
    pub who: Option<&'a Customer>,
    pub path: &'a str,
    /// Some: a POST of this form; None: a GET.
    pub form: Option<&'a [(&'a str, &'a str)]>,
    pub read_body: bool,
}

/// How long an answer may take before it counts as none.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

type Connection = BufReader<TcpStream>;

pub(super) struct Crowd {
    /// `127.0.0.1:PORT`.
    host: String,
    idle: Mutex<Vec<Connection>>,
    slots: Semaphore,
    pub origin: Instant,
    log: Mutex<Vec<Event>>,
}

impl Crowd {
    pub fn new(base: &str, connections: usize, origin: Instant) -> anyhow::Result<Crowd> {
        let host = base
            .strip_prefix("http://")
            .ok_or_else(|| anyhow::anyhow!("the shop's address {base} is not http://"))?
            .trim_end_matches('/')
            .to_string();
        Ok(Crowd {
            host,
            idle: Mutex::new(Vec::with_capacity(connections)),
            slots: Semaphore::new(connections),
            origin,
            log: Mutex::new(Vec::new()),
        })
    }

    pub fn micros(&self, at: Instant) -> i64 {
        match at.checked_duration_since(self.origin) {
            Some(after) => after.as_micros() as i64,
            None => -(self.origin.duration_since(at).as_micros() as i64),
        }
    }

    /// Sends one request as `who` once a connection is free, logs it, and
    /// answers its status (and body when `read_body`).
    pub async fn send(&self, what: Request<'_>, clicked: Instant) -> Answer {
        let bytes = self.format(&what);
        let _slot = self
            .slots
            .acquire()
            .await
            .expect("the semaphore stays open");
        let sent = Instant::now();
        let idle = self.idle.lock().expect("pool lock").pop();
        let outcome = match idle {
            // A kept connection the shop may have closed meanwhile (its
            // keep-alive ends idle ones): once more on a new one.
            Some(mut kept) => match exchange(&mut kept, &bytes, what.read_body).await {
                Ok(answer) => Ok((kept, answer)),
                Err(_) => self.fresh(&bytes, what.read_body).await,
            },
            None => self.fresh(&bytes, what.read_body).await,
        };
        let answered = Instant::now();
        let (status, body) = match outcome {
            Ok((connection, (status, body, keep))) => {
                if keep {
                    self.idle.lock().expect("pool lock").push(connection);
                }
                (status, body)
            }
            Err(_) => (0, None),
        };
        let event = Event {
            kind: what.kind,
            status,
            clicked_us: self.micros(clicked),
            sent_us: self.micros(sent),
            answered_us: self.micros(answered),
        };
        self.log.lock().expect("log lock").push(event);
        Answer { status, body }
    }

    async fn fresh(
        &self,
        bytes: &[u8],
        read_body: bool,
    ) -> std::io::Result<(Connection, (u16, Option<String>, bool))> {
        let stream = TcpStream::connect(&self.host).await?;
        stream.set_nodelay(true)?;
        let mut connection = BufReader::with_capacity(16 * 1024, stream);
        let answer = exchange(&mut connection, bytes, read_body).await?;
        Ok((connection, answer))
    }

    fn format(&self, what: &Request<'_>) -> Vec<u8> {
        let method = if what.form.is_some() { "POST" } else { "GET" };
        let mut head = format!("{method} {} HTTP/1.1\r\nHost: {}\r\n", what.path, self.host);
        if let Some(who) = what.who {
            head.push_str(&format!(
                "Cookie: {}\r\nX-Forwarded-For: {}\r\n",
                who.cookie, who.address
            ));
        }
        let body = what
            .form
            .map(|fields| serde_urlencoded::to_string(fields).unwrap_or_default())
            .unwrap_or_default();
        if what.form.is_some() {
            head.push_str(&format!(
                "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        head.push_str("\r\n");
        head.push_str(&body);
        head.into_bytes()
    }

    pub fn events(&self) -> Vec<Event> {
        self.log.lock().expect("log lock").clone()
    }
}

/// Writes one request and reads its answer: status, body if wanted, and
/// whether the connection may be kept.
async fn exchange(
    connection: &mut Connection,
    request: &[u8],
    read_body: bool,
) -> std::io::Result<(u16, Option<String>, bool)> {
    tokio::time::timeout(ANSWER_TIMEOUT, async {
        connection.get_mut().write_all(request).await?;
        read_answer(connection, read_body).await
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time"))?
}

async fn read_answer(
    connection: &mut Connection,
    read_body: bool,
) -> std::io::Result<(u16, Option<String>, bool)> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut line = String::new();
    if connection.read_line(&mut line).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid("no status line"))?;
    let (mut length, mut chunked, mut keep) = (0usize, false, true);
    loop {
        line.clear();
        if connection.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let Some((name, value)) = header.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse().map_err(|_| invalid("content-length"))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("connection") {
            keep = !value.eq_ignore_ascii_case("close");
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            connection.read_line(&mut line).await?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| invalid("chunk size"))?;
            if size == 0 {
                // Trailers, up to the blank line.
                loop {
                    line.clear();
                    if connection.read_line(&mut line).await? == 0 || line.trim().is_empty() {
                        break;
                    }
                }
                break;
            }
            let from = body.len();
            body.resize(from + size + 2, 0);
            connection.read_exact(&mut body[from..]).await?;
            body.truncate(from + size);
        }
    } else {
        body.resize(length, 0);
        connection.read_exact(&mut body).await?;
    }
    let body = read_body.then(|| String::from_utf8_lossy(&body).into_owned());
    Ok((status, body, keep))
}

/// How fast the driver itself goes: `requests` GETs of `/healthz` (no
/// database, no Redis, the shop's cheapest answer) through the same
/// connections as the drop, as fast as answers come back.
#[derive(Debug, Clone, Serialize)]
pub struct DriverCapacity {
    /// Debian's `wrk` (its own request loop, 2 threads) against the same
    /// shop and connections just after, for comparison; None without wrk.
    pub wrk_per_second: Option<f64>,
    pub connections: usize,
    pub requests: usize,
    pub seconds: f64,
    pub per_second: f64,
    pub failed: usize,
    pub latency: Latency,
}

pub(super) async fn capacity(
    base: &str,
    connections: usize,
    requests: usize,
) -> anyhow::Result<DriverCapacity> {
    let origin = Instant::now();
    let crowd = Arc::new(Crowd::new(base, connections, origin)?);
    let tasks: Vec<_> = (0..requests)
        .map(|_| {
            let crowd = crowd.clone();
            tokio::spawn(async move {
                let healthz = Request {
                    kind: Kind::Healthz,
                    who: None,
                    path: "/healthz",
                    form: None,
                    read_body: false,
                };
                crowd.send(healthz, origin).await.status
            })
        })
        .collect();
    for task in tasks {
        task.await?;
    }
    let events = crowd.events();
    let failed = events.iter().filter(|e| e.status != 200).count();
    let first = events.iter().map(|e| e.sent_us).min().unwrap_or(0);
    let last = events.iter().map(|e| e.answered_us).max().unwrap_or(0);
    let seconds = (last - first) as f64 / 1e6;
    let latency = latency_of(events.iter(), |e| e.answered_us - e.sent_us);
    Ok(DriverCapacity {
        wrk_per_second: None,
        connections,
        requests,
        seconds,
        per_second: (requests - failed) as f64 / seconds.max(1e-9),
        failed,
        latency,
    })
}

/// Percentiles of `span` (microseconds) over `events`.
pub(super) fn latency_of<'a>(
    events: impl Iterator<Item = &'a Event>,
    span: impl Fn(&Event) -> i64,
) -> Latency {
    let mut histogram: Histogram<u64> = new_histogram();
    for event in events {
        record(
            &mut histogram,
            Duration::from_micros(span(event).max(0) as u64),
        );
    }
    summarize(&histogram)
}

/// Answers by status (0: no answer), lowest first.
pub(super) fn by_status<'a>(events: impl Iterator<Item = &'a Event>) -> Vec<(u16, u64)> {
    let mut counts = std::collections::BTreeMap::new();
    for event in events {
        *counts.entry(event.status).or_insert(0u64) += 1;
    }
    counts.into_iter().collect()
}
