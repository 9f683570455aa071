//! Every form the shop accepts, as it arrives (all text, nothing trusted),
//! and the pure parser that turns it into the checked input its handler
//! passes on. Pure on purpose: property tests and the fuzz target call them
//! without a server, and a handler does nothing with a form before they pass.
//!
//! Ids are parsed here and in paths alike: text that is not a positive id
//! names no row, so it is a 404, not a form mistake. Query strings the pages
//! send (order search, page numbers) are forms too and live here as well.

use chrono::{DateTime, Datelike, NaiveDateTime, Utc};
use serde::Deserialize;

use crate::domain::{
    check_plain_text, Email, InvalidInput, Lines, Money, OrderId, OrderStatus, Password, ProductId,
    Quantity,
};
use crate::domain::{CardNumber, CustomerId};
use crate::error::AppError;
use crate::services::catalog::{SaleSpec, SaleTerms};
use crate::services::orders::OrderFilter;
use crate::services::stock::Adjustment;

pub fn parse_product_id(raw: &str) -> Result<ProductId, AppError> {
    raw.parse().map_err(names_nothing)
}

pub fn parse_order_id(raw: &str) -> Result<OrderId, AppError> {
    raw.parse().map_err(names_nothing)
}

/// An id in the path that does not parse names no row: not found.
fn names_nothing(error: InvalidInput) -> AppError {
    match error {
        InvalidInput::NoSuchId { kind, raw } => {
            AppError::NotFound(crate::error::Missing::Id { kind, raw })
        }
        other => other.into(),
    }
}

/// Forms that carry nothing but their CSRF token (and, for one-click actions
/// such as checkout and refund, the click's idempotency key).
#[derive(Debug, Deserialize)]
pub struct CsrfOnlyForm {
    #[serde(default)]
    pub csrf_token: String,
    pub idempotency_key: Option<String>,
}

/// Sign-up and sign-in.
#[derive(Debug, Deserialize)]
pub struct CredentialsForm {
    #[serde(default)]
    pub email: String,
    #[serde(default)]
    pub password: String,
    #[serde(default)]
    pub csrf_token: String,
    /// The solved bot check, as the ALTCHA widget puts it in the form
    /// (sign-up only).
    #[serde(default)]
    pub altcha: String,
    /// Where to go once signed in (kept only if `safe_return_path` agrees).
    #[serde(default)]
    pub next: String,
}

/// The sign-in and sign-up pages' query: where to come back to, and
/// whether what sent the customer here would have acted (`why=act`).
#[derive(Debug, Default, Deserialize)]
pub struct SignInQuery {
    #[serde(default)]
    pub next: String,
    #[serde(default)]
    pub why: String,
}

/// `raw`, if it is a path of this shop to send a customer to after signing
/// in: it starts with one `/` and holds no backslash, control character or
/// space, so no browser reads it as another site (`//evil.com`,
/// `/\evil.com`, a tab inside). The sign-in pages themselves are left out, so
/// signing in never comes back to signing in.
pub fn safe_return_path(raw: &str) -> Option<String> {
    let local = raw.starts_with('/') && !raw.starts_with("//");
    let plain = !raw
        .chars()
        .any(|c| c == '\\' || c.is_control() || c.is_whitespace());
    let loops = ["/login", "/signup", "/logout"]
        .iter()
        .any(|page| raw == *page || raw.starts_with(&format!("{page}?")));
    (local && plain && !loops && raw.len() <= 512).then(|| raw.to_string())
}

#[derive(Debug)]
pub struct Credentials {
    pub email: Email,
    pub password: Password,
}

/// A sign-in as the throttle sees it: a readable email, and the password or
/// why no account could have it.
#[derive(Debug)]
pub struct SignInAttempt {
    pub email: Email,
    pub password: Result<Password, InvalidInput>,
}

impl CredentialsForm {
    pub fn sign_up(&self) -> Result<Credentials, AppError> {
        Ok(Credentials {
            email: Email::parse(&self.email)?,
            password: Password::parse(&self.password)?,
        })
    }

    /// What the sign-in handler passes on: an impossible password still
    /// counts as an attempt, so the throttle sees every guess.
    pub fn sign_in_attempt(&self) -> Result<SignInAttempt, AppError> {
        Ok(SignInAttempt {
            email: Email::parse(&self.email)?,
            password: Password::parse(&self.password),
        })
    }

