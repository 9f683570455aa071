//! SIGTERM to the real `flashsale serve` binary: `/readyz` fails at once,
//! the instance serves through the drain, finishes what is in flight and
//! exits 0; a rolling restart of two instances loses no answered order.

use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::helpers::*;
use reqwest::StatusCode;

fn sigterm(server: &ServerProcess) {
    // SAFETY: kill(2) on a child this test started and has not reaped.
    let sent = unsafe { libc::kill(server.guard.pid() as i32, libc::SIGTERM) };
    assert_eq!(sent, 0, "SIGTERM could not be sent");
}

/// Waits for the child to exit by itself, at most `within`.
async fn exit_of(server: &mut ServerProcess, within: Duration) -> (ExitStatus, Duration) {
    let started = Instant::now();
    loop {
        if let Some(status) = server.guard.0.try_wait().unwrap() {
            return (status, started.elapsed());
        }
        assert!(
            started.elapsed() < within,
            "the server did not exit within {within:?} of the check"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client that opens a new connection for every request, as a load
/// balancer's health check does.
fn probe_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

async fn status_and_body(client: &reqwest::Client, url: String) -> (StatusCode, String) {
    let response = client.get(url).send().await.unwrap();
    let status = response.status();
    (status, response.text().await.unwrap())
}

/// The release binary serving `db` with these drain and stop bounds,
/// checked ready (so its signal handler is in place), and a probe client.
async fn ready_server(
    db: &TestDb,
    drain_secs: &str,
    timeout_secs: &str,
) -> (ServerProcess, reqwest::Client) {
    let env = [
        ("DRAIN_SECONDS", drain_secs),
        ("SHUTDOWN_TIMEOUT_SECS", timeout_secs),
    ];
    ready_server_with(db, &unique_prefix(), &env).await
}

/// `ready_server` with the Redis `prefix` and whatever `env` the test sets.
async fn ready_server_with(
    db: &TestDb,
    prefix: &str,
    env: &[(&str, &str)],
) -> (ServerProcess, reqwest::Client) {
    let server =
        start_server_process_from(&server_binary(), &db.url, prefix, &"ab".repeat(64), env);
    let probe = probe_client();
    assert_eq!(
        status_and_body(&probe, format!("{}/readyz", server.address)).await,
        (StatusCode::OK, "ready".to_string())
    );
    (server, probe)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_fails_readyz_at_once_serves_through_the_drain_then_exits_zero() {
    const DRAIN: Duration = Duration::from_secs(3);
    let db = TestDb::new();
    let (mut server, probe) = ready_server(&db, "3", "5").await;
    let base = server.address.clone();

    sigterm(&server);
    let signalled = Instant::now();
    // "At once": the first probe after the signal, allowing only for the
    // signal's delivery.
    let mut first_503 = None;
    while first_503.is_none() {
        let (status, body) = status_and_body(&probe, format!("{base}/readyz")).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(body.contains("draining"), "{body}");
            first_503 = Some(signalled.elapsed());
        } else {
            assert!(
                signalled.elapsed() < Duration::from_millis(500),
                "/readyz still {status}"
            );
        }
    }
    let first_503 = first_503.unwrap();

    // Through the drain, liveness and pages still answer, and readiness
    // stays failed; every answer closes its connection.
    let mut served_during_drain = 0;
    while signalled.elapsed() < DRAIN - Duration::from_millis(700) {
        let (status, _) = status_and_body(&probe, format!("{base}/healthz")).await;
        assert_eq!(status, StatusCode::OK, "/healthz during the drain");
        let page = probe.get(format!("{base}/")).send().await.unwrap();
        assert_eq!(
            page.status(),
            StatusCode::OK,
            "the shop's front page during the drain"
        );
        assert_eq!(
            page.headers()
                .get("connection")
                .map(|v| v.to_str().unwrap()),
            Some("close"),
            "answers while draining close their connection"
        );
        let (status, _) = status_and_body(&probe, format!("{base}/readyz")).await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "/readyz during the drain"
        );
        served_during_drain += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Nothing in flight: it exits soon after the drain, within drain + timeout.
    let (status, _) = exit_of(&mut server, DRAIN + Duration::from_secs(5 + 2)).await;
    let exited_after = signalled.elapsed();
    eprintln!(
        "first 503 after {first_503:?}; {served_during_drain} rounds served while draining; exited after {exited_after:?} with {status}"
    );
    assert_eq!(status.code(), Some(0), "exit status {status}");
    assert!(
        exited_after >= DRAIN,
        "exited after {exited_after:?}, before the drain ended"
    );
    assert!(served_during_drain >= 5);
}

/// An operator who does not want to wait sends the signal again: the
/// process exits at once, in the middle of a long drain, with 143.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_ends_the_stop_at_once() {
    let db = TestDb::new();
    let (mut server, probe) = ready_server(&db, "30", "30").await;
    let base = server.address.clone();
    sigterm(&server);
    // The first signal was taken: the instance is draining, not gone.
    let signalled = Instant::now();
    loop {
        let (status, body) = status_and_body(&probe, format!("{base}/readyz")).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert!(body.contains("draining"), "{body}");
            break;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(2),
            "/readyz still {status}"
        );
    }
    assert!(
        server.guard.0.try_wait().unwrap().is_none(),
        "exited on the first signal"
    );

    sigterm(&server);
    let (status, took) = exit_of(&mut server, Duration::from_secs(5)).await;
    assert_eq!(status.code(), Some(143), "exit status {status}");
    assert!(took < Duration::from_secs(5), "took {took:?}, not at once");
}

/// How many passes of the expiry job `/metrics` has counted.
async fn expiry_runs(probe: &reqwest::Client, base: &str) -> u64 {
    let (status, metrics) = status_and_body(probe, format!("{base}/metrics")).await;
    assert_eq!(status, StatusCode::OK, "/metrics");
    metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix("flashsale_job_runs_total{job=\"expire_unpaid_orders\"} ")
        })
        .map_or(0, |count| count.trim().parse().unwrap())
}

