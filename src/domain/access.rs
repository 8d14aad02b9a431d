//! Who may do what: the scopes of the specifications and the console roles.
//!
//! A client credential carries scopes; a console user holds roles, each of
//! which stands for a set of scopes. Every API operation requires one scope.
//! Crossing tenants requires [`Scope::Platform`], which only credentials of
//! the platform tenant can hold.
//!
//! What a caller has established is a value: a [`TenantScope`] for one
//! tenant's data, a [`PlatformScope`] across tenants. The store takes one
//! on every read and write.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::{DomainError, FieldError};
use super::ids::TenantId;

macro_rules! scopes {
    ($(#[doc = $doc:literal] $variant:ident = $text:literal),* $(,)?) => {
        /// One permission an access token can carry.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub enum Scope {
            $(#[doc = $doc] #[serde(rename = $text)] $variant,)*
        }

        impl Scope {
            /// Every scope the appliance knows.
            pub const ALL: &'static [Scope] = &[$(Scope::$variant),*];

            /// The scope's name on the wire.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Scope::$variant => $text,)*
                }
            }

            /// Whether only principals of the platform tenant may hold it:
            /// crossing tenants, and scraping the appliance's metrics (which
            /// describe every tenant).
            pub fn platform_only(self) -> bool {
                matches!(self, Scope::Platform | Scope::MetricsRead)
            }

            /// What the scope allows, in one line.
            pub fn summary(self) -> &'static str {
                match self {
                    $(Scope::$variant => $doc.trim_ascii(),)*
                }
            }
        }
    };
}

/// Every scope with what it allows, and what makes a credential a
/// PlatformAdmin: for help texts.
pub fn scope_help() -> String {
    let mut text = String::from("Scopes:\n");
    for scope in Scope::ALL {
        text.push_str(&format!("  {:<24} {}\n", scope.as_str(), scope.summary()));
    }
    text.push_str(&format!(
        "\nA client of tenant {} holding {} acts as PlatformAdmin: it crosses tenants, manages\npools, tenants and editions. Only the platform tenant's clients can hold it.",
        crate::domain::TenantId::platform(),
        Scope::Platform.as_str()
    ));
    text
}

scopes! {
    /// Read pools, quotas and leases.
    CapacityRead = "factory.capacity.read",
    /// Change pools (PlatformAdmin) and tighten quotas (WorkspaceAdmin).
    CapacityAdmin = "factory.capacity.admin",
    /// Acquire, renew and release capacity leases.
    CapacityLease = "factory.capacity.lease",
    /// Read runs, attempt timelines and checkpoints.
    RunsRead = "factory.runs.read",
    /// Submit and cancel runs.
    RunsWrite = "factory.runs.write",
    /// Answer decisions: approve, reject, give input.
    RunsDecide = "factory.runs.decide",
    /// Interrupt attempts and settle uncertain calls.
    RunsOperate = "factory.runs.operate",
    /// Act as an external execution adapter: claim attempts, report calls.
    RunsExecute = "factory.runs.execute",
    /// Read loaded releases.
    AssetsRead = "factory.assets.read",
    /// Import, deprecate and revoke releases.
    AssetsAdmin = "factory.assets.admin",
    /// Read the event stream.
    EventsRead = "agentbay.events.read",
    /// Scrape `/metrics`.
    MetricsRead = "agentbay.metrics.read",
    /// Manage client credentials and users of the tenant.
    Admin = "agentbay.admin",
    /// Act across tenants: the PlatformAdmin's scope.
    Platform = "agentbay.platform",
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = FieldError;

    fn from_str(s: &str) -> Result<Self, FieldError> {
        Scope::ALL
            .iter()
            .copied()
            .find(|scope| scope.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = Scope::ALL.iter().map(|s| s.as_str()).collect();
                FieldError::new(
                    "scopes",
                    format!("unknown scope {s:?}; known scopes: {}", known.join(", ")),
                )
            })
    }
}

/// Parses a list of scope names, rejecting unknown and empty lists.
pub fn parse_scopes<S: AsRef<str>>(names: &[S]) -> Result<BTreeSet<Scope>, FieldError> {
    if names.is_empty() {
        return Err(FieldError::new("scopes", "at least one scope is required"));
    }
    names.iter().map(|n| n.as_ref().parse()).collect()
}

