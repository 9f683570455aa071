//! From its opening a queue-mode sale has its seed committed in Postgres
//! (drawn once, never replaced: the published commitment must stay the one
//! every ticket was issued under) and its queue in Redis: prepared when new,
//! rebuilt from Postgres alone when Redis lost it.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;

use super::admissions::{settle_uses_a_rebuild_missed, used_by_their_orders, Numbers};
use super::entries::record_entries;
use super::local::local;
use super::sale::QueueSale;
use crate::db::schema::{queue_admissions, queue_draws, queue_entries};
use crate::db::{self, PgConn};
use crate::domain::draw::{draw_order, DrawEntry, DrawSeed, Ticket};
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::queue::{Entry, Issued, PassState, QueueSnapshot, QueueState, REBUILD_RENEW};
use crate::services::Shop;

/// Commits the sale's seed unless it is already committed.
pub async fn ensure_seed(shop: &Shop, product: ProductId) -> Result<(), AppError> {
    if local(&shop.redis_prefix).seeded.contains(&product) {
        return Ok(());
    }
    db::run(&shop.pool, move |conn| {
        let seed = DrawSeed::generate();
        diesel::insert_into(queue_draws::table)
            .values((
                queue_draws::product_id.eq(product.get()),
                queue_draws::seed.eq(seed.as_bytes().to_vec()),
                queue_draws::seed_sha256.eq(seed.commitment().as_bytes().to_vec()),
            ))
            .on_conflict_do_nothing()
            .execute(conn)?;
        Ok(())
    })
    .await?;
    local(&shop.redis_prefix).seeded.insert(product);
    Ok(())
}

/// What became of a queue Redis did not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readied {
    /// It was there all along.
    Present,
    Prepared,
    Rebuilt,
    /// Another caller is rebuilding it: try again in a moment.
    Rebuilding,
    /// The sale is over for good (`QueueSale::has_retired`), or over with
    /// no pass open in the record: its queue is freed (or about to be), not
    /// made again, whatever still asks for it (a poll, a buy from a tab
    /// left open, a forged pass), or no running tick might free it again.
    Retired,
}

/// Makes sure Redis has the sale's queue (its seed committed first), and
/// that an undrawn queue has the sale's current setup.
pub async fn ensure_queue(shop: &Shop, sale: &QueueSale) -> Result<Readied, AppError> {
    ensure_seed(shop, sale.product).await?;
    let room = &shop.waiting_room;
    let setup = sale.setup(&shop.settings);
    if room.exists(sale.product).await? {
        // Only this process's own setup is known here; a setup it has not
        // given yet (its first look, or an admin moved the start) is given
        // again, which an undrawn queue takes and a drawn one ignores.
        if local(&shop.redis_prefix).needs_prepare(sale.product, &setup) {
            room.give_setup(sale.product, &setup).await?;
            local(&shop.redis_prefix).prepared_with(sale.product, &setup);
        }
        return Ok(Readied::Present);
    }
    // An ended sale's queue is made again only while the record shows a
    // pass open, which its last tick must end; otherwise nobody needs it,
    // and one made by an instance whose clock is behind, after another
    // freed it, would be left in Redis.
    let now = Utc::now();
    if sale.has_retired(&shop.settings, now)
        || (sale.has_ended(now) && !has_open_admissions(shop, sale.product).await?)
    {
        return Ok(Readied::Retired);
    }
    // Callers that find another rebuilding read nothing from Postgres.
    if room.is_rebuilding(sale.product).await? {
        return Ok(Readied::Rebuilding);
    }
    let readied = if !has_record(shop, sale.product).await? {
        // Nothing to lose: a new queue. Two instances may both get here;
        // preparing is create-unless-exists.
        room.prepare(sale.product, &setup).await?;
        Readied::Prepared
    } else {
        // Its own task: a request whose client hung up must not leave a
        // rebuild part-way (its key held until it expires).
        let (served, sale) = (shop.clone(), sale.clone());
        tokio::spawn(async move {
            let rebuilt = rebuild(&served, &sale).await;
            if let Err(error) = &rebuilt {
                // Its caller may be gone; the next tick tries again.
                tracing::warn!(product = %sale.product, %error, "could not rebuild a waiting room Redis had lost");
            }
            rebuilt
        })
        .await
            .map_err(|e| AppError::Internal(anyhow::anyhow!("rebuild task failed: {e}")))??
    };
    local(&shop.redis_prefix).prepared_with(sale.product, &setup);
    Ok(readied)
}

/// Whether the record still shows a pass open (`issued`).
pub(super) async fn has_open_admissions(shop: &Shop, product: ProductId) -> Result<bool, AppError> {
    db::run(&shop.pool, move |conn| {
        let open = queue_admissions::table
            .filter(queue_admissions::product_id.eq(product.get()))
            .filter(queue_admissions::state.eq("issued"));
        Ok(diesel::select(diesel::dsl::exists(open)).get_result(conn)?)
    })
    .await
}

