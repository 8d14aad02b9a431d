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

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Record, Store, StoreError, Table, TenantScope, Tx};
use crate::domain::TenantId;

/// Size of one chunk.
pub const CHUNK_BYTES: usize = 32 * 1024;
/// Largest artifact accepted.
pub const MAX_ARTIFACT_BYTES: usize = 64 * 1024 * 1024;

/// `sha256:<hex>` of bytes.
pub fn content_hash(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

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
}

impl Record for Artifact {
    const TABLE: Table = Table::Artifacts;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.hash.clone()
    }
}

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
        let count_key = chunk_key(&hash, u32::MAX);
        if self.raw_get(Table::ArtifactChunks, &count_key)?.is_none() {
            let chunks: Vec<&[u8]> = bytes.chunks(CHUNK_BYTES).collect();
            for (i, chunk) in chunks.iter().enumerate() {
                self.raw_put(
                    Table::ArtifactChunks,
                    chunk_key(&hash, i as u32),
                    chunk.to_vec(),
                );
            }
            self.raw_put(
                Table::ArtifactChunks,
                count_key,
                (chunks.len() as u32).to_be_bytes().to_vec(),
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
            None => Artifact {
                tenant_id: scope.tenant().clone(),
                hash: hash.clone(),
                size: bytes.len() as u64,
                media_type: media_type.to_string(),
                created_at: now,
                retain_until,
            },
        };
        self.put(scope, &record)?;
        Ok(hash)
    }
}

impl Store {
    /// Reads an artifact of the scope's tenant, checking its hash.
    pub fn read_artifact(
        &self,
        scope: &TenantScope,
        hash: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        if self.get::<Artifact>(scope, hash)?.is_none() {
            return Ok(None);
        }
        let tree = self.tree(Table::ArtifactChunks);
        let corrupt = |reason: String| StoreError::Corrupt {
            table: Table::ArtifactChunks.name(),
            key: hash.to_string(),
            reason,
        };
        let count = tree
            .get(chunk_key(hash, u32::MAX))?
            .ok_or_else(|| corrupt("the content is missing".into()))?;
        let count = u32::from_be_bytes(
            count
                .as_ref()
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
        Ok(Some(bytes))
    }
}