    /// A password no account could have is answered like a wrong one, so the
    /// form does not tell which rule an attacker's guess broke.
    pub fn sign_in(&self) -> Result<Credentials, AppError> {
        Ok(Credentials {
            email: Email::parse(&self.email)?,
            password: Password::parse(&self.password)
                .map_err(|_| AppError::Forbidden(crate::error::NotAllowed::WrongCredentials))?,
        })
    }
}

/// Buy now, on a product page (the product is in the path).
#[derive(Debug, Deserialize)]
pub struct BuyForm {
    #[serde(default)]
    pub quantity: String,
    #[serde(default)]
    pub csrf_token: String,
    pub idempotency_key: Option<String>,
    /// The waiting room's pass (`TICKET-NUMBER`), sent by the waiting page's form.
    #[serde(default)]
    pub pass: Option<String>,
}

impl BuyForm {
    pub fn quantity(&self) -> Result<Quantity, AppError> {
        Ok(Quantity::parse(&self.quantity)?)
    }

    /// None when the form has no pass; a pass that does not read as one is
    /// no pass the shop issued.
    pub fn pass(&self) -> Result<Option<crate::domain::PassRef>, AppError> {
        match self.pass.as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(raw) => crate::domain::PassRef::parse(raw)
                .map(Some)
                .ok_or(AppError::PassRefused(crate::error::PassRefusal::Forged)),
        }
    }
}

/// Cart add, update and remove share one form shape.
#[derive(Debug, Deserialize)]
pub struct CartForm {
    #[serde(default)]
    pub product_id: String,
    #[serde(default)]
    pub quantity: String,
    #[serde(default)]
    pub csrf_token: String,
}

impl CartForm {
    /// Units to add to the cart.
    pub fn addition(&self) -> Result<(ProductId, Quantity), AppError> {
        let product = parse_product_id(&self.product_id)?;
        Ok((product, Quantity::parse(&self.quantity)?))
    }

    /// A line's new quantity; `None` (typed as 0) removes the line.
    pub fn change(&self) -> Result<(ProductId, Option<Quantity>), AppError> {
        let product = parse_product_id(&self.product_id)?;
        let quantity = match self.quantity.trim() {
            "0" => None,
            raw => Some(Quantity::parse(raw)?),
        };
        Ok((product, quantity))
    }

    pub fn removal(&self) -> Result<ProductId, AppError> {
        parse_product_id(&self.product_id)
    }
}

/// Paying an order (the order is in the path).
#[derive(Debug, Deserialize)]
pub struct PayForm {
    #[serde(default)]
    pub card_number: String,
    #[serde(default)]
    pub csrf_token: String,
    pub idempotency_key: Option<String>,
}

impl PayForm {
    pub fn card(&self) -> Result<CardNumber, AppError> {
        Ok(CardNumber::parse(&self.card_number)?)
    }
}

/// An admin's stock adjustment (the product is in the path).
#[derive(Debug, Deserialize)]
pub struct AdjustForm {
    #[serde(default)]
    pub delta: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub csrf_token: String,
}

impl AdjustForm {
    pub fn adjustment(&self) -> Result<Adjustment, AppError> {
        Ok(Adjustment::parse(&self.delta, &self.reason)?)
    }
}

/// The sale form's fields as text, so a refused form comes back as typed.
#[derive(Default, Deserialize)]
pub struct SaleFields {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub price: String,
    #[serde(default)]
    pub stock: String,
    #[serde(default)]
    pub per_customer_limit: String,
    #[serde(default)]
    pub starts_at: String,
    #[serde(default)]
    pub ends_at: String,
    /// The queue-mode checkbox: absent when unticked, `on` when ticked.
    #[serde(default)]
    pub queue_mode: String,
    /// The waiting room's opening; empty means 15 minutes before the start.
    #[serde(default)]
    pub queue_opens_at: String,
    /// The bot check's size for joining; empty means the shop's default
    /// (`JOIN_CHECK_WORK`).
    #[serde(default)]
    pub join_check_work: String,
    #[serde(default)]
    pub csrf_token: String,
}

/// The value a `datetime-local` input shows for `at`; the form is in UTC.
pub fn form_time(at: &DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M").to_string()
}

