//! An attempt followed as it runs: its views as they change, and its
//! events in outbox order, backlog first and then live. The API's SSE
//! routes, the Runtime RPC's watch and the console read these streams.

use std::sync::Arc;

use futures::Stream;
use tokio::sync::watch;
use uuid::Uuid;

use super::grain::AttemptView;
use super::{Runtime, RuntimeError};
use crate::domain::access::TenantScope;
use crate::domain::attempt::AttemptState;
use crate::domain::events::StoredEvent;

impl Runtime {
    /// The attempt's views as they change, starting with the current one and
    /// ending after the final one.
    pub fn updates(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<impl Stream<Item = Arc<AttemptView>> + Send + use<>, RuntimeError> {
        let mut rx = self.watch(scope, attempt_id)?;
        let (runtime, scope) = (self.clone(), scope.clone());
        Ok(async_stream(move |yield_| async move {
            let mut last = 0u64;
            loop {
                let view = rx.borrow_and_update().clone();
                if view.attempt.version != last || view.attempt.state.is_terminal() {
                    last = view.attempt.version;
                    let done = view.attempt.state.is_terminal();
                    if yield_.send(view).await.is_err() || done {
                        return;
                    }
                }
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() {
                        // The grain ended: the stored attempt is the last word.
                        if let Ok(v) = runtime.view(&scope, attempt_id) {
                            let _ = yield_.send(v).await;
                        }
                        return;
                    },
                    _ = shutdown.changed() => return,
                }
            }
        }))
    }

    /// Every event of an attempt after `after`, in outbox order (read through
    /// the attempt's event index, then live as each becomes durable), until
    /// the attempt has ended and all its events are delivered. Nothing is
    /// coalesced: a reader that resumes with the last sequence it got misses
    /// nothing and gets nothing twice.
    pub fn events(
        &self,
        scope: &TenantScope,
        attempt_id: Uuid,
        after: u64,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<impl Stream<Item = Arc<StoredEvent>> + Send + use<>, RuntimeError> {
        // The attempt exists in the caller's tenant (or this is NotFound).
        self.attempt(scope, attempt_id)?;
        let (store, runtime, scope) = (self.shared.store.clone(), self.clone(), scope.clone());
        let id = attempt_id.to_string();
        Ok(async_stream(move |yield_| async move {
            let mut live = store.subscribe();
            let mut last = after;
            loop {
                // The attempt's grain is gone only once its last write is
                // durable: then everything it emitted is in the backlog.
                let ended = !runtime.is_live(&scope, attempt_id)
                    && runtime
                        .attempt(&scope, attempt_id)
                        .is_ok_and(|a| a.state.is_terminal());
                loop {
                    let batch = match store.attempt_events_after(&scope, attempt_id, last, 256) {
                        Ok(b) => b,
                        Err(e) => {
                            tracing::warn!(attempt = %attempt_id, error = %e, "attempt event stream stopped");
                            return;
                        }
                    };
                    let full = batch.len() == 256;
                    for event in batch {
                        last = event.sequence;
                        if yield_.send(event).await.is_err() {
                            return;
                        }
                    }
                    if !full {
                        break;
                    }
                }
                if ended {
                    return;
                }
                // Wait for the next durable event of the attempt (or its end).
                loop {
                    let received = tokio::select! {
                        r = live.recv() => r,
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => break,
                        _ = shutdown.changed() => return,
                        _ = yield_.closed() => return,
                    };
                    match received {
                        Ok(event) => {
                            if event.sequence <= last
                                || event.tenant_id != *scope.tenant()
                                || event.attempt_id() != Some(id.as_str())
                            {
                                continue;
                            }
                            last = event.sequence;
                            let terminal = event
                                .payload
                                .get("state")
                                .and_then(|s| s.as_str())
                                .and_then(AttemptState::parse)
                                .is_some_and(AttemptState::is_terminal);
                            if yield_.send(event).await.is_err() {
                                return;
                            }
                            if terminal {
                                // The rest of its last transaction, then the end.
                                break;
                            }
                        }
                        // Fell behind the broadcast: read the backlog again.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    }
                }
            }
        }))
    }
}

/// A stream fed by a producer task over a small channel.
pub fn async_stream<T, F, Fut>(produce: F) -> impl Stream<Item = T> + Send + use<T, F, Fut>
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<T>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(produce(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
