//! Who the current task acts for: a request's address and door, and the
//! actor authentication names once it knows it.
//!
//! A request runs inside [`scope`]; authentication calls [`set_actor`];
//! the store's commit reads [`current`] and records it with every audited
//! event the transaction emits. A task outside any scope (a worker, the
//! autoscaler) acts as the appliance itself. Nothing here reads or writes
//! the store: the API sets who acts without knowing where it is kept.

use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::domain::audit::{Origin, Via};

tokio::task_local! {
    // Shared, so that a write takes who acts for the price of a reference
    // count; replaced whole when authentication names the actor.
    static ORIGIN: Mutex<Arc<Origin>>;
}

/// Runs `f` as done by `origin`: a request from its address through its
/// door, whose actor authentication names once it knows it.
pub fn scope<F: Future>(origin: impl Into<Arc<Origin>>, f: F) -> impl Future<Output = F::Output> {
    ORIGIN.scope(Mutex::new(origin.into()), f)
}

/// Names who the current request acts as.
pub fn set_actor(actor: &str) {
    let _ = ORIGIN.try_with(|o| {
        let mut o = o.lock();
        if o.actor != actor {
            let mut named = Origin::clone(&o);
            actor.clone_into(&mut named.actor);
            *o = Arc::new(named);
        }
    });
}

/// Who the current task acts as, once authenticated.
pub fn current() -> Option<Arc<Origin>> {
    ORIGIN
        .try_with(|o| o.lock().clone())
        .ok()
        .filter(|o| !o.actor.is_empty())
}

/// Where the current request came from, authenticated or not.
pub fn current_address() -> Option<(String, Via)> {
    ORIGIN
        .try_with(|o| {
            let o = o.lock();
            (o.address.clone(), o.via)
        })
        .ok()
}
