//! Test harness: a fresh database per test (cloned from a migrated template),
//! a Redis key prefix per test, the real HTTP server on a free port, and
//! browser-like clients that carry cookies and CSRF tokens.
#![allow(dead_code)]

pub mod hostile;
pub mod postgres;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::BigInt;
use diesel::PgConnection;
use flashsale::config::Settings;
use flashsale::db::split_database_url;
use flashsale::services::ledger_audit::{run_audit, AuditReport};
use flashsale::services::Shop;
use flashsale::startup::Application;
use reqwest::redirect::Policy;
use reqwest::StatusCode;

pub const PASSWORD: &str = "correct horse battery";
pub const GOOD_CARD: &str = "4242 4242 4242 4242";
pub const DECLINED_CARD: &str = "4000 0000 0000 0002";

fn server_url() -> String {
    let base =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| Settings::DEFAULT_DATABASE_URL.into());
    split_database_url(&base)
        .expect("DATABASE_URL names a database")
        .0
}

fn admin_connection(server: &str) -> PgConnection {
    PgConnection::establish(&format!("{server}/postgres"))
        .expect("Postgres is reachable (run scripts/test, which starts it)")
}

/// The template is keyed by the migrations' content, so a changed migration
/// gets a new template instead of a stale one.
fn template_name() -> String {
    let mut hasher = DefaultHasher::new();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut entries: Vec<_> = walk(&dir);
    entries.sort();
    for path in entries {
        path.to_string_lossy().hash(&mut hasher);
        std::fs::read(&path).unwrap().hash(&mut hasher);
    }
    format!("flashsale_tpl_{:016x}", hasher.finish())
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// A database of this test's own, dropped when the test ends (pass or fail).
pub struct TestDb {
    pub url: String,
    name: String,
    server: String,
}

impl TestDb {
    pub fn new() -> TestDb {
        let server = server_url();
        let template = template_name();
        let name = format!("flashsale_test_{}", uuid::Uuid::new_v4().simple());
        let mut admin = admin_connection(&server);
        // Serialise template creation and cloning across parallel test processes:
        // CREATE DATABASE ... TEMPLATE fails while anyone is connected to the template.
        diesel::sql_query("SELECT pg_advisory_lock(727274)")
            .execute(&mut admin)
            .unwrap();
        let exists: Count = diesel::sql_query(format!(
            "SELECT count(*) AS n FROM pg_database WHERE datname = '{template}'"
        ))
        .get_result(&mut admin)
        .unwrap();
        if exists.n == 0 {
            let building = format!("{template}_building");
            diesel::sql_query(format!(
                "DROP DATABASE IF EXISTS \"{building}\" WITH (FORCE)"
            ))
            .execute(&mut admin)
            .unwrap();
            diesel::sql_query(format!("CREATE DATABASE \"{building}\""))
                .execute(&mut admin)
                .unwrap();
            flashsale::db::run_migrations(&format!("{server}/{building}")).unwrap();
            diesel::sql_query(format!(
                "ALTER DATABASE \"{building}\" RENAME TO \"{template}\""
            ))
            .execute(&mut admin)
            .unwrap();
        }
        let cloned = diesel::sql_query(format!(
            "CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""
        ))
        .execute(&mut admin);
        diesel::sql_query("SELECT pg_advisory_unlock(727274)")
            .execute(&mut admin)
            .unwrap();
        cloned.unwrap();
        let db = TestDb {
            url: format!("{server}/{name}"),
            name,
            server,
        };
        // Clones share the template's Redis namespace; each test database is
        // its own deployment, as a freshly migrated one would be.
        diesel::sql_query(
            "UPDATE deployment SET redis_namespace = substr(replace(gen_random_uuid()::text, '-', ''), 1, 16)",
        )
        .execute(&mut db.conn())
        .unwrap();
        db
    }

    /// Drops the database and migrates a new, empty one under the same name:
    /// what an operator's reset does. It gets a new Redis namespace.
    pub fn reset(&self) {
        self.vanish();
        let mut admin = admin_connection(&self.server);
        diesel::sql_query(format!("CREATE DATABASE \"{}\"", self.name))
            .execute(&mut admin)
            .unwrap();
        flashsale::db::run_migrations(&self.url).unwrap();
    }

    pub fn redis_namespace(&self) -> String {
        #[derive(diesel::QueryableByName)]
        struct Namespace {
            #[diesel(sql_type = diesel::sql_types::Text)]
            redis_namespace: String,
        }
        diesel::sql_query("SELECT redis_namespace FROM deployment")
            .get_result::<Namespace>(&mut self.conn())
            .unwrap()
            .redis_namespace
    }

    /// A second handle on this database for another in-process instance;
    /// only the original drops the database.
    pub fn attach(url: &str) -> TestDb {
        TestDb {
            url: url.into(),
            name: String::new(),
            server: String::new(),
        }
    }

    /// The database disappears under whoever is using it (its connections are
    /// cut and new ones are refused): an outage, without touching the shared server.
    pub fn vanish(&self) {
        let mut admin = admin_connection(&self.server);
        diesel::sql_query(format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        ))
        .execute(&mut admin)
        .unwrap();
    }

    pub fn conn(&self) -> PgConnection {
        PgConnection::establish(&self.url).unwrap()
    }

    pub fn count(&self, sql: &str) -> i64 {
        diesel::sql_query(sql)
            .get_result::<Count>(&mut self.conn())
            .unwrap()
            .n
    }

    pub fn stock(&self, product: i64) -> i64 {
        self.count(&format!(
            "SELECT stock::int8 AS n FROM products WHERE id = {product}"
        ))
    }

    /// Rows written anywhere in the ledger tables: "nothing written" means this does not move.
    pub fn ledger_rows(&self) -> i64 {
        self.count(
            "SELECT (SELECT count(*) FROM orders) + (SELECT count(*) FROM order_items) \
             + (SELECT count(*) FROM stock_history) + (SELECT count(*) FROM payments) AS n",
        )
    }

    pub fn audit(&self) -> AuditReport {
        run_audit(&mut self.conn()).unwrap()
    }

    pub fn assert_audit_clean(&self) {
        let report = self.audit();
        assert!(
            report.is_clean(),
            "audit found problems: {:#?}",
            report.problems
        );
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.name.is_empty() {
            return;
        }
        if let Ok(mut admin) = PgConnection::establish(&format!("{}/postgres", self.server)) {
            let _ = diesel::sql_query(format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ))
            .execute(&mut admin);
        }
    }
}

