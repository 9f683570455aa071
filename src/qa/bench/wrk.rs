//! Load from Debian's `wrk`, a separate process much faster than the shop,
//! driven by a generated Lua script: customers rotated per request, a fresh
//! idempotency key per buy, answers counted by status.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context};

use super::customers::Customer;
use super::lua::lua_string;
use super::sale_script::{sale_lua, SaleRequests};
use crate::qa::Latency;

pub(super) enum Requests<'a> {
    /// wrk's built-in request loop (no Lua per request): the generator at
    /// its fastest, for `/healthz`.
    Plain { path: String },
    /// GETs of `paths` in turn, as `customers` in turn (none: anonymous).
    /// Without `count`, answers are told apart only as below 400 or not:
    /// handing every page body to Lua would make wrk the bottleneck.
    Get {
        paths: Vec<String>,
        customers: &'a [Customer],
        count: bool,
    },
    /// The buy form of `products` in turn, as `customers` in turn, each
    /// request with its own idempotency key starting with `tag`.
    Buy {
        products: Vec<i64>,
        customers: &'a [Customer],
        tag: String,
    },
    /// The waiting-room join form: request k joins room `k / customers`
    /// (of `products`, in turn) as customer `k % customers`, so every
    /// request is a new place until all pairs are used. Each pair sends
    /// its own bot check, solved beforehand as the page's widget would:
    /// `solutions[customer * products.len() + room]`, the form field
    /// urlencoded. wrk cannot solve one, and a solution is spent by its join.
    Join {
        products: Vec<i64>,
        customers: &'a [Customer],
        solutions: &'a [String],
    },
    /// A sale with its crowd mixed in (see `sale_script`).
    Sale(SaleRequests<'a>),
}

/// What wrk saw in one run.
#[derive(Debug, Clone, Default)]
pub(super) struct WrkRun {
    pub requests: u64,
    pub seconds: f64,
    /// Connect, read and write errors and timeouts: requests with no answer.
    pub socket_errors: u64,
    /// Answers of status 400 or above, as wrk counts them.
    pub failing: u64,
    /// Answers by status (empty for `Plain`, which has no Lua per answer).
    pub statuses: BTreeMap<u16, u64>,
    pub latency: Latency,
}

impl WrkRun {
    pub fn count(&self, status: u16) -> u64 {
        self.statuses.get(&status).copied().unwrap_or(0)
    }
}

pub(super) const THREADS: usize = 2;
const MARK: &str = "FLASHSALE_BENCH";

pub(super) async fn wrk(
    base: &str,
    requests: &Requests<'_>,
    connections: usize,
    seconds: f64,
    script: &Path,
) -> anyhow::Result<WrkRun> {
    let threads = THREADS.min(connections);
    let text = match requests {
        Requests::Sale(sale) => sale_lua(sale, script, threads)? + &done_lua(),
        _ => lua(requests),
    };
    std::fs::write(script, text)?;
    let path = match requests {
        Requests::Plain { path } => path.as_str(),
        _ => "/",
    };
    let output = tokio::process::Command::new("wrk")
        .args(["-t", &threads.to_string()])
        .args(["-c", &connections.to_string()])
        .args(["-d", &format!("{}s", (seconds.round() as u64).max(1))])
        .args(["--latency", "--timeout", "10s", "-s"])
        .arg(script)
        .arg(format!("{base}{path}"))
        .output()
        .await
        .context("running wrk (Debian: apt-get install wrk)")?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "wrk failed: {}{}",
            text.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    parse(&text).with_context(|| format!("reading wrk's output:\n{text}"))
}

fn parse(text: &str) -> anyhow::Result<WrkRun> {
    let mut run = WrkRun::default();
    let ms = |us: f64| us / 1000.0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(MARK) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let number = |i: usize| -> anyhow::Result<f64> {
            fields
                .get(i)
                .context("short line")?
                .parse::<f64>()
                .context("not a number")
        };
        match fields.first().copied() {
            Some("requests") => run.requests = number(1)? as u64,
            Some("duration_us") => run.seconds = number(1)? / 1e6,
            Some("errors") => {
                // connect read write status timeout; "status" is answers >= 400, counted below.
                run.socket_errors = (number(1)? + number(2)? + number(3)? + number(5)?) as u64;
                run.failing = number(4)? as u64;
            }
            Some("status") => {
                *run.statuses.entry(number(1)? as u16).or_default() += number(2)? as u64;
            }
            Some("p50") => run.latency.p50_ms = ms(number(1)?),
            Some("p95") => run.latency.p95_ms = ms(number(1)?),
            Some("p99") => run.latency.p99_ms = ms(number(1)?),
            Some("max") => run.latency.max_ms = ms(number(1)?),
            _ => {}
        }
    }
    if run.seconds <= 0.0 {
        bail!("no summary from the script's done()");
    }
    Ok(run)
}

