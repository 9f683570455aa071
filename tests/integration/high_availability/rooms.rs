//! The waiting room under the nemesis: one room per fault, whose start
//! (and so its draw, its first passes and its first buys) the nemesis sets
//! to the moment its fault begins. Waiters join every room's pre-queue
//! before the faults, poll `queue.json` through HAProxy as the waiting page
//! does, and buy with their pass when admitted (one in four lets its pass
//! run out instead, so the room admits the next in line during the fault).
//!
//! A room keeps nothing in Redis and nothing in process memory that is not
//! a cache: places, the draw, passes and their use are Postgres rows, and a
//! pass is used inside its order's transaction. So "the room agrees with
//! the database" is checked against the database: no place lost, passes
//! admitted in the drawn order, units sold and left adding up to the stock,
//! each used exactly once by the order a waiter was answered with, and
//! each waiter's own page saying what the database holds.

use std::time::{Duration, Instant};

use chrono::Utc;
use flashsale::domain::Money;
use flashsale::qa::harness;
use flashsale::services::catalog::{self, SaleSpec};
use reqwest::StatusCode;
use serde_json::Value;

use super::{buy_until_answered, Crowd};
use crate::helpers::*;

/// Waiters per room (the same customers in every room) and units per room:
/// more waiters than units, so a pass that runs out admits someone.
pub(super) const WAITERS: usize = 16;
pub(super) const ROOM_UNITS: i32 = 10;
/// `QUEUE_PASS_SECS` on the instances: short, so a let-lapse admits the
/// next in line within the fault; long enough to outlast most outages.
pub(super) const PASS_SECS: u64 = 10;
const LETS_IT_LAPSE_ONE_IN: usize = 4;
const POLL: Duration = Duration::from_secs(1);

/// What became of one waiter in one room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Turn {
    Bought(i64),
    /// Admitted, and let the pass run out on purpose.
    LetLapse,
    /// Admitted, but the pass ran out while the shop was failing over.
    PassRanOut,
    SoldOut,
    /// The turn ended otherwise (the room read "closed" before any pass).
    Closed,
    /// No ending before the deadline, or a page the room must never show.
    Unfinished,
}

/// A queue-mode sale, limit 1, whose pre-queue is open and whose start is
/// an hour away until the nemesis sets it.
pub(super) async fn create_room(pool: &flashsale::db::PgPool, index: usize) -> i64 {
    catalog::create_product(
        pool,
        SaleSpec {
            name: format!("Room {index} ({ROOM_UNITS} units)"),
            description: "a waiting room under the nemesis".into(),
            price: Money::from_cents(1_000).unwrap(),
            stock: ROOM_UNITS,
            per_customer_limit: Some(1),
            starts_at: Utc::now() + chrono::Duration::hours(1),
            ends_at: None,
            queue_mode: true,
            queue_opens_at: Some(Utc::now() - chrono::Duration::minutes(1)),
            join_check_work: 1,
        },
    )
    .await
    .unwrap()
    .id
}

/// The room starts now, by the database's clock: what the nemesis does as a
/// fault begins. The instances' caches learn of it within a second or two;
/// the draw is timed by the database.
pub(super) fn start_room_now(db_url: &str, room: i64) {
    use diesel::{Connection, RunQueryDsl};
    let mut conn = diesel::PgConnection::establish(db_url).unwrap();
    diesel::sql_query(format!(
        "UPDATE products SET sale_starts_at = clock_timestamp() WHERE id = {room}"
    ))
    .execute(&mut conn)
    .unwrap();
}

