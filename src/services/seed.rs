//! The demo sales that `flashsale seed-demo` (and the README's run command) sets up, with a waiting-room drop.

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
            Ok(_) | Err(AppError::Conflict(_)) => {
                report.push(format!("customer {email} / {DEMO_CUSTOMER_PASSWORD}"))
            }
            Err(other) => return Err(other),
        }
        // The demo's own people: their addresses are the operator's to vouch
        // for, so they can join the demo's waiting room at once.
        super::confirmation::confirm_as_operator(pool, email).await?;
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
            join_check_work: crate::services::catalog::DEFAULT_JOIN_CHECK_WORK,
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
            join_check_work: crate::services::catalog::DEFAULT_JOIN_CHECK_WORK,
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
            join_check_work: crate::services::catalog::DEFAULT_JOIN_CHECK_WORK,
        },
    ];
    for spec in sales.into_iter().chain([waiting_room_drop(now)?]) {
        let name = spec.name.clone();
        // The drop is the demo's moment: a drop that has started already
        // (an earlier demo's) does not count, a fresh one is set up.
        let upcoming_only = spec.queue_mode;
        let existing: Option<i64> = db::run(pool, move |conn| {
            let named = products::table.filter(products::name.eq(name));
            let query = if upcoming_only {
                named
                    .filter(products::sale_starts_at.gt(Utc::now()))
                    .select(products::id)
                    .into_boxed()
            } else {
                named.select(products::id).into_boxed()
            };
            Ok(query.first(conn).optional()?)
        })
        .await?;
        let id = match existing {
            Some(id) => id,
            None => create_product(pool, spec.clone()).await?.id,
        };
        report.push(format!(
            "product  {id}: {} ({} units){}",
            spec.name,
            spec.stock,
            if spec.queue_mode {
                ", waiting room open now, the drop starts in a few minutes"
            } else {
                ""
            }
        ));
    }
    Ok(report)
}

/// Minutes from the demo's start to the drop's: time to sign in as two or
/// three customers and join its waiting room.
pub const DEMO_DROP_IN_MINUTES: i64 = 5;

/// The feature that sets the shop apart: a queue-mode drop whose waiting
/// room is open when the demo starts and whose sale starts a few minutes
/// later, fewer units than the demo has customers.
fn waiting_room_drop(now: chrono::DateTime<Utc>) -> Result<SaleSpec, AppError> {
    let starts_at = now + Duration::minutes(DEMO_DROP_IN_MINUTES);
    Ok(SaleSpec {
        name: "Signed vinyl drop".into(),
        description: "Two signed first pressings, one per customer, sold through a waiting room: join before the start, and a published draw orders everyone at the start."
            .into(),
        price: Money::from_cents(4_500)?,
        stock: 2,
        per_customer_limit: Some(1),
        starts_at,
        ends_at: Some(starts_at + Duration::hours(2)),
        queue_mode: true,
        queue_opens_at: Some(now - Duration::minutes(1)),
        join_check_work: crate::services::catalog::DEFAULT_JOIN_CHECK_WORK,
    })
}
