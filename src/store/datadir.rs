//! The data directory: the store, the TLS material and the run files, behind
//! one exclusive lock.
//!
//! ```text
//! agentbay-data/
//!   AGENTBAY-DATA     marker: this directory belongs to agentbay
//!   lock              held by the process that owns the directory (pid inside)
//!   store/            sled
//!   tls/              generated CA and server certificate (0600 keys)
//!   run/              appliance.json (where the running appliance listens)
//!                     and admin.token (the local administration token)
//!   pair.key          the key the appliances on one PostgreSQL store share
//!                     (`agentbay cluster init`; 0600, in backups)
//! ```
//!
//! Administrative commands find a running appliance through `run/` and talk
//! to it; when none runs they take the lock and open the store themselves.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::StoreError;

pub(super) const MARKER: &str = "AGENTBAY-DATA";
pub(super) const MARKER_TEXT: &str = "agentbay data directory\nformat = 1\n";
const RUNTIME_INFO: &str = "run/appliance.json";
const ADMIN_TOKEN: &str = "run/admin.token";

/// The pair key's file in the data directory. It may be the only file of a
/// directory not yet initialised: it is copied there before a second
/// appliance of a pair first starts.
pub const PAIR_KEY_FILE: &str = "pair.key";

/// Where a running appliance can be reached, as it wrote it at start.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeInfo {
    /// Process id.
    pub pid: u32,
    /// Base URL, e.g. `https://127.0.0.1:8443`.
    pub url: String,
    /// SHA-256 of the served certificate, `sha256:<hex>`.
    pub certificate_fingerprint: String,
    /// agentbay version.
    pub version: String,
    /// Start time.
    pub started_at: DateTime<Utc>,
    /// The configuration file it reads (and reads again at a reload), if
    /// any.
    #[serde(default)]
    pub config_file: Option<PathBuf>,
}

/// An open, locked data directory.
#[derive(Debug)]
pub struct DataDir {
    root: PathBuf,
    // Held for the life of the value; the OS releases it if the process dies.
    _lock: File,
}

impl DataDir {
    /// Creates the directory if needed, checks that it is agentbay's, and
    /// takes its exclusive lock.
    pub fn open(root: &Path) -> Result<DataDir, StoreError> {
        ensure_agentbay_dir(root)?;
        let lock_path = root.join("lock");
        let mut lock = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(StoreError::io(format!("opening {}", lock_path.display())))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(StoreError::InUse {
                    path: root.to_path_buf(),
                    holder: describe_holder(root),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(StoreError::Io {
                    context: format!("locking {}", lock_path.display()),
                    source: e,
                });
            }
        }
        lock.set_len(0)
            .and_then(|()| lock.write_all(format!("{}\n", std::process::id()).as_bytes()))
            .map_err(StoreError::io("writing the lock file"))?;
        create_private_dir(&root.join("run"))?;
        let dir = DataDir {
            root: root.to_path_buf(),
            _lock: lock,
        };
        dir.finish_compaction()?;
        secure_tree(root)?;
        Ok(dir)
    }

    fn compacted_path(&self) -> PathBuf {
        self.root.join("store.compacted")
    }

    fn compacted_marker(&self) -> PathBuf {
        self.root.join("store.compacted.complete")
    }

    /// Rewrites the store into fresh files holding only what is live, then
    /// swaps them in: sled does not give back the space of deleted records
    /// by itself. The old files are replaced only once the copy is complete
    /// and synced (a marker file says so); a crash at any moment leaves
    /// either the old store or the new one, and the next open finishes or
    /// discards the swap. Needs the lock (the appliance stopped). Returns
    /// the bytes on disk before and after.
    pub fn compact(&self) -> Result<(u64, u64), StoreError> {
        let store = self.store_path();
        if !store.join("conf").exists() {
            return Err(StoreError::NotAStore {
                path: store,
                reason: "there is no store to compact".into(),
            });
        }
        let next = self.compacted_path();
        if next.exists() {
            fs::remove_dir_all(&next).map_err(StoreError::io("removing an old compaction"))?;
        }
        let before = dir_size(&store);
        {
            let old = super::open_sled(&store, None)?;
            let new = super::open_sled(&next, None)?;
            for name in old.tree_names() {
                let from = old.open_tree(&name)?;
                let to = new.open_tree(&name)?;
                // Plain inserts: the copy counts once its marker is
                // written, and a sled batch would take sled's process-wide
                // lock for good (see `redo.rs`).
                for item in from.iter() {
                    let (k, v) = item?;
                    to.insert(k, v)?;
                }
            }
            new.flush()?;
        }
        super::snapshot_rewritten(&next)?;
        sync_tree(&next)?;
        write_private(&self.compacted_marker(), b"complete\n")?;
        self.finish_compaction()?;
        secure_tree(&self.root)?;
        Ok((before, dir_size(&store)))
    }

