//! Payment providers: who charges a card. `pay` (in `services::payment`)
//! decides when to charge and records what happened; a provider only
//! answers yes or no. Adding a real provider is one file here beside
//! `sandbox.rs` and one name in `provider_named`, chosen by
//! `PAYMENT_PROVIDER`.

mod sandbox;

use std::sync::Arc;

use crate::domain::{CardNumber, Money};

pub use sandbox::SandboxProvider;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Charge {
    Approved,
    Declined(String),
}

pub trait PaymentProvider: Send + Sync {
    fn charge(&self, card: &CardNumber, amount: Money) -> Charge;
}

/// The names `PAYMENT_PROVIDER` accepts.
pub const PROVIDERS: &[&str] = &["sandbox"];

/// The provider called `name` (one of `PROVIDERS`), or None.
pub fn provider_named(name: &str) -> Option<Arc<dyn PaymentProvider>> {
    match name {
        "sandbox" => Some(Arc::new(SandboxProvider)),
        _ => None,
    }
}
