//! The integration suite: the real HTTP server, real Postgres and real Redis.
//! One test binary with a module per area, so the crate is linked once; the
//! harness is in `helpers/`.

mod helpers;

mod admin_console;
mod bad_input;
mod crash_recovery;
mod door;
mod drop_ux;
mod e2e_browser;
mod e2e_door;
mod e2e_drop_ux;
mod fail_closed;
mod fault_matrix;
mod form_parsers;
mod gate_answers;
mod graceful_stop;
mod group_commit;
mod high_availability;
mod holdings;
mod hostile_input;
mod hot_product;
mod idempotency_keys;
mod lab;
mod lifecycle;
mod mail;
mod observability;
mod planning;
mod purchase_race;
mod race_command;
mod redis_namespace;
mod restore_race;
mod security;
mod sessions;
mod shop_pages;
mod soak;
mod stock_gate;
mod uncertain_commit;
mod waiting_room;
mod waiting_room_admin;
mod waiting_room_crowd;
mod waiting_room_pages;
