//! The door in front of sign-up and of each waiting room: what makes a bot
//! pay per account and per place, decided in Postgres.
//!
//! - A proof of work ([ALTCHA](https://altcha.org), PBKDF2): the shop hands
//!   out a signed challenge, the visitor's browser solves it, the form
//!   carries the solution. Its size is the admin's per sale (sign-up's is a
//!   setting). The challenge names its door, so a cheap one does not open a
//!   dearer one, and it expires after ten minutes.
//! - Each solution once: its nonce is written to `spent_challenges` in the
//!   transaction that lets the visitor through, so a replay finds the row.
//! - A limit per client address and door within a window, counted from
//!   `door_passes` under an advisory lock per address and door: exact across
//!   instances, however many requests race.
//!
//! The challenge handed out and the refusals (which never commit) are
//! counted in this process and added to `door_counts` by the jobs: a crowd
//! fetching challenges writes nothing per request.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use altcha::{
    create_challenge, verify_solution, CreateChallengeOptions, Payload, VerifySolutionOptions,
};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Text, Timestamptz};
use hmac::{Hmac, Mac};
use rand::Rng;
use sha2::Sha256;

use crate::config::DoorSettings;
use crate::db::prepared::Prepared;
use crate::db::schema::{customers, door_counts, door_passes, spent_challenges};
use crate::db::{self, PgConn};
use crate::domain::{CustomerId, ProductId};
use crate::error::{AppError, DoorRefusal, Missing};
use crate::services::Shop;

/// PBKDF2 rounds per try. With `work` tries on average this is what a
/// browser spends: well under a second at the default 2,000 on a laptop.
pub const ROUNDS_PER_TRY: u32 = 1_000;
const ALGORITHM: &str = "PBKDF2/SHA-256";
/// Long enough to read a form; short enough that spent nonces are few.
pub const CHALLENGE_LIFETIME: Duration = Duration::from_secs(600);

/// Which door a challenge opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Door {
    SignUp,
    Join(ProductId),
}

impl Door {
    /// Its name in challenges and in `door_passes`.
    pub fn name(self) -> String {
        match self {
            Door::SignUp => "signup".into(),
            Door::Join(product) => format!("join:{product}"),
        }
    }
}

/// The two secrets a challenge is signed with, derived from the session
/// key so every instance of one shop signs alike.
pub struct DoorKeys {
    challenge: String,
    solution: String,
}

impl DoorKeys {
    pub fn derive(session_key: &[u8]) -> DoorKeys {
        let derive = |purpose: &[u8]| {
            let mut mac = Hmac::<Sha256>::new_from_slice(session_key).expect("any key length");
            mac.update(purpose);
            hex::encode(mac.finalize().into_bytes())
        };
        DoorKeys {
            challenge: derive(b"flashsale door challenge"),
            solution: derive(b"flashsale door solution"),
        }
    }
}

impl std::fmt::Debug for DoorKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DoorKeys(..)")
    }
}

/// A new challenge for `door` at the size its admin set, as the JSON the
/// ALTCHA widget reads. A waiting room's size comes from the sale list's
/// cache, so a crowd fetching challenges reads nothing from Postgres.
pub async fn challenge_for(shop: &Shop, door: Door) -> Result<String, AppError> {
    let work = match door {
        Door::SignUp => shop.settings.security.door.signup_work,
        Door::Join(product) => {
            let shelf = shop.sale_cache.shelf(&shop.pool).await?;
            let sale = shelf
                .product(product)
                .ok_or_else(|| AppError::NotFound(Missing::Product(product)))?;
            if !sale.queue_mode {
                return Err(AppError::NotFound(Missing::RoomToJoin {
                    name: sale.name.clone(),
                }));
            }
            sale.join_check_work
        }
    };
    Ok(challenge(&shop.door_keys, &shop.door_counts, door, work))
}

/// What a customer's join brings to the door: their bot check, already
/// checked (the cryptography runs in the request, not in the transaction
/// that writes places), and the client address the limit counts.
#[derive(Debug, Clone)]
pub struct Visit {
    checked: Result<Solved, DoorRefusal>,
    ip: IpAddr,
}

