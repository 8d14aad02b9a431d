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

use super::{ReleaseError, Releases};
use crate::domain::release::LoadState;
use crate::store::{StoreError, TenantScope};
use crate::worker::Worker;

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

    fn interval(&self) -> Duration {
        self.every
    }

    fn run(&self, _now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(async move {
            let releases = {
                let r = self.releases.clone();
                tokio::task::spawn_blocking(move || r.list(None)).await??
            };
            let stale: Vec<_> = releases
                .into_iter()
                .filter(|r| r.state == LoadState::Verified && !self.releases.is_current(r))
                .collect();
            let (mut verified, mut rejected, mut changed) = (0, 0, 0);
            for release in &stale {
                let scope = TenantScope::new(release.tenant_id.clone());
                match self.releases.reverify(&scope, release).await {
                    Ok(r) if r.state == LoadState::Verified => verified += 1,
                    Ok(_) => rejected += 1,
                    // Revoked or replaced since it was listed: the next
                    // pass verifies what is stored then.
                    Err(ReleaseError::Store(StoreError::Stale { .. })) => changed += 1,
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(format!(
                "{} releases re-verified: {verified} verified, {rejected} rejected, {changed} changed meanwhile (next pass)",
                stale.len()
            ))
        })
    }
}
