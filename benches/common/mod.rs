//! What the benchmarks share: the time per row and a row of figures.

#![allow(dead_code)]

use std::fs::File;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agentbay::api::AppState;
use agentbay::domain::access::TenantScope;
use agentbay::domain::capacity::{PoolKind, PoolSpec, SecurityBoundary};
use agentbay::domain::tenant::TenantSpec;
use agentbay::domain::{ProjectId, TenantId};
use agentbay::releases::bundle::Bundle;

/// A throwaway PostgreSQL cluster (Debian's server, in a temporary
/// directory), for the PostgreSQL store's rows.
#[path = "../../tests/common/pg.rs"]
pub mod pg;

/// The cluster the PostgreSQL rows run on, synced as PostgreSQL 15's
/// defaults are; `None` (the rows are skipped, saying so) where no
/// PostgreSQL server is installed.
pub fn postgres() -> Option<&'static pg::PgCluster> {
    static CLUSTER: std::sync::OnceLock<Option<pg::PgCluster>> = std::sync::OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            if !pg::installed() {
                println!("(no PostgreSQL server is installed: the PostgreSQL rows are skipped)");
                return None;
            }
            let cluster = pg::PgCluster::start(true);
            cluster.remove_at_exit();
            Some(cluster)
        })
        .as_ref()
}

/// Store options on a new database of [`postgres`].
pub fn postgres_options(cluster: &pg::PgCluster) -> agentbay::store::StoreOptions {
    agentbay::store::StoreOptions {
        backend: agentbay::store::Backend::Postgres(agentbay::store::PgOptions {
            url: cluster.database(),
            ca_file: None,
            node: "bench".into(),
            advertise: "https://127.0.0.1:1".into(),
            fingerprint: String::new(),
            lease: Duration::from_secs(10),
            pair: Some(agentbay::domain::cluster::PairKey::generate().1),
        }),
        ..agentbay::store::StoreOptions::default()
    }
}

