//! flashsale: a server-rendered flash-sale shop that never sells more than it has.
//!
//! # Layout
//!
//! Calls go one way, from the top of this list to the bottom; nothing below
//! `web` knows HTML or HTTP, and nothing below `services` knows the shop's
//! use cases.
//!
//! - `startup`, `cli`: build the application (`Application::build`) and the
//!   command line; `main.rs` only calls `cli::main`. `shutdown`: the
//!   graceful stop (draining, tracked tasks, the jobs' stop signal).
//!   `serial`: the runtime of the tasks that serve others one step at a
//!   time (batch leaders, committers, join writers), off the request workers.
//! - `web`: thin handlers per area (parse the form into domain types, call a
//!   service, render a template or redirect), the session cookie
//!   (`web::session_cookie`: sealed entries, opened once per thread) and
//!   the session and CSRF extractors, and `web::error`, where an
//!   `AppError` becomes a page.
//! - `services`: the use cases, each taking the `Shop` (the shop's parts).
//!   `services::checkout` serves purchases: gate admission, one batch per
//!   lock hold for a hot product, a lone transaction for a cart, the rules
//!   every buyer is checked against and the SQL that writes orders. Beside
//!   it: payment, restore (decline, expiry, refund), stock adjustments,
//!   keeping the stock gate in step (`stock_gate`), jobs, accounts, sessions
//!   and each process's list of revoked ones (`revocations`).
//!   `services::waiting_room` runs the queue-mode sales' waiting rooms, all
//!   decided in Postgres (joins, the draw, passes, standings, `draw.json`).
//! - `lock`: per-product Redlock locks with a local queue, lease watchdog and
//!   fencing tokens. `gate`: the Redis stock gate's counters and scripts.
//!   `payment`: payment providers (the sandbox). `db`: the pool, the one
//!   helper that runs blocking Diesel, migrations, schema, row types, how
//!   Diesel errors become `AppError`, and the connection that listens for
//!   revoked sessions. `redis_node`: kept Redis connections, one per thread;
//!   `redis_batch`: calls of one script on one product gathered into one
//!   Redis call while an earlier one is in flight.
//! - `domain`: types valid by construction (ids, money, quantities, emails,
//!   card numbers, order states, sale states and refusals), and the waiting
//!   room's draw (`domain::draw`: pure computation, checkable by anyone).
//! - `config` (settings from the environment, one loader), `error` (the one
//!   error type), `metrics`, `logging`: used from every layer.
//! - `qa`: the QA toolkit behind `flashsale race`, `lab`, `bench` and
//!   `draw verify`, and the harness it shares with the integration tests.

pub mod cli;
pub mod config;
pub mod db;
pub mod domain;
pub mod error;
pub mod gate;
pub mod lock;
pub mod logging;
pub mod metrics;
pub mod payment;
pub mod qa;
pub mod redis_batch;
pub mod redis_node;
pub mod serial;
pub mod services;
pub mod shutdown;
pub mod startup;
pub mod web;
