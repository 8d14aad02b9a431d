//! Capacity leases and their state machine.
//!
//! ```text
//! Requested --> Granted   capacity available
//! Requested --> Denied    quota or pool exhausted (or withdrawn, abandoned)
//! Granted   --> Active    holder started (first renewal, or activation)
//! Granted   --> Expired   not started within the TTL
//! Active    --> Released  holder completed
//! Active    --> Expired   heartbeat missed
//! ```
//!
//! Released, Expired and Denied are final. Every other move is an
//! [`IllegalTransition`]. Transitions take `now` and return the events
//! they cause.

use std::fmt;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::amount::Amount;
use crate::domain::error::DomainError;
use crate::domain::events::{EventPayload, NewEvent};
use crate::domain::ids::{ProjectId, TenantId};

use super::pool::PoolKind;

/// What holds a lease.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum HolderKind {
    /// An execution attempt.
    Attempt,
    /// A tool sandbox.
    Sandbox,
    /// A build.
    Build,
    /// A browser session.
    BrowserSession,
}

impl HolderKind {
    /// Every kind.
    pub const ALL: [HolderKind; 4] = [
        HolderKind::Attempt,
        HolderKind::Sandbox,
        HolderKind::Build,
        HolderKind::BrowserSession,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            HolderKind::Attempt => "attempt",
            HolderKind::Sandbox => "sandbox",
            HolderKind::Build => "build",
            HolderKind::BrowserSession => "browser-session",
        }
    }

    /// Parses the wire name, naming the field on failure.
    pub fn parse(text: &str) -> Result<HolderKind, crate::domain::FieldError> {
        HolderKind::ALL
            .into_iter()
            .find(|k| k.as_str() == text)
            .ok_or_else(|| {
                crate::domain::FieldError::new(
                    "holderKind",
                    format!("{text:?} is not one of attempt, sandbox, build, browser-session"),
                )
            })
    }

    /// The pool kind that serves it.
    pub fn pool_kind(self) -> PoolKind {
        match self {
            HolderKind::Attempt => PoolKind::AgentRuntime,
            HolderKind::Sandbox => PoolKind::Sandbox,
            HolderKind::Build => PoolKind::BuildRunner,
            HolderKind::BrowserSession => PoolKind::BrowserSession,
        }
    }

    /// Whether it counts against `concurrentRuns` (else `concurrentSandboxes`).
    pub fn counts_as_run(self) -> bool {
        matches!(self, HolderKind::Attempt | HolderKind::Build)
    }
}

/// Checks a lease holder's id: 1 to 128 of `A-Z a-z 0-9 - _ . :`.
pub fn parse_holder_id(text: &str) -> Result<String, crate::domain::FieldError> {
    let ok = !text.is_empty()
        && text.len() <= 128
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if ok {
        Ok(text.to_string())
    } else {
        Err(crate::domain::FieldError::new(
            "holderId",
            format!("{text:?} must be 1 to 128 characters of A-Z, a-z, 0-9, '-', '_', '.' or ':'"),
        ))
    }
}

/// Where a lease is in its life.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
pub enum LeaseState {
    /// Waiting for capacity.
    Requested,
    /// Capacity set aside; the holder has not started.
    Granted,
    /// The holder runs and heartbeats.
    Active,
    /// The holder finished and gave the capacity back.
    Released,
    /// The heartbeat stopped (or the holder never started).
    Expired,
    /// Not granted.
    Denied,
}

impl LeaseState {
    /// The states that are not final.
    pub const LIVE: [LeaseState; 3] = [
        LeaseState::Requested,
        LeaseState::Granted,
        LeaseState::Active,
    ];

    /// Final states: every state but the live ones.
    pub fn is_terminal(self) -> bool {
        !Self::LIVE.contains(&self)
    }

    /// States that hold capacity.
    pub fn holds_capacity(self) -> bool {
        matches!(self, LeaseState::Granted | LeaseState::Active)
    }