/// The sale form sends times as `datetime-local` values in UTC (it says so).
/// Four-digit years only: Postgres cannot store every year chrono can read,
/// and a sale in year 200000 is a typo.
fn parse_form_time(
    raw: &str,
    field: crate::domain::TimeField,
) -> Result<Option<DateTime<Utc>>, InvalidInput> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"]
        .iter()
        .find_map(|format| NaiveDateTime::parse_from_str(raw, format).ok())
        .filter(|naive| (1970..=9999).contains(&naive.year()))
        .map(|naive| Some(naive.and_utc()))
        .ok_or_else(|| InvalidInput::NotATime {
            field,
            raw: crate::domain::echo(raw),
        })
}

fn parse_whole(raw: &str, field: crate::domain::NumberField) -> Result<i32, InvalidInput> {
    raw.trim()
        .parse()
        .map_err(|_| InvalidInput::NotAWholeNumber {
            field,
            raw: crate::domain::echo(raw),
        })
}

impl SaleFields {
    /// A blank form for a new sale: ten units, starting an hour from `now`,
    /// the shop's default bot check.
    pub fn for_new_sale(now: DateTime<Utc>, check_work: i32) -> SaleFields {
        SaleFields {
            stock: "10".into(),
            starts_at: form_time(&(now + chrono::Duration::hours(1))),
            join_check_work: check_work.to_string(),
            ..SaleFields::default()
        }
    }

    /// The form filled in with a sale as it stands, for an edit.
    pub fn of(sale: &SaleSpec) -> SaleFields {
        let cents = sale.price.cents();
        SaleFields {
            name: sale.name.clone(),
            description: sale.description.clone(),
            price: format!("{}.{:02}", cents / 100, cents % 100),
            stock: sale.stock.to_string(),
            per_customer_limit: sale
                .per_customer_limit
                .map(|l| l.to_string())
                .unwrap_or_default(),
            starts_at: form_time(&sale.starts_at),
            ends_at: sale.ends_at.as_ref().map(form_time).unwrap_or_default(),
            queue_mode: if sale.queue_mode {
                "on".into()
            } else {
                String::new()
            },
            queue_opens_at: sale
                .queue_opens_at
                .as_ref()
                .map(form_time)
                .unwrap_or_default(),
            join_check_work: sale.join_check_work.to_string(),
            csrf_token: String::new(),
        }
    }

    /// Whether the form shows queue mode ticked (as typed, even if refused).
    pub fn queue_ticked(&self) -> bool {
        parse_checkbox(&self.queue_mode).unwrap_or(false)
    }

    /// The terms an edit may change (everything but stock), checked;
    /// `check_work` where the bot check's size was left empty.
    pub fn terms(&self, check_work: i32) -> Result<SaleTerms, InvalidInput> {
        self.unchecked_terms(check_work)?.validate()
    }

    /// A new sale: its terms and its opening stock, checked.
    pub fn spec(&self, check_work: i32) -> Result<SaleSpec, InvalidInput> {
        let terms = self.unchecked_terms(check_work)?;
        SaleSpec {
            name: terms.name,
            description: terms.description,
            price: terms.price,
            stock: parse_whole(&self.stock, crate::domain::NumberField::Stock)?,
            per_customer_limit: terms.per_customer_limit,
            starts_at: terms.starts_at,
            ends_at: terms.ends_at,
            queue_mode: terms.queue_mode,
            queue_opens_at: terms.queue_opens_at,
            join_check_work: terms.join_check_work,
        }
        .validate()
    }

    /// Each field read into its type, before the rules across fields.
    fn unchecked_terms(&self, check_work: i32) -> Result<SaleTerms, InvalidInput> {
        let join_check_work = match self.join_check_work.trim() {
            "" => check_work,
            raw => parse_whole(&raw.replace(',', ""), crate::domain::NumberField::CheckWork)?,
        };
        let per_customer_limit = match self.per_customer_limit.trim() {
            "" => None,
            raw => Some(parse_whole(
                raw,
                crate::domain::NumberField::PerCustomerLimit,
            )?),
        };
        let starts_at = parse_form_time(&self.starts_at, crate::domain::TimeField::Start)?
            .ok_or(InvalidInput::NoStart)?;
        Ok(SaleTerms {
            name: self.name.clone(),
            description: self.description.clone(),
            price: Money::parse_decimal(&self.price)?,
            per_customer_limit,
            starts_at,
            ends_at: parse_form_time(&self.ends_at, crate::domain::TimeField::End)?,
            queue_mode: parse_checkbox(&self.queue_mode).ok_or(InvalidInput::NotACheckbox)?,
            queue_opens_at: parse_form_time(
                &self.queue_opens_at,
                crate::domain::TimeField::QueueOpening,
            )?,
            join_check_work,
        })
    }
}