/// Several steps of the stop held up at once: a buy waiting for its
/// product's lock (a tracked task, and a request open for actix to finish)
/// and the expiry job's give-back of an unpaid order, waiting for the same
/// lock. Together they end at one deadline, `SHUTDOWN_TIMEOUT_SECS` after
/// the drain, not one timeout per step, and the process still exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_stop_after_the_drain_is_one_timeout_however_many_steps_are_held() {
    const DRAIN: Duration = Duration::from_secs(1);
    const TIMEOUT: Duration = Duration::from_secs(3);
    let db = TestDb::new();
    let prefix = unique_prefix();
    let env = [
        ("DRAIN_SECONDS", "1"),
        ("SHUTDOWN_TIMEOUT_SECS", "3"),
        ("LOCK_WAIT_MS", "60000"),
        // An unpaid order expires a second after it was made, and the
        // expiry job looks every second.
        ("PAYMENT_TIMEOUT", "1"),
        ("JOBS_INTERVAL", "1"),
        ("RECONCILE_INTERVAL", "3600"),
    ];
    let (mut server, probe) = ready_server_with(&db, &prefix, &env).await;
    let base = server.address.clone();
    let pool =
        flashsale::db::build_pool(&db.url, 2, Duration::from_secs(5), Duration::from_secs(3));
    let product = create_product(&pool, 10, None).await;
    let customers = sign_up_customers(&base, 2, "held").await;
    let (unpaid, waiting) = (&customers[0], &customers[1]);
    let token = unpaid.csrf().await;
    let bought = unpaid.web.buy(product, "1", &token, None).await.unwrap();
    assert_eq!(bought.status(), StatusCode::SEE_OTHER);
    let unpaid_order = order_id_from(&bought);

    // This test holds the product's lock, as another instance mid-purchase
    // would: the next buy and the unpaid order's give-back both wait.
    let settings = flashsale::config::Settings::for_tests(&db.url, &prefix);
    let observer = flashsale::services::Shop::new(settings).await.unwrap();
    let held = observer
        .locks
        .acquire(vec![flashsale::domain::ProductId(product)])
        .await
        .unwrap();
    let token = waiting.csrf().await;
    let buy = {
        let web = waiting.web.clone();
        tokio::spawn(async move { web.buy(product, "1", &token, None).await })
    };

    // The order is due; the expiry job's pass that took it on is stuck on
    // the lock, so the job's count stands still.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let runs = expiry_runs(&probe, &base).await;
    assert!(runs > 0, "the expiry job never ran");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        expiry_runs(&probe, &base).await,
        runs,
        "the expiry job is not held by the lock"
    );
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) AS n FROM orders WHERE id = {unpaid_order} AND status = 'awaiting_payment'"
        )),
        1,
        "the unpaid order was given back before the stop"
    );
    assert!(!buy.is_finished(), "the buy was answered before the stop");

    sigterm(&server);
    let signalled = Instant::now();
    // Waited for well past the old bound (a timeout per step) so that a
    // failure says how long the stop took.
    let (status, _) = exit_of(&mut server, DRAIN + 6 * TIMEOUT).await;
    let exited_after = signalled.elapsed();
    let answer = buy.await.unwrap();
    eprintln!(
        "exit {status} after {exited_after:?} (drain {DRAIN:?}, timeout {TIMEOUT:?}); the held buy: {:?}",
        answer.as_ref().map(|response| response.status())
    );
    held.release().await;
    assert_eq!(status.code(), Some(0), "exit status {status}");
    assert!(
        exited_after < DRAIN + TIMEOUT + Duration::from_millis(1500),
        "exited after {exited_after:?}: more than the drain and one timeout"
    );
    assert!(
        exited_after >= DRAIN + TIMEOUT - Duration::from_millis(200),
        "exited after {exited_after:?}, before the deadline, with work held"
    );
    assert!(
        answer.is_err(),
        "the held buy was answered, so it did not hold the stop"
    );
}

