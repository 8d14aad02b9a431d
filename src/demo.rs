//! The demo a zero-config start shows: tenant `demo` with project
//! `support`, the example releases (signed at seeding with this
//! appliance's own demo key), and
//! four runs of the builtin triage agent: one that succeeds, one that
//! waits for a reviewer's approval, one whose model asks the support lead a
//! question, one that runs out of corrections. It
//! is seeded once, on the first start of a data directory, and never when
//! `demo.enabled` is false (packaged installs).

use rust_embed::RustEmbed;
use serde_json::json;

use crate::api::AppState;
use crate::domain::access::TenantScope;
use crate::domain::tenant::TenantSpec;
use crate::domain::{ProjectId, TenantId};
use crate::releases::bundle::Bundle;
use crate::runs::RunRequest;

#[derive(RustEmbed)]
#[folder = "packaging/examples/releases/"]
struct Releases;

/// The demo tenant.
pub const TENANT: &str = "demo";

/// The releases the demo imports, and the runs it submits of each.
const RUNS: &[(&str, &str)] = &[
    (
        "triage-1.0.0",
        r#"{"customer": "acme-corp", "text": "Checkout takes 20 seconds since this morning."}"#,
    ),
    (
        "triage-approval-1.0.0",
        r#"{"customer": "globex", "text": "Checkout is down for all our users."}"#,
    ),
    (
        "triage-question-1.0.0",
        r#"{"customer": "initrode", "text": "Exports are slow."}"#,
    ),
    (
        "triage-corrections-1.0.0",
        r#"{"customer": "initech", "text": "Login is slow for some users."}"#,
    ),
];

/// A bundle of the embedded examples, by directory name.
fn bundle(dir: &str) -> Bundle {
    let prefix = format!("{dir}/");
    let files = Releases::iter()
        .filter_map(|path| {
            let rest = path.strip_prefix(&prefix)?.to_string();
            Some((rest, Releases::get(&path)?.data.into_owned()))
        })
        .collect();
    Bundle { files }
}

/// Seeds the demo unless it is seeded already: the demo tenant holds a
/// run (whatever became of the runs since, an operator's or an earlier
/// version's). The steps are idempotent (releases by hash, runs by
/// run key), so a start cut short before the runs completes the seeding
/// on the next start. Returns what it did, for the start banner.
pub async fn seed(state: &AppState) -> anyhow::Result<Option<String>> {
    let tenant = TenantId::parse(TENANT)?;
    let scope = TenantScope::new(tenant.clone());
    if state.capacity.tenant(&tenant).is_some() {
        let runs = state
            .runs
            .list(&scope, &crate::runs::RunFilter::default(), None, 1)?;
        if !runs.is_empty() {
            return Ok(None);
        }
    } else {
        state
            .capacity
            .put_tenant(
                tenant.clone(),
                TenantSpec {
                    display_name: Some("Demo".into()),
                    edition: "team".into(),
                    residency_regions: Vec::new(),
                    retention: None,
                },
            )
            .await?;
    }
    let project = ProjectId::parse("support")?;
    state
        .capacity
        .put_project(tenant.clone(), project.clone(), Some("Support".into()))
        .await?;
    // The examples are signed here, with this appliance's own demo key:
    // no key whose private half is published signs for anyone.
    let pair = crate::releases::signing::instance_demo_pair(&state.config.data_dir)?;
    for dir in [
        "triage",
        "triage-approval",
        "triage-question",
        "triage-corrections",
        "triage-external",
    ] {
        let bundle = bundle(dir)
            .signed(&pair)
            .map_err(|e| anyhow::anyhow!("example release {dir}: {}", e.0))?;
        let report = state.releases.check(&bundle);
        state.releases.record(bundle, report, "demo").await?;
    }
    let mut runs = Vec::new();
    for (release, input) in RUNS {
        let run = state
            .runs
            .submit(
                &scope,
                RunRequest {
                    project_id: project.clone(),
                    release_id: release.to_string(),
                    input: serde_json::from_str(input).unwrap_or(json!({})),
                    limits: None,
                    max_attempts: 0,
                    max_corrections: None,
                    request_id: None,
                    run_key: Some(format!("demo-{release}")),
                    labels: [("source".to_string(), "demo".to_string())].into(),
                    environment_id: None,
                    submitted_by: "demo".into(),
                },
            )
            .await?;
        runs.push(run.run_id.to_string());
    }
    Ok(Some(format!(
        "demo: tenant {TENANT} with {} example runs: one succeeds, one waits for a reviewer to approve paging on-call, one asks the support lead a question (Decisions), one runs out of corrections (Runs/ListRuns with tenantId demo); turn off with demo.enabled = false",
        runs.len()
    )))
}
