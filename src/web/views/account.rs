//! The account's address: the confirmation link's answer, the address page
//! and the small notice an unconfirmed account sees.

use askama::Template;

use super::Nav;
use crate::web::format::timestamp;

/// What opening a confirmation link did.
#[derive(Template)]
#[template(path = "confirm.html")]
pub struct ConfirmPage {
    pub nav: Nav,
    pub title: &'static str,
    pub message: String,
    /// Offer a new link (the link was bad or old).
    pub offer_new_link: bool,
}

/// The account's address and whether it is confirmed.
#[derive(Template)]
#[template(path = "account_email.html")]
pub struct AddressPage {
    pub nav: Nav,
    pub email: String,
    pub confirmed_at: Option<String>,
    pub last_link_at: Option<String>,
    /// What the last request did (a refused resend says when to try again).
    pub message: Option<String>,
}

impl AddressPage {
    pub fn new(
        nav: Nav,
        state: crate::services::confirmation::AddressState,
        message: Option<String>,
    ) -> AddressPage {
        AddressPage {
            nav,
            email: state.email,
            confirmed_at: state.confirmed_at.map(timestamp),
            last_link_at: state.last_link_at.map(timestamp),
            message,
        }
    }
}
