//! Benchmark customers: seeded in one statement with one password hash
//! (argon2 at its lowest cost: they are fixtures), then signed in through the shop's own form so
//! each holds a real session cookie and the CSRF token of that session.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text};
use futures::{StreamExt, TryStreamExt};
use reqwest::cookie::{CookieStore, Jar};

use crate::qa::harness::Browser;

/// A signed-in customer as a browser holds it: the cookie header and the
/// CSRF token of that session's forms; and the address it comes from, sent
/// as `X-Forwarded-For` to the shop, which trusts the bench's loopback as
/// its proxy: a crowd comes from many addresses, and the door's
/// per-address limits apply to each as in a real drop.
#[derive(Debug, Clone)]
pub(super) struct Customer {
    pub cookie: String,
    pub csrf: String,
    pub address: String,
}

/// Customer `n`'s own IPv4 address (distinct for the first 16 million).
pub(super) fn client_address(n: u64) -> String {
    format!("10.{}.{}.{}", (n >> 16) & 255, (n >> 8) & 255, n & 255)
}

const PASSWORD: &str = "bench-buyer-password";

fn email(n: usize) -> String {
    format!("bench{n}@flashsale.test")
}

/// Inserts customers 1..=count, their addresses confirmed (the waiting
/// rooms take no other), and answers the range of their ids.
pub(super) fn seed(conn: &mut PgConnection, count: usize) -> anyhow::Result<(i64, i64)> {
    #[derive(QueryableByName)]
    struct Range {
        #[diesel(sql_type = BigInt)]
        low: i64,
        #[diesel(sql_type = BigInt)]
        high: i64,
    }
    let hash = fixture_hash(PASSWORD)?;
    let range: Range = diesel::sql_query(
        "WITH made AS (INSERT INTO customers \
             (email, password_hash, role, email_canonical, email_confirmed_at) \
           SELECT 'bench' || n || '@flashsale.test', $1, 'customer', \
             'bench' || n || '@flashsale.test', now() FROM generate_series(1, $2) AS n \
           RETURNING id) \
         SELECT min(id) AS low, max(id) AS high FROM made",
    )
    .bind::<Text, _>(hash)
    .bind::<BigInt, _>(count as i64)
    .get_result(conn)?;
    anyhow::ensure!(
        range.high - range.low + 1 == count as i64,
        "seeded customer ids are not contiguous"
    );
    Ok((range.low, range.high))
}

/// Argon2id at its lowest cost: the benchmark's accounts are fixtures of a
/// scratch database, and thousands of them sign in through the shop's form
/// in seconds (verifying reads the cost from the hash). The shop hashes
/// its own accounts with the defaults.
fn fixture_hash(password: &str) -> anyhow::Result<String> {
    use argon2::password_hash::{rand_core::OsRng, PasswordHasher, SaltString};
    use argon2::{Algorithm, Argon2, Params, Version};
    let params = Params::new(Params::MIN_M_COST, Params::MIN_T_COST, 1, None)
        .map_err(|e| anyhow::anyhow!("argon2 parameters: {e}"))?;
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password(password.as_bytes(), &SaltString::generate(&mut OsRng))
        .map(|hash| hash.to_string())
        .map_err(|e| anyhow::anyhow!("hashing failed: {e}"))
}

/// Signs in the first `count` seeded customers, a few at a time.
pub(super) async fn sign_in_all(base: &str, count: usize) -> anyhow::Result<Vec<Customer>> {
    futures::stream::iter(1..=count)
        .map(|n| sign_in(base, n))
        .buffered(8)
        .try_collect()
        .await
}

async fn sign_in(base: &str, n: usize) -> anyhow::Result<Customer> {
    let jar = Arc::new(Jar::default());
    let client = Browser::client_builder()
        .cookie_provider(jar.clone())
        .timeout(Duration::from_secs(60))
        .build()?;
    let browser = Browser::new(base, client);
    browser.sign_in(&email(n), PASSWORD).await?;
    // Signing in starts a new session with a CSRF token of its own.
    let csrf = browser.csrf().await?;
    let url = base.parse().context("the shop's address")?;
    let cookie = jar
        .cookies(&url)
        .context("no session cookie after signing in")?
        .to_str()?
        .to_string();
    Ok(Customer {
        cookie,
        csrf,
        address: client_address(n as u64),
    })
}
