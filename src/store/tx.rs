//! The one way to write: a transaction closure run by the store's writer.
//!
//! A [`Tx`] reads through four layers, newest first: its own writes, the
//! writes of the group it belongs to (earlier transactions not yet handed
//! to the engine), the groups handed over but not readable before they are
//! durable (PostgreSQL's), and the engine itself. Its writes stay in memory until the closure
//! returns `Ok`; an `Err` drops them, so an aborted transaction leaves no
//! trace.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use super::derived::{self, Change, Derived};
use super::kv::{KvEngine, Reading};
use super::trail;
use super::{
    Record, StoreError, StoredVersion, Table, TenantScope, Versioned, decode, encode, index_prefix,
    project, record_key, tenant_prefix,
};
use crate::domain::audit::{self, AuditRecord, Change as AuditChange, Origin};
use crate::domain::events::NewEvent;
use crate::domain::events::StoredEvent;
use crate::telemetry::names;
use chrono::{DateTime, Utc};

/// Pending writes by tree position, then key; `None` deletes.
#[derive(Default)]
pub(super) struct Writes(Vec<BTreeMap<Vec<u8>, Option<Vec<u8>>>>);

impl Writes {
    pub(super) fn is_empty(&self) -> bool {
        self.0.iter().all(BTreeMap::is_empty)
    }

    pub(super) fn len(&self) -> usize {
        self.0.iter().map(BTreeMap::len).sum()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (usize, &[u8], &Option<Vec<u8>>)> {
        self.0.iter().enumerate().flat_map(|(table, writes)| {
            writes
                .iter()
                .map(move |(key, value)| (table, key.as_slice(), value))
        })
    }

    pub(super) fn merge(&mut self, newer: Writes) {
        for (table, writes) in newer.0.into_iter().enumerate() {
            if !writes.is_empty() {
                self.table_mut(table).extend(writes);
            }
        }
    }

    fn table_mut(&mut self, table: usize) -> &mut BTreeMap<Vec<u8>, Option<Vec<u8>>> {
        if self.0.len() <= table {
            self.0.resize_with(table + 1, BTreeMap::new);
        }
        &mut self.0[table]
    }

    pub(super) fn insert(&mut self, table: usize, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.table_mut(table).insert(key, value);
    }

    /// Every write, by table position then key.
    pub(super) fn into_writes(self) -> impl Iterator<Item = (usize, Vec<u8>, Option<Vec<u8>>)> {
        self.0.into_iter().enumerate().flat_map(|(table, writes)| {
            writes
                .into_iter()
                .map(move |(key, value)| (table, key, value))
        })
    }

    /// Takes the write of `key` out: its value, or `None` (a removal, or
    /// no write).
    pub(super) fn take(&mut self, table: usize, key: &[u8]) -> Option<Vec<u8>> {
        self.0.get_mut(table)?.remove(key).flatten()
    }

    fn get(&self, table: usize, key: &[u8]) -> Option<&Option<Vec<u8>>> {
        self.0.get(table)?.get(key)
    }

    fn overlay_prefix(&self, table: usize, prefix: &[u8], into: &mut BTreeMap<Vec<u8>, Vec<u8>>) {
        let Some(writes) = self.0.get(table) else {
            return;
        };
        for (key, value) in writes.range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded)) {
            if !key.starts_with(prefix) {
                break;
            }
            match value {
                Some(v) => into.insert(key.clone(), v.clone()),
                None => into.remove(key),
            };
        }
    }
}

/// What a transaction's writes make known (`Some`: the version and what it
/// derives) or unknown (`None`) of keys, by (tree position, key).
pub(super) type Learnt = HashMap<(usize, Vec<u8>), Option<(u64, Derived)>>;

/// What the versioned records the writer wrote last derive, by (tree
/// position, key), with the version they belong to. A version names one
/// stored state, so a save over exactly that version takes the entries it
/// moves away from here instead of decoding the stored record again; any
/// other write of the key forgets them. Bounded: past [`DerivedCache::MAX`]
/// keys it starts again empty.
#[derive(Default)]
pub(super) struct DerivedCache(HashMap<(usize, Vec<u8>), (u64, Derived)>);

