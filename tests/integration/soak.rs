//! The exactly-once soak (issue #15): three real `flashsale serve` processes
//! on one private Postgres and one private Redis take a random workload of
//! buys, cart checkouts, payments (approved, declined, slow, lost answer)
//! and refunds, every one under an idempotency key and some sent again,
//! while a nemesis kills -9 and restarts an instance, pauses one past its
//! lock lease, restarts Redis and crashes Postgres. At the end, after the
//! jobs and a reconcile: every intent has at most one order and each answer
//! that named an order named that one, every charge has its payment, every
//! unit is counted once, no limit is exceeded, and the gate equals the
//! database.
//!
//! `SOAK_SEED` picks the workload's choices (the seed is printed); timing
//! still differs from run to run.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use diesel::RunQueryDsl;
use flashsale::domain::ProductId;
use flashsale::qa::harness;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::header::{HeaderValue, COOKIE, LOCATION};

use crate::helpers::postgres::PrivatePostgres;
use crate::helpers::*;

const CUSTOMERS: usize = 36;
/// How long the customers keep starting new intents.
const WORKLOAD: Duration = Duration::from_secs(72);
const LEASE: Duration = Duration::from_millis(2_000);
/// After a connection error or a 503 the customer presses again; an intent
/// still unresolved after this is left to the end, when all is back up.
const PATIENCE: Duration = Duration::from_secs(25);
const RESEND_CHANCE: f64 = 0.25;
/// What a customer may mistype into the quantity field (the shop sells 1 to 100).
const BAD_QUANTITIES: [&str; 5] = ["0", "-1", "lots", "2.5", "101"];
const DOUBLE_SEND_CHANCE: f64 = 0.05;

/// The sale: (name, units, per-customer limit).
const PRODUCTS: [(&str, i32, Option<i32>); 4] = [
    ("plenty", 5_000, None),
    ("limited-3", 400, Some(3)),
    ("scarce-limited-2", 30, Some(2)),
    ("many", 3_000, None),
];

