//! The artifact store: content by SHA-256, inside the store.
//!
//! Release contents, prompts, model responses, tool payloads and adapter
//! checkpoint blobs are artifacts; records hold their references
//! (`sha256:<hex>`) only. Content lives in the `artifact_chunks` tree in
//! 32 KiB chunks keyed by hash and index, shared by whoever stores the same
//! bytes; each tenant that stores it gets a record in `artifacts`
//! (`<tenant>/<hash>`), and only a tenant with a record can read the bytes.
//! Because chunks are ordinary store values, an artifact commits in the
//! same transaction as the record that refers to it, is flushed and synced
//! like everything else, and is part of every backup.
//!
//! # When content goes
//!
//! Reference counting, kept in the same transaction as the references: a
//! record type that refers to artifacts names them in its
//! [`Record::derive`], and every write of such a record moves the counts
//! (`refs` of the tenant's [`Artifact`]) by the difference. A count that
//! drops to zero marks the artifact expired at once. The Purger then
//! deletes artifacts whose count is zero and whose `retain_until` has
//! passed ([`Tx::sweep_artifact`]), checking both again inside its
//! transaction: since every transaction runs on the one writer thread, a
//! reference written concurrently either committed before (count above
//! zero: kept) or commits after the artifact is gone (and counts nothing).
//! Counting beat mark-and-sweep here because the references are spread
//! over six tables and millions of records: a sweep would have to read all
//! of them, and be paused against writers, to free one blob.
//!
//! Content is shared across tenants: the chunks carry an owner count (how
//! many tenants hold a record of the hash) and go with the last owner.

use crate::domain::content::content_hash;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Derived, Record, Store, StoreError, Table, TenantScope, Tx, time_value};
use crate::domain::TenantId;

/// How long content nothing refers to is kept: an adapter may store content
/// in one call and refer to it in the next. Content something refers to is
/// kept as long as the reference (records follow the tenant's retention).
pub const UNREFERENCED_GRACE_HOURS: i64 = 24;

/// The `retain_until` of content stored at `now`.
pub fn unreferenced_until(now: DateTime<Utc>) -> DateTime<Utc> {
    now + chrono::Duration::hours(UNREFERENCED_GRACE_HOURS)
}

/// Size of one chunk.
pub const CHUNK_BYTES: usize = 32 * 1024;
/// Largest artifact accepted.
pub const MAX_ARTIFACT_BYTES: usize = 64 * 1024 * 1024;

/// A tenant's record of an artifact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// Owner.
    pub tenant_id: TenantId,
    /// `sha256:<hex>`.
    pub hash: String,
    /// Bytes.
    pub size: u64,
    /// What it is, e.g. `text/markdown` or `application/json`.
    pub media_type: String,
    /// When the tenant first stored it.
    pub created_at: DateTime<Utc>,
    /// Kept at least until then; `None` while something refers to it for
    /// good (a release).
    pub retain_until: Option<DateTime<Utc>>,
    /// How many references stored records hold.
    #[serde(default)]
    pub refs: u64,
}

impl Artifact {
    /// Whether the Purger may delete it at `now`.
    pub fn sweepable(&self, now: DateTime<Utc>) -> bool {
        self.refs == 0 && self.retain_until.is_some_and(|t| t <= now)
    }
}

/// The index of unreferenced artifacts, by the time they may go.
pub const SWEEP_INDEX: &str = "artifact-sweep";

impl Record for Artifact {
    const TABLE: Table = Table::Artifacts;
    const VERSION: u16 = 1;
    const DERIVES: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.hash.clone()
    }
    fn derive(&self, d: &mut Derived) {
        if let (0, Some(until)) = (self.refs, self.retain_until) {
            d.index(SWEEP_INDEX, time_value(until));
        }
    }
}

/// Chunk index of the chunk count; its presence means the content is whole.
const COUNT_INDEX: u32 = u32::MAX;
/// Chunk index of the owner count (tenants holding a record of the hash).
const OWNERS_INDEX: u32 = u32::MAX - 1;

fn chunk_key(hash: &str, index: u32) -> Vec<u8> {
    let mut key = hash.as_bytes().to_vec();
    key.push(b'/');
    key.extend_from_slice(&index.to_be_bytes());
    key
}

