//! What a record derives besides itself: index entries, counts and artifact
//! references, kept by [`Tx`](super::Tx) in the same transaction as the
//! record.
//!
//! A record type that sets [`Record::DERIVES`](super::Record::DERIVES)
//! says, in [`Record::derive`](super::Record::derive), which index entries
//! and artifact references its current state has. Every write of such a
//! record ([`Tx::put`](super::Tx::put), [`Tx::save`](super::Tx::save),
//! [`Tx::delete`](super::Tx::delete)) reads the stored state, derives both
//! states and applies the difference: entries that went away are deleted,
//! new ones written, counts moved and artifact reference counts changed.
//! So an index can never disagree with its records, a crash can never
//! leave one half-written, and no caller maintains an index by hand.
//!
//! # Keys (in the `index` tree)
//!
//! - tenant entry: `<tenant>/<index>/<value>/<id>`, newest last for UUIDv7
//!   ids, so a page is a reverse range read of `limit` keys;
//! - the count of a counted index's value: `<tenant>/#/<index>/<value>`
//!   (u64, big-endian). Only indexes whose counts something reads are
//!   counted ([`Derived::counted`]): a count is a read and a write in every
//!   transaction that moves an entry, so an index nobody counts keeps none;
//! - global entry: `~/<index>/<value>/<tenant>/<id>`, for the appliance's
//!   own workers (live work at startup, what is due for purge).
//!
//! Values are escaped (`%` and `/`), so any text can be a value.

use std::collections::BTreeMap;

use crate::domain::TenantId;

/// The first part of global index keys; no tenant id starts with `~`.
pub(crate) const GLOBAL: &[u8] = b"~/";
/// The index name under which counts are kept.
const COUNTS: &str = "#";

/// What one state of a record derives.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Derived {
    pub(crate) entries: Vec<Entry>,
    pub(crate) refs: Vec<String>,
}

/// Where an index entry lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// Under its tenant.
    Tenant,
    /// Under its tenant, in an index that keeps a count per value.
    Counted,
    /// Appliance-wide.
    Global,
}

/// One index entry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Entry {
    pub kind: Kind,
    pub index: &'static str,
    pub value: String,
}

impl Derived {
    /// A tenant-scoped entry under `index`/`value`.
    pub fn index(&mut self, index: &'static str, value: impl Into<String>) -> &mut Self {
        self.entries.push(Entry {
            kind: Kind::Tenant,
            index,
            value: value.into(),
        });
        self
    }

    /// A tenant-scoped entry under `index`/`value`, with a count per value
    /// that [`Store::index_count`](super::Store::index_count) reads. Every
    /// record of a table must count an index or none must.
    pub fn counted(&mut self, index: &'static str, value: impl Into<String>) -> &mut Self {
        self.entries.push(Entry {
            kind: Kind::Counted,
            index,
            value: value.into(),
        });
        self
    }

    /// An entry of the appliance-wide index `index`/`value`.
    pub fn global(&mut self, index: &'static str, value: impl Into<String>) -> &mut Self {
        self.entries.push(Entry {
            kind: Kind::Global,
            index,
            value: value.into(),
        });
        self
    }

    /// A reference to an artifact (ignored when `None`).
    pub fn reference(&mut self, hash: Option<&str>) -> &mut Self {
        if let Some(h) = hash {
            self.refs.push(h.to_string());
        }
        self
    }
}

/// Fixed-width text of a time that sorts as the time does.
pub fn time_value(at: chrono::DateTime<chrono::Utc>) -> String {
    format!("{:020}", at.timestamp_millis().max(0))
}

/// Escapes `%` and `/` in an index value.
pub(crate) fn escape(value: &str) -> String {
    if !value.contains(['%', '/']) {
        return value.to_string();
    }
    value.replace('%', "%25").replace('/', "%2F")
}

/// `<tenant>/<index>/<value>/`.
pub(crate) fn tenant_prefix(tenant: &TenantId, index: &str, value: &str) -> Vec<u8> {
    let mut key = super::tenant_prefix(tenant);
    key.extend_from_slice(index.as_bytes());
    key.push(b'/');
    key.extend_from_slice(escape(value).as_bytes());
    key.push(b'/');
    key
}

/// `~/<index>/` or, with a value, `~/<index>/<value>/`.
pub(crate) fn global_prefix(index: &str, value: Option<&str>) -> Vec<u8> {
    let mut key = GLOBAL.to_vec();
    key.extend_from_slice(index.as_bytes());
    key.push(b'/');
    if let Some(v) = value {
        key.extend_from_slice(escape(v).as_bytes());
        key.push(b'/');
    }
    key
}

