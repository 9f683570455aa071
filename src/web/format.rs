//! How the pages write times and money. Views call these, and templates call
//! them by path (`crate::web::format::iso(...)`), so every page writes a time
//! or an amount the same way.

use chrono::{DateTime, Utc};

use crate::domain::Money;

/// Shown in the customer's zone by the page script; the text is the UTC fallback.
pub fn timestamp(at: impl std::borrow::Borrow<DateTime<Utc>>) -> String {
    at.borrow().format("%Y-%m-%d %H:%M UTC").to_string()
}

/// The machine-readable time a `<time datetime>` carries.
pub fn iso(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub fn money(cents: impl std::borrow::Borrow<i64>) -> String {
    Money::from_cents(*cents.borrow())
        .unwrap_or_default()
        .to_string()
}
