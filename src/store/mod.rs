//! The store: a small typed facade over sled.
//!
//! # Layout
//!
//! - One sled tree per table of the specifications ([`Table`]), plus `meta`
//!   (format marker, schema version, signing keys), `outbox` (events by
//!   sequence) and `index` (secondary keys).
//! - Record keys are `<tenant>/<id>`: the tenant comes first, and every read
//!   and write takes a [`TenantScope`], so code that has not established
//!   whose data it touches cannot be written. Index keys are
//!   `<tenant>/<index>/<value>/<id>`. The outbox is the one log kept in
//!   global order (key: sequence), filtered by tenant when read.
//! - Values are `[u16 version][msgpack with named fields]`: fields can be
//!   added with `#[serde(default)]` and no migration; a changed shape bumps
//!   [`Record::VERSION`] and implements [`Record::upgrade`].
//!
//! # Writes and durability
//!
//! Every write is a [`Tx`] closure handed to [`Store::transact`]. One writer
//! thread runs the closures in one global order and applies each group of
//! them that queued up together to sled atomically, across its trees, so an
//! aggregate, its indexes and its outbox events commit together: a redo
//! record (and, for large new values, an undo record) first, then plain
//! inserts, with readers held off while they are made (`redo.rs`). One
//! flusher thread then flushes sled and `fdatasync`s its data file once per
//! batch of groups, and only then answers the writers: concurrent writers
//! share the cost of the sync (group commit), and a reply always means "on
//! disk". sled's own `flush_async` is never used (it deadlocks with many
//! concurrent callers in 0.34). See `commit.rs` for the measurements behind
//! this shape.
//!
//! # What readers and writers can rely on
//!
//! - **Inside a transaction** reads are linearizable: a [`Tx`] runs on the
//!   writer thread and reads through every write ordered before it, applied
//!   to sled or still queued in the group. A read-modify-write inside one
//!   closure can never lose an update.
//! - **Outside a transaction** ([`Store::get`], lists, scans) a read sees
//!   every write acknowledged before the read began: the writer applies a
//!   group to sled before the flusher syncs it, and the reply goes out only
//!   after the sync. It never sees part of a transaction. It may also see a
//!   write whose sync is still under way, and it does not see writes still
//!   queued in the writer. [`Store::get_latest`] reads through the writer
//!   instead, and returns once everything ordered before it is durable.
//! - **A value read outside a transaction is a snapshot**, stale as soon as
//!   it is read. An aggregate that more than one path writes (attempts,
//!   runs, capacity leases, pools) is [`Versioned`]: it carries the version
//!   of the stored state it was derived from, and [`Tx::save`] refuses a
//!   write whose version is not the stored one ([`StoreError::Stale`],
//!   counted in `agentbay_store_stale_writes_total` and logged), and one
//!   that breaks a rule every successor must keep
//!   ([`Versioned::check_successor`]: an ended attempt stays ended, a
//!   fencing token never goes back). So a writer holding an old copy fails
//!   loudly and must read again; it can never replace a newer acknowledged
//!   state with an older one. Versioned records cannot be written with
//!   [`Tx::put`] at all: the compiler refuses it.

pub mod artifacts;
mod backup;
mod commit;
pub mod datadir;
mod derived;
mod engine;
mod kv;
pub mod migrate;
mod outbox;
mod postgres;
mod redo;
pub mod scheduled;
mod schema;
pub mod trail;
mod tx;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;

use crate::domain::TenantId;
use crate::domain::access::{PlatformScope, TenantScope};
use crate::domain::events::{EventFilter, StoredEvent};

pub use backup::{BackupSummary, restore_into, restore_to};
pub use datadir::DataDir;
pub use derived::{Derived, time_value};
pub use postgres::PgOptions;
pub use schema::SCHEMA_VERSION;
pub use tx::Tx;

