//! A sale's window and why a buyer can be refused: the shop's rules, said
//! without any wording, so the web layer decides how a customer is told.

/// Where a sale stands at a given instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SaleState {
    Upcoming,
    Live,
    SoldOut,
    Ended,
}

/// Why a purchase was refused. Refusals are ordinary outcomes of a sale, not
/// failures: nothing was written, nothing was reserved.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Refusal {
    /// Fewer than the asked-for units are left (`available` may be 0).
    /// `product` is the product's name, or `None` where the refusal was
    /// decided before the product's row was read (the stock gate).
    SoldOut {
        product: Option<String>,
        available: i32,
    },
    /// The customer's live orders already hold `already` of at most `limit`.
    LimitReached {
        product: Option<String>,
        limit: i32,
        already: i64,
    },
    /// The sale has a per-customer `limit`, which is per person, and the
    /// buyer's address is not confirmed, so the shop cannot tell them from
    /// their other accounts.
    AddressUnconfirmed { product: Option<String>, limit: i32 },
    /// The sale has not started, or has ended.
    SaleNotOpen { product: String, state: SaleState },
}

impl Refusal {
    /// A stable name for counting refusals by kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Refusal::SoldOut { .. } => "sold_out",
            Refusal::LimitReached { .. } => "limit_reached",
            Refusal::AddressUnconfirmed { .. } => "unconfirmed",
            Refusal::SaleNotOpen { .. } => "not_open",
        }
    }
}
