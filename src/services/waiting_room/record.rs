//! A waiting room's published draw (`draw.json`, the draw page): read from
//! one `REPEATABLE READ` snapshot of `queue_draws`, `queue_entries` and
//! `queue_admissions`, so the entries, the commitments and the admissions
//! always belong to the same moment. The order is recomputed from the seed
//! every time (the positions the draw wrote must agree with it, and
//! `verify` checks that admissions followed it), and the seed is served
//! only once it is revealed.
//!
//! Each process keeps the record it built for `FRESH_FOR`: a crowd
//! refreshing the draw page costs Postgres one snapshot a second, not one
//! per view. One build at a time per process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::prelude::*;

use crate::db::schema::{products, queue_admissions, queue_draws, queue_entries};
use crate::domain::draw::{
    draw_order, DrawAdmission, DrawEntry, DrawRecord, DrawSeed, EntriesCommitment, PassState,
    SeedCommitment, Ticket,
};
use crate::domain::ProductId;
use crate::error::{AppError, Missing};
use crate::services::Shop;

/// How long a built record is served as it is.
pub const FRESH_FOR: Duration = Duration::from_secs(1);

/// The published draw of `product`, at most `FRESH_FOR` old. Not found for a
/// sale not in queue mode, and for one whose waiting room has not opened
/// (nothing is committed to before then).
pub async fn draw_record(shop: &Shop, product: ProductId) -> Result<Arc<DrawRecord>, AppError> {
    // Which sales have a draw comes from the sale cache, so an address
    // guessed for every id costs no Postgres read.
    let shelf = shop.sale_cache.shelf(&shop.pool).await?;
    match shelf.product(product) {
        Some(sale) if sale.queue_mode => {}
        _ => return Err(no_draw(product)),
    }
    let key = (shop.redis_prefix.clone(), product);
    if let Some(record) = cached(&key) {
        return Ok(record);
    }
    let _turn = building().lock().await;
    if let Some(record) = cached(&key) {
        return Ok(record);
    }
    let record = Arc::new(
        crate::db::run(&shop.pool, move |conn| read_snapshot(conn, product))
            .await?
            .ok_or_else(|| no_draw(product))?,
    );
    kept()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, (Instant::now(), record.clone()));
    Ok(record)
}

fn no_draw(product: ProductId) -> AppError {
    AppError::NotFound(Missing::Draw(product))
}

/// Keyed by the shop's key prefix too: tests run several shops (each on
/// its own database, with the same product ids) in one process.
type Key = (String, ProductId);
type Kept = Mutex<HashMap<Key, (Instant, Arc<DrawRecord>)>>;

fn kept() -> &'static Kept {
    static KEPT: OnceLock<Kept> = OnceLock::new();
    KEPT.get_or_init(Kept::default)
}

fn building() -> &'static tokio::sync::Mutex<()> {
    static BUILDING: OnceLock<tokio::sync::Mutex<()>> = OnceLock::new();
    BUILDING.get_or_init(|| tokio::sync::Mutex::new(()))
}

fn cached(key: &Key) -> Option<Arc<DrawRecord>> {
    let mut kept = kept().lock().unwrap_or_else(|e| e.into_inner());
    kept.retain(|_, (built, _)| built.elapsed() < FRESH_FOR);
    kept.get(key).map(|(_, record)| record.clone())
}

/// `queue_draws`' seed, the two commitments, and when it was frozen and drawn.
type DrawRow = (
    Vec<u8>,
    Vec<u8>,
    Option<Vec<u8>>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);
type EntryRow = (String, i64, DateTime<Utc>, bool);
type AdmissionRow = (String, DateTime<Utc>, String);

