//! Durable writes per second through the store facade, beside raw sled in
//! the same run.
//!
//! Every row writes 200-byte records and counts a record only once it is
//! flushed (and, where the row says so, fdatasync'ed). Run with
//! `cargo bench --bench store`; `AGENTBAY_BENCH_SECONDS` sets the time per
//! row (default 5).

use std::sync::Arc;
use std::time::Instant;

use agentbay::domain::TenantId;

mod common;

use agentbay::domain::access::TenantScope;
use agentbay::store::{Record, Store, StoreError, StoreOptions, Table};
use common::{RawRun, dir_size, raw_sled, raw_sled_one, seconds};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Row {
    tenant: TenantId,
    id: String,
    body: String,
}

impl Record for Row {
    const TABLE: Table = Table::Clients;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant
    }
    fn id(&self) -> String {
        self.id.clone()
    }
}

/// The store facade: `writers` tasks each committing one record per
/// transaction and waiting for it to be durable.
fn facade(writers: usize, sync: bool) -> RawRun {
    let options = StoreOptions {
        sync_data: sync,
        ..StoreOptions::default()
    };
    let label = format!(
        "store facade, {writers} writers{}",
        if sync {
            " + fdatasync"
        } else {
            ", no fdatasync"
        },
    );
    facade_on(options, writers, label)
}

/// The store facade on the PostgreSQL store (synced commits, as
/// PostgreSQL 15's defaults are); skipped where none is installed.
fn facade_postgres(writers: usize) -> Option<RawRun> {
    let cluster = common::postgres()?;
    Some(facade_on(
        common::postgres_options(cluster),
        writers,
        format!("store facade on PostgreSQL, {writers} writers (synced commit)"),
    ))
}

fn facade_on(options: StoreOptions, writers: usize, label: String) -> RawRun {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store"), &options).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let deadline = Instant::now() + seconds();
    let start = Instant::now();
    let body = Arc::new("x".repeat(200));
    let writes: u64 = runtime.block_on(async {
        let tasks: Vec<_> = (0..writers)
            .map(|w| {
                let store = store.clone();
                let body = body.clone();
                tokio::spawn(async move {
                    let scope = TenantScope::new(TenantId::parse("bench").unwrap());
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        let row = Row {
                            tenant: scope.tenant().clone(),
                            id: format!("{w:03}-{n:012}"),
                            body: body.as_str().to_string(),
                        };
                        let s = scope.clone();
                        store
                            .transact(move |tx| tx.put(&s, &row))
                            .await
                            .map_err(|e: StoreError| e)
                            .unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        total
    });
    let elapsed = start.elapsed();
    let stats = store.commit_stats();
    store.close().unwrap();
    eprintln!(
        "{label}: {:.1} commits per flush",
        stats.commits as f64 / stats.flushes.max(1) as f64
    );
    RawRun {
        label,
        writes,
        elapsed,
        disk: dir_size(dir.path()),
    }
}

/// Records written before the store is opened again
/// (`AGENTBAY_BENCH_RECORDS`, default 1,000,000).
fn records() -> u64 {
    std::env::var("AGENTBAY_BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// Fills a store with `records()` records (1,000 per transaction), closes
/// it, and times opening it again: what a restart of the appliance pays
/// for its store.
fn reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let total = records();
    let store = Store::open(&path, &StoreOptions::default()).unwrap();
    let scope = TenantScope::new(TenantId::parse("bench").unwrap());
    let body = "x".repeat(200);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut written = 0u64;
    while written < total {
        let batch: Vec<Row> = (written..(written + 1000).min(total))
            .map(|n| Row {
                tenant: scope.tenant().clone(),
                id: format!("{n:012}"),
                body: body.clone(),
            })
            .collect();
        written += batch.len() as u64;
        let s = scope.clone();
        runtime
            .block_on(store.transact(move |tx| {
                for row in &batch {
                    tx.put(&s, row)?;
                }
                Ok::<_, StoreError>(())
            }))
            .unwrap();
    }
    store.close().unwrap();
    drop(store);
    let start = Instant::now();
    let store = Store::open(&path, &StoreOptions::default()).unwrap();
    let took = start.elapsed();
    let last: Option<Row> = store.get(&scope, &format!("{:012}", total - 1)).unwrap();
    assert!(last.is_some(), "the last record reads back");
    store.close().unwrap();
    println!(
        "store opened again after {written} records of 200 bytes: {:.0} ms (disk {:.1} MiB)",
        took.as_secs_f64() * 1000.0,
        dir_size(dir.path()) as f64 / (1024.0 * 1024.0)
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects rows.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    type Row = (&'static str, Box<dyn Fn() -> Option<RawRun>>);
    let rows: Vec<Row> = vec![
        ("raw-1", Box::new(|| Some(raw_sled_one(false)))),
        ("raw-1-sync", Box::new(|| Some(raw_sled_one(true)))),
        ("raw-32", Box::new(|| Some(raw_sled(32, false)))),
        ("raw-32-sync", Box::new(|| Some(raw_sled(32, true)))),
        ("facade-1", Box::new(|| Some(facade(1, true)))),
        ("facade-32-nosync", Box::new(|| Some(facade(32, false)))),
        ("facade-32", Box::new(|| Some(facade(32, true)))),
        ("postgres-32", Box::new(|| facade_postgres(32))),
    ];
    println!(
        "durable 200-byte writes per second ({:?} per row)",
        seconds()
    );
    println!("{:<70} {:>12} {:>12}", "row", "writes/s", "disk MiB");
    let mut results = Vec::new();
    for (name, run) in rows {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let Some(outcome) = run() else { continue };
        println!(
            "{:<70} {:>12.0} {:>12.1}",
            outcome.label,
            outcome.rate(),
            outcome.disk as f64 / (1024.0 * 1024.0)
        );
        results.push((name, outcome));
    }
    if filter.as_deref().is_none_or(|f| "reopen".contains(f)) {
        reopen();
    }
    let rate = |n: &str| results.iter().find(|(k, _)| *k == n).map(|(_, o)| o.rate());
    if let (Some(facade), Some(raw)) = (rate("facade-32"), rate("raw-32-sync")) {
        println!(
            "facade / raw sled group commit, 32 writers, both with fdatasync: {:.2}x",
            facade / raw
        );
    }
    if let (Some(facade), Some(raw)) = (rate("facade-32-nosync"), rate("raw-32")) {
        println!(
            "facade / raw sled group commit, 32 writers, neither with fdatasync: {:.2}x",
            facade / raw
        );
    }
}
