//! The Redis behaviours the lab demonstrates on their own: what a pipeline,
//! MULTI, WATCH and Lua do and do not guarantee.

use std::fmt::Write as _;

use serde::Serialize;

/// One of the Redis behaviours the lab demonstrates on its own.
#[derive(Debug, Clone, Serialize)]
pub struct Experiment {
    pub name: &'static str,
    pub expected: String,
    pub observed: String,
    pub pass: bool,
}

fn experiment(name: &'static str, expected: String, observed: String) -> Experiment {
    Experiment {
        pass: expected == observed,
        name,
        expected,
        observed,
    }
}

/// Script that takes `ARGV[1]` units once per request id `KEYS[2]`: a repeat
/// with the same quantity answers what the first call answered, a repeat with
/// another quantity is refused, and neither touches the stock again.
const IDEMPOTENT_TAKE_LUA: &str = r"
local done = redis.call('HGET', KEYS[2], 'quantity')
if done then
  if done ~= ARGV[1] then return {'conflict', tonumber(done)} end
  return {'replay', tonumber(redis.call('HGET', KEYS[2], 'left'))}
end
local stock = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if stock < want then return {'sold-out', stock} end
local left = redis.call('DECRBY', KEYS[1], want)
redis.call('HSET', KEYS[2], 'quantity', ARGV[1], 'left', left)
redis.call('EXPIRE', KEYS[2], 3600)
return {'taken', left}
";

fn show(value: &redis::Value) -> String {
    match value {
        redis::Value::Nil => "nil".into(),
        redis::Value::Int(n) => n.to_string(),
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::Okay => "OK".into(),
        redis::Value::Array(items) => format!(
            "[{}]",
            items.iter().map(show).collect::<Vec<_>>().join(", ")
        ),
        redis::Value::ServerError(error) => {
            format!("error {}", error.code())
        }
        other => format!("{other:?}"),
    }
}

