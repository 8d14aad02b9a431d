//! The capacity workers: LeaseExpirer, Autoscaler, AccountingReconciler.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use uuid::Uuid;

use super::Capacity;
use crate::worker::{RetryKind, Schedule, Worker};

/// Expires leases whose heartbeat stopped and frees their capacity
/// (`LeaseExpirer`, every minute by default).
pub struct LeaseExpirer {
    /// The service.
    pub capacity: Arc<Capacity>,
    /// Time between passes.
    pub every: Duration,
}

impl Worker for LeaseExpirer {
    fn name(&self) -> &'static str {
        "LeaseExpirer"
    }

    fn schedule(&self) -> Schedule {
        Schedule::Every(self.every)
    }

    fn retry(&self) -> RetryKind {
        RetryKind::None
    }

    fn run(&self, now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(async move {
            if let Some(why) = self.capacity.expiry_waits() {
                return Ok(format!("waits: {why}"));
            }
            let n = self.capacity.expire_due(now).await;
            Ok(format!("{n} leases or requests ended"))
        })
    }
}

/// Moves pool sizes within their bounds from utilisation and queued demand
/// (`Autoscaler`, every two minutes by default, and at once when requests
/// start waiting for a pool's capacity).
pub struct Autoscaler {
    /// The service.
    pub capacity: Arc<Capacity>,
    /// Time between passes.
    pub every: Duration,
}

impl Worker for Autoscaler {
    fn name(&self) -> &'static str {
        "Autoscaler"
    }

    fn schedule(&self) -> Schedule {
        Schedule::Every(self.every)
    }

    fn retry(&self) -> RetryKind {
        RetryKind::Fixed
    }

    fn run(&self, _now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(async move {
            let changes = self.capacity.autoscale().await;
            Ok(if changes.is_empty() {
                "no pool changed size".to_string()
            } else {
                changes
                    .iter()
                    .map(|(pool, from, to)| format!("{pool} {from}->{to}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
        })
    }
}

/// Recomputes every pool's counters from its leases; a difference is
/// logged, counted and repaired, never silently absorbed.
pub struct AccountingReconciler {
    /// The service.
    pub capacity: Arc<Capacity>,
    /// Time between passes.
    pub every: Duration,
}

impl Worker for AccountingReconciler {
    fn name(&self) -> &'static str {
        "AccountingReconciler"
    }

    fn schedule(&self) -> Schedule {
        Schedule::Every(self.every)
    }

    fn retry(&self) -> RetryKind {
        RetryKind::Exponential
    }

    fn run(&self, _now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(async move {
            let mut repairs: Vec<String> = self
                .capacity
                .reconcile()
                .await
                .into_iter()
                .map(|(p, m)| format!("{p}: {m}"))
                .collect();
            let freed = self.capacity.reconcile_slots().await?;
            if !freed.is_empty() {
                repairs.push(format!(
                    "freed the run slots of {} ended run(s): {}",
                    freed.len(),
                    freed
                        .iter()
                        .map(Uuid::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            let slots = self.capacity.slots_held();
            if repairs.is_empty() {
                Ok(format!(
                    "every pool's counters match its leases; {slots} run slot(s) held by live runs"
                ))
            } else {
                Ok(format!("repaired {}", repairs.join("; ")))
            }
        })
    }
}
