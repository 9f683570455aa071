//! What the QA commands and the integration tests both need to drive a real
//! shop: a throw-away database, the shop served in-process, a browser-like
//! client with its session and CSRF tokens, and the sandbox's test cards.
//! One copy here, so the tests prove the same client the QA tools use.

mod browser;
mod cards;
mod database;
mod served;

pub use browser::{csrf_token, solve, Browser};
pub use cards::{DECLINED_CARD, GOOD_CARD, LOST_ANSWER_CARD, SLOW_CARD};
pub use database::{Count, ScratchDb};
pub use served::ServedShop;