use commit::Committer;

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
        }
    }

    fn position(self) -> usize {
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

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The storage engine failed (its own words): nothing above the store
    /// sees the engine's types.
    #[error("store engine error: {0}")]
    Engine(String),
    /// A file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A stored value could not be read.
    #[error("record {key:?} in {table} cannot be read: {reason}")]
    Corrupt {
        /// Tree name.
        table: &'static str,
        /// Key as text.
        key: String,
        /// Why.
        reason: String,
    },
    /// A stored value was written by a newer agentbay.
    #[error(
        "record {key:?} in {table} has version {version}, newer than this binary understands ({supported}); upgrade agentbay"
    )]
    NewerRecord {
        /// Tree name.
        table: &'static str,
        /// Key as text.
        key: String,
        /// Stored version.
        version: u16,
        /// Highest version this binary reads.
        supported: u16,
    },
    /// A value is over the size the store accepts in a record.
    #[error(
        "{table} record of {size} bytes exceeds the {max}-byte limit; large content belongs in the artifact store"
    )]
    TooLarge {
        /// Tree name.
        table: &'static str,
        /// Encoded size.
        size: usize,
        /// Limit.
        max: usize,
    },
    /// A write was attempted under another tenant's scope.
    #[error("record of tenant {record} written under the scope of tenant {scope}")]
    TenantMismatch {
        /// The record's tenant.
        record: TenantId,
        /// The scope's tenant.
        scope: TenantId,
    },
    /// The directory is not an agentbay store.
    #[error("{path} is not an agentbay data directory: {reason}")]
    NotAStore {
        /// The path given.
        path: PathBuf,
        /// What was found instead.
        reason: String,
    },
    /// The store was written by a newer agentbay.
    #[error(
        "the store in {path} has schema version {found}, but this agentbay understands up to {supported}; run a newer agentbay or restore a backup made by this version"
    )]
    NewerSchema {
        /// Store path.
        path: PathBuf,
        /// Version found.
        found: u32,
        /// Highest version this binary runs.
        supported: u32,
    },
    /// Another process holds the data directory.
    #[error("the data directory {path} is already in use by {holder}")]
    InUse {
        /// The data directory.
        path: PathBuf,
        /// Who holds it, as far as known.
        holder: String,
    },
    /// A write of a versioned aggregate was derived from another version
    /// than the stored one: someone else wrote it since.
    #[error(
        "{table} record {key} changed concurrently: this write was derived from {expected}, but the stored record is at {found}; read it again and retry"
    )]
    Stale {
        /// Tree name.
        table: &'static str,
        /// Key as text.
        key: String,
        /// The version the write was derived from, in words.
        expected: String,
        /// The stored version, in words.
        found: String,
    },
    /// A write of a versioned aggregate breaks a rule every successor of
    /// the stored state keeps.
    #[error("{table} record {key}: {rule}; the write was refused")]
    Invariant {
        /// Tree name.
        table: &'static str,
        /// Key as text.
        key: String,
        /// The rule, in words.
        rule: String,
    },
    /// The store was closed or its writer stopped.
    #[error("the store is closed")]
    Closed,
    /// Durability could not be confirmed; the write may not be on disk.
    #[error("flushing the store to disk failed: {0}")]
    FlushFailed(String),
    /// A backup file is unusable.
    #[error("backup: {0}")]
    Backup(String),
    /// Another appliance holds the shared store: this one stands by.
    #[error("another appliance ({} at {}, epoch {}) is active on this PostgreSQL store; this one stands by", active.node, active.url, active.epoch)]
    Standby {
        /// The active appliance.
        active: Box<crate::domain::cluster::Node>,
    },
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Engine(e.to_string())
    }
}

impl StoreError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StoreError {
        let context = context.into();
        move |source| StoreError::Io { context, source }
    }
}

/// Largest encoded record. sled writes bigger values to separate blob files
/// that its flush does not sync, so the store refuses them outright; prompts,
/// responses and other payloads go to the artifact store.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

/// Tuning of the store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// sled page cache, in bytes.
    pub cache_bytes: u64,
    /// Reopen the database after this many bytes of records were written,
    /// so that sled writes a fresh page-table snapshot and a restart
    /// replays little (0: never). See [`engine`].
    pub snapshot_every_bytes: u64,
    /// `fdatasync` the data file after each flush (on by default). Off only
    /// for the benchmark's comparison rows.
    pub sync_data: bool,
    /// Where a store that another agentbay version wrote is backed up
    /// before this one changes anything in it (see
    /// [`backup::before_upgrade`]); unset: no such backup (tests, tools).
    pub upgrade_backup_dir: Option<PathBuf>,
    /// Where the store is kept.
    pub backend: Backend,
}