impl Tx<'_> {
    /// Stores bytes for the scope's tenant and returns their reference.
    /// Content already present (from any tenant) is not written again.
    /// `retain_until: None` keeps it for good.
    pub fn put_artifact(
        &mut self,
        scope: &TenantScope,
        bytes: &[u8],
        media_type: &str,
        retain_until: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<String, StoreError> {
        if bytes.len() > MAX_ARTIFACT_BYTES {
            return Err(StoreError::TooLarge {
                table: Table::Artifacts.name(),
                size: bytes.len(),
                max: MAX_ARTIFACT_BYTES,
            });
        }
        let hash = content_hash(bytes);
        // The chunk count is stored under index u32::MAX: present means the
        // content is complete (it is written in the same transaction).
        let count_key = chunk_key(&hash, COUNT_INDEX);
        if self.raw_get(Table::ArtifactChunks, &count_key)?.is_none() {
            let chunks: Vec<&[u8]> = bytes.chunks(CHUNK_BYTES).collect();
            for (i, chunk) in chunks.iter().enumerate() {
                self.raw_write(
                    Table::ArtifactChunks,
                    chunk_key(&hash, i as u32),
                    Some(chunk.to_vec()),
                );
            }
            self.raw_write(
                Table::ArtifactChunks,
                count_key,
                Some((chunks.len() as u32).to_be_bytes().to_vec()),
            );
        }
        let existing: Option<Artifact> = self.get(scope, &hash)?;
        let record = match existing {
            Some(mut a) => {
                // The longer retention wins; `None` (for good) beats any date.
                a.retain_until = match (a.retain_until, retain_until) {
                    (None, _) | (_, None) => None,
                    (Some(x), Some(y)) => Some(x.max(y)),
                };
                a
            }
            None => {
                self.add_owner(&hash, 1);
                Artifact {
                    tenant_id: scope.tenant().clone(),
                    hash: hash.clone(),
                    size: bytes.len() as u64,
                    media_type: media_type.to_string(),
                    created_at: now,
                    retain_until,
                    refs: 0,
                }
            }
        };
        self.put(scope, &record)?;
        Ok(hash)
    }

    /// Moves the reference count of an artifact of the scope's tenant by
    /// `delta`. A count that reaches zero makes the artifact due at once
    /// (unless it is kept for good). A reference to content the tenant
    /// does not hold (already swept, or never stored) counts nothing.
    pub(super) fn adjust_refs(
        &mut self,
        scope: &TenantScope,
        hash: &str,
        delta: i64,
    ) -> Result<(), StoreError> {
        let Some(mut a) = self.get::<Artifact>(scope, hash)? else {
            return Ok(());
        };
        a.refs = a.refs.saturating_add_signed(delta);
        if a.refs == 0 && delta < 0 {
            a.retain_until = a.retain_until.map(|_| a.created_at);
        }
        self.put(scope, &a)
    }

    /// Deletes an artifact of the scope's tenant if nothing refers to it
    /// and its retention has passed at `now`, with its content when no
    /// other tenant holds it. Returns whether it was deleted.
    pub fn sweep_artifact(
        &mut self,
        scope: &TenantScope,
        hash: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let Some(a) = self.get::<Artifact>(scope, hash)? else {
            return Ok(false);
        };
        if !a.sweepable(now) {
            return Ok(false);
        }
        self.delete::<Artifact>(scope, hash)?;
        if self.add_owner(hash, -1) == 0 {
            let count = self.chunk_count(hash)?;
            for i in 0..count as u32 {
                self.raw_write(Table::ArtifactChunks, chunk_key(hash, i), None);
            }
            self.raw_write(Table::ArtifactChunks, chunk_key(hash, COUNT_INDEX), None);
            self.raw_write(Table::ArtifactChunks, chunk_key(hash, OWNERS_INDEX), None);
        }
        Ok(true)
    }

    fn chunk_count(&self, hash: &str) -> Result<u64, StoreError> {
        Ok(self
            .raw_get(Table::ArtifactChunks, &chunk_key(hash, COUNT_INDEX))?
            .and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok())
            .map_or(0, |b| u32::from_be_bytes(b) as u64))
    }

    /// Moves the owner count of content; returns the new count.
    fn add_owner(&mut self, hash: &str, delta: i64) -> u64 {
        let key = chunk_key(hash, OWNERS_INDEX);
        let now = self
            .raw_get(Table::ArtifactChunks, &key)
            .ok()
            .flatten()
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map_or(0, u64::from_be_bytes);
        let next = now.saturating_add_signed(delta);
        self.raw_write(
            Table::ArtifactChunks,
            key,
            (next > 0).then(|| next.to_be_bytes().to_vec()),
        );
        next
    }
}

