//! The waiting room's Redis side (`flashsale::queue`) against a real Redis:
//! places, the draw, passes bounded by the gate's stock, claims and
//! hand-backs exactly once under races, the log, status and a rebuild that
//! changes nobody's view. Each test has its own key prefix and deletes its
//! keys at the end.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use flashsale::domain::draw::Ticket;
use flashsale::domain::{CustomerId, ProductId};
use flashsale::queue::*;
use flashsale::redis_node::RedisNode;
use tokio::sync::Barrier;

use crate::helpers::unique_prefix;

const PRODUCT: ProductId = ProductId(41);

fn redis_url() -> String {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    url.split(',').next().unwrap().to_string()
}

struct Fixture {
    room: WaitingRoom,
    prefix: String,
    raw: redis::aio::MultiplexedConnection,
}

impl Fixture {
    async fn new() -> Fixture {
        let prefix = unique_prefix();
        let room = WaitingRoom::new(RedisNode::single(&redis_url()).unwrap(), &prefix);
        let raw = redis::Client::open(redis_url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        Fixture { room, prefix, raw }
    }

    fn gate_stock_key(&self, product: ProductId) -> String {
        format!("{}gate:{{product:{product}}}:stock", self.prefix)
    }

    async fn set_stock(&self, product: ProductId, units: i64) {
        let mut raw = self.raw.clone();
        let _: () = redis::cmd("SET")
            .arg(self.gate_stock_key(product))
            .arg(units)
            .query_async(&mut raw)
            .await
            .unwrap();
    }

    async fn add_stock(&self, product: ProductId, units: i64) -> i64 {
        let mut raw = self.raw.clone();
        redis::cmd("INCRBY")
            .arg(self.gate_stock_key(product))
            .arg(units)
            .query_async(&mut raw)
            .await
            .unwrap()
    }

    async fn get(&self, key: &str) -> Option<i64> {
        let mut raw = self.raw.clone();
        redis::cmd("GET")
            .arg(key)
            .query_async(&mut raw)
            .await
            .unwrap()
    }

    async fn outstanding(&self, product: ProductId) -> i64 {
        self.room.counts(product).await.unwrap().outstanding_units
    }

    /// Every key under this test's prefix.
    async fn keys(&self) -> Vec<String> {
        let mut raw = self.raw.clone();
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{}*", self.prefix))
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut raw)
                .await
                .unwrap();
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        keys.sort();
        keys
    }

    async fn delete(&self, keys: &[String]) {
        let mut raw = self.raw.clone();
        for key in keys {
            let _: i64 = redis::cmd("DEL")
                .arg(key)
                .query_async(&mut raw)
                .await
                .unwrap();
        }
    }

    async fn cleanup(self) {
        let keys = self.keys().await;
        self.delete(&keys).await;
    }
}

/// A test that fails leaves no keys behind either: a blocking sweep of the
/// prefix on a thread of its own (the runtime may be unwinding).
impl Drop for Fixture {
    fn drop(&mut self) {
        let pattern = format!("{}*", self.prefix);
        let _ = std::thread::spawn(move || {
            let Ok(mut connection) =
                redis::Client::open(redis_url()).and_then(|c| c.get_connection())
            else {
                return;
            };
            let keys: Vec<String> = match redis::Commands::scan_match(&mut connection, &pattern) {
                Ok(found) => found.filter_map(Result::ok).collect(),
                Err(_) => return,
            };
            for key in keys {
                let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&key).query(&mut connection);
            }
        })
        .join();
    }
}

fn setup(starts_in_ms: i64, pass_ms: u64, units: i64) -> QueueSetup {
    QueueSetup {
        starts_at: Utc::now() + chrono::Duration::milliseconds(starts_in_ms),
        pass: Duration::from_millis(pass_ms),
        units,
    }
}

/// Issues against a record that has nothing the queue does not.
async fn issue(room: &WaitingRoom, product: ProductId, bound: IssueBound) -> Vec<Issued> {
    match room.issue(product, bound, 0).await.unwrap() {
        Issue::Issued(issued) => issued,
        Issue::Behind => panic!("a queue cannot be behind an empty record"),
    }
}

async fn join_new(room: &WaitingRoom, product: ProductId, customer: i64) -> Entry {
    match room
        .join(product, CustomerId(customer), &Ticket::generate())
        .await
        .unwrap()
    {
        Joined::New(entry) => entry,
        other => panic!("customer {customer} should get a new place, got {other:?}"),
    }
}

async fn join_confirmed(room: &WaitingRoom, product: ProductId, customer: i64) -> Entry {
    let entry = join_new(room, product, customer).await;
    room.confirm(product, &entry).await.unwrap();
    Entry {
        confirmed: true,
        ..entry
    }
}

/// A drawn, open queue of `n` confirmed customers 1..=n, in join order.
async fn drawn_queue(
    f: &Fixture,
    product: ProductId,
    n: i64,
    pass_ms: u64,
    units: i64,
) -> Vec<Entry> {
    f.room
        .prepare(product, &setup(60_000, pass_ms, units))
        .await
        .unwrap();
    let mut entries = Vec::new();
    for customer in 1..=n {
        entries.push(join_confirmed(&f.room, product, customer).await);
    }
    let order: Vec<Ticket> = entries.iter().map(|e| e.ticket.clone()).collect();
    assert_eq!(f.room.draw(product, &order).await.unwrap(), Drawn::Done);
    entries
}

