//! Acquire + release pairs per second, with latency, with 32 concurrent
//! clients: in-process (the capacity service called directly) and over
//! HTTPS (the whole appliance, Connect RPC with keep-alive).
//!
//! Every grant and every release is durable before it is answered, so the
//! figures include the store's group commit and `fdatasync`.
//!
//! Where a PostgreSQL server is installed, the in-process row runs on the
//! PostgreSQL store too, beside what a site would write itself on the same
//! server: a pool row taken `FOR UPDATE` in each acquire and release
//! transaction, 32 connections.
//!
//! `cargo bench --bench capacity`; `AGENTBAY_BENCH_SECONDS` sets the time
//! per row (default 5).

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbay::app::{self, Clocks};
use agentbay::capacity::{AcquireRequest, Capacity};
use agentbay::clock::SystemClock;
use agentbay::config::Config;
use agentbay::domain::access::TenantScope;
use agentbay::domain::amount::Amount;
use agentbay::domain::capacity::{HolderKind, LeaseRequest};
use agentbay::domain::tenant::TenantSpec;
use agentbay::domain::{ProjectId, TenantId};
use agentbay::proto::agentbay::admin::v1 as admin_pb;
use agentbay::proto::agentbay::capacity::v1 as pb;
use agentbay::store::{Store, StoreOptions};
use connectrpc::CodecFormat;
use connectrpc::client::ClientConfig;

const CLIENTS: usize = 32;

// The same allocator as the binary.
mod common;