/// Who acts on the appliance's principals (users and credentials): the
/// principal a request runs as, or the appliance's owner at the machine
/// (the offline CLI, the first start), who holds every scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Actor {
    /// Who, as records and events name it.
    pub name: String,
    /// The tenant it acts for.
    pub tenant: TenantId,
    /// What it may do.
    pub scopes: BTreeSet<Scope>,
}

impl Actor {
    /// The appliance's owner at the machine: every scope, platform tenant.
    pub fn owner(name: &str) -> Actor {
        Actor {
            name: name.to_string(),
            tenant: TenantId::platform(),
            scopes: Scope::ALL.iter().copied().collect(),
        }
    }

    /// Whether it acts across tenants.
    pub fn is_platform_admin(&self) -> bool {
        self.tenant.is_platform() && self.scopes.contains(&Scope::Platform)
    }

    /// The one rule of who manages whom: an actor may create, change,
    /// reset, disable, enable or revoke a user or credential only when
    /// every scope the target holds (or would hold) is one it holds itself.
    /// `what` says what was asked, for the refusal, which names the scopes
    /// the actor lacks.
    pub fn may_manage(&self, target: &BTreeSet<Scope>, what: &str) -> Result<(), DomainError> {
        let lacking: Vec<&str> = target
            .difference(&self.scopes)
            .map(|s| s.as_str())
            .collect();
        if lacking.is_empty() {
            return Ok(());
        }
        Err(DomainError::Refused(format!(
            "{} cannot {what}: that needs the scopes {}, which it does not hold",
            self.name,
            lacking.join(", ")
        )))
    }
}

/// A console role within a tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Submits runs and reads their progress.
    Requester,
    /// Decides approvals and answers questions.
    Reviewer,
    /// Interrupts attempts and settles uncertain calls.
    Operator,
    /// Tightens quotas and manages the tenant's users and credentials.
    WorkspaceAdmin,
    /// Manages pools, tenants and everything across tenants.
    PlatformAdmin,
    /// Reads everything of the tenant, changes nothing.
    Observer,
}

/// Who is expected to answer a decision: anyone holding a role, or one
/// user of the tenant. Written `role:Reviewer` or `user:alice`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Assignee {
    /// Whoever holds the role.
    Role(Role),
    /// One user, by name.
    User(String),
}

impl Assignee {
    /// Parses `role:<Role>` or `user:<name>`, naming `field` when it is
    /// neither.
    pub fn parse(field: &str, text: &str) -> Result<Assignee, FieldError> {
        let bad = || {
            FieldError::new(
                field,
                format!(
                    "{text:?} is not role:<{}> or user:<name>",
                    Role::ALL
                        .iter()
                        .map(|r| r.as_str())
                        .collect::<Vec<_>>()
                        .join("|")
                ),
            )
        };
        match text.split_once(':') {
            Some(("role", name)) => Role::ALL
                .iter()
                .find(|r| r.as_str() == name)
                .map(|r| Assignee::Role(*r))
                .ok_or_else(bad),
            Some(("user", name))
                if !name.is_empty()
                    && name.chars().count() <= 64
                    && !name.chars().any(|c| c.is_control() || c.is_whitespace()) =>
            {
                Ok(Assignee::User(name.to_string()))
            }
            _ => Err(bad()),
        }
    }

    /// Whether the user `name` with `roles` is who is expected.
    pub fn includes(&self, name: &str, roles: &[Role]) -> bool {
        match self {
            Assignee::Role(role) => roles.contains(role),
            Assignee::User(user) => user == name,
        }
    }

    /// In words, for pages: `anyone with role Reviewer`, `user alice`.
    pub fn words(&self) -> String {
        match self {
            Assignee::Role(role) => format!("anyone with role {}", role.as_str()),
            Assignee::User(user) => format!("user {user}"),
        }
    }
}

impl From<Assignee> for String {
    fn from(a: Assignee) -> String {
        match a {
            Assignee::Role(role) => format!("role:{}", role.as_str()),
            Assignee::User(user) => format!("user:{user}"),
        }
    }
}

impl TryFrom<String> for Assignee {
    type Error = String;
    fn try_from(text: String) -> Result<Assignee, String> {
        Assignee::parse("assignee", &text).map_err(|e| e.to_string())
    }
}

