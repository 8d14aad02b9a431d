//! The open sled database, and reopening it while the appliance runs.
//!
//! sled 0.34 writes the snapshot of its page table only while it opens a
//! database. On the next open it reads that snapshot and replays the log
//! written after it, so a store that served for months without a restart
//! replays all of its log on the next start (measured: 4.1 s to `/readyz`
//! after 400 simulated days in one process, 0.14 s on the start after).
//!
//! So the writer thread reopens the database itself once
//! `store.snapshot_every_mb` of records were written since it was last
//! opened: between two groups, after the flusher has made every earlier
//! group durable, it takes the engine's write lock (waiting for the reads
//! in progress, never for longer than [`LOCK_WAIT`]), closes the database
//! and opens it again, which writes a fresh snapshot. Writes queue
//! meanwhile, and reads wait; the pause is the replay of what was written
//! since the last snapshot, which the threshold bounds. A crash at any
//! moment of it leaves the files as sled wrote them: an open is the same
//! recovery a start does.

use std::fs::File;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{MappedRwLockReadGuard, RwLock, RwLockReadGuard};

use super::kv::{KvBulk, KvEngine, KvRead, Pair, Rows};
use super::tx::Writes;
use super::{StoreError, Table, redo, schema};

/// Longest the writer waits for the reads in progress before it leaves
/// the reopen for a later group.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// The database and one handle per table.
pub(super) struct Open {
    pub db: sled::Db,
    pub trees: Arc<[sled::Tree]>,
}

impl Open {
    /// Opens the database at `path` and every table, and completes the
    /// last group of writes if a crash cut it short (see `redo.rs`).
    pub fn at(path: &Path, cache_bytes: u64) -> Result<Open, StoreError> {
        Open::as_found(path, cache_bytes)?.complete_last_group()
    }

    /// Opens the database at `path` and every table, as the last process
    /// left it (a group a crash cut short still unfinished).
    pub fn as_found(path: &Path, cache_bytes: u64) -> Result<Open, StoreError> {
        let db = open_sled(path, Some(cache_bytes))?;
        let trees: Arc<[sled::Tree]> = Table::ALL
            .iter()
            .map(|t| db.open_tree(t.name()))
            .collect::<Result<Vec<_>, _>>()?
            .into();
        Ok(Open { db, trees })
    }

    /// Completes the last group of writes if a crash cut it short (see
    /// `redo.rs`), unless the store is of a newer schema.
    pub fn complete_last_group(self) -> Result<Open, StoreError> {
        let trees = &self.trees;
        let meta = &trees[Table::Meta.position()];
        let replayed = if schema::is_newer(&self)? {
            0
        } else {
            redo::replay(trees, meta)?
        };
        if replayed > 0 {
            tracing::info!(
                writes = replayed,
                "store: completed the last group of writes, which the previous run left unfinished"
            );
        }
        Ok(self)
    }

    fn tree(&self, table: Table) -> &sled::Tree {
        &self.trees[table.position()]
    }
}

fn owned(b: Bound<&[u8]>) -> Bound<Vec<u8>> {
    b.map(<[u8]>::to_vec)
}

fn pair(item: sled::Result<(sled::IVec, sled::IVec)>) -> Result<Pair, StoreError> {
    let (k, v) = item?;
    Ok((k.to_vec(), v.to_vec()))
}

/// The database as it is, for the one who opened it: before the writer
/// starts, or a copy nobody else reads.
impl KvRead for Open {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.tree(table).get(key)?.map(|v| v.to_vec()))
    }

    fn range(&self, table: Table, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Rows<'_> {
        Box::new(self.tree(table).range((owned(start), owned(end))).map(pair))
    }
}

impl KvBulk for Open {
    fn put(&self, table: Table, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.tree(table).insert(key, value)?;
        Ok(())
    }

    fn remove(&self, table: Table, key: &[u8]) -> Result<(), StoreError> {
        self.tree(table).remove(key)?;
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }
}

/// The open database, shared by the store's readers, its writer and its
/// flusher. Empty only when a reopen failed (the store is then unhealthy).
pub(super) struct SledEngine {
    open: RwLock<Option<Open>>,
    /// Held exclusively while a group's writes are applied, and shared by
    /// each read: a reader sees a group whole or not at all.
    whole: RwLock<()>,
    path: PathBuf,
    cache_bytes: u64,
    /// sled's data file, synced after each flush when `sync_data`.
    file: File,
    sync_data: bool,
    /// Bytes of records written since the database was last opened.
    written: AtomicU64,
    /// Reopen the database after this many (0: never).
    snapshot_every: u64,
}

/// A read of the open database; a reopen waits until it is dropped.
type OpenRef<'a> = MappedRwLockReadGuard<'a, Open>;

impl SledEngine {
    pub fn new(
        open: Open,
        path: &Path,
        cache_bytes: u64,
        sync_data: bool,
        snapshot_every: u64,
    ) -> Result<SledEngine, StoreError> {
        let data_file = path.join("db");
        // Opened for writing because Windows' FlushFileBuffers needs it;
        // nothing is written through this handle.
        let file = File::options()
            .read(true)
            .write(true)
            .open(&data_file)
            .map_err(StoreError::io(format!("opening {}", data_file.display())))?;
        Ok(SledEngine {
            open: RwLock::new(Some(open)),
            whole: RwLock::new(()),
            path: path.to_path_buf(),
            cache_bytes,
            file,
            sync_data,
            written: AtomicU64::new(0),
            snapshot_every,
        })
    }

