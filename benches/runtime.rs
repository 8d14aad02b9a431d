//! The attempt core under load, with 32 concurrent attempts of an external
//! adapter: durable checkpoints per second, and decision round trips
//! (request -> answer -> running again) per second, with latency.
//!
//! In-process: the runtime service called directly inside a whole
//! appliance (the same grains, store, group commit and `fdatasync` as over
//! the API); over HTTPS: the adapter's Checkpoint RPC through Connect with
//! JSON. Every checkpoint and every decision step is durable before it is
//! answered.
//!
//! Where a PostgreSQL server is installed, the in-process checkpoint row
//! runs on the PostgreSQL store too.
//!
//! `cargo bench --bench runtime`; `AGENTBAY_BENCH_SECONDS` sets the time per
//! row (default 5).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbay::api::AppState;
use agentbay::app::{self, Clocks};
use agentbay::config::Config;
use agentbay::domain::TenantId;
use agentbay::domain::access::TenantScope;
use agentbay::domain::attempt::DecisionKind;
use agentbay::proto::agentbay::adapter::v1 as pb;
use agentbay::runs::RunRequest;
use agentbay::runtime::{DecisionAsk, Ticket};
use connectrpc::CodecFormat;
use connectrpc::client::ClientConfig;

const ATTEMPTS: usize = 32;

mod common;