/// The servers' settings: a lease short enough that a pause outlives it, the
/// jobs and reconcile every second or two, unpaid orders expiring within the
/// soak, and a provider timeout shorter than the slow card's answer.
fn server_env(redis_url: &str) -> Vec<(String, String)> {
    [
        ("REDIS_URL", redis_url),
        ("STOCK_GATE", "on"),
        ("LOCK_LEASE_MS", "2000"),
        ("LOCK_WAIT_MS", "3000"),
        ("DB_STATEMENT_TIMEOUT_MS", "1000"),
        ("DB_CONNECT_TIMEOUT_MS", "1000"),
        ("DB_POOL_SIZE", "8"),
        ("PAYMENT_TIMEOUT", "25"),
        ("PAYMENT_PROVIDER_TIMEOUT_MS", "1000"),
        ("JOBS_INTERVAL", "1"),
        ("RECONCILE_INTERVAL", "2"),
        // Warnings come by the thousand while Postgres is down.
        ("RUST_LOG", "error"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

// ---------------------------------------------------------------- cookies

/// A cookie jar that can be read and put back: a resent cart checkout must
/// carry the cart it was first sent with, as a browser's resend of the same
/// form does, not the emptied cart the first answer may have set. Cookies
/// are not port-specific, so one session serves all three instances.
#[derive(Default)]
struct Jar(Mutex<BTreeMap<String, String>>);

impl reqwest::cookie::CookieStore for Jar {
    fn set_cookies(&self, headers: &mut dyn Iterator<Item = &HeaderValue>, _url: &reqwest::Url) {
        let mut jar = self.0.lock().unwrap();
        for header in headers {
            let Ok(text) = header.to_str() else { continue };
            let mut parts = text.split(';');
            let Some((name, value)) = parts.next().and_then(|p| p.trim().split_once('=')) else {
                continue;
            };
            let removed =
                value.is_empty() || parts.any(|a| a.trim().eq_ignore_ascii_case("max-age=0"));
            if removed {
                jar.remove(name);
            } else {
                jar.insert(name.to_string(), value.to_string());
            }
        }
    }

    fn cookies(&self, _url: &reqwest::Url) -> Option<HeaderValue> {
        self.header()
    }
}

impl Jar {
    fn header(&self) -> Option<HeaderValue> {
        let jar = self.0.lock().unwrap();
        let text: Vec<String> = jar.iter().map(|(n, v)| format!("{n}={v}")).collect();
        (!text.is_empty()).then(|| HeaderValue::from_str(&text.join("; ")).unwrap())
    }

    fn snapshot(&self) -> BTreeMap<String, String> {
        self.0.lock().unwrap().clone()
    }

    fn restore(&self, cookies: BTreeMap<String, String>) {
        *self.0.lock().unwrap() = cookies;
    }
}

// ---------------------------------------------------------------- what was said

#[derive(Debug, Clone)]
enum Answer {
    /// No answer: refused connection, reset, or timeout (the instance died or hung).
    Lost(String),
    Got {
        status: u16,
        location: Option<String>,
        title: String,
        replayed: bool,
        instance: usize,
    },
}

impl Answer {
    /// An answer that settles the intent: 303, or a 4xx other than "still in progress".
    fn is_final(&self) -> bool {
        match self {
            Answer::Lost(_) => false,
            Answer::Got { status, title, .. } => {
                *status == 303 || ((400..500).contains(status) && title != "Already in progress")
            }
        }
    }

    fn label(&self) -> String {
        match self {
            Answer::Lost(why) => format!("lost ({why})"),
            Answer::Got {
                status,
                title,
                replayed,
                ..
            } => {
                let title = if *status == 303 {
                    String::new()
                } else {
                    format!(" {title}")
                };
                let replayed = if *replayed { " (replayed)" } else { "" };
                format!("{status}{title}{replayed}")
            }
        }
    }

    fn location(&self) -> Option<&str> {
        match self {
            Answer::Got {
                status: 303,
                location,
                ..
            } => location.as_deref(),
            _ => None,
        }
    }

    /// The order a 303 to `/orders/N` names.
    fn order(&self) -> Option<i64> {
        self.location()?.strip_prefix("/orders/")?.parse().ok()
    }
}

#[derive(Debug, Clone)]
enum Action {
    Buy {
        product: i64,
        quantity: String,
    },
    Checkout {
        cookie: HeaderValue,
        lines: [(i64, i32); 2],
    },
    Pay {
        order: i64,
        card: &'static str,
    },
    Refund {
        order: i64,
    },
}

impl Action {
    fn kind(&self) -> &'static str {
        match self {
            Action::Buy { quantity, .. } if BAD_QUANTITIES.contains(&quantity.as_str()) => {
                "buy (bad quantity)"
            }
            Action::Buy { .. } => "buy",
            Action::Checkout { .. } => "cart checkout",
            Action::Pay { card, .. } => match *card {
                GOOD_CARD => "pay (approve)",
                DECLINED_CARD => "pay (decline)",
                SLOW_CARD => "pay (slow)",
                _ => "pay (lost answer)",
            },
            Action::Refund { .. } => "refund",
        }
    }

    fn is_bad_input(&self) -> bool {
        self.kind() == "buy (bad quantity)"
    }
}

struct KeyRecord {
    /// Index into the soak's people; the admin is the last.
    person: usize,
    action: Action,
    answers: Vec<Answer>,
    /// The intent was still unresolved when its customer moved on.
    unresolved: bool,
}

#[derive(Default)]
struct Log {
    keys: BTreeMap<String, KeyRecord>,
    resends: BTreeMap<&'static str, usize>,
}

/// What the workload and the nemesis share.
struct Soak {
    addresses: RwLock<Vec<String>>,
    log: Mutex<Log>,
    /// Orders paid with an approving card that answered 303: refund candidates.
    paid: Mutex<Vec<i64>>,
    requests: AtomicUsize,
}

impl Soak {
    fn instance(&self, rng: &mut StdRng) -> (usize, String) {
        let addresses = self.addresses.read().unwrap();
        let i = rng.gen_range(0..addresses.len());
        (i, addresses[i].clone())
    }

    fn record(&self, key: &str, answer: Answer) {
        let mut log = self.log.lock().unwrap();
        log.keys.get_mut(key).unwrap().answers.push(answer);
    }

    fn resent(&self, why: &'static str) {
        *self.log.lock().unwrap().resends.entry(why).or_insert(0) += 1;
    }
}

/// One signed-up customer (or the admin): its own client and cookie jar.
struct Person {
    index: usize,
    email: String,
    client: reqwest::Client,
    jar: Arc<Jar>,
    csrf: String,
}

fn client(jar: Arc<Jar>) -> reqwest::Client {
    harness::Browser::client_builder()
        .cookie_provider(jar)
        .pool_max_idle_per_host(2)
        .pool_idle_timeout(Duration::from_secs(2))
        // Longer than a pause past the lease: a paused instance still answers.
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn heading(page: &str) -> String {
    page.split("<h1>")
        .nth(1)
        .and_then(|h| h.split("</h1>").next())
        .unwrap_or("")
        .trim()
        .to_string()
}

impl Person {
    async fn sign_up(index: usize, base: &str, email: String) -> Person {
        let jar = Arc::new(Jar::default());
        let web = harness::Browser::new(base, client(jar.clone()));
        let response = web.sign_up(&email, PASSWORD).await.unwrap();
        assert_eq!(response.status(), 303, "sign-up of {email}");
        Person::signed_in(index, web, jar, email).await
    }

    async fn sign_in(index: usize, base: &str, email: String) -> Person {
        let jar = Arc::new(Jar::default());
        let web = harness::Browser::new(base, client(jar.clone()));
        web.sign_in(&email, PASSWORD).await.unwrap();
        Person::signed_in(index, web, jar, email).await
    }

    async fn signed_in(
        index: usize,
        web: harness::Browser,
        jar: Arc<Jar>,
        email: String,
    ) -> Person {
        let csrf = web.csrf().await.unwrap();
        Person {
            index,
            email,
            client: web.client,
            jar,
            csrf,
        }
    }

    /// Sends `action` under `key` to the instance at `base`.
    async fn send(
        &self,
        soak: &Soak,
        instance: usize,
        base: &str,
        key: &str,
        action: &Action,
    ) -> Answer {
        soak.requests.fetch_add(1, Ordering::Relaxed);
        let csrf = self.csrf.as_str();
        let (path, mut fields, cookie) = match action {
            Action::Buy { product, quantity } => (
                format!("/products/{product}/buy"),
                vec![("quantity", quantity.as_str())],
                None,
            ),
            Action::Checkout { cookie, .. } => ("/cart/checkout".into(), vec![], Some(cookie)),
            Action::Pay { order, card } => (
                format!("/orders/{order}/pay"),
                vec![("card_number", *card)],
                None,
            ),
            Action::Refund { order } => (format!("/admin/orders/{order}/refund"), vec![], None),
        };
        fields.push(("csrf_token", csrf));
        fields.push(("idempotency_key", key));
        let mut request = self.client.post(format!("{base}{path}")).form(&fields);
        if let Some(cookie) = cookie {
            request = request.header(COOKIE, cookie.clone());
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => return Answer::Lost(error_kind(&error)),
        };
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|l| l.to_str().ok())
            .map(String::from);
        let replayed = response.headers().contains_key("idempotent-replayed");
        let page = match response.text().await {
            Ok(page) => page,
            Err(error) => return Answer::Lost(error_kind(&error)),
        };
        Answer::Got {
            status,
            location,
            title: heading(&page),
            replayed,
            instance,
        }
    }

    /// Sends `action` under a new key until it is settled, sometimes twice
    /// at once, sometimes once more after it is settled. Returns the final answer.
    async fn intent(
        &self,
        soak: &Soak,
        rng: &mut StdRng,
        key: String,
        action: Action,
    ) -> Option<Answer> {
        soak.log.lock().unwrap().keys.insert(
            key.clone(),
            KeyRecord {
                person: self.index,
                action: action.clone(),
                answers: Vec::new(),
                unresolved: false,
            },
        );
        let settled = self
            .until_settled(soak, rng, &key, &action, PATIENCE, true)
            .await;
        match &settled {
            Some(_) if rng.gen_bool(RESEND_CHANCE) => {
                soak.resent("after a final answer");
                let (i, base) = soak.instance(rng);
                let again = self.send(soak, i, &base, &key, &action).await;
                soak.record(&key, again);
            }
            Some(_) => {}
            None => {
                soak.log
                    .lock()
                    .unwrap()
                    .keys
                    .get_mut(&key)
                    .unwrap()
                    .unresolved = true
            }
        }
        settled
    }

    /// Sends `action` under `key` to random instances until an answer
    /// settles it, resending after a lost answer or a 503 as a person presses
    /// again, for at most `patience`.
    async fn until_settled(
        &self,
        soak: &Soak,
        rng: &mut StdRng,
        key: &str,
        action: &Action,
        patience: Duration,
        mut first: bool,
    ) -> Option<Answer> {
        let started = Instant::now();
        while started.elapsed() < patience {
            let (i, base) = soak.instance(rng);
            let answer = if first && rng.gen_bool(DOUBLE_SEND_CHANCE) {
                // A double click: the same form to two instances at once.
                soak.resent("double send");
                let (j, other) = soak.instance(rng);
                let (a, b) = tokio::join!(
                    self.send(soak, i, &base, key, action),
                    self.send(soak, j, &other, key, action)
                );
                soak.record(key, a.clone());
                soak.record(key, b.clone());
                if a.is_final() {
                    a
                } else {
                    b
                }
            } else {
                let answer = self.send(soak, i, &base, key, action).await;
                soak.record(key, answer.clone());
                answer
            };
            first = false;
            if answer.is_final() {
                return Some(answer);
            }
            soak.resent(match answer {
                Answer::Lost(_) => "after a lost answer",
                Answer::Got { status: 409, .. } => "after 409 in progress",
                _ => "after a 5xx",
            });
            tokio::time::sleep(Duration::from_millis(rng.gen_range(100..600))).await;
        }
        None
    }
}

fn error_kind(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        "timeout".into()
    } else if error.is_connect() {
        "connect".into()
    } else {
        "cut".into()
    }
}

// ---------------------------------------------------------------- the workload

async fn customer(soak: Arc<Soak>, me: Arc<Person>, products: Vec<i64>, seed: u64, until: Instant) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut unpaid: Vec<i64> = Vec::new();
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        let key = format!("soak-{}-{n}", me.index);
        let roll: f64 = rng.gen();
        if roll < 0.45 {
            let product = products[rng.gen_range(0..products.len())];
            let quantity = rng.gen_range(1..=3).to_string();
            let answer = me
                .intent(&soak, &mut rng, key, Action::Buy { product, quantity })
                .await;
            unpaid.extend(answer.and_then(|a| a.order()));
        } else if roll < 0.60 {
            if let Some(answer) = checkout(&soak, &me, &mut rng, &products, key).await {
                unpaid.extend(answer.order());
            }
        } else if roll < 0.98 {
            if unpaid.is_empty() {
                continue;
            }
            let order = unpaid.swap_remove(rng.gen_range(0..unpaid.len()));
            let card = match rng.gen_range(0..100) {
                0..=54 => GOOD_CARD,
                55..=74 => DECLINED_CARD,
                75..=89 => SLOW_CARD,
                _ => LOST_ANSWER_CARD,
            };
            let answer = me
                .intent(&soak, &mut rng, key, Action::Pay { order, card })
                .await;
            match answer {
                Some(a) if a.location().is_some() && card != DECLINED_CARD => {
                    soak.paid.lock().unwrap().push(order)
                }
                // Paying a second time is refused; now and then a customer tries.
                _ if rng.gen_bool(0.1) => unpaid.push(order),
                _ => {}
            }
        } else {
            let product = products[rng.gen_range(0..products.len())];
            let quantity = BAD_QUANTITIES[rng.gen_range(0..BAD_QUANTITIES.len())].to_string();
            me.intent(&soak, &mut rng, key, Action::Buy { product, quantity })
                .await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..80))).await;
    }
}

