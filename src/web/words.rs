//! The sentences a customer or admin reads for the typed reasons the
//! services and the domain give (`Invalid`, `InvalidInput`, `Missing`,
//! `NotAllowed`, `Conflict`). `web::error` picks the page; this says it.

use std::borrow::Cow;

use chrono::{DateTime, Utc};

use crate::domain::{
    grouped_thousands, HexValue, IdKind, InvalidInput, NumberField, OrderStatus, TextField,
    TimeField,
};
use crate::error::{
    Conflict, FrozenTerm, Invalid, Missing, NoAdmission, NotAllowed, StrandingEdit,
};

/// An order's status as its pages name it.
pub fn status_in_words(status: OrderStatus) -> &'static str {
    match status {
        OrderStatus::AwaitingPayment => "Awaiting payment",
        OrderStatus::Paid => "Paid",
        OrderStatus::PaymentFailed => "Payment declined",
        OrderStatus::Expired => "Expired",
        OrderStatus::Refunded => "Refunded",
    }
}

/// What a refused form or address says about its content.
pub(super) fn invalid_in_words(invalid: &Invalid) -> Cow<'static, str> {
    match invalid {
        Invalid::Input(input) => input_in_words(input),
        Invalid::StockAboveMax { max, stock } => Cow::Owned(format!(
            "A sale holds at most {} units; it has {stock} now. Nothing was changed.",
            grouped_thousands(i64::from(*max))
        )),
        Invalid::BeyondPass { units } => Cow::Owned(format!(
            "Your pass covers {units} unit(s): buy at most that many."
        )),
        Invalid::LinesNotDistinct => "An order needs each product once, with a quantity.".into(),
        Invalid::CartFull { max } => {
            Cow::Owned(format!("A cart holds at most {max} different products."))
        }
        Invalid::CartEmpty => "Your cart is empty: add a product first.".into(),
        Invalid::UnreadableQuery(reason) => {
            Cow::Owned(format!("The address could not be read: {reason}."))
        }
    }
}

