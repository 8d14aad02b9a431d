//! What the benchmarks share: the time per row and a row of figures.

#![allow(dead_code)]

use std::time::Duration;

use agentbay::domain::capacity::{PoolKind, PoolSpec, SecurityBoundary};

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
