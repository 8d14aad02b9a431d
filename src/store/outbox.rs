//! The outbox: every event, numbered in commit order.
//!
//! Keys are the big-endian sequence number, so a range scan from any
//! sequence resumes a stream exactly. Sequence numbers are never reused:
//! when old events are pruned, the highest pruned number is kept in `meta`.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::Stream;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::kv::{KvRead, Reading};
use super::{Store, StoreError, Table};
use crate::domain::TenantId;
use crate::domain::events::{EventFilter, StoredEvent};

const EVENT_VERSION: u16 = 1;
/// Meta key holding the highest sequence ever pruned.
pub(super) const PRUNED_THROUGH: &str = "outbox.pruned_through";

/// The index of an attempt's events (in the `index` tree):
/// `<tenant>/attempt-events/<attempt>/<sequence, 20 digits>`.
pub(super) const ATTEMPT_EVENTS: &str = "attempt-events";

impl StoredEvent {
    /// The attempt the event is about, when it is about one.
    pub fn attempt_id(&self) -> Option<&str> {
        self.payload.get("attemptId").and_then(|v| v.as_str())
    }

    /// Its key in the index of its attempt's events.
    pub(super) fn attempt_index_key(&self) -> Option<Vec<u8>> {
        let attempt = self.attempt_id()?;
        let mut key = super::derived::tenant_prefix(&self.tenant_id, ATTEMPT_EVENTS, attempt);
        key.extend_from_slice(format!("{:020}", self.sequence).as_bytes());
        Some(key)
    }

    pub(super) fn encode(&self) -> Result<Vec<u8>, StoreError> {
        let mut out = EVENT_VERSION.to_be_bytes().to_vec();
        // JSON inside msgpack keeps arbitrary payloads lossless.
        let body = (
            self.sequence,
            &self.topic,
            &self.tenant_id,
            self.occurred_at,
            serde_json::to_string(&self.payload).expect("JSON values serialise"),
        );
        rmp_serde::encode::write(&mut out, &body).map_err(|e| StoreError::Corrupt {
            table: "outbox",
            key: self.sequence.to_string(),
            reason: e.to_string(),
        })?;
        Ok(out)
    }

    pub(super) fn decode(key: &[u8], bytes: &[u8]) -> Result<StoredEvent, StoreError> {
        let corrupt = |reason: String| StoreError::Corrupt {
            table: "outbox",
            key: format!("{key:?}"),
            reason,
        };
        if bytes.len() < 2 || u16::from_be_bytes([bytes[0], bytes[1]]) != EVENT_VERSION {
            return Err(corrupt("unknown event encoding".into()));
        }
        let (sequence, topic, tenant_id, occurred_at, payload): (
            u64,
            String,
            TenantId,
            DateTime<Utc>,
            String,
        ) = rmp_serde::from_slice(&bytes[2..]).map_err(|e| corrupt(e.to_string()))?;
        Ok(StoredEvent {
            sequence,
            topic,
            tenant_id,
            occurred_at,
            payload: serde_json::from_str(&payload).map_err(|e| corrupt(e.to_string()))?,
        })
    }
}

pub(super) fn read_after(
    tree: &Reading<'_>,
    filter: &EventFilter,
    after: u64,
    limit: usize,
) -> Result<Vec<Arc<StoredEvent>>, StoreError> {
    let start = after.saturating_add(1).to_be_bytes();
    let mut out = Vec::new();
    for item in tree.range(start..) {
        let (k, v) = item?;
        let event = StoredEvent::decode(&k, &v)?;
        if filter.admits(&event) {
            out.push(Arc::new(event));
            if out.len() >= limit {
                break;
            }
        }
    }
    Ok(out)
}

/// The events of one attempt after `after`, by the attempt's index, at
/// most `limit`, in sequence order.
pub(super) fn attempt_events_after(
    outbox: &Reading<'_>,
    index: &Reading<'_>,
    tenant: &TenantId,
    attempt_id: &str,
    after: u64,
    limit: usize,
) -> Result<Vec<Arc<StoredEvent>>, StoreError> {
    let prefix = super::derived::tenant_prefix(tenant, ATTEMPT_EVENTS, attempt_id);
    let mut start = prefix.clone();
    start.extend_from_slice(format!("{:020}", after.saturating_add(1)).as_bytes());
    let mut out = Vec::new();
    for item in index.range(start..) {
        let (k, _) = item?;
        if !k.starts_with(&prefix) || out.len() >= limit {
            break;
        }
        let sequence: u64 = std::str::from_utf8(&k[prefix.len()..])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| StoreError::Corrupt {
                table: "index",
                key: String::from_utf8_lossy(&k).into_owned(),
                reason: "not an event sequence".into(),
            })?;
        // An index entry outlives its event only inside the transaction
        // that prunes both.
        if let Some(v) = outbox.get(sequence.to_be_bytes())? {
            out.push(Arc::new(StoredEvent::decode(&sequence.to_be_bytes(), &v)?));
        }
    }
    Ok(out)
}

