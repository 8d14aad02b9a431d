//! A run taken away for review: one `.tar.gz` with the run, every
//! attempt's timeline (phases, checkpoints, calls, decisions, outcome),
//! the verdicts on its release, every artifact those name (prompts,
//! replies, tool payloads, checkpoint states, answers), a page that opens
//! offline, and a manifest of every file's SHA-256.
//!
//! Layout:
//!
//! ```text
//! manifest.json              format, run, tenant, who and when, files with sha256 and size
//! index.html                 the run and its attempts, readable offline (no script, no network)
//! run.json                   the run record
//! attempts/<attemptId>.json  each attempt's timeline, as GET /runtime/attempts/{id} shows it
//! release-verdicts.json      every verdict on the run's release
//! artifacts/<hex>            each artifact a record names by `sha256:<hex>`
//! ```

use std::collections::BTreeSet;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::error::ApiError;
use super::runtime::timeline;
use crate::api::AppState;
use crate::api::extract::{Authorized, need};
use crate::domain::access::TenantScope;
use crate::domain::ids::parse_uuid;

/// The export format's name, in its manifest.
pub const FORMAT: &str = "agentbay.run-export/v1";

/// Every `sha256:<64 hex>` text in a document.
fn hashes(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::String(s)
            if s.len() == 71
                && s.starts_with("sha256:")
                && s[7..].bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            out.insert(s.clone());
        }
        Value::Array(a) => a.iter().for_each(|v| hashes(v, out)),
        Value::Object(o) => o.values().for_each(|v| hashes(v, out)),
        _ => {}
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The offline page: the run, its attempts and what each did, linking to
/// the files beside it.
fn index_html(run: &Value, attempts: &[(Uuid, Value)], artifacts: &[String]) -> String {
    let text = |v: &Value| {
        v.as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v.to_string())
    };
    let mut html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Run {id}</title>\
         <style>body{{font:14px system-ui,sans-serif;margin:24px;max-width:1100px}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccd;padding:3px 6px;text-align:left;vertical-align:top}}code{{font-size:12px}}</style></head><body>\
         <h1>Run <code>{id}</code> — {state}</h1><p>Agent {agent}, release {release}, tenant {tenant}; submitted {at} by {by}.</p>",
        id = escape(&text(&run["runId"])),
        state = escape(&text(&run["state"])),
        agent = escape(&text(&run["agentId"])),
        release = escape(&text(&run["snapshot"]["releaseId"])),
        tenant = escape(&text(&run["tenantId"])),
        at = escape(&text(&run["createdAt"])),
        by = escape(&text(&run["submittedBy"])),
    );
    if let Some(reason) = run["reason"].as_str() {
        html += &format!("<p>Reason: {}</p>", escape(reason));
    }
    html += "<p><a href=\"run.json\">run.json</a> · <a href=\"release-verdicts.json\">release verdicts</a> · <a href=\"manifest.json\">manifest</a></p>";
    for (id, t) in attempts {
        html += &format!(
            "<h2>Attempt {n} <code>{id}</code> — {state}</h2><p><a href=\"attempts/{id}.json\">timeline (JSON)</a></p>",
            n = escape(&text(&t["number"])),
            state = escape(&text(&t["state"])),
        );
        html += "<table><tr><th>#</th><th>Call</th><th>Target</th><th>Status</th><th>Request</th><th>Result</th></tr>";
        for c in t["calls"].as_array().into_iter().flatten() {
            let link = |key: &str| match c[key].as_str() {
                Some(h) if artifacts.iter().any(|a| a == h) => {
                    format!(
                        "<a href=\"artifacts/{0}\"><code>{0:.12}</code></a>",
                        &h[7..]
                    )
                }
                Some(h) => format!("<code>{}</code>", escape(h)),
                None => String::new(),
            };
            html += &format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&text(&c["sequence"])),
                escape(&text(&c["kind"])),
                escape(&text(&c["target"])),
                escape(&text(&c["status"])),
                link("requestHash"),
                link("resultHash"),
            );
        }
        html += "</table>";
        let decisions = t["decisions"].as_array().map_or(0, Vec::len);
        let checkpoints = t["checkpoints"].as_array().map_or(0, Vec::len);
        html += &format!("<p>{checkpoints} checkpoint(s), {decisions} decision(s).</p>");
    }
    html += "</body></html>\n";
    html
}

