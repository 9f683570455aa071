//! Property tests of the form parsers (no server, no database): whatever
//! text arrives, they never panic, they accept exactly their domain, and
//! what they say back cannot break the page it is shown on.

use crate::helpers::hostile::{hostile_text, SCRIPT};
use actix_web::ResponseError;
use chrono::{DateTime, TimeZone, Utc};
use flashsale::domain::Product;
use flashsale::domain::{CardNumber, Email, IdempotencyKey, Money, Password, ProductId, Quantity};
use flashsale::error::AppError;
use flashsale::services::catalog::{SaleSpec, MAX_STOCK};
use flashsale::web::forms::{
    parse_order_id, parse_product_id, AdjustForm, BuyForm, CartForm, CredentialsForm, CsrfOnlyForm,
    OrderSearch, PayForm, SaleFields,
};
use proptest::prelude::*;
use serde::de::DeserializeOwned;

/// Renders `error` as the shop would answer it.
fn error_page(error: AppError) -> String {
    let body = futures::executor::block_on(actix_web::body::to_bytes(
        error.error_response().into_body(),
    ))
    .unwrap();
    String::from_utf8(body.to_vec()).unwrap()
}

/// What a refusal says must be short and safe to show: whatever it echoes of
/// the input is cut, and markup in it arrives escaped.
fn assert_safe_message(error: AppError) {
    let message = flashsale::web::error::in_words(&error);
    assert!(
        message.chars().count() <= 300,
        "message echoes too much: {message:?}"
    );
    let page = error_page(error);
    assert!(!page.contains("<script>"), "unescaped markup in: {page}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn quantity_is_a_whole_number_from_one_to_the_maximum(raw in hostile_text()) {
        match Quantity::parse(&raw) {
            Ok(quantity) => {
                prop_assert!((1..=Quantity::MAX).contains(&quantity.get()));
                let digits = raw.trim();
                prop_assert!(digits.bytes().all(|b| b.is_ascii_digit()), "accepted {raw:?}");
                prop_assert_eq!(digits.parse::<i32>().unwrap(), quantity.get());
            }
            Err(error) => assert_safe_message(error.into()),
        }
    }

    #[test]
    fn every_quantity_in_range_is_accepted(units in 1..=Quantity::MAX, pad in "[ \t]{0,3}") {
        let typed = format!("{pad}{units}{pad}");
        prop_assert_eq!(Quantity::parse(&typed).unwrap().get(), units);
    }

    #[test]
    fn quantities_out_of_range_are_refused(units in any::<i64>()) {
        prop_assume!(!(1..=i64::from(Quantity::MAX)).contains(&units));
        prop_assert!(Quantity::parse(&units.to_string()).is_err());
    }

    #[test]
    fn ids_are_positive_decimals_and_nothing_else(raw in hostile_text()) {
        match raw.parse::<ProductId>() {
            Ok(id) => {
                prop_assert!(id.get() > 0);
                prop_assert!(raw.bytes().all(|b| b.is_ascii_digit()), "accepted {raw:?}");
            }
            Err(error) => assert_safe_message(error.into()),
        }
        if let Err(error) = parse_order_id(&raw) {
            prop_assert_eq!(error.status_code().as_u16(), 404);
            assert_safe_message(error);
        }
    }

    #[test]
    fn every_positive_id_round_trips(id in 1..=i64::MAX) {
        prop_assert_eq!(parse_product_id(&id.to_string()).unwrap(), ProductId(id));
    }

    #[test]
    fn prices_round_trip_through_both_ways_the_shop_writes_them(cents in 0i64..100_000_000_000) {
        let money = Money::from_cents(cents).unwrap();
        let shown = money.to_string();
        prop_assert!(regex::Regex::new(r"^\$\d{1,3}(,\d{3})*\.\d{2}$").unwrap().is_match(&shown), "{}", shown);
        prop_assert_eq!(Money::parse_decimal(&shown).unwrap(), money);
        let in_the_form = format!("{}.{:02}", cents / 100, cents % 100);
        prop_assert_eq!(Money::parse_decimal(&in_the_form).unwrap(), money);
    }

    #[test]
    fn prices_are_never_negative_or_absurd(raw in hostile_text()) {
        match Money::parse_decimal(&raw) {
            Ok(money) => {
                prop_assert!((0..100_000_000_000).contains(&money.cents()));
                prop_assert!(!raw.contains('-'));
            }
            Err(error) => assert_safe_message(error.into()),
        }
    }

    #[test]
    fn email_normalisation_is_idempotent(
        raw in prop_oneof![
            hostile_text(),
            "[ ]{0,2}[A-Za-zÀ-ÿİ0-9._%+-]{1,20}@[A-Za-z0-9-]{1,20}\\.[A-Za-z]{2,6}[ ]{0,2}",
        ]
    ) {
        match Email::parse(&raw) {
            Ok(email) => {
                let again = Email::parse(email.as_str()).unwrap();
                prop_assert_eq!(&again, &email);
                prop_assert_eq!(email.as_str(), email.as_str().to_lowercase());
                prop_assert!(email.as_str().len() <= 254 && email.as_str().contains('@'));
                prop_assert!(!email.as_str().chars().any(|c| c.is_whitespace() || c.is_control()));
            }
            Err(error) => assert_safe_message(error.into()),
        }
    }

    #[test]
    fn passwords_are_8_to_256_characters(raw in hostile_text()) {
        let length = raw.chars().count();
        prop_assert_eq!(Password::parse(&raw).is_ok(), (8..=256).contains(&length));
    }

    #[test]
    fn card_numbers_are_luhn_checked_digits(raw in prop_oneof![hostile_text(), "[0-9 -]{10,24}"]) {
        match CardNumber::parse(&raw) {
            Ok(card) => {
                let digits: String = raw.chars().filter(|c| c.is_ascii_digit()).collect();
                prop_assert!((12..=19).contains(&digits.len()));
                prop_assert!(raw.chars().all(|c| c.is_ascii_digit() || c == ' ' || c == '-'));
                prop_assert!(digits.ends_with(card.last4()));
            }
            Err(error) => assert_safe_message(error.into()),
        }
    }

    #[test]
    fn idempotency_keys_are_short_printable_text(raw in hostile_text()) {
        match IdempotencyKey::parse(&raw) {
            Ok(key) => {
                prop_assert!(!key.as_str().is_empty() && key.as_str().len() <= IdempotencyKey::MAX_LEN);
                prop_assert!(!key.as_str().chars().any(char::is_control));
            }
            Err(error) => assert_safe_message(error.into()),
        }
    }

    #[test]
    fn stock_adjustments_are_signed_whole_numbers_with_a_reason(
        delta in hostile_text(),
        reason in hostile_text(),
    ) {
        let form = AdjustForm { delta: delta.clone(), reason, csrf_token: String::new() };
        match form.adjustment() {
            Ok(adjustment) => {
                prop_assert!(adjustment.delta != 0 && adjustment.delta.unsigned_abs() <= MAX_STOCK as u32);
                let typed = delta.trim();
                let unsigned = typed.strip_prefix(['+', '-']).unwrap_or(typed);
                prop_assert!(unsigned.bytes().all(|b| b.is_ascii_digit()), "accepted {delta:?}");
                prop_assert!(!adjustment.note.is_empty() && !adjustment.note.contains('\0'));
            }
            Err(error) => assert_safe_message(error),
        }
    }

    #[test]
    fn every_stock_change_in_range_is_accepted(delta in -MAX_STOCK..=MAX_STOCK, plus in any::<bool>()) {
        prop_assume!(delta != 0);
        let typed = if plus { format!("{delta:+}") } else { delta.to_string() };
        let form = AdjustForm { delta: typed, reason: "counted".into(), csrf_token: String::new() };
        prop_assert_eq!(form.adjustment().unwrap().delta, delta);
    }

    #[test]
    fn sale_forms_accept_only_storable_sales(
        name in hostile_text(),
        description in hostile_text(),
        price in hostile_text(),
        stock in hostile_text(),
        limit in hostile_text(),
        starts_at in prop_oneof![hostile_text(), Just("2026-12-01T09:00".to_string()), "[+-]?[0-9]{1,6}-0[1-9]-1[0-9]T0[0-9]:00"],
        ends_at in prop_oneof![hostile_text(), Just(String::new())],
        queue_mode in prop_oneof![hostile_text(), Just(String::new()), Just("on".to_string())],
        queue_opens_at in prop_oneof![hostile_text(), Just(String::new()), Just("2026-12-01T08:45".to_string())],
        join_check_work in prop_oneof![hostile_text(), Just(String::new()), Just("2,000".to_string()), Just("0".to_string())],
    ) {
        let fields = SaleFields {
            name, description, price, stock, per_customer_limit: limit, starts_at, ends_at,
            queue_mode, queue_opens_at, join_check_work,
            csrf_token: String::new(),
        };
        match fields.spec(1) {
            Ok(spec) => {
                prop_assert!(!spec.name.is_empty() && spec.name.chars().count() <= 200);
                prop_assert!(!spec.name.chars().any(char::is_control));
                prop_assert!(!spec.description.contains('\0'));
                prop_assert!((0..=MAX_STOCK).contains(&spec.stock));
                prop_assert!(spec.per_customer_limit.is_none_or(|l| l >= 1));
                // Postgres stores these; chrono reads far wider years.
                prop_assert!((1970..=9999).contains(&chrono::Datelike::year(&spec.starts_at)));
                prop_assert!(spec.ends_at.is_none_or(|end| end > spec.starts_at));
                // What the products table's queue checks demand, and no opening without a queue.
                prop_assert!(!spec.queue_mode || spec.per_customer_limit.is_some());
                prop_assert!(spec.queue_opens_at.is_none_or(|opens| spec.queue_mode && opens <= spec.starts_at));
                // What the products table's check on the bot check's size demands.
                prop_assert!((1..=1_000_000).contains(&spec.join_check_work));
            }
            Err(error) => assert_safe_message(error.into()),
        }
        if let Err(error) = fields.terms(1) {
            assert_safe_message(error.into());
        }
    }

    /// The queue choice on an otherwise good form: accepted exactly when
    /// queue mode has a limit and any opening is a queue's, at or before the start.
    #[test]
    fn queue_choices_are_accepted_only_when_the_table_would_store_them(
        queue_mode in prop_oneof![Just(String::new()), Just("on".to_string()), hostile_text()],
        limit in prop_oneof![Just(String::new()), Just("2".to_string())],
        opening in prop_oneof![
            Just(String::new()),
            Just("2026-12-01T08:45".to_string()),
            Just("2026-12-01T09:00".to_string()),
            Just("2026-12-01T09:01".to_string()),
            hostile_text(),
        ],
    ) {
        let fields = SaleFields {
            name: "Lamp".into(),
            price: "10".into(),
            stock: "5".into(),
            starts_at: "2026-12-01T09:00".into(),
            per_customer_limit: limit.clone(),
            queue_mode: queue_mode.clone(),
            queue_opens_at: opening.clone(),
            ..SaleFields::default()
        };
        let ticked = match queue_mode.trim() {
            "" => Some(false),
            "on" | "1" | "true" => Some(true),
            _ => None,
        };
        let opening = opening.trim();
        let opens_in_time = matches!(opening, "" | "2026-12-01T08:45" | "2026-12-01T09:00");
        let storable = ticked.is_some_and(|queue| {
            (!queue || !limit.is_empty()) && (opening.is_empty() || queue) && opens_in_time
        });
        match (fields.spec(1), fields.terms(1)) {
            (Ok(spec), Ok(terms)) => {
                prop_assert!(storable, "accepted {queue_mode:?} {limit:?} {opening:?}");
                prop_assert_eq!(spec.queue_mode, ticked == Some(true));
                prop_assert_eq!(terms.queue_opens_at, spec.queue_opens_at);
            }
            (Err(spec), Err(_)) => {
                prop_assert!(!storable, "refused {queue_mode:?} {limit:?} {opening:?}: {spec}");
                assert_safe_message(spec.into());
            }
            _ => prop_assert!(false, "spec and terms disagree"),
        }
    }

    #[test]
    fn a_sale_shown_in_its_edit_form_reads_back_as_the_same_sale(
        name in "[A-Za-z0-9<>'&\"]([A-Za-z0-9<>'&\" ]{0,40}[A-Za-z0-9])?",
        description in "([A-Za-z0-9<>'&\"]([A-Za-z0-9<>'&\" \r\n\t]{0,60}[A-Za-z0-9])?)?",
        cents in 0i64..100_000_000_000,
        stock in 0..=MAX_STOCK,
        limit in proptest::option::of(1..=i32::MAX),
        start_minute in 0i64..4_000_000,
        length_minutes in proptest::option::of(1i64..1_000_000),
        queue in proptest::option::of(proptest::option::of(0i64..100_000)),
    ) {
        let starts_at = minute(start_minute);
        // Queue mode needs a limit; its opening is at most the start.
        let limit = if queue.is_some() { limit.or(Some(1)) } else { limit };
        let queue_opens_at = queue.flatten().map(|before| minute(start_minute - before));
        let product = Product {
            id: 1,
            name: name.clone(),
            description: description.clone(),
            price_cents: cents,
            stock,
            initial_stock: stock,
            per_customer_limit: limit,
            sale_starts_at: starts_at,
            sale_ends_at: length_minutes.map(|m| minute(start_minute + m)),
            created_at: starts_at,
            updated_at: starts_at,
            fence: 0,
            queue_mode: queue.is_some(),
            queue_opens_at,
            join_check_work: 2_000,
        };
        let fields = SaleFields::of(&SaleSpec::of(&product));
        prop_assert_eq!(fields.queue_ticked(), product.queue_mode);
        let spec = fields.spec(1).unwrap();
        prop_assert_eq!(spec.name, name);
        prop_assert_eq!(spec.description, description);
        prop_assert_eq!(spec.price.cents(), cents);
        prop_assert_eq!(spec.stock, stock);
        prop_assert_eq!(spec.per_customer_limit, limit);
        prop_assert_eq!(spec.starts_at, product.sale_starts_at);
        prop_assert_eq!(spec.ends_at, product.sale_ends_at);
        prop_assert_eq!(spec.queue_mode, product.queue_mode);
        prop_assert_eq!(spec.queue_opens_at, product.queue_opens_at);
        let terms = fields.terms(1).unwrap();
        prop_assert_eq!(terms.queue_mode, product.queue_mode);
        prop_assert_eq!(terms.queue_opens_at, product.queue_opens_at);
    }

    #[test]
    fn order_searches_never_reach_the_database_with_nul(
        email in hostile_text(),
        status in prop_oneof![hostile_text(), Just("paid".to_string())],
        product in hostile_text(),
    ) {
        let search = OrderSearch { email: email.clone(), status, product, page: String::new() };
        match search.filter() {
            Ok(filter) => prop_assert!(filter.email.is_none_or(|e| !e.contains('\0'))),
            Err(error) => {
                prop_assert!(error.status_code().is_client_error());
                assert_safe_message(error);
            }
        }
    }

    /// The same path the fuzz target takes, for every form: urlencoded bytes
    /// decoded into the raw form, then parsed.
    #[test]
    fn any_urlencoded_body_parses_or_is_refused_without_panicking(
        body in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..400),
            proptest::collection::vec(
                ("(quantity|product_id|card_number|email|password|delta|reason|name|price|stock|starts_at|ends_at|queue_mode|queue_opens_at|per_customer_limit|idempotency_key|status|product)", hostile_text()),
                0..6,
            ).prop_map(|fields| serde_urlencoded::to_string(fields).unwrap().into_bytes()),
        ]
    ) {
        fn form<T: DeserializeOwned>(body: &[u8]) -> Option<T> {
            serde_urlencoded::from_bytes(body).ok()
        }
        let refusals: Vec<AppError> = [
            form::<CredentialsForm>(&body).and_then(|f| f.sign_up().err()),
            form::<CredentialsForm>(&body).and_then(|f| f.sign_in().err()),
            form::<BuyForm>(&body).and_then(|f| f.quantity().err()),
            form::<CartForm>(&body).and_then(|f| f.addition().err()),
            form::<CartForm>(&body).and_then(|f| f.change().err()),
            form::<CartForm>(&body).and_then(|f| f.removal().err()),
            form::<PayForm>(&body).and_then(|f| f.card().err()),
            form::<AdjustForm>(&body).and_then(|f| f.adjustment().err()),
            form::<SaleFields>(&body).and_then(|f| f.spec(1).err().map(AppError::from)),
            form::<OrderSearch>(&body).and_then(|f| f.filter().err()),
        ]
        .into_iter()
        .flatten()
        .collect();
        for error in refusals {
            prop_assert!(error.status_code().is_client_error(), "{error:?}");
            assert_safe_message(error);
        }
        let _ = form::<CsrfOnlyForm>(&body);
    }
}