impl Visit {
    /// `payload` as the widget posts it, checked against `door`. A refusal
    /// is kept, not returned: a customer who already holds a place passes
    /// without a check.
    pub fn new(keys: &DoorKeys, door: Door, payload: &str, ip: IpAddr) -> Visit {
        Visit {
            checked: check_solution(keys, door, payload),
            ip,
        }
    }
}

/// The door's counts and limits, for a transaction that lets visitors
/// through away from the request (the waiting room's writer).
#[derive(Debug, Clone)]
pub struct Doorkeeper {
    counts: Arc<DoorCounts>,
    limits: DoorSettings,
}

impl Doorkeeper {
    pub fn of(shop: &Shop) -> Doorkeeper {
        Doorkeeper {
            counts: shop.door_counts.clone(),
            limits: shop.settings.security.door,
        }
    }

    /// Lets `visitors` through the door of `product`'s waiting room inside
    /// the transaction that writes their places, so a place and the spent
    /// solution and counted pass it cost commit together or not at all: a
    /// join that fails spends nothing. Returns those refused, and why; the
    /// rest passed. Confirmed addresses only (one place per person: a
    /// canonical address has at most one confirmed account). Addresses are
    /// taken in order, so two transactions may wait but never deadlock.
    pub fn let_join(
        &self,
        conn: &mut PgConn,
        product: ProductId,
        visitors: &[(CustomerId, &Visit)],
    ) -> Result<HashMap<CustomerId, DoorRefusal>, AppError> {
        let door = Door::Join(product);
        let ids: Vec<i64> = visitors.iter().map(|(c, _)| c.get()).collect();
        let confirmed: HashSet<i64> = customers::table
            .filter(customers::id.eq_any(&ids))
            .filter(customers::email_confirmed_at.is_not_null())
            .select(customers::id)
            .load::<i64>(conn)?
            .into_iter()
            .collect();
        let mut refused = HashMap::new();
        let mut passing: Vec<(CustomerId, &Solved, String)> = Vec::with_capacity(visitors.len());
        for (customer, visit) in visitors {
            let why = match &visit.checked {
                _ if !confirmed.contains(&customer.get()) => DoorRefusal::Unconfirmed,
                Err(why) => *why,
                Ok(solved) => {
                    passing.push((*customer, solved, address_key(visit.ip)));
                    continue;
                }
            };
            refused.insert(*customer, why);
        }
        refused.extend(admit(conn, &self.limits, door, &passing)?);
        for why in refused.values() {
            self.counts.add(door, why.kind());
        }
        Ok(refused)
    }
}

/// Lets `passing` (each with its checked solution and address) through
/// `door` inside the caller's transaction, as one at a time in the order
/// given would be: over its address's limit first, then a solution used
/// before (or earlier in this batch); only those let through spend their
/// solution and count towards their address. Returns those refused, and
/// why. A statement for all of them at each step, not one per visitor: a
/// crowd joining at once comes in batches of hundreds, and these statements
/// run inside the transaction that writes their places.
fn admit<K: Copy>(
    conn: &mut PgConn,
    limits: &DoorSettings,
    door: Door,
    passing: &[(K, &Solved, String)],
) -> QueryResult<Vec<(K, DoorRefusal)>> {
    let mut refused = Vec::new();
    if passing.is_empty() {
        return Ok(refused);
    }
    let mut addresses: Vec<&str> = passing.iter().map(|(_, _, ip)| ip.as_str()).collect();
    addresses.sort_unstable();
    addresses.dedup();
    lock_addresses(conn, door, &addresses)?;
    let nonces: Vec<&str> = passing.iter().map(|(_, s, _)| s.nonce.as_str()).collect();
    let spent_before: HashSet<String> = spent_challenges::table
        .filter(spent_challenges::nonce.eq_any(&nonces))
        .select(spent_challenges::nonce)
        .load::<String>(conn)?
        .into_iter()
        .collect();
    let now = Utc::now();
    let mut counted = passes_counted(conn, limits, door, &addresses, now)?;
    let limit = per_address(limits, door);
    let window = window(limits);
    let mut spending: Vec<(K, &Solved, &str)> = Vec::with_capacity(passing.len());
    let mut spent_here: HashSet<&str> = HashSet::new();
    for (key, solved, address) in passing {
        let passes = counted.entry(address.clone()).or_default();
        let why = if let Some(oldest) = passes.get(limit - 1) {
            too_many(door, *oldest + window - now)
        } else if spent_before.contains(&solved.nonce) || !spent_here.insert(solved.nonce.as_str())
        {
            DoorRefusal::Spent
        } else {
            passes.insert(0, now);
            spending.push((*key, solved, address));
            continue;
        };
        refused.push((*key, why));
    }
    // Spent in nonce order: two writers replaying each other's solutions
    // from different addresses wait on each other's inserts in one
    // direction only. (Every address lock is held already.)
    spending.sort_by(|a, b| a.1.nonce.cmp(&b.1.nonce));
    let passing: Vec<(&Solved, &str)> = spending.iter().map(|(_, s, a)| (*s, *a)).collect();
    let fresh = spend_and_pass(conn, door, &passing, now)?;
    for (key, solved, _) in spending {
        if !fresh.contains(&solved.nonce) {
            // Another transaction spent it since the read above. The place
            // it took in its address's count stays taken for the rest of
            // this batch: stricter than needed, never looser.
            refused.push((key, DoorRefusal::Spent));
        }
    }
    Ok(refused)
}

