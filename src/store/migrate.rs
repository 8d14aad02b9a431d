//! Moving a stopped appliance's store from one backend to the other
//! (`agentbay store migrate --to postgres|sled`).
//!
//! The records are copied as they are (the same keys and values on both
//! backends) into a target that must hold no store yet, and then read
//! back: every table's record count and SHA-256 over its keys and values
//! in key order must be the source's. On PostgreSQL the copy is one
//! transaction, and taking the source's or target's leader row first
//! makes sure no appliance uses it meanwhile. The source is left as it
//! was.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::engine::Open;
use super::kv::{KvBulk, KvRead, Reading};
use super::postgres::PgEngine;
use super::schema::{FORMAT_KEY, FORMAT_VALUE, SCHEMA_VERSION, VERSION_KEY};
use super::{Backend, StoreError, Table};

/// One table as copied and read back.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TableCopy {
    /// The table's name.
    pub table: &'static str,
    /// Records copied.
    pub records: u64,
    /// `sha256:<hex>` over each record's key and value, with their lengths,
    /// in key order: the same on both sides.
    pub sha256: String,
}

/// A store opened for the move: sled's files, or a PostgreSQL database
/// whose leader row this process holds.
enum Side {
    Sled(Open),
    Postgres(Box<PgEngine>),
}

impl Side {
    fn read(&self) -> &dyn KvRead {
        match self {
            Side::Sled(open) => open,
            Side::Postgres(pg) => pg.as_ref(),
        }
    }

    fn describe(backend: &Backend, path: &Path) -> String {
        match backend {
            Backend::Sled => format!("the sled store at {}", path.display()),
            Backend::Postgres(pg) => format!("the PostgreSQL store ({})", pg.describe()),
        }
    }
}

/// Copies the store at `path` (sled) or of `from` (PostgreSQL) into `to`,
/// which must hold no store yet, and verifies the copy. The appliance
/// must be stopped: the caller holds the data directory's lock.
pub fn migrate(path: &Path, from: &Backend, to: &Backend) -> Result<Vec<TableCopy>, StoreError> {
    let source = match from {
        Backend::Sled => {
            if !path.join("conf").exists() {
                return Err(StoreError::NotAStore {
                    path: path.to_path_buf(),
                    reason: "there is no sled store to move".into(),
                });
            }
            Side::Sled(Open::at(path, 32 * 1024 * 1024)?)
        }
        Backend::Postgres(pg) => Side::Postgres(Box::new(PgEngine::open(pg.clone())?)),
    };
    check_current(source.read(), &Side::describe(from, path))?;
    let mut copied = Vec::new();
    let target = match to {
        Backend::Sled => {
            if path.join("conf").exists() {
                return Err(StoreError::NotAStore {
                    path: path.to_path_buf(),
                    reason: "a sled store is already there; move it away first".into(),
                });
            }
            let open = Open::as_found(path, 32 * 1024 * 1024)?;
            for table in Table::ALL {
                let mut digest = TableHash::new(*table);
                for item in Reading::new(source.read(), *table).iter() {
                    let (k, v) = item?;
                    digest.add(&k, &v);
                    open.put(*table, &k, &v)?;
                }
                copied.push(digest.finish());
            }
            open.flush()?;
            Side::Sled(open)
        }
        Backend::Postgres(pg) => {
            let engine = PgEngine::open(pg.clone())?;
            engine.load(|sink| {
                for table in Table::ALL {
                    let mut digest = TableHash::new(*table);
                    for item in Reading::new(source.read(), *table).iter() {
                        let (k, v) = item?;
                        digest.add(&k, &v);
                        sink(*table, k, v)?;
                    }
                    copied.push(digest.finish());
                }
                Ok(())
            })?;
            Side::Postgres(Box::new(engine))
        }
    };
    for want in &copied {
        let table = Table::named(want.table.as_bytes()).expect("a table's own name");
        let mut digest = TableHash::new(table);
        for item in Reading::new(target.read(), table).iter() {
            let (k, v) = item?;
            digest.add(&k, &v);
        }
        let found = digest.finish();
        if &found != want {
            return Err(StoreError::Corrupt {
                table: want.table,
                key: String::new(),
                reason: format!(
                    "the copy reads back as {} records ({}), the source holds {} ({}); {} is not to be used",
                    found.records,
                    found.sha256,
                    want.records,
                    want.sha256,
                    Side::describe(to, path)
                ),
            });
        }
    }
    Ok(copied)
}

/// Refuses a source that is not an agentbay store of this schema: an
/// older one is migrated by starting this version on it first.
fn check_current(kv: &dyn KvRead, what: &str) -> Result<(), StoreError> {
    if kv.get(Table::Meta, FORMAT_KEY.as_bytes())?.as_deref() != Some(FORMAT_VALUE) {
        return Err(StoreError::Engine(format!(
            "{what} holds no agentbay store"
        )));
    }
    let version = kv
        .get(Table::Meta, VERSION_KEY.as_bytes())?
        .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
        .map(u32::from_be_bytes);
    if version != Some(SCHEMA_VERSION) {
        return Err(StoreError::Engine(format!(
            "{what} is at schema version {}, this agentbay at {SCHEMA_VERSION}: start this agentbay on it once (it migrates the schema), stop it, then move it",
            version.map_or("(none)".into(), |v| v.to_string())
        )));
    }
    Ok(())
}

/// A table's count and hash, as it is read.
struct TableHash {
    table: Table,
    records: u64,
    hash: Sha256,
}

impl TableHash {
    fn new(table: Table) -> TableHash {
        TableHash {
            table,
            records: 0,
            hash: Sha256::new(),
        }
    }

    fn add(&mut self, key: &[u8], value: &[u8]) {
        self.records += 1;
        self.hash.update((key.len() as u32).to_be_bytes());
        self.hash.update(key);
        self.hash.update((value.len() as u32).to_be_bytes());
        self.hash.update(value);
    }

    fn finish(self) -> TableCopy {
        TableCopy {
            table: self.table.name(),
            records: self.records,
            sha256: format!("sha256:{}", hex::encode(self.hash.finalize())),
        }
    }
}
