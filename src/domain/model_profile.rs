//! Site model profiles: where a model profile id points on this site.
//!
//! A release names a model profile id (and may carry a default endpoint).
//! The site maps profile ids to its own model servers: a PlatformAdmin sets
//! a profile for every tenant (owner: the platform) or for one tenant
//! (owner: that tenant), and the one of the attempt's tenant wins over the
//! platform's, which wins over the release's own. Re-pointing a profile
//! moves the next model call; nothing is signed or imported again.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{FieldError, TenantId};

/// A site's mapping of one profile id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteModelProfile {
    /// The platform (every tenant) or one tenant.
    pub tenant_id: TenantId,
    /// The profile id releases name (`modelProfile.id`).
    pub profile_id: String,
    /// Base URL of an OpenAI-compatible chat-completions API on the site.
    pub endpoint: String,
    /// Servers a call moves to, in order, when the one before cannot
    /// serve now (refused the connection, timed out before answering,
    /// 429, 502, 503, 504): never when it says the request is wrong.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_endpoints: Vec<String>,
    /// The model name the server is asked for.
    pub model: String,
    /// Name of an API key under `[runtime.model_api_keys]`, never the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_ref: Option<String>,
    /// Seconds one call may take.
    pub timeout_seconds: u32,
    /// What its server takes: calls in flight, requests and tokens a
    /// minute, for every caller together.
    #[serde(default)]
    pub limits: ServerLimits,
    /// When and by whom it was last set.
    pub updated_at: DateTime<Utc>,
    /// Who.
    pub updated_by: String,
    /// The stored state this value was read from (0: new).
    #[serde(default)]
    pub version: u64,
}

/// What setting a profile asks for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfileSpec {
    /// Profile id.
    pub profile_id: String,
    /// Endpoint.
    pub endpoint: String,
    /// Fallback endpoints, in order.
    pub fallback_endpoints: Vec<String>,
    /// Model name.
    pub model: String,
    /// API key name.
    pub api_key_ref: Option<String>,
    /// Seconds; 0 or none: 120.
    pub timeout_seconds: Option<u32>,
    /// Its server's limits (0: none).
    pub limits: ServerLimits,
}

/// The limits of a site's model server, enforced for every caller (the
/// builtin loop and `CallModel` alike): a call beyond them waits in a
/// queue fair between tenants. None: no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerLimits {
    /// Calls in flight at once (a llama.cpp server's slots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// Calls started in any minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    /// Tokens (input and output) of the calls that ended in any minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u32>,
}

impl ServerLimits {
    /// Limits from the wire's numbers (0: none), checked.
    pub fn of(
        max_concurrent: u32,
        requests_per_minute: u32,
        tokens_per_minute: u32,
    ) -> Result<ServerLimits, FieldError> {
        let bounded = |field: &str, n: u32, most: u32| match n {
            0 => Ok(None),
            n if n > most => Err(FieldError::new(
                field,
                format!("{n} is more than {most} (0: no limit)"),
            )),
            n => Ok(Some(n)),
        };
        Ok(ServerLimits {
            max_concurrent: bounded("maxConcurrent", max_concurrent, 10_000)?,
            requests_per_minute: bounded("requestsPerMinute", requests_per_minute, 1_000_000)?,
            tokens_per_minute: bounded("tokensPerMinute", tokens_per_minute, 1_000_000_000)?,
        })
    }

    /// The limits in words, for the console and the command line.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = [
            self.max_concurrent.map(|n| format!("{n} calls at once")),
            self.requests_per_minute
                .map(|n| format!("{n} requests/min")),
            self.tokens_per_minute.map(|n| format!("{n} tokens/min")),
        ]
        .into_iter()
        .flatten()
        .collect();
        if parts.is_empty() {
            "no limits".into()
        } else {
            parts.join(", ")
        }
    }
}

impl SiteModelProfile {
    /// Where it points, as the audit trail shows a change of it.
    pub fn settings(&self) -> serde_json::Value {
        serde_json::json!({
            "endpoint": self.endpoint,
            "fallbackEndpoints": self.fallback_endpoints,
            "model": self.model,
            "apiKeyRef": self.api_key_ref,
            "timeoutSeconds": self.timeout_seconds,
            "limits": self.limits,
        })
    }

