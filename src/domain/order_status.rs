use std::fmt;

/// Where an order is in its life. Stock is taken when the order is created
/// (`AwaitingPayment`) and given back exactly once when it leaves the live
/// states for a restoring one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderStatus {
    AwaitingPayment,
    Paid,
    PaymentFailed,
    Expired,
    Refunded,
}

/// Why a stock_history row exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StockReason {
    Purchase,
    PaymentFailed,
    Expired,
    Refund,
    AdminAdjust,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an order that is {from} cannot become {to}")]
pub struct TransitionRefused {
    pub from: OrderStatus,
    pub to: OrderStatus,
}

impl OrderStatus {
    pub const ALL: [OrderStatus; 5] = [
        OrderStatus::AwaitingPayment,
        OrderStatus::Paid,
        OrderStatus::PaymentFailed,
        OrderStatus::Expired,
        OrderStatus::Refunded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::AwaitingPayment => "awaiting_payment",
            OrderStatus::Paid => "paid",
            OrderStatus::PaymentFailed => "payment_failed",
            OrderStatus::Expired => "expired",
            OrderStatus::Refunded => "refunded",
        }
    }

    pub fn parse(raw: &str) -> Option<OrderStatus> {
        OrderStatus::ALL.into_iter().find(|s| s.as_str() == raw)
    }

    /// Live orders hold stock; the others have given it back (or never will hold it again).
    pub fn holds_stock(self) -> bool {
        matches!(self, OrderStatus::AwaitingPayment | OrderStatus::Paid)
    }

    /// The state machine: the only moves an order can make.
    pub fn transition(self, to: OrderStatus) -> Result<OrderStatus, TransitionRefused> {
        use OrderStatus::*;
        match (self, to) {
            (AwaitingPayment, Paid)
            | (AwaitingPayment, PaymentFailed)
            | (AwaitingPayment, Expired)
            | (Paid, Refunded) => Ok(to),
            _ => Err(TransitionRefused { from: self, to }),
        }
    }

    /// The ledger reason recorded when moving into this status gives stock back.
    pub fn restore_reason(self) -> Option<StockReason> {
        match self {
            OrderStatus::PaymentFailed => Some(StockReason::PaymentFailed),
            OrderStatus::Expired => Some(StockReason::Expired),
            OrderStatus::Refunded => Some(StockReason::Refund),
            OrderStatus::AwaitingPayment | OrderStatus::Paid => None,
        }
    }
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl StockReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StockReason::Purchase => "purchase",
            StockReason::PaymentFailed => "payment_failed",
            StockReason::Expired => "expired",
            StockReason::Refund => "refund",
            StockReason::AdminAdjust => "admin_adjust",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::OrderStatus::*;
    use super::*;

    #[test]
    fn allowed_transitions() {
        assert_eq!(AwaitingPayment.transition(Paid), Ok(Paid));
        assert_eq!(AwaitingPayment.transition(PaymentFailed), Ok(PaymentFailed));
        assert_eq!(AwaitingPayment.transition(Expired), Ok(Expired));
        assert_eq!(Paid.transition(Refunded), Ok(Refunded));
    }

    #[test]
    fn every_other_transition_is_refused() {
        let allowed = [
            (AwaitingPayment, Paid),
            (AwaitingPayment, PaymentFailed),
            (AwaitingPayment, Expired),
            (Paid, Refunded),
        ];
        let mut refused = 0;
        for from in OrderStatus::ALL {
            for to in OrderStatus::ALL {
                if allowed.contains(&(from, to)) {
                    continue;
                }
                assert_eq!(
                    from.transition(to),
                    Err(TransitionRefused { from, to }),
                    "{from:?} -> {to:?}"
                );
                refused += 1;
            }
        }
        assert_eq!(refused, 21);
    }

    #[test]
    fn refund_twice_is_refused() {
        let refunded = Paid.transition(Refunded).unwrap();
        assert!(refunded.transition(Refunded).is_err());
    }

    #[test]
    fn restoring_statuses_name_their_ledger_reason() {
        assert_eq!(
            PaymentFailed.restore_reason(),
            Some(StockReason::PaymentFailed)
        );
        assert_eq!(Expired.restore_reason(), Some(StockReason::Expired));
        assert_eq!(Refunded.restore_reason(), Some(StockReason::Refund));
        assert_eq!(Paid.restore_reason(), None);
        assert!(AwaitingPayment.holds_stock() && Paid.holds_stock());
        assert!(!Refunded.holds_stock() && !Expired.holds_stock() && !PaymentFailed.holds_stock());
    }

    #[test]
    fn status_round_trips_through_text() {
        for s in OrderStatus::ALL {
            assert_eq!(OrderStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(OrderStatus::parse("shipped"), None);
    }
}