/// Two products into the cart, then the checkout; the jar is put back to
/// the empty cart afterwards, whatever the checkout's answers set.
async fn checkout(
    soak: &Soak,
    me: &Person,
    rng: &mut StdRng,
    products: &[i64],
    key: String,
) -> Option<Answer> {
    let empty = me.jar.snapshot();
    let first = rng.gen_range(0..products.len());
    let second = (first + rng.gen_range(1..products.len())) % products.len();
    let lines = [
        (products[first], rng.gen_range(1..=2)),
        (products[second], rng.gen_range(1..=2)),
    ];
    for (product, units) in lines {
        let (_, base) = soak.instance(rng);
        let units = units.to_string();
        let product = product.to_string();
        let fields = [
            ("product_id", product.as_str()),
            ("quantity", units.as_str()),
            ("csrf_token", me.csrf.as_str()),
        ];
        let added = me
            .client
            .post(format!("{base}/cart/add"))
            .form(&fields)
            .send()
            .await;
        if !matches!(&added, Ok(r) if r.status() == 303) {
            // An instance down or the database away: no cart this time.
            me.jar.restore(empty);
            return None;
        }
    }
    let cookie = me.jar.header().unwrap();
    let answer = me
        .intent(soak, rng, key, Action::Checkout { cookie, lines })
        .await;
    me.jar.restore(empty);
    answer
}

async fn admin(soak: Arc<Soak>, me: Arc<Person>, seed: u64, until: Instant) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(150..450))).await;
        let order = {
            let mut paid = soak.paid.lock().unwrap();
            if paid.is_empty() {
                continue;
            }
            let i = rng.gen_range(0..paid.len());
            paid.swap_remove(i)
        };
        n += 1;
        me.intent(
            &soak,
            &mut rng,
            format!("soak-admin-{n}"),
            Action::Refund { order },
        )
        .await;
    }
}

// ---------------------------------------------------------------- the nemesis

#[derive(Debug, Clone, Copy)]
enum Fault {
    KillNine,
    PausePastLease,
    RestartRedis,
    CrashPostgres,
}

/// What the nemesis owns: the servers it kills and restarts.
struct Cluster {
    servers: Vec<ServerProcess>,
    postgres: PrivatePostgres,
    redis: ChildGuard,
    redis_port: u16,
    prefix: String,
    session_key: String,
    env: Vec<(String, String)>,
}

impl Cluster {
    fn start_server(&self) -> ServerProcess {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        start_server_process_from(
            &server_binary(),
            &self.postgres.url(),
            &self.prefix,
            &self.session_key,
            &env,
        )
    }
}

