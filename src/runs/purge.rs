//! The Purger: what retention says has expired, deleted in small batches.
//!
//! Each pass walks every tenant with the retention in force for it
//! (configuration defaults, the tenant's overrides) and, through indexes of
//! what is due (never a scan of history):
//!
//! 1. **payloads** of runs that ended before the payload cutoff: the run,
//!    its attempts, checkpoints, call records and decisions keep their
//!    hashes and get a [`Tombstone`]; their artifact references are dropped
//!    with it, so the content goes with its last reference;
//! 2. **history** of runs that ended before the history cutoff: the run and
//!    everything under its attempts are deleted;
//! 3. ended **leases** and per-day **minutes** before the history cutoff;
//! 4. **artifacts** nothing refers to any more whose retention has passed;
//! 5. **events** older than the longest history retention of any tenant.
//!
//! Every batch is one store transaction of at most
//! `retention.purge_batch_records` records, followed by a pause, so writers
//! always get the store between batches; a crash between batches loses
//! nothing but the batches not yet done, and a crash inside one leaves it
//! undone as a whole. Each batch decides inside its transaction: a run that
//! is live, held, or has an Uncertain call waiting for settlement is left
//! alone, whatever the index said when the batch was picked.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;

use super::index;
use crate::capacity::records::{ExecutionMinutes, index as lease_index};
use crate::config::RetentionConfig;
use crate::domain::access::{PlatformScope, TenantScope};
use crate::domain::attempt::{
    CallRecord, CallStatus, Checkpoint, DecisionRequest, ExecutionAttempt, SubAgentDelegation,
};
use crate::domain::capacity::CapacityLease;
use crate::domain::retention::{Retention, Tombstone};
use crate::domain::run::Run;
use crate::domain::tenant::Tenant;
use crate::store::artifacts::SWEEP_INDEX;
use crate::store::{Store, StoreError, Tx, time_value};
use crate::telemetry::names;
use crate::worker::{RetryKind, Schedule, Worker};

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Runs whose payloads were replaced by tombstones.
    pub payloads: u64,
    /// Runs deleted with everything under them.
    pub runs: u64,
    /// Other records deleted (leases, minutes).
    pub records: u64,
    /// Artifacts deleted.
    pub artifacts: u64,
    /// Events deleted.
    pub events: u64,
    /// Runs due but left alone (live, held or with an unsettled call).
    pub skipped: u64,
    /// Items still due when the pass ended: left alone (an unsettled call,
    /// a live attempt) or come due while it ran (0: caught up).
    pub backlog: u64,
}

/// The Purger worker.
pub struct Purger {
    /// The store.
    pub store: Store,
    /// Defaults and pacing (reloadable).
    pub config: crate::config::Live<RetentionConfig>,
}

impl Worker for Purger {
    fn name(&self) -> &'static str {
        "Purger"
    }

    fn schedule(&self) -> Schedule {
        Schedule::seconds(self.config.get().purge_interval_seconds)
    }

    fn retry(&self) -> RetryKind {
        RetryKind::Exponential
    }

    fn run(&self, now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(async move {
            let r = purge(&self.store, &self.config.get(), now).await?;
            Ok(format!(
                "{} run payloads tombstoned, {} runs, {} leases and minutes records, {} artifacts and {} events deleted; {} runs left alone (live, held or unsettled); backlog {}",
                r.payloads, r.runs, r.records, r.artifacts, r.events, r.skipped, r.backlog
            ))
        })
    }
}

/// Kinds of work of a pass, for the loop and the metric.
#[derive(Clone, Copy)]
enum Stage {
    Payloads,
    History,
    Leases,
    Artifacts,
}

impl Stage {
    fn index(self) -> &'static str {
        match self {
            Stage::Payloads => index::PAYLOAD_DUE,
            Stage::History => index::HISTORY_DUE,
            Stage::Leases => lease_index::ENDED,
            Stage::Artifacts => SWEEP_INDEX,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Stage::Payloads => "payloads",
            Stage::History => "runs",
            Stage::Leases => "leases",
            Stage::Artifacts => "artifacts",
        }
    }
}

