//! The shop's own terms, below every other layer: types that are valid by
//! construction (once a handler has parsed its form into these, the
//! services never re-check shape, only business rules), and the records the
//! shop reads back (`Product`, `Order` and what hangs off it), which
//! `db::models` maps onto its rows.

mod canonical_email;
mod card_number;
mod credentials;
pub mod draw;
mod idempotency_key;
mod ids;
mod invalid_input;
mod money;
mod order;
mod order_status;
mod product;
mod quantity;
mod sale;
mod text;
mod waiting_room;

pub use canonical_email::{canonical_address, canonical_email, DOT_BLIND_PROVIDERS};
pub use card_number::CardNumber;
pub use credentials::{Email, Password};
pub use idempotency_key::IdempotencyKey;
pub use ids::{CustomerId, OrderId, ProductId};
pub use invalid_input::{echo, HexValue, IdKind, InvalidInput, NumberField, TextField, TimeField};
pub use money::{grouped_thousands, Money};
pub use order::{Order, OrderItem, Payment, StockChange};
pub use order_status::{OrderStatus, StockReason, TransitionRefused};
pub use product::Product;
pub use quantity::Quantity;
pub use sale::{Refusal, SaleState};
pub use text::{check_plain_text, Lines};
pub use waiting_room::{PassRef, PassRow, Place, QueueState, Standing, PASS_GRACE};

/// Who a signed-in account is: it decides which pages it may see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Customer,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Customer => "customer",
            Role::Admin => "admin",
        }
    }

    pub fn parse(raw: &str) -> Option<Role> {
        match raw {
            "customer" => Some(Role::Customer),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}
