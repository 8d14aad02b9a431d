//! What the runtime needs of run control: one interface, implemented by
//! run control (`runs::Port`) and handed to the runtime when it starts.
//! The runtime reports through it; it never reaches into run control's
//! module, so the dependency goes one way: run control uses the runtime.
//!
//! Every method runs inside the attempt's own store transaction, so an
//! attempt's outcome and the run's decision about it, or a call's result
//! and the tokens it is charged, commit together or not at all.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::config::RuntimeConfig;
use crate::domain::DomainError;
use crate::domain::access::TenantScope;
use crate::domain::attempt::ExecutionAttempt;
use crate::domain::release::{LoadedRelease, Manifest};
use crate::domain::run::{Followup, NewRun, ParentLink};
use crate::domain::usage::TokenUsage;
use crate::store::{StoreError, Tx};

/// A sub-agent call's child run, to plan.
pub struct ChildPlan<'a> {
    /// The supervisor attempt.
    pub supervisor: &'a ExecutionAttempt,
    /// The child's release, verified and dispatchable.
    pub release: &'a LoadedRelease,
    /// Its manifest.
    pub manifest: &'a Manifest,
    /// Its workflow's steps.
    pub steps: Vec<String>,
    /// The call's request: the child run's input.
    pub input: Value,
    /// The supervisor's side of the link.
    pub parent: ParentLink,
    /// The runtime's configuration now.
    pub config: &'a RuntimeConfig,
    /// When.
    pub now: DateTime<Utc>,
}

/// Run control, as the runtime sees it.
pub trait RunPort: Send + Sync + 'static {
    /// Records the single outcome of a terminal attempt in its run and
    /// writes the run's next attempt, if any.
    fn record_outcome(
        &self,
        tx: &mut Tx,
        scope: &TenantScope,
        attempt: &ExecutionAttempt,
        now: DateTime<Utc>,
    ) -> Result<Followup, StoreError>;

    /// Charges the tokens of a model call of `attempt` to the ledger: its
    /// tenant's day, its run and every run above it.
    fn charge_tokens(
        &self,
        tx: &mut Tx,
        scope: &TenantScope,
        attempt: &ExecutionAttempt,
        usage: &TokenUsage,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// Plans the child run of a sub-agent call (outside the transaction).
    fn plan_child(&self, plan: ChildPlan<'_>) -> Result<NewRun, DomainError>;

    /// Writes a planned child run with its first attempt; returns the
    /// attempt.
    fn create_child(
        &self,
        tx: &mut Tx,
        scope: &TenantScope,
        child: NewRun,
        retain_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<ExecutionAttempt, StoreError>;
}