/// Time per row: `AGENTBAY_BENCH_SECONDS` (default 5).
pub fn seconds() -> Duration {
    let s = std::env::var("AGENTBAY_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5.0);
    Duration::from_secs_f64(s)
}

/// Operations done in a time, with their latencies.
pub struct Row {
    /// What was measured.
    pub label: String,
    /// Operations completed.
    pub count: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// One latency per operation.
    pub latencies: Vec<Duration>,
}

impl Row {
    /// Prints the label, operations per second, p50 and p99 in ms, and the
    /// rate as a multiple of `raw`, raw sled's rate in the same run (see
    /// [`raw_sled_reference`]).
    pub fn print(&mut self, raw: f64) {
        self.latencies.sort();
        let pct = |p: f64| {
            let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
            self.latencies.get(i).copied().unwrap_or_default()
        };
        let rate = self.count as f64 / self.elapsed.as_secs_f64();
        println!(
            "{:<62} {:>10.0} {:>10.2} {:>10.2} {:>8.3}",
            self.label,
            rate,
            pct(0.50).as_secs_f64() * 1000.0,
            pct(0.99).as_secs_f64() * 1000.0,
            rate / raw,
        );
    }
}

/// Durable writes in a time: raw sled's ([`raw_sled`]) or the store's.
pub struct RawRun {
    /// What was measured.
    pub label: String,
    /// Writes made durable.
    pub writes: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Bytes on disk at the end.
    pub disk: u64,
}

impl RawRun {
    /// Writes per second.
    pub fn rate(&self) -> f64 {
        self.writes as f64 / self.elapsed.as_secs_f64()
    }
}

/// Bytes of the files under `path`.
pub fn dir_size(path: &Path) -> u64 {
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| {
                    let m = e.metadata().unwrap();
                    if m.is_dir() {
                        dir_size(&e.path())
                    } else {
                        m.len()
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

/// A sled database of its own in `dir`, with no flusher of its own, and
/// its data file for fdatasync.
fn raw_db(dir: &Path) -> (sled::Db, File) {
    let db = sled::Config::new()
        .path(dir)
        .flush_every_ms(None)
        .open()
        .unwrap();
    let file = File::options()
        .read(true)
        .write(true)
        .open(dir.join("db"))
        .unwrap();
    (db, file)
}

/// Raw sled, one writer, for [`seconds`]: insert, flush, (fdatasync), next.
pub fn raw_sled_one(sync: bool) -> RawRun {
    let dir = tempfile::tempdir().unwrap();
    let (db, file) = raw_db(dir.path());
    let value = vec![7u8; 200];
    let deadline = Instant::now() + seconds();
    let start = Instant::now();
    let mut n = 0u64;
    while Instant::now() < deadline {
        db.insert(n.to_be_bytes(), value.as_slice()).unwrap();
        db.flush().unwrap();
        if sync {
            file.sync_data().unwrap();
        }
        n += 1;
    }
    RawRun {
        label: format!(
            "raw sled, 1 writer, flush each{}",
            if sync { " + fdatasync" } else { "" }
        ),
        writes: n,
        elapsed: start.elapsed(),
        disk: dir_size(dir.path()),
    }
}

/// Raw sled driven by one group-commit thread, for [`seconds`]: `writers`
/// threads insert 200-byte values and wait for the flusher, which flushes
/// (and, with `sync`, fdatasyncs) once per batch. The ceiling the store
/// facade is measured against.
pub fn raw_sled(writers: usize, sync: bool) -> RawRun {
    let dir = tempfile::tempdir().unwrap();
    let (db, file) = raw_db(dir.path());
    let (tx, rx) = mpsc::channel::<mpsc::SyncSender<()>>();
    let flusher = {
        let db = db.clone();
        std::thread::spawn(move || {
            while let Ok(first) = rx.recv() {
                let mut batch = vec![first];
                while let Ok(more) = rx.try_recv() {
                    batch.push(more);
                }
                db.flush().unwrap();
                if sync {
                    file.sync_data().unwrap();
                }
                for w in batch {
                    let _ = w.send(());
                }
            }
        })
    };
    let deadline = Instant::now() + seconds();
    let start = Instant::now();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let db = db.clone();
            let tx = tx.clone();
            std::thread::spawn(move || {
                let value = vec![7u8; 200];
                let mut n = 0u64;
                let (done_tx, done_rx) = mpsc::sync_channel(1);
                while Instant::now() < deadline {
                    let key = ((w as u64) << 40 | n).to_be_bytes();
                    db.insert(key, value.as_slice()).unwrap();
                    tx.send(done_tx.clone()).unwrap();
                    done_rx.recv().unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let writes: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let elapsed = start.elapsed();
    drop(tx);
    flusher.join().unwrap();
    RawRun {
        label: format!(
            "raw sled, {writers} writers, one group-commit thread{}",
            if sync { " + fdatasync" } else { "" }
        ),
        writes,
        elapsed,
        disk: dir_size(dir.path()),
    }
}

/// Raw sled's rate with 32 writers and fdatasync, measured now and printed
/// as a row: every bench prints its rows as multiples of it, so that one
/// run gives ratios that hold on whatever machine it ran.
pub fn raw_sled_reference() -> f64 {
    let raw = raw_sled(32, true);
    let rate = raw.rate();
    println!(
        "{:<62} {:>10.0} {:>10} {:>10} {:>8.3}",
        "raw sled, 32 writers, group commit + fdatasync (reference)", rate, "-", "-", 1.0
    );
    rate
}

/// An agent pool large enough that no request waits: the figures measure
/// the work, not queueing.
pub fn big_pool() -> PoolSpec {
    PoolSpec {
        tenant_id: None,
        kind: PoolKind::AgentRuntime,
        security_boundary: SecurityBoundary::Shared,
        region: "local".into(),
        node_profile: "large".into(),
        min_size: 1000,
        max_size: 1000,
        internet_egress: false,
        autoscaling: None,
        state: None,
    }
}

/// Tenant `demo` (platform edition: no quota holds it back) with project
/// `load`, a [`big_pool`] and the example external triage release
/// (`triage-external-1.0.0`), whose attempts wait for an adapter.
pub async fn external_site(state: &AppState) -> (TenantScope, ProjectId) {
    let tenant = TenantId::parse("demo").unwrap();
    state
        .capacity
        .put_tenant(
            tenant.clone(),
            TenantSpec {
                edition: "platform".into(),
                ..TenantSpec::default()
            },
        )
        .await
        .unwrap();
    let project = ProjectId::parse("load").unwrap();
    state
        .capacity
        .put_project(tenant.clone(), project.clone(), None)
        .await
        .unwrap();
    state
        .capacity
        .set_pool("bench-agents", big_pool())
        .await
        .unwrap();
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("packaging/examples/releases/triage-external");
    // Signed as the demo signs it: with the data directory's own demo key.
    let pair = agentbay::releases::signing::instance_demo_pair(&state.config.data_dir).unwrap();
    let bundle = Bundle::from_dir(&example, &state.releases.limits)
        .unwrap()
        .signed(&pair)
        .unwrap();
    let report = state.releases.check(&bundle);
    state
        .releases
        .record(bundle, report, "bench")
        .await
        .unwrap();
    (TenantScope::new(tenant), project)
}