/// A new challenge for `door`, `work` tries on average, as the JSON the
/// ALTCHA widget reads.
pub fn challenge(keys: &DoorKeys, counts: &DoorCounts, door: Door, work: i32) -> String {
    let work = u32::try_from(work.max(1)).unwrap_or(1);
    // The answer is a counter drawn here, uniformly below twice the work:
    // `work` tries on average, and no floor a script could skip to.
    let counter = rand::thread_rng().gen_range(0..work.saturating_mul(2));
    let expires_at = SystemTime::now() + CHALLENGE_LIFETIME;
    let data = [("door".to_string(), serde_json::Value::from(door.name()))].into();
    let created = create_challenge(CreateChallengeOptions {
        algorithm: ALGORITHM.into(),
        cost: ROUNDS_PER_TRY,
        counter: Some(counter),
        data: Some(data),
        expires_at: Some(unix_seconds(expires_at)),
        hmac_signature_secret: Some(keys.challenge.clone()),
        hmac_key_signature_secret: Some(keys.solution.clone()),
        ..Default::default()
    })
    .expect("PBKDF2 challenges are always created");
    counts.add(door, "challenge issued");
    serde_json::to_string(&created).expect("a challenge serialises")
}

/// Lets a visitor through `door`, inside the caller's transaction: the
/// solution (`payload`, as the widget posts it) must solve a live challenge
/// of this door that was never used, and `ip` must be under its limit.
/// Spends the solution and records the pass; a refusal writes nothing (the
/// checks come before the writes) and is counted here.
pub fn let_through(
    conn: &mut PgConn,
    keys: &DoorKeys,
    counts: &DoorCounts,
    limits: &DoorSettings,
    door: Door,
    payload: &str,
    ip: IpAddr,
) -> Result<(), AppError> {
    let refused = |refusal: DoorRefusal| {
        counts.add(door, refusal.kind());
        AppError::DoorRefused(refusal)
    };
    let solved = check_solution(keys, door, payload).map_err(refused)?;
    match admit(conn, limits, door, &[((), &solved, address_key(ip))])?.pop() {
        Some(((), why)) => Err(refused(why)),
        None => Ok(()),
    }
}

/// Passes from one address at `door` within the window, at most.
fn per_address(limits: &DoorSettings, door: Door) -> usize {
    let limit = match door {
        Door::SignUp => limits.signups_per_address,
        Door::Join(_) => limits.joins_per_address,
    };
    limit.max(1) as usize
}

/// How far back passes count towards an address's limit.
fn window(limits: &DoorSettings) -> chrono::Duration {
    chrono::Duration::from_std(limits.window).unwrap_or(chrono::Duration::hours(1))
}

/// Over the limit, with how long until the oldest pass counted leaves the
/// window (`until`).
fn too_many(door: Door, until: chrono::Duration) -> DoorRefusal {
    DoorRefusal::TooMany {
        signing_up: door == Door::SignUp,
        retry_after: until
            .to_std()
            .unwrap_or_default()
            .max(Duration::from_secs(1)),
    }
}

