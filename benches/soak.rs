//! Soak: a simulated year of a site, on the manual clock, to show that the
//! appliance's cost is flat in its age once retention is reached.
//!
//! A whole appliance in-process with the default retention (payloads 30
//! days, history 90 days). Every simulated day, `AGENTBAY_SOAK_PER_DAY`
//! runs (default 40; the site is about 3,000, run with
//! `AGENTBAY_SOAK_PER_DAY=3000`) of the external triage release go the
//! whole way through the services an adapter uses: submitted (a capacity
//! lease each), claimed, started, a model call and a tool call with a few KB
//! of request and result each, checkpoints with a few KB of adapter state,
//! a decision on every tenth, and a verified outcome. Then the clock moves a
//! day and the workers run (the Purger among them).
//!
//! Every simulated month, and at the end, it prints: records live, bytes on
//! disk, logical bytes (keys and values of every record), the size of a
//! rewritten copy (a backup restored: what `agentbay compact` writes), the
//! bench's resident memory, the time to restart (`agentbay serve` on that
//! copy, until `/readyz` answers) and the restarted appliance's resident
//! memory a second later, the p95 of ListRuns and of the busiest list
//! pages' reads (runs by state, attempts, leases, the decision inbox), and
//! the Purger's backlog. `AGENTBAY_SOAK_DAYS` sets the days (default 400).
//!
//! `cargo bench --bench soak`

use std::time::{Duration, Instant};

use agentbay::api::AppState;
use agentbay::app::{self, Clocks};
use agentbay::capacity::LeaseFilter;
use agentbay::config::{Config, DemoConfig};
use agentbay::domain::ProjectId;
use agentbay::domain::access::TenantScope;
use agentbay::domain::attempt::CallKind;
use agentbay::runs::{RunFilter, RunRequest};
use agentbay::runtime::{BeginCall, Completion, Report};
use serde_json::json;

mod common;

use common::external_site;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A few KB of JSON that differs per run (so content is not all shared).
fn payload(kind: &str, i: usize, kb: usize) -> serde_json::Value {
    json!({
        "customer": format!("c{i}"),
        "kind": kind,
        "n": i,
        "text": format!("{kind} {i} ").repeat(kb * 1024 / (kind.len() + 8)),
    })
}

/// One run the whole way to its verified outcome.
async fn one_run(state: &AppState, scope: &TenantScope, project: &ProjectId, i: usize) {
    let run = state
        .runs
        .submit(
            scope,
            RunRequest {
                project_id: project.clone(),
                release_id: "triage-external-1.0.0".into(),
                input: json!({"customer": format!("c{i}"), "text": "checkout is slow"}),
                limits: None,
                max_attempts: 0,
                max_corrections: None,
                request_id: None,
                run_key: None,
                labels: Default::default(),
                environment_id: None,
                submitted_by: "soak".into(),
            },
        )
        .await
        .expect("submit");
    let ticket = state
        .runtime
        .claim(scope, "triage", "soak", Duration::from_secs(10))
        .await
        .expect("claim")
        .expect("an attempt to claim");
    let a = &ticket.attempt;
    assert_eq!(a.run_id, run.run_id);
    let (id, token) = (a.attempt_id, a.fencing_token);
    state
        .runtime
        .start_attempt(
            scope,
            id,
            token,
            a.adapter_version.clone(),
            a.checkpoint_format,
            None,
        )
        .await
        .expect("start");
    for (kind, target) in [
        (CallKind::Model, "triage-scripted"),
        (CallKind::Tool, "lookup-ticket"),
    ] {
        let begun = state
            .runtime
            .begin_call(
                scope,
                id,
                token,
                BeginCall {
                    kind,
                    target: target.into(),
                    request: payload("request", i, 3),
                    context_tokens: (kind == CallKind::Model).then_some(1200),
                    approval_id: None,
                    state: Some(serde_json::to_vec(&payload("state", i, 2)).unwrap()),
                    context_since: None,
                    in_process: false,
                    approval_asked: false,
                },
            )
            .await
            .expect("begin");
        state
            .runtime
            .complete_call(
                scope,
                id,
                token,
                Completion {
                    call_id: begun
                        .call_id
                        .filter(|_| begun.outcome == agentbay::runtime::BeginOutcome::Started)
                        .unwrap_or_else(|| panic!("{target} was not started: {:?}", begun.reason)),
                    ok: true,
                    result: Some(serde_json::to_vec(&payload("result", i, 3)).unwrap()),
                    receipt: Some(serde_json::to_vec(&json!({"receipt": i})).unwrap()),
                    error: None,
                    state: Some(serde_json::to_vec(&payload("observed", i, 2)).unwrap()),
                    usage: None,
                    latency_ms: None,
                },
            )
            .await
            .expect("complete");
    }
    state
        .runtime
        .report(
            scope,
            id,
            token,
            Report {
                succeeded: true,
                output: Some(
                    json!({"severity": "low", "summary": format!("run {i}"), "paged": false}),
                ),
                failure_class: None,
                reason: None,
                error: None,
            },
        )
        .await
        .expect("report");
}

