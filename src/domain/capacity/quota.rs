//! Quotas: edition defaults, tightened by tenants and projects.
//!
//! Each level (edition, tenant, project) may set any limit or leave it to
//! its parent. The effective value of a limit is the smallest set at any
//! level on the path, and it names the level it came from. A tenant quota
//! may only tighten its edition's, and a project quota its tenant's: a
//! `SetQuota` that would loosen a limit beyond its parent is refused with the
//! field, the requested value and the parent's bound.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use uuid::Uuid;

use crate::domain::access::{Actor, Scope};
use crate::domain::amount::Amount;
use crate::domain::error::{DomainError, FieldError};
use crate::domain::events::{EventPayload, NewEvent};
use crate::domain::ids::{ProjectId, TenantId, new_id};

/// Limits set at one level; `None` leaves the limit to the parent (or
/// unlimited at the edition).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaLimits {
    /// Concurrent attempt and build leases.
    #[serde(default)]
    pub concurrent_runs: Option<u32>,
    /// Concurrent sandbox and browser-session leases.
    #[serde(default)]
    pub concurrent_sandboxes: Option<u32>,
    /// Largest CPU one lease may ask for.
    #[serde(default)]
    pub cpu_per_attempt: Option<Amount>,
    /// Largest memory one lease may ask for, in GB.
    #[serde(default)]
    pub memory_gb_per_attempt: Option<Amount>,
    /// Lease minutes per UTC day: minutes leases held CPU and memory
    /// (not minutes a run held only its run slot).
    #[serde(default)]
    pub execution_minutes_per_day: Option<u32>,
    /// Model tokens (input and output) per UTC day; past it, new model
    /// calls are refused.
    #[serde(default)]
    pub tokens_per_day: Option<u64>,
}

/// Where a quota applies.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(tag = "level", rename_all = "camelCase")]
pub enum QuotaScope {
    /// The defaults of an edition (PlatformAdmins).
    Edition {
        /// Edition name.
        edition: String,
    },
    /// A tenant (PlatformAdmins).
    #[serde(rename_all = "camelCase")]
    Tenant {
        /// The tenant.
        tenant_id: TenantId,
    },
    /// A project of a tenant (WorkspaceAdmin).
    #[serde(rename_all = "camelCase")]
    Project {
        /// The tenant.
        tenant_id: TenantId,
        /// The project.
        project_id: ProjectId,
    },
}

impl QuotaScope {
    /// Who may set the limits of this level: edition defaults and tenant
    /// limits are the platform's (PlatformAdmins); a project's limits are
    /// its tenant's (a principal of that tenant holding
    /// `factory.capacity.admin`, such as a WorkspaceAdmin) or the
    /// platform's. Tighten-only holds on top of this, across levels.
    pub fn check_authority(&self, actor: &Actor) -> Result<(), DomainError> {
        if actor.is_platform_admin() {
            return Ok(());
        }
        let refused =
            |why: String| Err(DomainError::Refused(format!("{} cannot {why}", actor.name)));
        match self {
            QuotaScope::Edition { edition } => refused(format!(
                "set the defaults of edition {edition}: that is a PlatformAdmin's"
            )),
            QuotaScope::Tenant { tenant_id } => refused(format!(
                "set the limits of tenant {tenant_id}: tenant limits are set by PlatformAdmins; a WorkspaceAdmin sets its projects' limits, within the tenant's"
            )),
            QuotaScope::Project { tenant_id, .. } if *tenant_id != actor.tenant => {
                refused(format!("set the limits of tenant {tenant_id}'s projects"))
            }
            QuotaScope::Project { .. } if !actor.scopes.contains(&Scope::CapacityAdmin) => {
                refused(format!(
                    "set project limits without the scope {}",
                    Scope::CapacityAdmin
                ))
            }
            QuotaScope::Project { .. } => Ok(()),
        }
    }

