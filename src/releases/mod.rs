//! Release loading for sites with no network: bundles arrive as files.
//!
//! `import` runs LoadRelease on a bundle: the checks of `verify.rs`, then
//! either a Verified LoadedRelease whose contents go to the artifact store
//! by hash (ReleaseLoaded), or a Rejected one that keeps only the reason
//! (ReleaseLoadRejected, `release_load_rejected` metric). Nothing of a
//! bundle is stored unless its whole verdict is, in one transaction.
//!
//! A bundle whose only fault is its signer (unknown, revoked, or not allowed
//! for its tenant) is stored Untrusted with its contents. Trusted publisher
//! keys are data (`trust.rs`): releases verified against another adapter
//! version (after an upgrade) or another set of trusted keys are verified
//! again from the stored contents, right after a key changes, by the
//! ReleaseCacheWarmer, or at dispatch; so trusting a key again makes its
//! releases Verified without importing anything. Every verdict is kept as
//! a [`ReleaseVerdict`].
//! Deprecation and revocation apply the release's in-flight policy to the
//! attempts running it through [`InFlight`], which the attempt engine
//! implements; revocation never deletes what attempts loaded.

pub mod bundle;
pub mod signing;
mod trust;
pub mod verify;
pub mod warmer;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::RwLock;
use serde::Serialize;

use self::bundle::{Bundle, Limits, MANIFEST, SIGNATURE};
use self::signing::Trust;
pub use self::trust::configured_keys;
use self::verify::{Report, verify};
use crate::capacity::records::TENANT_RECORD;
use crate::clock::SharedClock;
use crate::config::ReleasesConfig;
use crate::domain::access::{PlatformScope, TenantScope};
use crate::domain::release::{
    InFlightPolicy, Lifecycle, LoadState, LoadedRelease, Manifest, adapter_version, canonical_json,
};
use crate::domain::tenant::Tenant;
use crate::domain::trust::{ReleaseVerdict, VerdictCause};
use crate::domain::{DomainError, TenantId};
use crate::store::{Record, Store, StoreError, Table, Tx};
use crate::telemetry::names;

impl Record for LoadedRelease {
    const TABLE: Table = Table::LoadedReleases;
    const VERSION: u16 = 1;
    const VERSIONED: bool = true;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        self.release_id.clone()
    }
}

crate::versioned!(
    LoadedRelease,
    revision,
    crate::domain::release::StoredRelease
);

impl Record for ReleaseVerdict {
    const TABLE: Table = Table::ReleaseVerdicts;
    const VERSION: u16 = 1;
    fn tenant(&self) -> &TenantId {
        &self.tenant_id
    }
    fn id(&self) -> String {
        format!("{}/{}", self.release_id, self.verdict_id)
    }
}

/// What applying an in-flight policy did to running attempts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InFlightReport {
    /// Attempts of the release that were running.
    pub running: usize,
    /// Of those, interrupted.
    pub interrupted: usize,
}

/// The attempt engine's side of deprecation and revocation.
pub trait InFlight: Send + Sync + 'static {
    /// Applies `policy` to the running attempts of a release: `finish` and
    /// `drain` let them run to the end, `interrupt` stops them at their next
    /// safe point.
    fn apply<'a>(
        &'a self,
        scope: &'a TenantScope,
        release_id: &'a str,
        policy: InFlightPolicy,
    ) -> BoxFuture<'a, InFlightReport>;
}

/// Until an attempt engine is attached nothing runs, so there is nothing to
/// apply a policy to.
pub struct NothingRuns;

impl InFlight for NothingRuns {
    fn apply<'a>(
        &'a self,
        _: &'a TenantScope,
        _: &'a str,
        _: InFlightPolicy,
    ) -> BoxFuture<'a, InFlightReport> {
        Box::pin(async { InFlightReport::default() })
    }
}

/// This appliance's demo publisher key when the configuration trusts it
/// (made at the first start of the data directory).
pub fn demo_key(
    config: &crate::config::Config,
) -> Result<Option<signing::TrustedKey>, signing::KeyError> {
    config
        .releases
        .trust_demo_key
        .then(|| signing::instance_demo_key(&config.data_dir))
        .transpose()
}