    /// Completes a compaction whose copy is complete, or discards one whose
    /// copy is not (a crash in the middle of `agentbay compact`).
    fn finish_compaction(&self) -> Result<(), StoreError> {
        let (store, next, marker) = (
            self.store_path(),
            self.compacted_path(),
            self.compacted_marker(),
        );
        let old = self.root.join("store.old");
        let io = |what: &str| StoreError::io(format!("finishing the store compaction: {what}"));
        if !marker.exists() {
            if next.exists() {
                fs::remove_dir_all(&next).map_err(io("discarding an incomplete copy"))?;
            }
            return Ok(());
        }
        if next.exists() {
            if store.exists() {
                if old.exists() {
                    fs::remove_dir_all(&old).map_err(io("removing store.old"))?;
                }
                fs::rename(&store, &old).map_err(io("moving the old store aside"))?;
            }
            fs::rename(&next, &store).map_err(io("moving the compacted store in"))?;
            sync_dir(&self.root)?;
        }
        if old.exists() {
            fs::remove_dir_all(&old).map_err(io("removing the old store"))?;
        }
        fs::remove_file(&marker).map_err(io("removing the marker"))?;
        sync_dir(&self.root)?;
        tracing::info!(store = %store.display(), "store compaction finished");
        Ok(())
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where sled keeps its files.
    pub fn store_path(&self) -> PathBuf {
        self.root.join("store")
    }

    /// Where generated TLS material lives.
    pub fn tls_dir(&self) -> PathBuf {
        self.root.join("tls")
    }

    /// Records where the appliance listens, for administrative commands.
    pub fn write_runtime_info(&self, info: &RuntimeInfo) -> Result<(), StoreError> {
        let json = serde_json::to_vec_pretty(info).expect("runtime info serialises");
        write_private(&self.root.join(RUNTIME_INFO), &json)
    }

    /// Writes the local administration token (readable by the owner only).
    pub fn write_admin_token(&self, token: &str) -> Result<(), StoreError> {
        write_private(&self.root.join(ADMIN_TOKEN), token.as_bytes())
    }

    /// Removes the run files at shutdown.
    pub fn clear_runtime_files(&self) {
        let _ = fs::remove_file(self.root.join(RUNTIME_INFO));
        let _ = fs::remove_file(self.root.join(ADMIN_TOKEN));
    }

    /// Bytes the store's files take on disk.
    pub fn store_size(&self) -> u64 {
        dir_size(&self.store_path())
    }

    /// Whether the store has never been created here.
    pub fn is_fresh(&self) -> bool {
        !self.store_path().join("conf").exists()
    }
}

/// The pair key of the data directory at `root`, if it has one. A file
/// that cannot be read or is not a key is an error naming the file and
/// what is wrong, never its content.
pub fn read_pair_key(root: &Path) -> Result<Option<crate::domain::cluster::PairKey>, StoreError> {
    let path = root.join(PAIR_KEY_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(StoreError::Io {
                context: format!(
                    "reading the pair key {} (it must be readable by the account the appliance runs as)",
                    path.display()
                ),
                source: e,
            });
        }
    };
    crate::domain::cluster::PairKey::parse(&text)
        .map(Some)
        .map_err(|why| {
            StoreError::Engine(format!("the pair key {} is not one: {why}", path.display()))
        })
}

/// Makes a new pair key in the data directory at `root` (creating the
/// directory if needed), 0600. Refuses when one is there: replacing it
/// would cut this appliance off from the rest of its pair.
pub fn create_pair_key(root: &Path) -> Result<crate::domain::cluster::PairKey, StoreError> {
    use crate::domain::cluster::PairKey;
    ensure_agentbay_dir(root)?;
    let path = root.join(PAIR_KEY_FILE);
    if path.exists() {
        return Err(StoreError::NotAStore {
            path,
            reason: "a pair key is already there; the pair's appliances must share one key, so it is not replaced (delete it first to make a new one for every appliance of the pair)".into(),
        });
    }
    let (bytes, key) = PairKey::generate();
    write_private(&path, PairKey::file_text(&bytes).as_bytes())?;
    Ok(key)
}

/// The files of the data directory at `root` a backup carries besides the
/// store: the TLS material and the pair key.
pub fn backup_files(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = crate::tls::backup_files(&root.join("tls"));
    if let Ok(bytes) = fs::read(root.join(PAIR_KEY_FILE)) {
        files.push((PAIR_KEY_FILE.to_string(), bytes));
    }
    files
}

