//! The wrk script of a sale with its crowd mixed in. In a drop most of the
//! crowd never gets a unit: while the buyers check out, others refresh the
//! product page and press "buy" on what is already gone. The mix here, of
//! every four requests: two buys of the sale, one buy of a sold-out product,
//! one view of the sale's product page, all signed in. The buys are half
//! so that the purchase path, which the targets measure, is most of the
//! load, and the crowd's cheap answers still take a share of the same
//! CPU a drop would give them.

use std::fmt::Write as _;
use std::path::Path;

use super::customers::Customer;
use super::lua::lua_string;

/// A sale and its crowd, by request: of every `MIX.len()` requests, the
/// buys go to `products` in turn as `buyers` in turn, each buyer sending
/// `buys_per_buyer` buys before the next takes over (a buyer comes back
/// only once every other one has bought); the crowd's sold-out buys (of
/// `sold_out`) and views of `page` go as `crowd` in turn.
pub(super) struct SaleRequests<'a> {
    pub products: Vec<i64>,
    pub buyers: &'a [Customer],
    pub buys_per_buyer: usize,
    pub sold_out: i64,
    pub page: String,
    pub crowd: &'a [Customer],
    pub tag: String,
}

/// The requests of one turn of the mix, in order.
pub(super) const MIX: [Kind; 4] = [Kind::Buy, Kind::Page, Kind::Buy, Kind::SoldOut];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Buy,
    SoldOut,
    Page,
}

impl Kind {
    fn lua(self) -> &'static str {
        match self {
            Kind::Buy => "\"buy\"",
            Kind::SoldOut => "\"gone\"",
            Kind::Page => "\"page\"",
        }
    }
}

/// The mix in words, for the report.
pub(super) fn mix_described() -> String {
    let count = |kind| MIX.iter().filter(|k| **k == kind).count();
    format!(
        "of every {} requests: {} buys of the sale, {} sold-out buy, {} product page view",
        MIX.len(),
        count(Kind::Buy),
        count(Kind::SoldOut),
        count(Kind::Page)
    )
}

/// Writes `customers` to `file`, one a line (cookie, tab, CSRF form field),
/// and the Lua that reads them at load into `{name}_cookie` and
/// `{name}_csrf`. Not as a table in the script: LuaJIT allows a function
/// 65,536 string constants, and a sale's distinct buyers are more. Two
/// arrays of strings, not a table per customer: the garbage collector
/// walks a hundred thousand of those on every cycle.
fn customers_from_file(
    out: &mut String,
    name: &str,
    customers: &[Customer],
    file: &Path,
) -> anyhow::Result<()> {
    let mut lines = String::with_capacity(customers.len() * 400);
    for customer in customers {
        let csrf =
            serde_urlencoded::to_string([("csrf_token", &customer.csrf)]).unwrap_or_default();
        anyhow::ensure!(
            !format!("{}{csrf}", customer.cookie).contains(['\t', '\n']),
            "a cookie or CSRF field with a tab or newline"
        );
        let _ = writeln!(lines, "{}\t{csrf}", customer.cookie);
    }
    // On the disk before the run: written back during it, tens of
    // megabytes of buyers would share the disk with the run's commits.
    let mut written = std::fs::File::create(file)?;
    std::io::Write::write_all(&mut written, lines.as_bytes())?;
    written.sync_all()?;
    let _ = writeln!(
        out,
        "local {name}_cookie, {name}_csrf = {{}}, {{}}\nfor line in io.lines({}) do\n  local cookie, csrf = line:match(\"^([^\\t]*)\\t(.*)$\")\n  {name}_cookie[#{name}_cookie + 1] = cookie\n  {name}_csrf[#{name}_csrf + 1] = csrf\nend",
        lua_string(&file.display().to_string())
    );
    Ok(())
}

