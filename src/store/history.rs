//! The outbox and the audit trail as readers see them, and their pruning.

use std::sync::Arc;

use super::{Store, StoreError, Table, Tx, outbox, trail};
use crate::domain::access::TenantScope;
use crate::domain::events::{EventFilter, StoredEvent};

impl Store {
    /// Up to `limit` audit records the filter admits, newest first, before
    /// record `before` when given. A filter without a tenant reads every
    /// tenant's: only a PlatformAdmin's query may leave it out.
    pub fn audit_page(
        &self,
        filter: &crate::domain::audit::AuditFilter,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<crate::domain::audit::AuditRecord>, StoreError> {
        trail::page(
            &self.tree(Table::Audit)?,
            &self.tree(Table::Index)?,
            filter,
            before,
            limit,
        )
    }

    /// Checks the whole audit chain: every kept record follows the one
    /// before and hashes to what it says.
    pub fn verify_audit(
        &self,
        expect: &crate::domain::audit::Expect,
    ) -> Result<crate::domain::audit::TrailReport, StoreError> {
        trail::verify(&self.tree(Table::Audit)?, &self.tree(Table::Meta)?, expect)
    }

    /// Records an action that changes no record (a backup taken, a run
    /// exported, a worker run by hand), as done by whoever the request or
    /// command acts for, in a transaction of its own.
    pub async fn record_action(
        &self,
        at: chrono::DateTime<chrono::Utc>,
        change: crate::domain::audit::Change,
    ) -> Result<(), StoreError> {
        self.transact(move |tx| tx.audit(at, change)).await
    }

    /// Removes up to `limit` audit records written before `until`, oldest
    /// first; returns how many. The chain stays checkable: the last one
    /// removed is kept as the anchor of the first one kept.
    pub async fn prune_audit(
        &self,
        until: chrono::DateTime<chrono::Utc>,
        limit: usize,
    ) -> Result<usize, StoreError> {
        let expired = trail::expired(&self.tree(Table::Audit)?, until, limit)?;
        let count = expired.len();
        if count > 0 {
            self.transact(move |tx| {
                tx.prune_audit(&expired);
                Ok::<_, StoreError>(())
            })
            .await?;
        }
        Ok(count)
    }

    /// Events after `after` that the filter admits, at most `limit`.
    pub fn events_after(
        &self,
        filter: &EventFilter,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Arc<StoredEvent>>, StoreError> {
        outbox::read_after(&self.tree(Table::Outbox)?, filter, after, limit)
    }

    /// Deletes up to `limit` of the oldest events that occurred before
    /// `cutoff`; returns how many. Sequence numbers stay unique: the highest
    /// deleted one is remembered.
    pub async fn prune_events(
        &self,
        cutoff: chrono::DateTime<chrono::Utc>,
        limit: usize,
    ) -> Result<usize, StoreError> {
        let expired = outbox::expired(&self.tree(Table::Outbox)?, cutoff, limit)?;
        let Some(&(last, _)) = expired.last() else {
            return Ok(0);
        };
        let count = expired.len();
        self.transact(move |tx: &mut Tx| {
            for (sequence, index_key) in expired {
                tx.outbox_delete(sequence, index_key);
            }
            tx.meta_put(outbox::PRUNED_THROUGH, &last.to_be_bytes());
            Ok::<_, StoreError>(())
        })
        .await?;
        Ok(count)
    }

    /// The durable events of one attempt after `after` (at most `limit`),
    /// in outbox order, read through the attempt's own index: the cost is
    /// its events', not the outbox's.
    pub fn attempt_events_after(
        &self,
        scope: &TenantScope,
        attempt_id: uuid::Uuid,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Arc<StoredEvent>>, StoreError> {
        let head = self.events_head();
        let mut events = outbox::attempt_events_after(
            &self.tree(Table::Outbox)?,
            &self.tree(Table::Index)?,
            scope.tenant(),
            &attempt_id.to_string(),
            after,
            limit,
        )?;
        events.retain(|e| e.sequence <= head);
        Ok(events)
    }
}