/// One pass at `now`.
pub async fn purge(
    store: &Store,
    config: &RetentionConfig,
    now: DateTime<Utc>,
) -> Result<PurgeReport, StoreError> {
    let defaults = config.defaults();
    let mut report = PurgeReport::default();
    let mut longest_history = defaults.history_days;
    let tenants = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || store.scan_all::<Tenant>(&PlatformScope::internal()))
            .await
            .map_err(|e| StoreError::Backup(e.to_string()))??
    };
    for tenant in tenants {
        let retention = tenant.retention.resolve(defaults);
        longest_history = longest_history.max(retention.history_days);
        let scope = TenantScope::new(tenant.tenant_id.clone());
        for stage in [
            Stage::Payloads,
            Stage::History,
            Stage::Leases,
            Stage::Artifacts,
        ] {
            let up_to = match stage {
                Stage::Payloads => retention.payload_cutoff(now),
                Stage::History | Stage::Leases => retention.history_cutoff(now),
                Stage::Artifacts => now,
            };
            run_stage(
                store,
                config,
                &scope,
                retention,
                stage,
                up_to,
                now,
                &mut report,
            )
            .await?;
        }
        report.records += purge_minutes(store, config, &scope, retention, now).await?;
    }
    // Events are one log for every tenant: kept for the longest history.
    let cutoff = now - chrono::Duration::days(longest_history.into());
    loop {
        let n = store.prune_events(cutoff, 5_000).await?;
        report.events += n as u64;
        if n < 5_000 {
            break;
        }
        pause(config).await;
    }
    // The audit trail is one chain for the site, kept for its own days.
    let cutoff = now - chrono::Duration::days(config.audit_days.into());
    let mut audit = 0u64;
    loop {
        let n = store.prune_audit(cutoff, 5_000).await?;
        audit += n as u64;
        if n < 5_000 {
            break;
        }
        pause(config).await;
    }
    metrics::counter!(names::PURGED, "what" => "audit").increment(audit);
    metrics::counter!(names::PURGED, "what" => "events").increment(report.events);
    metrics::counter!(names::PURGED, "what" => "records").increment(report.records);
    metrics::gauge!(names::PURGE_BACKLOG).set(report.backlog as f64);
    Ok(report)
}

/// Works through one index of what is due, batch by batch.
#[allow(clippy::too_many_arguments)]
async fn run_stage(
    store: &Store,
    config: &RetentionConfig,
    scope: &TenantScope,
    retention: Retention,
    stage: Stage,
    up_to: DateTime<Utc>,
    now: DateTime<Utc>,
    report: &mut PurgeReport,
) -> Result<(), StoreError> {
    let up_to = time_value(up_to);
    let budget = config.purge_batch_records as usize;
    // Where this pass is in the index: entries left alone stay in it, so
    // the next batch starts after them, not at them again.
    let mut cursor: Option<(String, String)> = None;
    loop {
        let from = cursor.as_ref().map(|(v, _)| v.as_str());
        let due: Vec<(String, String)> = store
            .index_range(scope, stage.index(), from, Some(&up_to), budget + 1)?
            .into_iter()
            .filter(|(v, id)| {
                cursor
                    .as_ref()
                    .is_none_or(|(cv, cid)| (v.as_str(), id.as_str()) > (cv.as_str(), cid.as_str()))
            })
            .collect();
        let Some(last) = due.last().cloned() else {
            // What is still due after the pass: left alone, or come due
            // while it ran.
            report.backlog += store
                .index_range(scope, stage.index(), None, Some(&up_to), 100_000)?
                .len() as u64;
            return Ok(());
        };
        cursor = Some(last);
        let ids: Vec<String> = due.into_iter().map(|(_, id)| id).collect();
        let s = scope.clone();
        let tomb = Tombstone {
            purged_at: now,
            tenant_id: scope.tenant().clone(),
            payload_days: retention.payload_days,
        };
        let done: Batch = store
            .transact(move |tx: &mut Tx| {
                let mut b = Batch::default();
                for id in &ids {
                    if b.touched >= budget {
                        b.left += 1;
                        continue;
                    }
                    match stage {
                        Stage::Payloads => tombstone_run(tx, &s, id, &tomb, &mut b)?,
                        Stage::History => delete_run(tx, &s, id, &mut b)?,
                        Stage::Leases => delete_lease(tx, &s, id, &mut b)?,
                        Stage::Artifacts => {
                            b.touched += 1;
                            if tx.sweep_artifact(&s, id, now)? {
                                b.done += 1;
                            } else {
                                b.skipped += 1;
                            }
                        }
                    }
                }
                Ok::<_, StoreError>(b)
            })
            .await?;
        metrics::counter!(names::PURGED, "what" => stage.label()).increment(done.done);
        match stage {
            Stage::Payloads => report.payloads += done.done,
            Stage::History => report.runs += done.done,
            Stage::Leases => report.records += done.done,
            Stage::Artifacts => report.artifacts += done.done,
        }
        report.skipped += done.skipped;
        if done.left > 0 {
            // Over the budget: start again from the first not done.
            cursor = None;
        }
        pause(config).await;
    }
}