/// Where the store is kept.
#[derive(Clone, Debug, Default)]
pub enum Backend {
    /// sled, in the data directory: the embedded default.
    #[default]
    Sled,
    /// A PostgreSQL database that appliances share, one active at a time.
    Postgres(PgOptions),
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            cache_bytes: 32 * 1024 * 1024,
            snapshot_every_bytes: 32 * 1024 * 1024,
            sync_data: true,
            upgrade_backup_dir: None,
            backend: Backend::Sled,
        }
    }
}

/// The store. Cheap to clone; all clones share one writer.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Arc<dyn kv::KvEngine>,
    committer: Committer,
    events: broadcast::Sender<Arc<StoredEvent>>,
    path: PathBuf,
    schema_version: u32,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

/// How every sled database of agentbay is opened: the store, a backup being
/// restored, a compaction's copy.
///
/// - A new database is written uncompressed. sled 0.34 compresses every
///   page fragment it logs with a zstd context made for that one call, and
///   making one costs two `cpuid` instructions, which trap in a virtual
///   machine: compressed, the store spent a quarter of its writer's time
///   there and lease pairs ran at half the rate. sled fixes the choice when
///   the database is created, so a database written compressed by an earlier
///   version keeps its format (read from its `conf`) until `agentbay compact`
///   or a restore rewrites it, uncompressed.
/// - sled's own flusher runs once a second. Its syncs are redundant with
///   the store's flusher, but it is also the thread that rewrites the live
///   pages of half-empty segments so that their space is used again; with
///   it off, disk grew without bound.
pub fn open_sled(path: &Path, cache_bytes: Option<u64>) -> Result<sled::Db, StoreError> {
    let conf = path.join("conf");
    // sled's `conf` is text lines followed by a binary checksum.
    let compressed = match std::fs::read(&conf) {
        Ok(bytes) => bytes
            .split(|b| *b == b'\n')
            .any(|line| line == b"use_compression: true"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(StoreError::io(format!("reading {}", conf.display()))(e)),
    };
    let mut config = sled::Config::new()
        .path(path)
        .use_compression(compressed)
        .compression_factor(1)
        .flush_every_ms(Some(1000));
    if let Some(bytes) = cache_bytes {
        config = config.cache_capacity(bytes);
    }
    // A handle dropped a moment ago in this process may still hold sled's
    // file lock: its flusher thread and deferred frees release it shortly
    // after the drop returns (sled issues 1234, 1289). Every caller holds
    // the data directory's lock or works in a directory of its own, so a
    // held sled lock can only be such a closing handle: wait for it, for a
    // bounded time.
    let deadline = std::time::Instant::now() + SLED_LOCK_WAIT;
    loop {
        match config.open() {
            // sled 0.34 reports it as `ErrorKind::Other` with this text.
            Err(sled::Error::Io(e))
                if e.to_string().starts_with("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return Ok(other?),
        }
    }
}

/// How long [`open_sled`] waits for a closing handle's lock.
const SLED_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Opens a database just written in bulk (a restore, a compaction) once
/// more and closes it. sled writes the snapshot of its page table while it
/// opens; without it, the first start would read the whole log (measured:
/// 1.0-1.6 s instead of 0.3-0.4 s for a 37 MiB store).
pub(crate) fn snapshot_rewritten(path: &Path) -> Result<(), StoreError> {
    let db = open_sled(path, None)?;
    db.flush()?;
    Ok(())
}

impl Store {
    /// Opens (or creates) the store, checks its format and schema
    /// version, migrates it forward and starts the writer and flusher
    /// threads: the sled store at `path`, or the PostgreSQL one of
    /// [`StoreOptions::backend`]. The caller must hold the data directory
    /// lock.
    pub fn open(path: &Path, options: &StoreOptions) -> Result<Store, StoreError> {
        match &options.backend {
            Backend::Sled => Store::open_sled(path, options),
            Backend::Postgres(pg) => Store::open_postgres(path, pg),
        }
    }

    fn open_sled(path: &Path, options: &StoreOptions) -> Result<Store, StoreError> {
        let fresh = !path.join("conf").exists();
        if !fresh && !path.join("db").exists() {
            return Err(StoreError::NotAStore {
                path: path.to_path_buf(),
                reason: "it has a sled configuration but no data file".into(),
            });
        }
        // Backed up as the earlier version left it, byte for byte: even a
        // group of writes a crash cut short is completed only afterwards.
        let open = engine::Open::as_found(path, options.cache_bytes)?;
        if !fresh && let Some(dir) = &options.upgrade_backup_dir {
            backup::before_upgrade(&open, path, dir)?;
        }
        let open = open.complete_last_group()?;
        let schema_version = schema::prepare(&open, path, fresh, schema::MIGRATIONS)?;
        schema::record_writer(&open)?;
        let engine: Arc<dyn kv::KvEngine> = Arc::new(engine::SledEngine::new(
            open,
            path,
            options.cache_bytes,
            options.sync_data,
            options.snapshot_every_bytes,
        )?);
        Store::start(engine, path, schema_version)
    }

    fn open_postgres(path: &Path, pg: &PgOptions) -> Result<Store, StoreError> {
        let engine = postgres::PgEngine::open(pg.clone())?;
        let fresh = engine.is_empty()?;
        let place = PathBuf::from(format!("PostgreSQL ({})", pg.describe()));
        let schema_version = schema::prepare(&engine, &place, fresh, schema::MIGRATIONS)?;
        schema::record_writer(&engine)?;
        Store::start(Arc::new(engine), path, schema_version)
    }

    /// Starts the writer and the flusher on an engine whose store is at
    /// this binary's schema.
    fn start(
        engine: Arc<dyn kv::KvEngine>,
        path: &Path,
        schema_version: u32,
    ) -> Result<Store, StoreError> {
        let next_seq = outbox::next_sequence(engine.reader())?;
        let trail = trail::Head::read(engine.reader())?;
        let (events, _) = broadcast::channel(4096);
        let committer = Committer::start(
            engine.clone(),
            commit::CommitOptions { next_seq, trail },
            events.clone(),
        )?;
        Ok(Store {
            inner: Arc::new(Inner {
                engine,
                committer,
                events,
                path: path.to_path_buf(),
                schema_version,
            }),
        })
    }

    /// The schema version the store runs at.
    pub fn schema_version(&self) -> u32 {
        self.inner.schema_version
    }

    /// The directory of the sled files.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// A table, read while no reopen runs (see [`engine`]), each read
    /// seeing groups of writes whole.
    fn tree(&self, table: Table) -> Result<kv::Reading<'_>, StoreError> {
        Ok(kv::Reading::new(self.inner.engine.reader(), table))
    }

    /// Writes a raw value past every check, for tests that damage what is
    /// stored.
    #[cfg(test)]
    fn damage(&self, table: Table, key: &[u8], value: Option<&[u8]>) {
        self.inner.engine.damage(table, key, value).unwrap();
    }

    /// Queues `f` now and returns a future that resolves once it is durable.
    /// Unlike [`Store::transact`], the write's place in the global order is
    /// fixed when this returns, not when the future is first polled: an
    /// actor can queue a write and move on to its next message.
    pub fn submit<R, E, F>(
        &self,
        f: F,
    ) -> impl std::future::Future<Output = Result<R, E>> + Send + 'static
    where
        F: FnOnce(&mut Tx<'_>) -> Result<R, E> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let queued = self.inner.committer.submit(f);
        async move {
            match queued {
                Ok(rx) => rx.await.map_err(|_| E::from(StoreError::Closed))?,
                Err(e) => Err(E::from(e)),
            }
        }
    }

    /// Queues `f` now, as [`Store::submit`] does, and calls `done` with its
    /// result once it is durable, without a task to wait for it: `done`
    /// runs on the store's flusher thread and must only hand the result
    /// on (send a reply). For actors that answer many callers per write.
    pub fn submit_then<R, E, F, D>(&self, f: F, done: D)
    where
        F: FnOnce(&mut Tx<'_>) -> Result<R, E> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
        D: FnOnce(Result<R, E>) + Send + 'static,
    {
        // A store already closed drops the job, whose answer then says so.
        let _ = self.inner.committer.submit_then(f, done);
    }

    /// Runs `f` as one atomic transaction and returns once its effects are
    /// durably on disk. `f` runs exactly once, on the store's writer thread:
    /// it must be quick and must not block.
    pub async fn transact<R, E, F>(&self, f: F) -> Result<R, E>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<R, E> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        self.submit(f).await
    }

    /// [`Store::transact`] for callers outside the async runtime (offline
    /// administrative commands, benchmarks' baselines).
    pub fn transact_blocking<R, E, F>(&self, f: F) -> Result<R, E>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<R, E> + Send + 'static,
        R: Send + 'static,
        E: From<StoreError> + Send + 'static,
    {
        let rx = self.inner.committer.submit(f)?;
        rx.blocking_recv()
            .map_err(|_| E::from(StoreError::Closed))?
    }

    /// Reads one record through the writer: the newest version, with every
    /// write ordered before this call (acknowledged or still queued)
    /// applied, returned once those writes are durable. For a writer that
    /// found its copy stale and must start again from the current state.
    pub async fn get_latest<R: Record>(
        &self,
        scope: &TenantScope,
        id: &str,
    ) -> Result<Option<R>, StoreError> {
        let (scope, id) = (scope.clone(), id.to_string());
        self.transact(move |tx: &mut Tx| tx.get::<R>(&scope, &id))
            .await
    }

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
        if let Some(broken) = self.verify_audit()?.broken {
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
    pub fn verify_audit(&self) -> Result<crate::domain::audit::TrailReport, StoreError> {
        trail::verify(&self.tree(Table::Audit)?, &self.tree(Table::Meta)?)
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

    /// The sequence of the last durable event (0 when there is none): a
    /// reader that has seen every event it may see up to here has caught
    /// up. Events become visible to [`Store::events_after`] no later than
    /// they count here.
    pub fn events_head(&self) -> u64 {
        self.inner.committer.head()
    }

    /// Live events as they become durable.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<StoredEvent>> {
        self.inner.events.subscribe()
    }

    /// Whether the writer and flusher threads are alive, the last flush
    /// succeeded and the engine takes writes (on PostgreSQL: this
    /// appliance still holds the store).
    pub fn healthy(&self) -> Result<(), String> {
        self.inner.committer.health()?;
        self.inner.engine.health()
    }

    /// The appliance holding the store with its epoch, when appliances
    /// share it (PostgreSQL); `None` on sled.
    pub fn leadership(&self) -> Option<crate::domain::cluster::Node> {
        self.inner.engine.leadership()
    }

    /// Counters of the group commit, for metrics and benchmarks.
    pub fn commit_stats(&self) -> commit::CommitStats {
        self.inner.committer.stats()
    }

    /// Bytes the store occupies on disk.
    pub fn size_on_disk(&self) -> Result<u64, StoreError> {
        self.inner.engine.size_on_disk()
    }

    /// Bytes of every key and value the store holds: its logical size, to
    /// compare with [`Store::size_on_disk`]. Reads everything.
    pub fn logical_bytes(&self) -> Result<u64, StoreError> {
        let mut total = 0u64;
        for table in Table::ALL {
            for item in self.tree(*table)?.iter() {
                let (k, v) = item?;
                total += (k.len() + v.len()) as u64;
            }
        }
        Ok(total)
    }

    /// Number of records in each table.
    pub fn table_sizes(&self) -> BTreeMap<&'static str, usize> {
        Table::ALL
            .iter()
            .map(|t| (t.name(), self.tree(*t).map_or(0, |tree| tree.len())))
            .collect()
    }

    /// Stops the writer after the writes already submitted, flushes and
    /// syncs. Later writes fail with [`StoreError::Closed`].
    pub fn close(&self) -> Result<(), StoreError> {
        let stopped = self.inner.committer.stop();
        if stopped.is_ok() {
            self.inner.engine.release();
        }
        stopped
    }
}

/// The first key after every key that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
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

#[cfg(test)]
mod tests;