fn pass_of(issued: &Issued) -> PassRef {
    PassRef {
        ticket: issued.ticket.clone(),
        number: issued.number,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_customer_has_one_place_and_a_closed_queue_takes_nobody() {
    let f = Fixture::new().await;
    let room = &f.room;
    assert_eq!(
        room.join(PRODUCT, CustomerId(1), &Ticket::generate())
            .await
            .unwrap(),
        Joined::Missing
    );
    assert!(!room.exists(PRODUCT).await.unwrap());
    assert!(room
        .prepare(PRODUCT, &setup(60_000, 1000, 1))
        .await
        .unwrap());
    assert!(!room
        .prepare(PRODUCT, &setup(60_000, 1000, 1))
        .await
        .unwrap());
    assert!(room.exists(PRODUCT).await.unwrap());

    let alice = join_new(room, PRODUCT, 1).await;
    assert_eq!((alice.seq, alice.late, alice.confirmed), (1, false, false));
    let again = room
        .join(PRODUCT, CustomerId(1), &Ticket::generate())
        .await
        .unwrap();
    assert_eq!(
        again,
        Joined::Again(alice.clone()),
        "same place, same ticket"
    );
    let bob = join_new(room, PRODUCT, 2).await;
    assert_eq!(bob.seq, 2);
    assert!(bob.joined_at >= alice.joined_at);
    room.confirm(PRODUCT, &alice).await.unwrap();
    let view = room.status(PRODUCT, CustomerId(1)).await.unwrap();
    assert!(view.entry.unwrap().confirmed);
    assert_eq!(view.queue, QueueState::Pre);
    assert_eq!(view.position, None, "no place in the line before the draw");

    for closed in [QueueState::SoldOut, QueueState::Closed] {
        assert!(room.set_state(PRODUCT, closed).await.unwrap());
        assert_eq!(
            room.join(PRODUCT, CustomerId(3), &Ticket::generate())
                .await
                .unwrap(),
            Joined::Refused(closed)
        );
        assert!(matches!(
            room.join(PRODUCT, CustomerId(2), &Ticket::generate())
                .await
                .unwrap(),
            Joined::Again(_)
        ));
    }
    assert_eq!(room.counts(PRODUCT).await.unwrap().joined, 2);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_undone_join_leaves_nothing_behind() {
    let f = Fixture::new().await;
    let room = &f.room;
    room.prepare(PRODUCT, &setup(60_000, 1000, 1))
        .await
        .unwrap();
    let first = join_confirmed(room, PRODUCT, 1).await;
    let before = f.keys().await;
    let counts_before = room.counts(PRODUCT).await.unwrap();
    let undone = join_new(room, PRODUCT, 2).await;
    room.undo_join(PRODUCT, CustomerId(2), &undone.ticket)
        .await
        .unwrap();
    assert_eq!(f.keys().await, before, "no key of the undone entry is left");
    assert_eq!(room.counts(PRODUCT).await.unwrap(), counts_before);
    assert_eq!(
        room.pre_queue(PRODUCT).await.unwrap().tickets,
        vec![first.ticket.clone()]
    );
    assert_eq!(room.pre_queue(PRODUCT).await.unwrap().unconfirmed, 0);
    // The customer may join again and gets a new place.
    let again = join_new(room, PRODUCT, 2).await;
    assert_ne!(again.ticket, undone.ticket);
    // A confirmed entry is not undone, nor someone else's.
    room.undo_join(PRODUCT, CustomerId(1), &first.ticket)
        .await
        .unwrap();
    room.undo_join(PRODUCT, CustomerId(1), &again.ticket)
        .await
        .unwrap();
    assert_eq!(room.counts(PRODUCT).await.unwrap().joined, 2);

    // A late one undone from the middle of the line: those behind close up.
    room.prepare(PRODUCT, &setup(-1, 1000, 1)).await.unwrap();
    let late: Vec<Entry> = {
        let mut v = Vec::new();
        for c in 10..13 {
            v.push(join_new(room, PRODUCT, c).await);
        }
        v
    };
    assert!(late.iter().all(|e| e.late));
    room.undo_join(PRODUCT, CustomerId(11), &late[1].ticket)
        .await
        .unwrap();
    let last = room.status(PRODUCT, CustomerId(12)).await.unwrap();
    // pre-queue: 2 entries, then late 10, then 12.
    assert_eq!(last.position, Some(4));
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unconfirmed_lists_only_old_unconfirmed_entries() {
    let f = Fixture::new().await;
    let room = &f.room;
    room.prepare(PRODUCT, &setup(60_000, 1000, 1))
        .await
        .unwrap();
    let a = join_new(room, PRODUCT, 1).await;
    let _b = join_confirmed(room, PRODUCT, 2).await;
    assert_eq!(
        room.unconfirmed(PRODUCT, Duration::from_secs(3600))
            .await
            .unwrap(),
        vec![]
    );
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(
        room.unconfirmed(PRODUCT, Duration::from_millis(10))
            .await
            .unwrap(),
        vec![a.clone()]
    );
    room.confirm(PRODUCT, &a).await.unwrap();
    assert!(room
        .unconfirmed(PRODUCT, Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_draw_orders_the_pre_queue_and_puts_late_arrivals_behind() {
    let f = Fixture::new().await;
    let room = &f.room;
    room.prepare(PRODUCT, &setup(60_000, 1000, 1))
        .await
        .unwrap();
    let mut pre = Vec::new();
    for c in 1..=4 {
        pre.push(join_new(room, PRODUCT, c).await);
    }
    // The start moved to now (before the draw: the queue takes it).
    room.prepare(PRODUCT, &setup(-5, 1000, 1)).await.unwrap();
    let late1 = join_confirmed(room, PRODUCT, 5).await;
    let late2 = join_confirmed(room, PRODUCT, 6).await;
    assert!(late1.late && late2.late && late1.seq < late2.seq);
    let view = room.status(PRODUCT, CustomerId(6)).await.unwrap();
    assert_eq!(
        view.position,
        Some(6),
        "behind the pre-queue even before the draw"
    );

    let read = room.pre_queue(PRODUCT).await.unwrap();
    assert!(!read.drawn);
    assert_eq!(
        read.tickets,
        pre.iter().map(|e| e.ticket.clone()).collect::<Vec<_>>()
    );
    assert_eq!(read.unconfirmed, 4);
    let mut order: Vec<Ticket> = pre.iter().rev().map(|e| e.ticket.clone()).collect();
    assert_eq!(
        room.draw(PRODUCT, &order).await.unwrap(),
        Drawn::Changed,
        "unconfirmed entries"
    );
    for e in &pre {
        room.confirm(PRODUCT, e).await.unwrap();
    }
    assert_eq!(
        room.draw(PRODUCT, &order[..3]).await.unwrap(),
        Drawn::Changed
    );
    let mut twice = order.clone();
    twice[3] = twice[0].clone();
    assert_eq!(room.draw(PRODUCT, &twice).await.unwrap(), Drawn::Changed);
    let mut with_late = order.clone();
    with_late[3] = late1.ticket.clone();
    assert_eq!(
        room.draw(PRODUCT, &with_late).await.unwrap(),
        Drawn::Changed
    );
    assert_eq!(room.draw(PRODUCT, &order).await.unwrap(), Drawn::Done);
    order.reverse();
    assert_eq!(
        room.draw(PRODUCT, &order).await.unwrap(),
        Drawn::Already,
        "a second draw changes nothing"
    );
    // Positions: the drawn order (customers 4,3,2,1), then 5, 6.
    let mut positions = BTreeMap::new();
    for c in 1..=6 {
        let view = room.status(PRODUCT, CustomerId(c)).await.unwrap();
        assert!(view.drawn);
        assert_eq!(view.queue, QueueState::Open);
        assert_eq!(view.ahead, view.position.map(|p| p - 1));
        positions.insert(c, view.position.unwrap());
    }
    assert_eq!(
        positions.into_values().collect::<Vec<_>>(),
        vec![4, 3, 2, 1, 5, 6]
    );
    let after = join_new(room, PRODUCT, 7).await;
    assert!(after.late);
    assert_eq!(
        room.status(PRODUCT, CustomerId(7)).await.unwrap().position,
        Some(7)
    );
    assert!(room.pre_queue(PRODUCT).await.unwrap().drawn);
    assert_eq!(
        room.draw(ProductId(999), &[]).await.unwrap(),
        Drawn::Missing
    );
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_after_an_early_draw_counts_as_at_the_start() {
    let f = Fixture::new().await;
    let room = &f.room;
    let start = setup(60_000, 1000, 1);
    room.prepare(PRODUCT, &start).await.unwrap();
    let a = join_confirmed(room, PRODUCT, 1).await;
    assert_eq!(room.draw(PRODUCT, &[a.ticket]).await.unwrap(), Drawn::Done);
    // After the draw a new setup is ignored.
    room.prepare(PRODUCT, &setup(120_000, 1000, 1))
        .await
        .unwrap();
    let b = join_new(room, PRODUCT, 2).await;
    assert!(b.late);
    assert_eq!(
        b.joined_at.timestamp_millis(),
        start.starts_at.timestamp_millis()
    );
    f.cleanup().await;
}

/// Admissions are stamped in issue order even when Redis's clock steps
/// back between two of them (NTP, a failover to another host): the
/// published record's admission times must never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_times_never_go_back_when_the_clock_does() {
    let f = Fixture::new().await;
    let room = &f.room;
    drawn_queue(&f, PRODUCT, 3, 60_000, 1).await;
    f.set_stock(PRODUCT, 1).await;
    let first = issue(room, PRODUCT, IssueBound::Gate).await;
    assert_eq!(first.len(), 1);
    // As if the clock had run an hour ahead when the first pass was issued.
    let ahead = first[0].issued_at + chrono::Duration::hours(1);
    let mut raw = f.raw.clone();
    let _: () = redis::cmd("HSET")
        .arg(format!("{}meta", room.key_base(PRODUCT)))
        .arg("last_issued_ms")
        .arg(ahead.timestamp_millis())
        .query_async(&mut raw)
        .await
        .unwrap();
    f.add_stock(PRODUCT, 1).await;
    let second = issue(room, PRODUCT, IssueBound::Gate).await;
    assert_eq!(second.len(), 1);
    assert!(second[0].issued_at >= ahead, "{second:?}");
    // The pass still lasts its time from the real clock.
    assert!(second[0].expires_at - chrono::Utc::now() <= chrono::Duration::seconds(61));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn passes_follow_the_line_within_the_gates_stock() {
    let f = Fixture::new().await;
    let room = &f.room;
    let entries = drawn_queue(&f, PRODUCT, 5, 60_000, 2).await;
    assert!(
        issue(room, PRODUCT, IssueBound::Gate).await.is_empty(),
        "no stock key: nothing issued"
    );
    f.set_stock(PRODUCT, 5).await;
    let issued = issue(room, PRODUCT, IssueBound::Gate).await;
    assert_eq!(
        issued.len(),
        2,
        "2 passes of 2 units fit in 5, a third does not"
    );
    assert_eq!(
        issued
            .iter()
            .map(|i| (i.number, i.ticket.clone(), i.customer))
            .collect::<Vec<_>>(),
        vec![
            (1, entries[0].ticket.clone(), CustomerId(1)),
            (2, entries[1].ticket.clone(), CustomerId(2))
        ]
    );
    assert_eq!(
        (issued[0].expires_at - issued[0].issued_at).num_milliseconds(),
        60_000
    );
    assert_eq!(f.outstanding(PRODUCT).await, 4);
    assert!(issue(room, PRODUCT, IssueBound::Gate).await.is_empty());
    assert_eq!(
        room.log(PRODUCT, 10).await.unwrap(),
        issued
            .iter()
            .cloned()
            .map(LogEvent::Issued)
            .collect::<Vec<_>>()
    );
    let view = room.status(PRODUCT, CustomerId(1)).await.unwrap();
    assert_eq!(
        view.pass,
        Some((pass_of(&issued[0]), PassState::Issued, issued[0].expires_at))
    );
    assert_eq!((view.units_left, view.outstanding), (1, 4));
    assert_eq!(
        room.status(PRODUCT, CustomerId(5)).await.unwrap().ahead,
        Some(2)
    );

    // Paused: nothing; resumed: on.
    f.set_stock(PRODUCT, 100).await;
    assert!(room.set_state(PRODUCT, QueueState::Paused).await.unwrap());
    assert!(issue(room, PRODUCT, IssueBound::Gate).await.is_empty());
    assert!(room.set_state(PRODUCT, QueueState::Open).await.unwrap());

    // A late, unconfirmed entry stops the line until it is confirmed.
    let late = join_new(room, PRODUCT, 6).await;
    let more = issue(room, PRODUCT, IssueBound::Gate).await;
    assert_eq!(
        more.len(),
        3,
        "customers 3, 4, 5; not past the unconfirmed 6"
    );
    assert!(issue(room, PRODUCT, IssueBound::Gate).await.is_empty());
    room.confirm(PRODUCT, &late).await.unwrap();
    let last = issue(room, PRODUCT, IssueBound::Gate).await;
    assert_eq!(last.len(), 1);
    assert_eq!((last[0].number, last[0].customer), (6, CustomerId(6)));
    assert_eq!(room.counts(PRODUCT).await.unwrap().admitted, 6);
    f.cleanup().await;
}

/// A queue with fewer admissions than Postgres has recorded lost writes:
/// it issues nothing (its cursor would hand the record's numbers out
/// again), and only such a queue is dropped for a rebuild.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_behind_the_recorded_admissions_issues_nothing_and_is_dropped() {
    let f = Fixture::new().await;
    let room = &f.room;
    drawn_queue(&f, PRODUCT, 4, 60_000, 1).await;
    f.set_stock(PRODUCT, 4).await;
    assert_eq!(
        room.issue(PRODUCT, IssueBound::Gate, 3).await.unwrap(),
        Issue::Behind
    );
    assert_eq!(room.counts(PRODUCT).await.unwrap().admitted, 0);
    assert_eq!(f.outstanding(PRODUCT).await, 0);
    let Issue::Issued(four) = room.issue(PRODUCT, IssueBound::Gate, 0).await.unwrap() else {
        panic!("not behind an empty record");
    };
    assert_eq!(four.len(), 4);
    assert!(!room
        .discard_behind(PRODUCT, Behind::Admissions { recorded: 4 })
        .await
        .unwrap());
    assert!(!room.discard_behind(PRODUCT, Behind::Undrawn).await.unwrap());
    assert!(room.exists(PRODUCT).await.unwrap());
    assert!(room
        .discard_behind(PRODUCT, Behind::Admissions { recorded: 5 })
        .await
        .unwrap());
    assert!(!room.exists(PRODUCT).await.unwrap());
    f.cleanup().await;
}

/// A queue still holding a pass the record has under another admission
/// is dropped; one that holds no such pass (rebuilt since with the
/// record's, or never issued it) is not, whatever else the drainer says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_holding_a_pass_the_record_conflicts_with_is_dropped() {
    let f = Fixture::new().await;
    let room = &f.room;
    drawn_queue(&f, PRODUCT, 3, 60_000, 1).await;
    f.set_stock(PRODUCT, 2).await;
    let Issue::Issued(two) = room.issue(PRODUCT, IssueBound::Gate, 0).await.unwrap() else {
        panic!("not behind an empty record");
    };
    assert_eq!(two.len(), 2);
    let mut other_issue = two[1].clone();
    other_issue.issued_at += chrono::Duration::milliseconds(1);
    let mut other_number = two[1].clone();
    other_number.number = 3;
    assert!(!room
        .discard_behind(
            PRODUCT,
            Behind::Conflicting(vec![other_issue, other_number])
        )
        .await
        .unwrap());
    assert!(room.exists(PRODUCT).await.unwrap());
    assert!(room
        .discard_behind(PRODUCT, Behind::Conflicting(vec![two[1].clone()]))
        .await
        .unwrap());
    assert!(!room.exists(PRODUCT).await.unwrap());
    assert!(
        room.log(PRODUCT, 10).await.unwrap().is_empty(),
        "its log goes too"
    );
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_mirror_bounds_passes_when_the_gate_is_off() {
    let f = Fixture::new().await;
    let room = &f.room;
    drawn_queue(&f, PRODUCT, 3, 60_000, 1).await;
    f.set_stock(PRODUCT, 10).await;
    assert!(issue(room, PRODUCT, IssueBound::Mirror).await.is_empty());
    room.mirror_stock(PRODUCT, 2, 0).await.unwrap();
    room.mirror_unpaid(PRODUCT, 7).await.unwrap();
    assert_eq!(issue(room, PRODUCT, IssueBound::Mirror).await.len(), 2);
    // units_left reads the gate first, the mirror only without it.
    let view = room.status(PRODUCT, CustomerId(3)).await.unwrap();
    assert_eq!((view.units_left, view.unpaid), (8, 7));
    f.delete(&[f.gate_stock_key(PRODUCT)]).await;
    let view = room.status(PRODUCT, CustomerId(3)).await.unwrap();
    assert_eq!(
        (view.units_left, view.counted),
        (0, true),
        "the mirror counts"
    );
    room.mirror_stock(PRODUCT, 5, 0).await.unwrap();
    assert_eq!(
        room.status(PRODUCT, CustomerId(3))
            .await
            .unwrap()
            .units_left,
        3
    );
    f.cleanup().await;
}

/// Many issuers race stock arriving and purchases under passes (claim,
/// take the units at the gate, settle): whatever the interleaving, the open
/// passes never cover more than the stock left, and every pass is a
/// distinct number in line order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_issuers_never_cover_more_than_the_stock() {
    let f = Arc::new(Fixture::new().await);
    let units = 2;
    let entries = drawn_queue(&f, PRODUCT, 300, 60_000, units).await;
    f.set_stock(PRODUCT, 3).await;
    let tasks = 24;
    let barrier = Arc::new(Barrier::new(tasks));
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (f, barrier) = (f.clone(), barrier.clone());
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut issued = Vec::new();
            for round in 0..20 {
                match task % 3 {
                    0 => {
                        f.add_stock(PRODUCT, 1 + (round % 3)).await;
                    }
                    1 => {
                        issued.extend(issue(&f.room, PRODUCT, IssueBound::Gate).await);
                    }
                    _ => {
                        // Buy under every pass issued so far that is still open.
                        for mine in issue(&f.room, PRODUCT, IssueBound::Gate).await {
                            let admission = format!("adm-{}", mine.number);
                            let claim = f
                                .room
                                .claim(PRODUCT, mine.customer, &pass_of(&mine), &admission)
                                .await
                                .unwrap();
                            assert_eq!(claim, Claim::Claimed { units });
                            f.add_stock(PRODUCT, -units).await;
                            assert!(f
                                .room
                                .settle(PRODUCT, &pass_of(&mine), &admission)
                                .await
                                .unwrap());
                            issued.push(mine);
                        }
                    }
                }
                let (stock, outstanding) = {
                    let mut raw = f.raw.clone();
                    let (stock, outstanding): (i64, i64) = redis::pipe()
                        .atomic()
                        .get(f.gate_stock_key(PRODUCT))
                        .get(format!("{}outstanding", f.room.key_base(PRODUCT)))
                        .query_async(&mut raw)
                        .await
                        .unwrap();
                    (stock, outstanding)
                };
                // Between a claim and its settle the units count twice
                // (off the stock and still outstanding): allow one such
                // purchase per buying task.
                let buying = (tasks as i64 / 3) * units;
                assert!(
                    outstanding <= stock + buying,
                    "{outstanding} units outstanding, {stock} in stock"
                );
            }
            issued
        }));
    }
    let mut all = Vec::new();
    for handle in handles {
        all.extend(handle.await.unwrap());
    }
    // Stock that arrived after the last issuer ran is issued now.
    all.extend(issue(&f.room, PRODUCT, IssueBound::Gate).await);
    let stock = f.get(&f.gate_stock_key(PRODUCT)).await.unwrap();
    let counts = f.room.counts(PRODUCT).await.unwrap();
    assert!(
        counts.outstanding_units <= stock,
        "{} outstanding > {stock} left",
        counts.outstanding_units
    );
    assert!(
        stock - counts.outstanding_units < units,
        "no pass left unissued that fits"
    );
    assert_eq!(counts.outstanding_units, counts.open_passes * units);
    all.sort_by_key(|i| i.number);
    assert_eq!(all.len() as i64, counts.admitted);
    for (i, issued) in all.iter().enumerate() {
        assert_eq!(issued.number, i as i64 + 1);
        assert_eq!(issued.ticket, entries[i].ticket, "admitted in line order");
    }
    Arc::try_unwrap(f).ok().unwrap().cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_checks_the_pass_and_takes_it_once() {
    let f = Fixture::new().await;
    let room = &f.room;
    let entries = drawn_queue(&f, PRODUCT, 3, 60_000, 1).await;
    f.set_stock(PRODUCT, 2).await;
    let issued = issue(room, PRODUCT, IssueBound::Gate).await;
    let (alice, bob) = (CustomerId(1), CustomerId(2));
    let alices = pass_of(&issued[0]);
    let unknown = PassRef {
        ticket: Ticket::generate(),
        number: 1,
    };
    let wrong_number = PassRef {
        number: 2,
        ..alices.clone()
    };
    let carols_ticket = PassRef {
        ticket: entries[2].ticket.clone(),
        number: 3,
    };
    assert_eq!(
        room.claim(PRODUCT, alice, &unknown, "a1").await.unwrap(),
        Claim::Forged
    );
    // A pass hash no place leads to (a dropped queue's leftover, written
    // here by hand): naming alice and open, yet not her place's.
    let mut raw = f.raw.clone();
    let _: () = redis::cmd("HSET")
        .arg(format!(
            "{}pass:{}",
            room.key_base(PRODUCT),
            unknown.ticket.as_str()
        ))
        .arg(&["n", "1", "customer", "1", "units", "1", "state", "issued"])
        .arg(&["issued_ms", "0", "expires_ms", "99999999999999"])
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        room.claim(PRODUCT, alice, &unknown, "a1").await.unwrap(),
        Claim::Forged,
        "a leftover hash is no pass"
    );
    assert_eq!(
        room.claim(PRODUCT, alice, &wrong_number, "a1")
            .await
            .unwrap(),
        Claim::Forged
    );
    assert_eq!(
        room.claim(PRODUCT, alice, &carols_ticket, "a1")
            .await
            .unwrap(),
        Claim::Forged
    );
    assert_eq!(
        room.claim(PRODUCT, CustomerId(3), &carols_ticket, "a1")
            .await
            .unwrap(),
        Claim::NoPass,
        "her own ticket, no pass yet"
    );
    assert_eq!(
        room.claim(PRODUCT, bob, &alices, "a1").await.unwrap(),
        Claim::NotYours
    );
    assert_eq!(
        room.claim(ProductId(999), alice, &alices, "a1")
            .await
            .unwrap(),
        Claim::Missing
    );

    // Ten buys with the same pass at once: one admission gets it.
    let barrier = Arc::new(Barrier::new(10));
    let mut handles = Vec::new();
    for i in 0..10 {
        let (room, barrier, pass) = (room.clone(), barrier.clone(), alices.clone());
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            (
                i,
                room.claim(PRODUCT, alice, &pass, &format!("a{i}"))
                    .await
                    .unwrap(),
            )
        }));
    }
    let mut winners = Vec::new();
    for handle in handles {
        let (i, claim) = handle.await.unwrap();
        match claim {
            Claim::Claimed { units: 1 } => winners.push(i),
            Claim::InUse => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(winners.len(), 1);
    let holder = format!("a{}", winners[0]);
    assert_eq!(
        room.claim(PRODUCT, alice, &alices, &holder).await.unwrap(),
        Claim::Claimed { units: 1 },
        "the same admission again"
    );
    assert_eq!(
        room.status(PRODUCT, alice).await.unwrap().pass.unwrap().1,
        PassState::Claimed
    );
    // Someone else's unclaim or settle does nothing.
    room.unclaim(PRODUCT, &alices, "other").await.unwrap();
    assert!(!room.settle(PRODUCT, &alices, "other").await.unwrap());
    // Unclaimed: issued again, another admission may claim it.
    room.unclaim(PRODUCT, &alices, &holder).await.unwrap();
    assert_eq!(
        room.status(PRODUCT, alice).await.unwrap().pass.unwrap().1,
        PassState::Issued
    );
    assert_eq!(
        room.claim(PRODUCT, alice, &alices, "b").await.unwrap(),
        Claim::Claimed { units: 1 }
    );
    assert_eq!(f.outstanding(PRODUCT).await, 2);
    assert!(room.settle(PRODUCT, &alices, "b").await.unwrap());
    assert!(
        room.settle(PRODUCT, &alices, "b").await.unwrap(),
        "a repeat says so"
    );
    assert_eq!(f.outstanding(PRODUCT).await, 1, "handed back once");
    assert_eq!(
        room.claim(PRODUCT, alice, &alices, "b").await.unwrap(),
        Claim::Used
    );
    assert_eq!(
        room.claim(PRODUCT, alice, &alices, "c").await.unwrap(),
        Claim::Used
    );
    let counts = room.counts(PRODUCT).await.unwrap();
    assert_eq!((counts.used, counts.open_passes), (1, 1));
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn passes_lapse_at_their_deadline_and_stale_claims_are_reported() {
    let f = Fixture::new().await;
    let room = &f.room;
    drawn_queue(&f, PRODUCT, 5, 300, 1).await;
    f.set_stock(PRODUCT, 4).await;
    let issued = issue(room, PRODUCT, IssueBound::Gate).await;
    assert_eq!(issued.len(), 4);
    let [a, b, c, d] = [0, 1, 2, 3].map(|i| pass_of(&issued[i]));
    assert_eq!(
        room.claim(PRODUCT, CustomerId(2), &b, "adm-b")
            .await
            .unwrap(),
        Claim::Claimed { units: 1 }
    );
    assert_eq!(
        room.claim(PRODUCT, CustomerId(3), &c, "adm-c")
            .await
            .unwrap(),
        Claim::Claimed { units: 1 }
    );
    assert!(room
        .lapse_due(PRODUCT, Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Status reads an expired pass as lapsed before any sweep.
    assert_eq!(
        room.status(PRODUCT, CustomerId(4))
            .await
            .unwrap()
            .pass
            .unwrap()
            .1,
        PassState::Lapsed
    );
    // A claim past the deadline lapses the pass in the same step.
    assert_eq!(
        room.claim(PRODUCT, CustomerId(1), &a, "adm-a")
            .await
            .unwrap(),
        Claim::Lapsed
    );
    assert_eq!(f.outstanding(PRODUCT).await, 3);
    // An unclaim past the deadline lapses too.
    room.unclaim(PRODUCT, &c, "adm-c").await.unwrap();
    assert_eq!(f.outstanding(PRODUCT).await, 2);
    let stale = room
        .lapse_due(PRODUCT, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(stale.is_empty(), "within the grace");
    assert_eq!(f.outstanding(PRODUCT).await, 1, "d lapsed; b still claimed");
    let stale = room.lapse_due(PRODUCT, Duration::ZERO).await.unwrap();
    assert_eq!(
        stale,
        vec![StaleClaim {
            pass: b.clone(),
            customer: CustomerId(2),
            admission: "adm-b".into()
        }]
    );
    assert!(!room.lapse_claim(PRODUCT, &b, "other").await.unwrap());
    assert!(room.lapse_claim(PRODUCT, &b, "adm-b").await.unwrap());
    assert!(room.lapse_claim(PRODUCT, &b, "adm-b").await.unwrap());
    assert!(
        !room.settle(PRODUCT, &b, "adm-b").await.unwrap(),
        "lapsed, not used"
    );
    assert_eq!(f.outstanding(PRODUCT).await, 0);
    assert!(room
        .lapse_due(PRODUCT, Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(f.outstanding(PRODUCT).await, 0);
    for (pass, customer) in [(&a, 1), (&b, 2), (&c, 3), (&d, 4)] {
        assert_eq!(
            room.claim(PRODUCT, CustomerId(customer), pass, "late")
                .await
                .unwrap(),
            Claim::Lapsed
        );
    }
    let lapsed: Vec<i64> = room
        .log(PRODUCT, 100)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            LogEvent::Lapsed { number, .. } => Some(number),
            _ => None,
        })
        .collect();
    assert_eq!(lapsed, vec![1, 3, 4, 2], "each lapse logged once, in order");
    let counts = room.counts(PRODUCT).await.unwrap();
    assert_eq!((counts.lapsed, counts.open_passes), (4, 0));
    // The freed units admit the next in line.
    let next = issue(room, PRODUCT, IssueBound::Gate).await;
    assert_eq!((next.len(), next[0].customer), (1, CustomerId(5)));
    f.cleanup().await;
}

/// Every ending of every pass raced from many tasks at once (settle,
/// lapse_claim, unclaim, claim, lapse_due, repeats): each pass hands its
/// units back exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_pass_hands_its_units_back_exactly_once() {
    let f = Arc::new(Fixture::new().await);
    let units = 3;
    drawn_queue(&f, PRODUCT, 40, 200, units).await;
    f.set_stock(PRODUCT, 40 * units).await;
    let issued = issue(&f.room, PRODUCT, IssueBound::Gate).await;
    assert_eq!(issued.len(), 40);
    // Half claimed now; the deadline passes during the race.
    for mine in issued.iter().step_by(2) {
        let claim = f
            .room
            .claim(PRODUCT, mine.customer, &pass_of(mine), "first")
            .await
            .unwrap();
        assert_eq!(claim, Claim::Claimed { units });
    }
    let barrier = Arc::new(Barrier::new(issued.len() * 3 + 4));
    let mut handles = Vec::new();
    for mine in &issued {
        for role in 0..3 {
            let (f, barrier, mine) = (f.clone(), barrier.clone(), mine.clone());
            handles.push(tokio::spawn(async move {
                barrier.wait().await;
                let pass = pass_of(&mine);
                for _ in 0..3 {
                    match (role, mine.number % 4) {
                        (0, 1) => {
                            f.room.settle(PRODUCT, &pass, "first").await.unwrap();
                        }
                        (0, _) => {
                            f.room.lapse_claim(PRODUCT, &pass, "first").await.unwrap();
                        }
                        (1, _) => f.room.unclaim(PRODUCT, &pass, "first").await.unwrap(),
                        _ => {
                            f.room
                                .claim(PRODUCT, mine.customer, &pass, "second")
                                .await
                                .unwrap();
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(60)).await;
                }
            }));
        }
    }
    for _ in 0..4 {
        let (f, barrier) = (f.clone(), barrier.clone());
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            for _ in 0..6 {
                for stale in f.room.lapse_due(PRODUCT, Duration::ZERO).await.unwrap() {
                    f.room
                        .lapse_claim(PRODUCT, &stale.pass, &stale.admission)
                        .await
                        .unwrap();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    // Past every deadline, a last sweep ends whatever is still open.
    tokio::time::sleep(Duration::from_millis(250)).await;
    for stale in f.room.lapse_due(PRODUCT, Duration::ZERO).await.unwrap() {
        assert!(f
            .room
            .lapse_claim(PRODUCT, &stale.pass, &stale.admission)
            .await
            .unwrap());
    }
    let counts = f.room.counts(PRODUCT).await.unwrap();
    assert_eq!(counts.open_passes, 0);
    assert_eq!(counts.used + counts.lapsed, 40, "each pass ended once");
    assert_eq!(counts.outstanding_units, 0, "each handed back exactly once");
    let lapses = f
        .room
        .log(PRODUCT, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| matches!(e, LogEvent::Lapsed { .. }))
        .count();
    assert_eq!(lapses as i64, counts.lapsed);
    Arc::try_unwrap(f).ok().unwrap().cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_drainers_of_the_log_never_drop_an_unrecorded_event() {
    let f = Fixture::new().await;
    let room = &f.room;
    drawn_queue(&f, PRODUCT, 5, 60_000, 1).await;
    f.set_stock(PRODUCT, 3).await;
    issue(room, PRODUCT, IssueBound::Gate).await;
    let slow = room.log(PRODUCT, 2).await.unwrap();
    let fast = room.log(PRODUCT, 10).await.unwrap();
    assert_eq!((slow.len(), fast.len()), (2, 3));
    room.ack_log(PRODUCT, &fast[2]).await.unwrap();
    f.add_stock(PRODUCT, 1).await;
    let fourth = issue(room, PRODUCT, IssueBound::Gate).await;
    // The slow drainer's ack finds its event gone: nothing more goes.
    room.ack_log(PRODUCT, &slow[1]).await.unwrap();
    assert_eq!(
        room.log(PRODUCT, 10).await.unwrap(),
        vec![LogEvent::Issued(fourth[0].clone())]
    );
    // An event that was never logged removes nothing.
    let never = LogEvent::Lapsed {
        number: 99,
        ticket: Ticket::generate(),
        at: Utc::now(),
    };
    room.ack_log(PRODUCT, &never).await.unwrap();
    assert_eq!(room.log(PRODUCT, 10).await.unwrap().len(), 1);
    room.ack_log(PRODUCT, &LogEvent::Issued(fourth[0].clone()))
        .await
        .unwrap();
    assert!(room.log(PRODUCT, 10).await.unwrap().is_empty());
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_and_counts_say_where_everyone_stands() {
    let f = Fixture::new().await;
    let room = &f.room;
    assert!(room.view(PRODUCT, CustomerId(1)).await.unwrap().is_none());
    assert!(matches!(
        room.status(PRODUCT, CustomerId(1)).await,
        Err(flashsale::error::AppError::Unavailable(_))
    ));
    room.prepare(PRODUCT, &setup(60_000, 60_000, 1))
        .await
        .unwrap();
    assert!(
        !room.set_state(PRODUCT, QueueState::Open).await.unwrap(),
        "no resume before the draw"
    );
    let stranger = room.status(PRODUCT, CustomerId(77)).await.unwrap();
    assert_eq!(
        (
            stranger.entry,
            stranger.position,
            stranger.ahead,
            stranger.pass
        ),
        (None, None, None, None)
    );
    let mut entries = Vec::new();
    for c in 1..=4 {
        entries.push(join_confirmed(room, PRODUCT, c).await);
    }
    let order: Vec<Ticket> = entries.iter().map(|e| e.ticket.clone()).collect();
    room.draw(PRODUCT, &order).await.unwrap();
    f.set_stock(PRODUCT, 2).await;
    room.mirror_unpaid(PRODUCT, 3).await.unwrap();
    let issued = issue(room, PRODUCT, IssueBound::Gate).await;
    let view = room.status(PRODUCT, CustomerId(4)).await.unwrap();
    assert_eq!(
        view,
        QueueView {
            queue: QueueState::Open,
            drawn: true,
            entry: Some(entries[3].clone()),
            position: Some(4),
            ahead: Some(1),
            pass: None,
            units_left: 0,
            counted: true,
            outstanding: 2,
            unpaid: 3,
        }
    );
    let first = room.status(PRODUCT, CustomerId(1)).await.unwrap();
    assert_eq!((first.position, first.ahead), (Some(1), Some(0)));
    assert_eq!(first.pass.unwrap().0, pass_of(&issued[0]));
    assert_eq!(
        room.counts(PRODUCT).await.unwrap(),
        QueueCounts {
            joined: 4,
            waiting: 2,
            admitted: 2,
            open_passes: 2,
            outstanding_units: 2,
            used: 0,
            lapsed: 0,
        }
    );
    assert!(room.set_state(PRODUCT, QueueState::SoldOut).await.unwrap());
    assert_eq!(
        room.status(PRODUCT, CustomerId(4)).await.unwrap().queue,
        QueueState::SoldOut
    );
    assert!(!room.set_state(PRODUCT, QueueState::Pre).await.unwrap());
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_key_of_a_queue_carries_the_products_hash_tag() {
    let f = Fixture::new().await;
    let room = &f.room;
    let product = ProductId(123);
    drawn_queue(&f, product, 3, 100, 1).await;
    join_new(room, product, 9).await;
    f.set_stock(product, 2).await;
    room.mirror_stock(product, 2, 0).await.unwrap();
    room.mirror_unpaid(product, 0).await.unwrap();
    let issued = issue(room, product, IssueBound::Gate).await;
    room.claim(product, CustomerId(1), &pass_of(&issued[0]), "x")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    room.lapse_due(product, Duration::ZERO).await.unwrap();
    let keys = f.keys().await;
    assert!(keys.len() > 10, "{keys:?}");
    for key in &keys {
        let tag = key
            .split_once('{')
            .and_then(|(_, rest)| rest.split_once('}'))
            .map(|(tag, _)| tag);
        assert_eq!(tag, Some("product:123"), "{key}");
    }
    for key in room.fixed_keys(product) {
        let tag = key.split_once('{').unwrap().1.split_once('}').unwrap().0;
        assert_eq!(tag, "product:123", "{key}");
    }
    assert!(
        room.fixed_keys(product)
            .contains(&f.gate_stock_key(product)),
        "the scripts read the gate's own stock key"
    );
    f.cleanup().await;
}

/// Builds a queue through every state a pass can be in, records every
/// customer's view, deletes every key of the queue, rebuilds it from what
/// Postgres would hold, and finds every view the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebuilt_queue_shows_everyone_what_they_saw_before() {
    let f = Fixture::new().await;
    let room = &f.room;
    let units = 2;
    let start = setup(60_000, 60_000, units);
    room.prepare(PRODUCT, &start).await.unwrap();
    let mut entries = Vec::new();
    for c in 1..=8 {
        entries.push(join_confirmed(room, PRODUCT, c).await);
    }
    let mut order: Vec<Ticket> = entries.iter().map(|e| e.ticket.clone()).collect();
    order.reverse();
    order.swap(1, 5);
    room.draw(PRODUCT, &order).await.unwrap();
    for c in 9..=11 {
        entries.push(join_confirmed(room, PRODUCT, c).await);
    }
    f.set_stock(PRODUCT, 8).await;
    let issued = issue(room, PRODUCT, IssueBound::Gate).await;
    assert_eq!(issued.len(), 4);
    // One used, one lapsed (a stale claim), two open.
    let used = pass_of(&issued[0]);
    room.claim(PRODUCT, issued[0].customer, &used, "u")
        .await
        .unwrap();
    f.add_stock(PRODUCT, -units).await;
    room.settle(PRODUCT, &used, "u").await.unwrap();
    let lapsed = pass_of(&issued[1]);
    room.claim(PRODUCT, issued[1].customer, &lapsed, "l")
        .await
        .unwrap();
    room.lapse_claim(PRODUCT, &lapsed, "l").await.unwrap();
    issue(room, PRODUCT, IssueBound::Gate).await;
    room.mirror_unpaid(PRODUCT, 1).await.unwrap();

    let customers: Vec<CustomerId> = (1..=12).map(CustomerId).collect();
    let mut before = Vec::new();
    for &c in &customers {
        before.push(room.status(PRODUCT, c).await.unwrap());
    }
    let counts_before = room.counts(PRODUCT).await.unwrap();

    // What Postgres holds: entries, the draw's order with late arrivals,
    // admissions from the log with their ends.
    let mut admissions = Vec::new();
    for event in room.log(PRODUCT, 1000).await.unwrap() {
        if let LogEvent::Issued(issued) = event {
            let state = before
                .iter()
                .find_map(|v| v.pass.as_ref().filter(|p| p.0.number == issued.number))
                .map(|p| p.1)
                .unwrap();
            admissions.push((issued, state));
        }
    }
    assert!(admissions.iter().any(|a| a.1 == PassState::Used));
    assert!(admissions.iter().any(|a| a.1 == PassState::Lapsed));
    let mut line = order.clone();
    line.extend(entries[8..].iter().map(|e| e.ticket.clone()));
    let snapshot = QueueSnapshot {
        setup: start,
        state: QueueState::Open,
        drawn: true,
        entries: entries.clone(),
        line,
        admissions,
    };
    assert!(
        !room.rebuild(PRODUCT, &snapshot).await.unwrap(),
        "the queue exists"
    );

    let queue_keys: Vec<String> = f
        .keys()
        .await
        .into_iter()
        .filter(|k| k.starts_with(&room.key_base(PRODUCT)))
        .collect();
    f.delete(&queue_keys).await;
    assert!(!room.exists(PRODUCT).await.unwrap());
    // Redis lost the mirror too; the jobs set it again once the queue is
    // back (a mirror is written only into a queue that exists).
    room.mirror_unpaid(PRODUCT, 1).await.unwrap();
    assert!(room.rebuild(PRODUCT, &snapshot).await.unwrap());
    assert!(!room.rebuild(PRODUCT, &snapshot).await.unwrap(), "once");
    room.mirror_unpaid(PRODUCT, 1).await.unwrap();
    for (c, was) in customers.iter().zip(&before) {
        assert_eq!(
            &room.status(PRODUCT, *c).await.unwrap(),
            was,
            "customer {c}"
        );
    }
    assert_eq!(room.counts(PRODUCT).await.unwrap(), counts_before);
    // And it goes on from there: the next pass is number 5+, to the next in line.
    f.add_stock(PRODUCT, 2).await;
    let next = issue(room, PRODUCT, IssueBound::Gate).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].number, counts_before.admitted + 1);
    let join = join_new(room, PRODUCT, 50).await;
    assert_eq!(join.seq, 12);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_rebuilt_before_its_draw_keeps_the_pre_queue() {
    let f = Fixture::new().await;
    let room = &f.room;
    let start = setup(60_000, 60_000, 1);
    room.prepare(PRODUCT, &start).await.unwrap();
    let mut entries = Vec::new();
    for c in 1..=3 {
        entries.push(join_confirmed(room, PRODUCT, c).await);
    }
    let moved = setup(-1, 60_000, 1);
    room.prepare(PRODUCT, &moved).await.unwrap();
    for c in 4..=5 {
        entries.push(join_confirmed(room, PRODUCT, c).await);
    }
    let mut before = Vec::new();
    for c in 1..=5 {
        before.push(room.status(PRODUCT, CustomerId(c)).await.unwrap());
    }
    let pre_before = room.pre_queue(PRODUCT).await.unwrap().tickets;
    f.cleanup_queue(PRODUCT).await;
    let snapshot = QueueSnapshot {
        setup: moved,
        state: QueueState::Pre,
        drawn: false,
        entries: entries.iter().rev().cloned().collect(),
        line: vec![],
        admissions: vec![],
    };
    assert!(room.rebuild(PRODUCT, &snapshot).await.unwrap());
    for c in 1..=5 {
        assert_eq!(
            room.status(PRODUCT, CustomerId(c)).await.unwrap(),
            before[c as usize - 1]
        );
    }
    assert_eq!(room.pre_queue(PRODUCT).await.unwrap().tickets, pre_before);
    let order: Vec<Ticket> = pre_before.into_iter().rev().collect();
    assert_eq!(room.draw(PRODUCT, &order).await.unwrap(), Drawn::Done);
    f.cleanup().await;
}

/// A hundred thousand places come back from a rebuild in parts: one
/// script for the whole queue would hold Redis (every gate and poll
/// behind it) past the client's timeout, and fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_of_a_hundred_thousand_places_is_rebuilt_in_parts() {
    let f = Fixture::new().await;
    let room = &f.room;
    let places = 100_000_i64;
    let joined_at = Utc::now() - chrono::Duration::minutes(5);
    let entries: Vec<Entry> = (1..=places)
        .map(|i| Entry {
            customer: CustomerId(i),
            ticket: Ticket::generate(),
            seq: i,
            joined_at,
            late: false,
            confirmed: true,
        })
        .collect();
    // Any order will do: the line is the snapshot's, not recomputed.
    let mut line: Vec<Ticket> = entries.iter().map(|e| e.ticket.clone()).collect();
    line.reverse();
    let admissions: Vec<(Issued, PassState)> = (0..1_500)
        .map(|n| {
            let at = line[n].clone();
            let customer = CustomerId(places - n as i64);
            let issued_at = joined_at + chrono::Duration::seconds(60);
            let state = match n {
                0..1_000 => PassState::Used,
                1_000..1_400 => PassState::Lapsed,
                _ => PassState::Issued,
            };
            (
                Issued {
                    number: n as i64 + 1,
                    ticket: at,
                    customer,
                    issued_at,
                    expires_at: issued_at + chrono::Duration::hours(1),
                },
                state,
            )
        })
        .collect();
    let snapshot = QueueSnapshot {
        setup: setup(-60_000, 3_600_000, 1),
        state: QueueState::Open,
        drawn: true,
        entries,
        line,
        admissions,
    };
    // Seen, not asserted (speed belongs in benchmarks): how long Redis
    // kept others waiting while the parts were written.
    let (rebuilt, took, slowest) = beside_pings(&f, room.rebuild(PRODUCT, &snapshot)).await;
    println!("rebuilt {places} places in {took:?}; the slowest PING meanwhile took {slowest:?}");
    assert!(rebuilt.unwrap(), "rebuilt");
    let counts = room.counts(PRODUCT).await.unwrap();
    assert_eq!(
        (
            counts.joined,
            counts.admitted,
            counts.used,
            counts.lapsed,
            counts.open_passes,
            counts.outstanding_units
        ),
        (places, 1_500, 1_000, 400, 100, 100)
    );
    // The first joiner is last in this line; the last is first, and used.
    let first = room.status(PRODUCT, CustomerId(1)).await.unwrap();
    assert_eq!(first.position, Some(places));
    let last = room.status(PRODUCT, CustomerId(places)).await.unwrap();
    assert_eq!(last.position, Some(1));
    assert_eq!(last.pass.map(|p| p.1), Some(PassState::Used));
    let open = room
        .status(PRODUCT, CustomerId(places - 1_450))
        .await
        .unwrap();
    assert_eq!(
        open.pass.map(|p| (p.0.number, p.1)),
        Some((1_451, PassState::Issued))
    );
    let waiting = room
        .status(PRODUCT, CustomerId(places - 1_500))
        .await
        .unwrap();
    assert_eq!((waiting.position, waiting.ahead), (Some(1_501), Some(0)));
    f.add_stock(PRODUCT, 101).await;
    let next = issue(room, PRODUCT, IssueBound::Gate).await;
    assert_eq!(
        next.iter()
            .map(|i| (i.number, i.customer))
            .collect::<Vec<_>>(),
        vec![(1_501, CustomerId(places - 1_500))],
        "100 passes open, one unit more"
    );
    f.cleanup().await;
}

/// A rebuilder that dies part-way leaves a queue nobody can see or change
/// (the parts written are no queue until the last), and the next rebuild,
/// once its key has expired, starts over: a place the dead one wrote that
/// the newer snapshot lacks is in no line, count or customer's view, and
/// confirming it is no confirm of a place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebuild_left_part_way_is_invisible_and_the_next_one_starts_over() {
    let f = Fixture::new().await;
    let room = &f.room;
    let entries = drawn_queue(&f, PRODUCT, 4, 60_000, 1).await;
    f.set_stock(PRODUCT, 1).await;
    let first = issue(room, PRODUCT, IssueBound::Gate).await;
    assert_eq!(first.len(), 1);
    let pass = pass_of(&first[0]);
    let snapshot = QueueSnapshot {
        setup: setup(-1, 60_000, 1),
        state: QueueState::Open,
        drawn: true,
        entries: entries.clone(),
        line: entries.iter().map(|e| e.ticket.clone()).collect(),
        admissions: vec![(first[0].clone(), PassState::Issued)],
    };
    f.cleanup_queue(PRODUCT).await;

    // The dead rebuilder's snapshot had a place the newer one has not (its
    // row was deleted meanwhile) and got as far as the places and the pass.
    let gone = Entry {
        customer: CustomerId(99),
        ticket: Ticket::generate(),
        seq: 99,
        joined_at: Utc::now(),
        late: false,
        confirmed: true,
    };
    let dead = room.begin_rebuild(PRODUCT).await.unwrap().expect("begun");
    let places = entries.iter().chain(std::iter::once(&gone)).flat_map(|e| {
        [
            e.ticket.as_str().to_string(),
            e.customer.get().to_string(),
            e.seq.to_string(),
            e.joined_at.timestamp_millis().to_string(),
            "0".to_string(),
        ]
    });
    assert!(dead.part(1, "entries", places).await.unwrap());
    let pass_part = [
        "1".to_string(),
        pass.ticket.as_str().to_string(),
        first[0].customer.get().to_string(),
        first[0].issued_at.timestamp_millis().to_string(),
        // Past its deadline, so a lapse sweep would find it.
        (Utc::now().timestamp_millis() - 1_000).to_string(),
        "issued".to_string(),
    ];
    assert!(dead.part(1, "passes", pass_part.into_iter()).await.unwrap());

    // Half-built is missing, to everyone, and nothing writes to it.
    assert!(!room.exists(PRODUCT).await.unwrap());
    assert!(
        !room.rebuild(PRODUCT, &snapshot).await.unwrap(),
        "another is rebuilding"
    );
    assert!(!room.settle(PRODUCT, &pass, "adm-1").await.unwrap());
    assert!(room
        .lapse_due(PRODUCT, Duration::ZERO)
        .await
        .unwrap()
        .is_empty());
    room.undo_join(PRODUCT, gone.customer, &gone.ticket)
        .await
        .unwrap();
    assert_eq!(
        room.claim(PRODUCT, first[0].customer, &pass, "adm-1")
            .await
            .unwrap(),
        Claim::Missing
    );
    assert!(!room.prepare(PRODUCT, &setup(-1, 60_000, 1)).await.unwrap());
    assert!(
        !room.exists(PRODUCT).await.unwrap(),
        "nothing made it a queue"
    );

    tokio::time::sleep(Duration::from_millis(5_100)).await;
    assert!(room.rebuild(PRODUCT, &snapshot).await.unwrap());
    assert!(
        !dead
            .part(1, "line", ["1".to_string()].into_iter())
            .await
            .unwrap(),
        "its key is gone"
    );
    let counts = room.counts(PRODUCT).await.unwrap();
    assert_eq!(
        (counts.joined, counts.admitted, counts.outstanding_units),
        (4, 1, 1)
    );
    let view = room.status(PRODUCT, gone.customer).await.unwrap();
    assert_eq!(
        (view.entry, view.position),
        (None, None),
        "the deleted place stays out"
    );
    // Its hash is still there; a confirm of it is no confirm of a place.
    assert_eq!(
        room.confirm(PRODUCT, &gone).await.unwrap(),
        Confirmed::TooLate
    );
    assert_eq!(room.pre_queue(PRODUCT).await.unwrap().tickets.len(), 4);
    let holder = room.status(PRODUCT, first[0].customer).await.unwrap();
    assert_eq!(holder.pass.map(|p| p.1), Some(PassState::Issued));
    f.cleanup().await;
}

impl Fixture {
    async fn cleanup_queue(&self, product: ProductId) {
        let base = self.room.key_base(product);
        let keys: Vec<String> = self
            .keys()
            .await
            .into_iter()
            .filter(|k| k.starts_with(&base))
            .collect();
        self.delete(&keys).await;
    }
}

/// Every script on a three-master Redis Cluster: each call lands on the
/// product's slot (the per-ticket keys the scripts name themselves carry the
/// same tag), for two products on different nodes, and a rebuild there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_redis_cluster_every_script_runs_on_the_products_slot() {
    let cluster = crate::helpers::RedisCluster::start();
    let prefix = unique_prefix();
    let room = WaitingRoom::new(RedisNode::cluster(&cluster.urls).unwrap(), &prefix);
    let gate = flashsale::gate::StockGate::new(
        RedisNode::cluster(&cluster.urls).unwrap(),
        &prefix,
        Duration::from_secs(60),
        Duration::from_secs(60),
    );
    let client = redis::cluster::ClusterClient::new(cluster.urls.clone()).unwrap();
    let mut raw = client.get_async_connection().await.unwrap();
    for product in [ProductId(1), ProductId(2), ProductId(3)] {
        let start = setup(60_000, 60_000, 1);
        assert!(room.prepare(product, &start).await.unwrap());
        let mut entries = Vec::new();
        for c in 1..=3 {
            entries.push(join_confirmed(&room, product, c).await);
        }
        let order: Vec<Ticket> = entries.iter().rev().map(|e| e.ticket.clone()).collect();
        assert_eq!(room.pre_queue(product).await.unwrap().tickets.len(), 3);
        assert_eq!(room.draw(product, &order).await.unwrap(), Drawn::Done);
        let late = join_new(&room, product, 4).await;
        room.confirm(product, &late).await.unwrap();
        entries.push(Entry {
            confirmed: true,
            ..late
        });
        let undone = join_new(&room, product, 5).await;
        room.undo_join(product, CustomerId(5), &undone.ticket)
            .await
            .unwrap();
        assert!(room
            .unconfirmed(product, Duration::ZERO)
            .await
            .unwrap()
            .is_empty());
        gate.seed_if_absent(product, 2, Some(1)).await.unwrap();
        let issued = issue(&room, product, IssueBound::Gate).await;
        assert_eq!(issued.len(), 2);
        assert_eq!(issued[0].customer, CustomerId(3));
        let used = pass_of(&issued[0]);
        assert_eq!(
            room.claim(product, CustomerId(3), &used, "u")
                .await
                .unwrap(),
            Claim::Claimed { units: 1 }
        );
        assert!(room.settle(product, &used, "u").await.unwrap());
        room.unclaim(product, &used, "u").await.unwrap();
        assert!(room
            .lapse_due(product, Duration::ZERO)
            .await
            .unwrap()
            .is_empty());
        assert!(!room.lapse_claim(product, &used, "u").await.unwrap());
        let log = room.log(product, 10).await.unwrap();
        assert_eq!(log.len(), 2);
        room.ack_log(product, &log[0]).await.unwrap();
        assert_eq!(room.log(product, 10).await.unwrap().len(), 1);
        room.mirror_stock(product, 2, 0).await.unwrap();
        room.mirror_unpaid(product, 1).await.unwrap();
        assert!(room.set_state(product, QueueState::Paused).await.unwrap());
        assert!(room.set_state(product, QueueState::Open).await.unwrap());
        let customers: Vec<CustomerId> = (1..=4).map(CustomerId).collect();
        let mut before = Vec::new();
        for &c in &customers {
            before.push(room.status(product, c).await.unwrap());
        }
        assert_eq!(before[2].pass.as_ref().unwrap().1, PassState::Used);
        let counts = room.counts(product).await.unwrap();
        assert_eq!((counts.joined, counts.used, counts.open_passes), (4, 1, 1));

        // Lost and rebuilt on the cluster.
        let base = room.key_base(product);
        let mut lost: Vec<String> = room
            .fixed_keys(product)
            .into_iter()
            .filter(|k| k.starts_with(&base) && !k.ends_with("mirror_unpaid"))
            .collect();
        for e in &entries {
            lost.push(format!("{base}entry:{}", e.ticket));
            lost.push(format!("{base}pass:{}", e.ticket));
        }
        let _: i64 = redis::cmd("DEL")
            .arg(&lost)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(!room.exists(product).await.unwrap());
        let mut line = order.clone();
        line.push(entries[3].ticket.clone());
        let snapshot = QueueSnapshot {
            setup: start,
            state: QueueState::Open,
            drawn: true,
            entries: entries.clone(),
            line,
            admissions: vec![
                (issued[0].clone(), PassState::Used),
                (issued[1].clone(), PassState::Issued),
            ],
        };
        assert!(room.rebuild(product, &snapshot).await.unwrap());
        room.mirror_stock(product, 2, 0).await.unwrap();
        for (c, was) in customers.iter().zip(&before) {
            assert_eq!(
                &room.status(product, *c).await.unwrap(),
                was,
                "customer {c}"
            );
        }
    }
}

/// A place whose row committed but which Redis no longer has (taken back
/// by a sweep racing its joiner, or missing from a rebuild's snapshot) is
/// put back where the line has it when confirmed: a late one among the
/// late by arrival, a pre-queue one in the pre-queue; one lost before a
/// draw that went ahead without it cannot be, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_committed_place_redis_lost_is_put_back_where_the_line_has_it() {
    let f = Fixture::new().await;
    let room = &f.room;
    let drawn = drawn_queue(&f, PRODUCT, 2, 60_000, 1).await;
    let third = join_confirmed(room, PRODUCT, 3).await;
    let lost = join_new(room, PRODUCT, 4).await;
    let fifth = join_confirmed(room, PRODUCT, 5).await;
    assert!(lost.late && fifth.seq > lost.seq);
    // The sweep took it back while its row was committing.
    room.undo_join(PRODUCT, lost.customer, &lost.ticket)
        .await
        .unwrap();
    assert_eq!(
        room.status(PRODUCT, CustomerId(5)).await.unwrap().position,
        Some(4),
        "the line closed up"
    );
    assert_eq!(
        room.confirm(PRODUCT, &lost).await.unwrap(),
        Confirmed::PutBack
    );
    assert_eq!(
        room.confirm(PRODUCT, &lost).await.unwrap(),
        Confirmed::Confirmed
    );
    let positions = |c: i64| async move {
        let view = room.status(PRODUCT, CustomerId(c)).await.unwrap();
        (view.entry.map(|e| (e.ticket, e.confirmed)), view.position)
    };
    assert_eq!(
        positions(3).await,
        (Some((third.ticket.clone(), true)), Some(3))
    );
    assert_eq!(
        positions(4).await,
        (Some((lost.ticket.clone(), true)), Some(4))
    );
    assert_eq!(
        positions(5).await,
        (Some((fifth.ticket.clone(), true)), Some(5))
    );

    // A customer's committed place displaces their unconfirmed one, whose
    // row can never commit beside it; later joins number after it.
    let unconfirmed = join_new(room, PRODUCT, 6).await;
    let committed = Entry {
        ticket: Ticket::generate(),
        seq: 40,
        confirmed: true,
        ..unconfirmed.clone()
    };
    assert_eq!(
        room.confirm(PRODUCT, &committed).await.unwrap(),
        Confirmed::PutBack
    );
    assert_eq!(
        positions(6).await,
        (Some((committed.ticket.clone(), true)), Some(6))
    );
    assert_eq!(room.counts(PRODUCT).await.unwrap().joined, 6);
    assert_eq!(join_new(room, PRODUCT, 7).await.seq, 41);
    assert_eq!(positions(7).await.1, Some(7));

    // A pre-queue place of this drawn queue: too late to put back.
    let mut pre = drawn[0].clone();
    pre.customer = CustomerId(8);
    pre.ticket = Ticket::generate();
    assert_eq!(
        room.confirm(PRODUCT, &pre).await.unwrap(),
        Confirmed::TooLate
    );
    assert_eq!(positions(8).await, (None, None));

    // Before the draw, the pre-queue takes it back in arrival order.
    let other = ProductId(PRODUCT.get() + 1);
    room.prepare(other, &setup(60_000, 60_000, 1))
        .await
        .unwrap();
    let first = join_confirmed(room, other, 1).await;
    let second = join_new(room, other, 2).await;
    let third = join_confirmed(room, other, 3).await;
    room.undo_join(other, second.customer, &second.ticket)
        .await
        .unwrap();
    assert_eq!(
        room.confirm(other, &second).await.unwrap(),
        Confirmed::PutBack
    );
    let pre_queue = room.pre_queue(other).await.unwrap();
    assert_eq!(
        pre_queue.tickets,
        vec![
            first.ticket.clone(),
            second.ticket.clone(),
            third.ticket.clone()
        ]
    );
    assert_eq!(pre_queue.unconfirmed, 0);
    let order = vec![third.ticket, first.ticket, second.ticket.clone()];
    assert_eq!(room.draw(other, &order).await.unwrap(), Drawn::Done);

    f.cleanup_queue(other).await;
    assert_eq!(
        room.confirm(other, &second).await.unwrap(),
        Confirmed::Missing
    );
    f.cleanup().await;
}

/// The tick decides sold out from what it read a moment before; an admin's
/// pause made meanwhile stands (and so does the sold-out it then cannot make).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_state_change_from_a_stale_read_never_undoes_a_pause() {
    let f = Fixture::new().await;
    let room = &f.room;
    drawn_queue(&f, PRODUCT, 1, 60_000, 1).await;
    let state = || async { room.status(PRODUCT, CustomerId(1)).await.unwrap().queue };
    assert_eq!(state().await, QueueState::Open);
    assert!(room.set_state(PRODUCT, QueueState::Paused).await.unwrap());
    assert!(!room
        .set_state_from(PRODUCT, QueueState::Open, QueueState::SoldOut)
        .await
        .unwrap());
    assert_eq!(state().await, QueueState::Paused);
    assert!(room
        .set_state_from(PRODUCT, QueueState::Paused, QueueState::Open)
        .await
        .unwrap());
    assert!(room
        .set_state_from(PRODUCT, QueueState::Open, QueueState::SoldOut)
        .await
        .unwrap());
    assert_eq!(state().await, QueueState::SoldOut);
    f.cleanup().await;
}

/// With the gate off the mirror bounds the passes: a unit sold under a pass
/// leaves it in the same step the pass ends, and a mirror written from a
/// Postgres read older than a sale counts that sale as made. Either way no
/// pass is issued for a unit that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_gate_off_a_sale_under_a_pass_leaves_the_mirror_at_once() {
    let f = Fixture::new().await;
    let room = &f.room;
    drawn_queue(&f, PRODUCT, 4, 60_000, 1).await;
    let mirror_key = format!("{}mirror_stock", room.key_base(PRODUCT));
    let before = room.settled_units(PRODUCT).await.unwrap();
    assert_eq!(room.mirror_stock(PRODUCT, 2, before).await.unwrap(), 2);
    let issued = issue(room, PRODUCT, IssueBound::Mirror).await;
    assert_eq!(issued.len(), 2);

    // The first holder buys (Postgres's stock is 1 now) and the pass ends.
    let first = pass_of(&issued[0]);
    room.claim(PRODUCT, issued[0].customer, &first, "a")
        .await
        .unwrap();
    assert!(room.settle(PRODUCT, &first, "a").await.unwrap());
    assert_eq!(f.get(&mirror_key).await, Some(1));
    assert!(
        issue(room, PRODUCT, IssueBound::Mirror).await.is_empty(),
        "the one unit left is the second pass's"
    );

    // The tick reads what passes settled, then Postgres (stock 1); the
    // second holder buys before the tick writes the mirror from that read.
    let settled_before = room.settled_units(PRODUCT).await.unwrap();
    let second = pass_of(&issued[1]);
    room.claim(PRODUCT, issued[1].customer, &second, "b")
        .await
        .unwrap();
    assert!(room.settle(PRODUCT, &second, "b").await.unwrap());
    assert_eq!(
        room.mirror_stock(PRODUCT, 1, settled_before).await.unwrap(),
        0
    );
    assert!(issue(room, PRODUCT, IssueBound::Mirror).await.is_empty());
    // A unit that comes back (a refund) admits the next waiter.
    let settled_now = room.settled_units(PRODUCT).await.unwrap();
    assert_eq!(room.mirror_stock(PRODUCT, 1, settled_now).await.unwrap(), 1);
    assert_eq!(issue(room, PRODUCT, IssueBound::Mirror).await.len(), 1);
    f.cleanup().await;
}

/// Once the sweep has taken over a place whose joiner looked dead, that
/// joiner's late undo leaves it alone (the sweep's insert may be
/// committing); the sweep itself can still take it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joiners_undo_leaves_a_place_the_sweep_took_over() {
    let f = Fixture::new().await;
    let room = &f.room;
    room.prepare(PRODUCT, &setup(60_000, 60_000, 1))
        .await
        .unwrap();
    let slow = join_new(room, PRODUCT, 1).await;
    let swept = room.unconfirmed(PRODUCT, Duration::ZERO).await.unwrap();
    assert_eq!(swept, vec![slow.clone()]);
    room.undo_join(PRODUCT, slow.customer, &slow.ticket)
        .await
        .unwrap();
    let view = room.status(PRODUCT, slow.customer).await.unwrap();
    assert_eq!(view.entry.map(|e| e.ticket), Some(slow.ticket.clone()));
    room.undo_swept(PRODUCT, slow.customer, &slow.ticket)
        .await
        .unwrap();
    assert_eq!(
        room.status(PRODUCT, slow.customer).await.unwrap().entry,
        None
    );
    assert_eq!(room.counts(PRODUCT).await.unwrap().joined, 0);
    f.cleanup().await;
}

/// An undrawn queue of `places` confirmed pre-queue places (customers
/// 1..=places, in that arrival order), written as a rebuild writes one.
async fn undrawn_queue(f: &Fixture, product: ProductId, places: i64) -> Vec<Ticket> {
    let joined_at = Utc::now() - chrono::Duration::minutes(5);
    let entries: Vec<Entry> = (1..=places)
        .map(|i| Entry {
            customer: CustomerId(i),
            ticket: Ticket::generate(),
            seq: i,
            joined_at,
            late: false,
            confirmed: true,
        })
        .collect();
    let tickets = entries.iter().map(|e| e.ticket.clone()).collect();
    let snapshot = QueueSnapshot {
        setup: setup(-60_000, 3_600_000, 1),
        state: QueueState::Pre,
        drawn: false,
        entries,
        line: Vec::new(),
        admissions: Vec::new(),
    };
    assert!(f.room.rebuild(product, &snapshot).await.unwrap());
    tickets
}

/// Runs `step` while another connection PINGs Redis; returns what the step
/// answered, how long it took, and the slowest PING meanwhile.
async fn beside_pings<T>(
    f: &Fixture,
    step: impl std::future::Future<Output = T>,
) -> (T, Duration, Duration) {
    let mut raw = f.raw.clone();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pinger = tokio::spawn({
        let done = done.clone();
        async move {
            let mut slowest = Duration::ZERO;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let asked = std::time::Instant::now();
                let answer: redis::RedisResult<String> =
                    redis::cmd("PING").query_async(&mut raw).await;
                if answer.is_err() {
                    break;
                }
                slowest = slowest.max(asked.elapsed());
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            slowest
        }
    });
    let began = std::time::Instant::now();
    let answer = step.await;
    let took = began.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    (answer, took, pinger.await.unwrap())
}

/// A pre-queue of a hundred thousand is drawn in parts, and a queue that
/// size is dropped at once: one script over it held Redis (every gate
/// call and poll of the opening second behind it) past the client's wait,
/// which then sent it again (the draw answered `Already`, the drop `false`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pre_queue_of_a_hundred_thousand_is_drawn_in_parts_and_dropped_at_once() {
    let f = Fixture::new().await;
    let room = &f.room;
    let places = 100_000_i64;
    let mut order = undrawn_queue(&f, PRODUCT, places).await;
    assert_eq!(room.pre_queue(PRODUCT).await.unwrap().tickets, order);
    order.reverse();
    // Seen, not asserted (speed belongs in benchmarks).
    let (drawn, took, slowest) = beside_pings(&f, room.draw(PRODUCT, &order)).await;
    println!("drew {places} places in {took:?}; the slowest PING meanwhile took {slowest:?}");
    assert_eq!(drawn.unwrap(), Drawn::Done);
    let first = room.status(PRODUCT, CustomerId(places)).await.unwrap();
    assert_eq!((first.position, first.ahead), (Some(1), Some(0)));
    let last = room.status(PRODUCT, CustomerId(1)).await.unwrap();
    assert_eq!(last.position, Some(places));
    let middle = room.status(PRODUCT, CustomerId(40_001)).await.unwrap();
    assert_eq!(middle.position, Some(60_000));
    assert_eq!(room.counts(PRODUCT).await.unwrap().waiting, places);

    let (dropped, took, slowest) = beside_pings(
        &f,
        room.discard_behind(PRODUCT, Behind::Admissions { recorded: 1 }),
    )
    .await;
    println!("dropped {places} places in {took:?}; the slowest PING meanwhile took {slowest:?}");
    assert!(dropped.unwrap(), "dropped");
    assert!(!room.exists(PRODUCT).await.unwrap());
    f.cleanup().await;
}

/// A finished queue of a hundred thousand places is freed in pages of the
/// keyspace, each one call, so no call holds Redis for long; every key of
/// it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queue_of_a_hundred_thousand_places_is_retired_in_pages() {
    let f = Fixture::new().await;
    let room = &f.room;
    let places = 100_000_i64;
    undrawn_queue(&f, PRODUCT, places).await;
    let base = room.key_base(PRODUCT);
    let under = |keys: Vec<String>| keys.iter().filter(|k| k.starts_with(&base)).count();
    assert!(under(f.keys().await) as i64 > places);
    let mut budget = usize::MAX;
    let (retired, took, slowest) = beside_pings(&f, room.retire(PRODUCT, &mut budget)).await;
    // Seen, not asserted (speed belongs in benchmarks).
    println!(
        "retired {places} places in {took:?} over {} calls; the slowest PING meanwhile took {slowest:?}",
        usize::MAX - budget
    );
    assert_eq!(retired.unwrap(), Retire::Retired);
    assert_eq!(under(f.keys().await), 0);
    f.cleanup().await;
}

