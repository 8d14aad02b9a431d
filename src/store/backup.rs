//! Backup and restore.
//!
//! A backup is taken on the writer thread, so no write interleaves with it:
//! the snapshot is consistent across every tree without stopping reads or
//! the appliance. Writes queue while it runs (a few seconds per gigabyte).
//!
//! File format (gzip-compressed):
//!
//! ```text
//! "AGENTBAY-BACKUP\0"                       16 bytes
//! u32 length + JSON header                  format, schema version, versions, time
//! entries, each starting with a tag byte:
//!   1  u16 tree-name length, name, u32 key length, key, u32 value length, value
//!   2  u16 path length, path, u32 length, bytes      (a file of the data directory)
//!   0  32-byte SHA-256 of every byte before this tag  (end)
//! ```
//!
//! Restore reads the whole file into a fresh store beside the target and
//! moves it into place only once the checksum matched, so a truncated or
//! altered backup leaves nothing behind.

use std::fs;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Component, Path};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::datadir::{MARKER, MARKER_TEXT, create_private_dir, secure_tree, write_private};
use super::kv::{KvRead, Reading};
use super::schema::{FORMAT_KEY, FORMAT_VALUE, SCHEMA_VERSION, VERSION_KEY};
use super::{Store, StoreError, Table};

const MAGIC: &[u8; 16] = b"AGENTBAY-BACKUP\0";
const TAG_END: u8 = 0;
const TAG_RECORD: u8 = 1;
const TAG_FILE: u8 = 2;

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    format: u32,
    schema_version: u32,
    agentbay_version: String,
    created_at: DateTime<Utc>,
}

/// What a backup or restore carried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupSummary {
    /// Schema version of the store in the backup.
    pub schema_version: u32,
    /// Key-value records across every tree.
    pub records: u64,
    /// Files of the data directory (TLS material).
    pub files: u64,
}