/// Errors of release handling.
/// An import that did not verify: this copy's verdict, and the stored
/// release of that id afterwards: the copy itself (stored Untrusted or
/// Rejected), or a Verified release the copy did not replace.
#[derive(Debug)]
pub struct Refusal {
    /// What this copy got: Untrusted or Rejected.
    pub copy: LoadState,
    /// Why.
    pub reason: String,
    /// The copy's manifest hash.
    pub manifest_hash: String,
    /// What the store holds for the release id now.
    pub stored: LoadedRelease,
}

impl Refusal {
    /// Whether the store kept another (Verified) release: the copy was
    /// refused and nothing stored changed.
    pub fn kept_another(&self) -> bool {
        self.stored.state != self.copy || self.stored.manifest_hash != self.manifest_hash
    }

    /// The refusal in words, saying what the store holds when it differs.
    pub fn words(&self) -> String {
        let copy = self.copy.as_str().to_lowercase();
        if self.kept_another() {
            format!(
                "this copy of release {} was refused ({copy}: {}); the stored release (manifest {}) stays {}",
                self.stored.release_id,
                self.reason,
                self.stored.manifest_hash,
                self.stored.state.as_str()
            )
        } else {
            format!("release {} {copy}: {}", self.stored.release_id, self.reason)
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// The bundle cannot be read at all (nothing stored).
    #[error("{0}")]
    Bundle(String),
    /// The bundle is larger than a limit allows (nothing stored).
    #[error("{0}")]
    TooLarge(String),
    /// The bundle was read and not verified (Untrusted or Rejected): what
    /// this copy got and why, and what the store holds for its id after.
    #[error("{}", .0.words())]
    Rejected(Box<Refusal>),
    /// A rule.
    #[error(transparent)]
    Domain(#[from] DomainError),
    /// The store.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The release service.
pub struct Releases {
    store: Store,
    clock: SharedClock,
    /// What verifications trust now, from the store (see `trust.rs`).
    trust: RwLock<Arc<Current>>,
    /// This appliance's own demo publisher key, trusted for the demo
    /// tenant while `releases.trust_demo_key` is on.
    demo: Option<signing::TrustedKey>,
    /// Bundle size limits.
    pub limits: Limits,
    /// What the site lets a release reach (checked at every verification).
    site: crate::config::SiteRules,
    in_flight: RwLock<Arc<dyn InFlight>>,
}

/// The trust a verification uses, and its fingerprint: a release verified
/// under another fingerprint is verified again.
pub(crate) struct Current {
    trust: Trust,
    fingerprint: String,
}

impl Releases {
    /// The service: seeds the configuration's trusted keys into the store
    /// and trusts what the store holds.
    pub async fn open(
        store: Store,
        clock: SharedClock,
        config: &ReleasesConfig,
        site: crate::config::SiteRules,
        demo: Option<signing::TrustedKey>,
    ) -> Result<Releases, ReleaseError> {
        let releases = Releases {
            trust: RwLock::new(Arc::new(Current {
                trust: Trust::default(),
                fingerprint: String::new(),
            })),
            demo: demo.filter(|_| config.trust_demo_key),
            store,
            clock,
            limits: Limits {
                max_bundle_bytes: config.max_bundle_bytes,
                max_file_bytes: config.max_file_bytes,
                max_files: config.max_files,
            },
            site,
            in_flight: RwLock::new(Arc::new(NothingRuns)),
        };
        releases.seed(config).await?;
        Ok(releases)
    }

    /// Attaches the attempt engine.
    pub fn set_in_flight(&self, engine: Arc<dyn InFlight>) {
        *self.in_flight.write() = engine;
    }

    /// What verifications trust now.
    pub(crate) fn current(&self) -> Arc<Current> {
        self.trust.read().clone()
    }

    /// LoadRelease's checks, without storing anything.
    pub fn check(&self, bundle: &Bundle) -> Report {
        verify(bundle, &self.current().trust, &|t| self.site.reach(t))
    }

    /// The key id of this appliance's demo publisher key, when trusted.
    pub fn demo_key_id(&self) -> Option<&str> {
        self.demo.as_ref().map(|k| k.key_id.as_str())
    }

    /// What the site lets a release reach.
    pub fn site(&self) -> &crate::config::SiteRules {
        &self.site
    }

    /// Stores the verdict on a checked bundle: a Verified release with its
    /// contents, an Untrusted one with its contents (its only fault is the
    /// signer), or a Rejected one with its reason; and the verdict itself
    /// as evidence. A bundle whose manifest cannot be read is refused
    /// without storing anything.
    pub async fn record(
        &self,
        bundle: Bundle,
        report: Report,
        by: &str,
    ) -> Result<LoadedRelease, ReleaseError> {
        let Some(parsed) = report.parsed.clone() else {
            let reason = report
                .rejection
                .map(|r| r.reason)
                .unwrap_or_else(|| "the manifest cannot be read".into());
            return Err(ReleaseError::Bundle(reason));
        };
        let current = self.current();
        let manifest = parsed.manifest;
        let now = self.clock.now();
        let scope = TenantScope::new(manifest.tenant_id.clone());
        let adapter = adapter_version(manifest.adapter.kind);
        let state = if report.verified() {
            LoadState::Verified
        } else if report.untrusted() {
            LoadState::Untrusted
        } else {
            LoadState::Rejected
        };
        let signer = report
            .signer
            .as_ref()
            .map(|k| format!("{} ({})", k.key_id, k.name));
        let release = LoadedRelease {
            release_id: manifest.release_id.clone(),
            tenant_id: manifest.tenant_id.clone(),
            agent_id: manifest.agent_id.clone(),
            version: manifest.version.clone(),
            manifest_hash: parsed.manifest_hash.clone(),
            adapter_version: adapter,
            adapter: manifest.adapter.kind,
            content_refs: BTreeMap::new(),
            state,
            reason: report.rejection.as_ref().map(|r| r.reason.clone()),
            lifecycle: Lifecycle::Published,
            in_flight_policy: None,
            signer: signer.clone(),
            verified_at: now,
            imported_at: now,
            imported_by: by.to_string(),
            trust_fingerprint: current.fingerprint.clone(),
            revision: 0,
        };
        let mut verdict = ReleaseVerdict {
            tenant_id: release.tenant_id.clone(),
            release_id: release.release_id.clone(),
            verdict_id: crate::domain::ids::new_id(),
            manifest_hash: release.manifest_hash.clone(),
            state,
            reason: release.reason.clone(),
            category: report.rejection.as_ref().map(|r| r.category.to_string()),
            signer,
            cause: VerdictCause::Import,
            by: by.to_string(),
            at: now,
            outcome: String::new(),
        };
        let stored = release.clone();
        let event = release.load_event(now);
        let canonical = parsed.canonical;
        let outcome = self
            .store
            .transact(move |tx: &mut Tx| -> Result<LoadedRelease, ReleaseError> {
                if tx.get::<Tenant>(&scope, TENANT_RECORD)?.is_none() {
                    return Err(DomainError::Invalid(crate::domain::FieldError::new(
                        "tenantId",
                        format!(
                            "the manifest names tenant {}, which is not registered",
                            scope.tenant()
                        ),
                    ))
                    .into());
                }
                let existing: Option<LoadedRelease> = tx.get(&scope, &stored.release_id)?;
                let kept = match &existing {
                    // The same release again: nothing to do.
                    Some(e)
                        if e.state == LoadState::Verified
                            && e.manifest_hash == stored.manifest_hash =>
                    {
                        Some(e.clone())
                    }
                    // Never let a bad import replace, or a new one silently
                    // change, a verified release.
                    Some(e)
                        if e.state == LoadState::Verified
                            && stored.state == LoadState::Verified =>
                    {
                        return Err(DomainError::AlreadyExists {
                            kind: "release",
                            id: format!(
                                "{} (with manifest {}; a changed release needs a new releaseId)",
                                e.release_id, e.manifest_hash
                            ),
                        }
                        .into());
                    }
                    Some(e) if e.state == LoadState::Verified => Some(e.clone()),
                    _ => None,
                };
                if let Some(kept) = kept {
                    if stored.state != LoadState::Verified {
                        tx.emit(event)?;
                    }
                    verdict.outcome = format!(
                        "unchanged: the stored release stays {}",
                        kept.state.as_str()
                    );
                    tx.put(&scope, &verdict)?;
                    return Ok(kept);
                }
                // An untrusted or rejected release of the same id is replaced.
                let mut release = stored;
                release.revision = existing.map_or(0, |e| e.revision);
                if release.state != LoadState::Rejected {
                    release.content_refs = store_contents(tx, &scope, &bundle, &canonical, now)?;
                }
                verdict.outcome = format!("stored as {}", release.state.as_str());
                tx.put(&scope, &verdict)?;
                tx.save(&scope, &mut release)?;
                tx.emit(event)?;
                Ok(release)
            })
            .await?;
        if let Some(r) = &report.rejection {
            // Counted once the tenant is known to be registered: metric
            // labels only ever name registered tenants.
            metrics::counter!(names::RELEASE_LOAD_REJECTED, "tenant" => outcome.tenant_id.to_string(), "reason" => r.category)
                .increment(1);
            tracing::warn!(release = %outcome.release_id, tenant = %outcome.tenant_id, reason = %r.reason, state = state.as_str(), "release not verified at load");
            return Err(ReleaseError::Rejected(Box::new(Refusal {
                copy: state,
                reason: r.reason.clone(),
                manifest_hash: parsed.manifest_hash,
                stored: outcome,
            })));
        }
        tracing::info!(release = %outcome.release_id, tenant = %outcome.tenant_id, hash = %outcome.manifest_hash, "release verified");
        Ok(outcome)
    }

    /// The imports that did not verify, newest first: every import verdict
    /// that was Untrusted or Rejected, whatever became of the release
    /// since (a later good copy, a key trusted afterwards).
    pub fn refused_imports(
        &self,
        scope: &TenantScope,
        limit: usize,
    ) -> Result<Vec<ReleaseVerdict>, DomainError> {
        let mut refused: Vec<ReleaseVerdict> = self.store.list(scope)?;
        refused.retain(|v| v.cause == VerdictCause::Import && v.state != LoadState::Verified);
        refused.sort_by_key(|v| std::cmp::Reverse(v.at));
        refused.truncate(limit);
        Ok(refused)
    }

    /// The verdicts on a release id, oldest first.
    pub fn verdicts(
        &self,
        scope: &TenantScope,
        release_id: &str,
    ) -> Result<Vec<ReleaseVerdict>, DomainError> {
        Ok(self.store.list_under(scope, &format!("{release_id}/"))?)
    }

    /// A release of the scope's tenant.
    pub fn get(
        &self,
        scope: &TenantScope,
        release_id: &str,
    ) -> Result<Option<LoadedRelease>, DomainError> {
        Ok(self.store.get(scope, release_id)?)
    }

    /// Releases of a tenant, or of every tenant.
    pub fn list(&self, scope: Option<&TenantScope>) -> Result<Vec<LoadedRelease>, DomainError> {
        match scope {
            Some(s) => Ok(self.store.list(s)?),
            None => Ok(self.store.scan_all(&PlatformScope::internal())?),
        }
    }

    /// The manifest of a verified release, from the artifact store.
    pub fn manifest(
        &self,
        scope: &TenantScope,
        release: &LoadedRelease,
    ) -> Result<Manifest, ReleaseError> {
        let bytes = self.artifact(scope, release, "manifest")?;
        serde_json::from_slice(&bytes).map_err(|e| {
            ReleaseError::Store(StoreError::Backup(format!(
                "stored manifest of {}: {e}",
                release.release_id
            )))
        })
    }

    /// One content item of a verified release by role (`instructions`,
    /// `workflow`, `skill:<id>`, ...).
    pub fn artifact(
        &self,
        scope: &TenantScope,
        release: &LoadedRelease,
        role: &str,
    ) -> Result<Vec<u8>, ReleaseError> {
        let hash = release.content_refs.get(role).ok_or_else(|| {
            DomainError::not_found(
                "release content",
                format!("{role} of {}", release.release_id),
            )
        })?;
        self.store.read_artifact(scope, hash)?.ok_or_else(|| {
            ReleaseError::Store(StoreError::Corrupt {
                table: "artifacts",
                key: hash.clone(),
                reason: format!("{role} of release {} is missing", release.release_id),
            })
        })
    }

    /// Whether a release was verified against what this appliance runs now.
    pub fn is_current(&self, release: &LoadedRelease) -> bool {
        release.adapter_version == adapter_version(release.adapter)
            && release.trust_fingerprint == self.current().fingerprint
    }

    /// Verifies a stored release again from its contents (after an upgrade
    /// or a change of trusted keys). Records the new verdict, and keeps it
    /// as evidence when the state changed.
    pub async fn reverify(
        &self,
        scope: &TenantScope,
        release: &LoadedRelease,
    ) -> Result<LoadedRelease, ReleaseError> {
        let mut bundle = Bundle::default();
        bundle
            .files
            .insert(MANIFEST.into(), self.artifact(scope, release, "manifest")?);
        bundle.files.insert(
            SIGNATURE.into(),
            self.artifact(scope, release, "signature")?,
        );
        let manifest = self.manifest(scope, release)?;
        for (_, path, sha) in manifest.files() {
            let bytes = self.store.read_artifact(scope, sha)?.ok_or_else(|| {
                ReleaseError::Store(StoreError::Corrupt {
                    table: "artifacts",
                    key: sha.to_string(),
                    reason: format!("file {path} of release {} is missing", release.release_id),
                })
            })?;
            bundle.files.insert(path.to_string(), bytes);
        }
        let current = self.current();
        let report = verify(&bundle, &current.trust, &|t| self.site.reach(t));
        let now = self.clock.now();
        let mut updated = release.clone();
        updated.verified_at = now;
        updated.adapter_version = adapter_version(release.adapter);
        updated.trust_fingerprint = current.fingerprint.clone();
        updated.state = if report.verified() {
            LoadState::Verified
        } else if report.untrusted() {
            LoadState::Untrusted
        } else {
            LoadState::Rejected
        };
        updated.reason = report
            .rejection
            .as_ref()
            .map(|r| format!("re-verification: {}", r.reason));
        if let Some(k) = &report.signer {
            updated.signer = Some(format!("{} ({})", k.key_id, k.name));
        }
        if let Some(r) = report
            .rejection
            .as_ref()
            .filter(|_| updated.state != release.state)
        {
            metrics::counter!(names::RELEASE_LOAD_REJECTED, "tenant" => release.tenant_id.to_string(), "reason" => r.category)
                .increment(1);
        }
        let changed = updated.state != release.state;
        let verdict = changed.then(|| ReleaseVerdict {
            tenant_id: release.tenant_id.clone(),
            release_id: release.release_id.clone(),
            verdict_id: crate::domain::ids::new_id(),
            manifest_hash: release.manifest_hash.clone(),
            state: updated.state,
            reason: updated.reason.clone(),
            category: report.rejection.as_ref().map(|r| r.category.to_string()),
            signer: updated.signer.clone(),
            cause: VerdictCause::Reverification,
            by: "appliance (trusted keys or adapter changed)".into(),
            at: now,
            outcome: format!("{} -> {}", release.state.as_str(), updated.state.as_str()),
        });
        let event = changed.then(|| updated.load_event(now));
        // Written over the version that was verified: a release revoked or
        // replaced meanwhile refuses this write as stale, and the next pass
        // verifies what is stored then.
        let s = scope.clone();
        let updated = self
            .store
            .transact(move |tx: &mut Tx| {
                tx.save(&s, &mut updated)?;
                if let Some(v) = &verdict {
                    tx.put(&s, v)?;
                }
                if let Some(e) = event {
                    tx.emit(e)?;
                }
                Ok::<_, StoreError>(updated)
            })
            .await?;
        if changed {
            tracing::info!(release = %updated.release_id, tenant = %updated.tenant_id, from = release.state.as_str(), to = updated.state.as_str(), reason = updated.reason.as_deref().unwrap_or(""), "release re-verified");
        }
        Ok(updated)
    }

    /// Verifies again every stored release that was verified under other
    /// trusted keys or another adapter version. A release that cannot be
    /// read is counted and left for the next pass; it does not stop the
    /// others.
    pub async fn reverify_stale(&self) -> Result<Reverified, ReleaseError> {
        let all = self.list(None)?;
        let mut done = Reverified::default();
        for release in all
            .iter()
            .filter(|r| r.reverifiable() && !self.is_current(r))
        {
            let scope = TenantScope::new(release.tenant_id.clone());
            match self.reverify(&scope, release).await {
                Ok(r) => match r.state {
                    LoadState::Verified => done.verified += 1,
                    LoadState::Untrusted => done.untrusted += 1,
                    LoadState::Rejected => done.rejected += 1,
                },
                // Revoked or replaced since it was listed: the next pass
                // verifies what is stored then.
                Err(ReleaseError::Store(StoreError::Stale { .. })) => done.changed += 1,
                Err(e) => {
                    tracing::warn!(release = %release.release_id, tenant = %release.tenant_id, error = %e, "re-verifying a release");
                    done.failed += 1;
                }
            }
        }
        Ok(done)
    }

    /// The release a new run may use, verified against this appliance now.
    pub async fn dispatchable(
        &self,
        scope: &TenantScope,
        release_id: &str,
    ) -> Result<LoadedRelease, ReleaseError> {
        let release = self
            .get(scope, release_id)?
            .ok_or_else(|| DomainError::not_found("release", release_id))?;
        let release = if release.reverifiable() && !self.is_current(&release) {
            self.reverify(scope, &release).await?
        } else {
            release
        };
        release.dispatchable()?;
        Ok(release)
    }

    /// Deprecates or revokes a release and applies its in-flight policy.
    pub async fn retire(
        &self,
        scope: &TenantScope,
        release_id: &str,
        revoke: bool,
        policy: InFlightPolicy,
    ) -> Result<(LoadedRelease, InFlightReport), ReleaseError> {
        let now = self.clock.now();
        let (s, id) = (scope.clone(), release_id.to_string());
        let release = self
            .store
            .transact(move |tx: &mut Tx| -> Result<LoadedRelease, ReleaseError> {
                let mut release: LoadedRelease = tx
                    .get(&s, &id)?
                    .ok_or_else(|| DomainError::not_found("release", &id))?;
                let event = if revoke {
                    release.revoke(policy, now)?
                } else {
                    release.deprecate(policy, now)?
                };
                tx.save(&s, &mut release)?;
                tx.emit(event)?;
                Ok(release)
            })
            .await?;
        let engine = self.in_flight.read().clone();
        let report = engine.apply(scope, release_id, policy).await;
        tracing::info!(
            release = %release_id,
            lifecycle = ?release.lifecycle,
            policy = %policy,
            running = report.running,
            interrupted = report.interrupted,
            "release retired"
        );
        Ok((release, report))
    }
}

/// What a re-verification pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reverified {
    /// Verified now.
    pub verified: usize,
    /// Untrusted now.
    pub untrusted: usize,
    /// Rejected now.
    pub rejected: usize,
    /// Changed meanwhile: left for the next pass.
    pub changed: usize,
    /// Could not be read: left for the next pass.
    pub failed: usize,
}

impl std::fmt::Display for Reverified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} verified, {} untrusted, {} rejected, {} changed meanwhile, {} unreadable",
            self.verified, self.untrusted, self.rejected, self.changed, self.failed
        )
    }
}