fn lua(requests: &Requests<'_>) -> String {
    let mut out = String::from("-- generated by `flashsale bench`\n");
    let (paths, customers, tag): (Vec<String>, &[Customer], Option<&str>) = match requests {
        Requests::Sale(_) => unreachable!("a sale's script is sale_script's"),
        Requests::Plain { .. } => (Vec::new(), &[], None),
        Requests::Join {
            products,
            customers,
            ..
        } => (
            products
                .iter()
                .map(|p| format!("/products/{p}/queue"))
                .collect(),
            customers,
            None,
        ),
        Requests::Get {
            paths, customers, ..
        } => (paths.clone(), customers, None),
        Requests::Buy {
            products,
            customers,
            tag,
        } => (
            products
                .iter()
                .map(|p| format!("/products/{p}/buy"))
                .collect(),
            customers,
            Some(tag.as_str()),
        ),
    };
    out.push_str("local customers = {\n");
    for customer in customers {
        // Every form's CSRF field; a buy adds its quantity and key.
        let csrf =
            serde_urlencoded::to_string([("csrf_token", &customer.csrf)]).unwrap_or_default();
        let _ = writeln!(
            out,
            "  {{ cookie = {}, csrf = {}, address = {} }},",
            lua_string(&customer.cookie),
            lua_string(&csrf),
            lua_string(&customer.address)
        );
    }
    out.push_str("}\nlocal paths = {\n");
    for path in &paths {
        let _ = writeln!(out, "  {},", lua_string(path));
    }
    out.push_str("}\nlocal solutions = {\n");
    if let Requests::Join { solutions, .. } = requests {
        for solution in solutions.iter() {
            let _ = writeln!(out, "  {},", lua_string(solution));
        }
    }
    out.push_str("}\n");
    let _ = writeln!(
        out,
        "local tag = {}\nlocal nthreads = {THREADS}\nlocal joining = {}",
        lua_string(tag.unwrap_or("")),
        matches!(requests, Requests::Join { .. })
    );
    out.push_str(
        r#"local threads = {}
function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end
"#,
    );
    if !paths.is_empty() {
        out.push_str(
            r#"function init(args)
  n = 0
  statuses = {}
end
-- Thread t sends as customers t, t + nthreads, ...: the threads never
-- share a customer at the same moment, and each request is the next one.
function request()
  n = n + 1
  local headers = {}
  local body = nil
  local method = "GET"
  local who = nil
  if #customers > 0 then
    who = customers[((n * nthreads + tid) % #customers) + 1]
    headers["Cookie"] = who.cookie
    headers["X-Forwarded-For"] = who.address
  end
  local path = paths[((n + tid) % #paths) + 1]
  if joining then
    local k = n * nthreads + tid
    local c = k % #customers
    local room = math.floor(k / #customers) % #paths
    who = customers[c + 1]
    headers["Cookie"] = who.cookie
    headers["X-Forwarded-For"] = who.address
    path = paths[room + 1]
    method = "POST"
    headers["Content-Type"] = "application/x-www-form-urlencoded"
    body = who.csrf .. "&" .. solutions[c * #paths + room + 1]
  elseif tag ~= "" then
    local key = tag .. "-" .. tid .. "-" .. n
    method = "POST"
    headers["Content-Type"] = "application/x-www-form-urlencoded"
    headers["Idempotency-Key"] = key
    body = "quantity=1&" .. who.csrf .. "&idempotency_key=" .. key
  end
  return wrk.format(method, path, headers, body)
end
"#,
        );
    }
    if !matches!(requests, Requests::Get { count: false, .. }) && !paths.is_empty() {
        out.push_str(
            r#"function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end
"#,
        );
    }
    out.push_str(&done_lua());
    out
}

/// wrk's summary and the threads' status counts, for `parse`.
fn done_lua() -> String {
    format!(
        r#"function done(summary, latency, requests)
  local mark = "{MARK}"
  io.write(string.format("%s requests %d\n", mark, summary.requests))
  io.write(string.format("%s duration_us %d\n", mark, summary.duration))
  local e = summary.errors
  io.write(string.format("%s errors %d %d %d %d %d\n", mark, e.connect, e.read, e.write, e.status, e.timeout))
  for _, p in ipairs({{50, 95, 99}}) do
    io.write(string.format("%s p%d %d\n", mark, p, latency:percentile(p)))
  end
  io.write(string.format("%s max %d\n", mark, latency.max))
  local total = {{}}
  for _, thread in ipairs(threads) do
    local counted = thread:get("statuses")
    if counted then
      for status, count in pairs(counted) do
        total[status] = (total[status] or 0) + count
      end
    end
  end
  for status, count in pairs(total) do
    io.write(string.format("%s status %d %d\n", mark, status, count))
  end
end
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lua_strings_escape_quotes_and_bytes() {
        assert_eq!(lua_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(lua_string("x\ny"), r#""x\010y""#);
    }

    #[test]
    fn the_summary_is_read_back() {
        let run = parse(
            "Running 1s test\nFLASHSALE_BENCH requests 10\nFLASHSALE_BENCH duration_us 2000000\n\
             FLASHSALE_BENCH errors 0 1 0 4 1\nFLASHSALE_BENCH p50 1500\nFLASHSALE_BENCH p99 9000\n\
             FLASHSALE_BENCH max 12000\nFLASHSALE_BENCH status 409 4\nFLASHSALE_BENCH status 303 5\n",
        )
        .unwrap();
        assert_eq!(run.requests, 10);
        assert_eq!(run.seconds, 2.0);
        assert_eq!(run.socket_errors, 2);
        assert_eq!(run.count(409), 4);
        assert_eq!(run.count(303), 5);
        assert_eq!(run.failing, 4);
        assert_eq!(run.latency.p99_ms, 9.0);
    }
}
