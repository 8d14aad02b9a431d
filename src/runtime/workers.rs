//! The runtime's workers: LeaseHeartbeat, OrphanedAttemptReconciler and
//! CheckpointCompactor, each a pass on the appliance clock.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;

use super::Runtime;
use crate::domain::attempt::{Checkpoint, ExecutionAttempt};
use crate::store::{PlatformScope, TenantScope, Tx};
use crate::worker::Worker;

/// Renews the capacity lease of every live attempt; a failed renewal
/// pauses the attempt at its next checkpoint, a later renewal resumes it.
pub struct LeaseHeartbeat {
    /// The runtime.
    pub runtime: Arc<Runtime>,
    /// Between passes (`runtime.heartbeat_seconds`).
    pub every: Duration,
}

impl Worker for LeaseHeartbeat {
    fn name(&self) -> &'static str {
        "LeaseHeartbeat"
    }

    fn interval(&self) -> Duration {
        self.every
    }

    fn run(&self, _now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(async move {
            let (renewed, failed) = self.runtime.heartbeat_all().await;
            Ok(format!(
                "{renewed} leases renewed, {failed} renewals failed"
            ))
        })
    }
}

/// Settles attempts whose adapter lease lapsed: Uncertain with an
/// unconfirmed call in flight, otherwise Cancelled (infrastructure), which
/// lets run control start a new attempt.
pub struct OrphanedAttemptReconciler {
    /// The runtime.
    pub runtime: Arc<Runtime>,
    /// Between passes.
    pub every: Duration,
}

impl Worker for OrphanedAttemptReconciler {
    fn name(&self) -> &'static str {
        "OrphanedAttemptReconciler"
    }

    fn interval(&self) -> Duration {
        self.every
    }

    fn run(&self, _now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(async move {
            let settled = self.runtime.reconcile().await?;
            Ok(format!("{} orphaned attempts settled", settled.len()))
        })
    }
}

/// Deletes superseded checkpoints of ended attempts after the retention
/// window; keeps each attempt's last checkpoint and every checkpoint that
/// is evidence (the ones before gated calls).
pub struct CheckpointCompactor {
    /// The runtime.
    pub runtime: Arc<Runtime>,
    /// Between passes.
    pub every: Duration,
    /// How long superseded checkpoints are kept.
    pub retention: chrono::Duration,
}

impl Worker for CheckpointCompactor {
    fn name(&self) -> &'static str {
        "CheckpointCompactor"
    }

    fn interval(&self) -> Duration {
        self.every
    }

    fn run(&self, now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(async move {
            let store = self.runtime.store().clone();
            let cutoff = now - self.retention;
            let ended: Vec<ExecutionAttempt> = store
                .scan_all::<ExecutionAttempt>(&PlatformScope::internal())?
                .into_iter()
                .filter(|a| a.state.is_terminal() && a.ended_at.is_some_and(|t| t <= cutoff))
                .collect();
            let mut deleted = 0usize;
            for attempt in ended {
                let scope = TenantScope::new(attempt.tenant_id.clone());
                let checkpoints: Vec<Checkpoint> =
                    store.list_under(&scope, &format!("{}/", attempt.attempt_id))?;
                let doomed: Vec<String> = checkpoints
                    .iter()
                    .filter(|c| Some(c.checkpoint_id) != attempt.last_checkpoint_id && !c.evidence)
                    .map(|c| Checkpoint::key(c.attempt_id, c.sequence))
                    .collect();
                if doomed.is_empty() {
                    continue;
                }
                deleted += doomed.len();
                store
                    .transact(move |tx: &mut Tx| {
                        for key in &doomed {
                            tx.delete::<Checkpoint>(&scope, key)?;
                        }
                        Ok::<_, crate::store::StoreError>(())
                    })
                    .await?;
            }
            Ok(format!("{deleted} superseded checkpoints deleted"))
        })
    }
}