/// Buys waiting for the product's lock when SIGTERM arrives are still
/// waiting when the drain ends and the instance stops accepting; the lock
/// is let go only then, and every one of them must be answered, its order
/// written and its give-backs done before the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buys_in_flight_at_sigterm_all_complete_before_exit() {
    const STOCK: i64 = 20;
    const BUYERS: usize = 30;
    const DRAIN: Duration = Duration::from_secs(2);
    let db = TestDb::new();
    let prefix = unique_prefix();
    let env = [
        ("DRAIN_SECONDS", "2"),
        ("SHUTDOWN_TIMEOUT_SECS", "20"),
        ("LOCK_WAIT_MS", "15000"),
        ("JOBS_INTERVAL", "3600"),
        ("RECONCILE_INTERVAL", "3600"),
    ];
    let mut server =
        start_server_process_from(&server_binary(), &db.url, &prefix, &"cd".repeat(64), &env);
    let pool =
        flashsale::db::build_pool(&db.url, 2, Duration::from_secs(5), Duration::from_secs(3));
    let product = create_product(&pool, STOCK as i32, None).await;
    let customers = sign_up_customers(&server.address, BUYERS, "inflight").await;
    let mut tokens = Vec::new();
    for buyer in &customers {
        tokens.push(buyer.csrf().await);
    }

    // This test's own view of the shop holds the product's lock, as another
    // instance mid-purchase would.
    let settings = flashsale::config::Settings::for_tests(&db.url, &prefix);
    let observer = flashsale::services::Shop::new(settings).await.unwrap();
    let pid = flashsale::domain::ProductId(product);
    let held = observer.locks.acquire(vec![pid]).await.unwrap();

    let buys: Vec<_> = customers
        .iter()
        .cloned()
        .zip(tokens)
        .map(|(buyer, token)| {
            tokio::spawn(async move { buyer.web.buy(product, "1", &token, None).await })
        })
        .collect();
    // Let every buy reach the server and queue behind the lock (the gate
    // answers the ones past the stock at once).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let answered_before = buys.iter().filter(|buy| buy.is_finished()).count();

    sigterm(&server);
    let signalled = Instant::now();
    let probe = probe_client();
    let (status, _) = status_and_body(&probe, format!("{}/readyz", server.address)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    // Past the drain: the instance no longer accepts, and the buys still wait.
    tokio::time::sleep(DRAIN + Duration::from_millis(1000)).await;
    let answered_at_release = buys.iter().filter(|buy| buy.is_finished()).count();
    assert!(
        server.guard.0.try_wait().unwrap().is_none(),
        "the server exited with buys in flight"
    );
    held.release().await;

    let mut statuses = Vec::new();
    let mut orders = Vec::new();
    for buy in buys {
        let response = buy
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("a buy in flight at SIGTERM got no answer: {e}"));
        if response.status() == StatusCode::SEE_OTHER {
            orders.push(order_id_from(&response));
        }
        statuses.push(response.status());
    }
    let (status, _) = exit_of(&mut server, Duration::from_secs(20 + 5)).await;
    eprintln!(
        "{answered_before} answered before SIGTERM, {answered_at_release} by the lock's release; answers {:?}; exit {status} after {:?}",
        tally(&statuses),
        signalled.elapsed()
    );
    assert_eq!(status.code(), Some(0), "exit status {status}");
    assert!(
        BUYERS - answered_at_release >= STOCK as usize,
        "only {} buys were in flight when the drain ended: the test proves nothing",
        BUYERS - answered_at_release
    );
    for status in &statuses {
        assert!(
            *status == StatusCode::SEE_OTHER || *status == StatusCode::CONFLICT,
            "unexpected answer {status}: {:?}",
            tally(&statuses)
        );
    }
    assert_eq!(
        orders.len() as i64,
        STOCK,
        "every unit sold: {:?}",
        tally(&statuses)
    );
    for order in &orders {
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) AS n FROM orders WHERE id = {order}"
            )),
            1,
            "order {order} was answered but is not in Postgres"
        );
    }
    assert_eq!(
        db.count("SELECT count(*) AS n FROM orders"),
        orders.len() as i64
    );
    let sold = db.count("SELECT COALESCE(sum(quantity), 0)::int8 AS n FROM order_items");
    assert_eq!(sold + db.stock(product), STOCK);
    db.assert_audit_clean();
    // The gate (when on) agrees with Postgres without a reconcile: no
    // admission was left pending by the stop.
    if let Some(gate) = observer.gate.clone() {
        assert_eq!(gate.stock(pid).await.unwrap(), Some(db.stock(product)));
    }
}

