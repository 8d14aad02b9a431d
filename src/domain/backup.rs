//! What is known of the scheduled backups: the newest one and how it went,
//! as `/readyz`, the console's System page and the metrics report them.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// The newest backup and how it went.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastBackup {
    /// The file.
    #[schema(value_type = String)]
    pub file: PathBuf,
    /// When it was taken (appliance clock).
    pub at: DateTime<Utc>,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Records it holds (when taken or verified by this process).
    pub records: Option<u64>,
    /// Whether it verified; `None` when found on disk at start and not
    /// verified since.
    pub verified: Option<bool>,
}

/// What `/readyz` and the System page say of backups.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupReport {
    /// Where backups go.
    #[schema(value_type = String)]
    pub dir: PathBuf,
    /// Minutes between backups.
    pub interval_minutes: u64,
    /// How many are kept.
    pub keep: u32,
    /// The newest backup.
    pub last: Option<LastBackup>,
    /// Its age in seconds.
    pub age_seconds: Option<i64>,
    /// The last failure, if the last attempt failed.
    pub error: Option<String>,
}
