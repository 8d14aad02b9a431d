//! Live leases by holder and by id.
//!
//! One live lease per holder makes AcquireLease idempotent: asking again
//! for the same holder follows the lease it already has. The index by lease
//! id lets renewals and releases go straight to the pool that holds the
//! lease, without a store read.

use std::collections::HashMap;

use uuid::Uuid;

use crate::domain::TenantId;
use crate::domain::capacity::{CapacityLease, HolderKind};

/// A live lease is identified by its holder: (tenant, kind, holder id).
pub type HolderKey = (TenantId, HolderKind, String);

/// Requested, granted and active leases. Guarded by a mutex in `Shared`.
#[derive(Default)]
pub struct Holders {
    by_holder: HashMap<HolderKey, (Uuid, String)>,
    by_lease: HashMap<Uuid, (TenantId, String)>,
}

/// What [`Holders::claim`] found.
pub enum Claim {
    /// The holder had no live lease; it is reserved for `lease_id` now.
    New,
    /// The holder's acquire is still being placed.
    InProgress,
    /// The holder has this lease in this pool.
    Existing(Uuid, String),
}

fn key_of(lease: &CapacityLease) -> HolderKey {
    (
        lease.tenant_id.clone(),
        lease.holder_kind,
        lease.holder_id.clone(),
    )
}

impl Holders {
    /// Reserves `key` for a new lease unless the holder has one.
    pub fn claim(&mut self, key: &HolderKey, lease_id: Uuid) -> Claim {
        match self.by_holder.get(key) {
            Some((_, pool)) if pool.is_empty() => Claim::InProgress,
            Some((id, pool)) => Claim::Existing(*id, pool.clone()),
            None => {
                self.by_holder
                    .insert(key.clone(), (lease_id, String::new()));
                Claim::New
            }
        }
    }

    /// Gives up a reservation that produced no live lease.
    pub fn unclaim(&mut self, key: &HolderKey, lease_id: Uuid) {
        if self
            .by_holder
            .get(key)
            .is_some_and(|(id, _)| *id == lease_id)
        {
            self.by_holder.remove(key);
        }
    }

    /// Records a live lease (queued or granted).
    pub fn note(&mut self, lease: &CapacityLease) {
        self.by_holder
            .insert(key_of(lease), (lease.lease_id, lease.pool_id.clone()));
        self.by_lease.insert(
            lease.lease_id,
            (lease.tenant_id.clone(), lease.pool_id.clone()),
        );
    }

    /// Forgets a lease that ended.
    pub fn forget(&mut self, lease: &CapacityLease) {
        let key = key_of(lease);
        if self
            .by_holder
            .get(&key)
            .is_some_and(|(id, _)| *id == lease.lease_id)
        {
            self.by_holder.remove(&key);
        }
        self.by_lease.remove(&lease.lease_id);
    }

    /// The pool of a live lease of `tenant`.
    pub fn pool_of(&self, lease_id: Uuid, tenant: &TenantId) -> Option<String> {
        self.by_lease
            .get(&lease_id)
            .filter(|(t, _)| t == tenant)
            .map(|(_, pool)| pool.clone())
    }
}