/// Joins `room`'s pre-queue through HAProxy, pressing again after a 5xx or
/// a cut connection (a sale just created reaches the instances' caches
/// within a second).
pub(super) async fn join(me: &harness::Browser, room: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match me.join_waiting_room(room).await {
            Ok(response) if response.status() == StatusCode::SEE_OTHER => return,
            answer => {
                assert!(
                    Instant::now() < deadline,
                    "joining room {room} still failed after 20 s: {:?}",
                    answer.map(|r| r.status())
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// One waiter's turn in one room: polls `queue.json` until the room says
/// how it ends, buys with the pass when admitted and pays (or lets the
/// pass run out, if this waiter is one who does).
pub(super) async fn take_turn(
    crowd: &Crowd,
    (email, me): &(String, harness::Browser),
    room: i64,
    waiter: usize,
    deadline: Instant,
) -> Turn {
    let token = me.csrf().await.expect("a form token before the drop");
    let mut lets_it_lapse = waiter.is_multiple_of(LETS_IT_LAPSE_ONE_IN);
    let mut let_lapse = false;
    while Instant::now() < deadline {
        let Some(status) = poll(me, room).await else {
            tokio::time::sleep(POLL).await;
            continue;
        };
        match status["state"].as_str().unwrap_or_default() {
            "waiting" => {}
            // Still shown until the room's tick lapses it: not to be bought with.
            "admitted" if let_lapse => {}
            "admitted" if lets_it_lapse => {
                // Past the pass and the grace a presented pass still has.
                tokio::time::sleep(
                    Duration::from_secs(PASS_SECS) + flashsale::domain::PASS_GRACE * 2,
                )
                .await;
                lets_it_lapse = false;
                let_lapse = true;
                continue;
            }
            "admitted" => {
                let Some(pass) = status["pass"].as_str() else {
                    crowd.problem(format!(
                        "{email} admitted to room {room} without a pass: {status}"
                    ));
                    return Turn::Unfinished;
                };
                let key = uuid::Uuid::new_v4().to_string();
                let Some(order) =
                    buy_until_answered(crowd, me, room, &token, &key, Some(pass)).await
                else {
                    return Turn::PassRanOut;
                };
                crowd.ordered_and_paid(me, email, order, &token).await;
                return Turn::Bought(order);
            }
            "sold_out" => return Turn::SoldOut,
            "closed" if let_lapse => return Turn::LetLapse,
            "closed" => return Turn::Closed,
            other => {
                crowd.problem(format!("{email} reads {other:?} in room {room}: {status}"));
                return Turn::Unfinished;
            }
        }
        tokio::time::sleep(POLL).await;
    }
    crowd.problem(format!(
        "{email} was still waiting in room {room} at the deadline"
    ));
    Turn::Unfinished
}

/// `queue.json`, or `None` while the shop fails over (a 5xx or a cut connection).
async fn poll(me: &harness::Browser, room: i64) -> Option<Value> {
    let response = me.get(&format!("/products/{room}/queue.json")).await.ok()?;
    if response.status() != StatusCode::OK {
        return None;
    }
    serde_json::from_str(&response.text().await.ok()?).ok()
}

/// The waiter's standing as `queue.json` says it now (every part is up again).
async fn standing_now(me: &harness::Browser, room: i64) -> String {
    for _ in 0..20 {
        if let Some(status) = poll(me, room).await {
            return status["state"].as_str().unwrap_or_default().to_string();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    "(no answer)".into()
}

/// The room against the database, once every waiter's turn has ended.
pub(super) async fn check_room(
    db: &TestDb,
    shop_url: &str,
    waiters: &[(String, harness::Browser)],
    room: i64,
    turns: &[Turn],
    problems: &mut Vec<String>,
) {
    let mut expect_zero = |what: &str, sql: String| {
        let n = db.count(&sql);
        if n != 0 {
            problems.push(format!("room {room}: {n} {what}"));
        }
    };
    expect_zero(
        "waiters without exactly one drawn place",
        format!(
            "SELECT count(*) AS n FROM customers c WHERE c.email LIKE 'haroom%' AND \
             (SELECT count(*) FROM queue_entries e WHERE e.product_id = {room} \
              AND e.customer_id = c.id AND e.position IS NOT NULL) <> 1"
        ),
    );
    // Admitted in the drawn order: pass n went to the holder of place n,
    // passes were issued in their numbers' order, and no place before the
    // last pass was passed over (limit 1, nobody held units before).
    expect_zero(
        "passes not held by the place their number names",
        format!(
            "SELECT count(*) AS n FROM queue_admissions a \
             LEFT JOIN queue_entries e ON e.product_id = a.product_id AND e.customer_id = a.customer_id \
             WHERE a.product_id = {room} \
             AND (e.position IS DISTINCT FROM a.number OR e.ticket IS DISTINCT FROM a.ticket)"
        ),
    );
    expect_zero(
        "passes issued before a pass with a smaller number",
        format!(
            "SELECT count(*) AS n FROM queue_admissions a JOIN queue_admissions b \
             ON b.product_id = a.product_id AND b.number > a.number \
             WHERE a.product_id = {room} AND b.issued_at < a.issued_at"
        ),
    );
    expect_zero(
        "places passed over (no pass, though a later place has one)",
        format!(
            "SELECT count(*) AS n FROM queue_entries e WHERE e.product_id = {room} \
             AND e.position < (SELECT coalesce(max(number), 0) FROM queue_admissions \
                               WHERE product_id = {room}) \
             AND NOT EXISTS (SELECT 1 FROM queue_admissions a \
                             WHERE a.product_id = {room} AND a.customer_id = e.customer_id)"
        ),
    );
    expect_zero(
        "orders of the room without exactly one pass used for them",
        format!(
            "SELECT count(*) AS n FROM order_items i WHERE i.product_id = {room} AND \
             (SELECT count(*) FROM queue_admissions a WHERE a.product_id = {room} \
              AND a.order_id = i.order_id AND a.state = 'used') <> 1"
        ),
    );
    expect_zero(
        "used passes without their order",
        format!(
            "SELECT count(*) AS n FROM queue_admissions a WHERE a.product_id = {room} \
             AND a.state = 'used' AND NOT EXISTS (SELECT 1 FROM orders o JOIN order_items i \
             ON i.order_id = o.id WHERE o.id = a.order_id AND i.product_id = {room} \
             AND o.customer_id = a.customer_id)"
        ),
    );
    let sold = db.count(&format!(
        "SELECT coalesce(sum(i.quantity), 0)::int8 AS n FROM order_items i \
         JOIN orders o ON o.id = i.order_id WHERE i.product_id = {room} \
         AND o.status IN ('awaiting_payment', 'paid')"
    ));
    let left = db.stock(room);
    if sold + left != i64::from(ROOM_UNITS) || sold > i64::from(ROOM_UNITS) {
        problems.push(format!(
            "room {room}: {sold} sold and {left} left of {ROOM_UNITS}"
        ));
    }
    // Passes open at the end (none, once every turn has ended) within what is left.
    let open_pass_units = db.count(&format!(
        "SELECT coalesce(sum(units), 0)::int8 AS n FROM queue_admissions \
         WHERE product_id = {room} AND state = 'issued'"
    ));
    if open_pass_units > left {
        problems.push(format!(
            "room {room}: open passes cover {open_pass_units} units but {left} are left"
        ));
    }
    // Each waiter's own answers and page against the database.
    for ((email, me), turn) in waiters.iter().zip(turns) {
        let used = db.count(&format!(
            "SELECT coalesce(max(a.order_id), 0) AS n FROM queue_admissions a \
             JOIN customers c ON c.id = a.customer_id \
             WHERE a.product_id = {room} AND c.email = '{email}' AND a.state = 'used'"
        ));
        match turn {
            Turn::Bought(order) if *order != used => problems.push(format!(
                "room {room}: {email} was answered with order {order}, the pass bought {used}"
            )),
            Turn::Bought(_) => {}
            _ if used != 0 => problems.push(format!(
                "room {room}: {email}'s pass bought order {used}, but the turn ended {turn:?}"
            )),
            _ => {}
        }
        let state = standing_now(me, room).await;
        if used != 0 && state != "closed" {
            problems.push(format!(
                "room {room}: {email} bought but the waiting page reads {state:?}"
            ));
        }
        if used == 0 && state == "admitted" {
            problems.push(format!(
                "room {room}: {email} reads admitted after the room's turns ended"
            ));
        }
    }
    // The published draw verifies, as a customer would check it.
    let verified = std::process::Command::new(server_binary())
        .args(["draw", "verify", "--base-url", shop_url, "--product"])
        .arg(room.to_string())
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    if !verified.status.success() {
        problems.push(format!(
            "room {room}: the draw does not verify: {}{}",
            String::from_utf8_lossy(&verified.stdout),
            String::from_utf8_lossy(&verified.stderr)
        ));
    }
}

/// How each room's turns ended, for the report.
pub(super) fn tally(turns: &[Turn]) -> String {
    let count = |f: fn(&Turn) -> bool| turns.iter().filter(|t| f(t)).count();
    format!(
        "{} bought, {} let the pass run out, {} had it run out in an outage, {} sold out, {} closed, {} unfinished",
        count(|t| matches!(t, Turn::Bought(_))),
        count(|t| *t == Turn::LetLapse),
        count(|t| *t == Turn::PassRanOut),
        count(|t| *t == Turn::SoldOut),
        count(|t| *t == Turn::Closed),
        count(|t| *t == Turn::Unfinished),
    )
}
