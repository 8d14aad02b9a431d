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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{MappedRwLockReadGuard, RwLock, RwLockReadGuard};

use super::{StoreError, Table, open_sled};

/// Longest the writer waits for the reads in progress before it leaves
/// the reopen for a later group.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// The database and one handle per table.
pub(super) struct Open {
    pub db: sled::Db,
    pub trees: Arc<[sled::Tree]>,
}

impl Open {
    /// Opens the database at `path` and every table.
    pub fn at(path: &Path, cache_bytes: u64) -> Result<Open, StoreError> {
        let db = open_sled(path, Some(cache_bytes))?;
        let trees: Arc<[sled::Tree]> = Table::ALL
            .iter()
            .map(|t| db.open_tree(t.name()))
            .collect::<Result<Vec<_>, _>>()?
            .into();
        Ok(Open { db, trees })
    }
}

/// The open database, shared by the store's readers, its writer and its
/// flusher. Empty only when a reopen failed (the store is then unhealthy).
#[derive(Clone)]
pub(super) struct Engine {
    open: Arc<RwLock<Option<Open>>>,
    path: PathBuf,
    cache_bytes: u64,
}

/// A read of the open database; a reopen waits until it is dropped.
pub(super) type OpenRef<'a> = MappedRwLockReadGuard<'a, Open>;

impl Engine {
    pub fn new(open: Open, path: &Path, cache_bytes: u64) -> Engine {
        Engine {
            open: Arc::new(RwLock::new(Some(open))),
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
