//! The demo sale that `flashsale seed-demo` (and the README's run command) sets up.

use chrono::{Duration, Utc};
use diesel::prelude::*;

use super::accounts::{ensure_admin, sign_up};
use super::catalog::{create_product, SaleSpec};
use crate::db::schema::products;
use crate::db::{self, PgPool};
use crate::domain::{Email, Money, Password, Role};
use crate::error::AppError;

pub const DEMO_ADMIN_EMAIL: &str = "admin@flashsale.test";
pub const DEMO_ADMIN_PASSWORD: &str = "admin-password";
pub const DEMO_CUSTOMER_PASSWORD: &str = "customer-password";
pub const DEMO_CUSTOMERS: [&str; 3] = [
    "alice@flashsale.test",
    "bob@flashsale.test",
    "carol@flashsale.test",
];

/// Seeds once: running it again leaves existing accounts and products alone.
pub async fn seed_demo(pool: &PgPool) -> Result<Vec<String>, AppError> {
    let mut report = Vec::new();
    ensure_admin(
        pool,
        Email::parse(DEMO_ADMIN_EMAIL)?,
        Password::parse(DEMO_ADMIN_PASSWORD)?,
    )
    .await?;
    report.push(format!(
        "admin    {DEMO_ADMIN_EMAIL} / {DEMO_ADMIN_PASSWORD}"
    ));
    for email in DEMO_CUSTOMERS {
        match sign_up(
            pool,
            Email::parse(email)?,
            Password::parse(DEMO_CUSTOMER_PASSWORD)?,
            Role::Customer,
        )
        .await
        {
            Ok(_) | Err(AppError::Conflict { .. }) => {
                report.push(format!("customer {email} / {DEMO_CUSTOMER_PASSWORD}"))
            }
            Err(other) => return Err(other),
        }
    }
    let now = Utc::now();
    let sales = [
        SaleSpec {
            name: "Midnight Runner sneakers".into(),
            description: "Hand-stitched limited edition. Only five pairs, one per customer.".into(),
            price: Money::from_cents(12_900)?,
            stock: 5,
            per_customer_limit: Some(1),
            starts_at: now,
            ends_at: None,
            queue_mode: false,
            queue_opens_at: None,
        },
        SaleSpec {
            name: "Studio headphones".into(),
            description: "Closed-back monitors at 60% off while stock lasts. Two per customer."
                .into(),
            price: Money::from_cents(7_950)?,
            stock: 100,
            per_customer_limit: Some(2),
            starts_at: now,
            ends_at: Some(now + Duration::days(7)),
            queue_mode: false,
            queue_opens_at: None,
        },
        SaleSpec {
            name: "Mechanical keyboard".into(),
            description: "Opens in one hour. Fifty units.".into(),
            price: Money::from_cents(9_900)?,
            stock: 50,
            per_customer_limit: None,
            starts_at: now + Duration::hours(1),
            ends_at: None,
            queue_mode: false,
            queue_opens_at: None,
        },
    ];
    for spec in sales {
        let name = spec.name.clone();
        let existing: Option<i64> = db::run(pool, move |conn| {
            Ok(products::table
                .filter(products::name.eq(name))
                .select(products::id)
                .first(conn)
                .optional()?)
        })
        .await?;
        let id = match existing {
            Some(id) => id,
            None => create_product(pool, spec.clone()).await?.id,
        };
        report.push(format!(
            "product  {id}: {} ({} units)",
            spec.name, spec.stock
        ));
    }
    Ok(report)
}