/// The running appliance of a data directory, if one holds its lock.
pub fn running_appliance(root: &Path) -> Option<(RuntimeInfo, String)> {
    let info: RuntimeInfo =
        serde_json::from_slice(&fs::read(root.join(RUNTIME_INFO)).ok()?).ok()?;
    let token = fs::read_to_string(root.join(ADMIN_TOKEN)).ok()?;
    // A stale file from a killed process: the lock tells the truth.
    if !is_locked(root) {
        return None;
    }
    Some((info, token.trim().to_string()))
}

/// Whether some process holds the data directory's lock.
pub fn is_locked(root: &Path) -> bool {
    let Ok(file) = File::options()
        .read(true)
        .write(true)
        .open(root.join("lock"))
    else {
        return false;
    };
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            false
        }
        Err(_) => true,
    }
}

fn describe_holder(root: &Path) -> String {
    if let Some((info, _)) = running_appliance(root) {
        return format!(
            "the agentbay appliance (pid {}) serving {}",
            info.pid, info.url
        );
    }
    let mut pid = String::new();
    let _ = File::open(root.join("lock")).and_then(|mut f| f.read_to_string(&mut pid));
    match pid.trim() {
        "" => "another agentbay process".to_string(),
        pid => format!("another agentbay process (pid {pid})"),
    }
}

fn ensure_agentbay_dir(root: &Path) -> Result<(), StoreError> {
    if !root.exists() {
        create_private_dir(root)?;
    }
    if !root.is_dir() {
        return Err(StoreError::NotAStore {
            path: root.to_path_buf(),
            reason: "it is not a directory".into(),
        });
    }
    let marker = root.join(MARKER);
    if marker.exists() {
        return Ok(());
    }
    let entries: Vec<String> = fs::read_dir(root)
        .map_err(StoreError::io(format!("reading {}", root.display())))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name != PAIR_KEY_FILE)
        .collect();
    if !entries.is_empty() {
        let mut shown: Vec<String> = entries.iter().take(5).cloned().collect();
        if entries.len() > 5 {
            shown.push(format!("and {} more", entries.len() - 5));
        }
        return Err(StoreError::NotAStore {
            path: root.to_path_buf(),
            reason: format!(
                "it is not empty and has no {MARKER} marker (found {}); point --data-dir at an empty or new directory",
                shown.join(", ")
            ),
        });
    }
    write_private(&marker, MARKER_TEXT.as_bytes())
}

/// The one file of the data directory others may read: the CA certificate,
/// which clients need to trust the appliance.
pub const PUBLIC_FILE: &str = "tls/ca.pem";

/// Makes every file this process creates from now on private (umask 077),
/// whatever umask it was started with: sled's store files, backups, restored
/// data directories, generated keys. Called by every command that touches a
/// data directory or writes a backup, and by [`crate::app::start`].
pub fn private_files() {
    #[cfg(unix)]
    // SAFETY: umask only sets the process's file mode creation mask; it
    // cannot fail and touches no memory.
    unsafe {
        libc::umask(0o077);
    }
}

/// Brings the modes of a data directory to what they must be, whatever
/// created its files (sled, an older agentbay, a restore, a copy): every
/// directory 0700, every file 0600, [`PUBLIC_FILE`] 0644.
pub fn secure_tree(root: &Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fn walk(root: &Path, dir: &Path) -> Result<(), StoreError> {
            set_mode(dir, 0o700)?;
            for entry in
                fs::read_dir(dir).map_err(StoreError::io(format!("reading {}", dir.display())))?
            {
                let entry = entry.map_err(StoreError::io(format!("reading {}", dir.display())))?;
                let path = entry.path();
                let kind = entry
                    .file_type()
                    .map_err(StoreError::io(format!("reading {}", path.display())))?;
                if kind.is_dir() {
                    walk(root, &path)?;
                } else if kind.is_file() {
                    let public = path
                        .strip_prefix(root)
                        .is_ok_and(|p| p == Path::new(PUBLIC_FILE));
                    set_mode(&path, if public { 0o644 } else { 0o600 })?;
                }
            }
            Ok(())
        }
        fn set_mode(path: &Path, mode: u32) -> Result<(), StoreError> {
            let current = fs::metadata(path)
                .map_err(StoreError::io(format!("reading {}", path.display())))?
                .permissions()
                .mode()
                & 0o777;
            if current != mode {
                fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(
                    StoreError::io(format!("setting the mode of {}", path.display())),
                )?;
            }
            Ok(())
        }
        walk(root, root)
    }
    #[cfg(not(unix))]
    {
        let _ = root;
        Ok(())
    }
}

/// Creates a directory only its owner can enter.
pub fn create_private_dir(path: &Path) -> Result<(), StoreError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder
        .create(path)
        .map_err(StoreError::io(format!("creating {}", path.display())))
}

/// Writes a file readable by its owner only, atomically: a crash leaves the
/// old content or the new, never a torn file.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write_file(path, bytes, 0o600)
}