    /// Parses the `{scope}` of `PUT /factory/capacity/quotas/{scope}`:
    /// `edition.<name>`, `tenant.<tenantId>` or `project.<tenantId>.<projectId>`.
    pub fn parse(text: &str) -> Result<QuotaScope, FieldError> {
        let bad = || {
            FieldError::new(
                "scope",
                format!(
                    "{text:?} is not a quota scope; use edition.<name>, tenant.<tenantId> or project.<tenantId>.<projectId>"
                ),
            )
        };
        let mut parts = text.split('.');
        let scope = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("edition"), Some(name), None, None) => {
                TenantId::parse_field("scope", name)?;
                QuotaScope::Edition {
                    edition: name.to_string(),
                }
            }
            (Some("tenant"), Some(t), None, None) => QuotaScope::Tenant {
                tenant_id: TenantId::parse_field("scope", t)?,
            },
            (Some("project"), Some(t), Some(p), None) => QuotaScope::Project {
                tenant_id: TenantId::parse_field("scope", t)?,
                project_id: ProjectId::parse_field("scope", p)?,
            },
            _ => return Err(bad()),
        };
        Ok(scope)
    }

    /// The tenant whose data this is (the platform tenant for editions).
    pub fn tenant(&self) -> TenantId {
        match self {
            QuotaScope::Edition { .. } => TenantId::platform(),
            QuotaScope::Tenant { tenant_id } | QuotaScope::Project { tenant_id, .. } => {
                tenant_id.clone()
            }
        }
    }

    /// The store id of the quota within its tenant.
    pub fn record_id(&self) -> String {
        match self {
            QuotaScope::Edition { edition } => format!("edition.{edition}"),
            QuotaScope::Tenant { .. } => "tenant".to_string(),
            QuotaScope::Project { project_id, .. } => format!("project.{project_id}"),
        }
    }
}

impl fmt::Display for QuotaScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaScope::Edition { edition } => write!(f, "edition {edition}"),
            QuotaScope::Tenant { tenant_id } => write!(f, "tenant {tenant_id}"),
            QuotaScope::Project { project_id, .. } => write!(f, "project {project_id}"),
        }
    }
}

/// A quota as stored: the limits set at one level.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Quota {
    /// Stable id.
    pub quota_id: Uuid,
    /// Where it applies.
    pub scope: QuotaScope,
    /// What it sets.
    pub limits: QuotaLimits,
    /// Who set it last (a subject, for the audit trail).
    pub updated_by: String,
    /// When.
    pub updated_at: DateTime<Utc>,
}

/// One limit's effective value and the level it comes from.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Effective<T> {
    /// The value; `None` is unlimited.
    pub value: Option<T>,
    /// The level that set it (`edition starter`, `tenant acme`, ...);
    /// `None` when no level limits it.
    pub source: Option<QuotaScope>,
}

/// The schema of an [`Effective`] limit of `T` in the API: `value` is `T`
/// or null, `source` a quota scope or null, both always present.
fn effective_schema<T: utoipa::PartialSchema>() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::Ref;
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
    let null = || ObjectBuilder::new().schema_type(Type::Null);
    ObjectBuilder::new()
        .description(Some(
            "One limit's effective value (null: unlimited) and the level it comes from (null: no level limits it)",
        ))
        .property("value", OneOfBuilder::new().item(null()).item(T::schema()))
        .required("value")
        .property(
            "source",
            OneOfBuilder::new()
                .item(null())
                .item(Ref::from_schema_name("QuotaScope")),
        )
        .required("source")
        .build()
}

impl<T: Copy + PartialOrd> Effective<T> {
    fn unlimited() -> Self {
        Effective {
            value: None,
            source: None,
        }
    }

    /// Tightens with a level's value, keeping the smaller; on a tie the more
    /// specific level (applied later) is named, since it set the limit
    /// explicitly.
    fn tighten(self, value: Option<T>, level: &QuotaScope) -> Self {
        match (self.value, value) {
            (_, None) => self,
            (None, Some(v)) => Effective {
                value: Some(v),
                source: Some(level.clone()),
            },
            (Some(current), Some(v)) if v <= current => Effective {
                value: Some(v),
                source: Some(level.clone()),
            },
            _ => self,
        }
    }
}

/// Every limit, resolved.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveLimits {
    /// See [`QuotaLimits::concurrent_runs`].
    #[schema(schema_with = effective_schema::<u32>)]
    pub concurrent_runs: Effective<u32>,
    /// See [`QuotaLimits::concurrent_sandboxes`].
    #[schema(schema_with = effective_schema::<u32>)]
    pub concurrent_sandboxes: Effective<u32>,
    /// See [`QuotaLimits::cpu_per_attempt`].
    #[schema(schema_with = effective_schema::<Amount>)]
    pub cpu_per_attempt: Effective<Amount>,
    /// See [`QuotaLimits::memory_gb_per_attempt`].
    #[schema(schema_with = effective_schema::<Amount>)]
    pub memory_gb_per_attempt: Effective<Amount>,
    /// See [`QuotaLimits::execution_minutes_per_day`].
    #[schema(schema_with = effective_schema::<u32>)]
    pub execution_minutes_per_day: Effective<u32>,
    /// See [`QuotaLimits::tokens_per_day`].
    #[schema(schema_with = effective_schema::<u64>)]
    pub tokens_per_day: Effective<u64>,
}

