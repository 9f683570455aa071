//! Admin stock adjustments and the per-product ledger they land in.

use diesel::prelude::*;

use super::catalog::MAX_STOCK;
use super::Shop;
use crate::db::fence::change_stock;
use crate::db::models::NewStockChange;
use crate::db::schema::{products, stock_history};
use crate::db::{self, PgPool};
use crate::domain::{
    check_plain_text, CustomerId, InvalidInput, Lines, ProductId, StockChange, StockReason,
};
use crate::error::{AppError, Conflict, Invalid, Missing};
use crate::services::action_log::{self, ActionKind, AdminAction};
use crate::services::stock_gate::resync_locked;

/// A checked request to add (positive) or remove (negative) units, with the
/// reason an accountant will read later.
#[derive(Debug, Clone)]
pub struct Adjustment {
    pub delta: i32,
    pub note: String,
}

impl Adjustment {
    pub fn parse(delta: &str, note: &str) -> Result<Adjustment, InvalidInput> {
        // i32's parser takes one optional sign, so "+5" passes and "+-5" does not.
        let delta: i32 = delta
            .trim()
            .parse()
            .ok()
            .filter(|d: &i32| *d != 0 && d.unsigned_abs() <= MAX_STOCK as u32)
            .ok_or_else(|| InvalidInput::NotAStockChange {
                raw: crate::domain::echo(delta),
            })?;
        let note = note.trim();
        check_plain_text(note, crate::domain::TextField::StockNote, Lines::One)?;
        if note.is_empty() || note.chars().count() > MAX_NOTE_CHARS {
            return Err(InvalidInput::StockNoteLength {
                max: MAX_NOTE_CHARS,
            });
        }
        Ok(Adjustment {
            delta,
            note: note.to_string(),
        })
    }
}

/// The longest reason an adjustment may give, in characters.
pub const MAX_NOTE_CHARS: usize = 500;

/// Applies `adjustment` under the same Redis lock and row lock as a sale, so
/// a removal can never take units a buyer is being handed at that moment.
/// The admin who asked is recorded in the same transaction. Returns the
/// stock afterwards.
pub async fn adjust_stock(
    shop: &Shop,
    product: ProductId,
    adjustment: Adjustment,
    admin: CustomerId,
) -> Result<i32, AppError> {
    let pool = shop.pool.clone();
    let gate = shop.gate.clone();
    let adjusted = shop
        .locks
        .with_locks(vec![product], move |lease| async move {
            let started = std::time::Instant::now();
            let stock_after = db::run(&pool, move |conn| {
                conn.transaction(|conn| {
                    let stock: i32 = products::table
                        .find(product.get())
                        .for_update()
                        .select(products::stock)
                        .first(conn)
                        .optional()?
                        .ok_or_else(|| AppError::NotFound(Missing::Product(product)))?;
                    let stock_after = stock + adjustment.delta;
                    if stock_after < 0 {
                        // Units already sold or reserved are not in `stock`, so
                        // this also keeps an adjustment from undoing a sale.
                        return Err(Conflict::StockTooLow {
                            stock,
                            removing: -adjustment.delta,
                        }
                        .into());
                    }
                    // Units a waiting room's open passes cover were promised
                    // to their holders: the issuer reads the stock under this
                    // row's lock too, so this count is exact.
                    let promised = units_under_open_passes(conn, product)?;
                    if adjustment.delta < 0 && stock_after < promised {
                        return Err(Conflict::StockPromised { promised, stock }.into());
                    }
                    if stock_after > MAX_STOCK {
                        return Err(AppError::Invalid(Invalid::StockAboveMax {
                            max: MAX_STOCK,
                            stock,
                        }));
                    }
                    change_stock(conn, &lease, product, adjustment.delta)?;
                    diesel::insert_into(stock_history::table)
                        .values(NewStockChange {
                            product_id: product.get(),
                            order_id: None,
                            delta: adjustment.delta,
                            stock_after,
                            reason: StockReason::AdminAdjust.as_str(),
                            note: &adjustment.note,
                        })
                        .execute(conn)?;
                    let detail = format!(
                        "{:+} units ({stock} → {stock_after}): {}",
                        adjustment.delta, adjustment.note
                    );
                    let action =
                        AdminAction::on_product(admin, ActionKind::StockAdjust, product, detail);
                    action_log::record(conn, &action)?;
                    lease.ensure_valid()?;
                    Ok(stock_after)
                })
            })
            .await?;
            crate::metrics::transaction_time("adjust", started.elapsed());
            resync_locked(gate.as_ref(), &pool, product).await?;
            Ok(stock_after)
        })
        .await;
    // Even after an error: the commit may have gone through unanswered.
    super::sale_cache::invalidate();
    adjusted
}

/// One page of a product's ledger, newest first, and how many rows it has.
pub async fn history_of(
    pool: &PgPool,
    product: ProductId,
    offset: i64,
    limit: i64,
) -> Result<(Vec<StockChange>, i64), AppError> {
    db::run(pool, move |conn| {
        let rows = stock_history::table
            .filter(stock_history::product_id.eq(product.get()))
            .order(stock_history::id.desc())
            .offset(offset)
            .limit(limit)
            .select(StockChange::as_select())
            .load(conn)?;
        let total = stock_history::table
            .filter(stock_history::product_id.eq(product.get()))
            .count()
            .get_result(conn)?;
        Ok((rows, total))
    })
    .await
}

/// Units the open waiting-room passes of `product` cover.
fn units_under_open_passes(
    conn: &mut crate::db::PgConn,
    product: ProductId,
) -> Result<i32, AppError> {
    use crate::db::schema::queue_admissions as a;
    let units: Option<i64> = a::table
        .filter(a::product_id.eq(product.get()))
        .filter(a::state.eq("issued"))
        .select(diesel::dsl::sum(a::units))
        .first(conn)?;
    Ok(i32::try_from(units.unwrap_or(0)).unwrap_or(i32::MAX))
}