/// The key of an entry of record `id` of `tenant`.
pub(crate) fn entry_key(tenant: &TenantId, id: &str, e: &Entry) -> Vec<u8> {
    if e.kind == Kind::Global {
        let mut key = global_prefix(e.index, Some(&e.value));
        key.extend_from_slice(tenant.as_str().as_bytes());
        key.push(b'/');
        key.extend_from_slice(id.as_bytes());
        key
    } else {
        let mut key = tenant_prefix(tenant, e.index, &e.value);
        key.extend_from_slice(id.as_bytes());
        key
    }
}

/// The key of the count of a tenant entry.
pub(crate) fn count_key(tenant: &TenantId, index: &str, value: &str) -> Vec<u8> {
    let mut key = tenant_prefix(tenant, COUNTS, index);
    key.extend_from_slice(escape(value).as_bytes());
    key
}

/// Splits a global key after its `~/<index>/` prefix into value, tenant and
/// id.
pub(crate) fn split_global(rest: &[u8]) -> Option<(String, TenantId, String)> {
    let text = std::str::from_utf8(rest).ok()?;
    let (value, rest) = text.split_once('/')?;
    let (tenant, id) = rest.split_once('/')?;
    let value = value.replace("%2F", "/").replace("%25", "%");
    Some((value, TenantId::parse(tenant).ok()?, id.to_string()))
}

/// How the entries and references of a record change from `before` to
/// `after`: entries to delete, entries to write, and per-artifact deltas.
pub(crate) struct Change {
    pub removed: Vec<Entry>,
    pub added: Vec<Entry>,
    pub refs: BTreeMap<String, i64>,
}

impl Change {
    pub(crate) fn between(before: &Derived, after: &Derived) -> Change {
        let removed = before
            .entries
            .iter()
            .filter(|e| !after.entries.contains(e))
            .cloned()
            .collect();
        let added = after
            .entries
            .iter()
            .filter(|e| !before.entries.contains(e))
            .cloned()
            .collect();
        let mut refs: BTreeMap<String, i64> = BTreeMap::new();
        for r in &before.refs {
            *refs.entry(r.clone()).or_default() -= 1;
        }
        for r in &after.refs {
            *refs.entry(r.clone()).or_default() += 1;
        }
        refs.retain(|_, d| *d != 0);
        Change {
            removed,
            added,
            refs,
        }
    }
}

/// Computes what every record derives: written for a store whose records
/// were written before they derived it (the migration to schema version
/// 2), or kept to compare with what is stored ([`super::Store::audit`]).
pub(crate) struct Rebuild<'a> {
    /// Where entries are written (a rebuild that writes).
    index: Option<&'a dyn super::kv::KvBulk>,
    /// Whether to keep every entry key expected (when not writing them).
    keep_keys: bool,
    /// Every entry key expected (when auditing).
    pub keys: std::collections::BTreeSet<Vec<u8>>,
    /// Expected counts by count key.
    pub counts: BTreeMap<Vec<u8>, u64>,
    /// References per (tenant, hash), for the artifact store's recount.
    pub refs: std::collections::HashMap<(String, String), u64>,
}

impl<'a> Rebuild<'a> {
    /// A rebuild that writes entries into the index table.
    pub(crate) fn writing(kv: &'a dyn super::kv::KvBulk) -> Rebuild<'a> {
        Rebuild {
            index: Some(kv),
            keep_keys: false,
            keys: Default::default(),
            counts: BTreeMap::new(),
            refs: Default::default(),
        }
    }

    /// A rebuild that only computes.
    pub(crate) fn computing() -> Rebuild<'a> {
        Rebuild {
            index: None,
            keep_keys: true,
            keys: Default::default(),
            counts: BTreeMap::new(),
            refs: Default::default(),
        }
    }