/// What the crowd saw during the rolling restart.
#[derive(Default)]
struct Seen {
    statuses: Vec<StatusCode>,
    orders: Vec<i64>,
    /// Requests sent whose answer never came (connection cut mid-request).
    lost: Vec<String>,
    /// Buys an instance refused to connect, retried on the other: the
    /// instance stopped accepting while still in rotation.
    redispatched: Vec<String>,
}

/// The test's load balancer: the instances whose `/readyz` answered 200 at
/// the last poll (every 200 ms, HAProxy-like), and a connect failure retried
/// on the other instance, as HAProxy's `retries` / `redispatch` do.
struct Rotation {
    bases: Vec<String>,
    ready: Vec<AtomicBool>,
    next: AtomicUsize,
}

impl Rotation {
    fn pick(&self) -> Vec<String> {
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.bases.len();
        let mut order: Vec<usize> = (0..n).map(|i| (first + i) % n).collect();
        // Ready ones first; the others only as a last resort.
        order.sort_by_key(|i| !self.ready[*i].load(Ordering::Relaxed));
        order.into_iter().map(|i| self.bases[i].clone()).collect()
    }

    async fn poll(self: Arc<Self>, done: Arc<AtomicBool>) {
        let probe = probe_client();
        while !done.load(Ordering::Relaxed) {
            for (base, ready) in self.bases.iter().zip(&self.ready) {
                let up = matches!(
                    probe.get(format!("{base}/readyz")).timeout(Duration::from_millis(500)).send().await,
                    Ok(response) if response.status() == StatusCode::OK
                );
                ready.store(up, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

async fn wait_ready(base: &str) {
    let probe = probe_client();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(response) = probe.get(format!("{base}/readyz")).send().await {
            if response.status() == StatusCode::OK {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{base} never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_restart_of_two_instances_loses_no_answered_order() {
    const STOCK: i64 = 100_000;
    const CROWD: usize = 12;
    let db = TestDb::new();
    let prefix = unique_prefix();
    let key = "ef".repeat(64);
    let binary = server_binary();
    let ports = [free_port(), free_port()];
    let binds: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let start = |i: usize| {
        let env = [
            ("BIND", binds[i].as_str()),
            // Longer than the clients' 2 s idle timeout: a connection kept
            // alive from before the signal is gone when the instance stops.
            ("DRAIN_SECONDS", "3"),
            ("SHUTDOWN_TIMEOUT_SECS", "10"),
        ];
        start_server_process_from(&binary, &db.url, &prefix, &key, &env)
    };
    let mut instances = [start(0), start(1)];
    let bases: Vec<String> = instances.iter().map(|s| s.address.clone()).collect();
    let pool =
        flashsale::db::build_pool(&db.url, 2, Duration::from_secs(5), Duration::from_secs(3));
    let product = create_product(&pool, STOCK as i32, None).await;
    let customers = sign_up_customers(&bases[0], CROWD, "rolling").await;

    let rotation = Arc::new(Rotation {
        bases: bases.clone(),
        ready: vec![AtomicBool::new(true), AtomicBool::new(true)],
        next: AtomicUsize::new(0),
    });
    let done = Arc::new(AtomicBool::new(false));
    let poller = tokio::spawn(rotation.clone().poll(done.clone()));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut crowd = Vec::new();
    for buyer in customers {
        let (rotation, done, seen) = (rotation.clone(), done.clone(), seen.clone());
        crowd.push(tokio::spawn(async move {
            // Sessions are sealed with the shared key: one cookie jar serves
            // both instances (cookies do not tell ports apart).
            let client = buyer.web.client.clone();
            let token = buyer.csrf().await;
            while !done.load(Ordering::Relaxed) {
                let mut answer = None;
                for base in rotation.pick() {
                    let web = flashsale::qa::harness::Browser::new(&base, client.clone());
                    match web.buy(product, "1", &token, None).await {
                        Ok(response) => {
                            answer = Some(response);
                            break;
                        }
                        // Never reached the instance: the next one gets it.
                        Err(error) if error.is_connect() => {
                            seen.lock()
                                .unwrap()
                                .redispatched
                                .push(format!("{base}: {error}"));
                            continue;
                        }
                        Err(error) => {
                            seen.lock().unwrap().lost.push(format!("{base}: {error}"));
                            break;
                        }
                    }
                }
                match answer {
                    Some(response) => {
                        let mut seen = seen.lock().unwrap();
                        if response.status() == StatusCode::SEE_OTHER {
                            seen.orders.push(order_id_from(&response));
                        }
                        seen.statuses.push(response.status());
                    }
                    None => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }));
    }

    let answered = |seen: &Arc<Mutex<Seen>>| seen.lock().unwrap().orders.len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut phases = Vec::new();
    for i in 0..2 {
        let before = answered(&seen);
        sigterm(&instances[i]);
        let signalled = Instant::now();
        let (status, _) = exit_of(&mut instances[i], Duration::from_secs(3 + 10 + 5)).await;
        let stopped_after = signalled.elapsed();
        assert_eq!(status.code(), Some(0), "instance {i} exit status {status}");
        instances[i] = start(i);
        wait_ready(&bases[i]).await;
        // Both serve again before the next one goes.
        tokio::time::sleep(Duration::from_secs(2)).await;
        phases.push(format!(
            "instance {i}: exited 0 after {stopped_after:?}, {} orders answered meanwhile",
            answered(&seen) - before
        ));
    }
    done.store(true, Ordering::Relaxed);
    for buyer in crowd {
        buyer.await.unwrap();
    }
    poller.await.unwrap();

    let seen = seen.lock().unwrap();
    eprintln!(
        "{phases:?}; answers {:?}; lost {:?}; redispatched {:?}",
        tally(&seen.statuses),
        seen.lost,
        seen.redispatched
    );
    assert!(
        seen.lost.is_empty(),
        "requests cut mid-way: {:?}",
        seen.lost
    );
    // The balancer took each instance out on its `/readyz` before the
    // instance stopped accepting: no buy had to be sent again.
    assert!(
        seen.redispatched.is_empty(),
        "an instance refused connections while in rotation: {:?}",
        seen.redispatched
    );
    assert!(
        seen.statuses.iter().all(|s| *s == StatusCode::SEE_OTHER),
        "every buy (the stock never runs out) is an order: {:?}",
        tally(&seen.statuses)
    );
    assert!(
        seen.orders.len() > 50,
        "too few buys to prove anything: {}",
        seen.orders.len()
    );
    let in_db = db.count("SELECT count(*) AS n FROM orders");
    assert_eq!(
        in_db,
        seen.orders.len() as i64,
        "orders answered vs orders in Postgres"
    );
    let missing = db.count(&format!(
        "SELECT count(*) AS n FROM unnest(ARRAY[{}]::int8[]) AS answered(id) WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = answered.id)",
        seen.orders.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(",")
    ));
    assert_eq!(missing, 0, "answered orders missing from Postgres");
    let sold = db.count("SELECT COALESCE(sum(quantity), 0)::int8 AS n FROM order_items");
    assert_eq!(sold + db.stock(product), STOCK);
    db.assert_audit_clean();
}

/// Buyers who hang up while their buys wait for the lock: the purchases go
/// on, on tasks no request awaits any more, and the stop must wait for
/// them, or the worker's runtime drops them half way (gate units admitted,
/// no order written, until reconcile).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buys_whose_buyers_hung_up_are_finished_before_exit() {
    const STOCK: i64 = 10;
    const BUYERS: usize = 10;
    let db = TestDb::new();
    let prefix = unique_prefix();
    let env = [
        ("DRAIN_SECONDS", "1"),
        ("SHUTDOWN_TIMEOUT_SECS", "20"),
        ("LOCK_WAIT_MS", "15000"),
        ("JOBS_INTERVAL", "3600"),
        ("RECONCILE_INTERVAL", "3600"),
    ];
    let mut server =
        start_server_process_from(&server_binary(), &db.url, &prefix, &"12".repeat(64), &env);
    let pool =
        flashsale::db::build_pool(&db.url, 2, Duration::from_secs(5), Duration::from_secs(3));
    let product = create_product(&pool, STOCK as i32, None).await;
    let customers = sign_up_customers(&server.address, BUYERS, "hungup").await;
    let mut tokens = Vec::new();
    for buyer in &customers {
        tokens.push(buyer.csrf().await);
    }
    let settings = flashsale::config::Settings::for_tests(&db.url, &prefix);
    let observer = flashsale::services::Shop::new(settings).await.unwrap();
    let pid = flashsale::domain::ProductId(product);
    let held = observer.locks.acquire(vec![pid]).await.unwrap();

    // Each buyer gives up after 800 ms, while the buy waits for the lock.
    let url = format!("{}/products/{product}/buy", server.address);
    let buys: Vec<_> = customers
        .iter()
        .zip(tokens)
        .map(|(buyer, token)| {
            let request = buyer
                .web
                .client
                .post(&url)
                .form(&[("quantity", "1"), ("csrf_token", token.as_str())])
                .timeout(Duration::from_millis(800));
            tokio::spawn(request.send())
        })
        .collect();
    for buy in buys {
        let error = buy
            .await
            .unwrap()
            .expect_err("the buy answered before the lock was free");
        assert!(error.is_timeout(), "{error}");
    }
    assert_eq!(db.count("SELECT count(*) AS n FROM orders"), 0);

    sigterm(&server);
    let signalled = Instant::now();
    // Past the drain and into the stop: only the purchases keep it alive.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    held.release().await;
    let (status, _) = exit_of(&mut server, Duration::from_secs(25)).await;
    let orders = db.count("SELECT count(*) AS n FROM orders");
    eprintln!(
        "exit {status} after {:?}; {orders} orders written for {BUYERS} buyers who hung up",
        signalled.elapsed()
    );
    assert_eq!(status.code(), Some(0), "exit status {status}");
    assert_eq!(
        orders, STOCK,
        "purchases of buyers who hung up were dropped by the stop"
    );
    let sold = db.count("SELECT COALESCE(sum(quantity), 0)::int8 AS n FROM order_items");
    assert_eq!(sold + db.stock(product), STOCK);
    db.assert_audit_clean();
    if let Some(gate) = observer.gate.clone() {
        assert_eq!(gate.stock(pid).await.unwrap(), Some(db.stock(product)));
    }
}
