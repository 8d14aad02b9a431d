//! A run taken away for review: one `.tar.gz` with the run, every
//! attempt's timeline (phases, checkpoints, calls, decisions, outcome),
//! the verdicts on its release, every artifact those name (prompts,
//! replies, tool payloads, checkpoint states, answers), a page that opens
//! offline, and a manifest of every file's SHA-256.
//!
//! The archive is written as it is read, into the response: the appliance
//! holds one artifact and a few compressed chunks of it at a time, however
//! large the run; the manifest, made as the files go by, comes last. A
//! tenant runs at most [`PER_TENANT`] exports at once.
//!
//! Layout:
//!
//! ```text
//! manifest.json              format, run, tenant, who and when, files with sha256 and size (last)
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

/// Exports a tenant may run at once.
pub const PER_TENANT: usize = 2;

/// Compressed chunks in flight between the writer and the response.
const CHUNKS: usize = 4;

/// The exports running now, per tenant.
#[derive(Default)]
pub struct Exports {
    running: parking_lot::Mutex<std::collections::HashMap<crate::domain::TenantId, usize>>,
}

/// One tenant's export running: its place is given back when dropped.
pub struct Running {
    exports: std::sync::Arc<Exports>,
    tenant: crate::domain::TenantId,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.exports.running.lock();
        if let Some(n) = running.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                running.remove(&self.tenant);
            }
        }
    }
}

impl Exports {
    /// A place for one more export of `tenant`'s, or the refusal that
    /// says why not.
    pub fn begin(
        self: &std::sync::Arc<Self>,
        tenant: &crate::domain::TenantId,
    ) -> Result<Running, ApiError> {
        let mut running = self.running.lock();
        let n = running.entry(tenant.clone()).or_default();
        if *n >= PER_TENANT {
            return Err(ApiError::new(
                super::error::ErrorCode::RateLimited,
                format!(
                    "tenant {tenant} has {PER_TENANT} run exports in progress; another starts when one ends"
                ),
            )
            .with_header(header::RETRY_AFTER, "5"));
        }
        *n += 1;
        Ok(Running {
            exports: self.clone(),
            tenant: tenant.clone(),
        })
    }
}

/// A writer that hands what it is given to the response, a chunk at a
/// time, waiting while the response has [`CHUNKS`] unsent: what the
/// archive holds in memory is bounded by the reader's pace.
struct Chunks {
    to: tokio::sync::mpsc::Sender<Result<bytes::Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

const CHUNK: usize = 64 * 1024;

impl std::io::Write for Chunks {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = bytes::Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.to
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the download ended"))
    }
}

/// A tar entry of `path` under `root`, with its bytes; its line of the
/// manifest.
fn append<W: std::io::Write>(
    tar: &mut tar::Builder<W>,
    root: &str,
    mtime: u64,
    path: &str,
    bytes: &[u8],
) -> std::io::Result<Value> {
    let mut head = tar::Header::new_gnu();
    head.set_size(bytes.len() as u64);
    head.set_mode(0o644);
    head.set_mtime(mtime);
    head.set_cksum();
    tar.append_data(&mut head, format!("{root}/{path}"), bytes)?;
    Ok(json!({
        "path": path,
        "sha256": format!("sha256:{}", hex::encode(Sha256::digest(bytes))),
        "bytes": bytes.len(),
    }))
}

