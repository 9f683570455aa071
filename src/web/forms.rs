//! Every form the shop accepts, as it arrives (all text, nothing trusted),
//! and the pure parser that turns it into the checked input its handler
//! passes on. Pure on purpose: property tests and the fuzz target call them
//! without a server, and a handler does nothing with a form before they pass.
//!
//! Ids are parsed here and in paths alike: text that is not a positive id
//! names no row, so it is a 404, not a form mistake.

use chrono::{DateTime, Datelike, NaiveDateTime, Utc};
use serde::Deserialize;

use crate::domain::CardNumber;
use crate::domain::{
    check_plain_text, Email, InvalidInput, Lines, Money, OrderId, OrderStatus, Password, ProductId,
    Quantity,
};
use crate::error::AppError;
use crate::services::catalog::{SaleSpec, SaleTerms};
use crate::services::orders::OrderFilter;
use crate::services::stock::Adjustment;

pub use super::pages::{OrderSearch, SaleFields};

pub fn parse_product_id(raw: &str) -> Result<ProductId, AppError> {
    raw.parse()
        .map_err(|e: InvalidInput| AppError::NotFound(e.0))
}

pub fn parse_order_id(raw: &str) -> Result<OrderId, AppError> {
    raw.parse()
        .map_err(|e: InvalidInput| AppError::NotFound(e.0))
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
}

#[derive(Debug)]
pub struct Credentials {
    pub email: Email,
    pub password: Password,
}

impl CredentialsForm {
    pub fn sign_up(&self) -> Result<Credentials, AppError> {
        Ok(Credentials {
            email: Email::parse(&self.email)?,
            password: Password::parse(&self.password)?,
        })
    }

    /// A password no account could have is answered like a wrong one, so the
    /// form does not tell which rule an attacker's guess broke.
    pub fn sign_in(&self) -> Result<Credentials, AppError> {
        Ok(Credentials {
            email: Email::parse(&self.email)?,
            password: Password::parse(&self.password).map_err(|_| {
                AppError::Forbidden(
                    "That email and password do not match an account. Check them and try again."
                        .into(),
                )
            })?,
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
}

impl BuyForm {
    pub fn quantity(&self) -> Result<Quantity, AppError> {
        Ok(Quantity::parse(&self.quantity)?)
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

/// The sale form sends times as `datetime-local` values in UTC (it says so).
/// Four-digit years only: Postgres cannot store every year chrono can read,
/// and a sale in year 200000 is a typo.
fn parse_form_time(raw: &str, field: &str) -> Result<Option<DateTime<Utc>>, InvalidInput> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"]
        .iter()
        .find_map(|format| NaiveDateTime::parse_from_str(raw, format).ok())
        .filter(|naive| (1970..=9999).contains(&naive.year()))
        .map(|naive| Some(naive.and_utc()))
        .ok_or_else(|| {
            InvalidInput(format!(
                "The {field} “{}” is not a date and time: write it like 2026-12-01T09:00.",
                raw.chars().take(40).collect::<String>()
            ))
        })
}

fn parse_whole(raw: &str, what: &str) -> Result<i32, InvalidInput> {
    raw.trim().parse().map_err(|_| {
        InvalidInput(format!(
            "The {what} “{}” is not a whole number.",
            raw.chars().take(40).collect::<String>()
        ))
    })
}

impl SaleFields {
    /// The terms an edit may change (everything but stock), checked.
    pub fn terms(&self) -> Result<SaleTerms, InvalidInput> {
        self.unchecked_terms()?.validate()
    }

    /// A new sale: its terms and its opening stock, checked.
    pub fn spec(&self) -> Result<SaleSpec, InvalidInput> {
        let terms = self.unchecked_terms()?;
        SaleSpec {
            name: terms.name,
            description: terms.description,
            price: terms.price,
            stock: parse_whole(&self.stock, "stock")?,
            per_customer_limit: terms.per_customer_limit,
            starts_at: terms.starts_at,
            ends_at: terms.ends_at,
        }
        .validate()
    }

    /// Each field read into its type, before the rules across fields.
    fn unchecked_terms(&self) -> Result<SaleTerms, InvalidInput> {
        let per_customer_limit = match self.per_customer_limit.trim() {
            "" => None,
            raw => Some(parse_whole(raw, "per-customer limit")?),
        };
        let starts_at = parse_form_time(&self.starts_at, "start")?.ok_or_else(|| {
            InvalidInput("Say when the sale starts (UTC), for example 2026-12-01T09:00.".into())
        })?;
        Ok(SaleTerms {
            name: self.name.clone(),
            description: self.description.clone(),
            price: Money::parse_decimal(&self.price)?,
            per_customer_limit,
            starts_at,
            ends_at: parse_form_time(&self.ends_at, "end")?,
        })
    }
}

impl OrderSearch {
    /// What the admin's order list is narrowed to.
    pub fn filter(&self) -> Result<OrderFilter, AppError> {
        let email = self.email.trim();
        // Postgres refuses NUL even inside a LIKE pattern.
        check_plain_text(email, "email searched for", Lines::One)?;
        Ok(OrderFilter {
            email: (!email.is_empty()).then(|| email.chars().take(254).collect()),
            status: match self.status.as_str() {
                "" => None,
                raw => Some(OrderStatus::parse(raw).ok_or_else(|| {
                    AppError::Invalid(format!(
                        "There is no order status “{}”.",
                        raw.chars().take(40).collect::<String>()
                    ))
                })?),
            },
            product: match self.product.as_str() {
                "" => None,
                raw => Some(raw.parse::<ProductId>()?),
            },
        })
    }
}
