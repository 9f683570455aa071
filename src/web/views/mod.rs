//! What each page shows: one askama template struct per page and the view
//! data it reads, grouped by area like the handlers that render them. This
//! file holds what every page shares: the layout's header data, rendering
//! and pagination.

pub mod account;
pub mod action_log;
pub mod admin;
pub mod auth;
pub mod cart;
pub mod draw;
pub mod mail;
pub mod operations;
pub mod orders;
pub mod sale;
pub mod shop;
pub mod waiting_room;
pub mod waiting_room_admin;

use crate::web::session_cookie::Session;
use askama::Template;

use super::session::{csrf_token, current_account};
use crate::domain::Role;
use crate::error::AppError;
use crate::services::accounts::Account;

/// What the base layout needs on every page: who is signed in and the form token.
pub struct Nav {
    pub account: Option<Account>,
    pub csrf_token: String,
}

impl Nav {
    pub fn from_session(session: &Session) -> Nav {
        Nav {
            account: current_account(session),
            csrf_token: csrf_token(session),
        }
    }

    /// For pages a CDN may share between strangers: a stranger's copy has no
    /// form token (their pages have no form that needs one), so viewing it
    /// starts no session and sets no cookie.
    pub fn for_shared_page(session: &Session) -> Nav {
        match current_account(session) {
            Some(account) => Nav {
                account: Some(account),
                csrf_token: csrf_token(session),
            },
            None => Nav {
                account: None,
                csrf_token: String::new(),
            },
        }
    }

    /// A one-time key for a state-changing form: a double click or a resend
    /// of the same rendered form carries the same key, so it runs once.
    pub fn idempotency_key(&self) -> String {
        uuid::Uuid::new_v4().simple().to_string()
    }

    pub fn is_admin(&self) -> bool {
        self.account.as_ref().is_some_and(|a| a.role == Role::Admin)
    }
}

pub fn render(page: &impl Template) -> Result<String, AppError> {
    page.render()
        .map_err(|e| AppError::Internal(anyhow::anyhow!("template: {e}")))
}

/// Pagination links that keep the rest of the query (search fields) intact.
pub struct Pager {
    pub page: i64,
    pub pages: i64,
    pub total: i64,
    pub prev: Option<String>,
    pub next: Option<String>,
}

impl Pager {
    /// `link(n)` builds the address of page `n`.
    pub fn new(page: i64, per_page: i64, total: i64, link: impl Fn(i64) -> String) -> Pager {
        let pages = ((total + per_page - 1) / per_page).max(1);
        Pager {
            page,
            pages,
            total,
            prev: (page > 1).then(|| link(page - 1)),
            next: (page < pages).then(|| link(page + 1)),
        }
    }
}