/// An event to prune: its sequence and its key in its attempt's index.
pub(super) type Expired = (u64, Option<Vec<u8>>);

/// The oldest events that occurred before `cutoff`, at most `limit`,
/// stopping at the first younger one.
pub(super) fn expired(
    tree: &Reading<'_>,
    cutoff: DateTime<Utc>,
    limit: usize,
) -> Result<Vec<Expired>, StoreError> {
    let mut out = Vec::new();
    for item in tree.iter() {
        let (k, v) = item?;
        let event = StoredEvent::decode(&k, &v)?;
        if event.occurred_at >= cutoff || out.len() >= limit {
            break;
        }
        out.push((event.sequence, event.attempt_index_key()));
    }
    Ok(out)
}

/// The sequence the next event gets: one past the highest ever written.
pub(super) fn next_sequence(kv: &dyn KvRead) -> Result<u64, StoreError> {
    let last = match Reading::new(kv, Table::Outbox).last()? {
        Some((k, _)) => {
            u64::from_be_bytes(k.as_slice().try_into().map_err(|_| StoreError::Corrupt {
                table: "outbox",
                key: format!("{k:?}"),
                reason: "key is not a sequence number".into(),
            })?)
        }
        None => 0,
    };
    let pruned = kv
        .get(Table::Meta, PRUNED_THROUGH.as_bytes())?
        .and_then(|v| v.as_slice().try_into().ok().map(u64::from_be_bytes))
        .unwrap_or(0);
    Ok(last.max(pruned) + 1)
}

impl Store {
    /// Events after `after` that pass `filter`, then live ones, until the client
    /// goes away or the appliance shuts down; with `until` (at most the head),
    /// only those up to that sequence, then the stream ends.
    pub fn event_stream(
        &self,
        filter: EventFilter,
        after: u64,
        until: Option<u64>,
        mut shutdown: watch::Receiver<bool>,
    ) -> impl Stream<Item = Arc<StoredEvent>> + Send + use<> {
        let (tx, rx) = mpsc::channel::<Arc<StoredEvent>>(256);
        let store = self.clone();
        tokio::spawn(async move {
            // Subscribe before reading the backlog so that nothing committed in
            // between is missed; duplicates are skipped by sequence.
            let mut live = store.subscribe();
            let mut last = after;
            loop {
                // Catch up from the store, up to the head: an event stored but
                // not yet durable could still be lost (and its number given to
                // another); it arrives live once it is durable.
                loop {
                    let head = store.events_head();
                    let batch = match store.events_after(&filter, last, 500) {
                        Ok(b) => b,
                        Err(e) => {
                            tracing::warn!(error = %e, "event stream stopped: cannot read the outbox");
                            return;
                        }
                    };
                    let mut done = batch.len() < 500;
                    for event in batch {
                        if until.is_some_and(|u| event.sequence > u) {
                            return;
                        }
                        if event.sequence > head {
                            done = true;
                            break;
                        }
                        last = event.sequence;
                        if tx.send(event).await.is_err() {
                            return;
                        }
                    }
                    if done {
                        break;
                    }
                }
                // Every event up to `until` was durable, so stored, when the
                // stream began: the backlog held all of them.
                if until.is_some() {
                    return;
                }
                // Then follow live events until this reader falls behind.
                loop {
                    let received = tokio::select! {
                        r = live.recv() => r,
                        _ = shutdown.changed() => return,
                        _ = tx.closed() => return,
                    };
                    match received {
                        Ok(event) => {
                            if event.sequence <= last || !filter.admits(&event) {
                                continue;
                            }
                            last = event.sequence;
                            if tx.send(event).await.is_err() {
                                return;
                            }
                        }
                        // Fell behind the broadcast buffer: re-read from the store.
                        Err(RecvError::Lagged(_)) => break,
                        Err(RecvError::Closed) => return,
                    }
                }
            }
        });
        ReceiverStream::new(rx)
    }
}
