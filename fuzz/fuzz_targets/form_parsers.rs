//! Arbitrary bytes, read as a urlencoded body into every form the shop
//! accepts, then through that form's parser: none may panic, and what they
//! accept must be inside the domain they promise.

#![no_main]

use flashsale::domain::{IdempotencyKey, Money, Quantity};
use flashsale::web::forms::{
    parse_order_id, parse_product_id, AdjustForm, BuyForm, CartForm, CredentialsForm,
    CsrfOnlyForm, OrderSearch, PayForm, SaleFields,
};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;

fn form<T: DeserializeOwned>(body: &[u8]) -> Option<T> {
    serde_urlencoded::from_bytes(body).ok()
}

fn check_quantity(quantity: Quantity) {
    assert!((1..=Quantity::MAX).contains(&quantity.get()));
}

fn check_key(raw: Option<&str>) {
    if let Some(Ok(key)) = raw.map(IdempotencyKey::parse) {
        assert!(!key.as_str().is_empty() && key.as_str().len() <= IdempotencyKey::MAX_LEN);
    }
}

fuzz_target!(|body: &[u8]| {
    // The same bytes as a path segment.
    let segment = String::from_utf8_lossy(body);
    if let Ok(id) = parse_product_id(&segment) {
        assert!(id.get() > 0);
    }
    if let Ok(id) = parse_order_id(&segment) {
        assert!(id.get() > 0);
    }

    if let Some(credentials) = form::<CredentialsForm>(body) {
        if let Ok(parsed) = credentials.sign_up() {
            // Normalising twice changes nothing: one person, one account.
            let again = flashsale::domain::Email::parse(parsed.email.as_str()).unwrap();
            assert_eq!(again, parsed.email);
        }
        let _ = credentials.sign_in();
    }
    if let Some(buy) = form::<BuyForm>(body) {
        if let Ok(quantity) = buy.quantity() {
            check_quantity(quantity);
        }
        check_key(buy.idempotency_key.as_deref());
    }
    if let Some(cart) = form::<CartForm>(body) {
        if let Ok((_, quantity)) = cart.addition() {
            check_quantity(quantity);
        }
        if let Ok((_, Some(quantity))) = cart.change() {
            check_quantity(quantity);
        }
        let _ = cart.removal();
    }
    if let Some(pay) = form::<PayForm>(body) {
        if let Ok(card) = pay.card() {
            assert!(card.last4().bytes().all(|b| b.is_ascii_digit()));
        }
        check_key(pay.idempotency_key.as_deref());
    }
    if let Some(plain) = form::<CsrfOnlyForm>(body) {
        check_key(plain.idempotency_key.as_deref());
    }
    if let Some(adjust) = form::<AdjustForm>(body) {
        if let Ok(adjustment) = adjust.adjustment() {
            assert!(adjustment.delta != 0 && !adjustment.note.is_empty());
        }
    }
    if let Some(sale) = form::<SaleFields>(body) {
        let _ = sale.terms();
        if let Ok(spec) = sale.spec() {
            // The price the form shows back must read as the same price.
            let shown = spec.price.to_string();
            assert_eq!(Money::parse_decimal(&shown).unwrap(), spec.price);
        }
    }
    if let Some(search) = form::<OrderSearch>(body) {
        let _ = search.filter();
    }
});
