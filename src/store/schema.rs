//! Format marker, schema version and forward migrations.
//!
//! A store knows what it is (`meta/format`) and which schema it is at
//! (`meta/schema_version`). Opening an older store runs the migrations from
//! its version up, each in its own transaction that also bumps the version,
//! so a crash mid-way resumes at the right step. A newer store, or a
//! directory that is not an agentbay store, is refused: the appliance never
//! guesses.

use std::path::Path;

use super::kv::{KvBulk, KvRead, Reading};
use super::{StoreError, Table};

/// The schema version this binary writes.
pub const SCHEMA_VERSION: u32 = 8;

pub(super) const FORMAT_KEY: &str = "format";
pub(super) const FORMAT_VALUE: &[u8] = b"agentbay-store";
pub(super) const VERSION_KEY: &str = "schema_version";
/// The agentbay version that last opened the store (absent: one from
/// before this key, or none yet).
pub(super) const WRITER_KEY: &str = "agentbay_version";

/// This binary's version, as [`WRITER_KEY`] holds it.
pub(super) const THIS_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Which agentbay version last opened the store, and at which schema it
/// left it; `None` for a store this binary has opened before (or a newer
/// one, which [`prepare`] refuses).
pub(super) fn earlier_writer(kv: &dyn KvRead) -> Result<Option<Writer>, StoreError> {
    let schema = kv
        .get(Table::Meta, VERSION_KEY.as_bytes())?
        .and_then(|raw| <[u8; 4]>::try_from(raw.as_ref()).ok())
        .map(u32::from_be_bytes);
    let version = kv
        .get(Table::Meta, WRITER_KEY.as_bytes())?
        .map(|v| String::from_utf8_lossy(&v).into_owned());
    let Some(schema) = schema else {
        return Ok(None);
    };
    if schema > SCHEMA_VERSION
        || (schema == SCHEMA_VERSION && version.as_deref() == Some(THIS_VERSION))
    {
        return Ok(None);
    }
    Ok(Some(Writer { version, schema }))
}

/// An earlier agentbay that wrote a store.
pub(super) struct Writer {
    /// Its version, when the store records it (every store a version of
    /// schema 8 or later opened).
    pub version: Option<String>,
    /// The schema it left the store at.
    pub schema: u32,
}

impl Writer {
    /// How a file names it: `agentbay-0.1.0-schema-7`, or `schema-6` when
    /// the store does not say which version wrote it.
    pub fn label(&self) -> String {
        match &self.version {
            Some(v) => format!("agentbay-{v}-schema-{}", self.schema),
            None => format!("schema-{}", self.schema),
        }
    }
}

/// Records this binary as the store's last writer (after [`prepare`]).
pub(super) fn record_writer(kv: &dyn KvBulk) -> Result<(), StoreError> {
    if kv.get(Table::Meta, WRITER_KEY.as_bytes())?.as_deref() != Some(THIS_VERSION.as_bytes()) {
        kv.put(Table::Meta, WRITER_KEY.as_bytes(), THIS_VERSION.as_bytes())?;
        kv.flush()?;
    }
    Ok(())
}

/// One step from `from` to `from + 1`.
pub(super) struct Migration {
    /// The version it upgrades from.
    pub from: u32,
    /// What it changes, for the log.
    pub description: &'static str,
    /// The change, applied to the whole database.
    pub apply: fn(&dyn KvBulk) -> Result<(), StoreError>,
}

/// The migrations of this binary, in order. Version 1 is the first schema.
pub(super) const MIGRATIONS: &[Migration] = &[
    Migration {
        from: 1,
        description: "write the index entries, counts and artifact reference counts records derive",
        apply: derive_everything,
    },
    Migration {
        from: 2,
        description: "derive the decision index (decisions by id)",
        apply: derive_everything,
    },
    Migration {
        from: 3,
        description: "releases rejected only because their publisher key was not trusted are Untrusted",
        apply: untrusted_releases,
    },
    Migration {
        from: 4,
        description: "index every attempt's events (WatchAttempt resumes from a sequence)",
        apply: index_attempt_events,
    },
    Migration {
        from: 5,
        description: "keep counts only for the indexes whose counts are read",
        apply: recount_indexes,
    },
    Migration {
        from: 6,
        description: "remove the leases' appliance-wide live index and per-pool index (the state index and the lease table answer them); groups of writes are made atomic by redo and undo records",
        apply: fewer_lease_indexes,
    },
    Migration {
        from: 7,
        description: "count artifact references again: an attempt's or checkpoint's context snapshot reference names the context builder's snapshot, not content of this store",
        apply: derive_everything,
    },
];