    /// Parses the wire name.
    pub fn parse(text: &str) -> Option<LeaseState> {
        [
            LeaseState::Requested,
            LeaseState::Granted,
            LeaseState::Active,
            LeaseState::Released,
            LeaseState::Expired,
            LeaseState::Denied,
        ]
        .into_iter()
        .find(|s| s.to_string().eq_ignore_ascii_case(text))
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A move the state machine does not allow.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("lease {lease_id} is {from}; it cannot {command}")]
pub struct IllegalTransition {
    /// The lease.
    pub lease_id: Uuid,
    /// Its state.
    pub from: LeaseState,
    /// What was asked.
    pub command: &'static str,
}

impl From<IllegalTransition> for DomainError {
    fn from(e: IllegalTransition) -> Self {
        DomainError::FailedPrecondition(e.to_string())
    }
}

/// A request for capacity, validated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRequest {
    /// The tenant.
    pub tenant_id: TenantId,
    /// The project.
    pub project_id: ProjectId,
    /// The run, if any.
    pub run_id: Option<Uuid>,
    /// The attempt, if any.
    pub attempt_id: Option<Uuid>,
    /// The run slot it counts in, for an attempt of a run: its own run, or
    /// for a delegated child run the root run it runs in. `None`: a run
    /// or sandbox lease is its own slot, freed with it.
    pub run_slot: Option<Uuid>,
    /// What holds it.
    pub holder_kind: HolderKind,
    /// Which one.
    pub holder_id: String,
    /// CPU wanted.
    pub cpu: Amount,
    /// Memory wanted, GB.
    pub memory_gb: Amount,
    /// Whether the work needs the internet.
    pub internet_egress: bool,
}

/// A lease as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityLease {
    /// The lease.
    pub lease_id: Uuid,
    /// The tenant.
    pub tenant_id: TenantId,
    /// The project.
    pub project_id: ProjectId,
    /// The run, if any.
    pub run_id: Option<Uuid>,
    /// The attempt, if any.
    pub attempt_id: Option<Uuid>,
    /// The run slot it counts in (see [`LeaseRequest::run_slot`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_slot: Option<Uuid>,
    /// What holds it.
    pub holder_kind: HolderKind,
    /// Which one.
    pub holder_id: String,
    /// The pool it is in (or waits in).
    pub pool_id: String,
    /// CPU.
    pub cpu: Amount,
    /// Memory, GB.
    pub memory_gb: Amount,
    /// Whether the work may reach the internet.
    pub internet_egress: bool,
    /// State.
    pub state: LeaseState,
    /// When it was asked for.
    pub requested_at: DateTime<Utc>,
    /// When capacity was granted.
    pub granted_at: Option<DateTime<Utc>>,
    /// When the holder started.
    pub activated_at: Option<DateTime<Utc>>,
    /// When it lapses without a heartbeat (for a request: when an
    /// unattended request is given up).
    pub expires_at: Option<DateTime<Utc>>,
    /// When it ended.
    pub released_at: Option<DateTime<Utc>>,
    /// Why it waits, why it was denied, or how it ended.
    pub reason: Option<String>,
    /// The quota field that held or denied it, when a quota did.
    #[serde(default)]
    pub limiting_quota: Option<String>,
    /// Seconds it held capacity (grant to end).
    pub execution_seconds: u64,
    /// What binds the processes that run under it (`cgroup-v2`,
    /// `cgroup-v1`, `rlimit`), once one has started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_by: Option<String>,
    /// The number of the stored state this value is (0: not stored yet);
    /// the store numbers every write and refuses one derived from an older
    /// state.
    #[serde(default = "crate::domain::stored_before_versions")]
    pub version: u64,
}

/// Payload of `capacity.leases.v1.capacity-lease-granted`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityLeaseGranted<'a> {
    /// The lease.
    pub lease_id: Uuid,
    /// The tenant.
    pub tenant_id: &'a TenantId,
    /// What holds it.
    pub holder_kind: &'a str,
    /// Which one.
    pub holder_id: &'a str,
    /// The pool.
    pub pool_id: &'a str,
    /// When it lapses without a heartbeat.
    pub expires_at: DateTime<Utc>,
}

impl EventPayload for CapacityLeaseGranted<'_> {
    const TOPIC: &'static str = "capacity.leases.v1.capacity-lease-granted";
}

