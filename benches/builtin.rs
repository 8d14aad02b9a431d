//! The builtin loop under load: the overhead the loop adds per step (one
//! no-op tool call and the next model call, with their checkpoints, all
//! durable), excluding the scripted model's and the tool's own time, p50
//! and p99; and attempts completed per second with 32 concurrent attempts
//! of 8 steps each.
//!
//! `cargo bench --bench builtin`; `AGENTBAY_BENCH_SECONDS` sets the time per
//! row (default 5).

use std::path::Path;
use std::time::{Duration, Instant};

use agentbay::api::AppState;
use agentbay::app::{self, Clocks};
use agentbay::config::{Config, DemoConfig};
use agentbay::domain::access::TenantScope;
use agentbay::domain::tenant::TenantSpec;
use agentbay::domain::{ProjectId, TenantId};
use agentbay::releases::bundle::Bundle;
use agentbay::runs::RunRequest;
use agentbay::runtime::builtin::sample_step_overheads;
use serde_json::{Value, json};

mod common;

use common::{big_pool, seconds};

const STEPS: usize = 8;
const CONCURRENT: usize = 32;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The triage example with a no-op tool and `STEPS` scripted turns.
fn bench_release(dir: &Path) -> Bundle {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("packaging/examples/releases/triage");
    let dst = dir.join("bench");
    for entry in walk(&src) {
        let rel = entry.strip_prefix(&src).unwrap();
        let to = dst.join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&entry, &to).unwrap();
    }
    let mut responses: Vec<Value> = (0..STEPS)
        .map(|_| json!({"content": "next", "toolCalls": [{"tool": "noop", "arguments": {}}]}))
        .collect();
    responses.push(json!({"content": json!({"severity": "low", "summary": "done", "paged": false}).to_string()}));
    std::fs::write(
        dst.join("model/responses.json"),
        serde_json::to_vec(&json!({"responses": responses})).unwrap(),
    )
    .unwrap();
    let path = dst.join("manifest.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    m["releaseId"] = json!("bench-1.0.0");
    m["tools"] = json!([{"id": "noop", "name": "noop", "description": "Nothing", "sideEffectClass": "read",
        "transport": "builtin", "inputSchema": {"type": "object"}}]);
    m["contract"]["limits"]["maxModelCalls"] = json!(50);
    m["contract"]["limits"]["maxToolCalls"] = json!(50);
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    agentbay::control::release_sign(
        &dst,
        &dir.join("data")
            .join(agentbay::releases::signing::DEMO_KEY_FILE),
        true,
    )
    .unwrap();
    Bundle::from_dir(&dst, &Default::default()).unwrap()
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

async fn site(dir: &Path) -> app::Running {
    let config = Config {
        data_dir: dir.join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        demo: DemoConfig { enabled: false },
        ..Config::default()
    };
    // Tools start through the spawner this build made.
    #[cfg(unix)]
    agentbay::runtime::confine::spawner::set_program(std::path::Path::new(env!(
        "CARGO_BIN_EXE_agentbay"
    )));
    let running = app::start(config, Clocks::system()).await.unwrap();
    let state = running.state.clone();
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
    state
        .capacity
        .put_project(tenant, ProjectId::parse("load").unwrap(), None)
        .await
        .unwrap();
    state
        .capacity
        .set_pool("bench-agents", big_pool())
        .await
        .unwrap();
    let bundle = bench_release(dir);
    let report = state.releases.check(&bundle);
    state
        .releases
        .record(bundle, report, "bench")
        .await
        .unwrap();
    running
}

/// Submits a run and waits until its attempt has ended.
async fn one_attempt(state: &AppState) {
    let scope = TenantScope::new(TenantId::parse("demo").unwrap());
    let run = state
        .runs
        .submit(
            &scope,
            RunRequest {
                project_id: ProjectId::parse("load").unwrap(),
                release_id: "bench-1.0.0".into(),
                input: json!({"customer": "acme", "text": "t"}),
                limits: None,
                max_attempts: 0,
                max_corrections: None,
                request_id: None,
                run_key: None,
                labels: Default::default(),
                environment_id: None,
                submitted_by: "bench".into(),
            },
        )
        .await
        .unwrap();
    let attempt = run.steps[0].attempts[0];
    let mut rx = state.runtime.watch(&scope, attempt).unwrap();
    loop {
        if rx.borrow_and_update().attempt.state.is_terminal() {
            break;
        }
        if rx.changed().await.is_err() {
            break;
        }
    }
    let ended = state.runtime.attempt(&scope, attempt).unwrap();
    assert_eq!(ended.state.as_str(), "Succeeded", "{:?}", ended.failure);
}

fn pct(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples.get(i).copied().unwrap_or_default().as_secs_f64() * 1000.0
}

async fn measure(state: &AppState, workers: usize) -> (usize, Duration, Vec<Duration>) {
    sample_step_overheads(true);
    let deadline = Instant::now() + seconds();
    let start = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let state = state.clone();
            tokio::spawn(async move {
                let mut done = 0;
                while Instant::now() < deadline {
                    one_attempt(&state).await;
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut done = 0;
    for t in tasks {
        done += t.await.unwrap();
    }
    (done, start.elapsed(), sample_step_overheads(false))
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let running = site(dir.path()).await;
        let state = running.state.clone();
        one_attempt(&state).await; // warm up
        println!(
            "{:<52} {:>12} {:>10} {:>10} {:>10}",
            "builtin loop", "attempts/s", "steps", "p50 ms", "p99 ms"
        );
        for workers in [1, CONCURRENT] {
            let (done, elapsed, mut steps) = measure(&state, workers).await;
            println!(
                "{:<52} {:>12.1} {:>10} {:>10.3} {:>10.3}",
                format!("{workers} concurrent attempts of {STEPS} steps, overhead/step"),
                done as f64 / elapsed.as_secs_f64(),
                steps.len(),
                pct(&mut steps, 0.50),
                pct(&mut steps, 0.99),
            );
        }
        drop(state);
        running.stop().await.unwrap();
    });
}
