//! The rules of agentbay, pure: no IO, no async, no clock reads.
//!
//! Each aggregate lives in a file of its own with its types and its
//! transitions: `state + command (+ now) -> new state + events`, or a typed
//! error. Everything else in the crate moves bytes around these decisions.

pub mod access;
pub mod amount;
pub mod attempt;
pub mod audit;
pub mod backup;
pub mod capacity;
pub mod cluster;
pub mod content;
pub mod credential;
pub mod csv;
pub mod diff;
pub mod error;
pub mod events;
pub mod form;
pub mod ids;
pub mod model_profile;
pub mod model_server;
pub mod notify;
pub mod reach;
pub mod release;
pub mod rerun;
pub mod retention;
pub mod run;
pub mod tenant;
pub mod text;
pub mod trust;
pub mod usage;
pub mod user;
pub mod webhook;

pub use error::{DomainError, FieldError};
pub use ids::{ProjectId, TenantId};

/// The version a stored aggregate reads as when it was written before
/// aggregates carried versions: it exists, so it is not new (0).
pub fn stored_before_versions() -> u64 {
    1
}