/// Payload of `capacity.leases.v1.capacity-lease-released`: released or
/// expired.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityLeaseReleased<'a> {
    /// The lease.
    pub lease_id: Uuid,
    /// The tenant.
    pub tenant_id: &'a TenantId,
    /// What held it.
    pub holder_kind: &'a str,
    /// Which one.
    pub holder_id: &'a str,
    /// The pool.
    pub pool_id: &'a str,
    /// `Released` or `Expired`.
    pub state: LeaseState,
    /// Seconds it held capacity.
    pub execution_seconds: u64,
}

impl EventPayload for CapacityLeaseReleased<'_> {
    const TOPIC: &'static str = "capacity.leases.v1.capacity-lease-released";
}

/// What a release or an expiry did.
#[derive(Clone, Debug, PartialEq)]
pub struct Ended {
    /// The `CapacityLeaseReleased` event.
    pub event: NewEvent,
    /// Capacity held until now (to give back to the pool and quotas).
    pub freed: bool,
}

/// What the rule between a stored lease and any state written over it
/// reads of the stored one.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredLease {
    /// The lease.
    pub lease_id: Uuid,
    /// Its stored version.
    #[serde(default = "crate::domain::stored_before_versions")]
    pub version: u64,
    /// Its state.
    pub state: LeaseState,
}

impl StoredLease {
    /// A lease that ended (released, expired, denied) stays ended.
    pub fn check_successor(&self, next: &CapacityLease) -> Result<(), String> {
        if self.state.is_terminal() && next.state != self.state {
            return Err(format!(
                "capacity lease {} ended {:?}; it cannot become {:?}",
                self.lease_id, self.state, next.state
            ));
        }
        Ok(())
    }
}