/// Version 7: leases no longer derive the appliance-wide `lease-live`
/// index nor the tenant index `lease-pool`; their entries are removed.
/// And a group of writes is applied as plain inserts after its redo and
/// undo records, not as a sled transaction (see `redo.rs`): the version
/// also makes a binary that would not complete a group a crash cut short
/// refuse the store. Safe to run again: it only removes.
fn fewer_lease_indexes(kv: &dyn KvBulk) -> Result<(), StoreError> {
    let live = super::derived::global_prefix("lease-live", None);
    let keys = Reading::new(kv, Table::Index)
        .iter()
        .map(|item| item.map(|(k, _)| k))
        .collect::<Result<Vec<_>, _>>()?;
    for key in keys {
        let by_pool = key
            .splitn(3, |b| *b == b'/')
            .nth(1)
            .is_some_and(|name| name == b"lease-pool");
        if key.starts_with(&live) || by_pool {
            kv.remove(Table::Index, &key)?;
        }
    }
    Ok(())
}

/// Version 4: a release kept with its contents and rejected at a
/// re-verification because its signer was not trusted (unknown, or not
/// allowed for its tenant) becomes Untrusted, so that trusting its key
/// verifies it again. Releases rejected for what they contain stay
/// Rejected. Safe to run again: it only rewrites such releases.
fn untrusted_releases(kv: &dyn KvBulk) -> Result<(), StoreError> {
    use crate::domain::release::{LoadState, LoadedRelease};
    let all = Reading::new(kv, Table::LoadedReleases)
        .iter()
        .collect::<Result<Vec<_>, _>>()?;
    for (key, bytes) in all {
        let mut release: LoadedRelease = super::decode(&key, &bytes)?;
        let untrusted_signer = release.reason.as_deref().is_some_and(|r| {
            r.starts_with("re-verification failed: signed by unknown publisher key")
                || (r.starts_with("re-verification failed: publisher key")
                    && r.contains("may not sign releases for tenant"))
        });
        if release.state == LoadState::Rejected
            && !release.content_refs.is_empty()
            && untrusted_signer
        {
            release.state = LoadState::Untrusted;
            kv.put(Table::LoadedReleases, &key, &super::encode(&release)?)?;
        }
    }
    Ok(())
}

/// Version 2: records derive index entries and artifact references (see
/// `derived.rs`). Writes them for every stored record. Version 8 runs it
/// again: context snapshot references no longer count as references. Safe to run again
/// after a crash: every value it writes is recomputed from the records.
fn derive_everything(kv: &dyn KvBulk) -> Result<(), StoreError> {
    let mut rebuild = super::derived::Rebuild::writing(kv);
    derive_tables(kv, &mut rebuild)?;
    super::artifacts::recount(kv, &mut rebuild)?;
    rebuild.finish()
}

/// Version 5: the index of each attempt's events, written for the events
/// already stored. Safe to run again: it writes the same keys.
fn index_attempt_events(kv: &dyn KvBulk) -> Result<(), StoreError> {
    let mut rebuild = super::derived::Rebuild::writing(kv);
    rebuild.outbox(kv)?;
    Ok(())
}

/// Version 6: only the indexes whose counts something reads keep counts
/// ([`Derived::counted`](super::Derived::counted)). Removes every stored
/// count and writes those of the counted indexes again, computed from the
/// records. Safe to run again: it starts by removing what it writes.
fn recount_indexes(kv: &dyn KvBulk) -> Result<(), StoreError> {
    let counts = Reading::new(kv, Table::Index)
        .iter()
        .filter_map(|item| match item {
            Ok((k, _)) => super::derived::is_count_key(&k).then_some(Ok(k)),
            Err(e) => Some(Err(e)),
        })
        .collect::<Result<Vec<_>, _>>()?;
    for key in counts {
        kv.remove(Table::Index, &key)?;
    }
    let mut rebuild = super::derived::Rebuild::counting();
    derive_tables(kv, &mut rebuild)?;
    super::derived::write_counts(kv, &rebuild.counts)
}

