//! Integration tests: the real `agentbay` binary over real HTTPS, with a
//! real store on disk. One test binary with a module per area, so the
//! dependency tree links once.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/pg.rs"]
mod pg;

mod alerts;
mod audit;
mod auth;
mod backup;
mod builtin;
mod capacity;
mod cli;
mod confine;
mod consistency;
mod console;
mod contract;
mod durability;
mod events;
mod ha;
mod http;
mod notify;
mod python;
mod readme;
mod releases;
mod rpc;
mod runtime;
mod security;
mod upgrade;
mod webhooks;