/// Puts every content item into the artifact store; returns the references
/// by role.
fn store_contents(
    tx: &mut Tx<'_>,
    scope: &TenantScope,
    bundle: &Bundle,
    canonical_manifest: &[u8],
    now: chrono::DateTime<chrono::Utc>,
) -> Result<BTreeMap<String, String>, StoreError> {
    let manifest: Manifest = serde_json::from_slice(canonical_manifest)
        .map_err(|e| StoreError::Backup(format!("a verified manifest no longer parses: {e}")))?;
    let mut refs = BTreeMap::new();
    let mut put =
        |tx: &mut Tx<'_>, role: String, bytes: &[u8], media: &str| -> Result<(), StoreError> {
            let hash = tx.put_artifact(scope, bytes, media, None, now)?;
            refs.insert(role, hash);
            Ok(())
        };
    put(
        tx,
        "manifest".into(),
        canonical_manifest,
        "application/json",
    )?;
    put(
        tx,
        "signature".into(),
        &bundle.files[SIGNATURE],
        "application/json",
    )?;
    for (role, path, _) in manifest.files() {
        let role = match role {
            "skill" => {
                let id = manifest
                    .skills
                    .iter()
                    .find(|s| s.path == path)
                    .map_or(path, |s| s.id.as_str());
                format!("skill:{id}")
            }
            "toolFile" => format!("file:{path}"),
            other => other.to_string(),
        };
        let media = if path.ends_with(".json") {
            "application/json"
        } else if role.starts_with("file:") {
            "application/octet-stream"
        } else {
            "text/markdown"
        };
        put(tx, role, &bundle.files[path], media)?;
    }
    let json = |v: serde_json::Value| canonical_json(&v);
    put(
        tx,
        "policy".into(),
        &json(serde_json::to_value(&manifest.policy).expect("policies serialise")),
        "application/json",
    )?;
    put(
        tx,
        "modelProfile".into(),
        &json(serde_json::to_value(&manifest.model_profile).expect("profiles serialise")),
        "application/json",
    )?;
    put(
        tx,
        "toolDescriptors".into(),
        &json(serde_json::to_value(&manifest.tools).expect("tools serialise")),
        "application/json",
    )?;
    Ok(refs)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use parking_lot::Mutex;

    use super::*;
    use crate::clock::SystemClock;
    use crate::domain::tenant::TenantSpec;
    use crate::store::StoreOptions;

    /// Records what the attempt engine was asked to do.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(TenantId, String, InFlightPolicy)>>);

    impl InFlight for Recorder {
        fn apply<'a>(
            &'a self,
            scope: &'a TenantScope,
            release_id: &'a str,
            policy: InFlightPolicy,
        ) -> BoxFuture<'a, InFlightReport> {
            Box::pin(async move {
                self.0
                    .lock()
                    .push((scope.tenant().clone(), release_id.to_string(), policy));
                InFlightReport {
                    running: 2,
                    interrupted: if policy == InFlightPolicy::Interrupt {
                        2
                    } else {
                        0
                    },
                }
            })
        }
    }

    /// The service over `store`, trusting the tests' demo key for the
    /// demo tenant.
    async fn open(store: Store) -> Releases {
        let public = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/keys/demo-publisher.pub"),
        )
        .unwrap();
        let demo = signing::TrustedKey::new(
            "tests' demo publisher",
            &public,
            vec![TenantId::parse("demo").unwrap()],
        )
        .unwrap();
        Releases::open(
            store,
            SystemClock::shared(),
            &ReleasesConfig::default(),
            crate::config::SiteRules::new(
                &crate::config::Config::default(),
                crate::config::Live::new(Default::default()),
                crate::config::Config::default().listen,
            ),
            Some(demo),
        )
        .await
        .unwrap()
    }

    /// `bundle` signed with the tests' demo key.
    fn signed(bundle: Bundle) -> Bundle {
        let pem = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/keys/demo-publisher.key"),
        )
        .unwrap();
        bundle
            .signed(&signing::read_private_key(&pem).unwrap())
            .unwrap()
    }

    async fn demo_store(dir: &Path) -> Store {
        let store = Store::open(&dir.join("store"), &StoreOptions::default()).unwrap();
        let (tenant, _) = Tenant::put(
            None,
            TenantId::parse("demo").unwrap(),
            TenantSpec {
                edition: "team".into(),
                ..TenantSpec::default()
            },
            &["team".to_string()],
            chrono::Utc::now(),
        )
        .unwrap();
        store
            .transact(move |tx: &mut Tx| {
                tx.put(&TenantScope::new(tenant.tenant_id.clone()), &tenant)
            })
            .await
            .unwrap();
        store
    }

    #[tokio::test]
    async fn retiring_applies_the_in_flight_policy_through_the_engine() {
        let dir = tempfile::tempdir().unwrap();
        let store = demo_store(dir.path()).await;
        let releases = open(store).await;
        let recorder = Arc::new(Recorder::default());
        releases.set_in_flight(recorder.clone());
        let example =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/examples/releases/triage");
        let bundle = signed(Bundle::from_dir(&example, &releases.limits).unwrap());
        let report = releases.check(&bundle);
        assert!(report.verified(), "{:?}", report.rejection);
        let release = releases.record(bundle, report, "test").await.unwrap();
        let scope = TenantScope::new(release.tenant_id.clone());
        assert!(releases.dispatchable(&scope, "triage-1.0.0").await.is_ok());

        let (r, report) = releases
            .retire(&scope, "triage-1.0.0", false, InFlightPolicy::Drain)
            .await
            .unwrap();
        assert_eq!(r.lifecycle, Lifecycle::Deprecated);
        assert_eq!(report.running, 2);
        let err = releases
            .dispatchable(&scope, "triage-1.0.0")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("takes no new runs"), "{err}");

        let (r, report) = releases
            .retire(&scope, "triage-1.0.0", true, InFlightPolicy::Interrupt)
            .await
            .unwrap();
        assert_eq!(r.lifecycle, Lifecycle::Revoked);
        assert_eq!(report.interrupted, 2);
        let err = releases
            .dispatchable(&scope, "triage-1.0.0")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("revoked"), "{err}");
        // What attempts loaded stays readable.
        assert!(releases.manifest(&scope, &r).is_ok());
        assert!(
            !releases
                .artifact(&scope, &r, "instructions")
                .unwrap()
                .is_empty()
        );

        let calls = recorder.0.lock().clone();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].2, InFlightPolicy::Drain);
        assert_eq!(calls[1].2, InFlightPolicy::Interrupt);
        assert_eq!(calls[1].1, "triage-1.0.0");
    }
    #[tokio::test]
    async fn a_re_verification_of_an_older_copy_never_undoes_a_revocation() {
        let dir = tempfile::tempdir().unwrap();
        let store = demo_store(dir.path()).await;
        let releases = open(store).await;
        releases.set_in_flight(Arc::new(Recorder::default()));
        let example =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/examples/releases/triage");
        let bundle = signed(Bundle::from_dir(&example, &releases.limits).unwrap());
        let report = releases.check(&bundle);
        let listed = releases.record(bundle, report, "test").await.unwrap();
        let scope = TenantScope::new(listed.tenant_id.clone());
        // The warmer listed the release; an operator revokes it before the
        // warmer writes its new verdict.
        let (revoked, _) = releases
            .retire(&scope, "triage-1.0.0", true, InFlightPolicy::Interrupt)
            .await
            .unwrap();
        let err = releases.reverify(&scope, &listed).await.unwrap_err();
        assert!(
            matches!(err, ReleaseError::Store(StoreError::Stale { .. })),
            "{err}"
        );
        let stored = releases.get(&scope, "triage-1.0.0").unwrap().unwrap();
        assert_eq!(stored.lifecycle, Lifecycle::Revoked);
        assert_eq!(stored.revision, revoked.revision);
        // From the current state it goes through and stays revoked.
        let again = releases.reverify(&scope, &stored).await.unwrap();
        assert_eq!(again.lifecycle, Lifecycle::Revoked);
        assert_eq!(again.revision, stored.revision + 1);
    }
}