/// Every address's lock at `door`, in the order given (sorted by the
/// caller), in one statement: the function scan hands the aggregate its
/// rows in array order, so two batches never hold each other's.
fn lock_addresses(conn: &mut PgConn, door: Door, addresses: &[&str]) -> QueryResult<()> {
    let keys: Vec<String> = addresses
        .iter()
        .map(|address| format!("door:{}:{address}", door.name()))
        .collect();
    Prepared::new(
        "SELECT count(pg_advisory_xact_lock(hashtextextended(key, 0))) AS n FROM unnest($1::text[]) AS key",
    )
    .bind::<Array<Text>, _>(keys)
    .execute(conn)?;
    Ok(())
}

/// Each address's passes at `door` that count now, newest first: as many
/// as the limit at most (enough to tell whether it is reached, and when
/// the oldest of them leaves the window). The addresses' locks are held.
fn passes_counted(
    conn: &mut PgConn,
    limits: &DoorSettings,
    door: Door,
    addresses: &[&str],
    now: DateTime<Utc>,
) -> QueryResult<HashMap<String, Vec<DateTime<Utc>>>> {
    #[derive(QueryableByName)]
    struct Counted {
        #[diesel(sql_type = Text)]
        client_ip: String,
        #[diesel(sql_type = Timestamptz)]
        passed_at: DateTime<Utc>,
    }
    let rows: Vec<Counted> = Prepared::new(
        "SELECT a.client_ip, p.passed_at FROM unnest($2::text[]) AS a(client_ip)
         CROSS JOIN LATERAL (
             SELECT passed_at FROM door_passes
             WHERE door = $1 AND client_ip = a.client_ip AND passed_at > $3
             ORDER BY passed_at DESC LIMIT $4
         ) AS p
         ORDER BY p.passed_at DESC",
    )
    .bind::<Text, _>(door.name())
    .bind::<Array<Text>, _>(owned(addresses))
    .bind::<Timestamptz, _>(now - window(limits))
    .bind::<BigInt, _>(per_address(limits, door) as i64)
    .load(conn)?;
    let mut counted: HashMap<String, Vec<DateTime<Utc>>> = HashMap::new();
    for row in rows {
        counted
            .entry(row.client_ip)
            .or_default()
            .push(row.passed_at);
    }
    Ok(counted)
}

/// Spends the solutions, in the order given, and records a pass through
/// `door` at `now` for the address of each one spent here, in one
/// statement (both inside the join's transaction, where a round trip is
/// time every joiner of the batch waits). Returns the nonces spent here;
/// the others' rows were already there, and their addresses get no pass.
fn spend_and_pass(
    conn: &mut PgConn,
    door: Door,
    passing: &[(&Solved, &str)],
    now: DateTime<Utc>,
) -> QueryResult<HashSet<String>> {
    #[derive(QueryableByName)]
    struct Spent {
        #[diesel(sql_type = Text)]
        nonce: String,
    }
    if passing.is_empty() {
        return Ok(HashSet::new());
    }
    let nonces: Vec<String> = passing.iter().map(|(s, _)| s.nonce.clone()).collect();
    let expiries: Vec<DateTime<Utc>> = passing.iter().map(|(s, _)| s.expires_at).collect();
    let addresses: Vec<String> = passing.iter().map(|(_, a)| a.to_string()).collect();
    let spent: Vec<Spent> = Prepared::new(
        "WITH spent AS (
             INSERT INTO spent_challenges (nonce, expires_at)
             SELECT s.nonce, s.expires_at
             FROM unnest($1::text[], $2::timestamptz[]) WITH ORDINALITY AS s(nonce, expires_at, n)
             ORDER BY s.n
             ON CONFLICT DO NOTHING RETURNING nonce
         ), passed AS (
             INSERT INTO door_passes (door, client_ip, passed_at)
             SELECT $3, s.address, $5
             FROM unnest($1::text[], $4::text[]) WITH ORDINALITY AS s(nonce, address, n)
             WHERE s.nonce IN (SELECT nonce FROM spent)
             ORDER BY s.n
         )
         SELECT nonce FROM spent",
    )
    .bind::<Array<Text>, _>(nonces)
    .bind::<Array<Timestamptz>, _>(expiries)
    .bind::<Text, _>(door.name())
    .bind::<Array<Text>, _>(addresses)
    .bind::<Timestamptz, _>(now)
    .load(conn)?;
    Ok(spent.into_iter().map(|s| s.nonce).collect())
}