/// Runs `schedule` (seconds after `start`, fault) on its own thread; the
/// shop keeps selling between faults. Then reports the faults on `done` and
/// keeps the cluster until `finished` says (or its sender is dropped):
/// whatever this thread restarted dies with it (PR_SET_PDEATHSIG fires when
/// the thread that spawned a child exits, not the process).
fn nemesis(
    mut cluster: Cluster,
    soak: Arc<Soak>,
    schedule: Vec<(u64, Fault)>,
    start: Instant,
    seed: u64,
    done: tokio::sync::oneshot::Sender<BTreeMap<String, usize>>,
    finished: std::sync::mpsc::Receiver<()>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut counts = BTreeMap::new();
    for (at, fault) in schedule {
        let when = start + Duration::from_secs(at);
        std::thread::sleep(when.saturating_duration_since(Instant::now()));
        let victim = rng.gen_range(0..cluster.servers.len());
        let began = Instant::now();
        match fault {
            Fault::KillNine => {
                cluster.servers[victim].guard.kill();
                std::thread::sleep(Duration::from_millis(1_500));
                let fresh = cluster.start_server();
                soak.addresses.write().unwrap()[victim] = fresh.address.clone();
                cluster.servers[victim] = fresh;
            }
            Fault::PausePastLease => {
                let pid = cluster.servers[victim].guard.pid() as libc::pid_t;
                // SAFETY: kill(2) on the PID of a child whose guard is held and not reaped.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                std::thread::sleep(LEASE + Duration::from_millis(1_500));
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
            Fault::RestartRedis => {
                cluster.redis.kill();
                std::thread::sleep(Duration::from_millis(500));
                cluster.redis = start_redis_on(cluster.redis_port);
            }
            Fault::CrashPostgres => {
                cluster.postgres.crash();
                std::thread::sleep(Duration::from_millis(1_500));
                cluster.postgres.restart();
            }
        }
        eprintln!(
            "nemesis at {:>5.1}s: {fault:?} (instance {victim}) for {:.1}s",
            start.elapsed().as_secs_f64() - began.elapsed().as_secs_f64(),
            began.elapsed().as_secs_f64()
        );
        *counts.entry(format!("{fault:?}")).or_insert(0) += 1;
    }
    let _ = done.send(counts);
    let _ = finished.recv();
    drop(cluster);
}

// ---------------------------------------------------------------- the test

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_under_kills_pauses_and_restarts_of_redis_and_postgres() {
    let seed: u64 = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("soak seed {seed} (SOAK_SEED={seed} repeats the workload's choices)");
    let set_up = Instant::now();
    let postgres = PrivatePostgres::start();
    let (redis, redis_port) = start_redis();
    let redis_url = format!("redis://127.0.0.1:{redis_port}");
    let db = TestDb::attach(&postgres.url());
    let prefix = unique_prefix();
    let mut cluster = Cluster {
        servers: Vec::new(),
        postgres,
        redis,
        redis_port,
        prefix: prefix.clone(),
        session_key: "5a".repeat(64),
        env: server_env(&redis_url),
    };
    for _ in 0..3 {
        let server = cluster.start_server();
        cluster.servers.push(server);
    }
    let addresses: Vec<String> = cluster.servers.iter().map(|s| s.address.clone()).collect();

    let pool =
        flashsale::db::build_pool(&db.url, 2, Duration::from_secs(5), Duration::from_secs(3));
    let mut products = Vec::new();
    let mut limits = HashMap::new();
    for (name, units, limit) in PRODUCTS {
        let id = create_product(&pool, units, limit).await;
        diesel::sql_query(format!(
            "UPDATE products SET name = '{name}' WHERE id = {id}"
        ))
        .execute(&mut db.conn())
        .unwrap();
        products.push(id);
        limits.insert(id, (units, limit));
    }
    flashsale::services::accounts::ensure_admin(
        &pool,
        flashsale::domain::Email::parse("admin@example.com").unwrap(),
        flashsale::domain::Password::parse(PASSWORD).unwrap(),
    )
    .await
    .unwrap();
    drop(pool);

    let signups = (0..CUSTOMERS)
        .map(|i| Person::sign_up(i, &addresses[i % 3], format!("soak{i}@example.com")));
    let mut people: Vec<Person> = futures::StreamExt::collect(futures::StreamExt::buffered(
        futures::stream::iter(signups),
        6,
    ))
    .await;
    // Confirmed, as they would be from their links: the limited products
    // sell only to confirmed addresses.
    assert_eq!(
        db.count(
            "WITH u AS (UPDATE customers SET email_confirmed_at = now() \
             WHERE email LIKE 'soak%@example.com' RETURNING 1) SELECT count(*) AS n FROM u"
        ),
        CUSTOMERS as i64
    );
    people.push(Person::sign_in(CUSTOMERS, &addresses[0], "admin@example.com".into()).await);
    let people: Vec<Arc<Person>> = people.into_iter().map(Arc::new).collect();
    let customer_ids: Vec<i64> = people
        .iter()
        .map(|p| {
            db.count(&format!(
                "SELECT id AS n FROM customers WHERE email = '{}'",
                p.email
            ))
        })
        .collect();
    eprintln!(
        "set up in {:.1}s: {} customers and an admin on 3 instances",
        set_up.elapsed().as_secs_f64(),
        CUSTOMERS
    );

    let soak = Arc::new(Soak {
        addresses: RwLock::new(addresses),
        log: Mutex::new(Log::default()),
        paid: Mutex::new(Vec::new()),
        requests: AtomicUsize::new(0),
    });
    let start = Instant::now();
    let until = start + WORKLOAD;
    let schedule = vec![
        (6, Fault::KillNine),
        (14, Fault::PausePastLease),
        (22, Fault::RestartRedis),
        (30, Fault::CrashPostgres),
        (39, Fault::KillNine),
        (47, Fault::PausePastLease),
        (55, Fault::RestartRedis),
        (63, Fault::CrashPostgres),
    ];
    let (done, faults) = tokio::sync::oneshot::channel();
    let (release_cluster, nemesis_may_end) = std::sync::mpsc::channel::<()>();
    let nemesis = NemesisThread {
        release: Some(release_cluster),
        thread: Some(std::thread::spawn({
            let soak = soak.clone();
            move || {
                nemesis(
                    cluster,
                    soak,
                    schedule,
                    start,
                    seed ^ 0x5eed,
                    done,
                    nemesis_may_end,
                )
            }
        })),
    };
    let mut tasks = Vec::new();
    for person in &people[..CUSTOMERS] {
        let seed = seed.wrapping_add(person.index as u64 * 7919);
        let task = customer(soak.clone(), person.clone(), products.clone(), seed, until);
        tasks.push(tokio::spawn(task));
    }
    let admin_task = admin(
        soak.clone(),
        people[CUSTOMERS].clone(),
        seed.wrapping_add(1),
        until,
    );
    tasks.push(tokio::spawn(admin_task));
    let finished = futures::future::join_all(tasks).await;
    // The nemesis has stopped before any check, so nothing stays paused.
    let faults = faults.await.expect("the nemesis ran its schedule");
    for task in finished {
        task.expect("a customer's loop");
    }
    let workload_ended = Instant::now();
    eprintln!(
        "workload: {:.1}s, {} requests; faults {faults:?}",
        start.elapsed().as_secs_f64(),
        soak.requests.load(Ordering::Relaxed)
    );

    let mut problems = Vec::new();
    resolve_the_rest(&soak, &people, seed).await;
    settle_payments(&db).await;
    // Past the longest a live gate admission may stay pending, so reconcile
    // counts only what the database holds.
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(workload_ended.elapsed())).await;
    let observer = observer(&db.url, &prefix, &redis_url).await;
    check_gate(
        &observer,
        &redis_url,
        &db,
        &products,
        &limits,
        &mut problems,
    )
    .await;
    below_the_limit_buys(
        &soak,
        &people,
        &customer_ids,
        &db,
        &products,
        &limits,
        &mut problems,
        seed,
    )
    .await;
    report(&soak, &db, &products, &faults);
    // The database's side first: one per product or per kind of row, where
    // the per-key checks below may name thousands of keys.
    check_ledger(&db, &limits, &mut problems);
    check_payments(&db, &mut problems);
    check_keys_against_orders(&soak, &db, &customer_ids, &mut problems);
    check_answers(&soak, &mut problems);
    // A broken shop can fail thousands of intents: the first ones say how.
    const SHOWN: usize = 60;
    assert!(
        problems.is_empty(),
        "the soak (seed {seed}) found {} problems{}:\n{}",
        problems.len(),
        if problems.len() > SHOWN {
            format!(", the first {SHOWN}")
        } else {
            String::new()
        },
        problems[..problems.len().min(SHOWN)].join("\n")
    );
    db.assert_audit_clean();
    drop(nemesis);
}