/// Everything but `done()`: the tables, `setup`, `init`, `request` and
/// `response` (answers counted by status).
/// The customers go to files beside `script`.
pub(super) fn sale_lua(
    sale: &SaleRequests<'_>,
    script: &Path,
    threads: usize,
) -> anyhow::Result<String> {
    let mut out = String::new();
    let beside = |what: &str| script.with_extension(format!("{what}.tsv"));
    customers_from_file(&mut out, "buyers", sale.buyers, &beside("buyers"))?;
    customers_from_file(&mut out, "crowd", sale.crowd, &beside("crowd"))?;
    out.push_str("local paths = {\n");
    for product in &sale.products {
        let _ = writeln!(
            out,
            "  {},",
            lua_string(&format!("/products/{product}/buy"))
        );
    }
    out.push_str("}\nlocal mix = {");
    for kind in MIX {
        let _ = write!(out, " {},", kind.lua());
    }
    let _ = writeln!(
        out,
        " }}\nlocal sold_out = {}\nlocal page = {}\nlocal tag = {}\nlocal per_buyer = {}\nlocal nthreads = {threads}\nlocal ready = {}",
        lua_string(&format!("/products/{}/buy", sale.sold_out)),
        lua_string(&sale.page),
        lua_string(&sale.tag),
        sale.buys_per_buyer.max(1),
        lua_string(&format!("{}.ready-{}-", script.display(), sale.tag)),
    );
    out.push_str(
        r#"local ffi = require("ffi")
ffi.cdef("int usleep(unsigned int usec);")
local threads = {}
function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end
function init(args)
  n = 0
  bought = 0
  seen = 0
  statuses = {}
  started = false
  -- The customers just loaded are the heap's bulk: collected once now,
  -- not in steps between the run's first requests.
  collectgarbage("collect")
  io.open(ready .. tid, "w"):close()
end
-- wrk loads each thread's copy of this script (and its customer files)
-- only after starting the threads before it, so the first thread would
-- sell alone for as long as the others take to load: a slow first second
-- that is the load generator's, not the shop's. Every thread leaves a mark
-- once loaded (`init`, the last thing wrk does for it before starting it),
-- and each waits for all the marks before its first real request.
local function wait_for_every_thread()
  -- At most ten seconds: a thread that never marks must not hang wrk.
  for _ = 1, 10000 do
    local missing = false
    for t = 1, nthreads do
      local mark = io.open(ready .. t, "r")
      if not mark then
        missing = true
        break
      end
      mark:close()
    end
    if not missing then return end
    ffi.C.usleep(1000)
  end
end
local function buy(path, cookie, csrf, key)
  local headers = {}
  headers["Cookie"] = cookie
  headers["Content-Type"] = "application/x-www-form-urlencoded"
  headers["Idempotency-Key"] = key
  return wrk.format("POST", path, headers, "quantity=1&" .. csrf .. "&idempotency_key=" .. key)
end
-- Buy number k of the whole run (thread t sends k = t - 1, t - 1 + nthreads,
-- ...) is the (k % per_buyer + 1)th of buyer k / per_buyer: no two threads
-- share a buyer's turn, and no buyer comes back before all have bought.
function request()
  -- wrk builds thread 1's first request on its own main thread, before it
  -- loads the other threads, only to check it: that call must not wait.
  if not started and (n > 0 or tid ~= 1) then
    wait_for_every_thread()
    started = true
  end
  n = n + 1
  local kind = mix[(n % #mix) + 1]
  local key = tag .. "-" .. tid .. "-" .. n
  if kind == "buy" then
    local k = bought * nthreads + (tid - 1)
    bought = bought + 1
    local who = (math.floor(k / per_buyer) % #buyers_cookie) + 1
    return buy(paths[(k % #paths) + 1], buyers_cookie[who], buyers_csrf[who], key)
  end
  seen = seen + 1
  local who = ((seen * nthreads + tid) % #crowd_cookie) + 1
  if kind == "gone" then
    return buy(sold_out, crowd_cookie[who], crowd_csrf[who], key)
  end
  local headers = {}
  headers["Cookie"] = crowd_cookie[who]
  return wrk.format("GET", page, headers, nil)
end
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end
"#,
    );
    Ok(out)
}