    /// The open database. Recursive: a reader may read again while it
    /// holds a read, even while the writer waits to reopen.
    pub fn read(&self) -> Result<OpenRef<'_>, StoreError> {
        RwLockReadGuard::try_map(self.open.read_recursive(), |o| o.as_ref())
            .map_err(|_| StoreError::FlushFailed("the store could not be reopened".into()))
    }

    /// Closes the database and opens it again, so that sled writes a fresh
    /// snapshot of its page table. `Ok(None)`: reads kept the lock for
    /// [`LOCK_WAIT`]; nothing changed. `Ok(Some(elapsed))`: reopened.
    fn reopen(&self) -> Result<Option<Duration>, StoreError> {
        let Some(mut guard) = self.open.try_write_for(LOCK_WAIT) else {
            return Ok(None);
        };
        let started = Instant::now();
        if let Some(old) = guard.take() {
            old.db.flush()?;
        }
        // Dropped with the old handles: sled releases its file lock a
        // moment later, which `open_sled` waits for.
        match Open::at(&self.path, self.cache_bytes) {
            Ok(open) => {
                *guard = Some(open);
                Ok(Some(started.elapsed()))
            }
            Err(first) => {
                tracing::warn!(error = %first, "reopening the store failed; trying once more");
                std::thread::sleep(Duration::from_secs(1));
                let open = Open::at(&self.path, self.cache_bytes)?;
                *guard = Some(open);
                Ok(Some(started.elapsed()))
            }
        }
    }
}

impl KvRead for SledEngine {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let open = self.read()?;
        let _whole = self.whole.read();
        open.get(table, key)
    }

    fn range(&self, table: Table, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Rows<'_> {
        let open = match self.read() {
            Ok(open) => open,
            Err(e) => return Box::new(std::iter::once(Err(e))),
        };
        let inner = open.tree(table).range((owned(start), owned(end)));
        Box::new(Whole {
            _open: open,
            inner,
            whole: &self.whole,
        })
    }
}

impl KvEngine for SledEngine {
    fn reader(&self) -> &dyn KvRead {
        self
    }

    fn visible_when_durable(&self) -> bool {
        false
    }

    /// Applies the group atomically (see `redo.rs`), while no reader
    /// reads.
    fn apply(&self, number: u64, writes: Writes) -> Result<Option<Arc<Writes>>, StoreError> {
        // `written` counts records only, as `store.snapshot_every_mb` says.
        let bytes = writes
            .iter()
            .map(|(_, key, value)| (key.len() + value.as_ref().map_or(0, |v| v.len())) as u64)
            .sum::<u64>();
        self.written.fetch_add(bytes, Ordering::Relaxed);
        let open = self.read()?;
        redo::apply(&open.trees, Table::Meta.position(), number, writes, || {
            self.whole.write()
        })?;
        Ok(None)
    }

    /// Flushes sled and syncs its data file.
    fn make_durable(&self, _pending: &[Arc<Writes>]) -> Result<(), StoreError> {
        self.read()?.db.flush()?;
        if self.sync_data {
            self.file
                .sync_data()
                .map_err(StoreError::io("syncing the store data file"))?;
        }
        Ok(())
    }

    fn maintenance_due(&self) -> bool {
        self.snapshot_every > 0 && self.written.load(Ordering::Relaxed) >= self.snapshot_every
    }

    /// Reopens the database once `store.snapshot_every_mb` of records
    /// were written since it was last opened (see the module's words).
    fn between_groups(&self) -> Result<Option<Duration>, StoreError> {
        if !self.maintenance_due() {
            return Ok(None);
        }
        let written = self.written.load(Ordering::Relaxed);
        match self.reopen()? {
            Some(took) => {
                self.written.store(0, Ordering::Relaxed);
                tracing::info!(
                    written_mib = written / (1024 * 1024),
                    took_ms = took.as_millis() as u64,
                    "store reopened: sled wrote a fresh snapshot of its page table, so that a restart replays little"
                );
                Ok(Some(took))
            }
            None => {
                // Busy readers: try again after an eighth more.
                self.written.store(
                    self.snapshot_every - self.snapshot_every / 8,
                    Ordering::Relaxed,
                );
                tracing::debug!("store reopen put off: reads held the store");
                Ok(None)
            }
        }
    }

    fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.read()?.db.size_on_disk()?)
    }

    #[cfg(test)]
    fn damage(&self, table: Table, key: &[u8], value: Option<&[u8]>) -> Result<(), StoreError> {
        let open = self.read()?;
        match value {
            Some(v) => open.put(table, key, v),
            None => open.remove(table, key),
        }
    }
}

/// A scan of the running database, each step seeing groups whole.
struct Whole<'a> {
    _open: OpenRef<'a>,
    inner: sled::Iter,
    whole: &'a RwLock<()>,
}

impl Iterator for Whole<'_> {
    type Item = Result<Pair, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        let _whole = self.whole.read();
        self.inner.next().map(pair)
    }
}

impl DoubleEndedIterator for Whole<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let _whole = self.whole.read();
        self.inner.next_back().map(pair)
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