/// Every instance's tick draws at the opening second: one drawer stages at
/// a time (the first part takes a lease the others are refused by), so two
/// at once, even with orders of their own, leave one order whole, and the
/// other is told another is drawing; a drawer whose lease lapsed (it
/// stalled or died) is taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_drawers_at_once_leave_one_order_whole() {
    use rand::seq::SliceRandom;
    let f = Fixture::new().await;
    let room = &f.room;
    let places = 3_000_i64;
    let tickets = undrawn_queue(&f, PRODUCT, places).await;
    let meta = format!("{}meta", room.key_base(PRODUCT));
    let mut raw = f.raw.clone();
    let lease = |until: i64| {
        redis::cmd("HSET")
            .arg(&meta)
            .arg(&["drawer", "STALLED"])
            .arg("drawer_until_ms")
            .arg(until)
            .to_owned()
    };
    let now_ms = Utc::now().timestamp_millis();
    let _: () = lease(now_ms + 60_000).query_async(&mut raw).await.unwrap();
    assert_eq!(room.draw(PRODUCT, &tickets).await.unwrap(), Drawn::Busy);
    let read = room.pre_queue(PRODUCT).await.unwrap();
    assert!(!read.drawn);
    assert!(
        read.busy && read.tickets.is_empty(),
        "another drawer's live lease: the pre-queue is not paged"
    );
    let _: () = lease(now_ms - 1).query_async(&mut raw).await.unwrap();
    let read = room.pre_queue(PRODUCT).await.unwrap();
    assert!(!read.busy);
    assert_eq!(read.tickets.len(), places as usize);
    assert_eq!(
        room.draw(PRODUCT, &tickets).await.unwrap(),
        Drawn::Done,
        "a lapsed lease is taken over"
    );
    for round in 0..6 {
        let product = ProductId(100 + round);
        let tickets = undrawn_queue(&f, product, places).await;
        let customer_of: std::collections::HashMap<Ticket, i64> =
            tickets.iter().cloned().zip(1..).collect();
        let mut orders = [tickets.clone(), tickets];
        for order in &mut orders {
            order.shuffle(&mut rand::thread_rng());
        }
        let barrier = Arc::new(Barrier::new(2));
        let drawers = orders.clone().map(|order| {
            let (room, barrier) = (room.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                room.draw(product, &order).await.unwrap()
            })
        });
        let mut answers = Vec::new();
        for drawer in drawers {
            answers.push(drawer.await.unwrap());
        }
        let done: Vec<usize> = (0..2).filter(|i| answers[*i] == Drawn::Done).collect();
        assert_eq!(done.len(), 1, "{answers:?}");
        let winner = done[0];
        assert!(
            matches!(answers[1 - winner], Drawn::Busy | Drawn::Already),
            "{answers:?}"
        );
        let mut by_position = vec![0_i64; places as usize];
        for customer in 1..=places {
            let position = room
                .status(product, CustomerId(customer))
                .await
                .unwrap()
                .position
                .unwrap();
            by_position[position as usize - 1] = customer;
        }
        let won: Vec<i64> = orders[winner].iter().map(|t| customer_of[t]).collect();
        assert_eq!(by_position, won, "round {round}: {answers:?}");
        f.cleanup_queue(product).await;
    }
}

