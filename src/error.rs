//! The one error type of the shop. It says what went wrong in terms of the
//! shop; `web::error` decides how a person is told, `db::error` how Diesel's
//! errors become one of these.

use chrono::{DateTime, Utc};

use crate::domain::{IdKind, InvalidInput, OrderId, OrderStatus, ProductId, Refusal};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The request's content does not parse: nothing was attempted.
    #[error("invalid: {0}")]
    Invalid(Invalid),
    #[error("not found: {0:?}")]
    NotFound(Missing),
    #[error("forbidden: {0:?}")]
    Forbidden(NotAllowed),
    /// A stranger asked for what needs an account. `return_to` is the
    /// shop's own path to come back to after signing in (already checked
    /// to be local); `to_act`: the request would have changed something (a
    /// buy, a join), and nothing was done.
    #[error("sign in to continue")]
    SignInRequired {
        return_to: Option<String>,
        to_act: bool,
    },
    #[error("the form was not issued by this shop for this session")]
    BadCsrf,
    /// A purchase the sale's rules refuse (sold out, limit reached, not open).
    #[error("purchase refused: {}", .0.kind())]
    Refused(Refusal),
    /// A buy of a sale in queue mode without a valid pass of this customer's
    /// (issue #16): nothing was written, nothing is held.
    #[error("pass refused: {}", .0.kind())]
    PassRefused(PassRefusal),
    /// Turned away at the door of sign-up or of a waiting room
    /// (`services::door`): nothing was written.
    #[error("door refused: {}", .0.kind())]
    DoorRefused(DoorRefusal),
    /// A well-formed request that the shop's rules refuse (already paid, ...).
    #[error("conflict: {0:?}")]
    Conflict(Conflict),
    /// The request's idempotency key was already used for a different request.
    #[error("idempotency key reused for a different request")]
    KeyReused,
    /// The first request under this idempotency key has not finished (or
    /// was interrupted and cannot be taken over yet).
    #[error("a request under this idempotency key is still in progress")]
    KeyInProgress,
    /// An order's transaction found its idempotency key already taken (by
    /// an earlier order, or a claim): it rolled back, and the purchase looks
    /// up what the key names.
    #[error("an order already names this idempotency key")]
    KeyTaken,
    /// Too many unsuccessful sign-ins for the account or from the address;
    /// refused before the password is looked at.
    #[error("too many sign-in attempts")]
    TooManyAttempts { retry_after: std::time::Duration },
    /// The product's lock was not obtained within the wait deadline.
    #[error("too many buyers at this moment")]
    Busy,
    /// Redis or Postgres did not answer: the shop fails closed.
    #[error("{0}")]
    Unavailable(String),
    /// The connection went while a COMMIT was on its way: the transaction
    /// may have landed or not, so this must never be read as "nothing
    /// changed". Answered like `Unavailable`, but an idempotency key it
    /// guards keeps its claim until the database says what happened.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// Postgres refused a stock write: the row carries a fencing token at or
    /// above this holder's, so a later lock holder has written since.
    #[error("stale lock holder: product {product} is fenced at {fence}")]
    Fenced { product: ProductId, fence: i64 },
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl AppError {
    /// The same error for every buyer of a batch (or of a transaction) that
    /// failed as a whole: what they must hear alike is kept, the rest is
    /// internal.
    pub fn duplicate(&self) -> AppError {
        match self {
            AppError::Busy => AppError::Busy,
            AppError::Unavailable(reason) => AppError::Unavailable(reason.clone()),
            AppError::OutcomeUnknown(reason) => AppError::OutcomeUnknown(reason.clone()),
            AppError::Fenced { product, fence } => AppError::Fenced {
                product: *product,
                fence: *fence,
            },
            AppError::NotFound(message) => AppError::NotFound(message.clone()),
            other => AppError::Internal(anyhow::anyhow!("{other}")),
        }
    }
}

/// Why a buy in queue mode was turned away at its pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassRefusal {
    /// The form carried no pass, or the customer holds none (not joined, or
    /// still waiting for their turn).
    NoPass,
    /// The form's pass names no pass of this sale's waiting room.
    Forged,
    /// The pass was issued to another customer.
    NotYours,
    /// The pass ran out before the purchase; its place went to the next in line.
    Lapsed,
    /// The pass already bought its order.
    Used,
    /// Another purchase under this pass is on its way.
    InUse,
}

impl PassRefusal {
    /// A stable name for counting refusals by kind.
    pub fn kind(self) -> &'static str {
        match self {
            PassRefusal::NoPass => "no_pass",
            PassRefusal::Forged => "forged_pass",
            PassRefusal::NotYours => "not_your_pass",
            PassRefusal::Lapsed => "pass_lapsed",
            PassRefusal::Used => "pass_used",
            PassRefusal::InUse => "pass_in_use",
        }
    }
}

/// Why a visitor was turned away at the door of sign-up or a waiting room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorRefusal {
    /// The form came without a solved check (no JavaScript, or sent too soon).
    NotSolved,
    /// The solution does not solve a challenge this shop issued for this door.
    Invalid,
    /// The challenge ran out before the form was sent.
    Expired,
    /// This solution was already used.
    Spent,
    /// The client's address came through this door as often as it may
    /// within the window.
    TooMany {
        signing_up: bool,
        retry_after: std::time::Duration,
    },
    /// Waiting rooms are for confirmed addresses only.
    Unconfirmed,
}