/// Values a prepared statement keeps until it runs.
fn owned(addresses: &[&str]) -> Vec<String> {
    addresses.iter().map(|a| a.to_string()).collect()
}

/// Checks `payload` answers a live challenge of `door`, without a
/// database: run before anything costly, so an unsolved form costs the
/// shop microseconds. `let_through` checks again where it spends.
pub fn check_answer(
    keys: &DoorKeys,
    counts: &DoorCounts,
    door: Door,
    payload: &str,
) -> Result<(), AppError> {
    check_solution(keys, door, payload)
        .map(|_| ())
        .map_err(|refusal| {
            counts.add(door, refusal.kind());
            AppError::DoorRefused(refusal)
        })
}

/// Who the limit counts: an IPv4 address, or an IPv6 address's /64 (one
/// subscriber's network holds the whole /64, so a script could otherwise
/// take a new address per request).
fn address_key(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
    }
}

/// A checked solution: what must be recorded to spend it.
#[derive(Debug, Clone)]
struct Solved {
    nonce: String,
    expires_at: DateTime<Utc>,
}

/// `payload` as the widget posts it, checked against `door`: empty (the
/// widget did not run) is not solved.
fn check_solution(keys: &DoorKeys, door: Door, payload: &str) -> Result<Solved, DoorRefusal> {
    let payload = payload.trim();
    if payload.is_empty() {
        return Err(DoorRefusal::NotSolved);
    }
    let decoded = STANDARD.decode(payload).map_err(|_| DoorRefusal::Invalid)?;
    let payload: Payload = serde_json::from_slice(&decoded).map_err(|_| DoorRefusal::Invalid)?;
    let parameters = &payload.challenge.parameters;
    let names_this_door = parameters
        .data
        .as_ref()
        .and_then(|data| data.get("door"))
        .and_then(|name| name.as_str())
        == Some(door.name().as_str());
    // An unsigned or foreign challenge fails its signature below; these
    // make sure a signed one is ours as we hand them out.
    if !names_this_door || parameters.algorithm != ALGORITHM || parameters.cost != ROUNDS_PER_TRY {
        return Err(DoorRefusal::Invalid);
    }
    let expires_at = parameters
        .expires_at
        .and_then(|at| DateTime::from_timestamp(i64::try_from(at).ok()?, 0))
        .ok_or(DoorRefusal::Invalid)?;
    let mut options =
        VerifySolutionOptions::new(&payload.challenge, &payload.solution, &keys.challenge);
    options.hmac_key_signature_secret = Some(keys.solution.clone());
    let verdict = verify_solution(options).map_err(|_| DoorRefusal::Invalid)?;
    if verdict.expired {
        return Err(DoorRefusal::Expired);
    }
    if !verdict.verified {
        return Err(DoorRefusal::Invalid);
    }
    Ok(Solved {
        nonce: parameters.nonce.clone(),
        expires_at,
    })
}

fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// Spent solutions whose challenges expired a while ago: a replay of one
/// is refused as expired without the row. The margin covers the checker's
/// whole seconds and the instances' clocks. Returns how many went.
pub fn purge_spent(conn: &mut PgConn) -> QueryResult<usize> {
    diesel::sql_query(
        "DELETE FROM spent_challenges WHERE expires_at < now() - interval '5 minutes'",
    )
    .execute(conn)
}

/// How long passes are kept for the admin's statistics (at least the
/// limit's window, which counts them).
const PASSES_KEPT: Duration = Duration::from_secs(30 * 24 * 3600);

