//! Mass sign-in for the benchmark's seeded customers: one statement opens a
//! real server-side session per customer, and each session's cookie is
//! sealed here exactly as the shop seals it after its sign-in form (the
//! same entries, AES-256-GCM under the same session key), so the shop
//! verifies these cookies like any signed-in browser's: the cookie must
//! open under its key, and the session row behind it must be live.
//!
//! Signing 50,000 customers in through the form would cost as many
//! password checks and round trips; this costs one INSERT and one
//! encryption per customer. `check_signed_in` proves, before a run relies
//! on them, that the shop accepts such a cookie for a page and a buy.

use std::collections::HashMap;
use std::time::Duration;

use actix_web::cookie::{Cookie, CookieJar, Key};
use anyhow::Context;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bytea, Text, Timestamptz};
use rand::rngs::OsRng;
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::customers::Customer;
use crate::web::session_cookie::COOKIE_NAME;

/// The cookie's entry names, as `web::session` writes them after its
/// sign-in form (private there; `check_signed_in` fails if they drift).
const ACCOUNT_ENTRY: &str = "account";
const CSRF_ENTRY: &str = "csrf";
const TOKEN_ENTRY: &str = "session_token";
const EXPIRES_ENTRY: &str = "session_expires";

/// Longer than any run; the shop's own default is 12 hours.
const SESSION_LIFETIME: Duration = Duration::from_secs(6 * 3600);

#[derive(QueryableByName)]
struct Account {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    email: String,
}

/// Signs in the seeded customers `bench1 ..= bench{count}` (see
/// `customers::seed`): a session row each, inserted in one statement, and
/// the cookie and CSRF token a browser would hold after signing in.
/// `session_key_hex` is the `SESSION_KEY` the shop was started with.
pub(super) fn sign_in_many(
    db_url: &str,
    session_key_hex: &str,
    count: usize,
) -> anyhow::Result<Vec<Customer>> {
    let key = Key::try_from(hex::decode(session_key_hex)?.as_slice())
        .context("the session key is shorter than 64 bytes")?;
    let mut conn = PgConnection::establish(db_url)?;
    let accounts: Vec<Account> = diesel::sql_query(
        "SELECT c.id, c.email FROM generate_series(1, $1) AS n \
         JOIN customers c ON c.email = 'bench' || n || '@flashsale.test' ORDER BY n",
    )
    .bind::<BigInt, _>(count as i64)
    .load(&mut conn)?;
    anyhow::ensure!(
        accounts.len() == count,
        "{count} customers asked for, {} seeded",
        accounts.len()
    );
    // Postgres keeps microseconds: the cookie's copy must equal the row's.
    let expires_at =
        DateTime::from_timestamp_micros((Utc::now() + SESSION_LIFETIME).timestamp_micros())
            .context("session expiry out of range")?;
    let tokens: Vec<String> = accounts.iter().map(|_| new_token()).collect();
    let hashes: Vec<Vec<u8>> = tokens
        .iter()
        .map(|token| Sha256::digest(token.as_bytes()).to_vec())
        .collect();
    let inserted = diesel::sql_query(
        "INSERT INTO sessions (id_hash, customer_id, created_at, last_seen_at, expires_at) \
         SELECT s.id_hash, s.customer_id, now(), now(), $3 \
         FROM unnest($1::bytea[], $2::bigint[]) AS s(id_hash, customer_id)",
    )
    .bind::<Array<Bytea>, _>(hashes)
    .bind::<Array<BigInt>, _>(accounts.iter().map(|a| a.id).collect::<Vec<_>>())
    .bind::<Timestamptz, _>(expires_at)
    .execute(&mut conn)?;
    anyhow::ensure!(inserted == count, "{inserted} of {count} sessions opened");
    accounts
        .iter()
        .zip(&tokens)
        .map(|(account, token)| customer(&key, account, token, expires_at))
        .collect()
}

/// A session token as the shop draws one: 256 random bits, base64url.
fn new_token() -> String {
    let mut bytes = [0u8; 32];
    OsRng.fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The cookie the shop's sign-in leaves in the browser: every entry a JSON
/// text, the whole map sealed in the private jar under the session key.
fn customer(
    key: &Key,
    account: &Account,
    token: &str,
    expires_at: DateTime<Utc>,
) -> anyhow::Result<Customer> {
    let csrf = uuid::Uuid::new_v4().simple().to_string();
    let json = |value: serde_json::Value| value.to_string();
    let entries: HashMap<&str, String> = HashMap::from([
        (
            ACCOUNT_ENTRY,
            json(serde_json::json!({
                "id": account.id,
                "email": account.email,
                "role": crate::domain::Role::Customer,
                // The bench's customers are seeded confirmed.
                "confirmed": true,
            })),
        ),
        (EXPIRES_ENTRY, json(expires_at.timestamp_micros().into())),
        (TOKEN_ENTRY, json(token.into())),
        (CSRF_ENTRY, json(csrf.as_str().into())),
    ]);
    let mut jar = CookieJar::new();
    jar.private_mut(key)
        .add(Cookie::new(COOKIE_NAME, serde_json::to_string(&entries)?));
    let sealed = jar
        .delta()
        .next()
        .context("the sealed cookie went missing")?;
    Ok(Customer {
        cookie: sealed.encoded().stripped().to_string(),
        csrf,
        address: super::customers::client_address(account.id as u64),
    })
}

/// Before a run relies on minted cookies: the shop shows `customer` a
/// signed-in page, and answers their buy of `product` with the 303 of an
/// order taken (one unit of the product's stock is spent on it).
pub(super) async fn check_signed_in(
    address: &str,
    customer: &Customer,
    product: i64,
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let page = client
        .get(format!("{address}/products/{product}"))
        .header(reqwest::header::COOKIE, &customer.cookie)
        .send()
        .await?;
    let status = page.status();
    let signed_in = page.text().await?.contains("action=\"/logout\"");
    anyhow::ensure!(
        status == reqwest::StatusCode::OK && signed_in,
        "a minted cookie's product page answered {status}, signed in: {signed_in}"
    );
    let key = uuid::Uuid::new_v4().simple().to_string();
    let buy = client
        .post(format!("{address}/products/{product}/buy"))
        .header(reqwest::header::COOKIE, &customer.cookie)
        .header("Idempotency-Key", &key)
        .form(&[
            ("quantity", "1"),
            ("csrf_token", customer.csrf.as_str()),
            ("idempotency_key", key.as_str()),
        ])
        .send()
        .await?;
    anyhow::ensure!(
        buy.status() == reqwest::StatusCode::SEE_OTHER,
        "a minted cookie's buy answered {}",
        buy.status()
    );
    Ok(())
}