impl EffectiveLimits {
    /// No limit anywhere.
    pub fn unlimited() -> Self {
        EffectiveLimits {
            concurrent_runs: Effective::unlimited(),
            concurrent_sandboxes: Effective::unlimited(),
            cpu_per_attempt: Effective::unlimited(),
            memory_gb_per_attempt: Effective::unlimited(),
            execution_minutes_per_day: Effective::unlimited(),
            tokens_per_day: Effective::unlimited(),
        }
    }

    /// Tightens with the limits of one more level.
    pub fn tighten(self, limits: &QuotaLimits, level: &QuotaScope) -> Self {
        EffectiveLimits {
            concurrent_runs: self.concurrent_runs.tighten(limits.concurrent_runs, level),
            concurrent_sandboxes: self
                .concurrent_sandboxes
                .tighten(limits.concurrent_sandboxes, level),
            cpu_per_attempt: self.cpu_per_attempt.tighten(limits.cpu_per_attempt, level),
            memory_gb_per_attempt: self
                .memory_gb_per_attempt
                .tighten(limits.memory_gb_per_attempt, level),
            execution_minutes_per_day: self
                .execution_minutes_per_day
                .tighten(limits.execution_minutes_per_day, level),
            tokens_per_day: self.tokens_per_day.tighten(limits.tokens_per_day, level),
        }
    }

    /// The limits of a path: edition, then tenant, then project.
    pub fn resolve(levels: &[(&QuotaScope, &QuotaLimits)]) -> Self {
        levels
            .iter()
            .fold(EffectiveLimits::unlimited(), |acc, (scope, limits)| {
                acc.tighten(limits, scope)
            })
    }
}

/// A change to one level's limits: each field absent (unchanged), `null`
/// (left to the parent again) or a value.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuotaPatch {
    /// See [`QuotaLimits::concurrent_runs`].
    #[serde(default, deserialize_with = "present")]
    pub concurrent_runs: Option<Option<u32>>,
    /// See [`QuotaLimits::concurrent_sandboxes`].
    #[serde(default, deserialize_with = "present")]
    pub concurrent_sandboxes: Option<Option<u32>>,
    /// See [`QuotaLimits::cpu_per_attempt`].
    #[serde(default, deserialize_with = "present")]
    pub cpu_per_attempt: Option<Option<f64>>,
    /// See [`QuotaLimits::memory_gb_per_attempt`].
    #[serde(default, deserialize_with = "present")]
    pub memory_gb_per_attempt: Option<Option<f64>>,
    /// See [`QuotaLimits::execution_minutes_per_day`].
    #[serde(default, deserialize_with = "present")]
    pub execution_minutes_per_day: Option<Option<u32>>,
    /// See [`QuotaLimits::tokens_per_day`].
    #[serde(default, deserialize_with = "present")]
    pub tokens_per_day: Option<Option<u64>>,
}

/// Tells an absent field (outer `None`) from an explicit `null`.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Payload of `capacity.quotas.v1.quota-changed`: an effective quota changed.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaChanged<'a> {
    /// The quota that was set.
    pub quota_id: Uuid,
    /// The tenant whose effective quota changed.
    pub tenant_id: &'a TenantId,
    /// The project, for a project quota.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<&'a ProjectId>,
    /// Effective concurrent runs; `null` for unlimited.
    pub concurrent_runs: Option<u32>,
    /// Effective concurrent sandboxes; `null` for unlimited.
    pub concurrent_sandboxes: Option<u32>,
}

impl EventPayload for QuotaChanged<'_> {
    const TOPIC: &'static str = "capacity.quotas.v1.quota-changed";
}