async fn pause(config: &RetentionConfig) {
    if config.purge_pause_ms > 0 {
        tokio::time::sleep(Duration::from_millis(config.purge_pause_ms)).await;
    }
}

/// What one batch did.
#[derive(Default)]
struct Batch {
    /// Items purged.
    done: u64,
    /// Items left alone for a reason of their own.
    skipped: u64,
    /// Items not reached within the budget.
    left: u64,
    /// Records written or deleted so far.
    touched: usize,
}

/// The records under a run's attempts, read in the transaction; `None`
/// when the run must be left alone: not ended, held, an attempt still
/// live, or an Uncertain call not yet settled.
struct RunTree {
    run: Run,
    attempts: Vec<ExecutionAttempt>,
    checkpoints: Vec<Checkpoint>,
    calls: Vec<CallRecord>,
    decisions: Vec<DecisionRequest>,
    delegations: Vec<SubAgentDelegation>,
}

fn read_run(tx: &Tx, scope: &TenantScope, run_id: &str) -> Result<Option<RunTree>, StoreError> {
    let Some(run) = tx.get::<Run>(scope, run_id)? else {
        return Ok(None);
    };
    if !run.state.is_terminal() || run.hold.is_some() {
        return Ok(None);
    }
    let mut tree = RunTree {
        run,
        attempts: Vec::new(),
        checkpoints: Vec::new(),
        calls: Vec::new(),
        decisions: Vec::new(),
        delegations: Vec::new(),
    };
    let ids: Vec<uuid::Uuid> = tree
        .run
        .steps
        .iter()
        .flat_map(|s| s.attempts.iter().copied())
        .collect();
    for id in ids {
        let Some(a) = tx.get::<ExecutionAttempt>(scope, &id.to_string())? else {
            continue;
        };
        if !a.state.is_terminal() {
            return Ok(None);
        }
        let under = format!("{id}/");
        let calls: Vec<CallRecord> = tx.list_under(scope, &under)?;
        if calls
            .iter()
            .any(|c| c.status == CallStatus::Uncertain && c.settlement.is_none())
        {
            return Ok(None);
        }
        tree.calls.extend(calls);
        tree.checkpoints
            .extend(tx.list_under::<Checkpoint>(scope, &under)?);
        tree.decisions
            .extend(tx.list_under::<DecisionRequest>(scope, &under)?);
        tree.delegations
            .extend(tx.list_under::<SubAgentDelegation>(scope, &under)?);
        tree.attempts.push(a);
    }
    Ok(Some(tree))
}

impl RunTree {
    fn size(&self) -> usize {
        1 + self.attempts.len()
            + self.checkpoints.len()
            + self.calls.len()
            + self.decisions.len()
            + self.delegations.len()
    }
}

