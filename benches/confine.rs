//! The cost of confinement: starting a tool process (`/bin/true`) and
//! waiting for it to end, unconfined versus through the confinement layer
//! (making its cgroup, network namespace and Landlock ruleset where this
//! host has them), p50 and p99 of each and the difference; and apart, the
//! time to remove a finished tree's cgroup, which no call waits for.
//!
//! Then the same at once: `AGENTBAY_BENCH_CONCURRENT` (default 32) tools
//! starting together, in rounds, unconfined and confined, p50 and p99 of
//! each start and the difference: rounds back to back (tools started on
//! demand: what the spawner made ahead is used up), then bursts from rest
//! (250 ms idle before each round, in which the spawner makes tool
//! processes ahead).
//!
//! `AGENTBAY_BENCH_WINDOWS` (any value) prints on standard error each
//! burst's window (`unconfined|confined START END`, CLOCK_MONOTONIC ns),
//! to count only the bursts' samples of a `perf record -k
//! CLOCK_MONOTONIC -a` profile.
//!
//! `AGENTBAY_BENCH_RLIMIT` (any value) measures the weaker mechanism
//! instead of a cgroup, `AGENTBAY_BENCH_EGRESS` tools with internet egress
//! (no network namespace): what each layer costs.
//!
//! `cargo bench --bench confine`; `AGENTBAY_BENCH_SPAWNS` sets the number
//! of starts per row (default 300). Run as root, or as an unprivileged
//! account with a delegated cgroup subtree (the packaged service), to
//! measure the cgroup mechanism; without one it measures the weaker one.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbay::config::RuntimeConfig;
use agentbay::domain::amount::Amount;
use agentbay::runtime::confine::{Cage, Confiner, Request};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn row(name: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let (p50, p99) = (percentile(&samples, 0.5), percentile(&samples, 0.99));
    println!(
        "{name:<34} p50 {:>8.2} ms   p99 {:>8.2} ms",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    (p50, p99)
}

/// One start of `/bin/true` without confinement, waited for: how long it
/// took.
async fn plain_start(workdir: &Path) -> Duration {
    let t = Instant::now();
    let status = tokio::process::Command::new("/bin/true")
        .current_dir(workdir)
        .status()
        .await
        .unwrap();
    assert!(status.success());
    t.elapsed()
}

/// One start of `/bin/true` through the confinement layer, waited for:
/// how long it took, and its cage (dropping it removes its group).
async fn confined_start(
    confiner: &Confiner,
    config: &RuntimeConfig,
    workdir: &Path,
) -> (Duration, Cage) {
    let t = Instant::now();
    let argv = ["/bin/true".to_string()];
    let request = Request {
        argv: &argv,
        cpu: Amount::units(1),
        memory_gb: Amount::units(1),
        egress: std::env::var_os("AGENTBAY_BENCH_EGRESS").is_some(),
        workdir,
        endpoints: &[],
        read_paths: &[],
    };
    let (tool, cage) = confiner.start(&request, config).await.unwrap();
    let status = tool.wait().await.unwrap();
    assert!(status.success(), "{status}");
    (t.elapsed(), cage)
}

#[tokio::main]
async fn main() {
    let spawns: usize = std::env::var("AGENTBAY_BENCH_SPAWNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir().unwrap();
    agentbay::runtime::confine::spawner::set_program(Path::new(env!("CARGO_BIN_EXE_agentbay")));
    let confiner = Arc::new(Confiner::detect(
        dir.path().join("work"),
        vec![dir.path().join("data")],
    ));
    let mut config = RuntimeConfig::default();
    if std::env::var_os("AGENTBAY_BENCH_RLIMIT").is_some() {
        config.confinement = agentbay::config::Confinement::Rlimit;
    }
    let config = Arc::new(config);
    let host = confiner.host(&config);
    println!(
        "confinement on this host: {} | network: {} | processes: {} | filesystem: {} | files: {} | syscalls: {} | user: {}",
        host.mechanism,
        host.network,
        host.processes,
        host.filesystem,
        host.files,
        host.syscalls,
        host.user
    );
    let workdir = confiner.workdir("bench", &config).unwrap();

    let mut plain = Vec::with_capacity(spawns);
    for _ in 0..spawns {
        plain.push(plain_start(&workdir).await);
    }
    let mut confined = Vec::with_capacity(spawns);
    let mut removals = Vec::with_capacity(spawns);
    for _ in 0..spawns {
        let (took, cage) = confined_start(&confiner, &config, &workdir).await;
        confined.push(took);
        let t = Instant::now();
        drop(cage);
        removals.push(t.elapsed());
    }

    println!("{spawns} starts of /bin/true each");
    let (p50a, p99a) = row("unconfined", plain);
    let (p50b, p99b) = row(&format!("confined ({})", host.mechanism), confined);
    added("added by confinement", (p50a, p99a), (p50b, p99b));
    row("removing an ended tree's cgroup", removals);

    // Starts at once: each round starts `concurrent` tools together and
    // waits for all of them; every start is one sample. Twice: rounds
    // back to back (a sustained stream of bursts: what was made ahead is
    // used up), and bursts from rest (the appliance idle for a moment
    // before each, as when the tools of many attempts start together).
    let concurrent: usize = std::env::var("AGENTBAY_BENCH_CONCURRENT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let rounds = spawns.div_ceil(concurrent).max(3);
    for (what, rest) in [
        ("back to back", Duration::ZERO),
        ("from rest", Duration::from_millis(250)),
    ] {
        let (plain, confined) =
            at_once(&confiner, &config, &workdir, concurrent, rounds, rest).await;
        println!(
            "{concurrent} starts at once, {what}, {rounds} rounds ({} starts each)",
            plain.len()
        );
        let a = row("unconfined, at once", plain);
        let b = row(&format!("confined ({}), at once", host.mechanism), confined);
        added("added by confinement, at once", a, b);
    }
    confiner.remove_workdir("bench");
    // The groups of what the spawner made ahead go with the bench.
    confiner.end_all();
}

/// `rounds` rounds of `concurrent` starts at once, unconfined then
/// confined, each after `rest`: every start's time.
async fn at_once(
    confiner: &Arc<Confiner>,
    config: &Arc<RuntimeConfig>,
    workdir: &Path,
    concurrent: usize,
    rounds: usize,
    rest: Duration,
) -> (Vec<Duration>, Vec<Duration>) {
    let mut plain = Vec::new();
    let mut confined = Vec::new();
    for _ in 0..rounds {
        tokio::time::sleep(rest).await;
        let window = monotonic_ns();
        let starts: Vec<_> = (0..concurrent)
            .map(|_| {
                let workdir = workdir.to_path_buf();
                tokio::spawn(async move { plain_start(&workdir).await })
            })
            .collect();
        for s in starts {
            plain.push(s.await.unwrap());
        }
        if std::env::var_os("AGENTBAY_BENCH_WINDOWS").is_some() {
            eprintln!("unconfined {window} {}", monotonic_ns());
        }
        tokio::time::sleep(rest).await;
        let window = monotonic_ns();
        let starts: Vec<_> = (0..concurrent)
            .map(|_| {
                let (workdir, confiner, config) =
                    (workdir.to_path_buf(), confiner.clone(), config.clone());
                tokio::spawn(async move {
                    let (took, cage) = confined_start(&confiner, &config, &workdir).await;
                    (took, tokio::task::spawn_blocking(move || drop(cage)))
                })
            })
            .collect();
        let mut removals = Vec::new();
        for s in starts {
            let (took, removal) = s.await.unwrap();
            confined.push(took);
            removals.push(removal);
        }
        if std::env::var_os("AGENTBAY_BENCH_WINDOWS").is_some() {
            eprintln!("confined {window} {}", monotonic_ns());
        }
        if !rest.is_zero() {
            for r in removals {
                r.await.unwrap();
            }
        }
    }
    (plain, confined)
}

/// CLOCK_MONOTONIC, ns: what `perf record -k CLOCK_MONOTONIC` stamps its
/// samples with, so that `AGENTBAY_BENCH_WINDOWS` can print each confined
/// burst's window for a profile of the bursts alone.
fn monotonic_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: one timespec, live for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

/// The difference of two rows' p50 and p99.
fn added(name: &str, (p50a, p99a): (Duration, Duration), (p50b, p99b): (Duration, Duration)) {
    println!(
        "{name:<34} p50 {:>8.2} ms   p99 {:>8.2} ms",
        (p50b.as_secs_f64() - p50a.as_secs_f64()) * 1e3,
        (p99b.as_secs_f64() - p99a.as_secs_f64()) * 1e3
    );
}
