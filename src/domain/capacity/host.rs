//! The machine the appliance runs on, as capacity: what the pools that run
//! on it (their region is the appliance's own) may promise together.
//!
//! The appliance keeps a reserve for itself (`capacity.reserve_cpu`,
//! `capacity.reserve_memory_gb`). Of the rest, memory is promised once: a
//! lease's memory is memory the machine has. CPU is promised
//! `capacity.cpu_overcommit` times over: an agent attempt mostly waits for
//! its model server and its tools, so a lease's CPU is a share it may use
//! at its busiest, not a core it holds. Pools in another region are
//! remote (customer-hosted machines) and count against nothing here.

use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::amount::Amount;

use super::pool::{PoolState, SlotSize, WorkerPool};

/// What the host has, as the operating system reports it to this process
/// (CPUs it may run on, memory its control group may use).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostResources {
    /// CPUs.
    pub cpus: f64,
    /// Memory, GB.
    pub memory_gb: f64,
}

/// How much of the host local pools may promise.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostBudget {
    /// The host.
    pub host: HostResources,
    /// CPUs kept for the appliance itself.
    pub reserve_cpu: f64,
    /// Memory kept for the appliance itself, GB.
    pub reserve_memory_gb: f64,
    /// How many times over the rest of the CPUs may be promised.
    pub cpu_overcommit: f64,
}

/// A resource the local pools promise, against what the host backs.
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Promise {
    /// What the host backs: CPUs less the reserve, times the overcommit;
    /// memory less the reserve.
    pub backed: f64,
    /// What the local pools promise at their maxSize.
    pub promised: f64,
}

/// How the pools fit the host: `/readyz`, the start banner and the System
/// page say it.
#[derive(Clone, Debug, PartialEq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostFit {
    /// The host, the reserve and the overcommit.
    pub budget: HostBudget,
    /// CPU.
    pub cpu: Promise,
    /// Memory, GB.
    pub memory_gb: Promise,
    /// Pools that run on this host (their region is the appliance's own).
    pub local_pools: Vec<String>,
    /// Pools in other regions, taken as remote: counted against nothing
    /// here.
    pub remote_pools: Vec<String>,
    /// What the local pools promise beyond the host, in words; empty when
    /// they fit.
    pub warnings: Vec<String>,
}

impl HostFit {
    /// One line for the start banner: the host and what its pools promise
    /// of it.
    pub fn summary(&self) -> String {
        let host = &self.budget.host;
        let mut line = format!(
            "pools of this host ({}): {} of {:.1} CPU and {} of {:.1} GB promised ({} CPUs, {:.1} GB)",
            if self.local_pools.is_empty() {
                "none".to_string()
            } else {
                self.local_pools.join(", ")
            },
            self.cpu.promised,
            self.cpu.backed,
            self.memory_gb.promised,
            self.memory_gb.backed,
            host.cpus,
            host.memory_gb
        );
        if !self.remote_pools.is_empty() {
            line.push_str(&format!("; remote: {}", self.remote_pools.join(", ")));
        }
        line
    }
}

impl HostBudget {
    /// CPU the local pools may promise together.
    pub fn cpu(&self) -> f64 {
        (self.host.cpus - self.reserve_cpu).max(0.0) * self.cpu_overcommit
    }

    /// Memory the local pools may promise together, GB.
    pub fn memory_gb(&self) -> f64 {
        (self.host.memory_gb - self.reserve_memory_gb).max(0.0)
    }

    /// The maxSize of each of the two pools a first start makes (`agents`
    /// and `sandboxes`): half of what the host backs each, in `slot`s;
    /// eight when the host's resources could not be read.
    pub fn default_pool_slots(budget: Option<&HostBudget>, slot: SlotSize) -> u32 {
        budget.map_or(8, |b| b.slots(0.5, slot))
    }

    /// Slots of `slot` that `share` (0..=1) of the budget holds: at least
    /// one, so a pool can grant anything at all.
    pub fn slots(&self, share: f64, slot: SlotSize) -> u32 {
        let fit = |budget: f64, per: Amount| {
            if per == Amount::ZERO {
                f64::INFINITY
            } else {
                (budget * share / per.as_f64()).floor()
            }
        };
        let n = fit(self.cpu(), slot.cpu).min(fit(self.memory_gb(), slot.memory_gb));
        (n.min(f64::from(super::pool::MAX_POOL_SIZE)) as u32).max(1)
    }

