//! Appliances sharing one PostgreSQL store: which one is active.
//!
//! Exactly one appliance of a pair is active: it holds the store's leader
//! row with an epoch no other appliance has held, and every write it
//! commits checks that epoch, so a deposed appliance's late write is
//! refused by the database. The others stand by: they answer health and
//! readiness and forward every other request to the active one.

use serde::Serialize;
use utoipa::ToSchema;

/// An appliance as the leader row names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// Its name among the pair (`store.postgres.node_name`).
    pub node: String,
    /// Where clients reach it (`store.postgres.advertise_url`).
    pub url: String,
    /// SHA-256 fingerprint of its TLS certificate, which a standby pins
    /// when it forwards a request.
    pub fingerprint: String,
    /// The epoch it holds (or held) the store with.
    pub epoch: i64,
}

/// This appliance's part in the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// It runs the grains, the workers and the event stream.
    Active,
    /// It waits to take over and forwards requests to the active one.
    Standby,
}