/// What a field that does not parse (or a sale's broken terms) says.
pub(super) fn input_in_words(input: &InvalidInput) -> Cow<'static, str> {
    use InvalidInput::*;
    match input {
        QuantityOutOfBounds { max } => {
            Cow::Owned(format!("Choose a quantity between 1 and {max}."))
        }
        NotAQuantity { raw, max } => Cow::Owned(format!(
            "“{raw}” is not a quantity: choose a whole number between 1 and {max}."
        )),
        QuantityOverflow => "Quantity is out of range.".into(),
        NotAnEmail => "Enter an email address like name@example.com.".into(),
        PasswordTooShort { min } => Cow::Owned(format!(
            "Choose a password of at least {min} characters."
        )),
        PasswordTooLong { max } => Cow::Owned(format!(
            "That password is too long ({max} characters at most)."
        )),
        KeyEmpty => {
            "The request's idempotency key is empty; reload the page and try again.".into()
        }
        KeyTooLong { max } => Cow::Owned(format!(
            "The request's idempotency key is longer than {max} characters."
        )),
        KeyControlCharacters => {
            "The request's idempotency key contains control characters.".into()
        }
        ControlCharacters { field } => Cow::Owned(format!(
            "The {} contains control characters (such as NUL); type it as plain text.",
            text_field(*field)
        )),
        CardNumberShape => {
            "Enter the card number as printed on the card (12 to 19 digits).".into()
        }
        CardCheckDigit => "That card number has a typo (its check digit does not match).".into(),
        NegativePrice => "A price cannot be negative.".into(),
        NotAPrice { raw } => Cow::Owned(format!("“{raw}” is not a price: write it like 12.50.")),
        NoSuchId { kind, raw } => Cow::Owned(no_such_id(*kind, raw)),
        NotHex32 { what, raw } => Cow::Owned(format!(
            "A {} is 64 hex digits (32 bytes); got “{raw}”.",
            hex_value(*what)
        )),
        NotATicket { len, raw } => Cow::Owned(format!(
            "A ticket is {len} characters of 0-9 and A-Z without I, L, O or U; got “{raw}”."
        )),
        NotATime { field, raw } => Cow::Owned(format!(
            "The {} “{raw}” is not a date and time: write it like 2026-12-01T09:00.",
            time_field(*field)
        )),
        NotAWholeNumber { field, raw } => Cow::Owned(format!(
            "The {} “{raw}” is not a whole number.",
            number_field(*field)
        )),
        NoStart => "Say when the sale starts (UTC), for example 2026-12-01T09:00.".into(),
        NotACheckbox => "Queue mode is a checkbox: ticked or not.".into(),
        NotAnOrderStatus { raw } => Cow::Owned(format!("There is no order status “{raw}”.")),
        StockOutOfBounds { max } => Cow::Owned(format!(
            "Stock must be between 0 and {} units.",
            grouped_thousands(i64::from(*max))
        )),
        NameLength { max } => Cow::Owned(format!(
            "Give the product a name of 1 to {max} characters."
        )),
        DescriptionTooLong { max } => Cow::Owned(format!(
            "Keep the description under {} characters.",
            grouped_thousands(*max as i64)
        )),
        LimitBelowOne => {
            "A per-customer limit must be at least 1 (leave it empty for no limit).".into()
        }
        EndsBeforeStart => "The sale must end after it starts.".into(),
        CheckWorkOutOfBounds { max } => Cow::Owned(format!(
            "The bot check's size must be between 1 and {max} tries."
        )),
        QueueNeedsLimit => "A sale in queue mode needs a per-customer limit: each pass from the waiting room covers that many units.".into(),
        OpeningWithoutQueue => "A waiting-room opening time only applies to a sale in queue mode: turn queue mode on, or leave the opening time empty.".into(),
        QueueOpensAfterStart => "The waiting room must open at or before the sale starts (leave the opening empty for 15 minutes before).".into(),
        NotAStockChange { raw } => Cow::Owned(format!(
            "“{raw}” is not a stock change: write a whole number of units such as 5 or -3 (not 0)."
        )),
        StockNoteLength { max } => Cow::Owned(format!(
            "Say why the stock changes (1 to {max} characters): it is kept in the stock history."
        )),
    }
}

fn no_such_id(kind: IdKind, raw: &str) -> String {
    let what = match kind {
        IdKind::Product => "product",
        IdKind::Order => "order",
        IdKind::Account => "account",
    };
    format!("There is no {what} with id “{raw}”.")
}

fn text_field(field: TextField) -> &'static str {
    match field {
        TextField::ProductName => "name",
        TextField::Description => "description",
        TextField::StockNote => "reason",
        TextField::EmailSearchedFor => "email searched for",
    }
}

fn time_field(field: TimeField) -> &'static str {
    match field {
        TimeField::Start => "start",
        TimeField::End => "end",
        TimeField::QueueOpening => "waiting-room opening",
    }
}

fn number_field(field: NumberField) -> &'static str {
    match field {
        NumberField::Stock => "stock",
        NumberField::CheckWork => "bot check's size",
        NumberField::PerCustomerLimit => "per-customer limit",
    }
}

fn hex_value(value: HexValue) -> &'static str {
    match value {
        HexValue::DrawSeed => "draw seed",
        HexValue::SeedCommitment => "seed commitment",
        HexValue::FrozenListSha256 => "frozen list's SHA-256",
    }
}

