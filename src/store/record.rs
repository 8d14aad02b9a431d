//! What the store keeps: its tables, records and their encoding, and the
//! key layout every backend shares (`<tenant>/<id>`, index keys
//! `<tenant>/<index>/<value>/<id>`).

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Derived, MAX_RECORD_BYTES, StoreError};
use crate::domain::TenantId;

/// The trees of the store. Tables of the specifications get a variant as
/// their aggregate is implemented.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// Format marker, schema version and appliance secrets.
    Meta,
    /// Events by sequence number.
    Outbox,
    /// Secondary keys of every table.
    Index,
    /// Client credentials.
    Clients,
    /// Registered tenants.
    Tenants,
    /// Projects of tenants.
    Projects,
    /// Worker pools with their accounting (WorkerPools).
    WorkerPools,
    /// Quotas of editions, tenants and projects (Quotas).
    Quotas,
    /// Capacity leases (CapacityLeases).
    CapacityLeases,
    /// Lease seconds charged per tenant, project and UTC day.
    ExecutionMinutes,
    /// Artifact records per tenant.
    Artifacts,
    /// Artifact content, by hash (see `artifacts.rs`).
    ArtifactChunks,
    /// Loaded releases (LoadedReleases).
    LoadedReleases,
    /// Runs with their steps (run control).
    Runs,
    /// Execution attempts (ExecutionAttempts).
    Attempts,
    /// Checkpoints, `<attempt>/<sequence>` (Checkpoints).
    Checkpoints,
    /// Call records, `<attempt>/<sequence>` (CallRecords).
    CallRecords,
    /// Decision requests and approvals (DecisionRequests).
    Decisions,
    /// Sub-agent delegations, `<attempt>/<delegation>` (SubAgentDelegations).
    Delegations,
    /// Console users, `<tenant>/<username>`.
    Users,
    /// Trusted and revoked publisher keys (platform), by key id.
    PublisherKeys,
    /// Verdicts on releases, `<release>/<verdict>`, kept as evidence.
    ReleaseVerdicts,
    /// The site's model profiles (platform-wide, or one tenant's), by id.
    ModelProfiles,
    /// Run slots held by live runs (RunSlots), by run.
    RunSlots,
    /// Model tokens per tenant and UTC day (the token ledger), by day.
    TokenDays,
    /// Model tokens per run, own and with its child runs, by run.
    RunTokens,
    /// Webhook endpoints, by id.
    WebhookEndpoints,
    /// Webhook deliveries, `<endpoint>/<message id>`.
    WebhookDeliveries,
    /// The audit trail, by sequence (see `trail.rs`).
    Audit,
    /// Mails about decisions, `<attempt>/<decision>/<user>` (see `notify`).
    Mails,
    /// Opened links to decisions, by link id, kept until they expire.
    LinkUses,
}

impl Table {
    /// Every table, in tree order.
    pub const ALL: &'static [Table] = &[
        Table::Meta,
        Table::Outbox,
        Table::Index,
        Table::Clients,
        Table::Tenants,
        Table::Projects,
        Table::WorkerPools,
        Table::Quotas,
        Table::CapacityLeases,
        Table::ExecutionMinutes,
        Table::Artifacts,
        Table::ArtifactChunks,
        Table::LoadedReleases,
        Table::Runs,
        Table::Attempts,
        Table::Checkpoints,
        Table::CallRecords,
        Table::Decisions,
        Table::Delegations,
        Table::Users,
        Table::PublisherKeys,
        Table::ReleaseVerdicts,
        Table::ModelProfiles,
        Table::RunSlots,
        Table::TokenDays,
        Table::RunTokens,
        Table::WebhookEndpoints,
        Table::WebhookDeliveries,
        Table::Audit,
        Table::Mails,
        Table::LinkUses,
    ];

    /// The table of a name (as [`Table::name`] gives it).
    pub(crate) fn named(name: &[u8]) -> Option<Table> {
        Table::ALL
            .iter()
            .copied()
            .find(|t| t.name().as_bytes() == name)
    }

    /// The sled tree name.
    pub fn name(self) -> &'static str {
        match self {
            Table::Meta => "meta",
            Table::Outbox => "outbox",
            Table::Index => "index",
            Table::Clients => "clients",
            Table::Tenants => "tenants",
            Table::Projects => "projects",
            Table::WorkerPools => "worker_pools",
            Table::Quotas => "quotas",
            Table::CapacityLeases => "capacity_leases",
            Table::ExecutionMinutes => "execution_minutes",
            Table::Artifacts => "artifacts",
            Table::ArtifactChunks => "artifact_chunks",
            Table::LoadedReleases => "loaded_releases",
            Table::Runs => "runs",
            Table::Attempts => "attempts",
            Table::Checkpoints => "checkpoints",
            Table::CallRecords => "call_records",
            Table::Decisions => "decisions",
            Table::Delegations => "delegations",
            Table::Users => "users",
            Table::PublisherKeys => "publisher_keys",
            Table::ReleaseVerdicts => "release_verdicts",
            Table::ModelProfiles => "model_profiles",
            Table::RunSlots => "run_slots",
            Table::TokenDays => "token_days",
            Table::RunTokens => "run_tokens",
            Table::WebhookEndpoints => "webhook_endpoints",
            Table::WebhookDeliveries => "webhook_deliveries",
            Table::Audit => "audit",
            Table::Mails => "mails",
            Table::LinkUses => "link_uses",
        }
    }

    pub(super) fn position(self) -> usize {
        Table::ALL
            .iter()
            .position(|t| *t == self)
            .expect("every table is listed in ALL")
    }
}