fn minute(n: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2020, 1, 1, 0, 0, 0).unwrap() + chrono::Duration::minutes(n)
}

#[test]
fn a_refusal_shows_markup_escaped() {
    let error = AppError::from(Quantity::parse(SCRIPT).unwrap_err());
    let page = error_page(error);
    assert!(
        page.contains("&#60;script&#62;alert(1)&#60;/script&#62;"),
        "the input is shown escaped: {page}"
    );
    assert!(!page.contains(SCRIPT));
}

#[test]
fn a_nul_in_a_name_description_or_reason_is_refused() {
    let fields = SaleFields {
        name: "Lamp\0".into(),
        price: "10".into(),
        stock: "5".into(),
        starts_at: "2026-12-01T09:00".into(),
        ..SaleFields::default()
    };
    let refused = AppError::from(fields.spec(1).unwrap_err());
    assert!(flashsale::web::error::in_words(&refused).contains("control characters"));
    let fields = SaleFields {
        name: "Lamp".into(),
        description: "bright\0".into(),
        ..fields
    };
    assert!(fields.spec(1).is_err());
    let form = AdjustForm {
        delta: "5".into(),
        reason: "found\0".into(),
        csrf_token: String::new(),
    };
    assert!(form.adjustment().is_err());
}

#[test]
fn sale_years_postgres_cannot_store_are_refused() {
    for start in [
        "-5000-01-01T00:00",
        "+20000-01-01T00:00",
        "0900-01-01T00:00",
    ] {
        let fields = SaleFields {
            name: "Lamp".into(),
            price: "10".into(),
            stock: "5".into(),
            starts_at: start.into(),
            ..SaleFields::default()
        };
        assert!(fields.spec(1).is_err(), "{start} should be refused");
    }
}