/// What a page or row that is not there says.
pub(super) fn missing_in_words(missing: &Missing) -> Cow<'static, str> {
    match missing {
        Missing::Product(id) => Cow::Owned(format!("There is no product with id {id}.")),
        Missing::Sale(id) => Cow::Owned(format!("There is no sale #{id}.")),
        Missing::Order(order) => Cow::Owned(format!("There is no order {order}.")),
        Missing::YourOrder(order) => Cow::Owned(format!("You have no order {order}.")),
        Missing::Id { kind, raw } => Cow::Owned(no_such_id(*kind, raw)),
        Missing::Draw(product) => Cow::Owned(format!(
            "Product {product} has no published draw: it is not sold through a waiting room, or its waiting room has not opened yet."
        )),
        Missing::RoomToJoin { name } => Cow::Owned(format!("{name} has no waiting room to join.")),
        Missing::WaitingRoom(product) => Cow::Owned(format!(
            "Product {product} is not sold through a waiting room: buy it from its product page."
        )),
        Missing::Row => "We could not find that.".into(),
        Missing::Page => "There is no page at this address.".into(),
        Missing::File => "There is no file at this address.".into(),
        Missing::CartLine => "That product is not in your cart.".into(),
    }
}

/// What a person who may not do this reads.
pub(super) fn not_allowed_in_words(not_allowed: NotAllowed) -> &'static str {
    match not_allowed {
        NotAllowed::WrongCredentials => {
            "That email and password do not match an account. Check them and try again."
        }
        NotAllowed::AdminsOnly => "This part of the shop is for administrators only.",
    }
}

