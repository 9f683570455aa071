//! The shop's use cases. Every path that changes stock goes through
//! `ProductLocks::with_locks` and re-reads the product rows `FOR UPDATE`.

pub mod accounts;
pub mod action_log;
pub mod catalog;
pub mod checkout;
pub mod confirmation;
pub mod door;
pub mod idempotency;
pub mod jobs;
pub mod ledger_audit;
pub mod mail;
pub mod orders;
pub mod payment;
pub mod readiness;
pub mod restore;
pub mod revocations;
pub mod sale_cache;
pub mod seed;
pub mod sessions;
pub mod stock;
pub mod stock_gate;
pub mod throttle;
pub mod units_left;
pub mod waiting_room;

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};

use crate::config::Settings;
use crate::db::PgPool;
use crate::gate::StockGate;
use crate::lock::ProductLocks;
use crate::payment::PaymentProvider;
use crate::redis_node::RedisNode;
use stock_gate::ReconcileReport;

/// When the gate was last reconciled, and what that pass found.
pub type LastReconcile = (DateTime<Utc>, ReconcileReport);

/// What the use cases need: the database, the locks, settings and the payment gateway.
#[derive(Clone)]
pub struct Shop {
    pub pool: PgPool,
    /// Idempotency keys only: commits that do not wait for the disk (see `db`).
    pub bookkeeping: PgPool,
    /// `REDIS_KEY_PREFIX` plus this database's namespace: the start of every Redis key.
    pub redis_prefix: String,
    pub locks: ProductLocks,
    pub settings: Arc<Settings>,
    /// Keys the fingerprints stored beside idempotency keys.
    pub fingerprint_key: Arc<idempotency::FingerprintKey>,
    /// Who charges cards (`PAYMENT_PROVIDER`).
    pub payment_provider: Arc<dyn PaymentProvider>,
    /// The Redis stock gate, unless `STOCK_GATE=off`.
    pub gate: Option<StockGate>,
    /// What this process last read of the waiting rooms (a cache; Postgres decides).
    pub waiting_room: Arc<waiting_room::Rooms>,
    /// Per-product batching of single-product purchases, unless `COMBINING=off`.
    pub combiner: Option<Arc<checkout::Combiner>>,
    /// When the gate was last reconciled and what drift was found (admin dashboard).
    pub last_reconcile: Arc<Mutex<Option<LastReconcile>>>,
    /// The revoked sessions, polled from Postgres, so a page trusts its cookie.
    pub revocations: Arc<revocations::Revocations>,
    /// The sale rows the shop pages are built from, at most a second old.
    pub sale_cache: Arc<sale_cache::SaleCache>,
    /// The gate's counts the shop pages show, at most a second old.
    pub units_left: Arc<units_left::UnitsLeft>,
    /// Signs the door's challenges (`services::door`).
    pub door_keys: Arc<door::DoorKeys>,
    /// Challenges handed out and refusals at the door, until the jobs add
    /// them to Postgres.
    pub door_counts: Arc<door::DoorCounts>,
    /// Customers seen confirmed, so a buy of a limited sale is not one more
    /// query each time: a confirmation is never undone by the shop, and the
    /// order's transaction checks it again anyway.
    pub confirmed: Arc<confirmation::ConfirmedCustomers>,
}

impl Shop {
    /// Connects the shop's parts. Needs the database: every Redis key is
    /// namespaced by the id the database got when it was migrated.
    pub async fn new(settings: Settings) -> anyhow::Result<Shop> {
        let pool = crate::db::build_pool(
            &settings.database_url,
            settings.db_pool_size,
            settings.db_statement_timeout,
            settings.db_connect_timeout,
        );
        let bookkeeping = crate::db::build_bookkeeping_pool(
            &settings.database_url,
            (settings.db_pool_size / 2).max(2),
            settings.db_statement_timeout,
            settings.db_connect_timeout,
        );
        let namespace = crate::db::redis_namespace(&pool)
            .await
            .map_err(|e| anyhow::anyhow!("reading the Redis namespace from the database: {e}"))?;
        let redis_prefix = format!("{}{namespace}:", settings.redis_key_prefix);
        let locks = ProductLocks::new(
            &settings.redis_urls,
            settings.redis_cluster,
            &redis_prefix,
            settings.lock_wait,
            settings.lock_lease,
            settings.redis_lock,
        )?;
        // A Redlock quorum spans independent servers; the gate lives on the
        // first (or on the cluster, where its hash-tagged keys spread by
        // product), with connections of its own.
        let redis_node = || {
            if settings.redis_cluster {
                RedisNode::cluster(&settings.redis_urls)
            } else {
                RedisNode::single(&settings.redis_urls[0])
            }
        };
        let waiting_room = Arc::new(waiting_room::Rooms::new());
        let gate = if settings.stock_gate {
            // Markers must outlive any order that may still give units back.
            let marker_ttl = settings.payment_timeout + settings.idempotency_retention;
            Some(StockGate::new(
                redis_node()?,
                &redis_prefix,
                marker_ttl,
                settings.gate_pending_ttl(),
            ))
        } else {
            None
        };
        let combiner = settings.combining.then(|| {
            Arc::new(checkout::Combiner::new(
                settings.combine_max,
                settings.combine_products,
            ))
        });
        let payment_provider = crate::payment::provider_named(&settings.payment_provider, &pool)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "PAYMENT_PROVIDER={:?}: use one of {}",
                    settings.payment_provider,
                    crate::payment::PROVIDERS.join(", ")
                )
            })?;
        Ok(Shop {
            pool,
            bookkeeping,
            redis_prefix,
            locks,
            gate,
            waiting_room,
            combiner,
            last_reconcile: Arc::new(Mutex::new(None)),
            revocations: Arc::new(revocations::Revocations::new(&settings)),
            sale_cache: Arc::new(sale_cache::SaleCache::new()),
            units_left: Arc::new(units_left::UnitsLeft::new()),
            fingerprint_key: Arc::new(idempotency::FingerprintKey::derive(&settings.session_key)),
            door_keys: Arc::new(door::DoorKeys::derive(&settings.session_key)),
            door_counts: Arc::new(door::DoorCounts::default()),
            confirmed: Arc::new(confirmation::ConfirmedCustomers::default()),
            payment_provider,
            settings: Arc::new(settings),
        })
    }
}