use common::{Row, big_pool, seconds};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn in_process(options: StoreOptions, backend: &str) -> Row {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store"), &options).unwrap();
    let config = Config::default();
    let capacity = Capacity::start(
        store.clone(),
        SystemClock::shared(),
        &config.capacity,
        Box::new(|| {}),
    )
    .await
    .unwrap();
    let tenant = TenantId::parse("bench").unwrap();
    capacity
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
    capacity
        .put_project(tenant.clone(), project.clone(), None)
        .await
        .unwrap();
    capacity.set_pool("bench-pool", big_pool()).await.unwrap();

    let deadline = Instant::now() + seconds();
    let start = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let capacity: Arc<Capacity> = capacity.clone();
            let (tenant, project) = (tenant.clone(), project.clone());
            tokio::spawn(async move {
                let scope = TenantScope::new(tenant.clone());
                let mut latencies = Vec::new();
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let lease = capacity
                        .acquire(AcquireRequest {
                            request: LeaseRequest {
                                tenant_id: tenant.clone(),
                                project_id: project.clone(),
                                run_id: None,
                                attempt_id: None,
                                run_slot: None,
                                holder_kind: HolderKind::Attempt,
                                holder_id: format!("c{c}-{i}"),
                                cpu: Amount::units(1),
                                memory_gb: Amount::units(1),
                                internet_egress: false,
                            },
                            pool_id: Some("bench-pool".into()),
                            wait: false,
                            wait_for: Duration::ZERO,
                        })
                        .await
                        .expect("granted");
                    capacity
                        .release(&scope, lease.lease.lease_id)
                        .await
                        .expect("released");
                    latencies.push(t.elapsed());
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
    let elapsed = start.elapsed();
    let stats = store.commit_stats();
    eprintln!(
        "in-process store: {} commits, {:.1} keys per commit, {:.1} commits per group, {:.1} per flush",
        stats.commits,
        stats.keys as f64 / stats.commits.max(1) as f64,
        stats.commits as f64 / stats.groups.max(1) as f64,
        stats.commits as f64 / stats.flushes.max(1) as f64
    );
    store.close().unwrap();
    Row {
        label: format!("in-process, {backend}{CLIENTS} clients"),
        count: latencies.len(),
        elapsed,
        latencies,
    }
}

async fn over_https(codec: CodecFormat) -> Row {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        demo: agentbay::config::DemoConfig { enabled: false },
        ..Config::default()
    };
    // Tools start through the spawner this build made.
    #[cfg(unix)]
    agentbay::runtime::confine::spawner::set_program(std::path::Path::new(env!(
        "CARGO_BIN_EXE_agentbay"
    )));
    let running = app::start(config, Clocks::system()).await.unwrap();
    let bootstrap = running
        .bootstrap
        .as_ref()
        .expect("a fresh appliance makes a credential");
    let state = running.state.clone();
    state
        .capacity
        .put_tenant(
            TenantId::parse("bench").unwrap(),
            TenantSpec {
                edition: "platform".into(),
                ..TenantSpec::default()
            },
        )
        .await
        .unwrap();
    state
        .capacity
        .put_project(
            TenantId::parse("bench").unwrap(),
            ProjectId::parse("load").unwrap(),
            None,
        )
        .await
        .unwrap();
    state
        .capacity
        .set_pool("bench-pool", big_pool())
        .await
        .unwrap();
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
        .create_client(admin_pb::CreateClientRequest {
            tenant_id: "bench".into(),
            scopes: vec!["factory.capacity.lease".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    let client = created.client.as_option().unwrap().client_id.clone();
    let credential = agentbay::auth::clients::authenticate(
        &state.store,
        &state.auth,
        &client,
        &created.client_secret,
        std::net::Ipv4Addr::LOCALHOST.into(),
    )
    .await
    .unwrap();
    let token = state
        .auth
        .issue(&credential, credential.scopes.clone())
        .access_token;

    let deadline = Instant::now() + seconds();
    let start = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let config = ClientConfig::new(running.url.parse().unwrap())
                .with_codec_format(codec)
                .with_default_header("authorization", format!("Bearer {token}"));
            let rpc = pb::CapacityClient::new(
                agentbay::control::pinned_transport(&state.tls.fingerprint),
                config,
            );
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let lease = rpc
                        .acquire_lease(pb::AcquireLeaseRequest {
                            project_id: "load".into(),
                            holder_kind: "attempt".into(),
                            holder_id: format!("c{c}-{i}"),
                            cpu: 1.0,
                            memory_gb: 1.0,
                            pool_id: "bench-pool".into(),
                            ..Default::default()
                        })
                        .await
                        .expect("granted")
                        .into_owned();
                    rpc.release_lease(pb::ReleaseLeaseRequest {
                        lease_id: lease.lease.as_option().unwrap().lease_id.clone(),
                        ..Default::default()
                    })
                    .await
                    .expect("released");
                    latencies.push(t.elapsed());
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
    let elapsed = start.elapsed();
    running.stop().await.unwrap();
    Row {
        label: format!("HTTPS Connect {codec:?}, {CLIENTS} clients, keep-alive (h2)"),
        count: latencies.len(),
        elapsed,
        latencies,
    }
}

/// What a site would write itself: a pool row with its capacity, taken
/// `FOR UPDATE` by every acquire (check, count, insert the lease) and
/// every release (delete it, count back), one transaction each, on
/// `CLIENTS` connections of the same PostgreSQL.
async fn for_update(cluster: &common::pg::PgCluster) -> Row {
    let url = cluster.database();
    let connect = || async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        client
    };
    connect()
        .await
        .batch_execute(
            "CREATE TABLE pool (id int PRIMARY KEY, cpu_total float8 NOT NULL, cpu_used float8 NOT NULL);
             CREATE TABLE lease (id text PRIMARY KEY, pool int NOT NULL REFERENCES pool, cpu float8 NOT NULL);
             INSERT INTO pool VALUES (1, 1000000, 0);",
        )
        .await
        .unwrap();
    let deadline = Instant::now() + seconds();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = connect().await;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                let id = format!("c{c}-{i}");
                client.batch_execute("BEGIN").await.unwrap();
                let row = client
                    .query_one(
                        "SELECT cpu_total - cpu_used FROM pool WHERE id = 1 FOR UPDATE",
                        &[],
                    )
                    .await
                    .unwrap();
                assert!(row.get::<_, f64>(0) >= 1.0, "the pool is large enough");
                client
                    .execute("UPDATE pool SET cpu_used = cpu_used + 1 WHERE id = 1", &[])
                    .await
                    .unwrap();
                client
                    .execute("INSERT INTO lease VALUES ($1, 1, 1)", &[&id])
                    .await
                    .unwrap();
                client.batch_execute("COMMIT").await.unwrap();
                client.batch_execute("BEGIN").await.unwrap();
                client
                    .query_one("SELECT 1 FROM pool WHERE id = 1 FOR UPDATE", &[])
                    .await
                    .unwrap();
                client
                    .execute("DELETE FROM lease WHERE id = $1", &[&id])
                    .await
                    .unwrap();
                client
                    .execute("UPDATE pool SET cpu_used = cpu_used - 1 WHERE id = 1", &[])
                    .await
                    .unwrap();
                client.batch_execute("COMMIT").await.unwrap();
                latencies.push(t.elapsed());
                i += 1;
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.unwrap());
    }
    Row {
        label: format!("plain PostgreSQL FOR UPDATE (a site's own), {CLIENTS} clients"),
        count: latencies.len(),
        elapsed: start.elapsed(),
        latencies,
    }
}

fn main() {
    agentbay::tls::install_crypto_provider();
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "acquire + release pairs, each durable before it is answered ({:?} per row)",
        seconds()
    );
    println!(
        "{:<62} {:>10} {:>10} {:>10} {:>8}",
        "row", "pairs/s", "p50 ms", "p99 ms", "x raw"
    );
    let raw = common::raw_sled_reference();
    let wants = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    if wants("in-process") {
        runtime
            .block_on(in_process(StoreOptions::default(), ""))
            .print(raw);
    }
    if wants("postgres")
        && let Some(cluster) = common::postgres()
    {
        runtime
            .block_on(in_process(
                common::postgres_options(cluster),
                "PostgreSQL store, ",
            ))
            .print(raw);
        runtime.block_on(for_update(cluster)).print(raw);
    }
    if wants("https-json") {
        runtime.block_on(over_https(CodecFormat::Json)).print(raw);
    }
    if wants("https-proto") {
        runtime.block_on(over_https(CodecFormat::Proto)).print(raw);
    }
}