/// The draw as one snapshot has it; None when no seed is committed yet.
fn read_snapshot(
    conn: &mut crate::db::PgConn,
    product: ProductId,
) -> Result<Option<DrawRecord>, AppError> {
    conn.build_transaction()
        .repeatable_read()
        .read_only()
        .run(|conn| {
            let starts_at: Option<DateTime<Utc>> = products::table
                .find(product.get())
                .select(products::sale_starts_at)
                .first(conn)
                .optional()?;
            let Some(starts_at) = starts_at else {
                return Ok(None);
            };
            let draw: Option<DrawRow> = queue_draws::table
                .find(product.get())
                .select((
                    queue_draws::seed,
                    queue_draws::seed_sha256,
                    queue_draws::entries_sha256,
                    queue_draws::frozen_at,
                    queue_draws::drawn_at,
                ))
                .first(conn)
                .optional()?;
            let Some(draw) = draw else {
                return Ok(None);
            };
            let entries: Vec<(String, i64, DateTime<Utc>, bool, bool)> = queue_entries::table
                .filter(queue_entries::product_id.eq(product.get()))
                .order(queue_entries::seq)
                .select((
                    queue_entries::ticket,
                    queue_entries::seq,
                    queue_entries::joined_at,
                    queue_entries::late,
                    queue_entries::drawn,
                ))
                .load(conn)?;
            // Once drawn, the line is the places the draw took and the late
            // ones (a room drawn before issue #37 may keep pre-queue rows
            // its draw went without).
            let revealed = draw.4.is_some();
            let entries: Vec<EntryRow> = entries
                .into_iter()
                .filter(|(_, _, _, late, drawn)| !revealed || *late || *drawn)
                .map(|(ticket, seq, joined_at, late, _)| (ticket, seq, joined_at, late))
                .collect();
            let admissions: Vec<AdmissionRow> = queue_admissions::table
                .filter(queue_admissions::product_id.eq(product.get()))
                .order(queue_admissions::number)
                .select((
                    queue_admissions::ticket,
                    queue_admissions::issued_at,
                    queue_admissions::state,
                ))
                .load(conn)?;
            Ok(Some(record_from_rows(
                product, starts_at, draw, entries, admissions,
            )?))
        })
}

/// Rows as Postgres keeps them, into the published shape. A row that does
/// not fit its domain type is the database's fault, not the reader's.
fn record_from_rows(
    product: ProductId,
    starts_at: DateTime<Utc>,
    (seed, seed_sha256, entries_sha256, frozen_at, drawn_at): DrawRow,
    entries: Vec<EntryRow>,
    admissions: Vec<AdmissionRow>,
) -> Result<DrawRecord, AppError> {
    let corrupt = |what: String| AppError::Internal(anyhow::anyhow!("draw of {product}: {what}"));
    let bytes32 = |bytes: Vec<u8>, what: &str| -> Result<[u8; 32], AppError> {
        bytes
            .try_into()
            .map_err(|_| corrupt(format!("{what} is not 32 bytes")))
    };
    let seed = DrawSeed::from_bytes(bytes32(seed, "the seed")?);
    let seed_sha256 = SeedCommitment::parse_hex(&hex::encode(&seed_sha256))
        .map_err(|e| corrupt(format!("the commitment: {e}")))?;
    let entries_sha256 = match entries_sha256 {
        Some(bytes) => Some(EntriesCommitment::from_bytes(bytes32(
            bytes,
            "the frozen list's commitment",
        )?)),
        None => None,
    };
    let ticket = |raw: &str| Ticket::parse(raw).map_err(|e| corrupt(format!("ticket: {e}")));
    let entries = entries
        .into_iter()
        .map(|(raw, seq, joined_at, late)| {
            Ok(DrawEntry {
                ticket: ticket(&raw)?,
                seq: u64::try_from(seq).map_err(|_| corrupt(format!("seq {seq}")))?,
                joined_at,
                late,
            })
        })
        .collect::<Result<Vec<_>, AppError>>()?;
    let admissions = admissions
        .into_iter()
        .map(|(raw, issued_at, state)| {
            Ok(DrawAdmission {
                ticket: ticket(&raw)?,
                issued_at,
                state: match state.as_str() {
                    "issued" => PassState::Issued,
                    "used" => PassState::Used,
                    "lapsed" => PassState::Lapsed,
                    other => return Err(corrupt(format!("admission state {other:?}"))),
                },
            })
        })
        .collect::<Result<Vec<_>, AppError>>()?;
    // Before the reveal the seed is the shop's secret, and there is no order.
    let (seed, order) = match drawn_at {
        Some(_) => {
            let order = draw_order(&seed, &entries);
            (Some(seed), order)
        }
        None => (None, Vec::new()),
    };
    Ok(DrawRecord {
        product,
        starts_at,
        seed_sha256,
        seed,
        entries_sha256,
        frozen_at,
        entries,
        order,
        admissions,
    })
}