    /// How `pools` fit: those in `local_region` count against the host
    /// (a disabled pool promises nothing).
    pub fn fit<'a>(
        &self,
        pools: impl IntoIterator<Item = &'a WorkerPool>,
        local_region: &str,
    ) -> HostFit {
        let (mut cpu, mut memory) = (Amount::ZERO, Amount::ZERO);
        let (mut local, mut remote) = (Vec::new(), Vec::new());
        for pool in pools {
            if pool.region != local_region {
                remote.push(format!("{} ({})", pool.pool_id, pool.region));
                continue;
            }
            local.push(pool.pool_id.clone());
            if pool.state == PoolState::Disabled {
                continue;
            }
            let most = pool.max_capacity();
            cpu = cpu + most.cpu;
            memory = memory + most.memory_gb;
        }
        let (cpu, memory) = (cpu.as_f64(), memory.as_f64());
        let mut warnings = Vec::new();
        let pools = local.join(", ");
        if cpu > self.cpu() + 1e-9 {
            warnings.push(format!(
                "the pools of this host ({pools}) promise {cpu} CPU at their maxSize; it backs {:.1} ({} CPUs less {} kept for the appliance, {} times over: capacity.cpu_overcommit)",
                self.cpu(),
                self.host.cpus,
                self.reserve_cpu,
                self.cpu_overcommit
            ));
        }
        if memory > self.memory_gb() + 1e-9 {
            warnings.push(format!(
                "the pools of this host ({pools}) promise {memory} GB of memory at their maxSize; it has {:.1} ({:.1} GB less {} kept for the appliance)",
                self.memory_gb(),
                self.host.memory_gb,
                self.reserve_memory_gb
            ));
        }
        if !warnings.is_empty() {
            warnings.push(format!(
                "lower their maxSize, or put pools that run elsewhere in a region of their own (this host's is {local_region:?}): those are taken as remote"
            ));
        }
        HostFit {
            budget: *self,
            cpu: Promise {
                backed: self.cpu(),
                promised: cpu,
            },
            memory_gb: Promise {
                backed: self.memory_gb(),
                promised: memory,
            },
            local_pools: local,
            remote_pools: remote,
            warnings,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::capacity::pool::{PoolKind, PoolSpec, SecurityBoundary};

    fn budget(cpus: f64, memory_gb: f64) -> HostBudget {
        HostBudget {
            host: HostResources { cpus, memory_gb },
            reserve_cpu: 0.5,
            reserve_memory_gb: 1.0,
            cpu_overcommit: 8.0,
        }
    }

    fn pool(id: &str, region: &str, slot: SlotSize, max_size: u32) -> WorkerPool {
        let spec = PoolSpec {
            tenant_id: None,
            kind: PoolKind::Sandbox,
            security_boundary: SecurityBoundary::Shared,
            region: region.into(),
            node_profile: "p".into(),
            min_size: 1,
            max_size,
            internet_egress: false,
            autoscaling: None,
            state: None,
        };
        WorkerPool::set(None, id, spec, slot, chrono::Utc::now())
            .unwrap()
            .0
    }

    fn slot(cpu: u64, memory_gb: u64) -> SlotSize {
        SlotSize {
            cpu: Amount::from_thousandths(cpu),
            memory_gb: Amount::from_thousandths(memory_gb),
        }
    }

    #[test]
    fn shares_of_the_budget_are_whole_slots_and_at_least_one() {
        // 2 CPUs, 24 GB: 12 CPU and 23 GB to promise.
        let b = budget(2.0, 24.0);
        assert_eq!((b.cpu(), b.memory_gb()), (12.0, 23.0));
        // Half each, slots of 0.5 CPU and 1 GB: memory binds (11.5 GB).
        assert_eq!(b.slots(0.5, slot(500, 1000)), 11);
        // A host too small for one slot still gets one (and a warning).
        assert_eq!(budget(1.0, 1.5).slots(0.5, slot(2000, 4000)), 1);
    }

    #[test]
    fn local_pools_beyond_the_host_are_named_and_remote_ones_count_for_nothing() {
        let b = budget(2.0, 24.0);
        let small = slot(500, 1000);
        let fits = [
            pool("agents", "local", small, 11),
            pool("sandboxes", "local", small, 11),
        ];
        let fit = b.fit(&fits, "local");
        assert!(fit.warnings.is_empty(), "{:?}", fit.warnings);
        assert_eq!(fit.memory_gb.promised, 22.0);

        let too_much = [
            pool("agents", "local", small, 11),
            pool("big", "local", slot(8000, 16000), 2),
            pool("customer", "customer-a", slot(8000, 16000), 100),
        ];
        let fit = b.fit(&too_much, "local");
        assert_eq!(fit.remote_pools, vec!["customer (customer-a)".to_string()]);
        assert_eq!(fit.local_pools, vec!["agents", "big"]);
        assert_eq!(fit.warnings.len(), 3, "{:?}", fit.warnings);
        assert!(
            fit.warnings[0].contains("promise 21.5 CPU") && fit.warnings[0].contains("backs 12.0"),
            "{}",
            fit.warnings[0]
        );
        assert!(
            fit.warnings[1].contains("promise 43 GB") && fit.warnings[1].contains("has 23.0"),
            "{}",
            fit.warnings[1]
        );
    }
}