use common::{Row, external_site, seconds};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// An appliance with tenant `demo`, project `load`, a pool for 1000
/// attempts, the external triage release, and `ATTEMPTS` running attempts.
async fn site(dir: &Path, store: agentbay::config::StoreConfig) -> (app::Running, Vec<Ticket>) {
    let config = Config {
        data_dir: dir.join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        demo: agentbay::config::DemoConfig { enabled: false },
        store,
        ..Config::default()
    };
    // Tools start through the spawner this build made.
    #[cfg(unix)]
    agentbay::runtime::confine::spawner::set_program(std::path::Path::new(env!(
        "CARGO_BIN_EXE_agentbay"
    )));
    let running = app::start(config, Clocks::system()).await.unwrap();
    let state = running.state.clone();
    let (scope, project) = external_site(&state).await;
    for i in 0..ATTEMPTS {
        state
            .runs
            .submit(
                &scope,
                RunRequest {
                    project_id: project.clone(),
                    release_id: "triage-external-1.0.0".into(),
                    input: serde_json::json!({"customer": format!("c{i}"), "text": "bench"}),
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
    }
    let mut tickets = Vec::new();
    while tickets.len() < ATTEMPTS {
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
        tickets.push(t);
    }
    (running, tickets)
}

/// Runs `op` in a loop on every attempt for the bench time.
async fn measure<F, Fut>(label: &str, tickets: &[Ticket], op: F) -> Row
where
    F: Fn(Ticket, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let deadline = Instant::now() + seconds();
    let start = Instant::now();
    let tasks: Vec<_> = tickets
        .iter()
        .cloned()
        .map(|t| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let started = Instant::now();
                    op(t.clone(), i).await;
                    latencies.push(started.elapsed());
                    i += 1;
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    Row {
        label: label.to_string(),
        count: latencies.len(),
        elapsed: start.elapsed(),
        latencies,
    }
}

fn scope() -> TenantScope {
    TenantScope::new(TenantId::parse("demo").unwrap())
}

async fn checkpoints_in_process(state: AppState, tickets: &[Ticket], store: &str) -> Row {
    let runtime = state.runtime.clone();
    measure(
        &format!("checkpoints, in-process, {store}{ATTEMPTS} attempts"),
        tickets,
        move |t: Ticket, i| {
            let runtime = runtime.clone();
            async move {
                let state = format!("{{\"step\":{i},\"notes\":\"{}\"}}", "x".repeat(200));
                runtime
                    .checkpoint(
                        &scope(),
                        t.attempt.attempt_id,
                        t.attempt.fencing_token,
                        state.into_bytes(),
                        None,
                    )
                    .await
                    .expect("checkpoint");
            }
        },
    )
    .await
}

async fn checkpoints_over_https(running: &app::Running, tickets: &[Ticket]) -> Row {
    let state = &running.state;
    let token = bench_token(running, &["factory.runs.execute"]).await;
    let config = ClientConfig::new(running.url.parse().unwrap())
        .with_codec_format(CodecFormat::Json)
        .with_default_header("authorization", format!("Bearer {token}"));
    // One connection per attempt, kept alive, as an adapter process has.
    let clients: Arc<std::collections::HashMap<uuid::Uuid, pb::AdapterClient<_>>> = Arc::new(
        tickets
            .iter()
            .map(|t| {
                let transport = agentbay::control::pinned_transport(&state.tls.fingerprint);
                (
                    t.attempt.attempt_id,
                    pb::AdapterClient::new(transport, config.clone()),
                )
            })
            .collect(),
    );
    measure(
        &format!("checkpoints, Connect JSON over HTTPS, {ATTEMPTS} attempts"),
        tickets,
        move |t: Ticket, i| {
            let clients = clients.clone();
            async move {
                let client = &clients[&t.attempt.attempt_id];
                client
                    .checkpoint(pb::CheckpointRequest {
                        attempt_id: t.attempt.attempt_id.to_string(),
                        fencing_token: t.attempt.fencing_token,
                        state_json: format!("{{\"step\":{i}}}"),
                        ..Default::default()
                    })
                    .await
                    .expect("checkpoint");
            }
        },
    )
    .await
}

async fn decisions_in_process(state: AppState, tickets: &[Ticket]) -> Row {
    let runtime = state.runtime.clone();
    measure(
        &format!("decision round trips, in-process, {ATTEMPTS} attempts"),
        tickets,
        move |t: Ticket, i| {
            let runtime = runtime.clone();
            async move {
                let a = &t.attempt;
                let d = runtime
                    .request_decision(
                        &scope(),
                        a.attempt_id,
                        a.fencing_token,
                        DecisionAsk {
                            kind: DecisionKind::Input,
                            question: Some(format!("{{\"q\":{i}}}").into_bytes()),
                            summary: "which queue?".into(),
                            options: Vec::new(),
                            recommendation: None,
                            answer_schema: None,
                            tool_call_id: None,
                            assignee: None,
                        },
                    )
                    .await
                    .expect("request");
                let back = runtime
                    .answer(
                        &scope(),
                        a.attempt_id,
                        d.decision_id,
                        "bench",
                        None,
                        Some(b"{\"queue\":\"ops\"}".to_vec()),
                    )
                    .await
                    .expect("answer");
                assert_eq!(back.state.as_str(), "Running");
            }
        },
    )
    .await
}

async fn bench_token(running: &app::Running, scopes: &[&str]) -> String {
    let state = &running.state;
    let bootstrap = running.bootstrap.as_ref().expect("a fresh appliance");
    let credential = bootstrap
        .credential(&state.store)
        .unwrap()
        .expect("the bootstrap credential is stored");
    let admin_token = state
        .auth
        .issue(&credential, credential.scopes.clone())
        .access_token;
    let admin = agentbay::control::admin_client(&running.url, &state.tls.fingerprint, &admin_token)
        .unwrap();
    let created = admin
        .create_client(agentbay::proto::agentbay::admin::v1::CreateClientRequest {
            tenant_id: "demo".into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    let id = created.client.as_option().unwrap().client_id.clone();
    let credential = agentbay::auth::clients::authenticate(
        &state.store,
        &state.auth,
        &id,
        &created.client_secret,
        std::net::Ipv4Addr::LOCALHOST.into(),
    )
    .await
    .unwrap();
    state
        .auth
        .issue(&credential, credential.scopes.clone())
        .access_token
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!(
            "{:<62} {:>10} {:>10} {:>10} {:>8}",
            "attempt core", "per s", "p50 ms", "p99 ms", "x raw"
        );
        let raw = common::raw_sled_reference();
        let dir = tempfile::tempdir().unwrap();
        let (running, tickets) = site(dir.path(), Default::default()).await;
        let state = running.state.clone();
        let tickets = Arc::new(tickets);
        checkpoints_in_process(state.clone(), &tickets, "")
            .await
            .print(raw);
        checkpoints_over_https(&running, &tickets).await.print(raw);
        decisions_in_process(state.clone(), &tickets)
            .await
            .print(raw);
        drop(state);
        running.stop().await.unwrap();
        if let Some(cluster) = common::postgres() {
            let dir = tempfile::tempdir().unwrap();
            let mut store = agentbay::config::StoreConfig {
                backend: agentbay::config::StoreBackend::Postgres,
                ..Default::default()
            };
            store.postgres.url = serde_json::from_value(serde_json::json!(cluster.database()))
                .expect("a URL is a string");
            agentbay::store::datadir::create_pair_key(&dir.path().join("data"))
                .expect("a pair key for the PostgreSQL store");
            let (running, tickets) = site(dir.path(), store).await;
            let state = running.state.clone();
            checkpoints_in_process(state.clone(), &tickets, "PostgreSQL store, ")
                .await
                .print(raw);
            drop(state);
            running.stop().await.unwrap();
        }
    });
}