/// Derives every table whose records derive entries or references (the
/// artifacts themselves aside), and the index of the attempts' events.
pub(super) fn derive_tables(
    kv: &dyn KvRead,
    rebuild: &mut super::derived::Rebuild<'_>,
) -> Result<(), StoreError> {
    use crate::domain::attempt::{CallRecord, Checkpoint, DecisionRequest, ExecutionAttempt};
    use crate::domain::capacity::CapacityLease;
    use crate::domain::run::Run;
    rebuild.table::<ExecutionAttempt>(kv)?;
    rebuild.table::<Run>(kv)?;
    rebuild.table::<Checkpoint>(kv)?;
    rebuild.table::<CallRecord>(kv)?;
    rebuild.table::<DecisionRequest>(kv)?;
    rebuild.table::<CapacityLease>(kv)?;
    rebuild.outbox(kv)?;
    Ok(())
}

/// Checks the marker and version, initialises a fresh store and migrates an
/// older one. Returns the version the store is at afterwards.
pub(super) fn prepare(
    kv: &dyn KvBulk,
    path: &Path,
    fresh: bool,
    migrations: &[Migration],
) -> Result<u32, StoreError> {
    let target = migrations
        .last()
        .map_or(SCHEMA_VERSION, |m| m.from + 1)
        .max(SCHEMA_VERSION);
    let format = kv.get(Table::Meta, FORMAT_KEY.as_bytes())?;
    let version = match (format, fresh) {
        (None, true) => {
            // The version first: sled recovers a prefix of these inserts,
            // so a store with the format marker has its version. No sled
            // transaction, ever (see `redo.rs`).
            kv.put(Table::Meta, VERSION_KEY.as_bytes(), &target.to_be_bytes())?;
            kv.put(Table::Meta, FORMAT_KEY.as_bytes(), FORMAT_VALUE)?;
            kv.flush()?;
            return Ok(target);
        }
        (None, false) => {
            return Err(StoreError::NotAStore {
                path: path.to_path_buf(),
                reason: "it holds a database without the agentbay format marker".into(),
            });
        }
        (Some(f), _) if f.as_slice() != FORMAT_VALUE => {
            return Err(StoreError::NotAStore {
                path: path.to_path_buf(),
                reason: format!(
                    "its format marker is {:?}",
                    String::from_utf8_lossy(f.as_ref())
                ),
            });
        }
        (Some(_), _) => read_version(kv, path)?,
    };
    if version > target {
        return Err(StoreError::NewerSchema {
            path: path.to_path_buf(),
            found: version,
            supported: target,
        });
    }
    let mut current = version;
    while current < target {
        let step = migrations
            .iter()
            .find(|m| m.from == current)
            .ok_or_else(|| StoreError::NotAStore {
                path: path.to_path_buf(),
                reason: format!("no migration from schema version {current}"),
            })?;
        tracing::info!(
            from = current,
            to = current + 1,
            what = step.description,
            "migrating store"
        );
        (step.apply)(kv)?;
        current += 1;
        kv.put(Table::Meta, VERSION_KEY.as_bytes(), &current.to_be_bytes())?;
        kv.flush()?;
    }
    Ok(current)
}

/// Whether the store says it is of a newer schema than this binary's
/// (which [`prepare`] then refuses): nothing in it is this binary's to
/// interpret, not even a record of an unfinished group (`redo.rs`).
pub(super) fn is_newer(kv: &dyn KvRead) -> Result<bool, StoreError> {
    Ok(kv
        .get(Table::Meta, VERSION_KEY.as_bytes())?
        .and_then(|raw| <[u8; 4]>::try_from(raw.as_ref()).ok())
        .is_some_and(|v| u32::from_be_bytes(v) > SCHEMA_VERSION))
}