/// Writes the export of run `run` of the scope's tenant to `out`, as a
/// `.tar.gz`, one file at a time.
fn write_export<W: std::io::Write>(
    state: &AppState,
    scope: &TenantScope,
    run: &crate::domain::run::Run,
    by: &str,
    out: W,
) -> Result<W, ApiError> {
    fn io(e: impl std::fmt::Display) -> ApiError {
        ApiError::internal(e)
    }
    let run_json = serde_json::to_value(run).map_err(io)?;
    let mut refs = BTreeSet::new();
    hashes(&run_json, &mut refs);
    let mut attempts = Vec::new();
    let mut story = Vec::new();
    for step in &run.steps {
        let mut told = Vec::new();
        for attempt_id in step.attempts.iter().copied() {
            let typed = timeline(state, scope, attempt_id)?;
            let t = serde_json::to_value(&typed).map_err(io)?;
            hashes(&t, &mut refs);
            attempts.push((attempt_id, t));
            told.push(typed);
        }
        story.push((step.name.clone(), step.state.as_str().to_string(), told));
    }
    let verdicts = state.releases.verdicts(scope, &run.snapshot.release_id)?;
    let verdicts = serde_json::to_value(&verdicts).map_err(io)?;
    let pretty = |v: &Value| serde_json::to_vec_pretty(v).expect("JSON values serialise");
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        out,
        flate2::Compression::default(),
    ));
    let mtime = state.clock.now().timestamp().max(0) as u64;
    let root = format!("run-{}", run.run_id);
    let mut files = Vec::new();
    // Artifacts: what the records name and the tenant's store still holds
    // (a purged payload leaves its hash and its tombstone in the record),
    // read and written one at a time.
    let mut artifacts = Vec::new();
    for hash in &refs {
        if let Some(bytes) = state.runtime.content(scope, hash)? {
            let path = format!("artifacts/{}", &hash[7..]);
            files.push(append(&mut tar, &root, mtime, &path, &bytes).map_err(io)?);
            artifacts.push(hash.clone());
        }
    }
    for (id, t) in &attempts {
        let path = format!("attempts/{id}.json");
        files.push(append(&mut tar, &root, mtime, &path, &pretty(t)).map_err(io)?);
    }
    let content = |hash: &str| -> Option<String> {
        let bytes = state.runtime.content(scope, hash).ok().flatten()?;
        Some(match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
            Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
        })
    };
    let index = crate::console::export_index(
        run,
        content(&run.input_ref).filter(|_| run.purged.is_none()),
        run.output_ref.as_deref().and_then(content),
        story,
        state.clock.now(),
        by,
    )
    .map_err(io)?;
    for (path, bytes) in [
        ("index.html", index.into_bytes()),
        ("release-verdicts.json", pretty(&verdicts)),
        ("run.json", pretty(&run_json)),
    ] {
        files.push(append(&mut tar, &root, mtime, path, &bytes).map_err(io)?);
    }
    let manifest = json!({
        "format": FORMAT,
        "runId": run.run_id,
        "tenantId": run.tenant_id,
        "exportedAt": state.clock.now(),
        "exportedBy": by,
        "files": files,
    });
    append(&mut tar, &root, mtime, "manifest.json", &pretty(&manifest)).map_err(io)?;
    let gz = tar.into_inner().map_err(io)?;
    gz.finish().map_err(io)
}

/// The export of run `run_id` of the scope's tenant, as a download that
/// is written while it is sent: refused at once when the run is not the
/// tenant's or the tenant has [`PER_TENANT`] exports running.
pub async fn export(
    state: &AppState,
    scope: TenantScope,
    run_id: Uuid,
    by: String,
) -> Result<Response, ApiError> {
    let run = state.runs.get(&scope, run_id)?;
    let running = state.exports.begin(scope.tenant())?;
    state
        .store
        .record_action(
            state.clock.now(),
            crate::domain::audit::Change::new(scope.tenant(), "run.export", run_id.to_string()),
        )
        .await
        .map_err(ApiError::internal)?;
    let (to, from) = tokio::sync::mpsc::channel(CHUNKS);
    let state = state.clone();
    tokio::task::spawn_blocking(move || {
        let _running = running;
        let out = Chunks {
            to: to.clone(),
            buf: Vec::with_capacity(CHUNK),
        };
        let written = write_export(&state, &scope, &run, &by, out)
            .and_then(|mut out| std::io::Write::flush(&mut out).map_err(ApiError::internal));
        if let Err(e) = written {
            // The response is cut short: the client sees a broken archive,
            // never a complete-looking one.
            tracing::warn!(run = %run_id, error = ?e, "a run export stopped");
            let _ = to.blocking_send(Err(std::io::Error::other("the export stopped")));
        }
    });
    let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(from));
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/gzip".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"run-{run_id}.tar.gz\""),
            ),
        ],
        body,
    )
        .into_response())
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
    export(&state, scope, id, by).await
}