/// The nemesis's thread, told to stop the cluster and waited for when this
/// drops, pass or fail, so a failed soak too stops its servers and removes
/// its Postgres data directory.
struct NemesisThread {
    release: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for NemesisThread {
    fn drop(&mut self) {
        self.release.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ---------------------------------------------------------------- the end

/// Every intent still without a settling answer is sent again, now that
/// every part of the shop is back, until it has one.
async fn resolve_the_rest(soak: &Arc<Soak>, people: &[Arc<Person>], seed: u64) {
    let open: Vec<(String, usize, Action)> = soak
        .log
        .lock()
        .unwrap()
        .keys
        .iter()
        .filter(|(_, r)| !r.answers.iter().any(Answer::is_final))
        .map(|(k, r)| (k.clone(), r.person, r.action.clone()))
        .collect();
    eprintln!(
        "{} intents unsettled when the workload ended; resending them",
        open.len()
    );
    let tasks = open
        .into_iter()
        .enumerate()
        .map(|(n, (key, person, action))| {
            let soak = soak.clone();
            let person = people[person].clone();
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed.wrapping_add(n as u64));
                let patience = Duration::from_secs(40);
                person
                    .until_settled(&soak, &mut rng, &key, &action, patience, false)
                    .await
            })
        });
    for task in futures::future::join_all(tasks).await {
        task.unwrap();
    }
}

/// Waits until the jobs have settled every payment attempt (slow and lost
/// answers are looked up at the provider).
async fn settle_payments(db: &TestDb) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pending = db.count("SELECT count(*) AS n FROM payments WHERE outcome = 'pending'");
        if pending == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{pending} payment attempts were never settled by the jobs"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// This test's own view of the shop: the same database, Redis and prefix,
/// with the servers' timings.
async fn observer(db_url: &str, prefix: &str, redis_url: &str) -> flashsale::services::Shop {
    let mut settings = flashsale::config::Settings::for_tests(db_url, prefix);
    settings.redis_urls = vec![redis_url.to_string()];
    settings.stock_gate = true;
    settings.db_pool_size = 2;
    settings.lock_wait = Duration::from_secs(3);
    settings.lock_lease = LEASE;
    settings.db_statement_timeout = Duration::from_secs(1);
    settings.db_connect_timeout = Duration::from_secs(1);
    flashsale::services::Shop::new(settings).await.unwrap()
}