    /// Checks a spec and makes the profile, naming the field at fault.
    /// `known_key` says whether an API key name is configured.
    pub fn new(
        owner: TenantId,
        spec: ProfileSpec,
        known_key: impl Fn(&str) -> bool,
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<SiteModelProfile, FieldError> {
        let id = spec.profile_id.trim();
        if id.is_empty()
            || id.len() > 128
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(FieldError::new(
                "profileId",
                "is required: 1 to 128 of a-z, A-Z, 0-9, '-', '_', '.' (the id releases name)",
            ));
        }
        let endpoint = server_url("endpoint", &spec.endpoint)?;
        if spec.fallback_endpoints.len() > MAX_FALLBACKS {
            return Err(FieldError::new(
                "fallbackEndpoints",
                format!(
                    "has {} servers; at most {MAX_FALLBACKS}",
                    spec.fallback_endpoints.len()
                ),
            ));
        }
        let mut fallback_endpoints = Vec::with_capacity(spec.fallback_endpoints.len());
        for (i, url) in spec.fallback_endpoints.iter().enumerate() {
            let field = format!("fallbackEndpoints[{i}]");
            let url = server_url(&field, url)?;
            if url == endpoint || fallback_endpoints.contains(&url) {
                return Err(FieldError::new(
                    field,
                    "names a server the profile already lists",
                ));
            }
            fallback_endpoints.push(url);
        }
        FieldError::require(
            "model",
            &spec.model,
            "the model name the server is asked for",
        )?;
        let api_key_ref = spec
            .api_key_ref
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty());
        if let Some(k) = &api_key_ref
            && !known_key(k)
        {
            return Err(FieldError::new(
                "apiKeyRef",
                format!("{k:?} is not a key under [runtime.model_api_keys]"),
            ));
        }
        let timeout = spec.timeout_seconds.filter(|t| *t > 0).unwrap_or(120);
        if timeout > 3600 {
            return Err(FieldError::new(
                "timeoutSeconds",
                format!("{timeout} is more than 3600"),
            ));
        }
        Ok(SiteModelProfile {
            tenant_id: owner,
            profile_id: id.to_string(),
            endpoint,
            fallback_endpoints,
            model: spec.model.trim().to_string(),
            api_key_ref,
            timeout_seconds: timeout,
            limits: spec.limits,
            updated_at: now,
            updated_by: by.to_string(),
            version: 0,
        })
    }

    /// Its servers, in the order a call tries them.
    pub fn servers(&self) -> Vec<String> {
        std::iter::once(&self.endpoint)
            .chain(&self.fallback_endpoints)
            .cloned()
            .collect()
    }

    /// Whom it applies to, in words.
    pub fn scope_text(&self) -> String {
        if self.tenant_id == TenantId::platform() {
            "every tenant".into()
        } else {
            format!("tenant {}", self.tenant_id)
        }
    }
}

/// The most fallback servers one profile lists.
pub const MAX_FALLBACKS: usize = 4;

/// A model server's base URL, checked: an http(s) URL with a host and no
/// credential, without a trailing slash.
fn server_url(field: &str, url: &str) -> Result<String, FieldError> {
    let endpoint = url.trim().trim_end_matches('/');
    let parsed = url::Url::parse(endpoint).map_err(|e| {
        FieldError::new(
            field,
            format!("{:?} is not a URL: {e}", super::reach::redacted(endpoint)),
        )
    })?;
    super::reach::credential_free(&parsed).map_err(|why| FieldError::new(field, why))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(FieldError::new(
            field,
            format!("{endpoint:?} must be an http:// or https:// URL with a host"),
        ));
    }
    Ok(endpoint.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ProfileSpec {
        ProfileSpec {
            profile_id: "triage-llm".into(),
            endpoint: "http://llm.local:8080/v1/".into(),
            fallback_endpoints: vec!["http://llm-b.local:8080/v1".into()],
            model: "qwen".into(),
            api_key_ref: Some("site".into()),
            timeout_seconds: None,
            limits: ServerLimits::default(),
        }
    }

    #[test]
    fn a_profile_names_the_field_at_fault() {
        let now = Utc::now();
        let ok =
            SiteModelProfile::new(TenantId::platform(), spec(), |k| k == "site", "a", now).unwrap();
        assert_eq!(ok.endpoint, "http://llm.local:8080/v1");
        assert_eq!(ok.timeout_seconds, 120);
        let bad = |edit: fn(&mut ProfileSpec), field: &str| {
            let mut s = spec();
            edit(&mut s);
            let e = SiteModelProfile::new(TenantId::platform(), s, |k| k == "site", "a", now)
                .unwrap_err();
            assert_eq!(e.field, field, "{e}");
        };
        bad(|s| s.profile_id = "a b".into(), "profileId");
        bad(|s| s.endpoint = "ftp://x".into(), "endpoint");
        bad(|s| s.endpoint = "not a url".into(), "endpoint");
        bad(|s| s.model = " ".into(), "model");
        bad(|s| s.api_key_ref = Some("other".into()), "apiKeyRef");
        bad(|s| s.timeout_seconds = Some(4000), "timeoutSeconds");
        bad(
            |s| s.fallback_endpoints.push("gopher://x".into()),
            "fallbackEndpoints[1]",
        );
        bad(
            |s| {
                s.fallback_endpoints
                    .push("http://llm.local:8080/v1/".into())
            },
            "fallbackEndpoints[1]",
        );
        bad(
            |s| s.fallback_endpoints = vec!["http://a".into(); 5],
            "fallbackEndpoints",
        );
        assert_eq!(
            ok.servers(),
            ["http://llm.local:8080/v1", "http://llm-b.local:8080/v1"]
        );
    }
}
