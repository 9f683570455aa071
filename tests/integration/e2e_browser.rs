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
pub(crate) const DESKTOP: (u32, u32) = (1280, 1000);
pub(crate) const PHONE: (u32, u32) = (390, 844);

/// chromedriver on a free port, killed by PID when the test ends.
pub(crate) fn start_chromedriver() -> (ChildGuard, u16) {
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

pub(crate) struct Chrome {
    pub(crate) client: Client,
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
    pub(crate) async fn start(driver_port: u16, base: &str) -> Chrome {
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

    pub(crate) async fn open(&self, path: &str) {
        self.client
            .goto(&format!("{}{}", self.base, path))
            .await
            .unwrap();
    }

    pub(crate) async fn path(&self) -> String {
        self.client.current_url().await.unwrap().path().to_string()
    }

    /// The visible text of the page's main content.
    pub(crate) async fn text(&self) -> String {
        self.client
            .find(Locator::Css("main"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Waits (a form submit may still be navigating) until the main content says `wanted`.
    pub(crate) async fn expect_text(&self, wanted: &str) -> String {
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

    /// Like `expect_text`, for what happens by itself later (a countdown
    /// ending, the next admission): waits up to `within`.
    pub(crate) async fn expect_text_within(&self, wanted: &str, within: Duration) -> String {
        let deadline = std::time::Instant::now() + within;
        loop {
            let text = self.text().await;
            if text.contains(wanted) {
                return text;
            }
            if std::time::Instant::now() > deadline {
                panic!(
                    "expected {wanted:?} on {} within {within:?}:\n{text}",
                    self.path().await
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Marks the page's document, for `same_document`.
    pub(crate) async fn mark_document(&self) {
        self.client
            .execute("window.__markedDocument = true", vec![])
            .await
            .unwrap();
    }

    /// Whether the page is still the document `mark_document` marked: it
    /// changed by itself, with no reload or navigation.
    /// A refresh the page has armed counts as a reload: a `<meta
    /// http-equiv="refresh">` that reached the live document (parsed out of
    /// a `<noscript>` in swapped-in markup, say) reloads it moments later,
    /// so a check made before it fires must fail too.
    pub(crate) async fn same_document(&self) -> bool {
        self.client
            .execute(
                "return window.__markedDocument === true && \
                 document.querySelectorAll('meta[http-equiv=\"refresh\" i]').length === 0",
                vec![],
            )
            .await
            .unwrap()
            == serde_json::Value::Bool(true)
    }

    pub(crate) async fn expect_path(&self, wanted: &str) {
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

    pub(crate) async fn expect_source(&self, wanted: &str) {
        for _ in 0..100 {
            if self.client.source().await.unwrap().contains(wanted) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("expected {wanted:?} in the page at {}", self.path().await);
    }

    pub(crate) async fn fill(&self, css: &str, value: &str) {
        let field = self.client.find(Locator::Css(css)).await.unwrap();
        field.clear().await.unwrap();
        field.send_keys(value).await.unwrap();
    }

    pub(crate) async fn click(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"))
            .click()
            .await
            .unwrap();
    }

    /// Clicks a submit button and waits until the next page has replaced this one.
    pub(crate) async fn submit(&self, css: &str) {
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

    pub(crate) async fn click_link(&self, text: &str) {
        self.client
            .find(Locator::LinkText(text))
            .await
            .unwrap_or_else(|e| panic!("no link {text:?}: {e}"))
            .click()
            .await
            .unwrap();
    }

    pub(crate) async fn save(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(self.shots.join(format!("{name}.png")), png).unwrap();
    }

    /// A desktop screenshot, and one at phone width.
    pub(crate) async fn shot(&self, name: &str) {
        self.save(name).await;
        self.client.set_window_size(PHONE.0, PHONE.1).await.unwrap();
        self.save(&format!("{name}-phone")).await;
        self.client
            .set_window_size(DESKTOP.0, DESKTOP.1)
            .await
            .unwrap();
    }

    pub(crate) async fn sign_up(&self, email: &str) {
        self.open("/").await;
        self.click_link("Create account").await;
        self.fill("#email", email).await;
        self.fill("#password", PASSWORD).await;
        self.submit("main button[type=submit]").await;
        // A new account is confirmed, then goes on to the sales.
        self.expect_path("/welcome").await;
        self.expect_text("Your account is ready").await;
        self.click_link("See the sales").await;
        self.expect_path("/").await;
        self.expect_source(email).await;
    }

    pub(crate) async fn sign_in(&self, email: &str) {
        self.open("/login").await;
        self.fill("#email", email).await;
        self.fill("#password", PASSWORD).await;
        self.submit("main button[type=submit]").await;
    }

    pub(crate) async fn sign_out(&self) {
        // Error pages carry no account menu; the sale list always does.
        self.open("/").await;
        self.submit("header form[action='/logout'] button").await;
        self.expect_source(">Sign in</a>").await;
    }

    pub(crate) async fn buy(&self, product: i64) -> i64 {
        self.open(&format!("/products/{product}")).await;
        self.submit("form.buy button[type=submit]").await;
        self.expect_text("Pay").await;
        let path = self.path().await;
        match path.trim_start_matches("/orders/").parse() {
            Ok(order) => order,
            Err(_) => panic!("buying led to {path}: {}", self.text().await),
        }
    }

    pub(crate) async fn pay(&self, card: &str) {
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
    app.confirm("first@example.com");
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
    app.confirm("second@example.com");
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

    // (3) A third customer's card is declined: the unit stays held for
    // another card; they give up, and the unit comes back.
    chrome.sign_up("third@example.com").await;
    app.confirm("third@example.com");
    let declined_order = chrome.buy(poster).await;
    chrome.open("/").await;
    chrome.expect_text("0 of 1 left").await;
    chrome.open(&format!("/orders/{declined_order}")).await;
    chrome.pay(DECLINED_CARD).await;
    chrome.expect_text("Your card was declined").await;
    chrome.expect_text("try another card").await;
    chrome.shot("08-declined").await;
    chrome.submit("form.give-up button[type=submit]").await;
    chrome.expect_text("This order was cancelled").await;
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
            join_check_work: 1,
        },
    )
    .await
    .unwrap()
    .id
}

/// The waiting room end to end: two customers join before the opening and
/// watch the countdown turn into a place by itself; the first admitted
/// buys and is declined, which admits the next; the next buys and pays;
/// a late arrival watching the waiting page sees "sold out" as the last
/// unit goes; and the published draw passes `flashsale draw verify`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_room_in_chromium() {
    use crate::waiting_room_pages::{join, queue_json, queue_sale, wait_for};
    let app = spawn_app().await;
    let (_driver, driver_port) = start_chromedriver();
    let one = Chrome::start(driver_port, &app.address).await;
    let two = Chrome::start(driver_port, &app.address).await;
    // Long enough for both browsers to sign up and join first.
    let product = queue_sale(&app, 1, 1, chrono::Duration::seconds(40), None).await;
    let late = app.customer("queue-late@example.com").await;

    for (chrome, email) in [
        (&one, "queue-one@example.com"),
        (&two, "queue-two@example.com"),
    ] {
        chrome.sign_up(email).await;
        // As opening the mailed link does (the `mail` tests open it).
        app.confirm(email);
        chrome.open(&format!("/products/{product}")).await;
        chrome
            .expect_text("This sale opens through a waiting room")
            .await;
        chrome.submit("form.join button[type=submit]").await;
        chrome
            .expect_path(&format!("/products/{product}/queue"))
            .await;
        chrome.expect_text("You are in the waiting room").await;
        chrome.expect_text("The sale starts in").await;
        // The draw's commitment, to keep with the ticket.
        chrome.expect_text("The draw's commitment").await;
        chrome.mark_document().await;
    }
    one.shot("20-waiting-room-countdown").await;

    // At the start the countdown turns into a place, without a reload (the
    // first in line may go straight on to its pass).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let first_is_one = loop {
        let (a, b) = (one.text().await, two.text().await);
        if a.contains("It is your turn") && b.contains("in line") {
            break true;
        }
        if b.contains("It is your turn") && a.contains("in line") {
            break false;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no place and pass at the start:\n{a}\n---\n{b}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (first, second) = if first_is_one {
        (&one, &two)
    } else {
        (&two, &one)
    };
    for chrome in [first, second] {
        assert!(chrome.same_document().await, "the page was reloaded");
    }
    second.expect_text("You are number 2 in line").await;
    second.shot("21-waiting-room-place").await;
    // A late arrival goes to the back.
    crate::helpers::expect_redirect(
        &join(&late, product).await,
        &format!("/products/{product}/queue"),
    );
    assert_eq!(queue_json(&late, product).await["position"], 3);
    // The other waiter is told at once that every unit is held.
    second
        .expect_text_within(
            "Every unit is sold or held right now",
            Duration::from_secs(20),
        )
        .await;
    first.shot("22-admitted").await;
    second.shot("23-all-held").await;

    // The first buys with the pass and the card is declined, the unit still
    // held; they give the order up ...
    first.submit("form.buy button[type=submit]").await;
    first.expect_text("Pay $25.00").await;
    first.pay(DECLINED_CARD).await;
    first.expect_text("Your card was declined").await;
    first.submit("form.give-up button[type=submit]").await;
    first.expect_text("This order was cancelled").await;
    // ... which gives the unit back and admits the next waiter.
    second
        .expect_text_within("It is your turn", Duration::from_secs(30))
        .await;
    assert!(second.same_document().await, "the page was reloaded");
    second.shot("24-admitted-after-decline").await;

    // The late arrival watches the waiting page in the first browser.
    first.sign_out().await;
    first.sign_in("queue-late@example.com").await;
    first.open(&format!("/products/{product}/queue")).await;
    first
        .expect_text("Every unit is sold or held right now")
        .await;
    first.mark_document().await;

    second.submit("form.buy button[type=submit]").await;
    second.expect_text("Pay $25.00").await;
    second.pay(GOOD_CARD).await;
    second.expect_text("Paid — thank you").await;
    second.shot("25-paid-with-pass").await;

    first
        .expect_text_within("Sold out", Duration::from_secs(30))
        .await;
    assert!(first.same_document().await, "the page was reloaded");
    first.shot("26-sold-out-for-waiters").await;
    wait_for(&late, product, Duration::from_secs(5), |s| {
        s["state"] == "sold_out"
    })
    .await;

    // The draw page, and the draw checked as anyone would.
    first.open(&format!("/products/{product}/draw")).await;
    first.expect_text("flashsale draw verify").await;
    first.shot("27-draw").await;
    let report =
        flashsale::qa::draw::fetch_and_check(&app.address, flashsale::domain::ProductId(product))
            .await
            .unwrap();
    assert!(report.passed(), "{}", report.render());
    one.client.clone().close().await.unwrap();
    two.client.clone().close().await.unwrap();
    assert_eq!(
        app.db.count(&format!(
            "SELECT count(*) AS n FROM orders o JOIN order_items i ON i.order_id = o.id \
             WHERE i.product_id = {product} AND o.status = 'paid'"
        )),
        1
    );
    app.db.assert_audit_clean();
}

/// The opening second, by the shop's clock: an open-mode sale's Buy button
/// and a queue-mode sale's join button enable themselves, without a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buttons_open_by_themselves_at_the_opening_second_in_chromium() {
    use crate::waiting_room_pages::queue_sale;
    let app = spawn_app().await;
    let (_driver, driver_port) = start_chromedriver();
    let chrome = Chrome::start(driver_port, &app.address).await;
    chrome.sign_up("opening@example.com").await;
    app.confirm("opening@example.com");
    let soon = chrono::Utc::now() + chrono::Duration::seconds(12);
    let open_sale = flashsale::services::catalog::create_product(
        &app.shop.pool,
        flashsale::services::catalog::SaleSpec {
            name: "Opening owl".into(),
            description: "Opens in a moment.".into(),
            price: flashsale::domain::Money::from_cents(1_500).unwrap(),
            stock: 3,
            per_customer_limit: Some(1),
            starts_at: soon,
            ends_at: None,
            queue_mode: false,
            queue_opens_at: None,
            join_check_work: 1,
        },
    )
    .await
    .unwrap()
    .id;
    chrome.open(&format!("/products/{open_sale}")).await;
    chrome.expect_text("has not opened yet").await;
    let button = chrome
        .client
        .find(Locator::Css("form.buy button[type=submit]"))
        .await
        .unwrap();
    assert!(!button.is_enabled().await.unwrap());
    chrome.mark_document().await;
    chrome
        .expect_text_within("Buy now", Duration::from_secs(30))
        .await;
    assert!(button.is_enabled().await.unwrap());
    assert!(chrome.same_document().await, "the page was reloaded");
    assert!(!chrome.text().await.contains("has not opened yet"));
    chrome.shot("30-opened-by-itself").await;
    chrome.submit("form.buy button[type=submit]").await;
    chrome.expect_text("Pay $15.00").await;

    // A waiting room that opens 12 s from now, its sale 10 minutes later.
    let queued = queue_sale(
        &app,
        3,
        1,
        chrono::Duration::seconds(612),
        Some(chrono::Duration::minutes(10)),
    )
    .await;
    chrome.open(&format!("/products/{queued}")).await;
    chrome.expect_text("The waiting room opens").await;
    let join = chrome
        .client
        .find(Locator::Css("form.join button[type=submit]"))
        .await
        .unwrap();
    assert!(!join.is_enabled().await.unwrap(), "joining is not open yet");
    assert!(
        chrome.client.find(Locator::Css("form.buy")).await.is_err(),
        "a queue-mode sale offers no Buy"
    );
    chrome.mark_document().await;
    for _ in 0..150 {
        if join.is_enabled().await.unwrap() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        join.is_enabled().await.unwrap(),
        "the join button never opened"
    );
    assert!(chrome.same_document().await, "the page was reloaded");
    chrome.submit("form.join button[type=submit]").await;
    chrome
        .expect_path(&format!("/products/{queued}/queue"))
        .await;
    chrome.expect_text("You are in the waiting room").await;
    chrome.shot("31-joined-at-the-opening").await;
    chrome.client.close().await.unwrap();
}