impl DerivedCache {
    const MAX: usize = 16_384;

    /// Forgets everything (the group it described was not applied).
    pub(super) fn clear(&mut self) {
        self.0.clear();
    }

    /// Takes in what a committed transaction learnt.
    pub(super) fn merge(&mut self, learnt: Learnt) {
        if self.0.len() + learnt.len() > Self::MAX {
            self.0.clear();
        }
        for (key, known) in learnt {
            match known {
                Some(known) => self.0.insert(key, known),
                None => self.0.remove(&key),
            };
        }
    }
}

/// What a stored state (`None`: nothing stored) of record `R` derives.
fn derived_of<R: Record>(key: &[u8], stored: Option<&[u8]>) -> Result<Derived, StoreError> {
    let mut derived = Derived::default();
    if let Some(bytes) = stored {
        decode::<R>(key, bytes)?.derive(&mut derived);
    }
    Ok(derived)
}

/// What a committed transaction hands the writer.
pub(super) struct Finished {
    pub writes: Writes,
    pub events: Vec<Arc<StoredEvent>>,
    pub learnt: Learnt,
    pub trail: trail::Head,
}

/// A transaction in progress. Reads see the transaction's own writes.
pub struct Tx<'a> {
    base: &'a dyn KvEngine,
    group: &'a Writes,
    pending: &'a VecDeque<(u64, Arc<Writes>)>,
    cache: &'a DerivedCache,
    writes: Writes,
    /// What this transaction's writes make known (`Some`) or unknown
    /// (`None`) in the cache, once it commits.
    learnt: Learnt,
    next_seq: u64,
    events: Vec<Arc<StoredEvent>>,
    /// Who the transaction acts for, when a person or a client does.
    origin: Option<Arc<Origin>>,
    /// The end of the audit chain, as this transaction leaves it.
    trail: trail::Head,
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
    pub(super) fn new(
        base: &'a dyn KvEngine,
        group: &'a Writes,
        pending: &'a VecDeque<(u64, Arc<Writes>)>,
        cache: &'a DerivedCache,
        next_seq: u64,
        trail: trail::Head,
        origin: Option<Arc<Origin>>,
    ) -> Tx<'a> {
        Tx {
            base,
            group,
            pending,
            cache,
            writes: Writes::default(),
            learnt: HashMap::new(),
            next_seq,
            events: Vec::new(),
            origin,
            trail,
        }
    }

    pub(super) fn finish(self) -> Finished {
        Finished {
            writes: self.writes,
            events: self.events,
            learnt: self.learnt,
            trail: self.trail,
        }
    }

    fn read(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let t = table.position();
        let newest = self
            .writes
            .get(t, key)
            .or_else(|| self.group.get(t, key))
            .or_else(|| self.pending.iter().rev().find_map(|(_, w)| w.get(t, key)));
        if let Some(v) = newest {
            return Ok(v.clone());
        }
        self.base.writer_get(table, key)
    }

    fn write(&mut self, table: Table, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.writes.insert(table.position(), key, value);
    }

    fn scan_prefix(
        &self,
        table: Table,
        prefix: &[u8],
    ) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, StoreError> {
        let t = table.position();
        let mut merged = BTreeMap::new();
        for item in Reading::new(self.base.reader(), table).scan_prefix(prefix) {
            let (k, v) = item?;
            merged.insert(k, v);
        }
        for (_, writes) in self.pending {
            writes.overlay_prefix(t, prefix, &mut merged);
        }
        self.group.overlay_prefix(t, prefix, &mut merged);
        self.writes.overlay_prefix(t, prefix, &mut merged);
        Ok(merged)
    }

    /// Reads a raw value (for the artifact store's own keys).
    pub(super) fn raw_get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(table, key)
    }

    /// Writes or deletes a raw value (for the artifact store's own keys).
    pub(super) fn raw_write(&mut self, table: Table, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.write(table, key, value);
    }

    /// Reads a record of the scope's tenant.
    pub fn get<R: Record>(&self, scope: &TenantScope, id: &str) -> Result<Option<R>, StoreError> {
        let key = record_key(scope.tenant(), id);
        self.read(R::TABLE, &key)?
            .map(|bytes| decode::<R>(&key, &bytes))
            .transpose()
    }

    /// Every record of the table in the scope's tenant.
    pub fn list<R: Record>(&self, scope: &TenantScope) -> Result<Vec<R>, StoreError> {
        self.scan_prefix(R::TABLE, &tenant_prefix(scope.tenant()))?
            .iter()
            .map(|(k, v)| decode::<R>(k, v))
            .collect()
    }

    /// Records of the scope's tenant whose ids start with `id_prefix`.
    pub fn list_under<R: Record>(
        &self,
        scope: &TenantScope,
        id_prefix: &str,
    ) -> Result<Vec<R>, StoreError> {
        self.scan_prefix(R::TABLE, &record_key(scope.tenant(), id_prefix))?
            .iter()
            .map(|(k, v)| decode::<R>(k, v))
            .collect()
    }

    /// Writes a record, which must belong to the scope's tenant. Versioned
    /// aggregates go through [`Tx::save`]; the compiler refuses them here.
    pub fn put<R: Record>(&mut self, scope: &TenantScope, record: &R) -> Result<(), StoreError> {
        const {
            assert!(
                !R::VERSIONED,
                "a versioned aggregate is written with Tx::save, which checks its version"
            )
        };
        check_scope(scope, record)?;
        let id = record.id();
        let key = record_key(scope.tenant(), &id);
        let value = encode(record)?;
        let before = self.stored_derived::<R>(&key)?;
        self.rederive(scope, &id, before, Some(record))?;
        self.forget::<R>(&key);
        self.write(R::TABLE, key, Some(value));
        Ok(())
    }

    /// Writes a versioned aggregate over the stored state it was derived
    /// from: `record.version()` must be the stored version (0: nothing is
    /// stored under its id yet), and the new state must keep the rules of
    /// [`Versioned::check_successor`]. On success the record carries its
    /// new version. A stale or rule-breaking write is refused, counted and
    /// logged, and leaves the record as it was.
    pub fn save<R: Versioned>(
        &mut self,
        scope: &TenantScope,
        record: &mut R,
    ) -> Result<(), StoreError> {
        const {
            assert!(
                R::VERSIONED,
                "Tx::save is for records that declare VERSIONED = true"
            )
        };
        check_scope(scope, record)?;
        let id = record.id();
        let key = record_key(scope.tenant(), &id);
        let stored_bytes = self.read(R::TABLE, &key)?;
        let stored = stored_bytes
            .as_deref()
            .map(|bytes| project::<R, R::Stored>(&key, bytes))
            .transpose()?;
        let base = record.version();
        match &stored {
            Some(s) if s.version() == base && base != 0 => {}
            None if base == 0 => {}
            _ => {
                let words = |v: Option<u64>| match v {
                    Some(0) => "a new record".to_string(),
                    Some(v) => format!("version {v}"),
                    None => "nothing (no such record)".to_string(),
                };
                let e = StoreError::Stale {
                    table: R::TABLE.name(),
                    key: format!("{}/{id}", scope.tenant()),
                    expected: words(Some(base)),
                    found: words(stored.as_ref().map(StoredVersion::version)),
                };
                metrics::counter!(names::STORE_STALE_WRITES, "table" => R::TABLE.name())
                    .increment(1);
                tracing::warn!(error = %e, "a stale write was refused");
                return Err(e);
            }
        }
        if let Some(s) = &stored {
            R::check_successor(s, record).map_err(|rule| {
                let e = StoreError::Invariant {
                    table: R::TABLE.name(),
                    key: format!("{}/{id}", scope.tenant()),
                    rule,
                };
                tracing::error!(error = %e, "a write that breaks an invariant was refused");
                e
            })?;
        }
        record.set_version(base + 1);
        let value = match encode(record) {
            Ok(value) => value,
            Err(e) => {
                record.set_version(base);
                return Err(e);
            }
        };
        let before = match self.known_derived::<R>(&key, base) {
            Some(known) => {
                // Tests run debug builds: there the cache is checked
                // against the stored state on every save.
                debug_assert_eq!(
                    Some(&known),
                    derived_of::<R>(&key, stored_bytes.as_deref()).ok().as_ref(),
                    "the writer's cache of derived entries disagrees with {}",
                    String::from_utf8_lossy(&key)
                );
                Ok(known)
            }
            None if R::DERIVES => derived_of::<R>(&key, stored_bytes.as_deref()),
            None => Ok(Derived::default()),
        };
        let derived = before.and_then(|before| self.rederive(scope, &id, before, Some(&*record)));
        let after = match derived {
            Ok(after) => after,
            Err(e) => {
                record.set_version(base);
                return Err(e);
            }
        };
        if R::DERIVES {
            self.learnt
                .insert((R::TABLE.position(), key.clone()), Some((base + 1, after)));
        }
        self.write(R::TABLE, key, Some(value));
        Ok(())
    }

    /// Deletes a record of the scope's tenant, with its index entries and
    /// artifact references.
    pub fn delete<R: Record>(&mut self, scope: &TenantScope, id: &str) -> Result<(), StoreError> {
        let key = record_key(scope.tenant(), id);
        let before = self.stored_derived::<R>(&key)?;
        self.rederive::<R>(scope, id, before, None)?;
        self.forget::<R>(&key);
        self.write(R::TABLE, key, None);
        Ok(())
    }

    /// What the stored state of `key` derives (read now).
    fn stored_derived<R: Record>(&self, key: &[u8]) -> Result<Derived, StoreError> {
        if !R::DERIVES {
            return Ok(Derived::default());
        }
        derived_of::<R>(key, self.read(R::TABLE, key)?.as_deref())
    }

    /// What version `version` of `key` derives, if the writer still knows.
    fn known_derived<R: Record>(&self, key: &[u8], version: u64) -> Option<Derived> {
        if !R::DERIVES || version == 0 {
            return None;
        }
        let at = (R::TABLE.position(), key.to_vec());
        let known = match self.learnt.get(&at) {
            Some(known) => known.as_ref(),
            None => self.cache.0.get(&at),
        };
        known
            .filter(|(v, _)| *v == version)
            .map(|(_, derived)| derived.clone())
    }

    /// The cache no longer knows what `key` derives (it only holds records
    /// that derive).
    fn forget<R: Record>(&mut self, key: &[u8]) {
        if R::DERIVES {
            self.learnt
                .insert((R::TABLE.position(), key.to_vec()), None);
        }
    }

    /// Moves the derived entries, counts and artifact references of record
    /// `id` from `before` (what its stored state derives) to `next`
    /// (`None`: deleted); returns what `next` derives.
    fn rederive<R: Record>(
        &mut self,
        scope: &TenantScope,
        id: &str,
        before: Derived,
        next: Option<&R>,
    ) -> Result<Derived, StoreError> {
        let mut after = Derived::default();
        if !R::DERIVES {
            return Ok(after);
        }
        if let Some(n) = next {
            n.derive(&mut after);
        }
        if before == after {
            return Ok(after);
        }
        let change = Change::between(&before, &after);
        let tenant = scope.tenant();
        for e in &change.removed {
            self.write(Table::Index, derived::entry_key(tenant, id, e), None);
            if e.kind == derived::Kind::Counted {
                self.add_count(tenant, e.index, &e.value, -1)?;
            }
        }
        for e in &change.added {
            self.write(
                Table::Index,
                derived::entry_key(tenant, id, e),
                Some(Vec::new()),
            );
            if e.kind == derived::Kind::Counted {
                self.add_count(tenant, e.index, &e.value, 1)?;
            }
        }
        for (hash, delta) in change.refs {
            self.adjust_refs(scope, &hash, delta)?;
        }
        Ok(after)
    }

    fn add_count(
        &mut self,
        tenant: &crate::domain::TenantId,
        index: &str,
        value: &str,
        delta: i64,
    ) -> Result<(), StoreError> {
        let key = derived::count_key(tenant, index, value);
        let now = read_u64(self.read(Table::Index, &key)?.as_deref());
        let next = now.saturating_add_signed(delta);
        self.write(
            Table::Index,
            key,
            (next > 0).then(|| next.to_be_bytes().to_vec()),
        );
        Ok(())
    }

    /// How many tenant entries `index`/`value` has, including this
    /// transaction's, for a counted index ([`Derived::counted`]).
    pub fn index_count(
        &self,
        scope: &TenantScope,
        index: &str,
        value: &str,
    ) -> Result<u64, StoreError> {
        let key = derived::count_key(scope.tenant(), index, value);
        Ok(read_u64(self.read(Table::Index, &key)?.as_deref()))
    }

    /// Adds `id` under `<tenant>/<index>/<value>/`.
    pub fn index_put(
        &mut self,
        scope: &TenantScope,
        index: &str,
        value: &str,
        id: &str,
    ) -> Result<(), StoreError> {
        check_index_part(index)?;
        check_index_part(value)?;
        let mut key = index_prefix(scope.tenant(), index, value);
        key.extend_from_slice(id.as_bytes());
        self.write(Table::Index, key, Some(Vec::new()));
        Ok(())
    }

    /// Removes `id` from `<tenant>/<index>/<value>/`.
    pub fn index_delete(
        &mut self,
        scope: &TenantScope,
        index: &str,
        value: &str,
        id: &str,
    ) -> Result<(), StoreError> {
        let mut key = index_prefix(scope.tenant(), index, value);
        key.extend_from_slice(id.as_bytes());
        self.write(Table::Index, key, None);
        Ok(())
    }

    /// Ids under `<tenant>/<index>/<value>/`, including this transaction's.
    pub fn index_ids(
        &self,
        scope: &TenantScope,
        index: &str,
        value: &str,
    ) -> Result<Vec<String>, StoreError> {
        let prefix = derived::tenant_prefix(scope.tenant(), index, value);
        Ok(self
            .scan_prefix(Table::Index, &prefix)?
            .keys()
            .map(|k| String::from_utf8_lossy(&k[prefix.len()..]).into_owned())
            .collect())
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
        let value = stored.encode()?;
        self.write(
            Table::Outbox,
            stored.sequence.to_be_bytes().to_vec(),
            Some(value),
        );
        if let Some(key) = stored.attempt_index_key() {
            self.write(Table::Index, key, Some(Vec::new()));
        }
        // Only an audited topic emitted on someone's behalf is an action.
        let audited = self.origin.as_ref().and_then(|origin| {
            audit::of_event(&stored.topic, &stored.payload).map(|a| (origin.clone(), a))
        });
        if let Some((origin, (action, target))) = audited {
            let mut change = AuditChange::new(&stored.tenant_id, action, target);
            change.before = self.last_value(&change)?;
            change.after = Some(stored.payload.clone());
            self.audit_as(&origin, stored.occurred_at, change)?;
        }
        self.next_seq += 1;
        let sequence = stored.sequence;
        self.events.push(Arc::new(stored));
        Ok(sequence)
    }

    /// Records an action that emits no audited event (an answer, a pool's
    /// settings), as done by whoever the transaction acts for. Without
    /// one (a worker, the autoscaler) nothing is recorded: the
    /// appliance's own doing is not an action.
    pub fn audit(&mut self, at: DateTime<Utc>, change: AuditChange) -> Result<(), StoreError> {
        match self.origin.clone() {
            Some(origin) => self.audit_as(&origin, at, change),
            None => Ok(()),
        }
    }

    /// The value the last record of the same action on the same target
    /// set: what a change replaces.
    fn last_value(&self, change: &AuditChange) -> Result<Option<serde_json::Value>, StoreError> {
        let prefix = trail::target_prefix(&change.tenant_id, &change.action, &change.target);
        let Some(last) = self
            .scan_prefix(Table::Index, &prefix)?
            .into_keys()
            .next_back()
        else {
            return Ok(None);
        };
        let Ok(sequence) = String::from_utf8_lossy(&last[prefix.len()..]).parse::<u64>() else {
            return Ok(None);
        };
        Ok(match self.read(Table::Audit, &trail::key(sequence))? {
            Some(bytes) => trail::decode(&bytes)?.after,
            None => None,
        })
    }

    /// Records an action done by `origin` (a sign-in, before the request
    /// has an actor): the next record of the chain.
    pub fn audit_as(
        &mut self,
        origin: &Origin,
        at: DateTime<Utc>,
        change: AuditChange,
    ) -> Result<(), StoreError> {
        let sequence = self.trail.next;
        let target = trail::target_prefix(&change.tenant_id, &change.action, &change.target);
        let record = AuditRecord::seal(sequence, &self.trail.previous, at, origin, change);
        let mut target_key = target;
        target_key.extend_from_slice(format!("{sequence:020}").as_bytes());
        self.write(Table::Index, target_key, Some(Vec::new()));
        self.write(
            Table::Index,
            trail::tenant_key(&record.tenant_id, sequence),
            Some(Vec::new()),
        );
        self.write(
            Table::Audit,
            trail::key(sequence),
            Some(trail::encode(&record)?),
        );
        self.trail = trail::Head {
            next: sequence + 1,
            previous: record.hash,
        };
        Ok(())
    }

    /// Removes the oldest audit records (retention), naming the last one
    /// removed as what the kept chain follows.
    pub(super) fn prune_audit(&mut self, records: &[AuditRecord]) {
        for record in records {
            self.write(Table::Audit, trail::key(record.sequence), None);
            self.write(
                Table::Index,
                trail::tenant_key(&record.tenant_id, record.sequence),
                None,
            );
            let mut target =
                trail::target_prefix(&record.tenant_id, &record.action, &record.target);
            target.extend_from_slice(format!("{:020}", record.sequence).as_bytes());
            self.write(Table::Index, target, None);
        }
        if let Some(last) = records.last() {
            self.meta_put(trail::PRUNED_THROUGH, &trail::anchor_value(last));
        }
    }

    /// Appends every event of a transition.
    pub fn emit_all(
        &mut self,
        events: impl IntoIterator<Item = NewEvent>,
    ) -> Result<(), StoreError> {
        for event in events {
            self.emit(event)?;
        }
        Ok(())
    }

    /// Deletes one outbox entry (retention).
    pub(crate) fn outbox_delete(&mut self, sequence: u64, index_key: Option<Vec<u8>>) {
        self.write(Table::Outbox, sequence.to_be_bytes().to_vec(), None);
        if let Some(key) = index_key {
            self.write(Table::Index, key, None);
        }
    }

    /// Reads an appliance-level value of the meta tree.
    pub(crate) fn meta_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(Table::Meta, key.as_bytes())
    }

    /// Writes an appliance-level value of the meta tree.
    pub(crate) fn meta_put(&mut self, key: &str, value: &[u8]) {
        self.write(Table::Meta, key.as_bytes().to_vec(), Some(value.to_vec()));
    }

    /// Deletes an appliance-level value of the meta tree.
    pub(crate) fn meta_delete(&mut self, key: &str) {
        self.write(Table::Meta, key.as_bytes().to_vec(), None);
    }
}

/// A stored big-endian u64 (0 when absent or malformed).
pub(super) fn read_u64(bytes: Option<&[u8]>) -> u64 {
    bytes
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map_or(0, u64::from_be_bytes)
}
