//! The test's own database and the questions tests ask of it.

use diesel::prelude::*;
use diesel::PgConnection;
use flashsale::config::Settings;
use flashsale::qa::harness::{Count, ScratchDb};
use flashsale::services::ledger_audit::run_audit;

use super::OwnRedisKeys;

/// A database of this test's own, cloned from a migrated template and
/// dropped when the test ends (pass or fail), with the keys it had on the
/// machine's Redis.
pub struct TestDb {
    pub url: String,
    /// `None` on a second handle for another in-process instance: only the
    /// original drops the database.
    scratch: Option<ScratchDb>,
    /// The keys on the machine's Redis of every namespace this database has
    /// had (a reset gives it a new one): every key a shop on it writes,
    /// whatever its `REDIS_KEY_PREFIX`, carries one. None on a handle that
    /// leaves them to the original.
    redis_keys: Option<OwnRedisKeys>,
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
        TestDb::owning_redis_keys(TestDb {
            url: scratch.url.clone(),
            scratch: Some(scratch),
            redis_keys: None,
        })
    }

    /// A database on a Postgres server the test runs itself, which goes
    /// with its server; its keys on the machine's Redis go with this handle.
    pub fn on_private_server(url: &str) -> TestDb {
        TestDb::owning_redis_keys(TestDb::attach(url))
    }

    fn owning_redis_keys(mut db: TestDb) -> TestDb {
        let keys = OwnRedisKeys::default();
        keys.of_namespace(&db.redis_namespace());
        db.redis_keys = Some(keys);
        db
    }

    /// Another handle on the database at `url`; dropping it drops nothing.
    pub fn attach(url: &str) -> TestDb {
        TestDb {
            url: url.into(),
            scratch: None,
            redis_keys: None,
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
        if let Some(keys) = &self.redis_keys {
            keys.of_namespace(&self.redis_namespace());
        }
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