/// Writes bytes through to `inner` while hashing them.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Store {
    /// Writes a consistent backup of the store and of `files` (paths
    /// relative to the data directory) to `out`.
    pub async fn backup<W: Write + Send + 'static>(
        &self,
        out: W,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<BackupSummary, StoreError> {
        let schema_version = self.schema_version();
        let rx = self
            .inner
            .committer
            .run_exclusive(move |kv| write_backup(out, kv, &files, schema_version));
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Writes a consistent backup of the store and of `files` into a new
    /// private file at `path` (0600, or the owner-only ACL), synced before
    /// this returns. Nothing is left at `path` when it fails. Every backup
    /// the appliance writes to a file (the CLI's, the Backup RPC's, the
    /// schedule's) goes through here; naming it into place is the caller's.
    pub async fn backup_file(
        &self,
        path: &Path,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<BackupSummary, StoreError> {
        let out = super::datadir::create_private_file(path)?;
        let written = self.backup(out, files).await;
        let synced = match written {
            Ok(summary) => {
                let p = path.to_path_buf();
                tokio::task::spawn_blocking(move || super::datadir::sync_file(&p))
                    .await
                    .map_err(|e| StoreError::Backup(e.to_string()))?
                    .map_err(StoreError::io("syncing the backup"))
                    .map(|()| summary)
            }
            Err(e) => Err(e),
        };
        if synced.is_err() {
            let _ = std::fs::remove_file(path);
        }
        synced
    }
}

/// Before this binary changes anything in a store another agentbay
/// version wrote (a migration, or only records of a new shape), writes a
/// backup of it as that version left it into `dir`:
/// `before-upgrade-from-agentbay-<version>-schema-<n>-<UTC time>.backup`,
/// private, synced, and only then named. The backup carries the old
/// schema version, so the earlier version restores it: the way back from
/// an upgrade (README, "Upgrading"). Kept until the operator deletes it;
/// scheduled backups never prune it. Refuses to open the store when the
/// backup cannot be written.
pub(super) fn before_upgrade(
    open: &super::engine::Open,
    store_path: &Path,
    dir: &Path,
) -> Result<(), StoreError> {
    let Some(writer) = super::schema::earlier_writer(open)? else {
        return Ok(());
    };
    let refused = |e: StoreError| {
        StoreError::Backup(format!(
            "the store was last opened by {}; before this agentbay {} changes it, it writes a backup into {} (backup.dir), which failed: {e}. Free space there or set backup.dir to a directory with room",
            writer.label(),
            super::schema::THIS_VERSION,
            dir.display()
        ))
    };
    create_private_dir(dir).map_err(refused)?;
    let stamp = Utc::now().format("%Y%m%dT%H%M%SZ");
    let name = format!("before-upgrade-from-{}-{stamp}.backup", writer.label());
    let file = dir.join(&name);
    let partial = dir.join(format!("{name}.partial"));
    let files = store_path
        .parent()
        .map(super::datadir::backup_files)
        .unwrap_or_default();
    let write = || -> Result<BackupSummary, StoreError> {
        let out = super::datadir::create_private_file(&partial)?;
        let summary = write_backup(&out, open, &files, writer.schema)?;
        out.sync_all()
            .map_err(StoreError::io(format!("syncing {}", partial.display())))?;
        fs::rename(&partial, &file)
            .map_err(StoreError::io(format!("naming {}", file.display())))?;
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(summary)
    };
    let summary = write().map_err(|e| {
        let _ = fs::remove_file(&partial);
        refused(e)
    })?;
    tracing::info!(
        from = %writer.label(),
        to = super::schema::THIS_VERSION,
        file = %file.display(),
        records = summary.records,
        "store: backed up as the earlier version left it, before this version opens it"
    );
    Ok(())
}

fn write_backup<W: Write>(
    out: W,
    kv: &dyn KvRead,
    files: &[(String, Vec<u8>)],
    schema_version: u32,
) -> Result<BackupSummary, StoreError> {
    let io_err = StoreError::io("writing the backup");
    let gz = flate2::write::GzEncoder::new(BufWriter::new(out), flate2::Compression::fast());
    let mut w = Hashing {
        inner: gz,
        hash: Sha256::new(),
    };
    let header = serde_json::to_vec(&Header {
        format: 1,
        schema_version,
        agentbay_version: env!("CARGO_PKG_VERSION").to_string(),
        created_at: Utc::now(),
    })
    .expect("header serialises");
    let mut summary = BackupSummary {
        schema_version,
        records: 0,
        files: 0,
    };
    (|| -> io::Result<()> {
        w.write_all(MAGIC)?;
        w.write_all(&(header.len() as u32).to_be_bytes())?;
        w.write_all(&header)?;
        for table in Table::ALL {
            let name = table.name().as_bytes();
            for item in Reading::new(kv, *table).iter() {
                let (k, v) = item.map_err(io::Error::other)?;
                w.write_all(&[TAG_RECORD])?;
                w.write_all(&(name.len() as u16).to_be_bytes())?;
                w.write_all(name)?;
                w.write_all(&(k.len() as u32).to_be_bytes())?;
                w.write_all(&k)?;
                w.write_all(&(v.len() as u32).to_be_bytes())?;
                w.write_all(&v)?;
                summary.records += 1;
            }
        }
        for (path, bytes) in files {
            w.write_all(&[TAG_FILE])?;
            w.write_all(&(path.len() as u16).to_be_bytes())?;
            w.write_all(path.as_bytes())?;
            w.write_all(&(bytes.len() as u32).to_be_bytes())?;
            w.write_all(bytes)?;
            summary.files += 1;
        }
        let digest = w.hash.clone().finalize();
        w.inner.write_all(&[TAG_END])?;
        w.inner.write_all(&digest)?;
        let mut buf = w.inner.finish()?;
        buf.flush()?;
        Ok(())
    })()
    .map_err(io_err)?;
    Ok(summary)
}

/// Reads `n` bytes, hashing them.
fn read_exact_hashed<R: Read>(
    r: &mut R,
    hash: &mut Sha256,
    n: usize,
) -> Result<Vec<u8>, StoreError> {
    let mut buf = vec![0; n];
    r.read_exact(&mut buf)
        .map_err(|e| StoreError::Backup(format!("the file ends early or is damaged ({e})")))?;
    hash.update(&buf);
    Ok(buf)
}

fn read_u16<R: Read>(r: &mut R, hash: &mut Sha256) -> Result<usize, StoreError> {
    let b = read_exact_hashed(r, hash, 2)?;
    Ok(u16::from_be_bytes([b[0], b[1]]) as usize)
}

fn read_u32<R: Read>(r: &mut R, hash: &mut Sha256) -> Result<usize, StoreError> {
    let b = read_exact_hashed(r, hash, 4)?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
}

/// A relative path inside the data directory, without `..` or roots.
fn safe_relative(path: &str) -> Option<&Path> {
    let p = Path::new(path);
    p.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then_some(p)
}

/// Restores `backup` into `data_root`, which must be empty or absent.
pub fn restore_into(backup: &Path, data_root: &Path) -> Result<BackupSummary, StoreError> {
    restore_to(backup, data_root, &super::Backend::Sled)
}

/// Restores `backup` into `data_root` (its files: the certificate), which
/// must be empty or absent, and its records into the store of `backend`:
/// sled in the data directory, or an empty PostgreSQL store, filled in one
/// transaction. A backup of either backend restores into either.
pub fn restore_to(
    backup: &Path,
    data_root: &Path,
    backend: &super::Backend,
) -> Result<BackupSummary, StoreError> {
    if data_root.exists() {
        let mut entries = fs::read_dir(data_root)
            .map_err(StoreError::io(format!("reading {}", data_root.display())))?;
        if entries.next().is_some() {
            return Err(StoreError::Backup(format!(
                "the data directory {} (--data-dir) is not empty; restore only fills an empty or new one",
                data_root.display()
            )));
        }
    }
    let file =
        fs::File::open(backup).map_err(StoreError::io(format!("opening {}", backup.display())))?;
    let mut r = BufReader::new(flate2::read::GzDecoder::new(BufReader::new(file)));
    let mut hash = Sha256::new();
    let magic = read_exact_hashed(&mut r, &mut hash, MAGIC.len()).map_err(|_| {
        StoreError::Backup(format!("{} is not an agentbay backup", backup.display()))
    })?;
    if magic != MAGIC {
        return Err(StoreError::Backup(format!(
            "{} is not an agentbay backup",
            backup.display()
        )));
    }
    let len = read_u32(&mut r, &mut hash)?;
    let header: Header = serde_json::from_slice(&read_exact_hashed(&mut r, &mut hash, len)?)
        .map_err(|e| StoreError::Backup(format!("unreadable header: {e}")))?;
    if header.format != 1 {
        return Err(StoreError::Backup(format!(
            "unknown backup format {}",
            header.format
        )));
    }
    if header.schema_version > SCHEMA_VERSION {
        return Err(StoreError::Backup(format!(
            "the backup has schema version {} (agentbay {}), newer than this agentbay understands ({SCHEMA_VERSION})",
            header.schema_version, header.agentbay_version
        )));
    }
    let mut entries = Entries {
        r,
        hash,
        summary: BackupSummary {
            schema_version: header.schema_version,
            records: 0,
            files: 0,
        },
        files: Vec::new(),
        marked: (false, false),
    };

    // Build everything in a staging directory beside the target.
    let staging = data_root.with_extension("restoring");
    if staging.exists() {
        fs::remove_dir_all(&staging)
            .map_err(StoreError::io("removing an old staging directory"))?;
    }
    create_private_dir(&staging)?;
    let result = (|| -> Result<(), StoreError> {
        match backend {
            super::Backend::Sled => {
                let db = super::open_sled(&staging.join("store"), None)?;
                entries.read(&mut |name, key, value| {
                    db.open_tree(name)?.insert(key, value)?;
                    Ok(())
                })?;
                db.flush()?;
                // Every handle on the database (its trees too) must be gone
                // before it is opened again: the last one closes it and
                // releases its lock.
                drop(db);
                super::snapshot_rewritten(&staging.join("store"))?;
            }
            super::Backend::Postgres(options) => {
                // The data directory is empty, so it holds no pair key yet:
                // the backup's comes with its files, after the records. The
                // restore holds the store only while it fills it, under a
                // key made for that, and releases it when filled; the
                // restored appliance signs the row with its pair's key.
                let mut options = options.clone();
                options
                    .pair
                    .get_or_insert_with(|| crate::domain::cluster::PairKey::generate().1);
                let pg = super::postgres::PgEngine::open(options)?;
                pg.load(|sink| {
                    entries.read(&mut |name, key, value| match Table::named(name) {
                        Some(table) => sink(table, key, value),
                        // sled's own default tree, unused by agentbay.
                        None if name == b"__sled__default" => Ok(()),
                        None => Err(StoreError::Backup(format!(
                            "the backup holds a table {:?} this agentbay does not know",
                            String::from_utf8_lossy(name)
                        ))),
                    })
                })?;
            }
        }
        for (path, bytes) in &entries.files {
            write_private(&staging.join(path), bytes)?;
        }
        write_private(&staging.join(MARKER), MARKER_TEXT.as_bytes())?;
        secure_tree(&staging)?;
        Ok(())
    })();
    match result {
        Ok(()) => {
            if data_root.exists() {
                fs::remove_dir(data_root)
                    .map_err(StoreError::io(format!("replacing {}", data_root.display())))?;
            }
            fs::rename(&staging, data_root).map_err(StoreError::io(format!(
                "moving the restored store to {}",
                data_root.display()
            )))?;
            Ok(entries.summary)
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}

/// Takes one record: its table's name, key and value.
type NamedSink<'a> = dyn FnMut(&[u8], Vec<u8>, Vec<u8>) -> Result<(), StoreError> + 'a;

/// The entries of a backup after its header.
struct Entries<R> {
    r: R,
    hash: Sha256,
    summary: BackupSummary,
    files: Vec<(String, Vec<u8>)>,
    /// Whether the format marker and the schema version were seen.
    marked: (bool, bool),
}

impl<R: Read> Entries<R> {
    /// Hands every record to `record` (table name, key, value), keeps the
    /// files, and checks the checksum and that the records are an
    /// agentbay store's: a damaged backup is an error before the end.
    fn read(&mut self, record: &mut NamedSink<'_>) -> Result<(), StoreError> {
        let (r, hash) = (&mut self.r, &mut self.hash);
        loop {
            let tag = read_exact_hashed(r, &mut Sha256::new(), 1)?[0];
            match tag {
                TAG_RECORD => {
                    hash.update([tag]);
                    let n = read_u16(r, hash)?;
                    let name = read_exact_hashed(r, hash, n)?;
                    let n = read_u32(r, hash)?;
                    let key = read_exact_hashed(r, hash, n)?;
                    let n = read_u32(r, hash)?;
                    let value = read_exact_hashed(r, hash, n)?;
                    if name == b"meta" && key == FORMAT_KEY.as_bytes() {
                        self.marked.0 = value == FORMAT_VALUE;
                    }
                    if name == b"meta" && key == VERSION_KEY.as_bytes() {
                        self.marked.1 = true;
                    }
                    record(&name, key, value)?;
                    self.summary.records += 1;
                }
                TAG_FILE => {
                    hash.update([tag]);
                    let n = read_u16(r, hash)?;
                    let path = String::from_utf8(read_exact_hashed(r, hash, n)?)
                        .map_err(|_| StoreError::Backup("a file path is not UTF-8".into()))?;
                    let n = read_u32(r, hash)?;
                    let bytes = read_exact_hashed(r, hash, n)?;
                    if safe_relative(&path).is_none() {
                        return Err(StoreError::Backup(format!(
                            "unsafe file path {path:?} in the backup"
                        )));
                    }
                    self.files.push((path, bytes));
                    self.summary.files += 1;
                }
                TAG_END => {
                    let expected = hash.clone().finalize();
                    let mut actual = [0u8; 32];
                    r.read_exact(&mut actual).map_err(|_| {
                        StoreError::Backup("the file ends before its checksum".into())
                    })?;
                    if actual[..] != expected[..] {
                        return Err(StoreError::Backup(
                            "checksum mismatch: the backup is damaged".into(),
                        ));
                    }
                    break;
                }
                other => {
                    return Err(StoreError::Backup(format!(
                        "unknown entry tag {other}: the backup is damaged"
                    )));
                }
            }
        }
        if self.marked != (true, true) {
            return Err(StoreError::Backup(
                "the backup holds no agentbay store".into(),
            ));
        }
        Ok(())
    }
}