/// Reconcile once (what the faults left is corrected and shown), then the
/// gate must equal the database: a second pass finds nothing to correct,
/// each stock counter is the database's stock, and each customer's holdings
/// of a limited product are the units of their live orders.
async fn check_gate(
    observer: &flashsale::services::Shop,
    redis_url: &str,
    db: &TestDb,
    products: &[i64],
    limits: &HashMap<i64, (i32, Option<i32>)>,
    problems: &mut Vec<String>,
) {
    use flashsale::services::stock_gate::reconcile_once;
    let first = reconcile_once(observer).await.unwrap();
    eprintln!(
        "reconcile after the soak: {} checked, {} failed, drifts: {:?}",
        first.checked,
        first.failed,
        first
            .drifts
            .iter()
            .map(|d| d.describe())
            .collect::<Vec<_>>()
    );
    let second = reconcile_once(observer).await.unwrap();
    if second.failed != 0 || !second.drifts.is_empty() {
        problems.push(format!(
            "a second reconcile still corrected the gate: {} failed, {:?}",
            second.failed, second.drifts
        ));
    }
    let gate = observer.gate.clone().unwrap();
    let redis = redis::Client::open(redis_url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for &product in products {
        // Under the product's lock, as every change of both sides is made:
        // the servers' expiry job may restore an order meanwhile, and it
        // commits in Postgres before it gives the gate its units back.
        let held_key = format!("{}gate:{{product:{product}}}:held", observer.redis_prefix);
        let (gate, url, mut redis) = (gate.clone(), db.url.clone(), redis.clone());
        let (in_gate, stock, held, live) = observer
            .locks
            .with_locks(vec![ProductId(product)], move |_lease| async move {
                let in_gate = gate.stock(ProductId(product)).await?;
                let db = TestDb::attach(&url);
                let held: BTreeMap<i64, i64> = redis::cmd("HGETALL")
                    .arg(&held_key)
                    .query_async(&mut redis)
                    .await
                    .unwrap();
                let live = live_units_by_customer(&mut db.conn(), product);
                Ok((in_gate, db.stock(product), held, live))
            })
            .await
            .unwrap();
        if in_gate != Some(stock) {
            problems.push(format!(
                "product {product}: gate stock {in_gate:?}, database {stock}"
            ));
        }
        if limits[&product].1.is_none() {
            continue;
        }
        if held != live {
            problems.push(format!(
                "product {product}: gate holdings {held:?} but live orders hold {live:?}"
            ));
        }
    }
}

#[derive(diesel::QueryableByName, Debug)]
struct Held {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    customer_id: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    units: i64,
}

fn live_units_by_customer(conn: &mut diesel::PgConnection, product: i64) -> BTreeMap<i64, i64> {
    diesel::sql_query(format!(
        "SELECT o.customer_id, sum(i.quantity)::int8 AS units FROM order_items i \
             JOIN orders o ON o.id = i.order_id \
             WHERE i.product_id = {product} AND o.status IN ('awaiting_payment', 'paid') \
             GROUP BY o.customer_id"
    ))
    .load::<Held>(conn)
    .unwrap()
    .into_iter()
    .map(|h| (h.customer_id, h.units))
    .collect()
}

fn customers_with_unpaid_orders(db: &TestDb, product: i64) -> BTreeSet<i64> {
    #[derive(diesel::QueryableByName)]
    struct Unpaid {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        customer_id: i64,
    }
    diesel::sql_query(format!(
        "SELECT DISTINCT o.customer_id FROM orders o JOIN order_items i ON i.order_id = o.id \
         WHERE i.product_id = {product} AND o.status = 'awaiting_payment'"
    ))
    .load::<Unpaid>(&mut db.conn())
    .unwrap()
    .into_iter()
    .map(|u| u.customer_id)
    .collect()
}

/// No customer is refused below their limit: on each limited product with
/// units left, a customer holding fewer than the limit buys up to it (and
/// is admitted), then one more (and is refused for the limit).
#[allow(clippy::too_many_arguments)]
async fn below_the_limit_buys(
    soak: &Arc<Soak>,
    people: &[Arc<Person>],
    customer_ids: &[i64],
    db: &TestDb,
    products: &[i64],
    limits: &HashMap<i64, (i32, Option<i32>)>,
    problems: &mut Vec<String>,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x11);
    for &product in products {
        let Some(limit) = limits[&product].1 else {
            continue;
        };
        let live = live_units_by_customer(&mut db.conn(), product);
        // An unpaid order may expire between the reads and the buys (the
        // servers' jobs still run), which would make room for one more:
        // the edge is checked on a customer whose units are all paid for.
        let unpaid = customers_with_unpaid_orders(db, product);
        let stock = db.stock(product);
        let below = (0..CUSTOMERS).find(|&p| {
            !unpaid.contains(&customer_ids[p])
                && live.get(&customer_ids[p]).copied().unwrap_or(0) < i64::from(limit)
        });
        let Some(p) = below else {
            continue;
        };
        let room = i64::from(limit) - live.get(&customer_ids[p]).copied().unwrap_or(0);
        if stock < room + 1 {
            eprintln!("product {product}: {stock} left, too few to check the limit's edge");
            continue;
        }
        let person = &people[p];
        let up_to = Action::Buy {
            product,
            quantity: room.to_string(),
        };
        let answer = person
            .intent(soak, &mut rng, format!("soak-edge-{product}-a"), up_to)
            .await;
        if answer.as_ref().and_then(Answer::order).is_none() {
            problems.push(format!(
                "product {product}: customer {} holding {} of {limit} was refused {room} more: {:?}",
                customer_ids[p],
                i64::from(limit) - room,
                answer.map(|a| a.label())
            ));
            continue;
        }
        let one_more = Action::Buy {
            product,
            quantity: "1".into(),
        };
        let answer = person
            .intent(soak, &mut rng, format!("soak-edge-{product}-b"), one_more)
            .await;
        let refused = matches!(&answer, Some(Answer::Got { status: 409, title, .. }) if title == "Purchase limit reached");
        if !refused {
            problems.push(format!(
                "product {product}: a customer at the limit of {limit} was answered {:?}",
                answer.map(|a| a.label())
            ));
        }
    }
}

// ---------------------------------------------------------------- the checks

fn report(soak: &Soak, db: &TestDb, products: &[i64], faults: &BTreeMap<String, usize>) {
    let log = soak.log.lock().unwrap();
    let mut intents: BTreeMap<&str, usize> = BTreeMap::new();
    let mut answers: BTreeMap<(&str, String), usize> = BTreeMap::new();
    for record in log.keys.values() {
        *intents.entry(record.action.kind()).or_insert(0) += 1;
        for answer in &record.answers {
            *answers
                .entry((record.action.kind(), answer.label()))
                .or_insert(0) += 1;
        }
    }
    eprintln!(
        "soak: {} intents, {} requests; faults: {faults:?}",
        log.keys.len(),
        soak.requests.load(Ordering::Relaxed)
    );
    eprintln!("intents by kind: {intents:?}");
    eprintln!("resends by reason: {:?}", log.resends);
    eprintln!(
        "intents still unsettled when their customer moved on (resent at the end): {}",
        log.keys.values().filter(|r| r.unresolved).count()
    );
    for ((kind, label), n) in &answers {
        eprintln!("  {kind:<20} {label:<45} {n:>6}");
    }
    let by = |sql: &str| -> Vec<(String, i64)> {
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            label: String,
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        diesel::sql_query(sql)
            .load::<Row>(&mut db.conn())
            .unwrap()
            .into_iter()
            .map(|r| (r.label, r.n))
            .collect()
    };
    eprintln!(
        "orders by status: {:?}",
        by("SELECT status AS label, count(*) AS n FROM orders GROUP BY status ORDER BY status")
    );
    eprintln!(
        "payments by outcome: {:?}",
        by("SELECT outcome AS label, count(*) AS n FROM payments GROUP BY outcome ORDER BY outcome")
    );
    eprintln!(
        "sandbox charges: {:?}",
        by("SELECT approved::text AS label, count(*) AS n FROM sandbox_charges GROUP BY approved")
    );
    eprintln!(
        "orders per 10 s from the first: {:?}",
        by("SELECT (floor(extract(epoch FROM created_at - (SELECT min(created_at) FROM orders)) / 10) * 10)::int8::text \
            AS label, count(*) AS n FROM orders GROUP BY 1 ORDER BY min(created_at)")
    );
    for &product in products {
        eprintln!(
            "product {product}: stock {} of {}",
            db.stock(product),
            db.count(&format!(
                "SELECT initial_stock::int8 AS n FROM products WHERE id = {product}"
            ))
        );
    }
}

