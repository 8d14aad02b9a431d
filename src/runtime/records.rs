//! How the runtime's records are stored: attempts, checkpoints, call
//! records, decisions and delegations, with the indexes they derive.

use uuid::Uuid;

use crate::domain::TenantId;
use crate::domain::attempt::{
    CallRecord, CallStatus, Checkpoint, DecisionRequest, DecisionStatus, ExecutionAttempt,
    SubAgentDelegation,
};
use crate::store::{Derived, Record, Table, time_value};

/// Names of the indexes the runtime's records derive (see
/// `store/derived.rs`).
pub mod index {
    /// Attempts of a tenant by state (value: the state).
    pub const ATTEMPT_STATE: &str = "attempt-state";
    /// Ended attempts of a tenant by end time.
    pub const ATTEMPT_ENDED: &str = "attempt-ended";
    /// Live attempts of every tenant (global, value `_`).
    pub const ATTEMPT_LIVE: &str = "attempt-live";
    /// Pending decisions of a tenant (value `_`).
    pub const DECISION_PENDING: &str = "decision-pending";
    /// Uncertain calls of a tenant that wait for settlement (value `_`).
    pub const CALL_UNSETTLED: &str = "call-unsettled";
    /// Decisions by the Run Control approval they carry.
    pub const APPROVAL: &str = "approval";
    /// Decisions by their id (the stored id is `<attempt>/<decision>`).
    pub const DECISION: &str = "decision";
    /// The one value of single-list indexes.
    pub const ALL: &str = "_";
}

impl Record for ExecutionAttempt {
    const TABLE: Table = Table::Attempts;
    /// 2: the phase history is stored compactly (`phase_history`).
    const VERSION: u16 = 2;
    const VERSIONED: bool = true;
    const DERIVES: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.attempt_id.to_string()
    }
    fn upgrade(version: u16, bytes: &[u8]) -> Result<Self, String> {
        match version {
            // Version 1 differs only in how phase marks are written, and
            // the phase history reads both.
            1 => rmp_serde::from_slice(bytes).map_err(|e| e.to_string()),
            v => Err(format!("no upgrade from version {v}")),
        }
    }
    fn derive(&self, d: &mut Derived) {
        d.counted(index::ATTEMPT_STATE, self.state.as_str());
        if self.state.is_terminal() {
            d.index(
                index::ATTEMPT_ENDED,
                time_value(self.ended_at.unwrap_or(self.started_at)),
            );
        } else {
            d.global(index::ATTEMPT_LIVE, index::ALL);
        }
        // `context_snapshot_ref` names the context builder's snapshot
        // (Knowledge's reference, or the builtin loop's hash of its first
        // context), not content this store holds: it references nothing.
        if self.purged.is_none() {
            d.reference(self.output_ref.as_deref())
                .reference(self.adapter_state_ref.as_deref())
                .reference(
                    self.failure
                        .as_ref()
                        .and_then(|f| f.feedback_ref.as_deref()),
                )
                .reference(self.failure.as_ref().and_then(|f| f.detail_ref.as_deref()));
        }
    }
}

crate::versioned!(
    ExecutionAttempt,
    version,
    crate::domain::attempt::StoredAttempt
);

impl Record for Checkpoint {
    const TABLE: Table = Table::Checkpoints;
    const VERSION: u16 = 1;
    const DERIVES: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        Checkpoint::key(self.attempt_id, self.sequence)
    }
    fn derive(&self, d: &mut Derived) {
        // As for attempts, the context snapshot is not content held here.
        if self.purged.is_none() {
            d.reference(Some(&self.adapter_state_ref));
        }
    }
}

impl Record for CallRecord {
    const TABLE: Table = Table::CallRecords;
    const VERSION: u16 = 1;
    const DERIVES: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        CallRecord::key(self.attempt_id, self.sequence)
    }
    fn derive(&self, d: &mut Derived) {
        if self.status == CallStatus::Uncertain && self.settlement.is_none() {
            d.index(index::CALL_UNSETTLED, index::ALL);
        }
        if self.purged.is_none() {
            d.reference(Some(&self.request_hash))
                .reference(self.receipt_ref.as_deref())
                .reference(self.result_hash.as_deref())
                .reference(self.late_receipt_ref.as_deref());
        }
    }
}

impl Record for DecisionRequest {
    const TABLE: Table = Table::Decisions;
    const VERSION: u16 = 1;
    const DERIVES: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        decision_key(self.attempt_id, self.decision_id)
    }
    fn derive(&self, d: &mut Derived) {
        d.index(index::DECISION, self.decision_id.to_string());
        if self.status == DecisionStatus::Pending {
            d.index(index::DECISION_PENDING, index::ALL);
        }
        if let Some(a) = self.approval_id {
            d.index(index::APPROVAL, a.to_string());
        }
        if self.purged.is_none() {
            d.reference(self.question_ref.as_deref())
                .reference(self.answer_ref.as_deref())
                .reference(self.proposal.as_ref().map(|p| p.request_hash.as_str()))
                .reference(self.edited_request_hash.as_deref());
        }
    }
}

impl Record for SubAgentDelegation {
    const TABLE: Table = Table::Delegations;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        SubAgentDelegation::key(self.attempt_id, self.delegation_id)
    }
}

/// The stored id of a decision: `<attempt>/<decision>`.
pub fn decision_key(attempt_id: Uuid, decision_id: Uuid) -> String {
    format!("{attempt_id}/{decision_id}")
}