fn p95(mut times: Vec<Duration>) -> f64 {
    times.sort();
    let i = ((times.len() as f64 - 1.0) * 0.95).round() as usize;
    times[i].as_secs_f64() * 1000.0
}

/// The p95 of the list reads the busiest pages and ListRuns make.
async fn list_p95(state: &AppState, scope: &TenantScope) -> (f64, f64) {
    let mut runs = Vec::new();
    let mut pages = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        state
            .runs
            .list(scope, &RunFilter::default(), None, 50)
            .unwrap();
        runs.push(t.elapsed());
        let t = Instant::now();
        state
            .runs
            .list(
                scope,
                &RunFilter {
                    state: Some(agentbay::domain::run::RunState::Succeeded),
                    ..Default::default()
                },
                None,
                51,
            )
            .unwrap();
        state.runs.count(scope, &RunFilter::default()).unwrap();
        state.runtime.page(scope, None, None, 51, |_| true).unwrap();
        state.runtime.count(scope, None).unwrap();
        state.runtime.pending_decisions(scope, 8).unwrap();
        state
            .capacity
            .leases(Some(scope), &LeaseFilter::default(), 51)
            .await
            .unwrap();
        pages.push(t.elapsed());
    }
    (p95(runs), p95(pages))
}

fn rss_mib(status: &str) -> f64 {
    std::fs::read_to_string(status)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// What a restart on a copy of the store (a backup taken while serving,
/// restored: the same rewrite as `agentbay compact`) shows.
struct Restart {
    /// From `agentbay serve` until it answers `/readyz` with 200.
    took: Duration,
    /// The restored store's size on disk, in MiB.
    copy_mib: f64,
    /// The restarted appliance's resident memory a second after it is
    /// ready, in MiB.
    rss_mib: f64,
}

fn dir_mib(dir: &std::path::Path) -> f64 {
    fn bytes(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir).map_or(0, |entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
    }
    bytes(dir) as f64 / 1_048_576.0
}

async fn restart(state: &AppState, scratch: &std::path::Path) -> Restart {
    let _ = std::fs::remove_dir_all(scratch);
    std::fs::create_dir_all(scratch).unwrap();
    let file = scratch.join("soak.backup");
    let out = std::fs::File::create(&file).unwrap();
    let files = agentbay::tls::backup_files(&state.config.data_dir.join("tls"));
    state.store.backup(out, files).await.unwrap();
    let data = scratch.join("data");
    agentbay::store::restore_into(&file, &data).unwrap();
    let copy_mib = dir_mib(&data.join("store"));
    let served = serve_until_ready(&data).await;
    let _ = std::fs::remove_dir_all(scratch);
    Restart { copy_mib, ..served }
}

/// `agentbay serve` on `data` until `/readyz` answers 200, and its resident
/// memory a second later; then it is killed.
async fn serve_until_ready(data: &std::path::Path) -> Restart {
    let bin = std::env::var("AGENTBAY_BIN").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/release/agentbay").to_string()
    });
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let started = Instant::now();
    let mut command = std::process::Command::new(&bin);
    // The benches' own settings (AGENTBAY_BIN, AGENTBAY_SOAK_*,
    // AGENTBAY_BENCH_*) are not configuration keys: the appliance would
    // refuse them.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("AGENTBAY_") {
            command.env_remove(name);
        }
    }
    let mut child = command
        .args(["serve", "--manual-clock", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(data)
        .env("AGENTBAY_DEMO__ENABLED", "false")
        .env("AGENTBAY_LOG__LEVEL", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("{bin}: {e} (build it with cargo build --release, or set AGENTBAY_BIN)")
        });
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let took = loop {
        if let Ok(r) = client
            .get(format!("https://127.0.0.1:{port}/readyz"))
            .send()
            .await
            && r.status() == 200
        {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no /readyz within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_mib = rss_mib(&format!("/proc/{}/status", child.id()));
    let _ = child.kill();
    let _ = child.wait();
    Restart {
        took,
        copy_mib: 0.0,
        rss_mib,
    }
}

/// One row of figures.
async fn report(
    state: &AppState,
    scope: &TenantScope,
    day: usize,
    scratch: &std::path::Path,
    worst: &mut (f64, f64, f64),
) {
    let backlog = state
        .workers
        .statuses()
        .into_iter()
        .find(|w| w.name == "Purger")
        .and_then(|w| w.last_message)
        .and_then(|m| m.rsplit("backlog ").next().map(str::to_string))
        .unwrap_or_default();
    let restart = restart(state, scratch).await;
    let (runs_p95, pages_p95) = list_p95(state, scope).await;
    let records: usize = state.store.table_sizes().values().sum();
    let disk = state.store.size_on_disk().unwrap_or(0) as f64 / 1_048_576.0;
    let logical = state.store.logical_bytes().unwrap() as f64 / 1_048_576.0;
    let live_runs = state
        .runs
        .count(scope, &RunFilter::default())
        .unwrap()
        .unwrap_or(0);
    *worst = (
        worst.0.max(restart.took.as_secs_f64() * 1000.0),
        worst.1.max(runs_p95),
        worst.2.max(pages_p95),
    );
    println!(
        "{day:>5} {live_runs:>9} {records:>9} {disk:>10.1} {logical:>10.1} {:>7.2} {:>10.1} {:>7.2} {:>8.1} {:>8.1} {:>10.0} {runs_p95:>10.2} {pages_p95:>8.2} {backlog:>8}",
        disk / logical.max(0.001),
        restart.copy_mib,
        restart.copy_mib / logical.max(0.001),
        rss_mib("/proc/self/status"),
        restart.rss_mib,
        restart.took.as_secs_f64() * 1000.0,
    );
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let per_day = env("AGENTBAY_SOAK_PER_DAY", 40);
    let days = env("AGENTBAY_SOAK_DAYS", 400);
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        demo: DemoConfig { enabled: false },
        ..Config::default()
    };
    let clocks = Clocks::manual_at(chrono::Utc::now());
    let manual = clocks.manual.clone().expect("a manual clock");
    println!(
        "soak: {per_day} runs a day for {days} days; retention: payloads {} days, history {} days; store cache {} MiB",
        config.retention.payload_days, config.retention.history_days, config.store.cache_mb
    );
    // Tools start through the spawner this build made.
    #[cfg(unix)]
    agentbay::runtime::confine::spawner::set_program(std::path::Path::new(env!(
        "CARGO_BIN_EXE_agentbay"
    )));
    let running = app::start(config.clone(), clocks.clone()).await.unwrap();
    let state = running.state.clone();
    let (scope, project) = external_site(&state).await;
    println!(
        "{:>5} {:>9} {:>9} {:>10} {:>10} {:>7} {:>10} {:>7} {:>8} {:>8} {:>10} {:>10} {:>8} {:>8}",
        "day",
        "runs",
        "records",
        "disk MiB",
        "logic MiB",
        "ratio",
        "copy MiB",
        "ratio",
        "RSS MiB",
        "srv RSS",
        "restart ms",
        "ListRuns",
        "pages",
        "backlog"
    );
    let scratch = dir.path().join("restart");
    let started = Instant::now();
    let mut n = 0;
    let mut worst = (0.0f64, 0.0f64, 0.0f64);
    for day in 1..=days {
        for _ in 0..per_day {
            one_run(&state, &scope, &project, n).await;
            n += 1;
        }
        manual.advance(Duration::from_secs(86_400));
        let pass = state.workers.run_now("Purger").await.unwrap();
        assert!(pass.last_ok, "{:?}", pass.last_message);
        if day % 30 == 0 || day == days {
            report(&state, &scope, day, &scratch, &mut worst).await;
        }
    }
    println!(
        "{n} runs in {:.0} s; worst restart {:.0} ms (target <= 1000), worst ListRuns p95 {:.2} ms and list pages p95 {:.2} ms (target <= 50)",
        started.elapsed().as_secs_f64(),
        worst.0,
        worst.1,
        worst.2
    );
    let stats = state.store.commit_stats();
    println!(
        "store reopens (store.snapshot_every_mb = {}): {}, the longest pause {} ms",
        config.store.snapshot_every_mb, stats.reopens, stats.longest_reopen_ms
    );
    drop(state);
    running.stop().await.unwrap();
    // The worst restart: the soaked store itself, after every simulated day
    // in one process (sled reads the log written since it last opened).
    // Copied as it lies on disk after the stop: this process may still hold
    // sled's lock on the original.
    let data = dir.path().join("soaked");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(dir.path().join("data"))
        .arg(&data)
        .status()
        .unwrap();
    assert!(copied.success());
    let _ = std::fs::remove_dir_all(data.join("run"));
    let took = serve_until_ready(&data).await;
    println!(
        "restart on the soaked store itself: {:.0} ms; again: {:.0} ms",
        took.took.as_secs_f64() * 1000.0,
        serve_until_ready(&data).await.took.as_secs_f64() * 1000.0
    );
}
