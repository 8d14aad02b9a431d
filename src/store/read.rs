//! Reads outside a transaction: records, indexes and pages of them, as
//! every reader on any thread sees them (see the guarantees at the top of
//! `mod.rs`), and the offline consistency check.

use std::collections::BTreeMap;

use super::{
    Record, Store, StoreError, Table, artifacts, decode, derived, prefix_end, record_key, schema,
    tenant_prefix, tx,
};
use crate::domain::TenantId;
use crate::domain::access::{PlatformScope, TenantScope};

impl Store {
    /// Reads one record of the scope's tenant.
    pub fn get<R: Record>(&self, scope: &TenantScope, id: &str) -> Result<Option<R>, StoreError> {
        let key = record_key(scope.tenant(), id);
        self.tree(R::TABLE)?
            .get(&key)?
            .map(|bytes| decode::<R>(&key, &bytes))
            .transpose()
    }

    /// Every record of the table in the scope's tenant, in key order.
    pub fn list<R: Record>(&self, scope: &TenantScope) -> Result<Vec<R>, StoreError> {
        self.list_page(scope, None, usize::MAX)
    }

    /// Up to `limit` records of the scope's tenant with ids after `after`.
    pub fn list_page<R: Record>(
        &self,
        scope: &TenantScope,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<R>, StoreError> {
        let prefix = tenant_prefix(scope.tenant());
        let start = match after {
            // The first key strictly after `<tenant>/<after>`.
            Some(after) => {
                let mut k = record_key(scope.tenant(), after);
                k.push(0);
                k
            }
            None => prefix.clone(),
        };
        let mut end = prefix.clone();
        *end.last_mut().expect("prefix ends with '/'") += 1;
        self.tree(R::TABLE)?
            .range(start..end)
            .take(limit)
            .map(|item| {
                let (k, v) = item?;
                decode::<R>(&k, &v)
            })
            .collect()
    }

    /// Records of the scope's tenant whose ids start with `id_prefix` (the
    /// entities of one attempt: `<attempt>/`), in key order.
    pub fn list_under<R: Record>(
        &self,
        scope: &TenantScope,
        id_prefix: &str,
    ) -> Result<Vec<R>, StoreError> {
        let prefix = record_key(scope.tenant(), id_prefix);
        self.tree(R::TABLE)?
            .scan_prefix(&prefix)
            .map(|item| {
                let (k, v) = item?;
                decode::<R>(&k, &v)
            })
            .collect()
    }

    /// Reads every record of `R`'s table back as this binary's type (an
    /// older shape through [`Record::upgrade`]) and counts them; the first
    /// that does not read back is the error. For the offline check.
    pub fn read_back<R: Record>(&self) -> Result<usize, StoreError> {
        let mut n = 0;
        for item in self.tree(R::TABLE)?.iter() {
            let (k, v) = item?;
            decode::<R>(&k, &v)?;
            n += 1;
        }
        Ok(n)
    }

    /// Every record of the table, of every tenant, for PlatformAdmins and
    /// the appliance's workers.
    pub fn scan_all<R: Record>(&self, _platform: &PlatformScope) -> Result<Vec<R>, StoreError> {
        self.tree(R::TABLE)?
            .iter()
            .map(|item| {
                let (k, v) = item?;
                decode::<R>(&k, &v)
            })
            .collect()
    }

    /// Ids under `<tenant>/<index>/<value>/`.
    pub fn index_ids(
        &self,
        scope: &TenantScope,
        index: &str,
        value: &str,
    ) -> Result<Vec<String>, StoreError> {
        let prefix = derived::tenant_prefix(scope.tenant(), index, value);
        self.tree(Table::Index)?
            .scan_prefix(&prefix)
            .map(|item| {
                let (k, _) = item?;
                Ok(String::from_utf8_lossy(&k[prefix.len()..]).into_owned())
            })
            .collect()
    }

    /// Ids of the tenant's derived entries `index`/`value`, last first
    /// (newest first for UUIDv7 ids), before `before` when given, at most
    /// `limit`: a page reads `limit` keys whatever the history.
    pub fn index_page(
        &self,
        scope: &TenantScope,
        index: &str,
        value: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let prefix = derived::tenant_prefix(scope.tenant(), index, value);
        let end = match before {
            Some(id) => {
                let mut k = prefix.clone();
                k.extend_from_slice(id.as_bytes());
                k
            }
            None => prefix_end(&prefix),
        };
        self.ids_before(Table::Index, &prefix, end, limit)
    }

    /// How many derived entries `index`/`value` the tenant has, for an
    /// index its records count ([`Derived::counted`]); an index kept
    /// without counts reads 0.
    pub fn index_count(
        &self,
        scope: &TenantScope,
        index: &str,
        value: &str,
    ) -> Result<u64, StoreError> {
        let key = derived::count_key(scope.tenant(), index, value);
        Ok(tx::read_u64(self.tree(Table::Index)?.get(key)?.as_deref()))
    }

    /// The tenant's derived entries of `index` with a value from `from`
    /// (when given) up to `up_to` inclusive (when given), lowest value
    /// first, at most `limit`, as (value, id): what is due by a
    /// time-valued index, or what ended since a time.
    pub fn index_range(
        &self,
        scope: &TenantScope,
        index: &str,
        from: Option<&str>,
        up_to: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut prefix = tenant_prefix(scope.tenant());
        prefix.extend_from_slice(index.as_bytes());
        prefix.push(b'/');
        let mut start = prefix.clone();
        if let Some(f) = from {
            start.extend_from_slice(derived::escape(f).as_bytes());
        }
        let end = match up_to {
            Some(u) => {
                let mut end = prefix.clone();
                end.extend_from_slice(derived::escape(u).as_bytes());
                end.push(b'/' + 1);
                end
            }
            None => prefix_end(&prefix),
        };
        let mut out = Vec::new();
        for item in self.tree(Table::Index)?.range(start..end) {
            if out.len() >= limit {
                break;
            }
            let (k, _) = item?;
            let rest = String::from_utf8_lossy(&k[prefix.len()..]).into_owned();
            if let Some((value, id)) = rest.split_once('/') {
                out.push((value.to_string(), id.to_string()));
            }
        }
        Ok(out)
    }

    /// Up to `limit` records of the tenant, newest first, before `before`
    /// when given, that `keep` admits: read through the derived index
    /// `by` (index, value) when given, else the table itself. Each step
    /// reads one page of keys, so a page costs `limit` records when the
    /// index is the caller's whole filter.
    pub fn page<R: Record>(
        &self,
        scope: &TenantScope,
        by: Option<(&str, &str)>,
        before: Option<&str>,
        limit: usize,
        mut keep: impl FnMut(&R) -> bool,
    ) -> Result<Vec<R>, StoreError> {
        let mut out = Vec::new();
        let mut cursor = before.map(str::to_string);
        let step = limit.clamp(1, 200);
        while out.len() < limit {
            let ids = match by {
                Some((index, value)) => {
                    self.index_page(scope, index, value, cursor.as_deref(), step)?
                }
                None => self.table_page::<R>(scope, cursor.as_deref(), step)?,
            };
            let Some(last) = ids.last().cloned() else {
                break;
            };
            for r in self.get_many::<R>(scope, &ids)? {
                if out.len() < limit && keep(&r) {
                    out.push(r);
                }
            }
            if ids.len() < step {
                break;
            }
            cursor = Some(last);
        }
        Ok(out)
    }

    /// Ids of the tenant's records of `R`, last first, before `before`.
    fn table_page<R: Record>(
        &self,
        scope: &TenantScope,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let prefix = tenant_prefix(scope.tenant());
        let end = match before {
            Some(id) => record_key(scope.tenant(), id),
            None => prefix_end(&prefix),
        };
        self.ids_before(R::TABLE, &prefix, end, limit)
    }

    /// The rest after `prefix` of up to `limit` keys of `table` from
    /// `prefix` to `end`, last first.
    fn ids_before(
        &self,
        table: Table,
        prefix: &[u8],
        end: Vec<u8>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.tree(table)?
            .range(prefix.to_vec()..end)
            .rev()
            .take(limit)
            .map(|item| {
                let (k, _) = item?;
                Ok(String::from_utf8_lossy(&k[prefix.len()..]).into_owned())
            })
            .collect()
    }

    /// Every entry of the appliance-wide index `index`/`value`, as
    /// (tenant, id): for the appliance's workers (live work at startup).
    pub fn global_ids(
        &self,
        _platform: &PlatformScope,
        index: &str,
        value: &str,
    ) -> Result<Vec<(TenantId, String)>, StoreError> {
        let all = derived::global_prefix(index, None);
        let prefix = derived::global_prefix(index, Some(value));
        self.tree(Table::Index)?
            .scan_prefix(&prefix)
            .filter_map(|item| match item {
                Ok((k, _)) => derived::split_global(&k[all.len()..]).map(|(_, t, id)| Ok((t, id))),
                Err(e) => Some(Err(e)),
            })
            .collect()
    }

    /// Records of the tenant by id, in the order given, skipping ids with
    /// no record (deleted since the index was read).
    pub fn get_many<R: Record>(
        &self,
        scope: &TenantScope,
        ids: &[String],
    ) -> Result<Vec<R>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(r) = self.get(scope, id)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Checks that what records derive is what is stored: every index
    /// entry and count, every artifact's reference count, the owners of
    /// all content, no reference to content that is gone and no content
    /// nobody holds. Returns the differences (none: consistent). Reads sled
    /// directly: meant for a store nothing writes to (offline, or a test
    /// after a crash).
    pub fn audit(&self) -> Result<Vec<String>, StoreError> {
        let kv = self.inner.engine.reader();
        let mut rebuild = derived::Rebuild::computing();
        schema::derive_tables(kv, &mut rebuild)?;
        let mut problems = Vec::new();
        artifacts::audit(kv, &mut rebuild, &mut problems)?;
        let mut stored_counts = BTreeMap::new();
        let mut stored_keys = std::collections::BTreeSet::new();
        for item in self.tree(Table::Index)?.iter() {
            let (k, v) = item?;
            if !derived::is_derived_key(&k) {
                continue;
            }
            if derived::is_count_key(&k) {
                stored_counts.insert(k.to_vec(), tx::read_u64(Some(&v)));
            } else {
                stored_keys.insert(k.to_vec());
            }
        }
        let text = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
        for k in rebuild.keys.difference(&stored_keys) {
            problems.push(format!("index entry {} is missing", text(k)));
        }
        for k in stored_keys.difference(&rebuild.keys) {
            problems.push(format!("index entry {} has no record", text(k)));
        }
        if stored_counts != rebuild.counts {
            for (k, n) in &rebuild.counts {
                let have = stored_counts.get(k).copied().unwrap_or(0);
                if have != *n {
                    problems.push(format!("count {} is {have}, the records make {n}", text(k)));
                }
            }
            for k in stored_counts
                .keys()
                .filter(|k| !rebuild.counts.contains_key(*k))
            {
                problems.push(format!("count {} has no records", text(k)));
            }
        }
        if let Some(broken) = self.verify_audit(&Default::default())?.broken {
            problems.push(format!(
                "the audit chain is broken at record {}: {}",
                broken.sequence, broken.reason
            ));
        }
        Ok(problems)
    }

    /// Reads an appliance-level value of the meta tree (a worker's cursor).
    pub fn meta_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.tree(Table::Meta)?.get(key)?.map(|v| v.to_vec()))
    }
}
