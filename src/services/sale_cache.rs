//! The sale rows the shop pages show, kept in this process for a moment, so
//! a crowd refreshing the sale list and product pages costs Postgres one
//! read per refresh instead of one per view.
//!
//! - A copy is served as it is for `REFRESH_AFTER`; after that the first
//!   reader refreshes it while everyone else keeps getting the copy, and no
//!   one is served a copy older than `SERVE_AT_MOST` (they wait for the
//!   refresh instead). One refresh at a time per process: a crowd never
//!   sends Postgres more than one of these reads at once.
//! - The copy holds every product, so a product it lacks does not exist (or
//!   was created by another process less than `SERVE_AT_MOST` ago): an
//!   unknown id is answered from memory, never by a read per request.
//! - A write in this process (`invalidate`) makes every copy in the process
//!   stale at once; other processes see it when their copy ages out.
//!
//! Memory: one copy of the `products` rows per process, the same rows the
//! sale list shows in full anyway.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use diesel::prelude::*;

use crate::db::schema::products;
use crate::db::{self, PgPool};
use crate::domain::{Product, ProductId};
use crate::error::AppError;

/// How long a copy is served before a reader refreshes it.
pub const REFRESH_AFTER: Duration = Duration::from_millis(500);
/// No page is built from a copy older than this, counted from when its read
/// began: the bound other instances' edits are seen within.
pub const SERVE_AT_MOST: Duration = Duration::from_secs(1);

/// Bumped by every edit of a sale this process makes (creating, editing,
/// adjusting stock; purchases and restores need not: the pages read units
/// left from the gate, and every copy ages out within a second). Process-wide, not
/// per `Shop`: some writers (seeding, the command line, tests) hold only a
/// pool, and a copy that missed a write made in its own process would be
/// wrong for up to a second for no reason. A second `Shop` in the same
/// process (tests) only pays one extra read for it.
static WRITES: AtomicU64 = AtomicU64::new(0);

/// How many sale edits this process has made: a copy of anything read
/// before the count moved is stale.
pub fn writes() -> u64 {
    WRITES.load(Ordering::Acquire)
}

/// Makes every copy in this process stale now. Call it after a write to
/// `products` commits.
pub fn invalidate() {
    WRITES.fetch_add(1, Ordering::AcqRel);
}

/// Every product as one read saw it, in the sale list's order.
pub struct Shelf {
    products: Vec<Arc<Product>>,
    by_id: HashMap<i64, usize>,
    /// When the read began: the rows are at least this fresh.
    read_at: Instant,
    /// `WRITES` when the read began; a copy from before a write is stale.
    writes: u64,
}

impl Shelf {
    pub fn products(&self) -> &[Arc<Product>] {
        &self.products
    }

    pub fn product(&self, id: ProductId) -> Option<&Arc<Product>> {
        self.by_id.get(&id.get()).map(|&i| &self.products[i])
    }

    fn serves(&self, within: Duration) -> bool {
        self.writes == WRITES.load(Ordering::Acquire) && self.read_at.elapsed() < within
    }
}

#[derive(Default)]
pub struct SaleCache {
    shelf: RwLock<Option<Arc<Shelf>>>,
    /// Held by whoever is refreshing: the single flight.
    refreshing: tokio::sync::Mutex<()>,
    /// When the last refresh failed, so the readers queued behind it share
    /// its answer instead of each trying Postgres again in turn.
    failed_at: Mutex<Option<Instant>>,
}

impl SaleCache {
    pub fn new() -> SaleCache {
        SaleCache::default()
    }

    /// A copy of every product, at most `SERVE_AT_MOST` old.
    pub async fn shelf(&self, pool: &PgPool) -> Result<Arc<Shelf>, AppError> {
        let current = self.current();
        if let Some(shelf) = &current {
            if shelf.serves(REFRESH_AFTER) {
                return Ok(shelf.clone());
            }
        }
        if let Some(shelf) = current.filter(|s| s.serves(SERVE_AT_MOST)) {
            // Due for a refresh but still fit to serve: the first reader
            // refreshes, the others keep the copy meanwhile.
            return match self.refreshing.try_lock() {
                // A refresh that failed (or took long) leaves the copy to
                // serve only while it is still young enough.
                Ok(_turn) => match self.refresh(pool).await {
                    Ok(fresh) => Ok(fresh),
                    Err(_) if shelf.serves(SERVE_AT_MOST) => Ok(shelf),
                    Err(error) => Err(error),
                },
                Err(_) => Ok(shelf),
            };
        }
        let asked = Instant::now();
        let _turn = self.refreshing.lock().await;
        // Whoever held the turn may have just refreshed it, or just failed to.
        if let Some(shelf) = self.current().filter(|s| s.serves(REFRESH_AFTER)) {
            return Ok(shelf);
        }
        if self.failed_since(asked) {
            return Err(AppError::Unavailable(
                "the sale list could not be read from the database".into(),
            ));
        }
        self.refresh(pool).await
    }

    /// The copy as the last reader left it, however old, without reading
    /// Postgres: for a background job that must not cost an idle shop a
    /// read, but should see what the pages see.
    pub fn peek(&self) -> Option<Arc<Shelf>> {
        self.current()
    }

    fn current(&self) -> Option<Arc<Shelf>> {
        self.shelf.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn failed_since(&self, asked: Instant) -> bool {
        self.failed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at >= asked)
    }

    /// Reads every product; call it holding `refreshing`.
    async fn refresh(&self, pool: &PgPool) -> Result<Arc<Shelf>, AppError> {
        let writes = WRITES.load(Ordering::Acquire);
        let read_at = Instant::now();
        let rows = match load_products(pool).await {
            Ok(rows) => rows,
            Err(error) => {
                *self.failed_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                return Err(error);
            }
        };
        let products: Vec<Arc<Product>> = rows.into_iter().map(Arc::new).collect();
        let by_id = products
            .iter()
            .enumerate()
            .map(|(i, p)| (p.id, i))
            .collect();
        let shelf = Arc::new(Shelf {
            products,
            by_id,
            read_at,
            writes,
        });
        *self.shelf.write().unwrap_or_else(|e| e.into_inner()) = Some(shelf.clone());
        Ok(shelf)
    }
}

/// Every product row, by start then id: what a copy holds, and what
/// `catalog::list_products` reads fresh for the admin pages. The read lives
/// here so calls go one way, catalog -> sale_cache.
pub(crate) async fn load_products(pool: &PgPool) -> Result<Vec<Product>, AppError> {
    db::run(pool, |conn| {
        Ok(products::table
            .order((products::sale_starts_at.asc(), products::id.asc()))
            .select(Product::as_select())
            .load(conn)?)
    })
    .await
}