impl CapacityLease {
    /// A new request, placed in `pool_id`. An unattended request lapses
    /// after `ttl` unless its holder asks again.
    pub fn request(
        lease_id: Uuid,
        request: LeaseRequest,
        pool_id: &str,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> CapacityLease {
        CapacityLease {
            lease_id,
            tenant_id: request.tenant_id,
            project_id: request.project_id,
            run_id: request.run_id,
            run_slot: request.run_slot,
            attempt_id: request.attempt_id,
            holder_kind: request.holder_kind,
            holder_id: request.holder_id,
            pool_id: pool_id.to_string(),
            cpu: request.cpu,
            memory_gb: request.memory_gb,
            internet_egress: request.internet_egress,
            state: LeaseState::Requested,
            requested_at: now,
            granted_at: None,
            activated_at: None,
            expires_at: Some(now + ttl),
            released_at: None,
            reason: None,
            limiting_quota: None,
            execution_seconds: 0,
            bound_by: None,
            version: 0,
        }
    }

    fn illegal(&self, command: &'static str) -> IllegalTransition {
        IllegalTransition {
            lease_id: self.lease_id,
            from: self.state,
            command,
        }
    }

    /// Requested -> Granted.
    pub fn grant(
        &mut self,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<NewEvent, IllegalTransition> {
        if self.state != LeaseState::Requested {
            return Err(self.illegal("be granted"));
        }
        self.state = LeaseState::Granted;
        self.granted_at = Some(now);
        self.expires_at = Some(now + ttl);
        self.reason = None;
        self.limiting_quota = None;
        Ok(NewEvent::new(
            &self.tenant_id,
            now,
            &CapacityLeaseGranted {
                lease_id: self.lease_id,
                tenant_id: &self.tenant_id,
                holder_kind: self.holder_kind.as_str(),
                holder_id: &self.holder_id,
                pool_id: &self.pool_id,
                expires_at: now + ttl,
            },
        ))
    }

    /// Requested -> Denied, with the reason and the quota field when a
    /// quota is why.
    pub fn deny(
        &mut self,
        reason: String,
        quota: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<(), IllegalTransition> {
        if self.state != LeaseState::Requested {
            return Err(self.illegal("be denied"));
        }
        self.state = LeaseState::Denied;
        self.released_at = Some(now);
        self.expires_at = None;
        self.reason = Some(reason);
        self.limiting_quota = quota.map(str::to_string);
        Ok(())
    }

    /// Records why a request waits (no state change).
    pub fn wait(&mut self, reason: String, quota: Option<&str>) -> Result<(), IllegalTransition> {
        if self.state != LeaseState::Requested {
            return Err(self.illegal("wait"));
        }
        self.reason = Some(reason);
        self.limiting_quota = quota.map(str::to_string);
        Ok(())
    }

    /// Heartbeat. Granted -> Active on the first one; Active stays Active;
    /// a waiting request stays attended. The TTL restarts.
    pub fn renew(&mut self, now: DateTime<Utc>, ttl: Duration) -> Result<(), IllegalTransition> {
        match self.state {
            LeaseState::Granted => {
                self.state = LeaseState::Active;
                self.activated_at = Some(now);
            }
            LeaseState::Active | LeaseState::Requested => {}
            LeaseState::Expired => {
                return Err(self.illegal("be renewed: it expired; acquire a new lease"));
            }
            LeaseState::Released => {
                return Err(self.illegal("be renewed: it was released; acquire a new lease"));
            }
            LeaseState::Denied => {
                return Err(self.illegal("be renewed: it was denied; acquire a new lease"));
            }
        }
        self.expires_at = Some(now + ttl);
        Ok(())
    }

    fn end(&mut self, state: LeaseState, now: DateTime<Utc>) -> Ended {
        let granted_at = self.granted_at.unwrap_or(now);
        self.execution_seconds = (now - granted_at).num_seconds().max(0) as u64;
        self.state = state;
        self.released_at = Some(now);
        self.expires_at = None;
        Ended {
            event: NewEvent::new(
                &self.tenant_id,
                now,
                &CapacityLeaseReleased {
                    lease_id: self.lease_id,
                    tenant_id: &self.tenant_id,
                    holder_kind: self.holder_kind.as_str(),
                    holder_id: &self.holder_id,
                    pool_id: &self.pool_id,
                    state,
                    execution_seconds: self.execution_seconds,
                },
            ),
            freed: true,
        }
    }

    /// The holder is done. Active -> Released; a Granted lease whose holder
    /// finishes before its first heartbeat passes through Active; a waiting
    /// request is withdrawn (Denied). Releasing an ended lease changes
    /// nothing and returns `None`: release is idempotent.
    pub fn release(&mut self, now: DateTime<Utc>) -> Option<Ended> {
        match self.state {
            LeaseState::Granted => {
                self.activated_at = Some(now);
                Some(self.end(LeaseState::Released, now))
            }
            LeaseState::Active => Some(self.end(LeaseState::Released, now)),
            LeaseState::Requested => {
                self.state = LeaseState::Denied;
                self.released_at = Some(now);
                self.expires_at = None;
                self.reason = Some("withdrawn by its holder before it was granted".into());
                None
            }
            LeaseState::Released | LeaseState::Expired | LeaseState::Denied => None,
        }
    }

    /// Whether the TTL has run out at `now`.
    pub fn is_due(&self, now: DateTime<Utc>) -> bool {
        !self.state.is_terminal() && self.expires_at.is_some_and(|t| t <= now)
    }

    /// The LeaseExpirer's move for a lease whose TTL ran out: Granted or
    /// Active -> Expired (capacity freed); an unattended request -> Denied.
    pub fn expire(&mut self, now: DateTime<Utc>) -> Result<Option<Ended>, IllegalTransition> {
        if !self.is_due(now) {
            return Err(self.illegal("expire before its time"));
        }
        match self.state {
            LeaseState::Granted | LeaseState::Active => {
                Ok(Some(self.end(LeaseState::Expired, now)))
            }
            LeaseState::Requested => {
                self.deny(
                    "abandoned: its holder stopped asking for it (not renewed within the lease TTL)".into(),
                    None,
                    now,
                )?;
                Ok(None)
            }
            _ => Err(self.illegal("expire")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request() -> LeaseRequest {
        LeaseRequest {
            tenant_id: TenantId::parse("acme").unwrap(),
            project_id: ProjectId::parse("web").unwrap(),
            run_id: None,
            attempt_id: None,
            run_slot: None,
            holder_kind: HolderKind::Attempt,
            holder_id: "attempt-1".into(),
            cpu: Amount::units(1),
            memory_gb: Amount::units(2),
            internet_egress: false,
        }
    }

    fn ttl() -> Duration {
        Duration::seconds(120)
    }

    #[test]
    fn the_happy_path_counts_execution_seconds() {
        let t0 = Utc::now();
        let mut lease = CapacityLease::request(Uuid::nil(), request(), "agents", t0, ttl());
        let granted = lease.grant(t0 + Duration::seconds(5), ttl()).unwrap();
        assert_eq!(granted.topic, "capacity.leases.v1.capacity-lease-granted");
        lease.renew(t0 + Duration::seconds(10), ttl()).unwrap();
        assert_eq!(lease.state, LeaseState::Active);
        let ended = lease.release(t0 + Duration::seconds(65)).unwrap();
        assert_eq!(lease.state, LeaseState::Released);
        assert_eq!(lease.execution_seconds, 60);
        assert_eq!(ended.event.payload["executionSeconds"], 60);
        assert_eq!(ended.event.payload["state"], "Released");
        // Idempotent.
        assert!(lease.release(t0 + Duration::seconds(70)).is_none());
        assert_eq!(lease.execution_seconds, 60);
        let err = lease.renew(t0 + Duration::seconds(71), ttl()).unwrap_err();
        assert!(err.to_string().contains("released"), "{err}");
    }

    #[test]
    fn missed_heartbeats_expire_and_renewing_says_so() {
        let t0 = Utc::now();
        let mut lease = CapacityLease::request(Uuid::nil(), request(), "agents", t0, ttl());
        lease.grant(t0, ttl()).unwrap();
        assert!(lease.expire(t0 + Duration::seconds(119)).is_err());
        let ended = lease.expire(t0 + Duration::seconds(120)).unwrap().unwrap();
        assert_eq!(ended.event.payload["state"], "Expired");
        let err = lease.renew(t0 + Duration::seconds(121), ttl()).unwrap_err();
        assert!(
            err.to_string().contains("expired; acquire a new lease"),
            "{err}"
        );
    }

    #[derive(Clone, Debug)]
    enum Command {
        Grant,
        Deny,
        Renew,
        Release,
        Expire,
        Wait(i64),
    }

    fn command() -> impl Strategy<Value = Command> {
        prop_oneof![
            Just(Command::Grant),
            Just(Command::Deny),
            Just(Command::Renew),
            Just(Command::Release),
            Just(Command::Expire),
            (1i64..300).prop_map(Command::Wait),
        ]
    }

    fn allowed(from: LeaseState, to: LeaseState) -> bool {
        use LeaseState::*;
        from == to
            || matches!(
                (from, to),
                (Requested, Granted)
                    | (Requested, Denied)
                    | (Granted, Active)
                    | (Granted, Expired)
                    | (Granted, Released)
                    | (Active, Released)
                    | (Active, Expired)
            )
    }

    proptest! {
        #[test]
        fn random_commands_only_take_allowed_edges(commands in proptest::collection::vec(command(), 1..40)) {
            let t0 = Utc::now();
            let mut now = t0;
            let mut lease = CapacityLease::request(Uuid::nil(), request(), "agents", now, ttl());
            let mut capacity_held = false;
            for c in commands {
                let before = lease.clone();
                match c {
                    Command::Grant => {
                        if lease.grant(now, ttl()).is_ok() { capacity_held = true; }
                    }
                    Command::Deny => { let _ = lease.deny("no".into(), None, now); }
                    Command::Renew => { let _ = lease.renew(now, ttl()); }
                    Command::Release => {
                        if let Some(ended) = lease.release(now) {
                            prop_assert!(ended.freed && capacity_held);
                            capacity_held = false;
                        }
                    }
                    Command::Expire => {
                        if let Ok(Some(_)) = lease.expire(now) {
                            prop_assert!(capacity_held);
                            capacity_held = false;
                        }
                    }
                    Command::Wait(s) => now += Duration::seconds(s),
                }
                prop_assert!(allowed(before.state, lease.state), "{:?} -> {:?}", before.state, lease.state);
                if before.state.is_terminal() {
                    prop_assert_eq!(&before, &lease, "terminal states are final");
                }
                // Capacity is held exactly in Granted and Active.
                prop_assert_eq!(capacity_held, lease.state.holds_capacity());
                prop_assert_eq!(lease.granted_at.is_some(), !matches!(lease.state, LeaseState::Requested | LeaseState::Denied));
                prop_assert_eq!(lease.released_at.is_some(), lease.state.is_terminal());
                if lease.state.holds_capacity() || lease.state == LeaseState::Requested {
                    prop_assert!(lease.expires_at.is_some());
                }
            }
        }
    }
}
