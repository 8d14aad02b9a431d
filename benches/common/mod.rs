//! What the benchmarks share: the time per row and a row of figures.

#![allow(dead_code)]

use std::time::Duration;

use agentbay::app::AppState;
use agentbay::domain::capacity::{PoolKind, PoolSpec, SecurityBoundary};
use agentbay::domain::tenant::TenantSpec;
use agentbay::domain::{ProjectId, TenantId};
use agentbay::releases::bundle::Bundle;
use agentbay::store::TenantScope;

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
    /// Prints the label, operations per second, p50 and p99 in ms.
    pub fn print(&mut self) {
        self.latencies.sort();
        let pct = |p: f64| {
            let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
            self.latencies.get(i).copied().unwrap_or_default()
        };
        println!(
            "{:<62} {:>10.0} {:>10.2} {:>10.2}",
            self.label,
            self.count as f64 / self.elapsed.as_secs_f64(),
            pct(0.50).as_secs_f64() * 1000.0,
            pct(0.99).as_secs_f64() * 1000.0,
        );
    }
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