impl DoorRefusal {
    /// A stable name for counting refusals by kind.
    pub fn kind(self) -> &'static str {
        match self {
            DoorRefusal::NotSolved => "not solved",
            DoorRefusal::Invalid => "invalid solution",
            DoorRefusal::Expired => "expired challenge",
            DoorRefusal::Spent => "solution reused",
            DoorRefusal::TooMany { .. } => "address limit",
            DoorRefusal::Unconfirmed => "address not confirmed",
        }
    }
}

impl From<InvalidInput> for AppError {
    fn from(error: InvalidInput) -> Self {
        AppError::Invalid(Invalid::Input(error))
    }
}

impl From<Conflict> for AppError {
    fn from(conflict: Conflict) -> Self {
        AppError::Conflict(conflict)
    }
}

/// Why a request's content was refused before anything was attempted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// A field that does not parse, or a sale's terms that break their rules.
    #[error(transparent)]
    Input(InvalidInput),
    /// An adjustment would take a sale's stock (`stock` now) above `max`.
    #[error("stock above {max} (now {stock})")]
    StockAboveMax { max: i32, stock: i32 },
    /// More units than the buyer's waiting-room pass covers.
    #[error("quantity beyond the pass's {units} units")]
    BeyondPass { units: i32 },
    /// An order with no line, or a product on two lines.
    #[error("an order needs each product once")]
    LinesNotDistinct,
    /// A cart already holds `max` different products.
    #[error("cart holds at most {max} products")]
    CartFull { max: usize },
    /// Checkout of an empty cart.
    #[error("empty cart")]
    CartEmpty,
    /// The query string did not parse (actix's reason).
    #[error("unreadable query: {0}")]
    UnreadableQuery(String),
}

/// What a request named that does not exist (or is not the asker's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    Product(ProductId),
    /// An admin's sale page or action on a sale that does not exist.
    Sale(ProductId),
    Order(OrderId),
    /// The signed-in customer has no order with this id.
    YourOrder(OrderId),
    /// An id in the path that names nothing (`raw`, at most 40 characters).
    Id {
        kind: IdKind,
        raw: String,
    },
    /// A product without a published draw.
    Draw(ProductId),
    /// The sale `name` has no waiting room (so no bot check to join one).
    RoomToJoin {
        name: String,
    },
    /// A product not sold through a waiting room, asked for its room's page.
    WaitingRoom(ProductId),
    /// A row Diesel did not find.
    Row,
    Page,
    File,
    CartLine,
}

/// Why a signed-in (or signing-in) person may not do this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAllowed {
    /// Email and password do not match an account (or no account could
    /// have this password).
    WrongCredentials,
    AdminsOnly,
}

/// A well-formed request that the shop's rules refuse; each carries what
/// the person who asked is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conflict {
    /// An admin's sale edit would change what a published draw fixed.
    DrawPublished {
        frozen_at: DateTime<Utc>,
        change: FrozenTerm,
    },
    /// An admin's sale edit would strand the `people` in its waiting room.
    CustomersWaiting {
        people: i64,
        edit: StrandingEdit,
    },
    /// Removing `removing` units from a sale with `stock`.
    StockTooLow {
        stock: i32,
        removing: i32,
    },
    /// Removing units that `promised` of the `stock` open passes cover.
    StockPromised {
        promised: i32,
        stock: i32,
    },
    /// Sign-up with an address that has an account already.
    EmailTaken {
        email: String,
    },
    /// Confirming an address another account has confirmed.
    AddressConfirmedElsewhere {
        email: String,
    },
    /// Cancelling an order whose payment is still being confirmed.
    CancelWhilePaymentPending(OrderId),
    /// Paying an order whose earlier payment is still being confirmed.
    PaymentPending(OrderId),
    PaymentWindowClosed(OrderId),
    /// The order's cards were declined `declined` times: it is being cancelled.
    CardsDeclined {
        order: OrderId,
        declined: i64,
    },
    /// A move the order's state machine refuses.
    Transition {
        order: OrderId,
        from: OrderStatus,
        to: OrderStatus,
    },
    /// A plain purchase of a sale sold through its waiting room.
    SaleHasWaitingRoom {
        name: String,
    },
    WaitingRoomNotOpen {
        name: String,
        opens_at: DateTime<Utc>,
    },
    WaitingRoomClosed {
        name: String,
    },
    WaitingRoomSoldOut {
        name: String,
    },
    /// Joining the waiting room of a sale that has none.
    NoWaitingRoom {
        name: String,
    },
    /// Pausing or resuming admission of a sale not in queue mode.
    AdmissionNotQueueMode(ProductId),
    /// Pausing or resuming admission while there is none.
    AdmissionUnchanged {
        sale: ProductId,
        why: NoAdmission,
    },
}

/// What a published draw fixes about its sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrozenTerm {
    QueueMode,
    Start,
    Opening,
    Limit,
}

/// An edit that would strand customers already in a waiting room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrandingEdit {
    LeaveQueueMode,
    /// Open later than `first_joined`.
    OpenLater {
        first_joined: DateTime<Utc>,
    },
    /// Start at or before `last_joined`.
    StartTooEarly {
        last_joined: DateTime<Utc>,
    },
}

/// Why a waiting room has no admission to pause or resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoAdmission {
    Ended,
    NotRunningYet { opens_at: DateTime<Utc> },
    NotAdmittingYet { starts_at: DateTime<Utc> },
}