/// Whether Postgres has anything of the queue a new one would lose.
async fn has_record(shop: &Shop, product: ProductId) -> Result<bool, AppError> {
    db::run(&shop.pool, move |conn| {
        let entries = queue_entries::table.filter(queue_entries::product_id.eq(product.get()));
        let drawn = queue_draws::table
            .find(product.get())
            .filter(queue_draws::drawn_at.is_not_null());
        Ok(
            diesel::select(diesel::dsl::exists(entries).or(diesel::dsl::exists(drawn)))
                .get_result(conn)?,
        )
    })
    .await
}

/// Rebuilds the queue from the record, read once the rebuild key is ours:
/// a rebuilder that died part-way wrote a snapshot no newer than this one.
pub(super) async fn rebuild(shop: &Shop, sale: &QueueSale) -> Result<Readied, AppError> {
    let room = &shop.waiting_room;
    let Some(rebuilder) = room.begin_rebuild(sale.product).await? else {
        return Ok(if room.exists(sale.product).await? {
            Readied::Present
        } else {
            Readied::Rebuilding
        });
    };
    // The key is renewed while Postgres is read: a slow read must not let
    // it expire and a second rebuilder begin over this one's, every time.
    let read = snapshot(shop, sale);
    tokio::pin!(read);
    let mut renewal = tokio::time::interval(REBUILD_RENEW);
    renewal.tick().await;
    let snapshot = loop {
        tokio::select! {
            read = &mut read => break read,
            _ = renewal.tick() => {
                if !rebuilder.renew().await? {
                    return Ok(Readied::Rebuilding);
                }
            }
        }
    };
    let snapshot = match snapshot {
        Ok(snapshot) => snapshot,
        Err(error) => {
            rebuilder.abandon().await;
            return Err(error);
        }
    };
    if rebuilder.complete(&snapshot).await? {
        tracing::warn!(product = %sale.product, entries = snapshot.entries.len(), "rebuilt a waiting room Redis had lost");
        // Purchases that committed after the snapshot and settled while
        // the queue was half built reopened their passes: settled now, or
        // at the rebuild's reconciliation if this fails.
        if let Err(error) = settle_uses_a_rebuild_missed(shop, sale.product).await {
            tracing::warn!(product = %sale.product, %error, "could not settle the passes a rebuild reopened; its reconciliation will");
        }
        Ok(Readied::Rebuilt)
    } else if room.exists(sale.product).await? {
        Ok(Readied::Present)
    } else {
        Ok(Readied::Rebuilding)
    }
}

/// Everything Postgres knows of the sale's queue, read in one snapshot.
pub async fn snapshot(shop: &Shop, sale: &QueueSale) -> Result<QueueSnapshot, AppError> {
    let product = sale.product;
    let setup = sale.setup(&shop.settings);
    let record = db::run(&shop.pool, move |conn| {
        // A pass whose order committed while its claim lived only in the
        // Redis that was lost would come back open, holding a sold unit.
        used_by_their_orders(conn, product, Numbers::All)?;
        read_record(conn, product)
    })
    .await?;
    let now = Utc::now();
    let drawn = record.drawn_at.is_some();
    let line = match (&record.seed, drawn) {
        (Some(seed), true) => draw_order(seed, &record.draw_entries()),
        // Before the draw only the late arrivals are in the line, in
        // arrival order; the draw puts the pre-queue ahead of them.
        _ => {
            let mut late: Vec<&Entry> = record.entries.iter().filter(|e| e.late).collect();
            late.sort_by_key(|e| (e.joined_at, e.seq));
            late.into_iter().map(|e| e.ticket.clone()).collect()
        }
    };
    // Redis kept the pause; the admin action log keeps it too, so a queue
    // rebuilt mid-pause does not start admitting on its own.
    let paused =
        drawn && crate::services::queue_admin::paused_in_record(&shop.pool, product).await?;
    let state = if sale.has_ended(now) {
        QueueState::Closed
    } else if paused {
        QueueState::Paused
    } else if drawn {
        // Sold out is decided again by the tick.
        QueueState::Open
    } else {
        QueueState::Pre
    };
    Ok(QueueSnapshot {
        setup,
        state,
        drawn,
        entries: record.entries,
        line,
        admissions: record.admissions,
    })
}

/// The three tables as one `REPEATABLE READ` snapshot saw them.
pub struct QueueRecord {
    pub seed: Option<DrawSeed>,
    pub drawn_at: Option<DateTime<Utc>>,
    /// By `seq`.
    pub entries: Vec<Entry>,
    /// By number.
    pub admissions: Vec<(Issued, PassState)>,
}

impl QueueRecord {
    pub fn draw_entries(&self) -> Vec<DrawEntry> {
        self.entries
            .iter()
            .map(|e| DrawEntry {
                ticket: e.ticket.clone(),
                seq: e.seq as u64,
                joined_at: e.joined_at,
                late: e.late,
            })
            .collect()
    }
}