pub async fn run_experiments(redis_url: &str) -> anyhow::Result<Vec<Experiment>> {
    let client = redis::Client::open(redis_url)?;
    let prefix = format!("lab:{}:", uuid::Uuid::new_v4().simple());
    let key = |name: &str| format!("{prefix}{name}");
    let mut con = client.get_multiplexed_async_connection().await?;
    let mut out = Vec::new();

    // 1. A plain pipeline only batches round trips: DECRBY runs whatever GET saw.
    let stock = key("pipeline");
    let _: () = redis::cmd("SET")
        .arg(&stock)
        .arg(0)
        .query_async(&mut con)
        .await?;
    let (seen, after): (i64, i64) = redis::pipe()
        .cmd("GET")
        .arg(&stock)
        .cmd("DECRBY")
        .arg(&stock)
        .arg(1)
        .query_async(&mut con)
        .await?;
    out.push(experiment(
        "pipeline GET+DECRBY at stock 0",
        "GET 0, DECRBY -1: the decrement is not conditional".into(),
        format!("GET {seen}, DECRBY {after}: the decrement is not conditional"),
    ));

    // 2. Inside MULTI the GET's answer arrives with EXEC, too late to decide anything.
    let stock = key("multi");
    let _: () = redis::cmd("SET")
        .arg(&stock)
        .arg(0)
        .query_async(&mut con)
        .await?;
    let (seen, after): (i64, i64) = redis::pipe()
        .atomic()
        .cmd("GET")
        .arg(&stock)
        .cmd("DECRBY")
        .arg(&stock)
        .arg(1)
        .query_async(&mut con)
        .await?;
    out.push(experiment(
        "MULTI with GET then DECRBY at stock 0",
        "EXEC answers [0, -1]: atomic, yet the DECRBY could not depend on the GET".into(),
        format!(
            "EXEC answers [{seen}, {after}]: atomic, yet the DECRBY could not depend on the GET"
        ),
    ));

    // 3. WATCH: a write by another connection between WATCH and EXEC voids the transaction.
    let stock = key("watch");
    let mut watcher = client.get_multiplexed_async_connection().await?;
    let mut other = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("SET")
        .arg(&stock)
        .arg(5)
        .query_async(&mut con)
        .await?;
    let _: () = redis::cmd("WATCH")
        .arg(&stock)
        .query_async(&mut watcher)
        .await?;
    let _: i64 = redis::cmd("GET")
        .arg(&stock)
        .query_async(&mut watcher)
        .await?;
    let _: i64 = redis::cmd("DECR")
        .arg(&stock)
        .query_async(&mut other)
        .await?;
    let exec: redis::Value = redis::pipe()
        .atomic()
        .cmd("DECRBY")
        .arg(&stock)
        .arg(1)
        .query_async(&mut watcher)
        .await?;
    let left: i64 = redis::cmd("GET").arg(&stock).query_async(&mut con).await?;
    out.push(experiment(
        "WATCH, then another client writes, then EXEC",
        "EXEC nil, stock 4".into(),
        format!("EXEC {}, stock {left}", show(&exec)),
    ));

    // 4. An idempotent Lua decrement, called twice, then with a conflicting quantity.
    let stock = key("idem-stock");
    let request = key("idem-request:1");
    let script = redis::Script::new(IDEMPOTENT_TAKE_LUA);
    let _: () = redis::cmd("SET")
        .arg(&stock)
        .arg(10)
        .query_async(&mut con)
        .await?;
    let mut answers = Vec::new();
    for quantity in [2, 2, 3] {
        let answer: redis::Value = script
            .key(&stock)
            .key(&request)
            .arg(quantity)
            .invoke_async(&mut con)
            .await?;
        answers.push(show(&answer));
    }
    let left: i64 = redis::cmd("GET").arg(&stock).query_async(&mut con).await?;
    out.push(experiment(
        "idempotent Lua decrement: qty 2, same again, then qty 3 with the same id",
        "[taken, 8] [replay, 8] [conflict, 2], stock 8".into(),
        format!("{}, stock {left}", answers.join(" ")),
    ));

    // 5. A command failing inside EXEC does not undo the ones before it: no rollback.
    let stock = key("wrongtype-stock");
    let list = key("wrongtype-list");
    let _: () = redis::cmd("SET")
        .arg(&stock)
        .arg(5)
        .query_async(&mut con)
        .await?;
    let _: i64 = redis::cmd("RPUSH")
        .arg(&list)
        .arg("x")
        .query_async(&mut con)
        .await?;
    let exec: redis::Value = redis::pipe()
        .atomic()
        .cmd("DECRBY")
        .arg(&stock)
        .arg(1)
        .cmd("INCR")
        .arg(&list)
        .cmd("DECRBY")
        .arg(&stock)
        .arg(1)
        .ignore_errors()
        .query_async(&mut con)
        .await?;
    let left: i64 = redis::cmd("GET").arg(&stock).query_async(&mut con).await?;
    out.push(experiment(
        "MULTI: DECRBY, a WRONGTYPE INCR, DECRBY",
        "EXEC [4, error WRONGTYPE, 3], stock 3: the writes around the error stay".into(),
        format!(
            "EXEC {}, stock {left}: the writes around the error stay",
            show(&exec)
        ),
    ));

    let keys: Vec<String> = [
        "pipeline",
        "multi",
        "watch",
        "idem-stock",
        "idem-request:1",
        "wrongtype-stock",
        "wrongtype-list",
    ]
    .iter()
    .map(|k| key(k))
    .collect();
    let _: i64 = redis::cmd("DEL").arg(keys).query_async(&mut con).await?;
    Ok(out)
}

pub fn render_experiments(experiments: &[Experiment]) -> String {
    let mut out = String::new();
    for (n, e) in experiments.iter().enumerate() {
        let _ = writeln!(
            out,
            "{}. [{}] {}\n   expected: {}\n   observed: {}",
            n + 1,
            if e.pass { "PASS" } else { "FAIL" },
            e.name,
            e.expected,
            e.observed
        );
    }
    out
}
