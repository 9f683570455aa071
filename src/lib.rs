//! flashsale: a server-rendered flash-sale shop that never sells more than it has.

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
pub mod redis_node;
pub mod services;
pub mod startup;
pub mod web;