/// A time in an admin's refusal: "2026-12-01 09:00 UTC".
fn audit_time(at: &DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// The heading and the explanation of a request the shop's rules refuse.
pub(super) fn conflict_in_words(conflict: &Conflict) -> (&'static str, Cow<'static, str>) {
    let (title, message) = match conflict {
        Conflict::DrawPublished { frozen_at, change } => (
            "The draw is published",
            format!(
                "The waiting room's pre-queue was frozen for its draw at {}: an edit cannot {} any more.",
                audit_time(frozen_at),
                match change {
                    FrozenTerm::QueueMode => "take the sale out of queue mode",
                    FrozenTerm::Start => "move the start",
                    FrozenTerm::Opening => "move the opening of the waiting room",
                    FrozenTerm::Limit => "change the per-customer limit (each pass covers it)",
                }
            ),
        ),
        Conflict::CustomersWaiting { people, edit } => {
            let people = if *people == 1 {
                "1 customer is".to_string()
            } else {
                format!("{people} customers are")
            };
            (
                "Customers are waiting",
                match edit {
                    StrandingEdit::LeaveQueueMode => format!(
                        "{people} in the waiting room: the sale cannot leave queue mode."
                    ),
                    StrandingEdit::OpenLater { first_joined } => format!(
                        "{people} in the waiting room since {}: it cannot open later than that.",
                        audit_time(first_joined)
                    ),
                    StrandingEdit::StartTooEarly { last_joined } => format!(
                        "{people} in the waiting room, the last joined at {}: the start must stay after that, so they are drawn as the pre-queue they joined.",
                        audit_time(last_joined)
                    ),
                },
            )
        }
        Conflict::StockTooLow { stock, removing } => (
            "Not enough stock to remove",
            format!(
                "Only {stock} units are in stock, so {removing} cannot be removed. Units already sold or awaiting payment cannot be taken back. Nothing was changed."
            ),
        ),
        Conflict::StockPromised { promised, stock } => (
            "Units are promised to waiting customers",
            format!(
                "{promised} of the {stock} units in stock are held by waiting-room passes that customers may use now, so at most {} can be removed. Pause admission and wait for those passes to be used or to run out, then try again. Nothing was changed.",
                (stock - promised).max(0)
            ),
        ),
        Conflict::EmailTaken { email } => (
            "Email already registered",
            format!(
                "An account for {email} already exists. Sign in instead, or use another address."
            ),
        ),
        Conflict::AddressConfirmedElsewhere { email } => (
            "Address already confirmed",
            format!("Another account of {email} is confirmed already."),
        ),
        Conflict::CancelWhilePaymentPending(order) => (
            "Payment being confirmed",
            format!("A payment for order {order} is still being confirmed with the card's bank, so the order was not cancelled. Reload the order in a minute to see the result."),
        ),
        Conflict::PaymentPending(order) => (
            "Payment being confirmed",
            format!("A payment for order {order} is still being confirmed with the card's bank, so this one was not sent. Reload the order in a minute to see the result; you were not charged twice."),
        ),
        Conflict::PaymentWindowClosed(order) => (
            "Payment window closed",
            format!("The time to pay for order {order} has run out, so its units may already belong to someone else. You were not charged."),
        ),
        Conflict::CardsDeclined { order, declined } => (
            "Payment declined",
            format!("The cards for order {order} were declined {declined} times, so the order is being cancelled and its units returned; this payment was not sent and you were not charged. Buy again to pay with another card."),
        ),
        Conflict::Transition { order, from, to } => {
            use crate::domain::OrderStatus::*;
            let from_label = status_in_words(*from).to_lowercase();
            (
                "This order cannot change that way",
                match (from, to) {
                    (Refunded, Refunded) => format!("Order {order} has already been refunded; nothing was changed."),
                    (_, Refunded) => format!("Order {order} is {from_label}: only a paid order can be refunded."),
                    (Paid, Paid) => format!("Order {order} is already paid; you were not charged again."),
                    (Expired, _) => format!("The payment window of order {order} has closed and its units were released."),
                    (PaymentFailed, _) => format!("Order {order} was cancelled (its payment was declined or given up) and its units were released; please place a new order."),
                    _ => format!("Order {order} is {from_label} and cannot become {}.", status_in_words(*to).to_lowercase()),
                },
            )
        }
        Conflict::SaleHasWaitingRoom { name } => (
            "This sale has a waiting room",
            format!(
                "{name} is sold through its waiting room, one customer at a time: join it from the product's page and buy with the pass you get when your turn comes. Nothing was bought, reserved or charged."
            ),
        ),
        Conflict::WaitingRoomNotOpen { name, opens_at } => (
            "The waiting room is not open yet",
            format!(
                "The waiting room for {name} opens at {} UTC. Come back then; nothing was changed.",
                opens_at.format("%Y-%m-%d %H:%M:%S")
            ),
        ),
        Conflict::WaitingRoomClosed { name } => (
            "The waiting room is closed",
            format!("The sale of {name} has ended, so its waiting room takes nobody else. Nothing was changed."),
        ),
        Conflict::WaitingRoomSoldOut { name } => (
            "Sold out",
            format!("{name} is sold out and no unit can come back, so its waiting room takes nobody else. Nothing was changed."),
        ),
        Conflict::NoWaitingRoom { name } => (
            "This sale has no waiting room",
            format!("{name} is sold to whoever buys first, without a waiting room: buy it from its page once the sale is open. Nothing was changed."),
        ),
        Conflict::AdmissionNotQueueMode(sale) => (
            "Not a queue-mode sale",
            format!(
                "Sale #{sale} is not in queue mode: it has no waiting room to pause or resume."
            ),
        ),
        Conflict::AdmissionUnchanged { sale, why } => (
            "Admission unchanged",
            match why {
                NoAdmission::Ended => format!(
                    "Sale #{sale} is over: its waiting room is closed, so there is no admission to pause or resume."
                ),
                NoAdmission::NotRunningYet { opens_at } => format!(
                    "Sale #{sale}'s waiting room is not running yet (it opens {}), so there is no admission to pause or resume.",
                    audit_time(opens_at)
                ),
                NoAdmission::NotAdmittingYet { starts_at } => format!(
                    "Sale #{sale}'s waiting room is not admitting yet: the draw at the start ({}) opens admission.",
                    audit_time(starts_at)
                ),
            },
        ),
    };
    (title, Cow::Owned(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_grouped_by_thousands() {
        assert_eq!(grouped_thousands(0), "0");
        assert_eq!(grouped_thousands(999), "999");
        assert_eq!(grouped_thousands(5_000), "5,000");
        assert_eq!(grouped_thousands(10_000_000), "10,000,000");
        assert_eq!(grouped_thousands(-1_234), "-1,234");
    }
}