/// A stored aggregate or entity.
pub trait Record: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The tree it lives in.
    const TABLE: Table;
    /// The version of its stored shape. Bump it when a field changes meaning
    /// or type, and teach [`Record::upgrade`] the old shape.
    const VERSION: u16;
    /// Its tenant: the first part of its key.
    fn tenant(&self) -> &TenantId;
    /// Its id within the tenant: the rest of its key.
    fn id(&self) -> String;
    /// Reads a value written with an older `VERSION`.
    fn upgrade(version: u16, bytes: &[u8]) -> Result<Self, String> {
        let _ = bytes;
        Err(format!("no upgrade from version {version}"))
    }
    /// Whether the record is a [`Versioned`] aggregate, written only with
    /// [`Tx::save`]. Set it together with implementing [`Versioned`].
    const VERSIONED: bool = false;
    /// Whether the record derives index entries or artifact references
    /// ([`Record::derive`]); every write then keeps them in step.
    const DERIVES: bool = false;
    /// The index entries and artifact references of this state (see
    /// `derived.rs`). Only read when [`Record::DERIVES`] is set.
    fn derive(&self, derived: &mut Derived) {
        let _ = derived;
    }
}

/// An aggregate that more than one path writes (an actor, a worker, run
/// control, an operator's command). Its value carries the version of the
/// stored state it was derived from; 0 for one never stored. [`Tx::save`]
/// writes it only over exactly that version and numbers the new state,
/// so no writer can replace a newer state with one derived from an older.
pub trait Versioned: Record {
    /// What the successor rules read of a stored state, with its version:
    /// decoded from the stored bytes alone, the rest of the record skipped,
    /// so that checking a write costs little on the writer thread.
    type Stored: DeserializeOwned + StoredVersion;
    /// The stored version this value was derived from (0: new).
    fn version(&self) -> u64;
    /// Sets the version; only [`Tx::save`] calls it.
    fn set_version(&mut self, version: u64);
    /// The rules that hold between a stored state and any state written
    /// over it, whoever writes it (the domain's invariants: what has ended
    /// stays ended, what is monotonic never goes back). A violation names
    /// the rule; the write is refused.
    fn check_successor(stored: &Self::Stored, next: &Self) -> Result<(), String>;
}

/// The version of a stored aggregate, as its [`Versioned::Stored`] part
/// carries it.
pub trait StoredVersion {
    /// The stored version.
    fn version(&self) -> u64;
}

/// The stored part of an aggregate without successor rules: its version.
#[derive(Debug, serde::Deserialize)]
pub struct VersionOnly {
    /// The stored version.
    #[serde(default = "crate::domain::stored_before_versions")]
    pub version: u64,
}

impl StoredVersion for VersionOnly {
    fn version(&self) -> u64 {
        self.version
    }
}

