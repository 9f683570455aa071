//! The shop's use cases. Every path that changes stock goes through
//! `ProductLocks::with_locks` and re-reads the product rows `FOR UPDATE`.

pub mod accounts;
pub mod audit;
pub mod catalog;
pub mod idempotency;
pub mod jobs;
pub mod orders;
pub mod payment;
pub mod purchase;
pub mod restore;
pub mod seed;
pub mod stock;

use std::sync::Arc;

use crate::config::Settings;
use crate::db::PgPool;
use crate::lock::ProductLocks;
use payment::PaymentGateway;

/// What the use cases need: the database, the locks, settings and the payment gateway.
#[derive(Clone)]
pub struct Shop {
    pub pool: PgPool,
    pub locks: ProductLocks,
    pub settings: Arc<Settings>,
    pub gateway: Arc<dyn PaymentGateway>,
}

impl Shop {
    pub fn new(settings: Settings) -> anyhow::Result<Shop> {
        let pool = crate::db::build_pool(
            &settings.database_url,
            settings.db_pool_size,
            settings.db_statement_timeout,
            settings.db_connect_timeout,
        );
        let locks = ProductLocks::new(
            &settings.redis_urls,
            &settings.redis_key_prefix,
            settings.lock_wait,
            settings.lock_lease,
        )?;
        Ok(Shop {
            pool,
            locks,
            settings: Arc::new(settings),
            gateway: Arc::new(payment::SandboxGateway),
        })
    }
}