/// The export of a run of the scope's tenant: the `.tar.gz` bytes.
pub fn run_export(
    state: &AppState,
    scope: &TenantScope,
    run_id: Uuid,
    by: &str,
) -> Result<Vec<u8>, ApiError> {
    let run = state.runs.get(scope, run_id)?;
    let run_json = serde_json::to_value(&run).map_err(ApiError::internal)?;
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut refs = BTreeSet::new();
    hashes(&run_json, &mut refs);
    let mut attempts = Vec::new();
    for attempt_id in run.steps.iter().flat_map(|s| s.attempts.iter().copied()) {
        let t = serde_json::to_value(timeline(state, scope, attempt_id)?)
            .map_err(ApiError::internal)?;
        hashes(&t, &mut refs);
        attempts.push((attempt_id, t));
    }
    let verdicts = state.releases.verdicts(scope, &run.snapshot.release_id)?;
    let verdicts = serde_json::to_value(&verdicts).map_err(ApiError::internal)?;
    // Artifacts: what the records name and the tenant's store still holds
    // (a purged payload leaves its hash and its tombstone in the record).
    let mut artifacts = Vec::new();
    for hash in &refs {
        if let Some(bytes) = state.runtime.content(scope, hash)? {
            artifacts.push(hash.clone());
            files.push((format!("artifacts/{}", &hash[7..]), bytes));
        }
    }
    let pretty = |v: &Value| serde_json::to_vec_pretty(v).expect("JSON values serialise");
    files.push(("run.json".into(), pretty(&run_json)));
    for (id, t) in &attempts {
        files.push((format!("attempts/{id}.json"), pretty(t)));
    }
    files.push(("release-verdicts.json".into(), pretty(&verdicts)));
    files.push((
        "index.html".into(),
        index_html(&run_json, &attempts, &artifacts).into_bytes(),
    ));
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let manifest = json!({
        "format": FORMAT,
        "runId": run.run_id,
        "tenantId": run.tenant_id,
        "exportedAt": state.clock.now(),
        "exportedBy": by,
        "files": files.iter().map(|(path, bytes)| json!({
            "path": path,
            "sha256": format!("sha256:{}", hex::encode(Sha256::digest(bytes))),
            "bytes": bytes.len(),
        })).collect::<Vec<_>>(),
    });
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mtime = state.clock.now().timestamp().max(0) as u64;
    let root = format!("run-{run_id}");
    for (path, bytes) in
        std::iter::once(("manifest.json".to_string(), pretty(&manifest))).chain(files)
    {
        let mut head = tar::Header::new_gnu();
        head.set_size(bytes.len() as u64);
        head.set_mode(0o644);
        head.set_mtime(mtime);
        head.set_cksum();
        tar.append_data(&mut head, format!("{root}/{path}"), bytes.as_slice())
            .map_err(ApiError::internal)?;
    }
    let gz = tar.into_inner().map_err(ApiError::internal)?;
    gz.finish().map_err(ApiError::internal)
}

/// The response carrying an export, as a download.
pub fn download(run_id: Uuid, bytes: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/gzip".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"run-{run_id}.tar.gz\""),
            ),
        ],
        bytes,
    )
        .into_response()
}

/// `ExportRun`: one run taken away for review, as a `.tar.gz`.
#[utoipa::path(get, path = "/runtime/runs/{runId}/export", tag = "runtime",
    params(
        ("runId" = String, Path, description = "The run"),
        ("tenant" = Option<String>, Query, description = "Another tenant's run (a slug), PlatformAdmin only"),
    ),
    responses(
        (status = 200, description = "The run's export, a .tar.gz: manifest.json (every file's sha256), index.html (opens offline), run.json, attempts/<id>.json, release-verdicts.json, artifacts/<hex>", content(
            (Vec<u8> = "application/gzip"),
        )),
        (status = 404, description = "No such run in the caller's tenant"),
    ),
    security(("bearer" = ["factory.runs.read"])))]
pub async fn export_run(
    State(state): State<AppState>,
    auth: Authorized<need::RunsRead>,
    Path(run_id): Path<String>,
    axum::extract::RawQuery(raw): axum::extract::RawQuery,
) -> Result<Response, ApiError> {
    let scope = super::runtime::scope_of(&auth.principal, raw.as_deref())?;
    let id = parse_uuid("runId", &run_id)?;
    let by = auth.principal.subject.to_string();
    let bytes = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || run_export(&state, &scope, id, &by))
            .await
            .map_err(ApiError::internal)??
    };
    Ok(download(id, bytes))
}