/// A checkbox sends `on` (or the value the page gave it) when ticked and
/// nothing when not; anything else was not sent by our page.
fn parse_checkbox(raw: &str) -> Option<bool> {
    match raw.trim() {
        "" => Some(false),
        "on" | "1" | "true" => Some(true),
        _ => None,
    }
}

/// What the admin typed into the order search, echoed back into the form
/// and kept in the pager's links.
#[derive(Default, serde::Serialize, Deserialize, Clone)]
pub struct OrderSearch {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub email: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub product: String,
    #[serde(default, skip_serializing)]
    pub page: String,
}

impl OrderSearch {
    pub fn page_number(&self) -> i64 {
        page_number(&self.page)
    }

    /// What the admin's order list is narrowed to.
    pub fn filter(&self) -> Result<OrderFilter, AppError> {
        let email = self.email.trim();
        // Postgres refuses NUL even inside a LIKE pattern.
        check_plain_text(
            email,
            crate::domain::TextField::EmailSearchedFor,
            Lines::One,
        )?;
        Ok(OrderFilter {
            email: (!email.is_empty()).then(|| email.chars().take(254).collect()),
            status: match self.status.as_str() {
                "" => None,
                raw => {
                    Some(
                        OrderStatus::parse(raw).ok_or_else(|| InvalidInput::NotAnOrderStatus {
                            raw: crate::domain::echo(raw),
                        })?,
                    )
                }
            },
            product: match self.product.as_str() {
                "" => None,
                raw => Some(raw.parse::<ProductId>()?),
            },
        })
    }
}

/// `?page=` on a paged list.
#[derive(Debug, Deserialize)]
pub struct PageQuery {
    #[serde(default)]
    pub page: String,
}

impl PageQuery {
    pub fn number(&self) -> i64 {
        page_number(&self.page)
    }
}

/// A page number from the query; anything odd means the first page. The cap
/// keeps the row offset far from overflowing.
fn page_number(raw: &str) -> i64 {
    raw.parse::<i64>()
        .ok()
        .filter(|p| (1..=1_000_000).contains(p))
        .unwrap_or(1)
}

/// `?saved=1` on the sale form after a save.
#[derive(Debug, Deserialize)]
pub struct SavedQuery {
    #[serde(default)]
    saved: String,
}

impl SavedQuery {
    pub fn saved(&self) -> bool {
        !self.saved.is_empty()
    }
}

#[cfg(test)]
mod return_path_tests {
    use super::safe_return_path;

    #[test]
    fn only_the_shops_own_paths_are_kept() {
        assert_eq!(
            safe_return_path("/products/5").as_deref(),
            Some("/products/5")
        );
        assert_eq!(
            safe_return_path("/products/5/queue?x=1").as_deref(),
            Some("/products/5/queue?x=1")
        );
        for hostile in [
            "//evil.com",
            "https://evil.com",
            "/\\evil.com",
            "\\/evil.com",
            "/\tevil.com",
            "evil.com",
            "",
            "/login",
            "/login?next=/x",
        ] {
            assert_eq!(safe_return_path(hostile), None, "{hostile:?}");
        }
    }
}

/// A confirmation link's query (`/account/confirm?account=&issued=&code=`).
#[derive(Debug, Default, Deserialize)]
pub struct ConfirmQuery {
    #[serde(default)]
    pub account: String,
    #[serde(default)]
    pub issued: String,
    #[serde(default)]
    pub code: String,
}

impl ConfirmQuery {
    /// The link it names; `None` when a part is missing or garbled, which
    /// confirms nothing like any other bad link.
    pub fn link(&self) -> Option<crate::services::mail::ConfirmLink> {
        let customer = self.account.trim().parse::<CustomerId>().ok()?;
        let issued = self.issued.trim().parse::<i64>().ok()?;
        let code = self.code.trim();
        if code.len() != 64 || !code.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(crate::services::mail::ConfirmLink {
            customer,
            issued,
            code: code.to_ascii_lowercase(),
        })
    }
}
