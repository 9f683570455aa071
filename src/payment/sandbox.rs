//! The sandbox provider behaves like a payment provider's test mode: fixed
//! card numbers decide the outcome, and no money moves.

use super::{Charge, PaymentProvider};
use crate::domain::{CardNumber, Money};

/// Test mode: 4242 4242 4242 4242 pays, 4000 0000 0000 0002 is declined,
/// and any other number is declined as unknown to the sandbox.
pub struct SandboxProvider;

impl SandboxProvider {
    pub const APPROVED_CARD: &'static str = "4242424242424242";
    pub const DECLINED_CARD: &'static str = "4000000000000002";
}

impl PaymentProvider for SandboxProvider {
    fn charge(&self, card: &CardNumber, _amount: Money) -> Charge {
        match card.digits() {
            Self::APPROVED_CARD => Charge::Approved,
            Self::DECLINED_CARD => Charge::Declined("The card was declined by the issuer.".into()),
            _ => Charge::Declined("This sandbox only accepts its test cards.".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_decides_by_test_card() {
        let amount = Money::from_cents(100).unwrap();
        let ok = CardNumber::parse(SandboxProvider::APPROVED_CARD).unwrap();
        let declined = CardNumber::parse(SandboxProvider::DECLINED_CARD).unwrap();
        assert_eq!(SandboxProvider.charge(&ok, amount), Charge::Approved);
        assert!(matches!(
            SandboxProvider.charge(&declined, amount),
            Charge::Declined(_)
        ));
        assert!(!format!("{ok:?}").contains("42424242"));
    }
}
