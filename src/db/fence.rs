//! The one way stock changes in Postgres: carrying the lock holder's fencing
//! token, so a holder whose lock lapsed while it was paused cannot write over
//! a later holder's work.

use chrono::Utc;
use diesel::prelude::*;

use super::schema::products;
use super::PgConn;
use crate::domain::ProductId;
use crate::error::AppError;
use crate::lock::Lease;

/// Adds `delta` to `product`'s stock and records the holder's token, unless
/// a holder with the same or a newer token has written the row already.
/// Returns the stock afterwards. Must run after the row was read `FOR UPDATE`.
pub fn change_stock(
    conn: &mut PgConn,
    lease: &Lease,
    product: ProductId,
    delta: i32,
) -> Result<i32, AppError> {
    let token = lease.token(product)?;
    let written: Option<i32> = diesel::update(
        products::table
            .find(product.get())
            .filter(products::fence.lt(token)),
    )
    .set((
        products::stock.eq(products::stock + delta),
        products::fence.eq(token),
        products::updated_at.eq(Utc::now()),
    ))
    .returning(products::stock)
    .get_result(conn)
    .optional()?;
    match written {
        Some(stock_after) => Ok(stock_after),
        None => Err(refused(conn, product)?),
    }
}

/// The error for a stock write its fencing token did not allow, naming the
/// token that holds the row now.
pub fn refused(conn: &mut PgConn, product: ProductId) -> Result<AppError, AppError> {
    let fence: i64 = products::table
        .find(product.get())
        .select(products::fence)
        .first(conn)?;
    Ok(AppError::Fenced { product, fence })
}
