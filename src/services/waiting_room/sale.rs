//! A sale in queue mode, as the waiting room sees it: when joining opens,
//! when the draw happens and when it ends. Read from the shelf (the sale
//! cache); every decision that matters is taken again in Postgres.

use chrono::{DateTime, Utc};

use crate::domain::{Product, ProductId};
use crate::error::{AppError, Conflict, Missing};
use crate::services::catalog::queue_opening;
use crate::services::Shop;

#[derive(Debug, Clone)]
pub struct QueueSale {
    pub product: ProductId,
    pub name: String,
    pub opens_at: DateTime<Utc>,
    pub starts_at: DateTime<Utc>,
    pub ends_at: Option<DateTime<Utc>>,
    /// Units a pass covers at most: the per-customer limit (queue mode requires one).
    pub limit: i64,
}

impl QueueSale {
    /// None for a sale in open mode.
    pub fn of(product: &Product) -> Option<QueueSale> {
        if !product.queue_mode {
            return None;
        }
        Some(QueueSale {
            product: product.product_id(),
            name: product.name.clone(),
            opens_at: queue_opening(product.sale_starts_at, product.queue_opens_at),
            starts_at: product.sale_starts_at,
            ends_at: product.sale_ends_at,
            limit: i64::from(product.per_customer_limit.unwrap_or(1).max(1)),
        })
    }

    pub fn is_open(&self, now: DateTime<Utc>) -> bool {
        now >= self.opens_at
    }

    pub fn has_ended(&self, now: DateTime<Utc>) -> bool {
        self.ends_at.is_some_and(|end| now >= end)
    }
}

/// The sale `product` in queue mode, from the shelf (no Postgres read
/// unless the shelf is due for its refresh).
pub async fn queue_sale(shop: &Shop, product: ProductId) -> Result<QueueSale, AppError> {
    let shelf = shop.sale_cache.shelf(&shop.pool).await?;
    let row = shelf
        .product(product)
        .ok_or_else(|| AppError::NotFound(Missing::Product(product)))?;
    QueueSale::of(row).ok_or_else(|| not_in_queue_mode(&row.name))
}

pub fn not_open_yet(name: &str, opens_at: DateTime<Utc>) -> AppError {
    Conflict::WaitingRoomNotOpen {
        name: name.to_string(),
        opens_at,
    }
    .into()
}

pub fn closed(name: &str) -> AppError {
    Conflict::WaitingRoomClosed {
        name: name.to_string(),
    }
    .into()
}

pub fn sold_out(name: &str) -> AppError {
    Conflict::WaitingRoomSoldOut {
        name: name.to_string(),
    }
    .into()
}

pub fn not_in_queue_mode(name: &str) -> AppError {
    Conflict::NoWaitingRoom {
        name: name.to_string(),
    }
    .into()
}