/// Recounts what the artifact store derives, for a store written before
/// reference counts: `refs` of every artifact record from `counts`
/// (tenant, hash -> references) and the owner count of all content.
pub(super) fn recount(
    kv: &dyn super::kv::KvBulk,
    rebuild: &mut super::derived::Rebuild<'_>,
) -> Result<(), StoreError> {
    let counts = std::mem::take(&mut rebuild.refs);
    let mut owners: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let all = super::kv::Reading::new(kv, Table::Artifacts)
        .iter()
        .collect::<Result<Vec<_>, _>>()?;
    for (k, v) in all {
        let mut a: Artifact = super::decode(&k, &v)?;
        a.refs = counts
            .get(&(a.tenant_id.to_string(), a.hash.clone()))
            .copied()
            .unwrap_or(0);
        *owners.entry(a.hash.clone()).or_default() += 1;
        rebuild.entries_of(&a)?;
        kv.put(Table::Artifacts, &k, &super::encode(&a)?)?;
    }
    for (hash, n) in owners {
        kv.put(
            Table::ArtifactChunks,
            &chunk_key(&hash, OWNERS_INDEX),
            &n.to_be_bytes(),
        )?;
    }
    Ok(())
}

impl Store {
    /// Reads an artifact of the scope's tenant, checking its hash.
    pub fn read_artifact(
        &self,
        scope: &TenantScope,
        hash: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.artifact(scope, hash)?.map(|(_, bytes)| bytes))
    }

    /// An artifact of the scope's tenant with its record (size, media
    /// type, retention), checking its hash.
    pub fn artifact(
        &self,
        scope: &TenantScope,
        hash: &str,
    ) -> Result<Option<(Artifact, Vec<u8>)>, StoreError> {
        let Some(record) = self.get::<Artifact>(scope, hash)? else {
            return Ok(None);
        };
        let tree = self.tree(Table::ArtifactChunks)?;
        let corrupt = |reason: String| StoreError::Corrupt {
            table: Table::ArtifactChunks.name(),
            key: hash.to_string(),
            reason,
        };
        let count = tree
            .get(chunk_key(hash, COUNT_INDEX))?
            .ok_or_else(|| corrupt("the content is missing".into()))?;
        let count = u32::from_be_bytes(
            count
                .as_slice()
                .try_into()
                .map_err(|_| corrupt("bad chunk count".into()))?,
        );
        let mut bytes = Vec::new();
        for i in 0..count {
            let chunk = tree
                .get(chunk_key(hash, i))?
                .ok_or_else(|| corrupt(format!("chunk {i} of {count} is missing")))?;
            bytes.extend_from_slice(&chunk);
        }
        let actual = content_hash(&bytes);
        if actual != hash {
            return Err(corrupt(format!("the content hashes to {actual}")));
        }
        Ok(Some((record, bytes)))
    }
}

/// Compares what is stored of the artifact store's derived state with what
/// the records say (see [`Store::audit`]); appends every difference.
pub(super) fn audit(
    kv: &dyn super::kv::KvRead,
    rebuild: &mut super::derived::Rebuild<'_>,
    problems: &mut Vec<String>,
) -> Result<(), StoreError> {
    let artifacts = super::kv::Reading::new(kv, Table::Artifacts);
    let chunks = super::kv::Reading::new(kv, Table::ArtifactChunks);
    let mut owners: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let mut expected = std::mem::take(&mut rebuild.refs);
    for item in artifacts.iter() {
        let (k, v) = item?;
        let a: Artifact = super::decode(&k, &v)?;
        rebuild.entries_of(&a)?;
        *owners.entry(a.hash.clone()).or_default() += 1;
        let want = expected
            .remove(&(a.tenant_id.to_string(), a.hash.clone()))
            .unwrap_or(0);
        if a.refs != want {
            problems.push(format!(
                "artifact {} of tenant {} counts {} references, the records hold {want}",
                a.hash, a.tenant_id, a.refs
            ));
        }
        if chunks.get(chunk_key(&a.hash, COUNT_INDEX))?.is_none() {
            problems.push(format!(
                "artifact {} of tenant {} has no content",
                a.hash, a.tenant_id
            ));
        }
    }
    for ((tenant, hash), n) in expected {
        problems.push(format!(
            "{n} references of tenant {tenant} to {hash}, which the tenant does not hold (dangling)"
        ));
    }
    for item in chunks.iter() {
        let (k, v) = item?;
        // `<hash>/<u32 index>`: the index is the last four bytes.
        if k.len() < 5 {
            continue;
        }
        let slash = k.len() - 5;
        let hash = String::from_utf8_lossy(&k[..slash]).into_owned();
        let index = <[u8; 4]>::try_from(&k[slash + 1..])
            .map(u32::from_be_bytes)
            .ok();
        let held = owners.get(&hash).copied().unwrap_or(0);
        if held == 0 {
            problems.push(format!(
                "content {hash} is stored but no tenant holds it (orphan)"
            ));
            continue;
        }
        if index == Some(OWNERS_INDEX) {
            let n = <[u8; 8]>::try_from(v.as_ref()).map_or(0, u64::from_be_bytes);
            if n != held {
                problems.push(format!(
                    "content {hash} counts {n} owners, {held} tenants hold it"
                ));
            }
        }
    }
    Ok(())
}
