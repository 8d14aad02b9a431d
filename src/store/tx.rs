//! The one way to write: a transaction over every tree.

use std::sync::Arc;

use sled::transaction::{TransactionalTree, UnabortableTransactionError};

use super::outbox::StoredEvent;
use super::{
    Record, StoreError, Table, TenantScope, decode, encode, index_prefix, record_key,
};
use crate::domain::events::NewEvent;

/// A transaction in progress. Reads see the transaction's own writes.
pub struct Tx<'a> {
    trees: &'a [TransactionalTree],
    next_seq: u64,
    events: Vec<Arc<StoredEvent>>,
}

fn engine(e: UnabortableTransactionError) -> StoreError {
    match e {
        UnabortableTransactionError::Storage(e) => StoreError::Engine(e),
        // sled 0.34 transactions hold a global lock, and the store has one
        // writer: a conflict cannot happen. Reported rather than retried so
        // that a change in sled cannot turn into a silent loop.
        UnabortableTransactionError::Conflict => {
            StoreError::Engine(sled::Error::ReportableBug("transaction conflict".into()))
        }
    }
}

fn check_scope<R: Record>(scope: &TenantScope, record: &R) -> Result<(), StoreError> {
    if record.tenant() != scope.tenant() {
        return Err(StoreError::TenantMismatch {
            record: record.tenant().clone(),
            scope: scope.tenant().clone(),
        });
    }
    Ok(())
}

fn check_index_part(part: &str) -> Result<(), StoreError> {
    if part.contains('/') {
        return Err(StoreError::Corrupt {
            table: Table::Index.name(),
            key: part.to_string(),
            reason: "index names and values cannot contain '/'".into(),
        });
    }
    Ok(())
}

impl<'a> Tx<'a> {
    pub(super) fn new(trees: &'a [TransactionalTree], next_seq: u64) -> Tx<'a> {
        Tx {
            trees,
            next_seq,
            events: Vec::new(),
        }
    }

    pub(super) fn into_events(self) -> Vec<Arc<StoredEvent>> {
        self.events
    }

    fn tree(&self, table: Table) -> &TransactionalTree {
        &self.trees[table.position()]
    }

    /// Reads a record of the scope's tenant.
    pub fn get<R: Record>(&self, scope: &TenantScope, id: &str) -> Result<Option<R>, StoreError> {
        let key = record_key(scope.tenant(), id);
        self.tree(R::TABLE)
            .get(&key)
            .map_err(engine)?
            .map(|bytes| decode::<R>(&key, &bytes))
            .transpose()
    }

    /// Writes a record, which must belong to the scope's tenant.
    pub fn put<R: Record>(&self, scope: &TenantScope, record: &R) -> Result<(), StoreError> {
        check_scope(scope, record)?;
        let key = record_key(scope.tenant(), &record.id());
        self.tree(R::TABLE)
            .insert(key, encode(record)?)
            .map_err(engine)?;
        Ok(())
    }

    /// Deletes a record of the scope's tenant.
    pub fn delete<R: Record>(&self, scope: &TenantScope, id: &str) -> Result<(), StoreError> {
        self.tree(R::TABLE)
            .remove(record_key(scope.tenant(), id))
            .map_err(engine)?;
        Ok(())
    }

    /// Adds `id` under `<tenant>/<index>/<value>/`.
    pub fn index_put(
        &self,
        scope: &TenantScope,
        index: &str,
        value: &str,
        id: &str,
    ) -> Result<(), StoreError> {
        check_index_part(index)?;
        check_index_part(value)?;
        let mut key = index_prefix(scope.tenant(), index, value);
        key.extend_from_slice(id.as_bytes());
        self.tree(Table::Index)
            .insert(key, &[] as &[u8])
            .map_err(engine)?;
        Ok(())
    }

    /// Removes `id` from `<tenant>/<index>/<value>/`.
    pub fn index_delete(
        &self,
        scope: &TenantScope,
        index: &str,
        value: &str,
        id: &str,
    ) -> Result<(), StoreError> {
        let mut key = index_prefix(scope.tenant(), index, value);
        key.extend_from_slice(id.as_bytes());
        self.tree(Table::Index).remove(key).map_err(engine)?;
        Ok(())
    }

    /// Appends an event to the outbox; it commits with the transaction and
    /// is published once durable. Returns its sequence number.
    pub fn emit(&mut self, event: NewEvent) -> Result<u64, StoreError> {
        let stored = StoredEvent {
            sequence: self.next_seq,
            topic: event.topic.to_string(),
            tenant_id: event.tenant_id,
            occurred_at: event.occurred_at,
            payload: event.payload,
        };
        self.tree(Table::Outbox)
            .insert(&stored.sequence.to_be_bytes(), stored.encode()?)
            .map_err(engine)?;
        self.next_seq += 1;
        let sequence = stored.sequence;
        self.events.push(Arc::new(stored));
        Ok(sequence)
    }

    /// Appends every event of a transition.
    pub fn emit_all(&mut self, events: impl IntoIterator<Item = NewEvent>) -> Result<(), StoreError> {
        for event in events {
            self.emit(event)?;
        }
        Ok(())
    }

    /// Reads an appliance-level value of the meta tree.
    pub(crate) fn meta_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .tree(Table::Meta)
            .get(key.as_bytes())
            .map_err(engine)?
            .map(|v| v.to_vec()))
    }

    /// Writes an appliance-level value of the meta tree.
    pub(crate) fn meta_put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.tree(Table::Meta)
            .insert(key.as_bytes(), value)
            .map_err(engine)?;
        Ok(())
    }
}
