//! Writing entries' rows: a join is answered only once its row is durably
//! committed, and a commit per join would cap joins at the disk's flush
//! rate. So the joins of a process queue here, and whichever finds nobody
//! writing becomes a writer: it takes everything queued (up to
//! `QUEUE_JOIN_MAX`), inserts it in one multi-row `INSERT ... ON CONFLICT
//! DO NOTHING` and commits once; joins that arrive meanwhile go in the next
//! commit. Two writers at most, so one's statement runs while the other
//! waits for its flush (as purchases' `group` does). A committed batch's
//! places are confirmed in Redis together (a CONFIRM per product, not one
//! per joiner) by a task of its own, and then each joiner is answered. The
//! writer waits for that confirm, so the joins arriving meanwhile make the
//! next commit larger, but at most `JOIN_CONFIRM_WAIT`: a slow Redis must
//! not hold rows back (the tick's `longest_join` counts on them committing
//! promptly).
//!
//! A row that did not go in because the customer's row is already there
//! (the tick wrote it for a joiner that looked dead, or the same customer
//! clicked twice) counts as written when it names the same ticket.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Bool, Text, Timestamptz};
use tokio::sync::oneshot;

use crate::config::JOIN_CONFIRM_WAIT;
use crate::db::schema::{queue_draws, queue_entries};
use crate::db::{self, PgConn, PgPool};
use crate::domain::draw::Ticket;
use crate::domain::{CustomerId, ProductId};
use crate::error::AppError;
use crate::queue::{Confirmed, Entry, WaitingRoom, CONFIRM_BATCH};
use crate::services::Shop;

/// Insert transactions a process runs at once.
const WRITERS: usize = 2;

type Answer = Result<Written, AppError>;

/// What became of a place's row.
#[derive(Debug)]
pub enum Written {
    /// It is there, with this ticket, and this is what Redis answered when
    /// the writer confirmed it (an error leaves the place unconfirmed, for
    /// the tick to confirm).
    Written(Result<Confirmed, AppError>),
    /// Another row stands in its way: the customer's own from before (Redis
    /// lost that place), or another's with the same seq or ticket.
    Blocked,
}

