//! `flashsale race`: many signed-in buyers press "buy" on one product at the
//! same instant against a running shop, then the ledger is checked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use reqwest::StatusCode;
use serde::Serialize;
use tokio::sync::{Barrier, Semaphore};

use super::harness::{Browser, DECLINED_CARD, GOOD_CARD};
use super::{new_histogram, record, summarize, Latency};
use crate::services::payment::CARD_TRIES;
use checks::{check_in_database, check_via_dashboard};

mod checks;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PayMode {
    Success,
    Decline,
    /// Every other purchased order is declined.
    Mixed,
}

#[derive(Debug, Clone)]
pub struct RaceConfig {
    pub base_url: String,
    pub admin_email: String,
    pub admin_password: String,
    pub stock: i32,
    pub buyers: usize,
    pub quantity: u32,
    /// Buys in flight at once; all of them when `None`.
    pub concurrency: Option<usize>,
    pub pay: Option<PayMode>,
    pub refund: usize,
    /// Race on this product instead of creating one (needs no database access).
    pub product: Option<i64>,
    /// Creates the product and checks the ledger directly when set.
    pub database_url: Option<String>,
    /// Buyer accounts are `{buyer_tag}{i}@flashsale.test`, reused across runs.
    pub buyer_tag: String,
    pub buyer_password: String,
    pub progress: bool,
}

impl RaceConfig {
    pub fn new(base_url: &str, admin_email: &str, admin_password: &str) -> RaceConfig {
        RaceConfig {
            base_url: base_url.trim_end_matches('/').to_string(),
            admin_email: admin_email.into(),
            admin_password: admin_password.into(),
            stock: 5,
            buyers: 20,
            quantity: 1,
            concurrency: None,
            pay: None,
            refund: 0,
            product: None,
            database_url: None,
            buyer_tag: "racer".into(),
            buyer_password: "race-buyer-password".into(),
            progress: false,
        }
    }
}

/// How one buy was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum BuyOutcome {
    Purchased(i64),
    SoldOut,
    Limit,
    Busy,
    Error(String),
}