    /// A rebuild that computes counts and references only, not keeping
    /// the entry keys (a million records' keys would not fit in memory).
    pub(crate) fn counting() -> Rebuild<'a> {
        Rebuild {
            keep_keys: false,
            ..Rebuild::computing()
        }
    }

    /// Derives every record of `R`'s table.
    pub(crate) fn table<R: super::Record>(
        &mut self,
        kv: &dyn super::kv::KvRead,
    ) -> Result<u64, super::StoreError> {
        let mut n = 0;
        for item in super::kv::Reading::new(kv, R::TABLE).iter() {
            let (k, v) = item?;
            let record: R = super::decode(&k, &v)?;
            self.entries_of(&record)?;
            n += 1;
        }
        Ok(n)
    }

    /// The index of every stored event about an attempt (see
    /// `outbox.rs`).
    pub(crate) fn outbox(&mut self, kv: &dyn super::kv::KvRead) -> Result<u64, super::StoreError> {
        if self.index.is_none() && !self.keep_keys {
            // Event index entries carry no count: nothing to compute.
            return Ok(0);
        }
        let mut n = 0;
        for item in super::kv::Reading::new(kv, super::Table::Outbox).iter() {
            let (k, v) = item?;
            let event = crate::domain::events::StoredEvent::decode(&k, &v)?;
            if let Some(key) = event.attempt_index_key() {
                match &self.index {
                    Some(index) => {
                        index.put(super::Table::Index, &key, &[])?;
                    }
                    None if self.keep_keys => {
                        self.keys.insert(key);
                    }
                    None => {}
                }
                n += 1;
            }
        }
        Ok(n)
    }

    /// The entries of one record, and its references.
    pub(crate) fn entries_of<R: super::Record>(
        &mut self,
        record: &R,
    ) -> Result<(), super::StoreError> {
        let mut d = Derived::default();
        record.derive(&mut d);
        let id = record.id();
        for e in &d.entries {
            let key = entry_key(record.tenant(), &id, e);
            match &self.index {
                Some(index) => {
                    index.put(super::Table::Index, &key, &[])?;
                }
                None if self.keep_keys => {
                    self.keys.insert(key);
                }
                None => {}
            }
            if e.kind == Kind::Counted {
                *self
                    .counts
                    .entry(count_key(record.tenant(), e.index, &e.value))
                    .or_default() += 1;
            }
        }
        for r in d.refs {
            *self
                .refs
                .entry((record.tenant().to_string(), r))
                .or_default() += 1;
        }
        Ok(())
    }

    /// Writes the counts (a rebuild that writes).
    pub(crate) fn finish(self) -> Result<(), super::StoreError> {
        if let Some(index) = self.index {
            write_counts(index, &self.counts)?;
        }
        Ok(())
    }
}

/// Writes counts computed by a [`Rebuild`] into the index tree.
pub(crate) fn write_counts(
    kv: &dyn super::kv::KvBulk,
    counts: &BTreeMap<Vec<u8>, u64>,
) -> Result<(), super::StoreError> {
    for (k, n) in counts {
        kv.put(super::Table::Index, k, &n.to_be_bytes())?;
    }
    Ok(())
}

/// Whether an index key is a count (`<tenant>/#/...`).
pub(crate) fn is_count_key(key: &[u8]) -> bool {
    !key.starts_with(GLOBAL) && String::from_utf8_lossy(key).split('/').nth(1) == Some(COUNTS)
}

/// Whether an index key is one records derive (not a hand-kept index such
/// as the login names, or the audit trail's own, which its appender keeps).
pub(crate) fn is_derived_key(key: &[u8]) -> bool {
    if key.starts_with(GLOBAL) {
        return true;
    }
    let text = String::from_utf8_lossy(key);
    let mut parts = text.splitn(3, '/');
    let (_, index) = (parts.next(), parts.next());
    !matches!(index, Some(i) if i == "user" || i == super::trail::BY_TENANT || i == super::trail::BY_TARGET)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_escape_and_global_keys_split_back() {
        let t = TenantId::parse("acme").unwrap();
        let e = Entry {
            kind: Kind::Global,
            index: "x",
            value: "a/b%c".into(),
        };
        let key = entry_key(&t, "id/1", &e);
        assert_eq!(key, b"~/x/a%2Fb%25c/acme/id/1".to_vec());
        let (v, tenant, id) = split_global(&key[global_prefix("x", None).len()..]).unwrap();
        assert_eq!(
            (v.as_str(), tenant.as_str(), id.as_str()),
            ("a/b%c", "acme", "id/1")
        );
    }

    #[test]
    fn changes_are_differences() {
        let mut a = Derived::default();
        a.index("state", "Running")
            .reference(Some("h1"))
            .reference(Some("h2"));
        let mut b = Derived::default();
        b.index("state", "Succeeded")
            .reference(Some("h2"))
            .reference(Some("h3"));
        let c = Change::between(&a, &b);
        assert_eq!(c.removed[0].value, "Running");
        assert_eq!(c.added[0].value, "Succeeded");
        assert_eq!(
            c.refs.into_iter().collect::<Vec<_>>(),
            vec![("h1".to_string(), -1), ("h3".to_string(), 1)]
        );
    }
}
