//! The audit trail as stored: one table keyed by the record's big-endian
//! sequence, appended only by the writer thread (so the chain follows
//! commit order), and an index per tenant.
//!
//! Who acts comes with the task that submits a transaction
//! ([`crate::acting`]): the commit takes what it finds there. An event of an audited topic
//! emitted by a transaction that has an actor is an audit record; a
//! transaction without one (a worker, the autoscaler) is the appliance's
//! own doing.

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use super::kv::{KvRead, Reading};
use super::{StoreError, Table};
use crate::domain::TenantId;
use crate::domain::audit::{
    AuditFilter, AuditRecord, ChainBreak, ChainCheck, TrailReport, genesis,
};

/// Meta key: the sequence (8 bytes, big-endian) and hash of the last
/// record retention removed, which the first kept record follows.
pub(super) const PRUNED_THROUGH: &str = "audit.pruned_through";
/// Index of a tenant's records: `<tenant>/audit/all/<sequence, 20 digits>`.
pub(super) const BY_TENANT: &str = "audit";
/// Index of the records of one action on one target, for the value before
/// a change: `<tenant>/audit-target/<hash of action and target>/<sequence>`.
pub(super) const BY_TARGET: &str = "audit-target";

/// The end of the chain: the next record's number and the hash it follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Head {
    pub next: u64,
    pub previous: String,
}

impl Head {
    /// The head of the stored chain.
    pub(super) fn read(kv: &dyn KvRead) -> Result<Head, StoreError> {
        if let Some((_, bytes)) = Reading::new(kv, Table::Audit).last()? {
            let last = decode(&bytes)?;
            return Ok(Head {
                next: last.sequence + 1,
                previous: last.hash,
            });
        }
        Ok(anchor(
            kv.get(Table::Meta, PRUNED_THROUGH.as_bytes())?.as_deref(),
        ))
    }
}

/// The record the kept chain follows: the last one pruned, or the genesis.
fn anchor(stored: Option<&[u8]>) -> Head {
    match stored.filter(|b| b.len() > 8) {
        Some(b) => Head {
            next: u64::from_be_bytes(b[..8].try_into().expect("8 bytes")) + 1,
            previous: String::from_utf8_lossy(&b[8..]).into_owned(),
        },
        None => Head {
            next: 1,
            previous: genesis(),
        },
    }
}

pub(super) fn key(sequence: u64) -> Vec<u8> {
    sequence.to_be_bytes().to_vec()
}

pub(super) fn encode(record: &AuditRecord) -> Result<Vec<u8>, StoreError> {
    rmp_serde::to_vec_named(record).map_err(|e| StoreError::Corrupt {
        table: Table::Audit.name(),
        key: record.sequence.to_string(),
        reason: e.to_string(),
    })
}

pub(super) fn decode(bytes: &[u8]) -> Result<AuditRecord, StoreError> {
    rmp_serde::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        table: Table::Audit.name(),
        key: String::new(),
        reason: e.to_string(),
    })
}

/// The tenant index key of a record.
pub(super) fn tenant_key(tenant: &TenantId, sequence: u64) -> Vec<u8> {
    let mut key = super::derived::tenant_prefix(tenant, BY_TENANT, "all");
    key.extend_from_slice(format!("{sequence:020}").as_bytes());
    key
}

/// The prefix of the records of `action` on `target`.
pub(super) fn target_prefix(tenant: &TenantId, action: &str, target: &str) -> Vec<u8> {
    let digest = Sha256::digest(format!("{action}\n{target}").as_bytes());
    super::derived::tenant_prefix(tenant, BY_TARGET, &hex::encode(&digest[..16]))
}

/// The sequence a tenant or target index key ends with.
fn sequence_of(key: &[u8]) -> Option<u64> {
    let tail = key.rsplit(|b| *b == b'/').next()?;
    std::str::from_utf8(tail).ok()?.parse().ok()
}

/// Up to `limit` records `filter` admits, newest first, before record
/// `before` when given.
pub(super) fn page(
    trail: &Reading<'_>,
    index: &Reading<'_>,
    filter: &AuditFilter,
    before: Option<u64>,
    limit: usize,
) -> Result<Vec<AuditRecord>, StoreError> {
    let mut out = Vec::new();
    let end = before.unwrap_or(u64::MAX);
    let mut take = |record: AuditRecord| {
        if filter.admits(&record) {
            out.push(record);
        }
        out.len() < limit
    };
    match &filter.tenant {
        Some(tenant) => {
            let prefix = super::derived::tenant_prefix(tenant, BY_TENANT, "all");
            let mut end_key = prefix.clone();
            end_key.extend_from_slice(format!("{end:020}").as_bytes());
            for item in index.range(prefix.clone()..end_key).rev() {
                let (k, _) = item?;
                let Some(sequence) = sequence_of(&k) else {
                    continue;
                };
                if let Some(bytes) = trail.get(key(sequence))?
                    && !take(decode(&bytes)?)
                {
                    break;
                }
            }
        }
        None => {
            for item in trail.range(..key(end)).rev() {
                let (_, bytes) = item?;
                if !take(decode(&bytes)?) {
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// Checks every kept record against the chain.
pub(super) fn verify(
    trail: &Reading<'_>,
    meta: &Reading<'_>,
    expect: &crate::domain::audit::Expect,
) -> Result<TrailReport, StoreError> {
    let start = anchor(meta.get(PRUNED_THROUGH)?.as_deref());
    let mut head_at = None;
    let mut check = ChainCheck::new(start.next, start.previous.clone());
    let mut first = None;
    let mut last = None;
    for item in trail.iter() {
        let (k, bytes) = item?;
        let record = match decode(&bytes) {
            Ok(r) => r,
            Err(e) => {
                let sequence = k
                    .as_slice()
                    .try_into()
                    .map(u64::from_be_bytes)
                    .unwrap_or_default();
                check.broken.get_or_insert(ChainBreak {
                    sequence,
                    reason: format!("record {sequence} cannot be read: {e}"),
                });
                break;
            }
        };
        first.get_or_insert(record.sequence);
        if !check.take(&record) {
            break;
        }
        if expect.head.as_deref() == Some(record.hash.as_str()) {
            head_at = Some(record.sequence);
        }
        last = Some(record.sequence);
    }
    let mut report = TrailReport {
        checked: check.checked,
        first,
        last,
        anchor: start.previous,
        head: check.head().to_string(),
        broken: check.broken,
        unmet: Vec::new(),
    };
    report.unmet = expect.unmet(&report, head_at);
    Ok(report)
}

/// The oldest records written before `until`, at most `limit`: what
/// retention removes next.
pub(super) fn expired(
    trail: &Reading<'_>,
    until: DateTime<Utc>,
    limit: usize,
) -> Result<Vec<AuditRecord>, StoreError> {
    let mut out = Vec::new();
    for item in trail.iter() {
        let (_, bytes) = item?;
        let record = decode(&bytes)?;
        if record.at >= until || out.len() >= limit {
            break;
        }
        out.push(record);
    }
    Ok(out)
}

/// The meta value naming `record` as the last one removed.
pub(super) fn anchor_value(record: &AuditRecord) -> Vec<u8> {
    let mut value = record.sequence.to_be_bytes().to_vec();
    value.extend_from_slice(record.hash.as_bytes());
    value
}