/// Implements [`Versioned`] for a record whose stored version is the `u64`
/// field `$field`, with `$stored` the part of it its successor rules read
/// (a domain type with the same version field and a
/// `check_successor(&self, &Record) -> Result<(), String>`, written in the
/// domain, where the rule is decided); without `$stored`, a record with no
/// rule but the version.
#[macro_export]
macro_rules! versioned {
    ($record:ty, $field:ident, $stored:ty) => {
        impl $crate::store::Versioned for $record {
            type Stored = $stored;
            fn version(&self) -> u64 {
                self.$field
            }
            fn set_version(&mut self, version: u64) {
                self.$field = version;
            }
            fn check_successor(stored: &$stored, next: &Self) -> Result<(), String> {
                stored.check_successor(next)
            }
        }
        impl $crate::store::StoredVersion for $stored {
            fn version(&self) -> u64 {
                self.$field
            }
        }
    };
    ($record:ty, $field:ident) => {
        impl $crate::store::Versioned for $record {
            type Stored = $crate::store::VersionOnly;
            fn version(&self) -> u64 {
                self.$field
            }
            fn set_version(&mut self, version: u64) {
                self.$field = version;
            }
            fn check_successor(_: &$crate::store::VersionOnly, _: &Self) -> Result<(), String> {
                Ok(())
            }
        }
    };
}

/// The first key after every key that starts with `prefix`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    vec![u8::MAX; prefix.len() + 1]
}

pub(crate) fn tenant_prefix(tenant: &TenantId) -> Vec<u8> {
    let mut key = Vec::with_capacity(tenant.as_str().len() + 1);
    key.extend_from_slice(tenant.as_str().as_bytes());
    key.push(b'/');
    key
}

pub(crate) fn record_key(tenant: &TenantId, id: &str) -> Vec<u8> {
    let mut key = tenant_prefix(tenant);
    key.extend_from_slice(id.as_bytes());
    key
}

pub(crate) fn index_prefix(tenant: &TenantId, index: &str, value: &str) -> Vec<u8> {
    let mut key = tenant_prefix(tenant);
    key.extend_from_slice(index.as_bytes());
    key.push(b'/');
    key.extend_from_slice(value.as_bytes());
    key.push(b'/');
    key
}

/// Encodes a record as `[u16 version][msgpack named]`.
pub(crate) fn encode<R: Record>(record: &R) -> Result<Vec<u8>, StoreError> {
    let mut out = R::VERSION.to_be_bytes().to_vec();
    rmp_serde::encode::write_named(&mut out, record).map_err(|e| StoreError::Corrupt {
        table: R::TABLE.name(),
        key: record.id(),
        reason: format!("cannot encode: {e}"),
    })?;
    if out.len() > MAX_RECORD_BYTES {
        return Err(StoreError::TooLarge {
            table: R::TABLE.name(),
            size: out.len(),
            max: MAX_RECORD_BYTES,
        });
    }
    Ok(out)
}

/// Decodes a stored record, upgrading older versions.
pub(crate) fn decode<R: Record>(key: &[u8], bytes: &[u8]) -> Result<R, StoreError> {
    let key_text = || String::from_utf8_lossy(key).into_owned();
    if bytes.len() < 2 {
        return Err(StoreError::Corrupt {
            table: R::TABLE.name(),
            key: key_text(),
            reason: "value shorter than its version header".into(),
        });
    }
    let version = u16::from_be_bytes([bytes[0], bytes[1]]);
    let body = &bytes[2..];
    if version == R::VERSION {
        rmp_serde::from_slice(body).map_err(|e| StoreError::Corrupt {
            table: R::TABLE.name(),
            key: key_text(),
            reason: e.to_string(),
        })
    } else if version > R::VERSION {
        Err(StoreError::NewerRecord {
            table: R::TABLE.name(),
            key: key_text(),
            version,
            supported: R::VERSION,
        })
    } else {
        R::upgrade(version, body).map_err(|reason| StoreError::Corrupt {
            table: R::TABLE.name(),
            key: key_text(),
            reason,
        })
    }
}

/// Decodes the projection `P` of a record of table `R`.
pub(crate) fn project<R: Record + Serialize, P: DeserializeOwned>(
    key: &[u8],
    bytes: &[u8],
) -> Result<P, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        table: R::TABLE.name(),
        key: String::from_utf8_lossy(key).into_owned(),
        reason,
    };
    if bytes.len() >= 2 && u16::from_be_bytes([bytes[0], bytes[1]]) == R::VERSION {
        return rmp_serde::from_slice(&bytes[2..]).map_err(|e| corrupt(e.to_string()));
    }
    let whole = decode::<R>(key, bytes)?;
    let body = rmp_serde::to_vec_named(&whole).map_err(|e| corrupt(e.to_string()))?;
    rmp_serde::from_slice(&body).map_err(|e| corrupt(e.to_string()))
}
