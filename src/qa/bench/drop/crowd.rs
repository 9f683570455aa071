//! The drop's load generator: a tokio driver in this process (the shop
//! runs as its own process), every request timed on its own so a buyer's
//! wait can be told apart from a refused customer's. At most `connections`
//! requests are on the wire at once, over as many keep-alive connections;
//! the rest of a crowd waits its turn in the driver, and that queue is
//! part of the time a customer waits from the moment they clicked.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use reqwest::header::COOKIE;
use serde::Serialize;
use tokio::sync::Semaphore;

use super::super::wrk::Customer;
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

pub(super) struct Crowd {
    client: reqwest::Client,
    base: String,
    slots: Arc<Semaphore>,
    pub origin: Instant,
    log: Mutex<Vec<Event>>,
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

impl Crowd {
    pub fn new(base: &str, connections: usize, origin: Instant) -> anyhow::Result<Crowd> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(connections)
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(120))
            .build()?;
        Ok(Crowd {
            client,
            base: base.to_string(),
            slots: Arc::new(Semaphore::new(connections)),
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
        let _slot = self
            .slots
            .acquire()
            .await
            .expect("the semaphore stays open");
        let url = format!("{}{}", self.base, what.path);
        let mut request = match what.form {
            Some(fields) => self.client.post(url).form(fields),
            None => self.client.get(url),
        };
        if let Some(who) = what.who {
            request = request.header(COOKIE, &who.cookie);
        }
        let read_body = what.read_body;
        let kind = what.kind;
        let sent = Instant::now();
        let (status, body) = match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                // The body is read either way, so the connection can be reused.
                match response.text().await {
                    Ok(text) => (status, read_body.then_some(text)),
                    Err(_) => (0, None),
                }
            }
            Err(_) => (0, None),
        };
        let answered = Instant::now();
        let event = Event {
            kind,
            status,
            clicked_us: self.micros(clicked),
            sent_us: self.micros(sent),
            answered_us: self.micros(answered),
        };
        self.log.lock().expect("log lock").push(event);
        Answer { status, body }
    }

    pub fn events(&self) -> Vec<Event> {
        self.log.lock().expect("log lock").clone()
    }
}

/// How fast the driver itself goes: `requests` GETs of `/healthz` (no
/// database, no Redis, the shop's cheapest answer) through the same
/// connections as the drop, as fast as answers come back.
#[derive(Debug, Clone, Serialize)]
pub struct DriverCapacity {
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
