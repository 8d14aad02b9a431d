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

use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{MappedRwLockReadGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{StoreError, Table, open_sled, redo, schema};

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
        let replayed = if schema::is_newer(meta)? {
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
}

/// The open database, shared by the store's readers, its writer and its
/// flusher. Empty only when a reopen failed (the store is then unhealthy).
#[derive(Clone)]
pub(super) struct Engine {
    open: Arc<RwLock<Option<Open>>>,
    /// Held exclusively while a group's writes are applied, and shared by
    /// each read: a reader sees a group whole or not at all.
    whole: Arc<RwLock<()>>,
    path: PathBuf,
    cache_bytes: u64,
}

/// A read of the open database; a reopen waits until it is dropped.
pub(super) type OpenRef<'a> = MappedRwLockReadGuard<'a, Open>;

impl Engine {
    pub fn new(open: Open, path: &Path, cache_bytes: u64) -> Engine {
        Engine {
            open: Arc::new(RwLock::new(Some(open))),
            whole: Arc::new(RwLock::new(())),
            path: path.to_path_buf(),
            cache_bytes,
        }
    }

    /// The open database. Recursive: a reader may read again while it
    /// holds a read, even while the writer waits to reopen.
    pub fn read(&self) -> Result<OpenRef<'_>, StoreError> {
        RwLockReadGuard::try_map(self.open.read_recursive(), |o| o.as_ref())
            .map_err(|_| StoreError::FlushFailed("the store could not be reopened".into()))
    }

    /// A table for a reader (see [`Reading`]).
    pub fn reading(&self, table: Table) -> Result<Reading<'_>, StoreError> {
        Ok(Reading {
            tree: MappedRwLockReadGuard::map(self.read()?, |o| &o.trees[table.position()]),
            whole: &self.whole,
        })
    }

    /// Held by the writer while it applies a group: no read runs meanwhile.
    pub fn applying(&self) -> RwLockWriteGuard<'_, ()> {
        self.whole.write()
    }

    /// Closes the database and opens it again, so that sled writes a fresh
    /// snapshot of its page table. Only the writer thread calls it, with
    /// every earlier group durable. `Ok(None)`: reads kept the lock for
    /// [`LOCK_WAIT`]; nothing changed. `Ok(Some(elapsed))`: reopened.
    pub fn reopen(&self) -> Result<Option<Duration>, StoreError> {
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

/// A table as the store's readers see it: each read (a get, one step of a
/// scan) sees every group of writes whole or not at all, as a sled
/// transaction would show it.
pub(super) struct Reading<'a> {
    tree: MappedRwLockReadGuard<'a, sled::Tree>,
    whole: &'a RwLock<()>,
}

impl Reading<'_> {
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<sled::IVec>, StoreError> {
        let _whole = self.whole.read();
        Ok(self.tree.get(key)?)
    }

    pub fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Whole<'_> {
        self.steps(self.tree.range(range))
    }

    pub fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> Whole<'_> {
        self.steps(self.tree.scan_prefix(prefix))
    }

    pub fn iter(&self) -> Whole<'_> {
        self.steps(self.tree.iter())
    }

    /// Number of entries: a scan.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        let _whole = self.whole.read();
        self.tree.is_empty()
    }

    fn steps(&self, inner: sled::Iter) -> Whole<'_> {
        Whole {
            inner,
            whole: self.whole,
        }
    }
}

/// A scan of a [`Reading`], one whole view per step.
pub(super) struct Whole<'a> {
    inner: sled::Iter,
    whole: &'a RwLock<()>,
}

impl Iterator for Whole<'_> {
    type Item = sled::Result<(sled::IVec, sled::IVec)>;

    fn next(&mut self) -> Option<Self::Item> {
        let _whole = self.whole.read();
        self.inner.next()
    }
}

impl DoubleEndedIterator for Whole<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let _whole = self.whole.read();
        self.inner.next_back()
    }
}