type EntryRow = (i64, String, i64, DateTime<Utc>, bool);
type AdmissionRow = (i32, String, DateTime<Utc>, DateTime<Utc>, String);

pub fn read_record(conn: &mut PgConn, product: ProductId) -> Result<QueueRecord, AppError> {
    conn.build_transaction()
        .repeatable_read()
        .read_only()
        .run(|conn| {
            let draw: Option<(Vec<u8>, Option<DateTime<Utc>>)> = queue_draws::table
                .find(product.get())
                .select((queue_draws::seed, queue_draws::drawn_at))
                .first(conn)
                .optional()?;
            let revealed = draw
                .as_ref()
                .is_some_and(|(_, drawn_at)| drawn_at.is_some());
            let rows: Vec<EntryRow> = record_entries(product, revealed)
                .select((
                    queue_entries::customer_id,
                    queue_entries::ticket,
                    queue_entries::seq,
                    queue_entries::joined_at,
                    queue_entries::late,
                ))
                .load(conn)?;
            let admitted: Vec<AdmissionRow> = queue_admissions::table
                .filter(queue_admissions::product_id.eq(product.get()))
                .order(queue_admissions::number.asc())
                .select((
                    queue_admissions::number,
                    queue_admissions::ticket,
                    queue_admissions::issued_at,
                    queue_admissions::expires_at,
                    queue_admissions::state,
                ))
                .load(conn)?;
            Ok::<_, diesel::result::Error>((draw, rows, admitted))
        })
        .map_err(AppError::from)
        .and_then(|(draw, rows, admitted)| record_from_rows(draw, rows, admitted))
}

/// The record's places that arrived after arrival number `seq`, in
/// arrival order, at most `max`.
pub fn places_after(
    conn: &mut PgConn,
    product: ProductId,
    seq: i64,
    max: i64,
) -> Result<Vec<Entry>, AppError> {
    let revealed: bool = diesel::select(diesel::dsl::exists(
        queue_draws::table
            .find(product.get())
            .filter(queue_draws::drawn_at.is_not_null()),
    ))
    .get_result(conn)?;
    let rows: Vec<EntryRow> = record_entries(product, revealed)
        .filter(queue_entries::seq.gt(seq))
        .limit(max)
        .select((
            queue_entries::customer_id,
            queue_entries::ticket,
            queue_entries::seq,
            queue_entries::joined_at,
            queue_entries::late,
        ))
        .load(conn)?;
    rows.into_iter().map(entry_from_row).collect()
}

/// A place of the record, as Redis takes it (confirmed: its row is there).
fn entry_from_row((customer, ticket, seq, joined_at, late): EntryRow) -> Result<Entry, AppError> {
    Ok(Entry {
        customer: CustomerId(customer),
        ticket: stored_ticket(&ticket)?,
        seq,
        joined_at,
        late,
        confirmed: true,
    })
}

fn record_from_rows(
    draw: Option<(Vec<u8>, Option<DateTime<Utc>>)>,
    rows: Vec<EntryRow>,
    admitted: Vec<AdmissionRow>,
) -> Result<QueueRecord, AppError> {
    let (seed, drawn_at) = match draw {
        Some((bytes, drawn_at)) => {
            let bytes: [u8; 32] = bytes
                .try_into()
                .map_err(|_| AppError::Internal(anyhow::anyhow!("a draw seed is not 32 bytes")))?;
            (Some(DrawSeed::from_bytes(bytes)), drawn_at)
        }
        None => (None, None),
    };
    let entries = rows
        .into_iter()
        .map(entry_from_row)
        .collect::<Result<Vec<_>, _>>()?;
    let customers: HashMap<&Ticket, CustomerId> =
        entries.iter().map(|e| (&e.ticket, e.customer)).collect();
    let mut admissions = Vec::with_capacity(admitted.len());
    for (number, ticket, issued_at, expires_at, state) in admitted {
        let ticket = stored_ticket(&ticket)?;
        let customer = *customers.get(&ticket).ok_or_else(|| {
            AppError::Internal(anyhow::anyhow!("an admission names a ticket with no entry"))
        })?;
        let state = match state.as_str() {
            "issued" => PassState::Issued,
            "used" => PassState::Used,
            "lapsed" => PassState::Lapsed,
            other => {
                return Err(AppError::Internal(anyhow::anyhow!(
                    "an admission in state {other:?}"
                )))
            }
        };
        admissions.push((
            Issued {
                number: i64::from(number),
                ticket,
                customer,
                issued_at,
                expires_at,
            },
            state,
        ));
    }
    Ok(QueueRecord {
        seed,
        drawn_at,
        entries,
        admissions,
    })
}

fn stored_ticket(raw: &str) -> Result<Ticket, AppError> {
    Ticket::parse(raw)
        .map_err(|e| AppError::Internal(anyhow::anyhow!("a stored ticket does not parse: {}", e.0)))
}
