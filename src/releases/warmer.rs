//! The ReleaseCacheWarmer: verifies releases before their first dispatch.
//!
//! Every release is verified when it is imported. The warmer keeps that
//! verdict current: a release verified against an older adapter version
//! (the appliance was upgraded) or under another set of trusted keys (the
//! configuration changed) is verified again from its stored contents, so
//! that the first dispatch after the change does not pay for it, and a
//! release whose signer is no longer trusted is rejected before anyone
//! runs it.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;

use super::Releases;
use crate::worker::{RetryKind, Schedule, Worker};

/// The worker.
pub struct ReleaseCacheWarmer {
    /// The service.
    pub releases: Arc<Releases>,
    /// Time between passes.
    pub every: Duration,
}

impl Worker for ReleaseCacheWarmer {
    fn name(&self) -> &'static str {
        "ReleaseCacheWarmer"
    }

    fn schedule(&self) -> Schedule {
        Schedule::Every(self.every)
    }

    fn retry(&self) -> RetryKind {
        RetryKind::Exponential
    }

    fn run(&self, _now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(async move {
            let done = self.releases.reverify_stale().await?;
            Ok(format!("releases re-verified: {done}"))
        })
    }
}