/// Only answers the shop means: 303, 409, 503, and 422/400 for bad input
/// only; a 303 of a purchase names an order; a 303 of a payment or refund
/// goes back to that order; every intent was settled in the end.
fn check_answers(soak: &Soak, problems: &mut Vec<String>) {
    let log = soak.log.lock().unwrap();
    for (key, record) in &log.keys {
        let history = || {
            record
                .answers
                .iter()
                .map(Answer::label)
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !record.answers.iter().any(Answer::is_final) {
            problems.push(format!(
                "{key} ({}) never settled: {}",
                record.action.kind(),
                history()
            ));
        }
        for answer in &record.answers {
            let Answer::Got {
                status,
                location,
                instance,
                ..
            } = answer
            else {
                continue;
            };
            let meant = match status {
                303 | 409 | 503 => true,
                400 | 422 => record.action.is_bad_input(),
                _ => false,
            };
            if !meant || (record.action.is_bad_input() && *status == 303) {
                problems.push(format!(
                    "{key} ({}) answered {} by instance {instance}: {}",
                    record.action.kind(),
                    answer.label(),
                    history()
                ));
            }
            if *status != 303 {
                continue;
            }
            let expected = match &record.action {
                Action::Buy { .. } | Action::Checkout { .. } => None,
                Action::Pay { order, .. } => Some(format!("/orders/{order}")),
                Action::Refund { order } => Some(format!("/admin/orders/{order}")),
            };
            let fine = match &expected {
                None => answer.order().is_some(),
                Some(expected) => location.as_deref() == Some(expected.as_str()),
            };
            if !fine {
                problems.push(format!(
                    "{key} ({}) redirected to {location:?} (expected {}): {}",
                    record.action.kind(),
                    expected.unwrap_or_else(|| "/orders/N".into()),
                    history()
                ));
            }
        }
    }
}

#[derive(diesel::QueryableByName, Debug)]
struct KeyRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    customer_id: i64,
    #[diesel(sql_type = diesel::sql_types::Text)]
    key: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    order_id: Option<i64>,
}

#[derive(diesel::QueryableByName, Debug)]
struct ItemRow {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    order_id: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    customer_id: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    product_id: i64,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    quantity: i32,
}