#[derive(Debug, Clone, Serialize)]
pub struct Invariant {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct RaceReport {
    pub base_url: String,
    pub product: i64,
    pub stock: i64,
    pub buyers: usize,
    pub quantity: u32,
    pub purchased: usize,
    pub sold_out: usize,
    pub limit: usize,
    pub busy: usize,
    pub errors: usize,
    pub error_samples: Vec<String>,
    pub latency: Latency,
    pub elapsed_ms: f64,
    pub paid: usize,
    pub declined: usize,
    pub refunded: usize,
    pub follow_up_errors: Vec<String>,
    /// "database" or "admin dashboard".
    pub checked_via: String,
    pub invariants: Vec<Invariant>,
}

impl RaceReport {
    /// Whether the run proves what it should: every invariant held and nothing unexpected happened.
    pub fn passed(&self) -> bool {
        self.errors == 0 && self.follow_up_errors.is_empty() && self.invariants.iter().all(|i| i.ok)
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let l = &self.latency;
        out.push_str(&format!(
            "race on {} product {} ({} units, {} buyers x {} unit(s), {:.0} ms)\n",
            self.base_url, self.product, self.stock, self.buyers, self.quantity, self.elapsed_ms
        ));
        out.push_str("  outcome     count\n");
        for (name, n) in [
            ("purchased", self.purchased),
            ("sold out", self.sold_out),
            ("limit", self.limit),
            ("busy", self.busy),
            ("errors", self.errors),
        ] {
            out.push_str(&format!("  {name:<10} {n:>6}\n"));
        }
        out.push_str(&format!(
            "  latency ms  p50 {:.1}  p95 {:.1}  p99 {:.1}  max {:.1}\n",
            l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms
        ));
        if self.paid + self.declined + self.refunded > 0 {
            out.push_str(&format!(
                "  paid {}  declined {}  refunded {}\n",
                self.paid, self.declined, self.refunded
            ));
        }
        for sample in self.error_samples.iter().chain(&self.follow_up_errors) {
            out.push_str(&format!("  error: {sample}\n"));
        }
        out.push_str(&format!("invariants (checked via {}):\n", self.checked_via));
        for invariant in &self.invariants {
            out.push_str(&format!(
                "  [{}] {}: {}\n",
                if invariant.ok { "PASS" } else { "FAIL" },
                invariant.name,
                invariant.detail
            ));
        }
        out.push_str(if self.passed() {
            "result: PASS\n"
        } else {
            "result: FAIL\n"
        });
        out
    }
}

fn browser(base: &str) -> anyhow::Result<Browser> {
    let client = Browser::client_builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    Ok(Browser::new(base, client))
}

/// Makes the buyer's account unless an earlier run made it.
async fn ensure_account(
    pool: &crate::db::PgPool,
    email: &str,
    password: &str,
) -> anyhow::Result<()> {
    use crate::domain::{Email, Password, Role};
    let email = Email::parse(email)?;
    let password = Password::parse(password)?;
    let address = email.as_str().to_string();
    match crate::services::accounts::sign_up(pool, email, password, Role::Customer).await {
        Ok(_) | Err(crate::error::AppError::Conflict(_)) => {}
        Err(error) => return Err(anyhow::anyhow!("creating a buyer's account: {error}")),
    }
    // The operator knows these addresses, as the demo's: confirmed, so a
    // sale with a per-customer limit (per person) sells to them.
    crate::services::confirmation::confirm_as_operator(pool, &address)
        .await
        .map_err(|error| anyhow::anyhow!("confirming a buyer's address: {error}"))
}

/// Signs up, or signs in when the account exists from an earlier run.
async fn sign_up_or_in(browser: &Browser, email: &str, password: &str) -> anyhow::Result<()> {
    let response = browser.sign_up(email, password).await?;
    match response.status() {
        StatusCode::SEE_OTHER => Ok(()),
        StatusCode::CONFLICT => browser.sign_in(email, password).await,
        other => bail!("sign-up of {email} answered {other}"),
    }
}

async fn buy(browser: &Browser, product: i64, quantity: u32, token: &str) -> BuyOutcome {
    let quantity = quantity.to_string();
    let key = uuid::Uuid::new_v4().to_string();
    let response = match browser.buy(product, &quantity, token, Some(&key)).await {
        Ok(response) => response,
        Err(error) => return BuyOutcome::Error(format!("request failed: {error}")),
    };
    let status = response.status();
    let location = response
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = response.text().await.unwrap_or_default();
    classify(status, &location, &body)
}

fn classify(status: StatusCode, location: &str, body: &str) -> BuyOutcome {
    match status {
        StatusCode::SEE_OTHER => match location
            .strip_prefix("/orders/")
            .and_then(|id| id.parse().ok())
        {
            Some(order) => BuyOutcome::Purchased(order),
            None => BuyOutcome::Error(format!("303 to {location:?} instead of an order")),
        },
        StatusCode::CONFLICT if body.contains("Sold out") || body.contains("Not enough left") => {
            BuyOutcome::SoldOut
        }
        StatusCode::CONFLICT if body.contains("Purchase limit") => BuyOutcome::Limit,
        StatusCode::SERVICE_UNAVAILABLE => BuyOutcome::Busy,
        StatusCode::FORBIDDEN if body.contains("Confirm your email address") => BuyOutcome::Error(
            "the buyer's address is not confirmed, and a sale with a per-customer limit sells only to confirmed addresses: set DATABASE_URL so race makes confirmed accounts".into(),
        ),
        other => BuyOutcome::Error(format!("unexpected {other}")),
    }
}

async fn create_race_product(database_url: &str, stock: i32) -> anyhow::Result<i64> {
    use crate::services::catalog::{create_product, SaleSpec};
    let pool = crate::db::build_pool(
        database_url,
        2,
        Duration::from_secs(5),
        Duration::from_secs(5),
    );
    let product = create_product(
        &pool,
        SaleSpec {
            name: format!("Race item ({stock} units)"),
            description: "created by flashsale race".into(),
            price: crate::domain::Money::from_cents(100)?,
            stock,
            per_customer_limit: None,
            starts_at: chrono::Utc::now() - chrono::Duration::seconds(5),
            ends_at: None,
            queue_mode: false,
            queue_opens_at: None,
            join_check_work: crate::services::catalog::DEFAULT_JOIN_CHECK_WORK,
        },
    )
    .await?;
    Ok(product.id)
}

pub async fn run_race(config: RaceConfig) -> anyhow::Result<RaceReport> {
    if config.buyers == 0 {
        bail!("--buyers must be at least 1");
    }
    let fresh = config.product.is_none();
    let product = match (config.product, &config.database_url) {
        (Some(id), _) => id,
        (None, Some(url)) => create_race_product(url, config.stock).await?,
        (None, None) => bail!(
            "the shop has no page to create a product yet: pass --product ID, or set DATABASE_URL so race can create one"
        ),
    };

    let admin = browser(&config.base_url)?;
    admin
        .sign_in(&config.admin_email, &config.admin_password)
        .await
        .context("admin sign-in")?;

    // With the database at hand the buyers' accounts are made there, as
    // an operator makes accounts: a crowd from this one machine would
    // otherwise meet the sign-up door's per-address limit.
    let accounts = config
        .database_url
        .as_deref()
        .map(|url| crate::db::build_pool(url, 8, Duration::from_secs(5), Duration::from_secs(5)));
    // Argon2 makes each sign-up expensive; a few at a time keeps the server responsive.
    let signups = Arc::new(Semaphore::new(8));
    let mut joins = Vec::with_capacity(config.buyers);
    for i in 0..config.buyers {
        let email = format!("{}{i}@flashsale.test", config.buyer_tag);
        let password = config.buyer_password.clone();
        let base = config.base_url.clone();
        let signups = signups.clone();
        let accounts = accounts.clone();
        joins.push(tokio::spawn(async move {
            let _permit = signups.acquire_owned().await?;
            let session = browser(&base)?;
            match accounts {
                Some(pool) => {
                    ensure_account(&pool, &email, &password).await?;
                    session.sign_in(&email, &password).await?;
                }
                None => sign_up_or_in(&session, &email, &password).await?,
            }
            let token = session.csrf().await?;
            anyhow::Ok((session, token))
        }));
    }
    let mut buyers = Vec::with_capacity(config.buyers);
    for join in joins {
        buyers.push(join.await??);
    }

    let progress = if config.progress {
        let bar =
            ProgressBar::with_draw_target(Some(config.buyers as u64), ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("{spinner} buys {pos}/{len} {elapsed}")
                .expect("valid template"),
        );
        let shown = bar.clone();
        // Short runs finish before anyone could read a bar.
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if !shown.is_finished() {
                shown.set_draw_target(ProgressDrawTarget::stderr());
            }
        });
        bar
    } else {
        ProgressBar::hidden()
    };

    let start_line = Arc::new(Barrier::new(config.buyers + 1));
    let in_flight = Arc::new(Semaphore::new(
        config.concurrency.unwrap_or(config.buyers).max(1),
    ));
    let mut joins = Vec::with_capacity(config.buyers);
    for (session, token) in &buyers {
        let (session, token) = (session.clone(), token.clone());
        let start_line = start_line.clone();
        let in_flight = in_flight.clone();
        let progress = progress.clone();
        let quantity = config.quantity;
        joins.push(tokio::spawn(async move {
            start_line.wait().await;
            let _permit = in_flight.acquire_owned().await.expect("never closed");
            let began = Instant::now();
            let outcome = buy(&session, product, quantity, &token).await;
            progress.inc(1);
            (outcome, began.elapsed())
        }));
    }
    let began = Instant::now();
    start_line.wait().await;
    let mut histogram = new_histogram();
    let mut outcomes = Vec::with_capacity(config.buyers);
    for join in joins {
        let (outcome, elapsed) = join.await?;
        record(&mut histogram, elapsed);
        outcomes.push(outcome);
    }
    let elapsed = began.elapsed();
    progress.finish_and_clear();

    let mut report = RaceReport {
        base_url: config.base_url.clone(),
        product,
        stock: i64::from(config.stock),
        buyers: config.buyers,
        quantity: config.quantity,
        purchased: 0,
        sold_out: 0,
        limit: 0,
        busy: 0,
        errors: 0,
        error_samples: Vec::new(),
        latency: summarize(&histogram),
        elapsed_ms: elapsed.as_secs_f64() * 1000.0,
        paid: 0,
        declined: 0,
        refunded: 0,
        follow_up_errors: Vec::new(),
        checked_via: String::new(),
        invariants: Vec::new(),
    };
    let mut orders: Vec<(usize, i64)> = Vec::new();
    for (i, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            BuyOutcome::Purchased(order) => {
                report.purchased += 1;
                orders.push((i, order));
            }
            BuyOutcome::SoldOut => report.sold_out += 1,
            BuyOutcome::Limit => report.limit += 1,
            BuyOutcome::Busy => report.busy += 1,
            BuyOutcome::Error(message) => {
                report.errors += 1;
                if report.error_samples.len() < 5 {
                    report.error_samples.push(message);
                }
            }
        }
    }

    let mut paid_orders = Vec::new();
    if let Some(mode) = config.pay {
        for (n, &(buyer, order)) in orders.iter().enumerate() {
            let approve = match mode {
                PayMode::Success => true,
                PayMode::Decline => false,
                PayMode::Mixed => n % 2 == 0,
            };
            let card = if approve { GOOD_CARD } else { DECLINED_CARD };
            let session = &buyers[buyer].0;
            // A declined order keeps its units for another card until its
            // last try: the race declines it to the end, so they come back.
            let tries = if approve { 1 } else { CARD_TRIES };
            let result = async {
                for _ in 0..tries {
                    let response = session.pay(order, card).await?;
                    if response.status() != StatusCode::SEE_OTHER {
                        bail!("paying order {order} answered {}", response.status());
                    }
                }
                anyhow::Ok(())
            }
            .await;
            match result {
                Ok(()) if approve => {
                    report.paid += 1;
                    paid_orders.push(order);
                }
                Ok(()) => report.declined += 1,
                Err(error) => report.follow_up_errors.push(format!("{error:#}")),
            }
        }
    }
    for &order in paid_orders.iter().take(config.refund) {
        let result = async {
            let response = admin
                .post_form(&format!("/admin/orders/{order}/refund"), &[])
                .await?;
            if response.status() != StatusCode::SEE_OTHER {
                bail!("refunding order {order} answered {}", response.status());
            }
            anyhow::Ok(())
        }
        .await;
        match result {
            Ok(()) => report.refunded += 1,
            Err(error) => report.follow_up_errors.push(format!("{error:#}")),
        }
    }
    if config.refund > report.refunded && report.follow_up_errors.is_empty() {
        report.follow_up_errors.push(format!(
            "asked to refund {} orders but only {} were paid",
            config.refund, report.refunded
        ));
    }

    match &config.database_url {
        Some(url) => check_in_database(&mut report, url, fresh).await?,
        None => check_via_dashboard(&mut report, &admin).await?,
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified_by_status_and_page() {
        assert_eq!(
            classify(StatusCode::SEE_OTHER, "/orders/12", ""),
            BuyOutcome::Purchased(12)
        );
        assert!(matches!(
            classify(StatusCode::SEE_OTHER, "/login", ""),
            BuyOutcome::Error(_)
        ));
        assert_eq!(
            classify(StatusCode::CONFLICT, "", "<h1>Sold out</h1>"),
            BuyOutcome::SoldOut
        );
        assert_eq!(
            classify(StatusCode::CONFLICT, "", "Not enough left"),
            BuyOutcome::SoldOut
        );
        assert_eq!(
            classify(StatusCode::CONFLICT, "", "Purchase limit reached"),
            BuyOutcome::Limit
        );
        assert_eq!(
            classify(StatusCode::SERVICE_UNAVAILABLE, "", ""),
            BuyOutcome::Busy
        );
        assert!(matches!(
            classify(StatusCode::FORBIDDEN, "", ""),
            BuyOutcome::Error(_)
        ));
    }
}
