//! The test's own database and the questions tests ask of it.

use diesel::prelude::*;
use diesel::PgConnection;
use flashsale::config::Settings;
use flashsale::qa::harness::{Count, ScratchDb};
use flashsale::services::ledger_audit::run_audit;

/// A database of this test's own, cloned from a migrated template and
/// dropped when the test ends (pass or fail), with the keys it had on the
/// machine's Redis.
pub struct TestDb {
    pub url: String,
    /// `None` on a second handle for another in-process instance: only the
    /// original drops the database.
    scratch: Option<ScratchDb>,
    /// Every Redis namespace this database has had (a reset gives it a new
    /// one). Every key a shop on it writes, whatever its `REDIS_KEY_PREFIX`,
    /// carries one, so they are the keys to remove when the test ends.
    namespaces: std::sync::Mutex<Vec<String>>,
}

/// The `n` that `sql` selects, on `conn` (inside its transaction, if any).
pub fn count_in(conn: &mut PgConnection, sql: &str) -> i64 {
    diesel::sql_query(sql).get_result::<Count>(conn).unwrap().n
}

impl TestDb {
    pub fn new() -> TestDb {
        let base =
            std::env::var("DATABASE_URL").unwrap_or_else(|_| Settings::DEFAULT_DATABASE_URL.into());
        let scratch = ScratchDb::cloned(&base, "test")
            .expect("a test database (run scripts/test, which starts Postgres)");
        let db = TestDb {
            url: scratch.url.clone(),
            scratch: Some(scratch),
            namespaces: Default::default(),
        };
        db.namespaces.lock().unwrap().push(db.redis_namespace());
        db
    }

    /// Another handle on the database at `url`; dropping it drops nothing.
    pub fn attach(url: &str) -> TestDb {
        TestDb {
            url: url.into(),
            scratch: None,
            namespaces: Default::default(),
        }
    }

    fn scratch(&self) -> &ScratchDb {
        self.scratch
            .as_ref()
            .expect("only the handle that made the database can drop it")
    }

    /// Drops the database and migrates a new, empty one under the same name:
    /// what an operator's reset does. It gets a new Redis namespace.
    pub fn reset(&self) {
        self.scratch().recreate().unwrap();
        self.namespaces.lock().unwrap().push(self.redis_namespace());
    }

    /// The database disappears under whoever is using it (its connections are
    /// cut and new ones are refused): an outage, without touching the shared server.
    pub fn vanish(&self) {
        self.scratch().drop_database().unwrap();
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

    pub fn conn(&self) -> PgConnection {
        PgConnection::establish(&self.url).unwrap()
    }

    /// The `n` that `sql` selects.
    pub fn count(&self, sql: &str) -> i64 {
        count_in(&mut self.conn(), sql)
    }

    /// Runs `read` in one read-only snapshot: reads compared with each other
    /// while the shop's jobs still write (an order expiring between two
    /// of them) must all see the same moment.
    pub fn in_one_snapshot<T>(&self, read: impl FnOnce(&mut PgConnection) -> T) -> T {
        self.conn()
            .build_transaction()
            .repeatable_read()
            .read_only()
            .run(|conn| Ok::<_, diesel::result::Error>(read(conn)))
            .unwrap()
    }

    /// Confirms the address of the account `email` as its confirmation
    /// link would: for tests about what only confirmed accounts may do.
    pub fn confirm(&self, email: &str) {
        use diesel::sql_types::Text;
        let confirmed = diesel::sql_query(
            "UPDATE customers SET email_confirmed_at = now(), email_canonical = $2 WHERE email = $1",
        )
        .bind::<Text, _>(email.trim().to_lowercase())
        .bind::<Text, _>(flashsale::domain::canonical_address(email))
        .execute(&mut self.conn())
        .unwrap_or_else(|e| panic!("confirming {email}: {e}"));
        assert_eq!(confirmed, 1, "no account has the address {email}");
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

    pub fn assert_audit_clean(&self) {
        let report = run_audit(&mut self.conn()).unwrap();
        assert!(
            report.is_clean(),
            "audit found problems: {:#?}",
            report.problems
        );
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.scratch.is_some() {
            let namespaces = self.namespaces.lock().unwrap_or_else(|p| p.into_inner());
            remove_redis_keys(&namespaces);
        }
    }
}

/// Removes from the machine's Redis every key in one of `namespaces` (16
/// random hex digits each, so the pattern matches nobody else's keys).
/// Best effort: a test whose shop used a Redis of its own has nothing here,
/// and a Redis that is down keeps nothing to remove.
fn remove_redis_keys(namespaces: &[String]) {
    let urls = std::env::var("REDIS_URL").unwrap_or_else(|_| Settings::DEFAULT_REDIS_URL.into());
    // Every Redlock node holds lock keys of its own.
    for url in urls.split(',').map(str::trim).filter(|url| !url.is_empty()) {
        remove_keys_from(url, namespaces);
    }
}

fn remove_keys_from(url: &str, namespaces: &[String]) {
    use redis::Commands;
    let connected = redis::Client::open(url)
        .and_then(|client| client.get_connection_with_timeout(std::time::Duration::from_secs(1)));
    let Ok(mut conn) = connected else {
        return;
    };
    let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    for namespace in namespaces {
        let pattern = format!("*{namespace}:*");
        let keys: Vec<String> = match conn.scan_match(&pattern) {
            Ok(keys) => keys.filter_map(Result::ok).collect(),
            Err(_) => return,
        };
        for chunk in keys.chunks(500) {
            let _: redis::RedisResult<i64> = redis::cmd("UNLINK").arg(chunk).query(&mut conn);
        }
    }
}
