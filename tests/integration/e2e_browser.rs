//! The shop and the admin console driven end to end in headless Chromium
//! (Debian's `chromium` + `chromium-driver`; scripts/services installs them).
//! Screenshots of every key page land in `target/e2e/` for review.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::helpers::*;
use fantoccini::{Client, ClientBuilder, Locator};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
const DESKTOP: (u32, u32) = (1280, 1000);
const PHONE: (u32, u32) = (390, 844);

/// chromedriver on a free port, killed by PID when the test ends.
fn start_chromedriver() -> (ChildGuard, u16) {
    assert!(
        std::path::Path::new(CHROMEDRIVER).exists() && std::path::Path::new(CHROMIUM).exists(),
        "{CHROMIUM} and {CHROMEDRIVER} are missing: run scripts/test, which installs Debian's chromium and chromium-driver"
    );
    let port = free_port();
    let child = die_with_parent(&mut Command::new(CHROMEDRIVER))
        .arg(format!("--port={port}"))
        // A zone other than the server's UTC and without summer time, to see times in the reader's own.
        .env("TZ", "Asia/Tokyo")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let guard = ChildGuard(child);
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (guard, port);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("chromedriver on port {port} did not start");
}

struct Chrome {
    client: Client,
    base: String,
    shots: PathBuf,
    // Declared after `client` so the browser profile outlives the session.
    _profile: TempDir,
}