/// One intent, at most one order: every order is named by exactly one of
/// the customers' keys; a key whose answer named an order names exactly
/// that order in the database, and that order holds what the intent asked
/// for; an order in the database was named to its customer at least once.
fn check_keys_against_orders(
    soak: &Soak,
    db: &TestDb,
    customer_ids: &[i64],
    problems: &mut Vec<String>,
) {
    let mut conn = db.conn();
    let rows: Vec<KeyRow> =
        diesel::sql_query("SELECT customer_id, key, order_id FROM idempotency_keys")
            .load(&mut conn)
            .unwrap();
    let named: HashMap<(i64, String), Option<i64>> = rows
        .iter()
        .map(|r| ((r.customer_id, r.key.clone()), r.order_id))
        .collect();
    let items: Vec<ItemRow> = diesel::sql_query(
        "SELECT i.order_id, o.customer_id, i.product_id, i.quantity FROM order_items i \
         JOIN orders o ON o.id = i.order_id ORDER BY i.order_id, i.product_id",
    )
    .load(&mut conn)
    .unwrap();
    let mut orders: BTreeMap<i64, (i64, Vec<(i64, i32)>)> = BTreeMap::new();
    for item in &items {
        let entry = orders
            .entry(item.order_id)
            .or_insert((item.customer_id, Vec::new()));
        entry.1.push((item.product_id, item.quantity));
    }
    let mut keys_of_order: BTreeMap<i64, Vec<&str>> = BTreeMap::new();
    for row in &rows {
        if let Some(order) = row.order_id {
            keys_of_order.entry(order).or_default().push(&row.key);
        }
    }
    for (order, keys) in &keys_of_order {
        if keys.len() > 1 {
            problems.push(format!("order {order} is named by several keys: {keys:?}"));
        }
    }
    for order in orders.keys() {
        if !keys_of_order.contains_key(order) {
            problems.push(format!(
                "order {order} is named by no idempotency key: an intent bought twice?"
            ));
        }
    }

    let log = soak.log.lock().unwrap();
    let mut refused_though_ordered = 0;
    for (key, record) in &log.keys {
        let (wanted, bad) = match &record.action {
            Action::Buy { product, quantity } => match quantity.parse::<i32>() {
                Ok(q) if !record.action.is_bad_input() => (vec![(*product, q)], false),
                _ => (Vec::new(), true),
            },
            Action::Checkout { lines, .. } => {
                let mut lines = lines.to_vec();
                lines.sort();
                (lines, false)
            }
            _ => continue,
        };
        let customer = customer_ids[record.person];
        let history = || {
            record
                .answers
                .iter()
                .map(Answer::label)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let answered: BTreeSet<i64> = record.answers.iter().filter_map(Answer::order).collect();
        let in_db = named.get(&(customer, key.clone())).copied().flatten();
        if bad {
            if in_db.is_some() || !answered.is_empty() {
                problems.push(format!(
                    "{key}: a bad quantity bought order {in_db:?}: {}",
                    history()
                ));
            }
            continue;
        }
        if answered.len() > 1 {
            problems.push(format!(
                "{key} was answered with different orders {answered:?}: {}",
                history()
            ));
        }
        match (answered.iter().next(), in_db) {
            (Some(told), Some(stored)) if *told == stored => {}
            (None, None) => {}
            (told, stored) => problems.push(format!(
                "{key} ({}, customer {customer}): answered order {told:?} but the key names {stored:?}: {}",
                record.action.kind(),
                history()
            )),
        }
        let Some(order) = in_db else {
            continue;
        };
        match orders.get(&order) {
            Some((owner, lines)) if *owner == customer && *lines == wanted => {}
            found => problems.push(format!(
                "{key}: order {order} holds {found:?}, the intent was customer {customer} buying {wanted:?}"
            )),
        }
        let refused = record.answers.iter().any(|a| {
            matches!(a, Answer::Got { status: 409, title, .. } if title != "Already in progress")
        });
        if refused {
            refused_though_ordered += 1;
            eprintln!(
                "note: {key} has order {order} but was also refused: {}",
                history()
            );
        }
    }
    eprintln!(
        "keys with an order that were also answered with a refusal: {refused_though_ordered}"
    );
}

/// The ledger: never oversold, every unit counted once, and no customer
/// over a limit in live orders.
fn check_ledger(
    db: &TestDb,
    limits: &HashMap<i64, (i32, Option<i32>)>,
    problems: &mut Vec<String>,
) {
    let audit = flashsale::services::ledger_audit::run_audit(&mut db.conn()).unwrap();
    problems.extend(audit.problems.iter().map(|p| format!("audit: {p}")));
    // The servers' jobs still run (an unpaid order may expire now): the
    // checks below compare reads with each other, so they share one snapshot.
    db.in_one_snapshot(|conn| ledger_in_snapshot(conn, limits, problems));
}

fn ledger_in_snapshot(
    conn: &mut diesel::PgConnection,
    limits: &HashMap<i64, (i32, Option<i32>)>,
    problems: &mut Vec<String>,
) {
    // The test's database goes with it: say which orders a torn ledger is about.
    #[derive(diesel::QueryableByName)]
    struct Torn {
        #[diesel(sql_type = diesel::sql_types::Text)]
        line: String,
    }
    let torn: Vec<Torn> = diesel::sql_query(
        "SELECT format('order %s is %s but has a %s restore row (%s units at %s); its payments: %s', \
           o.id, o.status, h.reason, h.delta, h.created_at, \
           (SELECT string_agg(format('%s %s created %s settled %s', p.attempt_key, p.outcome, \
              p.created_at, p.settled_at), '; ' ORDER BY p.id) FROM payments p WHERE p.order_id = o.id)) AS line \
         FROM stock_history h JOIN orders o ON o.id = h.order_id \
         WHERE h.reason IN ('payment_failed', 'expired', 'refund') \
           AND o.status <> CASE h.reason WHEN 'refund' THEN 'refunded' ELSE h.reason END",
    )
    .load(conn)
    .unwrap();
    problems.extend(torn.into_iter().map(|t| t.line));
    let checks = [
        (
            "orders without items",
            "SELECT count(*) AS n FROM orders o WHERE NOT EXISTS \
             (SELECT 1 FROM order_items i WHERE i.order_id = o.id)",
        ),
        (
            "order items without exactly one purchase row",
            "SELECT count(*) AS n FROM order_items i WHERE (SELECT count(*) FROM stock_history h \
             WHERE h.order_id = i.order_id AND h.product_id = i.product_id AND h.reason = 'purchase') <> 1",
        ),
        (
            "order items restored more than once",
            "SELECT count(*) AS n FROM order_items i WHERE (SELECT count(*) FROM stock_history h \
             WHERE h.order_id = i.order_id AND h.product_id = i.product_id \
             AND h.reason IN ('payment_failed', 'expired', 'refund')) > 1",
        ),
        (
            "items of restored orders without their restore row",
            "SELECT count(*) AS n FROM order_items i JOIN orders o ON o.id = i.order_id \
             WHERE o.status IN ('payment_failed', 'expired', 'refunded') AND NOT EXISTS \
             (SELECT 1 FROM stock_history h WHERE h.order_id = i.order_id \
              AND h.product_id = i.product_id AND h.reason IN ('payment_failed', 'expired', 'refund'))",
        ),
        ("products with negative stock", "SELECT count(*) AS n FROM products WHERE stock < 0"),
    ];
    for (what, sql) in checks {
        let n = count_in(conn, sql);
        if n != 0 {
            problems.push(format!("{n} {what}"));
        }
    }
    for (&product, &(initial, limit)) in limits {
        let stock = count_in(
            conn,
            &format!("SELECT stock::int8 AS n FROM products WHERE id = {product}"),
        );
        let live = count_in(
            conn,
            &format!(
                "SELECT COALESCE(sum(i.quantity), 0)::int8 AS n FROM order_items i JOIN orders o \
             ON o.id = i.order_id WHERE i.product_id = {product} \
             AND o.status IN ('awaiting_payment', 'paid')"
            ),
        );
        let sold = count_in(
            conn,
            &format!(
            "SELECT COALESCE(sum(quantity), 0)::int8 AS n FROM order_items WHERE product_id = {product}"
        ));
        let restored = count_in(
            conn,
            &format!(
            "SELECT COALESCE(sum(delta), 0)::int8 AS n FROM stock_history WHERE product_id = {product} \
             AND reason IN ('payment_failed', 'expired', 'refund')"
        ));
        if stock + live != i64::from(initial) || stock != i64::from(initial) - sold + restored {
            problems.push(format!(
                "product {product}: stock {stock} + live {live} vs initial {initial}; \
                 {sold} units ordered, {restored} restored"
            ));
        }
        let Some(limit) = limit else {
            continue;
        };
        for (customer, units) in live_units_by_customer(conn, product) {
            if units > i64::from(limit) {
                problems.push(format!(
                    "customer {customer} holds {units} of product {product} (limit {limit})"
                ));
            }
        }
    }
}

/// Every charge has its payment: at most one approved payment per order,
/// every approved sandbox charge recorded as an approved payment of an order
/// that is paid or refunded, and no payment approved without a charge.
fn check_payments(db: &TestDb, problems: &mut Vec<String>) {
    let checks = [
        (
            "orders with more than one approved payment",
            "SELECT count(*) AS n FROM (SELECT order_id FROM payments WHERE outcome = 'approved' \
             GROUP BY order_id HAVING count(*) > 1) twice",
        ),
        (
            "approved sandbox charges without a payment row",
            "SELECT count(*) AS n FROM sandbox_charges c WHERE c.approved AND NOT EXISTS \
             (SELECT 1 FROM payments p WHERE p.attempt_key = c.attempt_key)",
        ),
        (
            "approved sandbox charges whose payment is not approved",
            "SELECT count(*) AS n FROM sandbox_charges c JOIN payments p ON p.attempt_key = c.attempt_key \
             WHERE c.approved AND p.outcome <> 'approved'",
        ),
        (
            "approved payments without an approved charge",
            "SELECT count(*) AS n FROM payments p WHERE p.outcome = 'approved' AND NOT EXISTS \
             (SELECT 1 FROM sandbox_charges c WHERE c.attempt_key = p.attempt_key AND c.approved)",
        ),
        (
            "approved payments of orders neither paid nor refunded (charged, not sold)",
            "SELECT count(*) AS n FROM payments p JOIN orders o ON o.id = p.order_id \
             WHERE p.outcome = 'approved' AND o.status NOT IN ('paid', 'refunded')",
        ),
        (
            "paid or refunded orders without exactly one approved payment",
            "SELECT count(*) AS n FROM orders o WHERE o.status IN ('paid', 'refunded') AND \
             (SELECT count(*) FROM payments p WHERE p.order_id = o.id AND p.outcome = 'approved') <> 1",
        ),
        (
            "payments still pending",
            "SELECT count(*) AS n FROM payments WHERE outcome = 'pending'",
        ),
    ];
    for (what, sql) in checks {
        let n = db.count(sql);
        if n != 0 {
            problems.push(format!("{n} {what}"));
        }
    }
}
