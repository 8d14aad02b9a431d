//! Scheduled backups: the recovery point, on the appliance clock.
//!
//! Every `backup.interval_minutes` the ScheduledBackup worker writes a
//! backup through the same path as `agentbay backup` (a consistent snapshot
//! taken on the store's writer, with the TLS material), into
//! `backup.dir/agentbay-<UTC time>.backup`, private (0600), synced and
//! renamed into place only when complete. It then verifies it as
//! `agentbay backup verify` does (the checksum, and that the restored store
//! opens), deletes the oldest beyond `backup.keep`, and records the outcome
//! for `/readyz`, the console's System page and
//! `agentbay_backup_age_seconds`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use parking_lot::Mutex;

use super::datadir::create_private_dir;
use super::{BackupSummary, Store, StoreError, StoreOptions, restore_into};
use crate::domain::backup::{BackupReport, LastBackup};
use crate::telemetry::names;
use crate::worker::{RetryKind, Schedule, Worker};

/// Scheduled backups: configuration and the last outcome.
pub struct Backups {
    store: Store,
    data_dir: PathBuf,
    dir: PathBuf,
    interval_minutes: u64,
    keep: u32,
    /// When this process started: the recovery point's clock starts here
    /// when no backup has been taken yet.
    started: DateTime<Utc>,
    state: Mutex<(Option<LastBackup>, Option<String>)>,
}

const PREFIX: &str = "agentbay-";
const SUFFIX: &str = ".backup";

impl Backups {
    /// Scheduled backups into `dir`; the newest backup already there (from
    /// before a restart) counts as the last one.
    pub fn new(
        store: Store,
        data_dir: PathBuf,
        dir: PathBuf,
        interval_minutes: u64,
        keep: u32,
        started: DateTime<Utc>,
    ) -> Result<Arc<Backups>, StoreError> {
        create_private_dir(&dir)?;
        let last = backups_in(&dir)?.pop().and_then(|(at, file)| {
            let size_bytes = std::fs::metadata(&file).ok()?.len();
            Some(LastBackup {
                file,
                at,
                size_bytes,
                records: None,
                verified: None,
            })
        });
        Ok(Arc::new(Backups {
            store,
            data_dir,
            dir,
            interval_minutes,
            keep,
            started,
            state: Mutex::new((last, None)),
        }))
    }

    /// The state for `/readyz` and the System page; also sets the backup
    /// gauges the recovery-point alert reads.
    pub fn report(&self, now: DateTime<Utc>) -> BackupReport {
        let (last, error) = self.state.lock().clone();
        let age_seconds = last.as_ref().map(|l| (now - l.at).num_seconds().max(0));
        if let Some(age) = age_seconds {
            metrics::gauge!(names::BACKUP_AGE).set(age as f64);
        }
        metrics::gauge!(names::BACKUP_ENABLED).set(1.0);
        metrics::gauge!(names::BACKUP_INTERVAL).set((self.interval_minutes * 60) as f64);
        // A backup found on disk at start was verified when it was taken.
        let success = last
            .as_ref()
            .filter(|l| l.verified != Some(false))
            .map_or(self.started, |l| l.at);
        metrics::gauge!(names::BACKUP_LAST_SUCCESS).set(success.timestamp() as f64);
        metrics::gauge!(names::BACKUP_LAST_RESULT).set(if error.is_none() { 1.0 } else { 0.0 });
        BackupReport {
            dir: self.dir.clone(),
            interval_minutes: self.interval_minutes,
            keep: self.keep,
            last,
            age_seconds,
            error,
        }
    }

    /// Takes, verifies and rotates one backup.
    pub async fn take(&self, now: DateTime<Utc>) -> Result<LastBackup, StoreError> {
        let result = self.take_inner(now).await;
        let mut state = self.state.lock();
        match &result {
            Ok(last) => *state = (Some(last.clone()), None),
            Err(e) => {
                metrics::counter!(names::BACKUP_FAILURES).increment(1);
                state.1 = Some(e.to_string());
            }
        }
        drop(state);
        self.report(now);
        result
    }