/// The check for joins Redis lost confirms the record's places past the
/// queue's mark and moves the mark in the same step, and only from the
/// mark it read: after a failover to a replica whose mark is lower (or a
/// queue of another life), a check read on the old primary does nothing
/// there, so the replica's own next check still finds what it lost. The
/// mark stops short of a refused place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_check_for_lost_joins_moves_the_mark_only_from_where_it_read_it() {
    let f = Fixture::new().await;
    let room = &f.room;
    room.prepare(PRODUCT, &setup(60_000, 1000, 1))
        .await
        .unwrap();
    let mut places = Vec::new();
    for customer in 1..=3 {
        places.push(join_confirmed(room, PRODUCT, customer).await);
    }
    let checked = room.checked_seq(PRODUCT).await.unwrap().expect("a queue");
    assert_eq!(checked.seq, 0);
    assert_eq!(
        room.confirm_checked(PRODUCT, &checked, &places[..2])
            .await
            .unwrap(),
        Some(vec![Confirmed::Confirmed; 2])
    );
    let moved = room.checked_seq(PRODUCT).await.unwrap().unwrap();
    assert_eq!(moved.seq, places[1].seq);

    // A replica whose mark is below the one the check read: nothing
    // confirmed there, nothing moved.
    let mut raw = f.raw.clone();
    let meta = format!("{}meta", room.key_base(PRODUCT));
    let _: () = redis::cmd("HSET")
        .arg(&meta)
        .arg("checked_seq")
        .arg(places[0].seq)
        .query_async(&mut raw)
        .await
        .unwrap();
    let lost = Entry {
        customer: CustomerId(9),
        ticket: Ticket::generate(),
        seq: 9,
        joined_at: Utc::now(),
        late: false,
        confirmed: true,
    };
    assert_eq!(
        room.confirm_checked(PRODUCT, &moved, std::slice::from_ref(&lost))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        room.status(PRODUCT, CustomerId(9)).await.unwrap().entry,
        None,
        "not put back by a check read elsewhere"
    );
    let other_life = Checked {
        life: "another".into(),
        seq: places[0].seq,
    };
    assert_eq!(
        room.confirm_checked(PRODUCT, &other_life, std::slice::from_ref(&lost))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        room.checked_seq(PRODUCT).await.unwrap().unwrap().seq,
        places[0].seq
    );

    // The replica's own check: the lost place comes back; a place that
    // conflicts with its customer's confirmed one holds the mark before it.
    let own = room.checked_seq(PRODUCT).await.unwrap().unwrap();
    let conflicting = Entry {
        customer: CustomerId(2),
        ticket: Ticket::generate(),
        seq: 8,
        ..lost.clone()
    };
    assert_eq!(
        room.confirm_checked(PRODUCT, &own, &[places[2].clone(), conflicting, lost])
            .await
            .unwrap(),
        Some(vec![
            Confirmed::Confirmed,
            Confirmed::Refused,
            Confirmed::PutBack
        ])
    );
    assert!(room
        .status(PRODUCT, CustomerId(9))
        .await
        .unwrap()
        .entry
        .is_some());
    assert_eq!(
        room.checked_seq(PRODUCT).await.unwrap().unwrap().seq,
        places[2].seq,
        "held short of the refused place"
    );
    f.cleanup().await;
}

