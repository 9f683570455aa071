//! The rules every buyer is checked against, the same for a lone purchase
//! and for each buyer of a batch: the sale's window, the stock, the
//! per-customer limit over the customer's live orders (a limited sale sells
//! only to confirmed addresses, so the limit is per person), and for a sale in
//! queue mode the buyer's own open waiting-room pass (read from the locked
//! product row, so no cache decides whether a sale is in queue mode).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::prelude::*;

use crate::db::holdings::{self, Holder};
use crate::db::PgConn;
use crate::domain::{CustomerId, Product, ProductId, Quantity, Refusal, SaleState};
use crate::error::{AppError, Invalid, Missing, PassRefusal};
use crate::services::waiting_room::{lock_open_passes, OpenPass};

/// The sale-window and stock rules for one line. Without the limit, so it
/// can also turn buyers away before the lock from a row read without it.
pub(super) fn refusal_for(
    product: &Product,
    quantity: Quantity,
    now: DateTime<Utc>,
) -> Option<Refusal> {
    match product.sale_state(now) {
        state @ (SaleState::Upcoming | SaleState::Ended) => Some(Refusal::SaleNotOpen {
            product: product.name.clone(),
            state,
        }),
        _ if product.stock < quantity.get() => Some(Refusal::SoldOut {
            product: Some(product.name.clone()),
            available: product.stock,
        }),
        _ => None,
    }
}

/// Every rule for one buyer of a locked product, who as a `holder` of it
/// already holds some units (read only when the product has a limit): the
/// stock left after them, or why they are refused.
pub(super) fn check_buyer(
    product: &Product,
    quantity: Quantity,
    holder: Holder,
    now: DateTime<Utc>,
) -> Result<i32, Refusal> {
    if let Some(refusal) = refusal_for(product, quantity, now) {
        return Err(refusal);
    }
    if let Some(limit) = product.per_customer_limit {
        if !holder.confirmed {
            return Err(Refusal::AddressUnconfirmed {
                product: Some(product.name.clone()),
                limit,
            });
        }
        if holder.units + i64::from(quantity.get()) > i64::from(limit) {
            return Err(Refusal::LimitReached {
                product: Some(product.name.clone()),
                limit,
                already: holder.units,
            });
        }
    }
    Ok(product.stock - quantity.get())
}

/// The pass rule, for a locked product: a sale in queue mode sells only to
/// a buyer presenting the number of their own open pass, for at most the
/// units it covers. `held` is the buyer's pass as the transaction locked it.
pub(super) fn pass_refusal(
    product: &Product,
    quantity: Quantity,
    presented: Option<i32>,
    held: Option<&OpenPass>,
) -> Result<(), AppError> {
    if !product.queue_mode {
        return Ok(());
    }
    let refused = |why| Err(AppError::PassRefused(why));
    let (Some(presented), Some(held)) = (presented, held) else {
        return refused(PassRefusal::NoPass);
    };
    if held.number() != presented {
        return refused(PassRefusal::Forged);
    }
    match *held {
        OpenPass::Used { .. } => refused(PassRefusal::Used),
        OpenPass::Lapsed { .. } => refused(PassRefusal::Lapsed),
        OpenPass::Open { units, .. } if quantity.get() > units => {
            Err(AppError::Invalid(Invalid::BeyondPass { units }))
        }
        OpenPass::Open { .. } => Ok(()),
    }
}

/// The passes of a batch's buyers, locked, when the product is in queue mode.
pub(super) fn passes_of(
    conn: &mut PgConn,
    product: &Product,
    customers: &[CustomerId],
) -> Result<HashMap<CustomerId, OpenPass>, AppError> {
    if !product.queue_mode {
        return Ok(HashMap::new());
    }
    lock_open_passes(conn, product.product_id(), customers)
}

/// Each customer as a holder of `product`: the units of it in their live
/// orders (awaiting payment or paid) and whether their address is confirmed.
pub(super) fn holders_of(
    conn: &mut PgConn,
    customers: &[CustomerId],
    product: ProductId,
) -> Result<HashMap<CustomerId, Holder>, AppError> {
    Ok(holdings::holders(conn, &[product], customers)?
        .remove(&product)
        .unwrap_or_default())
}

/// Locks the product's row for the rest of the transaction.
pub(super) fn lock_product(conn: &mut PgConn, product: ProductId) -> Result<Product, AppError> {
    crate::db::schema::products::table
        .find(product.get())
        .for_update()
        .select(Product::as_select())
        .first(conn)
        .optional()?
        .ok_or_else(|| AppError::NotFound(Missing::Product(product)))
}