struct Queued {
    product: ProductId,
    entry: Entry,
    answer: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Pending {
    queued: Vec<Queued>,
    writers: usize,
}

#[derive(Default)]
struct EntryWriter {
    pending: Mutex<Pending>,
}

impl EntryWriter {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One writer queue per database (Redis prefix) in the process.
fn writer_for(shop: &Shop) -> Arc<EntryWriter> {
    static ALL: OnceLock<Mutex<HashMap<String, Arc<EntryWriter>>>> = OnceLock::new();
    let mut all = ALL
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    all.entry(shop.redis_prefix.clone()).or_default().clone()
}

/// Writes the entry's row, sharing a commit with the process's other
/// joins; answered once that commit is durable.
pub async fn write_entry(shop: &Shop, product: ProductId, entry: Entry) -> Answer {
    let writer = writer_for(shop);
    let (answer, answered) = oneshot::channel();
    let start = {
        let mut pending = writer.pending();
        pending.queued.push(Queued {
            product,
            entry,
            answer,
        });
        (pending.writers < WRITERS).then(|| {
            pending.writers += 1;
            // Made here, so a task dropped before it first runs still hands
            // its place back.
            Writing {
                writer: writer.clone(),
                writing: true,
            }
        })
    };
    if let Some(writing) = start {
        // Its own task: a joiner who hangs up must not cancel a commit
        // other joiners wait for.
        tokio::spawn(write_queued(
            shop.pool.clone(),
            shop.waiting_room.clone(),
            writing,
            shop.settings.queue_join_max,
        ));
    }
    // A writer that vanished mid-commit (its runtime stopped) may have
    // written the row: the joiner's place stays unconfirmed, and the tick
    // confirms it if the row is there or writes it if not.
    answered.await.unwrap_or_else(|_| {
        Err(AppError::OutcomeUnknown(
            "the waiting room's insert lost its answer".into(),
        ))
    })
}

/// One of the writers. Dropped any way but by finding nothing queued, the
/// last one tells the joiners still queued (none of them started) to try again.
struct Writing {
    writer: Arc<EntryWriter>,
    writing: bool,
}

impl Writing {
    fn next(&mut self, max: usize) -> Vec<Queued> {
        let mut pending = self.writer.pending();
        let take = pending.queued.len().min(max);
        if take == 0 {
            pending.writers -= 1;
            self.writing = false;
        }
        pending.queued.drain(..take).collect()
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        if !self.writing {
            return;
        }
        let mut pending = self.writer.pending();
        pending.writers -= 1;
        if pending.writers > 0 {
            return;
        }
        for queued in pending.queued.drain(..) {
            let _ = queued.answer.send(Err(AppError::Unavailable(
                "the waiting room's writer stopped".into(),
            )));
        }
    }
}

async fn write_queued(pool: PgPool, room: WaitingRoom, mut writing: Writing, max: usize) {
    loop {
        let batch = writing.next(max.max(1));
        if batch.is_empty() {
            return;
        }
        let (rows, answers): (Vec<(ProductId, Entry)>, Vec<_>) = batch
            .into_iter()
            .map(|q| ((q.product, q.entry), q.answer))
            .unzip();
        let written = db::run(&pool, move |conn| {
            let written = db::transaction(conn, |conn| insert_entries(conn, &rows))?;
            Ok((rows, written))
        })
        .await;
        match written {
            Ok((rows, written)) => {
                // The rows are committed whatever becomes of this task: a
                // joiner whose answer is lost with it hears the outcome is
                // unknown, and the tick confirms the place.
                let room = room.clone();
                let confirming = tokio::spawn(async move {
                    let confirmed = confirm_committed(&room, &rows, &written).await;
                    for (answer, confirmed) in answers.into_iter().zip(confirmed) {
                        let _ = answer.send(Ok(match confirmed {
                            Some(confirmed) => Written::Written(confirmed),
                            None => Written::Blocked,
                        }));
                    }
                });
                let _ = tokio::time::timeout(JOIN_CONFIRM_WAIT, confirming).await;
            }
            Err(error) => {
                for answer in answers {
                    let _ = answer.send(Err(error.duplicate()));
                }
            }
        }
    }
}

/// Confirms in Redis the places of `rows` whose row is now committed (where
/// `written`), one CONFIRM per product and chunk, the products at once;
/// `None` for the rest (their rows are blocked). Each place gets its own
/// code from the script, as a lone confirm would, and a failed call fails
/// only the places it carried.
async fn confirm_committed(
    room: &WaitingRoom,
    rows: &[(ProductId, Entry)],
    written: &[bool],
) -> Vec<Option<Result<Confirmed, AppError>>> {
    let mut calls: Vec<(ProductId, Vec<usize>)> = Vec::new();
    for (i, (product, _)) in rows.iter().enumerate() {
        if !written[i] {
            continue;
        }
        match calls
            .iter_mut()
            .find(|(p, places)| p == product && places.len() < CONFIRM_BATCH)
        {
            Some((_, places)) => places.push(i),
            None => calls.push((*product, vec![i])),
        }
    }
    let answered =
        futures::future::join_all(calls.into_iter().map(|(product, places)| async move {
            let entries: Vec<Entry> = places.iter().map(|&i| rows[i].1.clone()).collect();
            let codes = room.confirm_all(product, &entries).await;
            (places, codes)
        }))
        .await;
    let mut answers: Vec<Option<Result<Confirmed, AppError>>> =
        std::iter::repeat_with(|| None).take(rows.len()).collect();
    for (places, codes) in answered {
        match codes {
            // `confirm_all` answers a code per place, or fails.
            Ok(codes) => {
                for (i, code) in places.into_iter().zip(codes) {
                    answers[i] = Some(Ok(code));
                }
            }
            Err(error) => {
                for i in places {
                    answers[i] = Some(Err(error.duplicate()));
                }
            }
        }
    }
    answers
}

#[derive(QueryableByName)]
struct Key {
    #[diesel(sql_type = BigInt)]
    product_id: i64,
    #[diesel(sql_type = BigInt)]
    customer_id: i64,
}

/// Inserts `rows` (which may name one customer twice), and says for each
/// whether its row is now there with its ticket.
pub fn insert_entries(
    conn: &mut PgConn,
    rows: &[(ProductId, Entry)],
) -> Result<Vec<bool>, AppError> {
    let products: Vec<i64> = rows.iter().map(|(p, _)| p.get()).collect();
    let customers: Vec<i64> = rows.iter().map(|(_, e)| e.customer.get()).collect();
    let tickets: Vec<String> = rows
        .iter()
        .map(|(_, e)| e.ticket.as_str().to_string())
        .collect();
    let seqs: Vec<i64> = rows.iter().map(|(_, e)| e.seq).collect();
    let joined: Vec<DateTime<Utc>> = rows.iter().map(|(_, e)| e.joined_at).collect();
    let late: Vec<bool> = rows.iter().map(|(_, e)| e.late).collect();
    let inserted: Vec<Key> = diesel::sql_query(
        "INSERT INTO queue_entries (product_id, customer_id, ticket, seq, joined_at, late)
         SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::bigint[], $5::timestamptz[], $6::bool[])
         ON CONFLICT DO NOTHING
         RETURNING product_id, customer_id",
    )
    .bind::<Array<BigInt>, _>(&products)
    .bind::<Array<BigInt>, _>(&customers)
    .bind::<Array<Text>, _>(&tickets)
    .bind::<Array<BigInt>, _>(&seqs)
    .bind::<Array<Timestamptz>, _>(&joined)
    .bind::<Array<Bool>, _>(&late)
    .load(conn)?;
    let inserted: std::collections::HashSet<(i64, i64)> = inserted
        .into_iter()
        .map(|k| (k.product_id, k.customer_id))
        .collect();
    let mut written: Vec<bool> = rows
        .iter()
        .map(|(p, e)| inserted.contains(&(p.get(), e.customer.get())))
        .collect();
    if written.iter().all(|w| *w) {
        return Ok(written);
    }
    // A row that went in earlier (another commit's, seen by this new
    // statement) is this join's if it carries this join's ticket.
    let missing: Vec<usize> = (0..rows.len()).filter(|&i| !written[i]).collect();
    let found: Vec<(i64, i64, String)> = queue_entries::table
        .filter(
            queue_entries::ticket.eq_any(
                missing
                    .iter()
                    .map(|&i| tickets[i].clone())
                    .collect::<Vec<_>>(),
            ),
        )
        .filter(
            queue_entries::product_id
                .eq_any(missing.iter().map(|&i| products[i]).collect::<Vec<_>>()),
        )
        .select((
            queue_entries::product_id,
            queue_entries::customer_id,
            queue_entries::ticket,
        ))
        .load(conn)?;
    for i in missing {
        written[i] = found
            .iter()
            .any(|(p, c, t)| *p == products[i] && *c == customers[i] && *t == tickets[i]);
    }
    Ok(written)
}

/// The customer's committed place, if any.
pub async fn committed_entry(
    shop: &Shop,
    product: ProductId,
    customer: CustomerId,
) -> Result<Option<Entry>, AppError> {
    entry_of(shop, product, customer, false).await
}

/// The customer's place among the record's (`entries_in_record`), if any:
/// a pre-queue row the revealed draw went without is no place.
pub async fn recorded_entry(
    shop: &Shop,
    product: ProductId,
    customer: CustomerId,
) -> Result<Option<Entry>, AppError> {
    entry_of(shop, product, customer, true).await
}

async fn entry_of(
    shop: &Shop,
    product: ProductId,
    customer: CustomerId,
    in_record: bool,
) -> Result<Option<Entry>, AppError> {
    db::run(&shop.pool, move |conn| {
        let mut row = queue_entries::table
            .filter(queue_entries::customer_id.eq(customer.get()))
            .filter(queue_entries::product_id.eq(product.get()))
            .into_boxed();
        if in_record {
            let revealed = queue_draws::table
                .find(product.get())
                .filter(queue_draws::drawn_at.is_not_null());
            row = row.filter(
                queue_entries::late
                    .or(queue_entries::drawn)
                    .or(diesel::dsl::not(diesel::dsl::exists(revealed))),
            );
        }
        let row: Option<(String, i64, DateTime<Utc>, bool)> = row
            .select((
                queue_entries::ticket,
                queue_entries::seq,
                queue_entries::joined_at,
                queue_entries::late,
            ))
            .first(conn)
            .optional()?;
        row.map(|(ticket, seq, joined_at, late)| {
            Ok(Entry {
                customer,
                ticket: Ticket::parse(&ticket).map_err(|e| {
                    AppError::Internal(anyhow::anyhow!("a stored ticket does not parse: {}", e.0))
                })?,
                seq,
                joined_at,
                late,
                confirmed: true,
            })
        })
        .transpose()
    })
    .await
}

/// Deletes the rows of places Redis could not put in the line (pre-queue
/// places lost before a draw that went ahead without them: CONFIRM keeps
/// their tickets in `:forget` until this has run), unless a pass was
/// issued to one. Their joiners were never told they had them.
pub async fn forget_entries(shop: &Shop, product: ProductId) -> Result<usize, AppError> {
    let room = &shop.waiting_room;
    let tickets = room.to_forget(product).await?;
    if tickets.is_empty() {
        return Ok(0);
    }
    let names: Vec<String> = tickets.iter().map(|t| t.as_str().to_string()).collect();
    db::run(&shop.pool, move |conn| {
        let tickets = names;
        diesel::delete(
            queue_entries::table
                .filter(queue_entries::product_id.eq(product.get()))
                .filter(queue_entries::ticket.eq_any(tickets))
                .filter(diesel::dsl::not(diesel::dsl::exists(
                    crate::db::schema::queue_admissions::table
                        .filter(crate::db::schema::queue_admissions::product_id.eq(product.get()))
                        .filter(
                            crate::db::schema::queue_admissions::ticket.eq(queue_entries::ticket),
                        ),
                ))),
        )
        .execute(conn)?;
        Ok(())
    })
    .await?;
    room.forgotten(product, &tickets).await?;
    Ok(tickets.len())
}

/// A sale's places as its record has them, in arrival order: once the draw
/// is revealed, the pre-queue places it took and the late ones, never a
/// pre-queue place that committed after the draw went ahead without it.
pub fn record_entries(
    product: ProductId,
    revealed: bool,
) -> queue_entries::BoxedQuery<'static, diesel::pg::Pg> {
    entries_in_record(product, revealed).order(queue_entries::seq.asc())
}

/// The same places in no order, for counting them.
pub fn entries_in_record(
    product: ProductId,
    revealed: bool,
) -> queue_entries::BoxedQuery<'static, diesel::pg::Pg> {
    let entries = queue_entries::table
        .filter(queue_entries::product_id.eq(product.get()))
        .into_boxed();
    match revealed {
        true => entries.filter(queue_entries::late.or(queue_entries::drawn)),
        false => entries,
    }
}
