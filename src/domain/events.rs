//! Events: what changed, named by the specification's topics.
//!
//! A domain transition returns the events it causes; the store writes them
//! to the outbox in the same transaction as the state change, where they get
//! their sequence number. Payloads are the specification's, in camelCase.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::ids::TenantId;

/// An event a transition produced, before the store gives it a sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    /// Topic, for example `capacity.leases.v1.capacity-lease-granted`.
    pub topic: &'static str,
    /// Tenant whose data changed; only that tenant (and PlatformAdmins) see it.
    pub tenant_id: TenantId,
    /// When the change happened, from the appliance's clock.
    pub occurred_at: DateTime<Utc>,
    /// The payload as the specification defines it.
    pub payload: serde_json::Value,
}

/// A payload type that knows its topic.
pub trait EventPayload: Serialize {
    /// The topic this payload is published under.
    const TOPIC: &'static str;
}

impl NewEvent {
    /// Wraps a payload with its topic.
    pub fn new<P: EventPayload>(tenant_id: &TenantId, at: DateTime<Utc>, payload: &P) -> Self {
        NewEvent {
            topic: P::TOPIC,
            tenant_id: tenant_id.clone(),
            occurred_at: at,
            // Payload structs hold strings, numbers and lists only, for
            // which serialisation to a JSON value cannot fail.
            payload: serde_json::to_value(payload).expect("event payloads serialise"),
        }
    }
}

/// An event as committed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredEvent {
    /// Position in the outbox, from 1.
    pub sequence: u64,
    /// The specification's topic.
    pub topic: String,
    /// Whose data changed.
    pub tenant_id: TenantId,
    /// When it changed.
    pub occurred_at: DateTime<Utc>,
    /// The specification's payload.
    pub payload: serde_json::Value,
}

/// Which events a reader may and wants to see.
#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    /// Only this tenant's events; `None` for every tenant (PlatformAdmin).
    pub tenant: Option<TenantId>,
    /// Topic prefixes; empty for every topic.
    pub topics: Vec<String>,
}

impl EventFilter {
    /// Whether the event passes.
    pub fn admits(&self, event: &StoredEvent) -> bool {
        self.tenant.as_ref().is_none_or(|t| *t == event.tenant_id)
            && (self.topics.is_empty() || self.topics.iter().any(|p| event.topic.starts_with(p)))
    }
}