/// A fresh browser profile directory, removed at the end.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Chrome {
    async fn start(driver_port: u16, base: &str) -> Chrome {
        let profile = TempDir(
            std::env::temp_dir().join(format!("flashsale-e2e-{}", uuid::Uuid::new_v4().simple())),
        );
        std::fs::create_dir_all(&profile.0).unwrap();
        let args = vec![
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--hide-scrollbars".into(),
            format!("--window-size={},{}", DESKTOP.0, DESKTOP.1),
            format!("--user-data-dir={}", profile.0.display()),
        ];
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({ "binary": CHROMIUM, "args": args }),
        );
        // Two rustls backends are compiled in (through reqwest and fantoccini),
        // so rustls cannot pick one itself; the WebDriver link is plain HTTP anyway.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = ClientBuilder::rustls()
            .expect("a WebDriver client")
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{driver_port}"))
            .await
            .expect("chromium starts under chromedriver");
        let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/e2e");
        std::fs::create_dir_all(&shots).unwrap();
        Chrome {
            client,
            base: base.to_string(),
            shots,
            _profile: profile,
        }
    }

    async fn open(&self, path: &str) {
        self.client
            .goto(&format!("{}{}", self.base, path))
            .await
            .unwrap();
    }

    async fn path(&self) -> String {
        self.client.current_url().await.unwrap().path().to_string()
    }

    /// The visible text of the page's main content.
    async fn text(&self) -> String {
        self.client
            .find(Locator::Css("main"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Waits (a form submit may still be navigating) until the main content says `wanted`.
    async fn expect_text(&self, wanted: &str) -> String {
        let mut text = String::new();
        for _ in 0..100 {
            text = self.text().await;
            if text.contains(wanted) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("expected {wanted:?} on {}:\n{text}", self.path().await);
    }

    async fn expect_path(&self, wanted: &str) {
        let mut path = String::new();
        for _ in 0..100 {
            path = self.path().await;
            if path == wanted {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "expected to be on {wanted}, am on {path}: {}",
            self.text().await
        );
    }

    async fn expect_source(&self, wanted: &str) {
        for _ in 0..100 {
            if self.client.source().await.unwrap().contains(wanted) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("expected {wanted:?} in the page at {}", self.path().await);
    }

    async fn fill(&self, css: &str, value: &str) {
        let field = self.client.find(Locator::Css(css)).await.unwrap();
        field.clear().await.unwrap();
        field.send_keys(value).await.unwrap();
    }

    async fn click(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"))
            .click()
            .await
            .unwrap();
    }

    /// Clicks a submit button and waits until the next page has replaced this one.
    async fn submit(&self, css: &str) {
        let old = self.client.find(Locator::Css("html")).await.unwrap();
        self.click(css).await;
        for _ in 0..100 {
            // A reference into the old page goes stale once the new one loads.
            if old.tag_name().await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("submitting {css} did not load a new page");
    }

    async fn click_link(&self, text: &str) {
        self.client
            .find(Locator::LinkText(text))
            .await
            .unwrap_or_else(|e| panic!("no link {text:?}: {e}"))
            .click()
            .await
            .unwrap();
    }

    async fn save(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(self.shots.join(format!("{name}.png")), png).unwrap();
    }

    /// A desktop screenshot, and one at phone width.
    async fn shot(&self, name: &str) {
        self.save(name).await;
        self.client.set_window_size(PHONE.0, PHONE.1).await.unwrap();
        self.save(&format!("{name}-phone")).await;
        self.client
            .set_window_size(DESKTOP.0, DESKTOP.1)
            .await
            .unwrap();
    }

    async fn sign_up(&self, email: &str) {
        self.open("/").await;
        self.click_link("Create account").await;
        self.fill("#email", email).await;
        self.fill("#password", PASSWORD).await;
        self.submit("main button[type=submit]").await;
        self.expect_path("/").await;
        self.expect_source(email).await;
    }

    async fn sign_in(&self, email: &str) {
        self.open("/login").await;
        self.fill("#email", email).await;
        self.fill("#password", PASSWORD).await;
        self.submit("main button[type=submit]").await;
    }

    async fn sign_out(&self) {
        // Error pages carry no account menu; the sale list always does.
        self.open("/").await;
        self.submit("header form[action='/logout'] button").await;
        self.expect_source(">Sign in</a>").await;
    }

    async fn buy(&self, product: i64) -> i64 {
        self.open(&format!("/products/{product}")).await;
        self.submit("form.buy button[type=submit]").await;
        self.expect_text("Pay").await;
        let path = self.path().await;
        match path.trim_start_matches("/orders/").parse() {
            Ok(order) => order,
            Err(_) => panic!("buying led to {path}: {}", self.text().await),
        }
    }

    async fn pay(&self, card: &str) {
        self.fill("#card_number", card).await;
        self.submit("form.pay button[type=submit]").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shop_and_admin_console_in_chromium() {
    let app = spawn_app().await;
    let sneakers = create_named_product(&app, "Limited sneakers", 1, 12_999).await;
    let poster = create_named_product(&app, "Signed poster", 1, 2_500).await;
    flashsale::services::accounts::ensure_admin(
        &app.shop.pool,
        flashsale::domain::Email::parse("boss@example.com").unwrap(),
        flashsale::domain::Password::parse(PASSWORD).unwrap(),
    )
    .await
    .unwrap();
    let (_driver, driver_port) = start_chromedriver();
    let chrome = Chrome::start(driver_port, &app.address).await;

    // (1) A customer signs up, buys the last unit, pays, sees the paid order.
    chrome.open("/").await;
    chrome.expect_text("Limited sneakers").await;
    chrome.expect_text("1 of 1 left").await;
    chrome.shot("01-sale-list").await;
    chrome.sign_up("first@example.com").await;
    chrome.open(&format!("/products/{sneakers}")).await;
    chrome.expect_text("$129.99").await;
    chrome.shot("02-product").await;
    let paid_order = chrome.buy(sneakers).await;
    chrome.expect_text("Pay $129.99").await;
    chrome.expect_text("4242 4242 4242 4242").await;
    // The page script shows the deadline in the reader's zone, counting down.
    chrome.expect_text("(in 9:").await;
    chrome.expect_text(" GMT+9 (in").await;
    chrome.shot("03-payment").await;
    chrome.pay(GOOD_CARD).await;
    chrome.expect_path(&format!("/orders/{paid_order}")).await;
    chrome.expect_text("Paid — thank you").await;
    chrome.shot("04-paid-order").await;
    chrome.click_link("My orders").await;
    chrome.expect_text(&format!("#{paid_order}")).await;
    chrome.shot("05-my-orders").await;
    chrome.sign_out().await;

    // (2) The next customer sees "sold out" and cannot buy.
    chrome.sign_up("second@example.com").await;
    chrome.expect_text("Sold out").await;
    chrome.open(&format!("/products/{sneakers}")).await;
    chrome.expect_text("0 of 1 left").await;
    let button = chrome
        .client
        .find(Locator::Css("form.buy button[type=submit]"))
        .await
        .unwrap();
    assert!(
        !button.is_enabled().await.unwrap(),
        "the buy button is disabled"
    );
    chrome.shot("06-sold-out").await;
    // The server decides, not the button: a forced submit is refused in words.
    chrome
        .client
        .execute("document.querySelector('form.buy').submit()", vec![])
        .await
        .unwrap();
    chrome.expect_text("Sold out").await;
    chrome.shot("07-sold-out-refused").await;
    assert_eq!(app.db.stock(sneakers), 0);
    chrome.sign_out().await;

    // (3) A third customer's payment is declined and the unit comes back.
    chrome.sign_up("third@example.com").await;
    let declined_order = chrome.buy(poster).await;
    chrome.open("/").await;
    chrome.expect_text("0 of 1 left").await;
    chrome.open(&format!("/orders/{declined_order}")).await;
    chrome.pay(DECLINED_CARD).await;
    chrome.expect_text("Your payment was declined").await;
    chrome.shot("08-declined").await;
    chrome.open(&format!("/products/{poster}")).await;
    chrome.expect_text("1 of 1 left").await;
    chrome.sign_out().await;

    // (4) An admin refunds the paid order through the confirmation step.
    chrome.sign_in("boss@example.com").await;
    chrome.expect_path("/admin").await;
    chrome.expect_text("Ledger audit: clean").await;
    chrome.shot("09-admin-dashboard").await;
    chrome.click_link("Orders").await;
    chrome.expect_text("2 orders.").await;
    chrome.fill("#email", "first@").await;
    chrome.submit("form.search button[type=submit]").await;
    chrome.expect_text("1 order matches.").await;
    chrome.shot("10-admin-orders").await;
    chrome.click_link(&format!("#{paid_order}")).await;
    chrome.expect_text("approved").await;
    chrome.shot("11-admin-order").await;
    chrome
        .click_link(&format!("Refund order {paid_order}…"))
        .await;
    chrome.expect_text("This cannot be undone").await;
    chrome.shot("12-refund-confirm").await;
    chrome.submit("button.danger").await;
    chrome
        .expect_path(&format!("/admin/orders/{paid_order}"))
        .await;
    chrome.expect_text("Refunded").await;
    chrome.open(&format!("/products/{sneakers}")).await;
    chrome.expect_text("1 of 1 left").await;
    chrome.expect_text("Live").await;
    chrome
        .open(&format!("/admin/products/{sneakers}/history"))
        .await;
    let history = chrome.expect_text("Refund").await;
    assert!(history.contains("Purchase"), "{history}");
    chrome.shot("13-stock-history").await;
    // Refunding again is refused with a clear message.
    chrome
        .open(&format!("/admin/orders/{paid_order}/refund"))
        .await;
    chrome.expect_text("already been refunded").await;

    // The admin creates a sale, edits it and adds stock with a reason.
    chrome.click_link("New sale").await;
    chrome.expect_text("In your time zone:").await;
    chrome.shot("14-admin-new-sale").await;
    chrome.fill("#name", "Vintage camera").await;
    chrome
        .fill("#description", "Fully working, one careful owner.")
        .await;
    chrome.fill("#price", "349").await;
    chrome.fill("#stock", "3").await;
    chrome.fill("#per_customer_limit", "1").await;
    chrome
        .client
        .execute(
            "document.getElementById('starts_at').value = '2020-01-01T00:00'",
            vec![],
        )
        .await
        .unwrap();
    chrome.submit("main form button[type=submit]").await;
    chrome.expect_text("Saved.").await;
    chrome.fill("#price", "299.00").await;
    chrome.submit("main form button[type=submit]").await;
    chrome.expect_text("Saved.").await;
    chrome.fill("#delta", "2").await;
    chrome.fill("#reason", "two more found in storage").await;
    chrome.shot("15-admin-edit-sale").await;
    chrome.submit("form[action$='/stock'] button").await;
    chrome.expect_text("two more found in storage").await;
    chrome.expect_text("5 in stock of 5 offered").await;
    chrome.shot("16-stock-adjusted").await;
    chrome.open("/").await;
    chrome.expect_text("Vintage camera").await;
    chrome.expect_text("$299.00").await;
    chrome.open("/admin").await;
    chrome.expect_text("Ledger audit: clean").await;

    chrome.client.close().await.unwrap();
    app.db.assert_audit_clean();
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM orders WHERE status = 'refunded'"),
        1
    );
}

async fn create_named_product(app: &TestApp, name: &str, stock: i32, cents: i64) -> i64 {
    use flashsale::services::catalog::{create_product, SaleSpec};
    create_product(
        &app.shop.pool,
        SaleSpec {
            name: name.into(),
            description: "A flash-sale item in the browser test.".into(),
            price: flashsale::domain::Money::from_cents(cents).unwrap(),
            stock,
            per_customer_limit: Some(1),
            starts_at: chrono::Utc::now() - chrono::Duration::minutes(1),
            ends_at: Some(chrono::Utc::now() + chrono::Duration::hours(2)),
            queue_mode: false,
            queue_opens_at: None,
        },
    )
    .await
    .unwrap()
    .id
}