pub fn unique_prefix() -> String {
    format!("test:{}:", uuid::Uuid::new_v4().simple())
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The shop running in this test process on a port the OS picked.
pub struct TestApp {
    pub address: String,
    pub shop: Shop,
    pub settings: Settings,
    server: actix_web::dev::ServerHandle,
    // Declared last: dropped after the server stops using it.
    pub db: TestDb,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(customize: impl FnOnce(&mut Settings)) -> TestApp {
    let db = TestDb::new();
    spawn_app_on(db, customize).await
}

pub async fn spawn_app_on(db: TestDb, customize: impl FnOnce(&mut Settings)) -> TestApp {
    let mut settings = Settings::for_tests(&db.url, &unique_prefix());
    customize(&mut settings);
    let app = Application::build(settings.clone())
        .await
        .expect("the app builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    let shop = app.shop().clone();
    let server = app.handle();
    tokio::spawn(app.run_until_stopped());
    TestApp {
        address,
        shop,
        settings,
        server,
        db,
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let server = self.server.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { server.stop(false).await });
        }
    }
}

/// Extracts the CSRF token from a page's form.
pub fn csrf_from(html: &str) -> String {
    let re = regex::Regex::new(r#"name="csrf_token" value="([^"]+)""#).unwrap();
    re.captures(html)
        .unwrap_or_else(|| panic!("no csrf_token in page:\n{html}"))
        .get(1)
        .unwrap()
        .as_str()
        .to_string()
}

/// A browser: its own cookie jar, no automatic redirects (tests check the 303s).
#[derive(Clone)]
pub struct Browser {
    pub client: reqwest::Client,
    pub base: String,
    pub email: String,
}

impl Browser {
    pub fn new(base: &str) -> Browser {
        Browser {
            client: reqwest::Client::builder()
                .cookie_store(true)
                .redirect(Policy::none())
                .pool_max_idle_per_host(4)
                // Shorter than the server's 5 s keep-alive, so a pooled connection is
                // never reused at the instant the server closes it.
                .pool_idle_timeout(Duration::from_secs(2))
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            base: base.to_string(),
            email: String::new(),
        }
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{}", self.base, path))
            .send()
            .await
            .unwrap()
    }

    pub async fn get_text(&self, path: &str) -> (StatusCode, String) {
        let response = self.get(path).await;
        let status = response.status();
        (status, response.text().await.unwrap())
    }

    /// A CSRF token as a page of the shop would hand it out to this session.
    pub async fn csrf(&self) -> String {
        let (status, html) = self.get_text("/login").await;
        assert_eq!(status, StatusCode::OK);
        csrf_from(&html)
    }

    pub async fn post(&self, path: &str, fields: &[(&str, &str)]) -> reqwest::Response {
        self.client
            .post(format!("{}{}", self.base, path))
            .form(fields)
            .send()
            .await
            .unwrap()
    }

    /// Posts a form with this session's CSRF token added.
    pub async fn post_form(&self, path: &str, fields: &[(&str, &str)]) -> reqwest::Response {
        let token = self.csrf().await;
        let mut fields = fields.to_vec();
        fields.push(("csrf_token", &token));
        self.post(path, &fields).await
    }

    pub fn sign_up(
        base: &str,
        email: &str,
    ) -> impl std::future::Future<Output = Browser> + 'static {
        let mut browser = Browser::new(base);
        browser.email = email.to_string();
        async move {
            let email = browser.email.clone();
            let response = browser
                .post_form("/signup", &[("email", &email), ("password", PASSWORD)])
                .await;
            let status = response.status();
            let page = response.text().await.unwrap();
            let heading = page
                .split("<h1>")
                .nth(1)
                .and_then(|h| h.split("</h1>").next());
            assert_eq!(
                status,
                StatusCode::SEE_OTHER,
                "sign-up of {email} failed: {heading:?}"
            );
            browser
        }
    }

    pub async fn sign_in(base: &str, email: &str, password: &str) -> Browser {
        let mut browser = Browser::new(base);
        browser.email = email.to_string();
        let response = browser
            .post_form("/login", &[("email", email), ("password", password)])
            .await;
        assert_eq!(
            response.status(),
            StatusCode::SEE_OTHER,
            "sign-in of {email} failed"
        );
        browser
    }

    pub async fn buy_with_token(
        &self,
        product: i64,
        quantity: &str,
        token: &str,
    ) -> reqwest::Response {
        self.post(
            &format!("/products/{product}/buy"),
            &[("quantity", quantity), ("csrf_token", token)],
        )
        .await
    }

    pub async fn buy(&self, product: i64, quantity: u32) -> reqwest::Response {
        let token = self.csrf().await;
        self.buy_with_token(product, &quantity.to_string(), &token)
            .await
    }

    pub async fn pay(&self, order: i64, card: &str) -> reqwest::Response {
        self.post_form(&format!("/orders/{order}/pay"), &[("card_number", card)])
            .await
    }
}

/// The order id a successful buy redirected to.
pub fn order_id_from(response: &reqwest::Response) -> i64 {
    let location = response
        .headers()
        .get("location")
        .expect("a redirect")
        .to_str()
        .unwrap();
    location
        .trim_start_matches("/orders/")
        .parse()
        .unwrap_or_else(|_| panic!("unexpected location {location}"))
}

impl TestApp {
    /// A second, independent lock client on the same Redis and prefix: what
    /// another instance of the shop would be, waiting at most `wait` for a
    /// lock and holding it for `lease`.
    pub fn other_instance(&self, wait: Duration, lease: Duration) -> flashsale::lock::ProductLocks {
        flashsale::lock::ProductLocks::new(
            &self.settings.redis_urls,
            false,
            &self.shop.redis_prefix,
            wait,
            lease,
            true,
        )
        .unwrap()
    }

    pub fn browser(&self) -> Browser {
        Browser::new(&self.address)
    }

    pub async fn customer(&self, email: &str) -> Browser {
        Browser::sign_up(&self.address, email).await
    }

    /// Signs up `n` customers concurrently.
    pub async fn customers(&self, n: usize, tag: &str) -> Vec<Browser> {
        sign_up_customers(&self.address, n, tag).await
    }

    pub async fn admin(&self) -> Browser {
        let email = "admin@example.com";
        flashsale::services::accounts::ensure_admin(
            &self.shop.pool,
            flashsale::domain::Email::parse(email).unwrap(),
            flashsale::domain::Password::parse(PASSWORD).unwrap(),
        )
        .await
        .unwrap();
        Browser::sign_in(&self.address, email, PASSWORD).await
    }

    /// Creates an open sale with `stock` units and returns its id.
    pub async fn product(&self, stock: i32, limit: Option<i32>) -> i64 {
        create_product(&self.shop.pool, stock, limit).await
    }

    /// A sale that opens in an hour.
    pub async fn upcoming_product(&self, stock: i32) -> i64 {
        flashsale::services::catalog::create_product(
            &self.shop.pool,
            flashsale::services::catalog::SaleSpec {
                name: "Tomorrow".into(),
                description: String::new(),
                price: flashsale::domain::Money::from_cents(500).unwrap(),
                stock,
                per_customer_limit: None,
                starts_at: chrono::Utc::now() + chrono::Duration::hours(1),
                ends_at: None,
            },
        )
        .await
        .unwrap()
        .id
    }
}

/// Signs up `n` customers of the shop at `base`, `{tag}{i}@example.com`.
/// The value of one sample line of the Prometheus text format, e.g.
/// `flashsale_purchases_total{outcome="purchased"}`.
pub fn metric_sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

pub async fn sign_up_customers(base: &str, n: usize, tag: &str) -> Vec<Browser> {
    use futures::StreamExt;
    // A few at a time: sign-up hashes a password, which is slow on purpose.
    let signups = (0..n).map(|i| Browser::sign_up(base, &format!("{tag}{i}@example.com")));
    futures::stream::iter(signups).buffered(8).collect().await
}

pub async fn create_product(pool: &flashsale::db::PgPool, stock: i32, limit: Option<i32>) -> i64 {
    use flashsale::services::catalog::{create_product, SaleSpec};
    create_product(
        pool,
        SaleSpec {
            name: format!("Test item ({stock} units)"),
            description: "for tests".into(),
            price: flashsale::domain::Money::from_cents(1_000).unwrap(),
            stock,
            per_customer_limit: limit,
            starts_at: chrono::Utc::now() - chrono::Duration::minutes(1),
            ends_at: None,
        },
    )
    .await
    .unwrap()
    .id
}

/// A process this test started; killed by PID when the guard drops, pass or fail.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Children die with the test process even if it is killed before guards run.
pub fn die_with_parent(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    }
}