fn read_version(kv: &dyn KvRead, path: &Path) -> Result<u32, StoreError> {
    let raw = kv
        .get(Table::Meta, VERSION_KEY.as_bytes())?
        .ok_or_else(|| StoreError::NotAStore {
            path: path.to_path_buf(),
            reason: "it has no schema version".into(),
        })?;
    let bytes: [u8; 4] = raw
        .as_slice()
        .try_into()
        .map_err(|_| StoreError::NotAStore {
            path: path.to_path_buf(),
            reason: "its schema version is unreadable".into(),
        })?;
    Ok(u32::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::super::engine::Open;
    use super::*;

    fn open(dir: &Path) -> Open {
        Open::as_found(dir, 1 << 20).unwrap()
    }

    #[test]
    fn fresh_store_gets_marker_and_version() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        assert_eq!(prepare(&db, dir.path(), true, &[]).unwrap(), SCHEMA_VERSION);
        assert_eq!(read_version(&db, dir.path()).unwrap(), SCHEMA_VERSION);
        // Reopening finds the same version.
        assert_eq!(
            prepare(&db, dir.path(), false, &[]).unwrap(),
            SCHEMA_VERSION
        );
    }

    #[test]
    fn migrations_run_forward_in_order() {
        fn add_greeting(kv: &dyn KvBulk) -> Result<(), StoreError> {
            kv.put(Table::Meta, b"greeting", b"hello")
        }
        fn shout_greeting(kv: &dyn KvBulk) -> Result<(), StoreError> {
            let g = kv
                .get(Table::Meta, b"greeting")?
                .expect("set by the previous step");
            kv.put(
                Table::Meta,
                b"greeting",
                String::from_utf8_lossy(&g).to_uppercase().as_bytes(),
            )
        }
        let v = SCHEMA_VERSION;
        let steps = [
            Migration {
                from: v,
                description: "add greeting",
                apply: add_greeting,
            },
            Migration {
                from: v + 1,
                description: "shout it",
                apply: shout_greeting,
            },
        ];
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        assert_eq!(prepare(&db, dir.path(), true, &[]).unwrap(), v);
        assert_eq!(prepare(&db, dir.path(), false, &steps).unwrap(), v + 2);
        assert_eq!(db.get(Table::Meta, b"greeting").unwrap().unwrap(), b"HELLO");
        assert_eq!(read_version(&db, dir.path()).unwrap(), v + 2);
    }

    #[test]
    fn version_7_removes_the_live_and_pool_lease_indexes_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        prepare(&db, dir.path(), true, &[]).unwrap();
        db.put(Table::Meta, VERSION_KEY.as_bytes(), &6u32.to_be_bytes())
            .unwrap();
        let index = db.db.open_tree(super::super::Table::Index.name()).unwrap();
        index.insert(b"~/lease-live/_/acme/0190", b"").unwrap();
        index.insert(b"~/lease-live/_/beta/0191", b"").unwrap();
        index.insert(b"acme/lease-state/Granted/0190", b"").unwrap();
        index.insert(b"acme/lease-pool/gpu/0190", b"").unwrap();
        index.insert(b"beta/lease-pool/a%2Fb/0191", b"").unwrap();
        index.insert(b"acme/run-pool/gpu/0193", b"").unwrap();
        index.insert(b"~/attempt-live/all/acme/0192", b"").unwrap();
        // On to this version: the later steps derive from records, and
        // there are none here.
        assert_eq!(
            prepare(&db, dir.path(), false, MIGRATIONS).unwrap(),
            SCHEMA_VERSION
        );
        let left: Vec<_> = index.iter().keys().map(|k| k.unwrap().to_vec()).collect();
        assert_eq!(
            left,
            vec![
                b"acme/lease-state/Granted/0190".to_vec(),
                b"acme/run-pool/gpu/0193".to_vec(),
                b"~/attempt-live/all/acme/0192".to_vec()
            ]
        );
    }

    #[test]
    fn newer_and_foreign_stores_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        prepare(&db, dir.path(), true, &[]).unwrap();
        assert!(!is_newer(&db).unwrap());
        db.put(Table::Meta, VERSION_KEY.as_bytes(), &99u32.to_be_bytes())
            .unwrap();
        assert!(is_newer(&db).unwrap(), "its records are not replayed");
        let err = prepare(&db, dir.path(), false, &[]).unwrap_err();
        assert!(
            matches!(err, StoreError::NewerSchema { found: 99, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("newer agentbay"), "{err}");

        let other = tempfile::tempdir().unwrap();
        let db = open(other.path());
        db.db.insert("something", "else").unwrap();
        let err = prepare(&db, other.path(), false, &[]).unwrap_err();
        assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
    }

    #[test]
    fn only_counted_indexes_keep_counts_after_version_6() {
        use crate::domain::TenantId;
        use crate::store::Table;
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        let acme = TenantId::parse("acme").unwrap();
        let attempt = crate::domain::attempt::tests::attempt();
        db.db
            .open_tree(Table::Attempts.name())
            .unwrap()
            .insert(
                crate::store::record_key(&acme, &attempt.attempt_id.to_string()),
                crate::store::encode(&attempt).unwrap(),
            )
            .unwrap();
        let index = db.db.open_tree(Table::Index.name()).unwrap();
        let count =
            |index: &str, value: &str| super::super::derived::count_key(&acme, index, value);
        let state = attempt.state.as_str();
        // As schema 5 left it: every tenant index counted, one count wrong.
        index
            .insert(count("lease-state", "Granted"), &3u64.to_be_bytes())
            .unwrap();
        index
            .insert(count("attempt-state", state), &9u64.to_be_bytes())
            .unwrap();
        index
            .insert(count("attempt-state", "Succeeded"), &2u64.to_be_bytes())
            .unwrap();
        let entry = b"acme/lease-state/Granted/0190".to_vec();
        index.insert(&entry, &[]).unwrap();
        for _ in 0..2 {
            recount_indexes(&db).unwrap();
            let counts: Vec<(Vec<u8>, u64)> = index
                .iter()
                .map(|kv| kv.unwrap())
                .filter(|(k, _)| super::super::derived::is_count_key(k))
                .map(|(k, v)| (k.to_vec(), crate::store::tx::read_u64(Some(&v))))
                .collect();
            assert_eq!(counts, vec![(count("attempt-state", state), 1)]);
            assert!(index.contains_key(&entry).unwrap(), "entries stay");
        }
    }

    #[test]
    fn releases_rejected_for_their_signer_alone_become_untrusted() {
        use crate::domain::release::{AdapterKind, Lifecycle, LoadState, LoadedRelease};
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path());
        let tree = db
            .db
            .open_tree(crate::store::Table::LoadedReleases.name())
            .unwrap();
        let release = |id: &str, reason: &str, contents: bool| LoadedRelease {
            release_id: id.into(),
            tenant_id: crate::domain::TenantId::parse("acme").unwrap(),
            agent_id: "triage".into(),
            version: "1.0.0".into(),
            manifest_hash: "sha256:m".into(),
            adapter_version: "builtin/1".into(),
            adapter: AdapterKind::Builtin,
            content_refs: if contents {
                [("manifest".to_string(), "sha256:m".to_string())].into()
            } else {
                Default::default()
            },
            state: LoadState::Rejected,
            reason: Some(reason.into()),
            lifecycle: Lifecycle::Published,
            in_flight_policy: None,
            signer: None,
            verified_at: chrono::Utc::now(),
            imported_at: chrono::Utc::now(),
            imported_by: "test".into(),
            trust_fingerprint: String::new(),
            revision: 3,
        };
        let cases = [
            (
                release(
                    "a",
                    "re-verification failed: signed by unknown publisher key ed25519:00; trusted keys: none",
                    true,
                ),
                LoadState::Untrusted,
            ),
            (
                release(
                    "b",
                    "re-verification failed: publisher key ed25519:00 (x) may not sign releases for tenant acme; it signs for demo",
                    true,
                ),
                LoadState::Untrusted,
            ),
            (
                release(
                    "c",
                    "re-verification failed: the signature does not verify with publisher key ed25519:00 (x)",
                    true,
                ),
                LoadState::Rejected,
            ),
            (
                release(
                    "d",
                    "signed by unknown publisher key ed25519:00; trusted keys: none",
                    false,
                ),
                LoadState::Rejected,
            ),
        ];
        for (r, _) in &cases {
            let key = format!("acme/{}", r.release_id);
            tree.insert(key.as_bytes(), crate::store::encode(r).unwrap())
                .unwrap();
        }
        untrusted_releases(&db).unwrap();
        untrusted_releases(&db).unwrap();
        for (r, expected) in &cases {
            let key = format!("acme/{}", r.release_id);
            let stored: LoadedRelease =
                crate::store::decode(key.as_bytes(), &tree.get(&key).unwrap().unwrap()).unwrap();
            assert_eq!(stored.state, *expected, "{}", r.release_id);
            assert_eq!(stored.revision, 3);
        }
    }
}