/// Passes older than the statistics keep and the limit counts.
pub fn purge_passes(conn: &mut PgConn, window: Duration) -> QueryResult<usize> {
    let kept = chrono::Duration::from_std(PASSES_KEPT.max(window)).unwrap_or(chrono::Duration::MAX);
    diesel::delete(door_passes::table.filter(door_passes::passed_at.lt(Utc::now() - kept)))
        .execute(conn)
}

/// Challenges handed out and refusals, by door, since the last flush.
/// Losing them (a crash) loses a few seconds of statistics, nothing else.
#[derive(Debug, Default)]
pub struct DoorCounts(Mutex<HashMap<(String, &'static str), i64>>);

impl DoorCounts {
    fn add(&self, door: Door, event: &'static str) {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *counts.entry((door.name(), event)).or_default() += 1;
    }

    /// Adds what was counted to `door_counts`. What fails to be written is
    /// counted again for the next flush.
    pub fn flush(&self, conn: &mut PgConn) -> QueryResult<usize> {
        let taken = std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()));
        let rows: Vec<_> = taken
            .iter()
            .map(|((door, event), count)| {
                (
                    door_counts::door.eq(door.clone()),
                    door_counts::event.eq(*event),
                    door_counts::count.eq(*count),
                )
            })
            .collect();
        if rows.is_empty() {
            return Ok(0);
        }
        let written = diesel::insert_into(door_counts::table)
            .values(&rows)
            .on_conflict((door_counts::door, door_counts::event))
            .do_update()
            .set(
                door_counts::count
                    .eq(door_counts::count + diesel::upsert::excluded(door_counts::count)),
            )
            .execute(conn);
        if written.is_err() {
            let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
            for (key, count) in taken {
                *counts.entry(key).or_default() += count;
            }
        }
        written
    }
}

/// What the admin reads about one sale's door.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DoorStats {
    pub challenges_issued: i64,
    /// Visitors let through (each a solved, unused challenge under the limit).
    pub passed: i64,
    /// Refusals by kind (`DoorRefusal::kind`), most first.
    pub refused: Vec<(String, i64)>,
    /// The addresses that came through most, with how many times.
    pub busiest_addresses: Vec<(String, i64)>,
}

/// Each door's statistics, this process's latest counts added first (the
/// other instances' arrive with their next jobs run).
pub async fn stats_of(shop: &Shop, doors: Vec<Door>) -> Result<Vec<DoorStats>, AppError> {
    let counts = shop.door_counts.clone();
    db::run(&shop.pool, move |conn| {
        counts.flush(conn)?;
        Ok(doors
            .into_iter()
            .map(|door| stats(conn, door))
            .collect::<QueryResult<_>>()?)
    })
    .await
}

/// The door of `door` as recorded (counts flushed by the jobs so far).
pub fn stats(conn: &mut PgConn, door: Door) -> QueryResult<DoorStats> {
    let name = door.name();
    let counted: Vec<(String, i64)> = door_counts::table
        .filter(door_counts::door.eq(&name))
        .select((door_counts::event, door_counts::count))
        .order(door_counts::count.desc())
        .load(conn)?;
    let passed = door_passes::table
        .filter(door_passes::door.eq(&name))
        .count()
        .get_result(conn)?;
    let busiest_addresses = door_passes::table
        .filter(door_passes::door.eq(&name))
        .group_by(door_passes::client_ip)
        .select((door_passes::client_ip, diesel::dsl::count_star()))
        .order(diesel::dsl::count_star().desc())
        .limit(5)
        .load(conn)?;
    let (issued, refused): (Vec<_>, Vec<_>) = counted
        .into_iter()
        .partition(|(event, _)| event == "challenge issued");
    Ok(DoorStats {
        challenges_issued: issued.first().map_or(0, |(_, n)| *n),
        passed,
        refused,
        busiest_addresses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_network_counts_as_one_address() {
        let one: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let other_in_same_64: IpAddr = "2001:db8:1:2:ffff:ffff:ffff:ffff".parse().unwrap();
        let next_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(address_key(one), address_key(other_in_same_64));
        assert_ne!(address_key(one), address_key(next_64));
        assert_eq!(
            address_key("::ffff:203.0.113.9".parse().unwrap()),
            "203.0.113.9"
        );
        assert_eq!(address_key("203.0.113.9".parse().unwrap()), "203.0.113.9");
    }
}