/// A Redis server of this test's own, on a free port, keeping nothing on disk.
pub fn start_redis() -> (ChildGuard, u16) {
    let port = free_port();
    (start_redis_on(port), port)
}

/// A Redis server on `port`: a fresh one, or one started again after it was killed.
pub fn start_redis_on(port: u16) -> ChildGuard {
    spawn_redis_server(port, &[])
}

/// Starts `redis-server` on `port` with `extra` arguments and waits until it listens.
fn spawn_redis_server(port: u16, extra: &[std::ffi::OsString]) -> ChildGuard {
    let child = die_with_parent(&mut Command::new("redis-server"))
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is installed (scripts/test installs it)");
    let guard = ChildGuard(child);
    wait_for_port(port);
    guard
}

/// A three-master Redis Cluster of this test's own, on free ports, made with
/// `redis-cli --cluster create`; its servers are stopped when it drops.
pub struct RedisCluster {
    pub urls: Vec<String>,
    _servers: Vec<ChildGuard>,
    dir: std::path::PathBuf,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let dir = std::env::temp_dir().join(format!(
            "flashsale-cluster-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut servers = Vec::new();
        let mut ports = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let extra: Vec<std::ffi::OsString> = vec![
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-node-timeout".into(),
                "2000".into(),
                "--cluster-config-file".into(),
                dir.join(format!("nodes-{port}.conf")).into(),
                "--dir".into(),
                dir.clone().into(),
            ];
            servers.push(spawn_redis_server(port, &extra));
            ports.push(port);
        }
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli is installed");
        assert!(
            created.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        // Wait until every node agrees the cluster is up.
        for port in &ports {
            let mut ok = false;
            for _ in 0..200 {
                let info = Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "cluster", "info"])
                    .output()
                    .unwrap();
                if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    ok = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(
                ok,
                "Redis Cluster node {port} did not reach cluster_state:ok"
            );
        }
        RedisCluster {
            urls: ports
                .iter()
                .map(|p| format!("redis://127.0.0.1:{p}"))
                .collect(),
            _servers: servers,
            dir,
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_for_port(port: u16) {
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on port {port}");
}

/// The release binary when `scripts/test` has built it (as production runs),
/// else the debug one this test was built with.
pub fn server_binary() -> std::path::PathBuf {
    let debug = std::path::PathBuf::from(env!("CARGO_BIN_EXE_flashsale"));
    let release = debug
        .parent()
        .and_then(|d| d.parent())
        .map(|t| t.join("release").join("flashsale"));
    match release {
        Some(path) if path.exists() => path,
        _ => {
            eprintln!("release binary not built; using {}", debug.display());
            debug
        }
    }
}

/// The real `flashsale serve` binary as a separate process on a free port.
pub struct ServerProcess {
    pub guard: ChildGuard,
    pub address: String,
}

pub fn start_server_process(
    db_url: &str,
    redis_prefix: &str,
    session_key_hex: &str,
    extra_env: &[(&str, &str)],
) -> ServerProcess {
    let binary = std::path::PathBuf::from(env!("CARGO_BIN_EXE_flashsale"));
    start_server_process_from(&binary, db_url, redis_prefix, session_key_hex, extra_env)
}

pub fn start_server_process_from(
    binary: &std::path::Path,
    db_url: &str,
    redis_prefix: &str,
    session_key_hex: &str,
    extra_env: &[(&str, &str)],
) -> ServerProcess {
    use std::io::{BufRead, BufReader};
    let mut command = Command::new(binary);
    die_with_parent(&mut command)
        .arg("serve")
        .env("DATABASE_URL", db_url)
        .env("REDIS_KEY_PREFIX", redis_prefix)
        .env("SESSION_KEY", session_key_hex)
        .env("BIND", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (key, value) in extra_env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("the flashsale binary starts");
    let stdout = child.stdout.take().unwrap();
    let guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let address = line
        .trim()
        .strip_prefix("flashsale listening on ")
        .unwrap_or_else(|| panic!("unexpected first line from flashsale serve: {line:?}"))
        .to_string();
    ServerProcess { guard, address }
}

/// A buy's status, insisting that every 303 is an order (not a sign-in redirect).
pub fn checked_status(response: reqwest::Response) -> StatusCode {
    if response.status() == StatusCode::SEE_OTHER {
        order_id_from(&response);
    }
    response.status()
}

/// A burst: each buyer takes its form token, all wait at one barrier, then
/// buyer w sends requests w, w+n, w+2n, ... of `requests`, one unit each.
pub async fn burst(buyers: Vec<Browser>, product: i64, requests: usize) -> Vec<StatusCode> {
    let workers = buyers.len();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(workers));
    let tasks = buyers.into_iter().enumerate().map(|(worker, buyer)| {
        let barrier = barrier.clone();
        tokio::spawn(async move {
            let token = buyer.csrf().await;
            barrier.wait().await;
            let mut statuses = Vec::new();
            for _ in (worker..requests).step_by(workers) {
                statuses.push(checked_status(
                    buyer.buy_with_token(product, "1", &token).await,
                ));
            }
            statuses
        })
    });
    futures::future::join_all(tasks)
        .await
        .into_iter()
        .flat_map(|r| r.unwrap())
        .collect()
}

/// Counts answers by status code.
pub fn tally(statuses: &[StatusCode]) -> std::collections::BTreeMap<u16, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for status in statuses {
        *counts.entry(status.as_u16()).or_insert(0) += 1;
    }
    counts
}

/// Asserts a response's status and that its body says `text`; returns the body.
pub async fn expect_page(response: reqwest::Response, status: StatusCode, text: &str) -> String {
    let got = response.status();
    let body = response.text().await.unwrap();
    assert_eq!(got, status, "expected {status} with {text:?}, body: {body}");
    assert!(body.contains(text), "expected {text:?} in: {body}");
    body
}

/// Asserts a 303 to `location`.
pub fn expect_redirect(response: &reqwest::Response, location: &str) {
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()["location"], location);
}