    async fn take_inner(&self, now: DateTime<Utc>) -> Result<LastBackup, StoreError> {
        // Two backups of one instant (an operator's on top of the
        // schedule's) get numbered names.
        let stamp = now.format("%Y%m%dT%H%M%SZ").to_string();
        let (name, file) = (1..)
            .map(|n| match n {
                1 => format!("{PREFIX}{stamp}{SUFFIX}"),
                n => format!("{PREFIX}{stamp}-{n}{SUFFIX}"),
            })
            .map(|name| (name.clone(), self.dir.join(name)))
            .find(|(_, f)| !f.exists())
            .expect("a free name");
        let partial = self.dir.join(format!("{name}.partial"));
        let files = super::datadir::backup_files(&self.data_dir);
        let summary = self.store.backup_file(&partial, files).await?;
        let (p, f) = (partial.clone(), file.clone());
        tokio::task::spawn_blocking(move || -> Result<(), StoreError> {
            std::fs::rename(&p, &f).map_err(StoreError::io("moving the backup into place"))?;
            if let Some(dir) = f.parent() {
                let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
            }
            Ok(())
        })
        .await
        .map_err(|e| StoreError::Backup(e.to_string()))??;
        let verify_file = file.clone();
        let scratch = self.dir.clone();
        let verified = tokio::task::spawn_blocking(move || verify(&verify_file, &scratch))
            .await
            .map_err(|e| StoreError::Backup(e.to_string()))?;
        let verified = match verified {
            Ok(v) if v.records == summary.records => true,
            Ok(v) => {
                return Err(StoreError::Backup(format!(
                    "{} holds {} records, but {} were written",
                    file.display(),
                    v.records,
                    summary.records
                )));
            }
            Err(e) => {
                return Err(StoreError::Backup(format!(
                    "{} did not verify: {e}",
                    file.display()
                )));
            }
        };
        let size_bytes = std::fs::metadata(&file)
            .map_err(StoreError::io("reading the backup's size"))?
            .len();
        self.rotate()?;
        tracing::info!(file = %file.display(), records = summary.records, size_bytes, "scheduled backup taken and verified");
        Ok(LastBackup {
            file,
            at: now,
            size_bytes,
            records: Some(summary.records),
            verified: Some(verified),
        })
    }

    /// Deletes the oldest backups beyond `keep`.
    fn rotate(&self) -> Result<(), StoreError> {
        let all = backups_in(&self.dir)?;
        let excess = all.len().saturating_sub(self.keep as usize);
        for (_, file) in all.into_iter().take(excess) {
            std::fs::remove_file(&file)
                .map_err(StoreError::io(format!("deleting {}", file.display())))?;
            tracing::info!(file = %file.display(), "old backup deleted");
        }
        Ok(())
    }
}

/// The backups in `dir`, oldest first, with the time in their names.
fn backups_in(dir: &Path) -> Result<Vec<(DateTime<Utc>, PathBuf)>, StoreError> {
    let mut out = Vec::new();
    for entry in
        std::fs::read_dir(dir).map_err(StoreError::io(format!("reading {}", dir.display())))?
    {
        let entry = entry.map_err(StoreError::io("reading the backup directory"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stamp) = name
            .strip_prefix(PREFIX)
            .and_then(|n| n.strip_suffix(SUFFIX))
        else {
            continue;
        };
        let (stamp, n) = match stamp.split_once('-') {
            Some((s, n)) => (s, n.parse::<u32>().unwrap_or(0)),
            None => (stamp, 1),
        };
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(stamp, "%Y%m%dT%H%M%SZ") {
            out.push((t.and_utc(), n, entry.path()));
        }
    }
    out.sort();
    let out = out.into_iter().map(|(t, _, p)| (t, p)).collect();
    Ok(out)
}

/// Checks a backup: its checksum (every byte read), and that the store it
/// restores opens. Restores into a scratch directory under `scratch`,
/// which is removed afterwards.
pub fn verify(file: &Path, scratch: &Path) -> Result<BackupSummary, StoreError> {
    let dir = scratch.join(format!(".verify-{}", crate::domain::ids::new_id().simple()));
    let result = (|| {
        let summary = restore_into(file, &dir)?;
        let store = Store::open(
            &dir.join("store"),
            &StoreOptions {
                cache_bytes: 8 * 1024 * 1024,
                sync_data: false,
                snapshot_every_bytes: 0,
                ..StoreOptions::default()
            },
        )?;
        let tables = store.table_sizes();
        store.close()?;
        if tables.get("meta").copied().unwrap_or(0) == 0 {
            return Err(StoreError::Backup(
                "the restored store has no meta records".into(),
            ));
        }
        Ok(summary)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(dir.with_extension("restoring"));
    result
}

/// The ScheduledBackup worker.
pub struct ScheduledBackup {
    /// The schedule.
    pub backups: Arc<Backups>,
}

impl Worker for ScheduledBackup {
    fn name(&self) -> &'static str {
        "ScheduledBackup"
    }

    fn schedule(&self) -> Schedule {
        Schedule::seconds(self.backups.interval_minutes * 60)
    }

    fn retry(&self) -> RetryKind {
        RetryKind::Fixed
    }

    fn run(&self, now: DateTime<Utc>) -> BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(async move {
            let last = self.backups.take(now).await?;
            Ok(format!(
                "{} written ({} bytes) and verified",
                last.file.display(),
                last.size_bytes
            ))
        })
    }
}