/// RETIRE frees every key under its queue's base (the per-ticket hashes
/// too) and nothing else. It does not begin while a pass is open, the log
/// holds events Postgres has not recorded, a place waits to be forgotten
/// or a rebuild runs. Once begun, the queue is gone for every script (no
/// join, no mirror makes a key of it again), and any later call goes on
/// from the mark. A rebuild holds it off; a dead rebuilder or a drop leaves
/// the mark at the start, so their leftovers are paged for; a whole queue
/// (prepared anew, or rebuilt) takes the mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retiring_frees_its_own_queue_only_once_its_log_is_recorded() {
    let f = Fixture::new().await;
    let room = &f.room;
    let other = ProductId(42);
    let mut raw = f.raw.clone();
    // Enough keys that one page of the keyspace cannot be all of it.
    let mut fill = redis::cmd("MSET");
    for i in 0..3000 {
        fill.arg(format!("{}filler:{i}", f.prefix)).arg(1);
    }
    let _: () = fill.query_async(&mut raw).await.unwrap();
    let under = |keys: &[String], product: ProductId| {
        let base = room.key_base(product);
        keys.iter().filter(|k| k.starts_with(&base)).count()
    };
    let retire_whole = |product: ProductId| async move {
        let mut budget = usize::MAX;
        room.retire(product, &mut budget).await.unwrap()
    };
    let set = |key: String| {
        let mut raw = f.raw.clone();
        async move {
            let _: () = redis::cmd("SADD")
                .arg(key)
                .arg("ZZZZZZZZZZ")
                .query_async(&mut raw)
                .await
                .unwrap();
        }
    };

    drawn_queue(&f, PRODUCT, 3, 300, 1).await;
    drawn_queue(&f, other, 2, 60_000, 1).await;
    f.set_stock(PRODUCT, 1).await;
    assert_eq!(issue(room, PRODUCT, IssueBound::Gate).await.len(), 1);
    assert_eq!(
        retire_whole(PRODUCT).await,
        Retire::NotYet,
        "a pass is open"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    room.lapse_due(PRODUCT, Duration::ZERO).await.unwrap();
    assert_eq!(
        retire_whole(PRODUCT).await,
        Retire::NotYet,
        "the issue and the lapse are not recorded"
    );
    let log = room.log(PRODUCT, 10).await.unwrap();
    assert_eq!(log.len(), 2);
    room.ack_log(PRODUCT, log.last().unwrap()).await.unwrap();
    let base = room.key_base(PRODUCT);
    for (key, why) in [
        (format!("{base}forget"), "a place waits to be forgotten"),
        (format!("{base}rebuilding"), "a rebuild runs"),
    ] {
        set(key.clone()).await;
        assert_eq!(retire_whole(PRODUCT).await, Retire::NotYet, "{why}");
        let _: () = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    assert!(room.exists(PRODUCT).await.unwrap(), "nothing was freed");

    // Begun: the queue is gone for every script at once.
    let mut one_page = 1;
    assert_eq!(
        room.retire(PRODUCT, &mut one_page).await.unwrap(),
        Retire::PartWay,
        "one page of a keyspace of over 3,000 keys is not all of it"
    );
    assert_eq!(one_page, 0);
    assert!(!room.exists(PRODUCT).await.unwrap());
    assert!(room.is_retiring(PRODUCT).await.unwrap());
    assert_eq!(
        room.join(PRODUCT, CustomerId(1), &Ticket::generate())
            .await
            .unwrap(),
        Joined::Missing
    );
    room.mirror_unpaid(PRODUCT, 3).await.unwrap();
    room.mirror_stock(PRODUCT, 5, 0).await.unwrap();
    let keys = f.keys().await;
    assert!(!keys.contains(&format!("{base}mirror_unpaid")));
    assert!(!keys.contains(&format!("{base}mirror_stock")));

    // Another call (another instance's) goes on from the mark and frees
    // the rest, and nothing of another sale's or of other keys.
    let before_other = under(&keys, other);
    assert!(before_other > 2);
    assert_eq!(retire_whole(PRODUCT).await, Retire::Retired);
    let keys = f.keys().await;
    assert_eq!(under(&keys, PRODUCT), 0, "{keys:?}");
    assert!(!room.is_retiring(PRODUCT).await.unwrap());
    assert_eq!(under(&keys, other), before_other);
    let filler = format!("{}filler:", f.prefix);
    assert_eq!(keys.iter().filter(|k| k.starts_with(&filler)).count(), 3000);
    assert_eq!(retire_whole(PRODUCT).await, Retire::Retired, "and again");

    // A rebuild holds a retirement off while it runs; one that dies leaves
    // the mark at the start, so its leftovers are paged for.
    let mut one_page = 1;
    assert_eq!(
        room.retire(other, &mut one_page).await.unwrap(),
        Retire::PartWay
    );
    let mark = format!("{}retiring", room.key_base(other));
    let read_mark = |raw: redis::aio::MultiplexedConnection| {
        let mark = mark.clone();
        async move {
            let mut raw = raw;
            let value: Option<String> = redis::cmd("GET")
                .arg(&mark)
                .query_async(&mut raw)
                .await
                .unwrap();
            value
        }
    };
    assert_ne!(read_mark(raw.clone()).await.as_deref(), Some("0"));
    let rebuilder = room.begin_rebuild(other).await.unwrap().unwrap();
    assert_eq!(
        read_mark(raw.clone()).await.as_deref(),
        Some("0"),
        "from the start"
    );
    assert_eq!(retire_whole(other).await, Retire::NotYet, "a rebuild runs");
    rebuilder.abandon().await;
    assert_eq!(read_mark(raw.clone()).await.as_deref(), Some("0"));
    let _: () = redis::cmd("HSET")
        .arg(format!("{}entry:ZZZZZZZZZZ", room.key_base(other)))
        .arg("customer")
        .arg(7)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(room.is_retiring(other).await.unwrap());
    assert_eq!(retire_whole(other).await, Retire::Retired);
    assert_eq!(under(&f.keys().await, other), 0);

    // A drop leaves the mark at the start too: a retirement pages for the
    // hashes it left, which nothing else reaches.
    drawn_queue(&f, other, 2, 60_000, 1).await;
    assert!(!room.is_retiring(other).await.unwrap());
    assert!(room
        .discard_behind(other, Behind::Admissions { recorded: 5 })
        .await
        .unwrap());
    assert!(room.is_retiring(other).await.unwrap());
    assert!(
        under(&f.keys().await, other) >= 2,
        "the entry hashes are left"
    );
    assert_eq!(retire_whole(other).await, Retire::Retired);
    assert_eq!(under(&f.keys().await, other), 0);

    // A whole queue is no one's to free: a queue prepared anew, or a
    // rebuild that finishes, takes the mark.
    drawn_queue(&f, other, 2, 60_000, 1).await;
    assert!(room
        .discard_behind(other, Behind::Admissions { recorded: 5 })
        .await
        .unwrap());
    room.prepare(other, &setup(60_000, 300, 1)).await.unwrap();
    assert!(!room.is_retiring(other).await.unwrap());
    assert!(room
        .discard_behind(other, Behind::Admissions { recorded: 5 })
        .await
        .unwrap());
    let snapshot = QueueSnapshot {
        setup: setup(60_000, 300, 1),
        state: QueueState::Pre,
        drawn: false,
        entries: Vec::new(),
        line: Vec::new(),
        admissions: Vec::new(),
    };
    assert!(room.rebuild(other, &snapshot).await.unwrap());
    assert!(!room.is_retiring(other).await.unwrap());

    // A mark another server wrote (a failover, a restart: its cursor means
    // nothing here) is paged from the start.
    drawn_queue(&f, other, 8, 60_000, 1).await;
    assert!(room
        .discard_behind(other, Behind::Admissions { recorded: 99 })
        .await
        .unwrap());
    let size: usize = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
    let (halfway, _): (String, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("COUNT")
        .arg(size / 2)
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{}retiring", room.key_base(other)))
        .arg(format!("0123456789abcdef:{halfway}"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(under(&f.keys().await, other) >= 8);
    assert_eq!(retire_whole(other).await, Retire::Retired);
    assert_eq!(under(&f.keys().await, other), 0);
    f.cleanup().await;
}
