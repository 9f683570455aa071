//! Payment providers: who charges a card. `pay` (in `services::payment`)
//! records an attempt, asks the provider outside any transaction, and
//! records the result; a provider only answers. Adding a real provider is
//! one file here beside `sandbox.rs` and one name in `provider_named`,
//! chosen by `PAYMENT_PROVIDER`.

mod sandbox;

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::db::PgPool;
use crate::domain::{CardNumber, Money};

pub use sandbox::SandboxProvider;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Charge {
    Approved,
    Declined(String),
    /// The shop voided the attempt before the provider decided it: nothing
    /// was or will be charged, and the card was not declined.
    Voided,
}

/// The provider gave no answer we can trust: it may or may not have
/// charged. The attempt stays pending until the settling job asks the provider.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("payment provider: {0}")]
pub struct NoAnswer(pub String);

pub trait PaymentProvider: Send + Sync {
    /// Charges `card` once per `attempt`: asked again with the same key,
    /// a provider answers what it did the first time and charges nothing.
    fn charge<'a>(
        &'a self,
        attempt: &'a str,
        card: &'a CardNumber,
        amount: Money,
    ) -> BoxFuture<'a, Result<Charge, NoAnswer>>;

    /// What became of `attempt`, ending it if the provider has not decided
    /// it: None means it is void now and will never charge, even if its
    /// charge request is still on its way (a paused or slow caller). A
    /// lookup alone cannot say that: "never seen" can turn into "charged" a
    /// moment later, after the shop has told the customer nothing was.
    fn void_unless_decided<'a>(
        &'a self,
        attempt: &'a str,
    ) -> BoxFuture<'a, Result<Option<Charge>, NoAnswer>>;
}

/// The names `PAYMENT_PROVIDER` accepts.
pub const PROVIDERS: &[&str] = &["sandbox"];

/// The provider called `name` (one of `PROVIDERS`), or None. The sandbox
/// keeps its own books in `pool`'s database, as a provider keeps its own.
pub fn provider_named(name: &str, pool: &PgPool) -> Option<Arc<dyn PaymentProvider>> {
    match name {
        "sandbox" => Some(Arc::new(SandboxProvider::new(pool.clone()))),
        _ => None,
    }
}
