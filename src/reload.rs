//! Reloading the configuration of the running appliance (SIGHUP,
//! `agentbay reload`, `Admin/ReloadConfiguration`).
//!
//! A reload reads the same sources as the start (the file and the
//! environment, with the command line's values) and checks the whole
//! result first: a file that does not load is refused with its key and
//! reason, and nothing changes. Then:
//!
//! - reloadable keys take effect at once: every `runtime.*` key (decision
//!   timeouts, default corrections and limits, the capacity grace, model API
//!   keys, ...), every `retention.*` key, `log.level`,
//!   `capacity.lease_ttl_seconds` (for leases granted or renewed from then
//!   on), `capacity.edition_defaults` (the effective quotas of every tenant
//!   of a changed edition, with a `QuotaChanged` event each),
//!   `releases.trusted_keys` (added to the store's trusted keys, which
//!   verifies the stored releases again), and of `[auth]` the token
//!   lifetime (tokens issued from then on), the console session lifetimes
//!   (live sessions too) and the failure limits (`failures_per_*`, counting
//!   the failures already seen), every `webhooks.*` and `notify.*` key;
//! - every other changed key is named in a warning and keeps its running
//!   value until the next restart (the listener, the data directory, TLS
//!   files, pools, `auth.hash_memory_mb`, ...).

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use serde::Serialize;

use crate::clock::SharedClock;
use crate::config::{AuthConfig, Config, ConfigError, Live, RetentionConfig, RuntimeConfig};
use crate::releases::Releases;

/// Key prefixes a reload applies.
const RELOADABLE: &[&str] = &[
    "runtime.",
    "retention.",
    "releases.trusted_keys",
    "log.level",
    "capacity.lease_ttl_seconds",
    "capacity.edition_defaults",
    "auth.token_ttl_seconds",
    "auth.session_idle_minutes",
    "auth.session_max_hours",
    "auth.failures_per_",
    "webhooks.",
    "notify.",
];

/// What a reload did.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reloaded {
    /// Changed keys now in force.
    pub applied: Vec<String>,
    /// Changed keys that keep their running value until a restart.
    pub restart_needed: Vec<String>,
    /// When the configuration in force was loaded.
    pub loaded_at: DateTime<Utc>,
    /// From where.
    pub from: String,
}

/// The running configuration and the live sections services read.
pub struct Reloader {
    running: Mutex<Config>,
    loaded: Mutex<(DateTime<Utc>, usize)>,
    /// `runtime.*`, read at every use by the attempt runtime and run control.
    pub runtime: Live<RuntimeConfig>,
    /// `retention.*`, read by the Purger and the console.
    pub retention: Live<RetentionConfig>,
    /// `[webhooks]`, read by the WebhookDispatcher at every pass and try.
    pub webhooks: Live<crate::config::WebhooksConfig>,
    /// `[notify]`, read by the Notifier at every pass and by every link
    /// made.
    pub notify: Live<crate::config::NotifyConfig>,
    /// `[auth]`, read at every token issued, session touched and secret
    /// checked (`hash_memory_mb` only at the start).
    auth: Live<AuthConfig>,
    releases: Arc<Releases>,
    capacity: Arc<crate::capacity::Capacity>,
    store: crate::store::Store,
    clock: SharedClock,
}

impl Reloader {
    /// The reloader of a configuration in force since now.
    pub fn new(
        config: &Config,
        runtime: Live<RuntimeConfig>,
        auth: Live<AuthConfig>,
        releases: Arc<Releases>,
        capacity: Arc<crate::capacity::Capacity>,
        store: crate::store::Store,
        clock: SharedClock,
    ) -> Reloader {
        Reloader {
            runtime,
            retention: Live::new(config.retention.clone()),
            webhooks: Live::new(config.webhooks.clone()),
            notify: Live::new(config.notify.clone()),
            auth,
            loaded: Mutex::new((clock.now(), 0)),
            running: Mutex::new(config.clone()),
            releases,
            capacity,
            store,
            clock,
        }
    }

    /// When the configuration in force was loaded, from where, and how
    /// many reloads there were.
    pub fn loaded(&self) -> (DateTime<Utc>, String, usize) {
        let (at, reloads) = *self.loaded.lock();
        (at, self.running.lock().source.describe(), reloads)
    }

    /// Reads the sources again and applies what can change while running.
    pub async fn reload(&self) -> Result<Reloaded, ConfigError> {
        let source = self.running.lock().source.clone();
        let next = Config::load(source.file.as_deref(), std::env::vars(), &source.cli)?;
        self.apply(next).await
    }

