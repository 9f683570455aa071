//! Why a form field or path segment does not parse into its domain type (or
//! a sale's terms break their rules). Each reason carries what its sentence
//! cites; `web::words` says it to a person. The `Display` here is for logs,
//! and for the draw's values (seed, commitments, tickets) the command line
//! and serde, which read them outside any page.

/// Which of the shop's ids a path or form named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    Product,
    Order,
    Account,
}

/// A free-text field checked by `check_plain_text`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextField {
    ProductName,
    Description,
    StockNote,
    EmailSearchedFor,
}

/// A date-and-time field of the sale form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeField {
    Start,
    End,
    QueueOpening,
}

/// A whole-number field of the sale form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberField {
    Stock,
    CheckWork,
    PerCustomerLimit,
}

/// A 32-byte value written as 64 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HexValue {
    DrawSeed,
    SeedCommitment,
    FrozenListSha256,
}

/// A form field or path segment that does not parse into its domain type.
/// Text echoed back (`raw`) is cut to its first 40 characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidInput {
    #[error("quantity outside 1..={max}")]
    QuantityOutOfBounds { max: i32 },
    #[error("{raw:?} is not a quantity (1..={max})")]
    NotAQuantity { raw: String, max: i32 },
    #[error("quantity out of range")]
    QuantityOverflow,
    #[error("not an email address")]
    NotAnEmail,
    #[error("password shorter than {min} characters")]
    PasswordTooShort { min: usize },
    #[error("password longer than {max} characters")]
    PasswordTooLong { max: usize },
    #[error("empty idempotency key")]
    KeyEmpty,
    #[error("idempotency key longer than {max} characters")]
    KeyTooLong { max: usize },
    #[error("idempotency key with control characters")]
    KeyControlCharacters,
    #[error("control characters in {field:?}")]
    ControlCharacters { field: TextField },
    #[error("card number not 12 to 19 digits")]
    CardNumberShape,
    #[error("card number check digit does not match")]
    CardCheckDigit,
    #[error("negative price")]
    NegativePrice,
    #[error("{raw:?} is not a price")]
    NotAPrice { raw: String },
    #[error("no {kind:?} id {raw:?}")]
    NoSuchId { kind: IdKind, raw: String },
    #[error("A {} is 64 hex digits (32 bytes); got “{raw}”.", what.name())]
    NotHex32 { what: HexValue, raw: String },
    #[error("A ticket is {len} characters of 0-9 and A-Z without I, L, O or U; got “{raw}”.")]
    NotATicket { len: usize, raw: String },
    #[error("{field:?} {raw:?} is not a date and time")]
    NotATime { field: TimeField, raw: String },
    #[error("{field:?} {raw:?} is not a whole number")]
    NotAWholeNumber { field: NumberField, raw: String },
    #[error("no start time")]
    NoStart,
    #[error("queue mode is not a checkbox value")]
    NotACheckbox,
    #[error("there is no order status {raw:?}")]
    NotAnOrderStatus { raw: String },
    #[error("stock outside 0..={max}")]
    StockOutOfBounds { max: i32 },
    #[error("product name not 1 to {max} characters")]
    NameLength { max: usize },
    #[error("description of {max} characters or more")]
    DescriptionTooLong { max: usize },
    #[error("per-customer limit below 1")]
    LimitBelowOne,
    #[error("sale ends before it starts")]
    EndsBeforeStart,
    #[error("bot check size outside 1..={max}")]
    CheckWorkOutOfBounds { max: i32 },
    #[error("queue mode without a per-customer limit")]
    QueueNeedsLimit,
    #[error("waiting-room opening without queue mode")]
    OpeningWithoutQueue,
    #[error("waiting room opens after the sale starts")]
    QueueOpensAfterStart,
    #[error("{raw:?} is not a stock change")]
    NotAStockChange { raw: String },
    #[error("stock change reason not 1 to {max} characters")]
    StockNoteLength { max: usize },
}

impl HexValue {
    /// What the value is called in logs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            HexValue::DrawSeed => "draw seed",
            HexValue::SeedCommitment => "seed commitment",
            HexValue::FrozenListSha256 => "frozen list's SHA-256",
        }
    }
}

/// What a refusal echoes of the text it refused: its first 40 characters.
pub fn echo(raw: &str) -> String {
    raw.chars().take(40).collect()
}
