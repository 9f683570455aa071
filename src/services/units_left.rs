//! Units left as the shop pages show them: the stock gate's counts, read for
//! every product in one MGET at most every `READ_EVERY` per process, so a
//! crowd refreshing the sale list costs Redis a few reads a second rather
//! than a hundred keys per view.
//!
//! One read at a time: while one reader asks the gate, the others show the
//! counts read before if they are under `SHOW_AT_MOST` old, or the cached
//! rows' own stock (itself at most a second old), never waiting on a gate
//! that is slow or down.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::domain::{Product, ProductId};
use crate::gate::StockGate;
use crate::services::sale_cache;

/// Counts younger than this are shown as they are.
pub const READ_EVERY: Duration = Duration::from_millis(200);
/// Counts older than this are never shown.
pub const SHOW_AT_MOST: Duration = Duration::from_secs(1);
/// How long a read may take before the page shows the rows' stock instead.
const READ_WAIT: Duration = Duration::from_millis(250);

struct Counts {
    /// When the read began: the counts are at least this fresh.
    read_at: Instant,
    /// `sale_cache::writes()` when the read began: an admin's stock
    /// adjustment since makes these counts stale at once.
    writes: u64,
    by_product: HashMap<i64, i64>,
}

#[derive(Default)]
pub struct UnitsLeft {
    counts: RwLock<Option<Arc<Counts>>>,
    reading: tokio::sync::Mutex<()>,
}

impl UnitsLeft {
    pub fn new() -> UnitsLeft {
        UnitsLeft::default()
    }

    /// The gate's count for each of `shown`, or `None` where it has none to
    /// offer young enough; `every` is the whole sale list, read at once.
    pub async fn counts(
        &self,
        gate: &StockGate,
        every: &[Arc<Product>],
        shown: &[Arc<Product>],
    ) -> Vec<Option<i64>> {
        let current = self.current();
        let usable = |counts: &Option<Arc<Counts>>, within: Duration| {
            counts
                .as_ref()
                .filter(|c| c.read_at.elapsed() < within && c.writes == sale_cache::writes())
                .cloned()
        };
        let counts = match usable(&current, READ_EVERY) {
            Some(fresh) => Some(fresh),
            None => match self.reading.try_lock() {
                Ok(_turn) => self
                    .read(gate, every)
                    .await
                    .or_else(|| usable(&current, SHOW_AT_MOST)),
                Err(_) => usable(&current, SHOW_AT_MOST),
            },
        };
        shown
            .iter()
            .map(|p| {
                counts
                    .as_ref()
                    .and_then(|c| c.by_product.get(&p.id).copied())
            })
            .collect()
    }

    fn current(&self) -> Option<Arc<Counts>> {
        self.counts
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// One MGET of every product's count; call it holding `reading`.
    async fn read(&self, gate: &StockGate, every: &[Arc<Product>]) -> Option<Arc<Counts>> {
        let ids: Vec<ProductId> = every.iter().map(|p| p.product_id()).collect();
        let (read_at, writes) = (Instant::now(), sale_cache::writes());
        let stocks = match tokio::time::timeout(READ_WAIT, gate.stocks(&ids)).await {
            Ok(Ok(stocks)) if stocks.len() == ids.len() => stocks,
            // Per read, so not worth a warning each: readiness reports a gate that is down.
            Ok(Ok(_)) => {
                tracing::debug!("the gate answered a different number of counts");
                return None;
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, "units left from the cached rows");
                return None;
            }
            Err(_) => {
                tracing::debug!("the gate was slow; units left from the cached rows");
                return None;
            }
        };
        let by_product = ids
            .iter()
            .zip(stocks)
            .filter_map(|(id, stock)| stock.map(|units| (id.get(), units)))
            .collect();
        let counts = Arc::new(Counts {
            read_at,
            writes,
            by_product,
        });
        *self.counts.write().unwrap_or_else(|e| e.into_inner()) = Some(counts.clone());
        Some(counts)
    }
}