    /// Applies a loaded configuration.
    pub async fn apply(&self, next: Config) -> Result<Reloaded, ConfigError> {
        let before = flatten(&self.running.lock());
        let after = flatten(&next);
        let mut changed: Vec<String> = before
            .keys()
            .chain(after.keys())
            .filter(|k| before.get(*k) != after.get(*k))
            .cloned()
            .collect();
        changed.sort();
        changed.dedup();
        let (applied, restart_needed): (Vec<String>, Vec<String>) = changed
            .into_iter()
            .partition(|k| RELOADABLE.iter().any(|p| k.starts_with(p)));
        // The one change the running state can refuse goes first, so that a
        // refusal leaves everything as it was.
        if applied
            .iter()
            .any(|k| k.starts_with("capacity.edition_defaults"))
        {
            use crate::capacity::CapacityError;
            use crate::domain::DomainError;
            match self
                .capacity
                .set_edition_defaults(&next.capacity.edition_defaults)
                .await
            {
                Ok(()) => {}
                Err(CapacityError::Domain(DomainError::Invalid(e))) => {
                    return Err(ConfigError::new(e.field, e.reason, ""));
                }
                Err(e) => {
                    return Err(ConfigError::new(
                        "capacity.edition_defaults",
                        e.to_string(),
                        "",
                    ));
                }
            }
        }
        if applied.iter().any(|k| k == "log.level") {
            crate::telemetry::set_log_level(&next.log.level)
                .map_err(|e| ConfigError::new("log.level", e, ""))?;
        }
        if applied.iter().any(|k| k == "capacity.lease_ttl_seconds") {
            self.capacity.set_lease_ttl(next.capacity.lease_ttl_seconds);
        }
        if applied
            .iter()
            .any(|k| k.starts_with("releases.trusted_keys"))
        {
            self.releases
                .seed(&next.releases)
                .await
                .map_err(|e| ConfigError::new("releases.trusted_keys", e.to_string(), ""))?;
            if let Err(e) = self.releases.reverify_stale().await {
                tracing::warn!(error = %e, "verifying releases again after a reload");
            }
        }
        self.runtime.set(next.runtime.clone());
        self.retention.set(next.retention.clone());
        self.webhooks.set(next.webhooks.clone());
        self.notify.set(next.notify.clone());
        {
            let mut running = self.running.lock();
            let auth = AuthConfig {
                hash_memory_mb: running.auth.hash_memory_mb,
                ..next.auth
            };
            self.auth.set(auth.clone());
            running.auth = auth;
            running.capacity.edition_defaults = next.capacity.edition_defaults;
            running.runtime = next.runtime;
            running.retention = next.retention;
            running.webhooks = next.webhooks;
            running.notify = next.notify;
            running.releases.trusted_keys = next.releases.trusted_keys;
            running.log.level = next.log.level;
            running.capacity.lease_ttl_seconds = next.capacity.lease_ttl_seconds;
        }
        let now = self.clock.now();
        {
            let mut loaded = self.loaded.lock();
            *loaded = (now, loaded.1 + 1);
        }
        for key in &restart_needed {
            tracing::warn!(key = %key, "configuration key changed; it keeps its running value until the appliance restarts");
        }
        tracing::info!(applied = ?applied, restart_needed = ?restart_needed, "configuration reloaded");
        let done = Reloaded {
            applied,
            restart_needed,
            loaded_at: now,
            from: self.running.lock().source.describe(),
        };
        self.audit(&done).await;
        Ok(done)
    }

    /// Records the reload in the audit trail: by whoever asked
    /// (`agentbay reload`), or by the appliance on SIGHUP. Which keys
    /// changed is kept, never their values (a key can hold a secret).
    async fn audit(&self, done: &Reloaded) {
        use crate::domain::audit::{Change, Origin, Via};
        let origin = crate::acting::current().unwrap_or_else(|| {
            std::sync::Arc::new(Origin {
                actor: "the appliance (SIGHUP)".into(),
                address: "local".into(),
                via: Via::System,
            })
        });
        let change = Change::new(
            &crate::domain::TenantId::platform(),
            "config.reload",
            &done.from,
        )
        .after(serde_json::json!({
            "applied": done.applied,
            "restartNeeded": done.restart_needed,
        }));
        let at = done.loaded_at;
        if let Err(e) = self
            .store
            .transact(move |tx| tx.audit_as(&origin, at, change))
            .await
        {
            tracing::error!(error = %e, "recording the configuration reload in the audit trail");
        }
    }
}

/// Every key of a configuration with its value (secrets as a digest, so
/// that a changed key is seen without its value being kept around).
fn flatten(config: &Config) -> BTreeMap<String, String> {
    fn walk(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
        match value {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            other => {
                let text = other.to_string();
                let digest = crate::domain::content::content_hash(text.as_bytes());
                out.insert(prefix.to_string(), digest);
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(table) = toml::Value::try_from(config) {
        walk("", &table, &mut out);
    }
    out
}