/// Payload of `capacity.quotas.v1.quota-exceeded`: a lease was refused by a
/// quota; the holder waits (or was denied).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaExceeded<'a> {
    /// The tenant.
    pub tenant_id: &'a TenantId,
    /// The project.
    pub project_id: &'a ProjectId,
    /// `attempt`, `sandbox`, `build` or `browser-session`.
    pub holder_kind: &'a str,
    /// The holder.
    pub holder_id: &'a str,
    /// The limiting quota, in words, e.g. `concurrentRuns of project P: 5 in use, limit 5`.
    pub limit: String,
}

impl EventPayload for QuotaExceeded<'_> {
    const TOPIC: &'static str = "capacity.quotas.v1.quota-exceeded";
}

fn check_bound<T: PartialOrd + fmt::Display + Copy>(
    field: &str,
    requested: T,
    parent: &Effective<T>,
    scope: &QuotaScope,
) -> Result<(), FieldError> {
    if let (Some(bound), Some(source)) = (parent.value, &parent.source)
        && requested > bound
    {
        return Err(FieldError::new(
            field,
            format!(
                "requested {requested}, but {source} allows at most {bound}; a quota of {scope} can only tighten its parent's"
            ),
        ));
    }
    Ok(())
}

impl Quota {
    /// Applies a patch to the quota of `scope` (or creates it). `parent` is
    /// the effective limits above this level (unlimited for an edition).
    pub fn set(
        existing: Option<&Quota>,
        scope: QuotaScope,
        patch: &QuotaPatch,
        parent: &EffectiveLimits,
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<Quota, DomainError> {
        let mut limits = existing.map(|q| q.limits.clone()).unwrap_or_default();
        let amount = |field: &str, v: Option<f64>| v.map(|v| Amount::parse(field, v)).transpose();
        if let Some(v) = patch.concurrent_runs {
            limits.concurrent_runs = v;
        }
        if let Some(v) = patch.concurrent_sandboxes {
            limits.concurrent_sandboxes = v;
        }
        if let Some(v) = patch.cpu_per_attempt {
            limits.cpu_per_attempt = amount("cpuPerAttempt", v)?;
        }
        if let Some(v) = patch.memory_gb_per_attempt {
            limits.memory_gb_per_attempt = amount("memoryGbPerAttempt", v)?;
        }
        if let Some(v) = patch.execution_minutes_per_day {
            limits.execution_minutes_per_day = v;
        }
        if let Some(v) = patch.tokens_per_day {
            limits.tokens_per_day = v;
        }
        // Only values this patch sets are checked against the parent: a
        // value set earlier may have been shadowed since by a tightened
        // parent, which is allowed (the effective value is the minimum).
        if let Some(Some(v)) = patch.concurrent_runs {
            check_bound("concurrentRuns", v, &parent.concurrent_runs, &scope)?;
        }
        if let Some(Some(v)) = patch.concurrent_sandboxes {
            check_bound(
                "concurrentSandboxes",
                v,
                &parent.concurrent_sandboxes,
                &scope,
            )?;
        }
        if let (Some(Some(_)), Some(v)) = (patch.cpu_per_attempt, limits.cpu_per_attempt) {
            check_bound("cpuPerAttempt", v, &parent.cpu_per_attempt, &scope)?;
        }
        if let (Some(Some(_)), Some(v)) =
            (patch.memory_gb_per_attempt, limits.memory_gb_per_attempt)
        {
            check_bound(
                "memoryGbPerAttempt",
                v,
                &parent.memory_gb_per_attempt,
                &scope,
            )?;
        }
        if let Some(Some(v)) = patch.execution_minutes_per_day {
            check_bound(
                "executionMinutesPerDay",
                v,
                &parent.execution_minutes_per_day,
                &scope,
            )?;
        }
        if let Some(Some(v)) = patch.tokens_per_day {
            check_bound("tokensPerDay", v, &parent.tokens_per_day, &scope)?;
        }
        Ok(Quota {
            quota_id: existing.map_or_else(new_id, |q| q.quota_id),
            scope,
            limits,
            updated_by: by.to_string(),
            updated_at: now,
        })
    }
}

/// The `QuotaChanged` event for one tenant (or project) whose effective
/// limits are now `effective`.
pub fn quota_changed(
    quota_id: Uuid,
    tenant: &TenantId,
    project: Option<&ProjectId>,
    effective: &EffectiveLimits,
    now: DateTime<Utc>,
) -> NewEvent {
    NewEvent::new(
        tenant,
        now,
        &QuotaChanged {
            quota_id,
            tenant_id: tenant,
            project_id: project,
            concurrent_runs: effective.concurrent_runs.value,
            concurrent_sandboxes: effective.concurrent_sandboxes.value,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edition() -> QuotaScope {
        QuotaScope::Edition {
            edition: "starter".into(),
        }
    }

    fn tenant() -> QuotaScope {
        QuotaScope::Tenant {
            tenant_id: TenantId::parse("acme").unwrap(),
        }
    }

    fn starter() -> QuotaLimits {
        QuotaLimits {
            concurrent_runs: Some(5),
            concurrent_sandboxes: Some(5),
            execution_minutes_per_day: Some(600),
            ..QuotaLimits::default()
        }
    }

    #[test]
    fn effective_limits_take_the_minimum_and_name_the_level() {
        let tenant_limits = QuotaLimits {
            concurrent_runs: Some(3),
            concurrent_sandboxes: Some(9),
            memory_gb_per_attempt: Some(Amount::units(4)),
            ..QuotaLimits::default()
        };
        let (e, t) = (edition(), tenant());
        let eff = EffectiveLimits::resolve(&[(&e, &starter()), (&t, &tenant_limits)]);
        assert_eq!(eff.concurrent_runs.value, Some(3));
        assert_eq!(eff.concurrent_runs.source, Some(tenant()));
        assert_eq!(eff.concurrent_sandboxes.value, Some(5));
        assert_eq!(eff.concurrent_sandboxes.source, Some(edition()));
        assert_eq!(eff.memory_gb_per_attempt.value, Some(Amount::units(4)));
        assert_eq!(eff.cpu_per_attempt.value, None);
    }

    #[test]
    fn a_tenant_quota_may_only_tighten_its_edition() {
        let e = edition();
        let parent = EffectiveLimits::resolve(&[(&e, &starter())]);
        let loosen = QuotaPatch {
            concurrent_runs: Some(Some(30)),
            ..QuotaPatch::default()
        };
        let err = Quota::set(None, tenant(), &loosen, &parent, "test", Utc::now()).unwrap_err();
        let DomainError::Invalid(field) = err else {
            panic!("{err:?}")
        };
        assert_eq!(field.field, "concurrentRuns");
        assert!(field.reason.contains("requested 30"), "{}", field.reason);
        assert!(
            field.reason.contains("edition starter allows at most 5"),
            "{}",
            field.reason
        );

        let tighten = QuotaPatch {
            concurrent_runs: Some(Some(2)),
            cpu_per_attempt: Some(Some(1.5)),
            ..QuotaPatch::default()
        };
        let q = Quota::set(None, tenant(), &tighten, &parent, "test", Utc::now()).unwrap();
        assert_eq!(q.limits.concurrent_runs, Some(2));
        assert_eq!(
            q.limits.cpu_per_attempt,
            Some(Amount::parse("x", 1.5).unwrap())
        );

        // null gives the limit back to the parent; absent keeps it.
        let clear = QuotaPatch {
            concurrent_runs: Some(None),
            ..QuotaPatch::default()
        };
        let q2 = Quota::set(Some(&q), tenant(), &clear, &parent, "test", Utc::now()).unwrap();
        assert_eq!(q2.limits.concurrent_runs, None);
        assert_eq!(q2.limits.cpu_per_attempt, q.limits.cpu_per_attempt);
        assert_eq!(q2.quota_id, q.quota_id);
    }

    #[test]
    fn patches_tell_null_from_absent() {
        let p: QuotaPatch =
            serde_json::from_str(r#"{"concurrentRuns": null, "cpuPerAttempt": 2}"#).unwrap();
        assert_eq!(p.concurrent_runs, Some(None));
        assert_eq!(p.cpu_per_attempt, Some(Some(2.0)));
        assert_eq!(p.concurrent_sandboxes, None);
        assert!(serde_json::from_str::<QuotaPatch>(r#"{"concurrentRun": 1}"#).is_err());
    }

    #[test]
    fn scopes_parse_from_the_path() {
        assert_eq!(QuotaScope::parse("edition.starter").unwrap(), edition());
        assert_eq!(QuotaScope::parse("tenant.acme").unwrap(), tenant());
        assert!(matches!(
            QuotaScope::parse("project.acme.web").unwrap(),
            QuotaScope::Project { .. }
        ));
        assert!(QuotaScope::parse("acme").is_err());
        assert!(QuotaScope::parse("tenant.Acme").is_err());
    }
}
