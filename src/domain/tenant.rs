//! Tenants and projects: the registry every other record refers to.
//!
//! The appliance stands in for the commercial service (a tenant's edition,
//! which sets its quota defaults) and the residency service (the regions
//! its pools may be in). PlatformAdmins manage the registry.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::error::{DomainError, FieldError};
use super::events::{EventPayload, NewEvent};
use super::ids::{ProjectId, TenantId};
use super::retention::RetentionOverride;

/// A registered tenant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tenant {
    /// The tenant.
    pub tenant_id: TenantId,
    /// Name shown to people.
    pub display_name: String,
    /// Edition: names the quota defaults (`starter`, `team`, `platform`, or
    /// one defined in configuration).
    pub edition: String,
    /// Regions the tenant's work may run in; empty for any region.
    pub residency_regions: Vec<String>,
    /// When it was registered.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// Its overrides of the configured retention.
    #[serde(default)]
    pub retention: RetentionOverride,
}

/// A project of a tenant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Project {
    /// Its tenant.
    pub tenant_id: TenantId,
    /// The project.
    pub project_id: ProjectId,
    /// Name shown to people.
    pub display_name: String,
    /// When it was registered.
    pub created_at: DateTime<Utc>,
}

/// What a PlatformAdmin sets on a tenant.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantSpec {
    /// Name shown to people; the id when absent.
    #[serde(default)]
    pub display_name: Option<String>,
    /// Edition name.
    pub edition: String,
    /// Allowed regions; empty for any.
    #[serde(default)]
    pub residency_regions: Vec<String>,
    /// Retention overrides (days; `null` inherits the configuration's).
    /// Absent: the tenant keeps the overrides it has.
    #[serde(default)]
    pub retention: Option<RetentionOverride>,
}

/// Payload of `agentbay.platform.v1.tenant-changed`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantChanged<'a> {
    /// The tenant.
    pub tenant_id: &'a TenantId,
    /// Its edition.
    pub edition: &'a str,
    /// Its residency regions.
    pub residency_regions: &'a [String],
    /// Whether it was created by this change.
    pub created: bool,
}

impl EventPayload for TenantChanged<'_> {
    const TOPIC: &'static str = "agentbay.platform.v1.tenant-changed";
}

/// Payload of `agentbay.platform.v1.project-changed`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectChanged<'a> {
    /// Its tenant.
    pub tenant_id: &'a TenantId,
    /// The project.
    pub project_id: &'a ProjectId,
}

impl EventPayload for ProjectChanged<'_> {
    const TOPIC: &'static str = "agentbay.platform.v1.project-changed";
}

/// Checks a region name: a slug-like word.
pub fn check_region(field: &str, region: &str) -> Result<(), FieldError> {
    let ok = !region.is_empty()
        && region.len() <= 63
        && region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!("{region:?} is not a region name (a-z, 0-9 and '-', at most 63)"),
        ))
    }
}

fn display_name(field: &str, given: Option<String>, fallback: &str) -> Result<String, FieldError> {
    let name = given.map(|s| s.trim().to_string()).unwrap_or_default();
    if name.chars().count() > 100 {
        return Err(FieldError::new(field, "is longer than 100 characters"));
    }
    Ok(if name.is_empty() {
        fallback.to_string()
    } else {
        name
    })
}

impl Tenant {
    /// Creates or changes a tenant. `editions` are the edition names known
    /// to this appliance.
    pub fn put(
        existing: Option<&Tenant>,
        tenant_id: TenantId,
        spec: TenantSpec,
        editions: &[String],
        now: DateTime<Utc>,
    ) -> Result<(Tenant, NewEvent), DomainError> {
        if !editions.contains(&spec.edition) {
            return Err(FieldError::new(
                "edition",
                format!(
                    "unknown edition {:?}; known editions: {}",
                    spec.edition,
                    editions.join(", ")
                ),
            )
            .into());
        }
        if tenant_id.is_platform() && spec.edition != "platform" {
            return Err(FieldError::new(
                "edition",
                "the platform tenant stays on the platform edition",
            )
            .into());
        }
        let mut regions = Vec::new();
        for (i, region) in spec.residency_regions.iter().enumerate() {
            check_region(&format!("residencyRegions[{i}]"), region)?;
            if !regions.contains(region) {
                regions.push(region.clone());
            }
        }
        if let Some(r) = &spec.retention {
            r.check()?;
        }
        let tenant = Tenant {
            retention: spec
                .retention
                .or(existing.map(|t| t.retention))
                .unwrap_or_default(),
            // What a change does not name, it keeps.
            display_name: display_name(
                "displayName",
                spec.display_name
                    .or_else(|| existing.map(|t| t.display_name.clone())),
                tenant_id.as_str(),
            )?,
            tenant_id,
            edition: spec.edition,
            residency_regions: regions,
            created_at: existing.map_or(now, |t| t.created_at),
            updated_at: now,
        };
        let event = NewEvent::new(
            &tenant.tenant_id,
            now,
            &TenantChanged {
                tenant_id: &tenant.tenant_id,
                edition: &tenant.edition,
                residency_regions: &tenant.residency_regions,
                created: existing.is_none(),
            },
        );
        Ok((tenant, event))
    }

    /// Whether a pool in `region` may serve this tenant.
    pub fn allows_region(&self, region: &str) -> bool {
        self.residency_regions.is_empty() || self.residency_regions.iter().any(|r| r == region)
    }
}

impl Project {
    /// Creates or renames a project.
    pub fn put(
        existing: Option<&Project>,
        tenant_id: TenantId,
        project_id: ProjectId,
        display: Option<String>,
        now: DateTime<Utc>,
    ) -> Result<(Project, NewEvent), DomainError> {
        let project = Project {
            display_name: display_name(
                "displayName",
                display.or_else(|| existing.map(|p| p.display_name.clone())),
                project_id.as_str(),
            )?,
            tenant_id,
            project_id,
            created_at: existing.map_or(now, |p| p.created_at),
        };
        let event = NewEvent::new(
            &project.tenant_id,
            now,
            &ProjectChanged {
                tenant_id: &project.tenant_id,
                project_id: &project.project_id,
            },
        );
        Ok((project, event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn editions() -> Vec<String> {
        vec!["starter".into(), "team".into(), "platform".into()]
    }

    #[test]
    fn tenants_name_a_known_edition_and_valid_regions() {
        let spec = TenantSpec {
            display_name: Some("Acme".into()),
            edition: "starter".into(),
            residency_regions: vec!["eu-west".into(), "eu-west".into()],
            retention: None,
        };
        let (t, event) = Tenant::put(
            None,
            TenantId::parse("acme").unwrap(),
            spec,
            &editions(),
            Utc::now(),
        )
        .unwrap();
        assert_eq!(t.residency_regions, vec!["eu-west"]);
        assert!(t.allows_region("eu-west"));
        assert!(!t.allows_region("us-east"));
        assert_eq!(event.payload["created"], true);

        let err = Tenant::put(
            None,
            TenantId::parse("acme").unwrap(),
            TenantSpec {
                edition: "gold".into(),
                ..TenantSpec::default()
            },
            &editions(),
            Utc::now(),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("known editions: starter, team, platform"),
            "{err}"
        );

        let err = Tenant::put(
            None,
            TenantId::parse("acme").unwrap(),
            TenantSpec {
                edition: "team".into(),
                residency_regions: vec!["EU West".into()],
                ..TenantSpec::default()
            },
            &editions(),
            Utc::now(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("residencyRegions[0]"), "{err}");
    }
}
