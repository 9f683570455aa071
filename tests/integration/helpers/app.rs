//! The shop running in the test's process, on its own database and Redis
//! key prefix, with the people who use it.

use std::time::Duration;

use flashsale::config::Settings;
use flashsale::db::PgPool;
use flashsale::domain::{Email, Money, Password};
use flashsale::qa::harness::ServedShop;
use flashsale::services::catalog::{self, SaleSpec};
use flashsale::services::Shop;
use futures::StreamExt;

use super::{Browser, TestDb, PASSWORD};

pub fn unique_prefix() -> String {
    format!("test:{}:", uuid::Uuid::new_v4().simple())
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
    let served = ServedShop::start(settings.clone())
        .await
        .expect("the app builds");
    TestApp {
        address: served.address,
        shop: served.shop,
        settings,
        server: served.server,
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

    /// Signs up `email` and confirms the address, as the customer would by
    /// opening the link mailed to them (`mail` tests open the real link).
    pub async fn customer(&self, email: &str) -> Browser {
        let browser = Browser::sign_up(&self.address, email).await;
        self.confirm(email);
        browser
    }

    /// Signs up `email` and leaves the address unconfirmed, as it is until
    /// its link is opened.
    pub async fn unconfirmed_customer(&self, email: &str) -> Browser {
        Browser::sign_up(&self.address, email).await
    }

    /// Signs up `n` customers concurrently, their addresses confirmed.
    pub async fn customers(&self, n: usize, tag: &str) -> Vec<Browser> {
        let browsers = sign_up_customers(&self.address, n, tag).await;
        for browser in &browsers {
            self.confirm(&browser.email);
        }
        browsers
    }

    pub async fn admin(&self) -> Browser {
        let email = "admin@example.com";
        flashsale::services::accounts::ensure_admin(
            &self.shop.pool,
            Email::parse(email).unwrap(),
            Password::parse(PASSWORD).unwrap(),
        )
        .await
        .unwrap();
        Browser::sign_in(&self.address, email, PASSWORD).await
    }

    /// Confirms the address of the account `email` straight in this test's
    /// database, as its confirmation link would: for tests about what
    /// only confirmed accounts may do.
    pub fn confirm(&self, email: &str) {
        self.db.confirm(email);
    }

    /// Creates an open sale with `stock` units and returns its id.
    pub async fn product(&self, stock: i32, limit: Option<i32>) -> i64 {
        create_product(&self.shop.pool, stock, limit).await
    }

    /// A sale that opens in an hour.
    pub async fn upcoming_product(&self, stock: i32) -> i64 {
        catalog::create_product(
            &self.shop.pool,
            SaleSpec {
                name: "Tomorrow".into(),
                description: String::new(),
                price: Money::from_cents(500).unwrap(),
                stock,
                per_customer_limit: None,
                starts_at: chrono::Utc::now() + chrono::Duration::hours(1),
                ends_at: None,
                queue_mode: false,
                queue_opens_at: None,
                join_check_work: 1,
            },
        )
        .await
        .unwrap()
        .id
    }
}

/// Signs up `n` customers of the shop at `base`, `{tag}{i}@example.com`.
pub async fn sign_up_customers(base: &str, n: usize, tag: &str) -> Vec<Browser> {
    // A few at a time: sign-up hashes a password, which is slow on purpose.
    let signups = (0..n).map(|i| Browser::sign_up(base, &format!("{tag}{i}@example.com")));
    futures::stream::iter(signups).buffered(8).collect().await
}

/// An open sale of `stock` units at $10.00 each; returns its id.
pub async fn create_product(pool: &PgPool, stock: i32, limit: Option<i32>) -> i64 {
    catalog::create_product(
        pool,
        SaleSpec {
            name: format!("Test item ({stock} units)"),
            description: "for tests".into(),
            price: Money::from_cents(1_000).unwrap(),
            stock,
            per_customer_limit: limit,
            starts_at: chrono::Utc::now() - chrono::Duration::minutes(1),
            ends_at: None,
            queue_mode: false,
            queue_opens_at: None,
            join_check_work: 1,
        },
    )
    .await
    .unwrap()
    .id
}

/// One unit of `product` for `customer` (any id, even one with no account)
/// straight into the product's batch, as no form would send it.
pub async fn one_unit_in_batch(
    shop: &Shop,
    product: i64,
    customer: i64,
) -> Result<flashsale::services::checkout::PurchaseOutcome, flashsale::error::AppError> {
    use flashsale::domain::{CustomerId, ProductId, Quantity};
    use flashsale::services::checkout::{buy_in_batch, Buyer};
    let buyer = Buyer {
        customer: CustomerId(customer),
        quantity: Quantity::new(1).unwrap(),
        payment_deadline: chrono::Utc::now() + chrono::Duration::minutes(10),
        gate_key: None,
        answer_key: None,
        pass: None,
    };
    buy_in_batch(shop, ProductId(product), buyer).await
}
