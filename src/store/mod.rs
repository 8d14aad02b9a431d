//! The store: a small typed facade over a key-value engine, sled in the
//! data directory (the embedded default) or PostgreSQL shared by an
//! active/standby pair of appliances ([`Backend`]).
//!
//! The engines are one interface (`kv.rs`) with two implementations
//! (`engine.rs`: sled; `postgres.rs`), and one test suite runs on both
//! (`tests.rs`). Everything above the interface is the same on both: the
//! key layout and encoding (`record.rs`), transactions (`tx.rs`), the
//! group commit (`commit.rs`), readers (`read.rs`, `history.rs`), the
//! outbox, the audit chain, artifacts, migrations and backups. Nothing
//! outside this module knows which engine it runs on.
//!
//! # Layout
//!
//! - One table per table of the specifications ([`Table`]), plus `meta`
//!   (format marker, schema version, signing keys), `outbox` (events by
//!   sequence) and `index` (secondary keys): a sled tree each, or the rows
//!   of `agentbay_kv` with that `tree` on PostgreSQL, in the same bytewise
//!   key order.
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
//! thread runs the closures in one global order and hands each group of
//! them that queued up together to the engine, so an aggregate, its
//! indexes and its outbox events commit together. sled applies a group
//! atomically across its trees: a redo record (and, for large new values,
//! an undo record) first, then plain inserts, with readers held off while
//! they are made (`redo.rs`). One flusher thread then makes every group so
//! far durable at once (sled: a flush and an `fdatasync` of its data file;
//! PostgreSQL: one transaction, fenced by the appliance's epoch), and only
//! then answers the writers: concurrent writers share the cost of the sync
//! (group commit), and a reply always means "on disk". sled's own
//! `flush_async` is never used (it deadlocks with many concurrent callers
//! in 0.34). See `commit.rs` for the measurements behind this shape.
//!
//! # What readers and writers can rely on
//!
//! - **Inside a transaction** reads are linearizable: a [`Tx`] runs on the
//!   writer thread and reads through every write ordered before it,
//!   handed to the engine, still being committed, or queued in the group.
//!   A read-modify-write inside one closure can never lose an update.
//! - **Outside a transaction** ([`Store::get`], lists, scans) a read sees
//!   every write acknowledged before the read began: sled applies a group
//!   before the flusher syncs it, PostgreSQL commits it before anyone is
//!   answered, and the reply goes out only after that. It never sees part
//!   of a transaction. On sled it may also see a write whose sync is still
//!   under way; it does not see writes still queued in the writer. [`Store::get_latest`] reads through the writer
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
mod history;
mod kv;
pub mod migrate;
mod outbox;
mod postgres;
mod read;
mod record;
mod redo;
pub mod scheduled;
mod schema;
pub mod trail;
mod tx;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::broadcast;

use crate::domain::access::TenantScope;
use crate::domain::events::StoredEvent;
use crate::domain::{DomainError, TenantId};

pub use backup::{BackupSummary, restore_into, restore_to};
pub use datadir::DataDir;
pub use derived::{Derived, time_value};
pub use engine::open_sled;
pub(crate) use engine::snapshot_rewritten;
pub use kv::Reach;
pub use postgres::{PgOptions, unix_socket};
pub use record::{Record, StoredVersion, Table, VersionOnly, Versioned};
pub(crate) use record::{
    decode, encode, index_prefix, prefix_end, project, record_key, tenant_prefix,
};
pub use schema::SCHEMA_VERSION;
pub use tx::Tx;

use commit::Committer;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The storage engine failed (its own words): nothing above the store
    /// sees the engine's types.
    #[error("store engine error: {0}")]
    Engine(String),
    /// The database behind the store did not answer (PostgreSQL
    /// restarting, failing over, out of reach): the same request may
    /// succeed a moment later. While this appliance keeps its role the
    /// store waits for it instead (see [`Reach`]); this is what is left
    /// when the wait ended without an answer.
    #[error("the store's database does not answer: {0}")]
    Unreachable(String),
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
    #[error("another appliance ({} at {}, epoch {}) is active on this PostgreSQL store; this one stands by{}", active.node, active.url, active.epoch, untrusted.as_ref().map(|u| format!(", and does not believe the leader row: {u}")).unwrap_or_default())]
    Standby {
        /// The active appliance, as the leader row names it.
        active: Box<crate::domain::cluster::Node>,
        /// Why the row is not to be believed (not signed with the pair's
        /// key), if it is not.
        untrusted: Option<crate::domain::cluster::Untrusted>,
    },
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Engine(e.to_string())
    }
}

/// What a store failure means to whoever asked: the API and the console
/// see it as the domain's error, never as the store's type.
impl From<StoreError> for DomainError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Closed | StoreError::FlushFailed(_) | StoreError::Standby { .. } => {
                DomainError::Unavailable(format!("the store cannot accept writes: {e}"))
            }
            // The database did not answer: the caller is told when to
            // come back.
            StoreError::Unreachable(_) => DomainError::Waiting(format!("{e}; retry")),
            // The engine's own failure: retry.
            StoreError::Engine(_) => {
                DomainError::Unavailable(format!("the store cannot be reached: {e}"))
            }
            StoreError::Stale { .. } => DomainError::Aborted(e.to_string()),
            StoreError::Invariant { .. } => DomainError::FailedPrecondition(e.to_string()),
            // A record grown past the store's limit by what the caller
            // sent (free text, a list): nothing was written.
            StoreError::TooLarge { .. } => {
                DomainError::TooLarge(format!("{e}; shorten the text or lists of the request"))
            }
            other => DomainError::Broken(other.to_string()),
        }
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

    /// Whether the database behind the store answers now (see [`Reach`]).
    pub fn reach(&self) -> Reach {
        self.inner.engine.reach()
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

#[cfg(test)]
mod tests;
