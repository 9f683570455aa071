//! The suite's harness: a fresh database per test (cloned from a migrated
//! template), a Redis key prefix per test, the real HTTP server on a free
//! port, and browser-like clients that carry cookies and CSRF tokens. What
//! the QA tools share with it lives in `flashsale::qa::harness`.

mod alone;
mod answers;
mod app;
mod browser;
mod cookies;
mod database;
pub mod hostile;
mod logs;
mod pg_proxy;
pub mod postgres;
mod processes;
mod redis;
mod smtp;

pub use alone::*;
pub use answers::*;
pub use app::*;
pub use browser::*;
pub use cookies::*;
pub use database::*;
pub use flashsale::qa::harness::{DECLINED_CARD, GOOD_CARD, LOST_ANSWER_CARD, SLOW_CARD};
pub use logs::*;
pub use pg_proxy::*;
pub use processes::*;
pub use redis::*;
pub use smtp::*;