/// Replaces a run's payload references by tombstones.
fn tombstone_run(
    tx: &mut Tx,
    scope: &TenantScope,
    run_id: &str,
    tomb: &Tombstone,
    b: &mut Batch,
) -> Result<(), StoreError> {
    let Some(mut tree) = read_run(tx, scope, run_id)? else {
        b.skipped += 1;
        b.touched += 1;
        return Ok(());
    };
    if tree.run.purged.is_some() {
        return Ok(());
    }
    b.touched += tree.size();
    for mut c in tree.checkpoints {
        c.purged = Some(tomb.clone());
        tx.put(scope, &c)?;
    }
    for mut c in tree.calls {
        c.purged = Some(tomb.clone());
        tx.put(scope, &c)?;
    }
    for mut d in tree.decisions {
        d.purged = Some(tomb.clone());
        tx.put(scope, &d)?;
    }
    for a in &mut tree.attempts {
        a.purged = Some(tomb.clone());
        tx.save(scope, a)?;
    }
    tree.run.purged = Some(tomb.clone());
    tx.save(scope, &mut tree.run)?;
    b.done += 1;
    Ok(())
}

/// Deletes a run with everything under its attempts.
fn delete_run(
    tx: &mut Tx,
    scope: &TenantScope,
    run_id: &str,
    b: &mut Batch,
) -> Result<(), StoreError> {
    let Some(tree) = read_run(tx, scope, run_id)? else {
        b.skipped += 1;
        b.touched += 1;
        return Ok(());
    };
    b.touched += tree.size();
    for c in &tree.checkpoints {
        tx.delete::<Checkpoint>(scope, &Checkpoint::key(c.attempt_id, c.sequence))?;
    }
    for c in &tree.calls {
        tx.delete::<CallRecord>(scope, &CallRecord::key(c.attempt_id, c.sequence))?;
    }
    for d in &tree.decisions {
        tx.delete::<DecisionRequest>(
            scope,
            &crate::runtime::decision_key(d.attempt_id, d.decision_id),
        )?;
    }
    for d in &tree.delegations {
        tx.delete::<SubAgentDelegation>(
            scope,
            &SubAgentDelegation::key(d.attempt_id, d.delegation_id),
        )?;
    }
    for a in &tree.attempts {
        tx.delete::<ExecutionAttempt>(scope, &a.attempt_id.to_string())?;
    }
    tx.delete::<Run>(scope, run_id)?;
    b.done += 1;
    Ok(())
}

/// Deletes an ended lease.
fn delete_lease(
    tx: &mut Tx,
    scope: &TenantScope,
    lease_id: &str,
    b: &mut Batch,
) -> Result<(), StoreError> {
    b.touched += 1;
    match tx.get::<CapacityLease>(scope, lease_id)? {
        Some(l) if l.state.is_terminal() => {
            tx.delete::<CapacityLease>(scope, lease_id)?;
            b.done += 1;
        }
        _ => b.skipped += 1,
    }
    Ok(())
}

/// Deletes per-day minutes records before the history cutoff (their keys
/// are days, in order).
async fn purge_minutes(
    store: &Store,
    config: &RetentionConfig,
    scope: &TenantScope,
    retention: Retention,
    now: DateTime<Utc>,
) -> Result<u64, StoreError> {
    let cutoff = retention.history_cutoff(now).date_naive();
    let mut total = 0;
    loop {
        let old: Vec<String> = store
            .list_page::<ExecutionMinutes>(scope, None, config.purge_batch_records as usize)?
            .into_iter()
            .filter(|m| m.day < cutoff)
            .map(|m| m.day.to_string())
            .collect();
        if old.is_empty() {
            return Ok(total);
        }
        total += old.len() as u64;
        let s = scope.clone();
        store
            .transact(move |tx: &mut Tx| {
                for day in &old {
                    tx.delete::<ExecutionMinutes>(&s, day)?;
                }
                Ok::<_, StoreError>(())
            })
            .await?;
        pause(config).await;
    }
}

/// The Purger for the appliance.
pub fn worker(store: Store, config: crate::config::Live<RetentionConfig>) -> Arc<dyn Worker> {
    Arc::new(Purger { store, config })
}