/// Writes a file others may read (a certificate), atomically.
pub fn write_public(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write_file(path, bytes, 0o644)
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StoreError> {
    if let Some(parent) = path.parent() {
        create_private_dir(parent)?;
    }
    let tmp = path.with_extension("tmp");
    let mut options = File::options();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let context = format!("writing {}", path.display());
    let mut file = options
        .open(&tmp)
        .map_err(StoreError::io(context.clone()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(StoreError::io(context.clone()))?;
    // The mode given, not the umask's version of it.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))
            .map_err(StoreError::io(context.clone()))?;
    }
    fs::rename(&tmp, path).map_err(StoreError::io(context))?;
    Ok(())
}

/// Creates a new file readable by its owner only (a backup): it fails if
/// the file exists.
pub fn create_private_file(path: &Path) -> Result<File, StoreError> {
    let mut options = File::options();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options
        .open(path)
        .map_err(StoreError::io(format!("creating {}", path.display())))
}

/// Bytes of the files under `dir`.
fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Syncs a written file's data to disk by its path. Opened for writing:
/// Windows flushes only a handle with write access (a read-only one is
/// refused, access denied).
pub fn sync_file(path: &Path) -> std::io::Result<()> {
    File::options().write(true).open(path)?.sync_all()
}

/// Syncs every file under `dir`, then `dir` itself.
fn sync_tree(dir: &Path) -> Result<(), StoreError> {
    for entry in fs::read_dir(dir).map_err(StoreError::io(format!("reading {}", dir.display())))? {
        let entry = entry.map_err(StoreError::io("reading a directory"))?;
        let path = entry.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            sync_file(&path).map_err(StoreError::io(format!("syncing {}", path.display())))?;
        }
    }
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(StoreError::io(format!("syncing {}", dir.display())))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_opener_is_refused_with_the_holder_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("data");
        let first = DataDir::open(&root).unwrap();
        let err = DataDir::open(&root).unwrap_err();
        assert!(matches!(err, StoreError::InUse { .. }), "{err}");
        assert!(err.to_string().contains("already in use"), "{err}");
        assert!(
            err.to_string().contains(&std::process::id().to_string()),
            "{err}"
        );
        drop(first);
        DataDir::open(&root).unwrap();
    }

    #[test]
    fn a_foreign_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        let err = DataDir::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("notes.txt"), "{err}");
        assert!(
            err.to_string().contains("not an agentbay data directory"),
            "{err}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn private_files_are_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        write_private(&path, b"x").unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    fn compressed(store: &Path) -> bool {
        String::from_utf8_lossy(&fs::read(store.join("conf")).unwrap())
            .contains("use_compression: true")
    }

    fn records(store: &Path) -> Vec<(Vec<u8>, sled::IVec, sled::IVec)> {
        let db = crate::store::open_sled(store, None).unwrap();
        let mut all = Vec::new();
        for name in db.tree_names() {
            for item in db.open_tree(&name).unwrap().iter() {
                let (k, v) = item.unwrap();
                all.push((name.to_vec(), k, v));
            }
        }
        all
    }

    #[test]
    fn a_store_written_compressed_keeps_working_and_compaction_rewrites_it_uncompressed() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::open(&dir.path().join("data")).unwrap();
        let store = data.store_path();
        {
            // A store as the versions that compressed wrote it.
            let s = crate::store::Store::open(&store, &Default::default()).unwrap();
            drop(s);
            assert!(!compressed(&store), "a new store is written uncompressed");
            let old = store.with_extension("old-format");
            // Through open_sled: the store just dropped may still hold
            // sled's lock for a moment (see open_sled).
            let from = crate::store::open_sled(&store, None).unwrap();
            let to = sled::Config::new()
                .path(&old)
                .use_compression(true)
                .open()
                .unwrap();
            for name in from.tree_names() {
                let (a, b) = (from.open_tree(&name).unwrap(), to.open_tree(&name).unwrap());
                for item in a.iter() {
                    let (k, v) = item.unwrap();
                    b.insert(k, v).unwrap();
                }
            }
            // sled's default tree, unused by agentbay, is copied all the same.
            to.insert(b"payload", vec![b'x'; 4096]).unwrap();
            to.flush().unwrap();
            drop((from, to));
            fs::remove_dir_all(&store).unwrap();
            fs::rename(&old, &store).unwrap();
        }
        assert!(compressed(&store));
        let before = records(&store);
        // It opens as it was written, and keeps its format while it is used.
        drop(crate::store::Store::open(&store, &Default::default()).unwrap());
        assert!(compressed(&store));
        assert_eq!(records(&store), before);
        data.compact().unwrap();
        assert!(!compressed(&store));
        assert_eq!(records(&store), before);
        drop(crate::store::Store::open(&store, &Default::default()).unwrap());
    }
}