impl Role {
    /// Every role, from the least to the most powerful.
    pub const ALL: &'static [Role] = &[
        Role::Observer,
        Role::Requester,
        Role::Reviewer,
        Role::Operator,
        Role::WorkspaceAdmin,
        Role::PlatformAdmin,
    ];

    /// The role's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Requester => "Requester",
            Role::Reviewer => "Reviewer",
            Role::Operator => "Operator",
            Role::WorkspaceAdmin => "WorkspaceAdmin",
            Role::PlatformAdmin => "PlatformAdmin",
            Role::Observer => "Observer",
        }
    }

    /// The scopes the role stands for.
    pub fn scopes(self) -> BTreeSet<Scope> {
        use Scope::*;
        let read = [CapacityRead, RunsRead, AssetsRead, EventsRead];
        let mut set: BTreeSet<Scope> = read.into_iter().collect();
        match self {
            Role::Observer => {}
            Role::Requester => {
                set.insert(RunsWrite);
            }
            Role::Reviewer => {
                set.insert(RunsDecide);
            }
            Role::Operator => {
                set.extend([RunsWrite, RunsOperate]);
            }
            Role::WorkspaceAdmin => {
                set.extend([
                    RunsWrite,
                    RunsOperate,
                    RunsDecide,
                    CapacityAdmin,
                    AssetsAdmin,
                    Admin,
                ]);
            }
            Role::PlatformAdmin => set.extend(Scope::ALL.iter().copied()),
        }
        set
    }
}

/// Proof that the caller has established which tenant's data it touches.
///
/// Built by `auth` from an authenticated principal (for its own tenant, or
/// for any tenant when the principal is a PlatformAdmin) and by internal
/// workers that act for the tenant of the record they process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TenantScope(TenantId);

impl TenantScope {
    /// A scope for `tenant`. Callers are `auth` (after checking the
    /// principal may act for it) and workers acting on a record's own tenant.
    pub fn new(tenant: TenantId) -> TenantScope {
        TenantScope(tenant)
    }

    /// The tenant.
    pub fn tenant(&self) -> &TenantId {
        &self.0
    }
}

/// Proof that the caller may read across tenants: a PlatformAdmin principal
/// or an internal worker.
#[derive(Clone, Debug)]
pub struct PlatformScope(());

impl PlatformScope {
    /// Only `auth` (for PlatformAdmins) and the appliance's own workers
    /// construct this.
    pub(crate) fn internal() -> PlatformScope {
        PlatformScope(())
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_assignee_is_a_role_or_a_user_and_says_whom_it_includes() {
        let role = Assignee::parse("assignee", "role:Reviewer").unwrap();
        assert!(role.includes("bob", &[Role::Observer, Role::Reviewer]));
        assert!(!role.includes("bob", &[Role::Operator]));
        let user = Assignee::parse("assignee", "user:alice").unwrap();
        assert!(user.includes("alice", &[]) && !user.includes("bob", &[Role::Reviewer]));
        assert_eq!(String::from(user), "user:alice");
        for bad in ["role:Chief", "alice", "user:", "user:a b", "group:x"] {
            let e = Assignee::parse("assignee", bad).unwrap_err();
            assert!(e.reason.contains("role:<Observer|"), "{bad}: {e}");
        }
    }

    use super::*;

    #[test]
    fn scopes_parse_and_reject_unknown_names() {
        let set = parse_scopes(&["factory.capacity.read", "agentbay.admin"]).unwrap();
        assert!(set.contains(&Scope::CapacityRead));
        assert!(set.contains(&Scope::Admin));
        let err = parse_scopes(&["factory.capacity.reed"]).unwrap_err();
        assert_eq!(err.field, "scopes");
        assert!(err.reason.contains("factory.capacity.reed"));
        assert!(err.reason.contains("factory.capacity.read"));
        assert!(parse_scopes::<&str>(&[]).is_err());
    }

    #[test]
    fn only_platform_admin_crosses_tenants() {
        for role in [
            Role::Requester,
            Role::Reviewer,
            Role::Operator,
            Role::WorkspaceAdmin,
            Role::Observer,
        ] {
            assert!(!role.scopes().contains(&Scope::Platform), "{role:?}");
        }
        assert!(Role::PlatformAdmin.scopes().contains(&Scope::Platform));
        assert!(!Role::Observer.scopes().contains(&Scope::RunsWrite));
    }
}
