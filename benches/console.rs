//! Server time to render each console page with 10,000 attempts and 1,000
//! live capacity leases in the store.
//!
//! A whole appliance in-process; the store is filled through the services,
//! as the API would: 10,000 runs of the external triage release are
//! submitted, 9,000 of them are cancelled again (terminal attempts, released
//! lease records: a busy appliance's history), and 1,000 stay live, each
//! attempt holding or waiting for its agent-runtime lease; a few are claimed
//! and checkpointed. Then every page is requested through the router with a
//! signed-in PlatformAdmin's session (no TLS, no network: the handler, the
//! reads and the template), and the p50, p95 and maximum are printed.
//!
//! `cargo bench --bench console`; `AGENTBAY_BENCH_ROUNDS` sets the requests
//! per page (default 40).

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbay::api::AppState;
use agentbay::app::{self, Clocks};
use agentbay::config::Config;
use agentbay::domain::access::Role;
use agentbay::domain::access::TenantScope;
use agentbay::domain::{ProjectId, TenantId};
use agentbay::runs::RunRequest;
use axum::body::Body;
use axum::http::{Request, header};
use tower::ServiceExt;

mod common;

use common::external_site;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Attempts in the store (`AGENTBAY_BENCH_ATTEMPTS`, default 10,000), of
/// which a tenth stay live.
fn attempts() -> usize {
    std::env::var("AGENTBAY_BENCH_ATTEMPTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn request(release: &str, project: &ProjectId, i: usize) -> RunRequest {
    RunRequest {
        project_id: project.clone(),
        release_id: release.into(),
        input: serde_json::json!({"customer": format!("c{i}"), "text": "checkout is slow"}),
        limits: None,
        max_attempts: 0,
        max_corrections: None,
        request_id: None,
        run_key: None,
        labels: Default::default(),
        environment_id: None,
        submitted_by: "bench".into(),
    }
}

/// Fills the store; returns the id of a claimed, checkpointed attempt and
/// of its run.
async fn fill(state: &AppState) -> (String, String) {
    let (scope, project) = external_site(state).await;

    let started = Instant::now();
    // History first: submitted and cancelled again, 32 at a time.
    let live_count = attempts() / 10;
    let history = attempts() - live_count;
    let workers: Vec<_> = (0..32)
        .map(|w| {
            let (state, scope, project) = (state.clone(), scope.clone(), project.clone());
            tokio::spawn(async move {
                for i in (w..history).step_by(32) {
                    let run = state
                        .runs
                        .submit(&scope, request("triage-external-1.0.0", &project, i))
                        .await
                        .unwrap();
                    state
                        .runs
                        .cancel(&scope, run.run_id, "bench", "history")
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    for i in 0..live_count {
        state
            .runs
            .submit(
                &scope,
                request("triage-external-1.0.0", &project, history + i),
            )
            .await
            .unwrap();
    }
    // A few attempts claimed by an adapter, with checkpoints.
    let mut claimed = None;
    for _ in 0..5 {
        let t = state
            .runtime
            .claim(&scope, "triage", "bench", Duration::from_secs(10))
            .await
            .unwrap()
            .expect("an attempt to claim");
        let a = &t.attempt;
        state
            .runtime
            .start_attempt(
                &scope,
                a.attempt_id,
                a.fencing_token,
                a.adapter_version.clone(),
                a.checkpoint_format,
                None,
            )
            .await
            .unwrap();
        for step in 0..20 {
            state
                .runtime
                .checkpoint(
                    &scope,
                    a.attempt_id,
                    a.fencing_token,
                    format!("{{\"step\":{step}}}").into_bytes(),
                    None,
                )
                .await
                .unwrap();
        }
        claimed = Some((a.attempt_id.to_string(), a.run_id.to_string()));
    }
    // Cancelled attempts give their leases back in the background.
    let (mut leases, mut live) = (Vec::new(), usize::MAX);
    for _ in 0..100 {
        leases = state
            .capacity
            .leases(Some(&scope), &Default::default(), usize::MAX)
            .await
            .unwrap();
        live = leases
            .iter()
            .filter(|l| !l.lease.state.is_terminal())
            .count();
        if live <= live_count {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut by_state = std::collections::BTreeMap::new();
    for l in &leases {
        *by_state.entry(format!("{:?}", l.lease.state)).or_insert(0) += 1;
    }
    let mut attempts_by_state = std::collections::BTreeMap::new();
    for s in agentbay::domain::attempt::AttemptState::ALL {
        attempts_by_state.insert(s.as_str(), state.runtime.count(&scope, Some(s)).unwrap());
    }
    println!(
        "store: {} attempts {attempts_by_state:?}, {} lease records ({} live: {by_state:?}) in {:.1} s",
        state.runtime.count(&scope, None).unwrap(),
        leases.len(),
        live,
        started.elapsed().as_secs_f64()
    );
    claimed.unwrap()
}

/// A session of a PlatformAdmin looking at tenant `demo`.
async fn session(state: &AppState) -> String {
    let (user, _) = agentbay::auth::users::create(
        &state.store,
        &agentbay::domain::access::Actor::owner("bench"),
        agentbay::auth::users::NewUser {
            tenant: TenantScope::new(TenantId::platform()),
            username: "bench",
            display_name: "",
            roles: [Role::PlatformAdmin].into(),
            password: None,
            email: "",
        },
        state.clock.now(),
    )
    .await
    .unwrap();
    let cookie = state.sessions.start(&user);
    state
        .sessions
        .view_tenant(&cookie, TenantId::parse("demo").unwrap());
    cookie
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        demo: agentbay::config::DemoConfig { enabled: false },
        ..Config::default()
    };
    if std::env::var("AGENTBAY_BENCH_LOG").is_ok() {
        agentbay::telemetry::init_logging(&config.log, &config.telemetry).unwrap();
    }
    // Tools start through the spawner this build made.
    #[cfg(unix)]
    agentbay::runtime::confine::spawner::set_program(std::path::Path::new(env!(
        "CARGO_BIN_EXE_agentbay"
    )));
    let running = app::start(config, Clocks::system()).await.unwrap();
    let state = running.state.clone();
    let (attempt, run) = fill(&state).await;
    let cookie = Arc::new(format!(
        "{}={}",
        agentbay::auth::session::COOKIE,
        session(&state).await
    ));
    let router = agentbay::api::router(state.clone(), agentbay::console::router(&state));
    let rounds: usize = std::env::var("AGENTBAY_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let pages = [
        "/".to_string(),
        "/runs".into(),
        "/runs?state=Cancelled&page=20".into(),
        format!("/runs/{run}"),
        "/attempts".into(),
        "/attempts?state=Claimed&sort=started&dir=desc".into(),
        "/attempts?q=c42&page=1".into(),
        format!("/attempts/{attempt}"),
        format!("/attempts/{attempt}/checkpoints"),
        "/decisions".into(),
        "/uncertain".into(),
        "/pools".into(),
        "/quotas".into(),
        "/leases".into(),
        "/leases?state=Active".into(),
        "/releases".into(),
        "/tenants".into(),
        "/users".into(),
        "/clients".into(),
    ];
    println!(
        "{:<52} {:>9} {:>9} {:>9} {:>9}",
        "page (10,000 attempts, 1,000 live leases)", "p50 ms", "p95 ms", "max ms", "KiB"
    );
    let mut worst = 0.0f64;
    for page in &pages {
        let mut times = Vec::with_capacity(rounds);
        let mut size = 0;
        for _ in 0..rounds {
            let request = Request::get(page.as_str())
                .header(header::COOKIE, cookie.as_str())
                .body(Body::empty())
                .unwrap();
            let started = Instant::now();
            let response = router.clone().oneshot(request).await.unwrap();
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            times.push(started.elapsed());
            assert_eq!(status, 200, "{page}: {}", String::from_utf8_lossy(&body));
            size = body.len();
        }
        times.sort();
        let p95 = percentile(&times, 0.95);
        worst = worst.max(p95);
        println!(
            "{:<52} {:>9.2} {:>9.2} {:>9.2} {:>9}",
            page.chars().take(52).collect::<String>(),
            percentile(&times, 0.5),
            p95,
            times.last().unwrap().as_secs_f64() * 1000.0,
            size / 1024
        );
    }
    println!("worst p95: {worst:.2} ms (target <= 50 ms)");
    drop(state);
    running.stop().await.unwrap();
}
