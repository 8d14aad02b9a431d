//! The runtime's workers: LeaseHeartbeat, OrphanedAttemptReconciler and
//! CheckpointCompactor, each a pass on the appliance clock.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;

use super::{Runtime, index};
use crate::domain::access::{PlatformScope, TenantScope};
use crate::domain::attempt::{Checkpoint, ExecutionAttempt};
use crate::domain::run::Run;
use crate::domain::tenant::Tenant;
use crate::store::{Tx, time_value};
use crate::worker::{RetryKind, Schedule, Worker};

/// Renews the capacity lease of every live attempt; a failed renewal
/// pauses the attempt at its next checkpoint, a later renewal resumes it.
pub struct LeaseHeartbeat {
    /// The runtime.
    pub runtime: Arc<Runtime>,
}

impl Worker for LeaseHeartbeat {
    fn name(&self) -> &'static str {
        "LeaseHeartbeat"
    }

    fn schedule(&self) -> Schedule {
        Schedule::seconds(self.runtime.config().heartbeat_seconds)
    }

    fn retry(&self) -> RetryKind {
        RetryKind::Fixed
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
}

impl Worker for OrphanedAttemptReconciler {
    fn name(&self) -> &'static str {
        "OrphanedAttemptReconciler"
    }

    fn schedule(&self) -> Schedule {
        Schedule::seconds(self.runtime.config().reconcile_interval_seconds)
    }

    fn retry(&self) -> RetryKind {
        RetryKind::Exponential
    }

    fn run(&self, _now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(async move {
            // An adapter told to come back while the store's database did
            // not answer has its lease's time to renew once it answers.
            let lease = std::time::Duration::from_secs(self.runtime.config().attempt_lease_seconds);
            if let Some(why) = self.runtime.store().reach().settling(lease) {
                return Ok(format!("waits: {why}"));
            }
            let settled = self.runtime.reconcile().await?;
            Ok(format!("{} orphaned attempts settled", settled.len()))
        })
    }
}

/// Deletes superseded checkpoints of ended attempts after the retention
/// window; keeps each attempt's last checkpoint and every checkpoint that
/// is evidence (the ones before gated calls).
pub struct CheckpointCompactor {
    /// The runtime; its configuration says how often and how long
    /// superseded checkpoints are kept.
    pub runtime: Arc<Runtime>,
}

impl Worker for CheckpointCompactor {
    fn name(&self) -> &'static str {
        "CheckpointCompactor"
    }

    fn schedule(&self) -> Schedule {
        Schedule::Cron(Box::new(self.runtime.config().compact_schedule.clone()))
    }

    fn retry(&self) -> RetryKind {
        RetryKind::Fixed
    }

    fn run(&self, now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(async move {
            let store = self.runtime.store().clone();
            let retention =
                chrono::Duration::days(self.runtime.config().checkpoint_retention_days.into());
            let up_to = time_value(now - retention);
            let platform = PlatformScope::internal();
            let mut deleted = 0usize;
            for tenant in store.scan_all::<Tenant>(&platform)? {
                let scope = TenantScope::new(tenant.tenant_id);
                // Ended attempts in end order from where the last pass
                // stopped: each pass reads only what ended since.
                let cursor_key = format!("checkpoint-compactor/{}", scope.tenant());
                loop {
                    let cursor = store
                        .meta_get(&cursor_key)?
                        .map(|c| String::from_utf8_lossy(&c).into_owned());
                    let from = cursor.as_deref().and_then(|c| c.split_once('/'));
                    let due: Vec<(String, String)> = store
                        .index_range(
                            &scope,
                            index::ATTEMPT_ENDED,
                            from.map(|(v, _)| v),
                            Some(&up_to),
                            COMPACT_BATCH,
                        )?
                        .into_iter()
                        .filter(|(v, id)| {
                            from.is_none_or(|(cv, cid)| (v.as_str(), id.as_str()) > (cv, cid))
                        })
                        .collect();
                    let Some((last_value, last_id)) = due.last().cloned() else {
                        break;
                    };
                    let s = scope.clone();
                    let key = cursor_key.clone();
                    deleted += store
                        .transact(move |tx: &mut Tx| {
                            let mut n = 0;
                            for (_, id) in &due {
                                n += compact_one(tx, &s, id)?;
                            }
                            tx.meta_put(&key, format!("{last_value}/{last_id}").as_bytes());
                            Ok::<_, crate::store::StoreError>(n)
                        })
                        .await?;
                }
            }
            Ok(format!("{deleted} superseded checkpoints deleted"))
        })
    }
}

/// Ended attempts one compaction transaction handles.
const COMPACT_BATCH: usize = 64;

/// Deletes the superseded checkpoints of one ended attempt (their blobs go
/// with their last reference); keeps the last one, the evidence, and
/// everything of a run on hold. Returns how many it deleted.
fn compact_one(
    tx: &mut Tx,
    scope: &TenantScope,
    attempt_id: &str,
) -> Result<usize, crate::store::StoreError> {
    let Some(attempt) = tx.get::<ExecutionAttempt>(scope, attempt_id)? else {
        return Ok(0);
    };
    let held = tx
        .get::<Run>(scope, &attempt.run_id.to_string())?
        .is_some_and(|r| r.hold.is_some());
    if held || !attempt.state.is_terminal() {
        return Ok(0);
    }
    let doomed: Vec<String> = tx
        .list_under::<Checkpoint>(scope, &format!("{attempt_id}/"))?
        .iter()
        .filter(|c| Some(c.checkpoint_id) != attempt.last_checkpoint_id && !c.evidence)
        .map(|c| Checkpoint::key(c.attempt_id, c.sequence))
        .collect();
    for key in &doomed {
        tx.delete::<Checkpoint>(scope, key)?;
    }
    Ok(doomed.len())
}
