//! Work pages: the overview, runs, attempts and their timelines,
//! checkpoints, the decision inbox and uncertain calls, with the actions of
//! Requesters (submit, cancel), Reviewers (decide) and Operators (interrupt,
//! settle).

use askama::Template;
use axum::extract::{Path, RawForm, RawQuery};
use axum::response::Response;
use serde_json::Value;
use uuid::Uuid;

use super::capacity::{PoolBar, pool_bars};
use super::table::{Cell, Filter, ListQuery, PAGE_SIZE, Table};
use super::{Console, Layout, ListPage, PageError, render, short, when, when_opt};
use crate::api::error::ApiError;
use crate::domain::access::Scope;
use crate::domain::access::TenantScope;
use crate::domain::attempt::{
    AttemptState, CallRecord, Checkpoint, DecisionKind, DecisionRequest, Effect, ExecutionAttempt,
    InterruptSource,
};
use crate::domain::content::Shown;
use crate::domain::form::Form;
use crate::domain::release::canonical_json;
use crate::domain::run::{RunAction, RunState};
use crate::domain::{FieldError, ProjectId};
use crate::runs::{RunRequest, rerun};
use crate::runtime::content::{CallContent, OutcomeContent};
use crate::runtime::grain::AttemptView;

pub(super) fn parse_uuid(field: &str, text: &str) -> Result<Uuid, PageError> {
    Uuid::parse_str(text).map_err(|_| PageError::bad(format!("{field}: {text:?} is not a UUID")))
}

// ---- overview ---------------------------------------------------------------

#[derive(Template)]
#[template(path = "console/overview.html")]
struct OverviewPage {
    l: Layout,
    live: OverviewLive,
}

/// The part of the overview that updates live.
#[derive(Template)]
#[template(path = "console/overview_live.html")]
pub struct OverviewLive {
    /// The newest runs: cells of id, state, agent, why, submitted.
    recent_runs: Vec<Vec<Cell>>,
    /// The newest attempts: cells of id, state, phase, agent, started.
    recent_attempts: Vec<Vec<Cell>>,
    by_state: Vec<(String, usize, &'static str)>,
    total: usize,
    pools: Vec<PoolBar>,
    waiting: Vec<Waiting>,
    uncertain: Vec<(String, String, String)>,
    rejections: Vec<(String, String, String, String)>,
    can_pools: bool,
}

/// A decision waiting for a person.
pub struct Waiting {
    attempt: String,
    kind: &'static str,
    summary: String,
    requested: String,
}

/// Builds the live part of the overview.
pub async fn overview_live(console: &Console) -> Result<OverviewLive, PageError> {
    let scope = console.scope()?;
    let state = &console.state;
    let mut total = 0;
    let mut by_state = Vec::new();
    for st in AttemptState::ALL {
        let n = state.runtime.count(&scope, Some(st))?;
        total += n;
        by_state.push((st.as_str().to_string(), n as usize, Cell::tone(st.as_str())));
    }
    let waiting = state
        .runtime
        .pending_decisions(&scope, 8)?
        .into_iter()
        .map(|d| Waiting {
            attempt: d.attempt_id.to_string(),
            kind: d.kind.as_str(),
            summary: d.summary,
            requested: when(&d.requested_at),
        })
        .collect();
    let uncertain = state
        .runtime
        .page(&scope, Some(AttemptState::Uncertain), None, 8, |_| true)?
        .into_iter()
        .map(|s| {
            (
                s.attempt_id.to_string(),
                s.agent_id.clone(),
                when_opt(&s.ended_at),
            )
        })
        .collect();
    // Every refused import counts, from the verdict history: a release
    // verified later (or kept Verified) was still refused then.
    let mut rejections: Vec<(String, String, String, String)> = state
        .releases
        .refused_imports(&scope, 8)?
        .into_iter()
        .map(|v| {
            (
                when(&v.at),
                format!("release import {}", v.state.as_str().to_lowercase()),
                v.release_id.clone(),
                v.reason.clone().unwrap_or_default(),
            )
        })
        .collect();
    let denied = state
        .capacity
        .leases(
            Some(&scope),
            &crate::capacity::LeaseFilter {
                states: vec![crate::domain::capacity::LeaseState::Denied],
                ..Default::default()
            },
            8,
        )
        .await?;
    rejections.extend(denied.into_iter().map(|v| {
        (
            when(&v.lease.requested_at),
            "lease denied".to_string(),
            format!("{} in {}", v.lease.holder_id, v.lease.pool_id),
            v.lease.reason.clone().unwrap_or_default(),
        )
    }));
    rejections.sort_by(|a, b| b.0.cmp(&a.0));
    rejections.truncate(8);
    let recent_runs = state
        .runs
        .list(&scope, &crate::runs::RunFilter::default(), None, 6)?
        .iter()
        .map(|r| {
            vec![
                Cell::id(r.run_id, format!("/runs/{}", r.run_id)),
                Cell::State(r.state.as_str().to_string()),
                Cell::text(&r.agent_id),
                Cell::text(run_why(console, &scope, r)),
                Cell::time(&r.created_at),
            ]
        })
        .collect();
    let recent_attempts = state
        .runtime
        .page(&scope, None, None, 6, |_| true)?
        .into_iter()
        .map(|s| {
            vec![
                Cell::id(s.attempt_id, format!("/attempts/{}", s.attempt_id)),
                Cell::State(s.state.as_str().to_string()),
                Cell::text(s.phase.as_str()),
                Cell::text(&s.agent_id),
                Cell::time(&s.started_at),
            ]
        })
        .collect();
    Ok(OverviewLive {
        recent_runs,
        recent_attempts,
        total: total as usize,
        by_state,
        pools: if console.can(Scope::CapacityRead) {
            pool_bars(console).await
        } else {
            Vec::new()
        },
        waiting,
        uncertain,
        rejections,
        can_pools: console.can(Scope::CapacityRead),
    })
}

/// `GET /`: attempts by state, pool utilisation, decisions waiting, recent
/// rejections and uncertain attempts.
pub async fn overview(console: Console) -> Result<Response, PageError> {
    console.require(Scope::RunsRead)?;
    let live = overview_live(&console).await?;
    render(&OverviewPage {
        l: console.layout("Overview", "/"),
        live,
    })
}

// ---- runs -------------------------------------------------------------------

/// Why a run is where it is: a live run's waiting reason (its live
/// attempt's), an ended run's reason.
fn run_why(console: &Console, scope: &TenantScope, r: &crate::domain::run::Run) -> String {
    if r.state.is_terminal() {
        return r.reason.clone().unwrap_or_default();
    }
    r.steps
        .iter()
        .flat_map(|s| s.attempts.last())
        .next_back()
        .and_then(|a| console.state.runtime.view(scope, *a).ok())
        .and_then(|v| v.waiting_reason())
        .unwrap_or_else(|| "running".into())
}

#[derive(Template)]
#[template(path = "console/runs.html")]
struct RunsPage {
    l: Layout,
    t: Table,
    can_submit: bool,
    /// Bulk actions the reader may take on picked runs.
    can_cancel: bool,
    can_hold: bool,
    releases: Vec<String>,
}

/// `GET /runs`: runs with state, agent, release and project filters.
pub async fn runs(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::RunsRead)?;
    let scope = console.scope()?;
    let q = ListQuery::parse(&raw);
    let (state, agent, release, project) = (
        q.get("state"),
        q.get("agent"),
        q.get("release"),
        q.get("project"),
    );
    let filter = crate::runs::RunFilter {
        state: state.and_then(RunState::parse),
        agent_id: agent.map(str::to_string),
        release_id: release.map(str::to_string),
        project_id: project.and_then(|p| ProjectId::parse(p).ok()),
        submitted_from: q.day("from").map_err(ApiError::from)?,
        submitted_until: q.day("until").map_err(ApiError::from)?,
        reason_contains: q
            .get("reason")
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string),
        label: match q.get("label").map(str::trim).filter(|t| !t.is_empty()) {
            Some(t) => Some(
                t.split_once('=')
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                    .ok_or_else(|| ApiError::invalid("label", format!("{t:?} is not key=value")))?,
            ),
            None => None,
        },
        waiting: match q.get("waiting") {
            Some(w) => {
                Some(crate::domain::run::parse_waiting("waiting", w).map_err(ApiError::from)?)
            }
            None => None,
        },
    };
    let before = q.get("before").and_then(|b| Uuid::parse_str(b).ok());
    let mut runs = console
        .state
        .runs
        .list(&scope, &filter, before, PAGE_SIZE + 1)?;
    let older = (runs.len() > PAGE_SIZE).then(|| {
        runs.truncate(PAGE_SIZE);
        runs.last()
            .map(|r| r.run_id.to_string())
            .unwrap_or_default()
    });
    let total = console.state.runs.count(&scope, &filter)?;
    let (agents, releases, projects) = choices(&console, &scope)?;
    let can_bulk = console.can(Scope::RunsWrite) || console.can(Scope::RunsOperate);
    let rows = runs
        .iter()
        .map(|r| {
            let last_id = r.steps.iter().flat_map(|s| s.attempts.last()).next_back();
            let last = last_id
                .map(|a| Cell::id(a, format!("/attempts/{a}")))
                .unwrap_or_else(|| Cell::text(""));
            let why = run_why(&console, &scope, r);
            let named = r
                .run_key
                .iter()
                .cloned()
                .chain(r.labels.iter().map(|(k, v)| format!("{k}={v}")))
                .collect::<Vec<_>>()
                .join(" · ");
            let mut row = vec![
                Cell::id(r.run_id, format!("/runs/{}", r.run_id)),
                Cell::State(r.state.as_str().to_string()),
                Cell::text(named),
                Cell::text(input_summary(&console, &scope, r)),
                Cell::text(&r.agent_id),
                Cell::text(&r.snapshot.release_id),
                Cell::text(r.project_id.as_str()),
                Cell::num(r.steps.iter().map(|s| s.attempts.len() as u32).sum::<u32>()),
                last,
                Cell::time(&r.created_at),
                Cell::words(why),
            ];
            if can_bulk {
                row.insert(
                    0,
                    Cell::Pick {
                        form: "bulk-runs",
                        name: "run",
                        value: r.run_id.to_string(),
                    },
                );
            }
            row
        })
        .collect();
    let run_states = [
        "Running",
        "Succeeded",
        "Failed",
        "TimedOut",
        "Cancelled",
        "Uncertain",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let filters = vec![
        q.filter("state", "state", run_states),
        q.filter("agent", "agent", agents),
        q.filter("release", "release", releases.clone()),
        q.filter("project", "project", projects.clone()),
        q.day_filter("from", "submitted from"),
        q.day_filter("until", "until"),
        q.filter("reason", "reason has", Vec::new()),
        q.filter("label", "label (key=value)", Vec::new()),
        Filter {
            name: "waiting",
            label: "waiting for",
            options: [
                ("WaitingForDecision", "a decision"),
                ("Paused", "paused (model server, quota, lease)"),
                ("WaitingForTool", "a tool"),
                ("Claimed", "capacity"),
            ]
            .iter()
            .map(|(v, l)| (v.to_string(), l.to_string()))
            .collect(),
            value: q.get("waiting").unwrap_or_default().to_string(),
            input: "text",
        },
    ];
    let labels = [
        "Pick",
        "Run",
        "State",
        "Key and labels",
        "Input",
        "Agent",
        "Release",
        "Project",
        "Attempts",
        "Last attempt",
        "Submitted",
        "Why it waits or ended",
    ];
    let t = q.history_table(
        "runs",
        "/runs",
        &labels[usize::from(!can_bulk)..],
        rows,
        filters,
        "No runs match.",
        total,
        older,
    );
    render(&RunsPage {
        l: console.layout("Runs", "/runs"),
        t,
        can_submit: console.can(Scope::RunsWrite),
        can_cancel: console.can(Scope::RunsWrite),
        can_hold: console.can(Scope::RunsOperate),
        releases,
    })
}

/// The first characters of a run's input, as compact JSON.
fn input_summary(console: &Console, scope: &TenantScope, run: &crate::domain::run::Run) -> String {
    const SHOWN: usize = 80;
    if run.purged.is_some() {
        return "(purged)".into();
    }
    let Ok(Some(bytes)) = console.state.runtime.content(scope, &run.input_ref) else {
        return String::new();
    };
    let text = serde_json::from_slice::<Value>(&bytes)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
    match text.char_indices().nth(SHOWN) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    }
}

/// Agents, release ids and project ids, for filters.
type Choices = (Vec<String>, Vec<String>, Vec<String>);

/// Agents, releases and projects of the tenant, for filters.
fn choices(console: &Console, scope: &TenantScope) -> Result<Choices, PageError> {
    let releases = console.state.releases.list(Some(scope))?;
    let mut agents: Vec<String> = releases.iter().map(|r| r.agent_id.clone()).collect();
    agents.sort();
    agents.dedup();
    let release_ids = releases.iter().map(|r| r.release_id.clone()).collect();
    let projects = console
        .state
        .capacity
        .projects(scope)
        .map_err(ApiError::from)?
        .into_iter()
        .map(|p| p.project_id.to_string())
        .collect();
    Ok((agents, release_ids, projects))
}

#[derive(Template)]
#[template(path = "console/run_new.html")]
struct RunNewPage {
    l: Layout,
    release_id: String,
    /// The form of the release's input schema; `None`: a JSON box.
    input: Option<Form>,
    projects: Vec<String>,
}

/// The form of a release's input schema, when it declares one.
fn input_form(
    console: &Console,
    scope: &TenantScope,
    release_id: &str,
) -> Result<Option<Form>, ApiError> {
    let release = console
        .state
        .releases
        .get(scope, release_id)?
        .ok_or_else(|| {
            ApiError::from(crate::domain::DomainError::not_found("release", release_id))
        })?;
    let manifest = console.state.releases.manifest(scope, &release)?;
    Ok(manifest.input_schema.map(|s| Form::of(&s, None)))
}

/// `GET /runs/new?release=ID`: the submit form of a release, built from
/// its input schema.
pub async fn run_new(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::RunsWrite)?;
    let scope = console.scope()?;
    let q = ListQuery::parse(&raw);
    let release_id = crate::domain::release::parse_release_id(q.get("release").unwrap_or(""))
        .map_err(|e| ApiError::invalid("release", e.reason))?;
    let input = input_form(&console, &scope, &release_id)?;
    let (_, _, projects) = choices(&console, &scope)?;
    render(&RunNewPage {
        l: console.layout(format!("Submit a run of {release_id}"), "/runs"),
        release_id,
        input,
        projects,
    })
}

/// `POST /runs`: a Requester submits a run of a release with its input,
/// from the release's form (`f.*` fields) or as JSON (`inputJson`).
pub async fn submit_run(console: Console, raw: RawForm) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::RunsWrite)?;
    let scope = console.scope()?;
    let release_id = fields.get("releaseId").unwrap_or("").to_string();
    let result = async {
        let input = match fields.get("inputJson") {
            Some(text) => crate::api::runtime::parse_json("inputJson", text)?,
            None => match input_form(&console, &scope, fields.need("releaseId")?)? {
                Some(form) => form.read(|name| fields.all(name))?,
                None => Value::Object(Default::default()),
            },
        };
        // One `key=value` a line; blanks around either side are the box's.
        let labels: Vec<String> = fields
            .get("labels")
            .unwrap_or("")
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| match l.split_once('=') {
                Some((k, v)) => format!("{}={}", k.trim(), v.trim()),
                // Refused by parse_labels, naming the line.
                None => l.to_string(),
            })
            .collect();
        let request = RunRequest {
            project_id: ProjectId::parse_field("projectId", fields.need("projectId")?)?,
            release_id: release_id.clone(),
            input,
            limits: None,
            max_attempts: 0,
            max_corrections: None,
            request_id: None,
            run_key: fields.get("runKey").map(str::to_string),
            labels: crate::domain::run::parse_labels("labels", labels.iter().map(String::as_str))?,
            environment_id: None,
            submitted_by: console.by(),
        };
        let run = console.state.runs.submit(&scope, request).await?;
        Ok::<_, ApiError>(run)
    }
    .await;
    Ok(match result {
        Ok(run) => {
            let to = format!("/runs/{}", run.run_id);
            console.done(
                &to,
                Ok::<_, ApiError>(format!("run {} submitted", run.run_id)),
            )
        }
        Err(e) => {
            let back = if release_id.is_empty() {
                "/runs".to_string()
            } else {
                format!("/runs/new?release={release_id}")
            };
            console.done(&back, Err::<String, _>(e))
        }
    })
}

/// Where the story of a run links to: the console's pages, or the files
/// beside an export's `index.html`.
#[derive(Clone, Copy, Debug)]
pub enum Links {
    /// The console.
    Console,
    /// An export, read offline.
    Export,
}

impl Links {
    /// An artifact's content.
    pub fn artifact(&self, hash: &str) -> String {
        match self {
            Links::Console => format!("/artifacts/{hash}"),
            Links::Export => format!("artifacts/{}", hash.trim_start_matches("sha256:")),
        }
    }

    /// An attempt's whole timeline.
    pub fn attempt(&self, id: &Uuid) -> String {
        match self {
            Links::Console => format!("/attempts/{id}"),
            Links::Export => format!("attempts/{id}.json"),
        }
    }
}

/// The offline page of a run's export: the run's story as the console
/// tells it, linking to the files beside it. No script, no network.
#[derive(Template)]
#[template(path = "console/export.html")]
struct ExportPage<'a> {
    run: &'a crate::domain::run::Run,
    input: Option<String>,
    output: Option<String>,
    waiting: Option<String>,
    story: Vec<StepStory>,
    links: Links,
    exported_at: String,
    exported_by: &'a str,
}

/// Renders an export's `index.html`: the input and output given whole
/// (as text), every step's attempts as their timelines tell them.
pub fn export_index(
    run: &crate::domain::run::Run,
    input: Option<String>,
    output: Option<String>,
    story: Vec<StepStory>,
    at: chrono::DateTime<chrono::Utc>,
    by: &str,
) -> askama::Result<String> {
    let waiting = story
        .iter()
        .flat_map(|(_, _, ts)| ts.last())
        .next_back()
        .and_then(|t| t.waiting_reason.clone());
    ExportPage {
        run,
        input,
        output,
        waiting,
        story,
        links: Links::Export,
        exported_at: at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        exported_by: by,
    }
    .render()
}

/// A step of a run as its story tells it: name, state, and each attempt's
/// whole timeline.
pub type StepStory = (String, String, Vec<crate::api::runtime::Timeline>);

#[derive(Template)]
#[template(path = "console/run.html")]
struct RunPage {
    l: Layout,
    input: Shown,
    output: Option<Shown>,
    run: crate::domain::run::Run,
    /// Why the run waits now (its attempt's reason), while it runs.
    waiting: Option<String>,
    story: Vec<StepStory>,
    links: Links,
    reruns: Vec<crate::domain::run::Run>,
    tokens: crate::capacity::ledger::RunTokens,
    can_cancel: bool,
    can_hold: bool,
}

/// `GET /runs/{id}/export`: the run taken away for review, as the API's
/// export gives it (`.tar.gz`, opens offline).
pub async fn export_run(
    console: Console,
    Path(run_id): Path<String>,
) -> Result<Response, PageError> {
    console.require(Scope::RunsRead)?;
    let scope = console.scope()?;
    let id = parse_uuid("runId", &run_id)?;
    Ok(crate::api::export::export(&console.state, scope, id, console.by()).await?)
}

/// `GET /runs/{id}`: a run with its steps and attempts.
pub async fn run(console: Console, Path(run_id): Path<String>) -> Result<Response, PageError> {
    console.require(Scope::RunsRead)?;
    let scope = console.scope()?;
    let run = console
        .state
        .runs
        .get(&scope, parse_uuid("runId", &run_id)?)?;
    let mut story = Vec::new();
    for step in &run.steps {
        let mut attempts = Vec::new();
        for id in &step.attempts {
            attempts.push(crate::api::runtime::timeline(&console.state, &scope, *id)?);
        }
        story.push((step.name.clone(), step.state.as_str().to_string(), attempts));
    }
    let waiting = (!run.state.is_terminal()).then(|| run_why(&console, &scope, &run));
    let runtime = &console.state.runtime;
    render(&RunPage {
        waiting,
        story,
        links: Links::Console,
        input: runtime.show(&scope, &run.input_ref, run.purged.as_ref()),
        output: run
            .output_ref
            .as_ref()
            .map(|h| runtime.show(&scope, h, run.purged.as_ref())),
        l: console.layout(format!("Run {}", short(&run_id)), "/runs"),
        can_cancel: console.can(Scope::RunsWrite) && !run.state.is_terminal(),
        can_hold: console.can(Scope::RunsOperate),
        reruns: console.state.runs.reruns(&scope, run.run_id)?,
        tokens: console.state.runs.tokens(&scope, run.run_id)?,
        run,
    })
}

/// `POST /runs/{id}/cancel`.
pub async fn cancel_run(
    console: Console,
    Path(run_id): Path<String>,
    raw: RawForm,
) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::RunsWrite)?;
    let scope = console.scope()?;
    let id = parse_uuid("runId", &run_id)?;
    let reason = fields.get("reason").unwrap_or_default();
    let result = console
        .state
        .runs
        .cancel(&scope, id, &console.by(), reason)
        .await
        .map(|r| {
            format!(
                "run {id} is {}; cancellation is observed at the next safe point",
                r.state.as_str()
            )
        });
    Ok(console.done(&format!("/runs/{id}"), result))
}

/// `POST /runs/{id}/hold`: places or releases a legal hold.
pub async fn hold_run(
    console: Console,
    Path(run_id): Path<String>,
    raw: RawForm,
) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::RunsOperate)?;
    let scope = console.scope()?;
    let id = parse_uuid("runId", &run_id)?;
    let reason = match fields.get("release") {
        Some(_) => None,
        None => Some(fields.get("reason").unwrap_or_default()),
    };
    let result = console
        .state
        .runs
        .hold(&scope, id, &console.by(), reason)
        .await
        .map(|r| match r.hold {
            Some(h) => format!("run {id} is on legal hold: {}", h.reason),
            None => format!("run {id} is no longer held; retention applies again"),
        });
    Ok(console.done(&format!("/runs/{id}"), result))
}

// ---- attempts ---------------------------------------------------------------

/// `GET /attempts`: every attempt with state, agent, release and project
/// filters.
pub async fn attempts(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::RunsRead)?;
    let scope = console.scope()?;
    let q = ListQuery::parse(&raw);
    let state = q.get("state").and_then(AttemptState::parse);
    let agent = q.get("agent");
    let release = q.get("release");
    let project = q.get("project");
    let before = q.get("before");
    let (from, until) = (
        q.day("from").map_err(ApiError::from)?,
        q.day("until").map_err(ApiError::from)?,
    );
    let reason = q
        .get("reason")
        .map(|r| r.trim().to_lowercase())
        .filter(|r| !r.is_empty());
    let mut summaries = console.state.runtime.page(
        &scope,
        state,
        before,
        PAGE_SIZE + 1,
        |a: &ExecutionAttempt| {
            let day = a.started_at.date_naive();
            agent.is_none_or(|v| a.agent_id == v)
                && release.is_none_or(|v| a.release_id == v)
                && project.is_none_or(|v| a.project_id.as_str() == v)
                && from.is_none_or(|d| day >= d)
                && until.is_none_or(|d| day <= d)
                && reason.as_ref().is_none_or(|text| {
                    a.failure
                        .as_ref()
                        .map(|f| f.reason.clone())
                        .or_else(|| a.waiting_reason())
                        .is_some_and(|why| why.to_lowercase().contains(text))
                })
        },
    )?;
    let older = (summaries.len() > PAGE_SIZE).then(|| {
        summaries.truncate(PAGE_SIZE);
        summaries
            .last()
            .map(|a| a.attempt_id.to_string())
            .unwrap_or_default()
    });
    let total = match (agent, release, project, from, until, &reason) {
        (None, None, None, None, None, None) => Some(console.state.runtime.count(&scope, state)?),
        _ => None,
    };
    // Why the live ones wait, from their grains' views.
    let waiting: std::collections::HashMap<Uuid, String> = console
        .state
        .runtime
        .live()
        .iter()
        .filter(|v| v.attempt.tenant_id == *console.viewing())
        .filter_map(|v| Some((v.attempt.attempt_id, v.waiting_reason()?)))
        .collect();
    let rows = summaries
        .iter()
        .map(|s| {
            vec![
                Cell::id(s.attempt_id, format!("/attempts/{}", s.attempt_id)),
                Cell::State(s.state.as_str().to_string()),
                Cell::text(s.phase.as_str()),
                Cell::text(&s.agent_id),
                Cell::text(&s.release_id),
                Cell::text(s.project_id.as_str()),
                Cell::id(s.run_id, format!("/runs/{}", s.run_id)),
                Cell::num(s.number),
                Cell::time(&s.started_at),
                Cell::words(
                    waiting
                        .get(&s.attempt_id)
                        .cloned()
                        .or_else(|| {
                            s.failure
                                .as_ref()
                                .map(|f| format!("{}: {}", f.class.as_str(), f.reason))
                        })
                        .unwrap_or_default(),
                ),
            ]
        })
        .collect();
    let (agents, releases, projects) = choices(&console, &scope)?;
    let filters = vec![
        q.filter(
            "state",
            "state",
            AttemptState::ALL
                .iter()
                .map(|s| s.as_str().to_string())
                .collect(),
        ),
        q.filter("agent", "agent", agents),
        q.filter("release", "release", releases),
        q.filter("project", "project", projects),
        q.day_filter("from", "started from"),
        q.day_filter("until", "until"),
        q.filter("reason", "reason has", Vec::new()),
    ];
    let t = q.history_table(
        "attempts",
        "/attempts",
        &[
            "Attempt", "State", "Phase", "Agent", "Release", "Project", "Run", "No", "Started",
            "Why",
        ],
        rows,
        filters,
        "No attempts match.",
        total,
        older,
    );
    render(&ListPage {
        l: console.layout("Attempts", "/attempts"),
        intro: "Every attempt of the tenant, newest first, with why a live one waits or why an ended one failed. Open one for its timeline.".into(),
        t,
    })
}

// ---- timeline ---------------------------------------------------------------

#[derive(Template)]
#[template(path = "console/timeline.html")]
struct TimelinePage {
    l: Layout,
    id: String,
    live: TimelineLive,
    /// The agent's graph, when its adapter keeps one in its state (a
    /// LangGraph graph run by the Python SDK).
    graph: Option<GraphView>,
    /// The model text of each turn as the stream holds it now, and where
    /// the stream ends (the page follows from there).
    turns: Vec<(String, String)>,
    text_end: u64,
}

/// An agent's graph as its last checkpoint keeps it (`langgraph_graph`:
/// `{nodes: [name], edges: [[from, to, conditional]]}`), with the nodes
/// that ran in the last step lit.
pub struct GraphView {
    /// Each node.
    nodes: Vec<GraphNode>,
    /// The step of the last checkpoint.
    step: Option<i64>,
}

/// A node of an agent's graph.
pub struct GraphNode {
    name: String,
    /// Whether it ran in the last step.
    ran: bool,
    /// Where it goes, and whether on a condition.
    to: Vec<(String, bool)>,
}

/// Nodes and edges a page shows at most.
const GRAPH_NODES: usize = 200;
const GRAPH_EDGES: usize = 500;

impl GraphView {
    /// The graph of an adapter state, if it keeps one.
    fn of(state: &Value) -> Option<GraphView> {
        // The Python SDK keeps the handler's state inside its envelope.
        let state = state
            .get("state")
            .filter(|s| s.get("langgraph_graph").is_some())
            .unwrap_or(state);
        let g = state.get("langgraph_graph")?;
        let name =
            |v: &Value| -> Option<String> { v.as_str().map(|s| s.chars().take(100).collect()) };
        // The root graph's latest checkpoint (namespace "").
        let latest = state.pointer("/langgraph//latest");
        let ran: Vec<String> = latest
            .and_then(|l| l.get("nodes"))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(name).collect())
            .unwrap_or_default();
        let edges: Vec<(String, String, bool)> = g
            .get("edges")?
            .as_array()?
            .iter()
            .take(GRAPH_EDGES)
            .filter_map(|e| {
                let e = e.as_array()?;
                Some((
                    name(e.first()?)?,
                    name(e.get(1)?)?,
                    e.get(2).and_then(Value::as_bool).unwrap_or(false),
                ))
            })
            .collect();
        let nodes = g
            .get("nodes")?
            .as_array()?
            .iter()
            .take(GRAPH_NODES)
            .filter_map(name)
            .map(|name| GraphNode {
                to: edges
                    .iter()
                    .filter(|(from, ..)| *from == name)
                    .map(|(_, to, conditional)| (to.clone(), *conditional))
                    .collect(),
                ran: ran.contains(&name),
                name,
            })
            .collect();
        Some(GraphView {
            nodes,
            step: latest.and_then(|l| l.get("step")).and_then(Value::as_i64),
        })
    }
}

/// A phase segment of the timeline's strip.
pub struct Segment {
    x: f64,
    width: f64,
    title: String,
    tone: &'static str,
    /// Time spent waiting ([`AttemptState::is_waiting`]): drawn hatched.
    waiting: bool,
}

/// One state of the legend under the phase strip: its colour, whether it
/// is waiting time, and how long the attempt spent in it.
pub struct LegendItem {
    state: String,
    tone: &'static str,
    waiting: bool,
    spent: String,
}

/// Milliseconds as a person reads them.
pub(crate) fn spent(ms: impl std::borrow::Borrow<i64>) -> String {
    match *ms.borrow() {
        ms if ms < 1_000 => format!("{ms} ms"),
        ms if ms < 60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        ms if ms < 3_600_000 => format!("{} min {} s", ms / 60_000, ms % 60_000 / 1000),
        ms => format!("{} h {} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// The part of the timeline that updates live.
#[derive(Template)]
#[template(path = "console/timeline_live.html")]
pub struct TimelineLive {
    csrf: String,
    a: ExecutionAttempt,
    waiting: Option<String>,
    queue_position: Option<usize>,
    limiting_quota: Option<String>,
    open_tool: Option<String>,
    segments: Vec<Segment>,
    legend: Vec<LegendItem>,
    strip_from: String,
    strip_to: String,
    phases: Vec<(String, String, String, String)>,
    checkpoints: Vec<Checkpoint>,
    checkpoint_count: usize,
    calls: Vec<(CallRecord, CallContent)>,
    decisions: Vec<DecisionView>,
    delegations: Vec<(String, String, String)>,
    outcome: OutcomeContent,
    can_decide: bool,
    can_operate: bool,
    /// Seconds on the clock `maxMinutes` counts, and on the wall.
    active_seconds: u64,
    wall_seconds: u64,
    /// The run's slot, and whether it is held.
    run_slot: (String, bool),
}

impl TimelineLive {
    fn tone(s: &str) -> &'static str {
        Cell::tone(s)
    }
}

/// A decision with what is decided, from the artifact store: the
/// proposed call's arguments, the question, the answer schema, the answer.
pub struct DecisionView {
    pub(super) d: DecisionRequest,
    pub(super) arguments: Option<Shown>,
    pub(super) question: Option<Shown>,
    pub(super) schema: Option<String>,
    pub(super) answer: Option<Shown>,
    /// The form a pending question is answered with, built from its answer
    /// schema (a text box when it has none).
    pub(super) form: Form,
    /// The form of a pending approval's arguments, filled with the
    /// proposed ones, when the release lets a reviewer change them.
    pub(super) edit: Option<Form>,
    /// The arguments approved instead of the proposed ones.
    pub(super) edited: Option<Shown>,
}

impl DecisionView {
    /// Whether it is an approval (which a bulk decision can decide).
    pub fn is_approval(&self) -> bool {
        self.d.kind == DecisionKind::Approval
    }

    /// `<attemptId>/<decisionId>`, as a bulk decision names it.
    pub fn key(&self) -> String {
        format!("{}/{}", self.d.attempt_id, self.d.decision_id)
    }

    /// Reads the content of a decision of the scope's tenant.
    pub fn read(
        runtime: &crate::runtime::Runtime,
        scope: &TenantScope,
        d: DecisionRequest,
    ) -> Self {
        let purged = d.purged.as_ref();
        let show = |h: &String| runtime.show(scope, h, purged);
        // An approval's question is the proposed call's arguments: shown
        // once, as the arguments.
        let arguments = d.proposal.as_ref().map(|p| &p.request_hash);
        DecisionView {
            arguments: arguments.map(show),
            question: d
                .question_ref
                .as_ref()
                .filter(|q| Some(*q) != arguments)
                .map(show),
            schema: d
                .answer_schema
                .as_ref()
                .map(|s| serde_json::to_string_pretty(s).unwrap_or_default()),
            answer: d.answer_ref.as_ref().map(show),
            form: answer_form(&d),
            edit: edit_form(runtime, scope, &d),
            edited: d.edited_request_hash.as_ref().map(show),
            d,
        }
    }
}

/// The form of a pending approval's arguments, filled with the proposed
/// ones: only where the release's policy lets a reviewer change them.
fn edit_form(
    runtime: &crate::runtime::Runtime,
    scope: &TenantScope,
    d: &DecisionRequest,
) -> Option<Form> {
    let proposal = d.proposal.as_ref().filter(|_| d.awaits_approval())?;
    let attempt = runtime.attempt(scope, d.attempt_id).ok()?;
    let info = runtime.release(scope, &attempt.release_id).ok()?;
    if !info.manifest.policy.allows_edit(&proposal.target) {
        return None;
    }
    let (tool, _) = info.tool(&proposal.target)?;
    let proposed = runtime
        .content(scope, &proposal.request_hash)
        .ok()
        .flatten()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
    Some(Form::of(&tool.input_schema, proposed.as_ref()))
}

/// The form a question is answered with: its answer schema's, else one
/// box whose text is the answer (JSON when it parses as JSON).
fn answer_form(d: &DecisionRequest) -> Form {
    match &d.answer_schema {
        Some(schema) => Form::of(schema, None),
        None => {
            let mut form = Form::of(&serde_json::json!({"type": "string"}), None);
            form.fields[0].label = "Your answer".into();
            form.fields[0].kind = crate::domain::form::Kind::LongText;
            form.fields[0].help = "Text, or a JSON document.".into();
            form
        }
    }
}

/// Builds the live part of a timeline.
pub fn timeline_live(console: &Console, attempt_id: Uuid) -> Result<TimelineLive, PageError> {
    let scope = console.scope()?;
    let view: std::sync::Arc<AttemptView> = console.state.runtime.view(&scope, attempt_id)?;
    timeline_of(console, &scope, &view)
}

/// Builds the live part of a timeline from a view of the attempt.
pub fn timeline_of(
    console: &Console,
    scope: &TenantScope,
    view: &AttemptView,
) -> Result<TimelineLive, PageError> {
    let runtime = &console.state.runtime;
    let a = view.attempt.clone();
    let now = console.state.clock.now();
    let end = a.ended_at.unwrap_or(now);
    let start = a.phases.first().map(|p| p.at).unwrap_or(a.started_at);
    let span = (end - start).num_milliseconds().max(1) as f64;
    let mut segments = Vec::new();
    let mut phases = Vec::new();
    let mut totals: Vec<(AttemptState, i64)> = Vec::new();
    for (i, p) in a.phases.iter().enumerate() {
        let until = a.phases.get(i + 1).map(|n| n.at).unwrap_or(end);
        let ms = (until - p.at).num_milliseconds().max(0);
        // At least 3 units wide, and inside the strip: the last segment of
        // an ended attempt starts where the strip ends.
        let width = (ms as f64 / span * 1000.0).max(3.0);
        let x = ((p.at - start).num_milliseconds() as f64 / span * 1000.0).min(1000.0 - width);
        let waiting = p.state.is_waiting();
        segments.push(Segment {
            x,
            width,
            title: format!(
                "{} · {} · {}{}",
                p.state.as_str(),
                p.phase.as_str(),
                spent(ms),
                if waiting { " waiting" } else { "" }
            ),
            tone: Cell::tone(p.state.as_str()),
            waiting,
        });
        match totals.iter_mut().find(|(s, _)| *s == p.state) {
            Some((_, total)) => *total += ms,
            None => totals.push((p.state, ms)),
        }
        phases.push((
            when(&p.at),
            p.state.as_str().to_string(),
            p.phase.as_str().to_string(),
            format!("{ms} ms"),
        ));
    }
    let legend = totals
        .into_iter()
        .map(|(state, ms)| LegendItem {
            state: state.as_str().to_string(),
            tone: Cell::tone(state.as_str()),
            waiting: state.is_waiting(),
            spent: spent(ms),
        })
        .collect();
    let checkpoints = runtime.checkpoints(scope, a.attempt_id)?;
    let checkpoint_count = checkpoints.len();
    let checkpoints = checkpoints.into_iter().rev().take(5).collect();
    let calls = runtime.calls(scope, a.attempt_id)?;
    let open_tool = calls
        .iter()
        .rev()
        .find(|c| c.is_open())
        .map(|c| format!("{} {}", c.kind.as_str(), c.target));
    let delegations = runtime
        .delegations(scope, a.attempt_id)?
        .into_iter()
        .map(|d| {
            (
                d.child_run_id.to_string(),
                d.child_agent_id.clone(),
                d.status.clone(),
            )
        })
        .collect();
    let decisions = runtime
        .decisions(scope, a.attempt_id)?
        .into_iter()
        .map(|d| DecisionView::read(runtime, scope, d))
        .collect();
    let calls = calls
        .into_iter()
        .map(|c| {
            let content = runtime.call_content(scope, &c);
            (c, content)
        })
        .collect();
    Ok(TimelineLive {
        outcome: runtime.outcome_content(scope, &a),
        csrf: console.session.csrf.clone(),
        waiting: view.waiting_reason(),
        queue_position: view.queue_position,
        limiting_quota: view.limiting_quota.clone(),
        open_tool,
        segments,
        legend,
        strip_from: when(&start),
        strip_to: if a.ended_at.is_some() {
            when(&end)
        } else {
            format!("{} (now)", when(&end))
        },
        phases,
        checkpoints,
        checkpoint_count,
        decisions,
        calls,
        delegations,
        can_decide: console.can(Scope::RunsDecide),
        can_operate: console.can(Scope::RunsOperate),
        active_seconds: a.active_ms(now) / 1000,
        wall_seconds: (end - a.started_at).num_seconds().max(0) as u64,
        run_slot: (
            a.run_slot().to_string(),
            console.state.capacity.holds_slot(a.run_slot()),
        ),
        a,
    })
}

/// `GET /attempts/{id}`: phases over time, checkpoints, calls, decisions,
/// outcome and why it waits now; live over SSE with JS.
pub async fn timeline(
    console: Console,
    Path(attempt_id): Path<String>,
) -> Result<Response, PageError> {
    console.require(Scope::RunsRead)?;
    let id = parse_uuid("attemptId", &attempt_id)?;
    let live = timeline_live(&console, id)?;
    // The graph as the last checkpoint keeps it, read once per page.
    let scope = console.scope()?;
    let graph = console
        .state
        .runtime
        .last_checkpoint(&scope, &live.a)?
        .and_then(|c| checkpoint_state(&console.state.runtime, &scope, &c).ok())
        .and_then(|state| GraphView::of(&state));
    let (turns, text_end) = console.state.runtime.text_so_far(&scope, id)?;
    render(&TimelinePage {
        l: console.layout(format!("Attempt {}", short(&attempt_id)), "/attempts"),
        id: id.to_string(),
        live,
        graph,
        turns: turns.into_iter().map(|(c, t)| (c.to_string(), t)).collect(),
        text_end,
    })
}

/// One checkpoint row: the checkpoint, and what a re-run from it with the
/// source run's release would meet.
struct CheckpointRow {
    c: Checkpoint,
    /// Why a re-run cannot start from it (with the run's release).
    blocked: Option<String>,
    /// Confirmed effects after it, by sequence.
    effects_after: Vec<u32>,
}

/// The re-run form: releases it may take and the confirmed effects an
/// operator may name for re-issue.
struct RerunForm {
    /// Why no checkpoint of the attempt can start a re-run.
    blocked: Option<String>,
    /// `(release id, version, the source run's)`.
    releases: Vec<(String, String, bool)>,
    /// Confirmed effects of the attempt.
    effects: Vec<CallRecord>,
    /// The checkpoint preselected: the last one a re-run can start from.
    preselected: Option<u32>,
}

impl RerunForm {
    fn preselects(&self, sequence: &u32) -> bool {
        self.preselected == Some(*sequence)
    }
}

#[derive(Template)]
#[template(path = "console/checkpoints.html")]
struct CheckpointsPage {
    l: Layout,
    id: String,
    a: ExecutionAttempt,
    rows: Vec<CheckpointRow>,
    resumable: Option<String>,
    rerun: Option<RerunForm>,
    compare: Compare,
}

/// Two checkpoints compared: the sequences chosen, and the changes from
/// the first's adapter state to the second's, as far as a page lists
/// them (or why they cannot be read).
#[derive(Default)]
struct Compare {
    from: Option<u32>,
    to: Option<u32>,
    changes: Option<Result<crate::domain::diff::Diff, String>>,
}

/// The adapter state of a checkpoint as JSON, or why it cannot be read.
fn checkpoint_state(
    runtime: &crate::runtime::Runtime,
    scope: &TenantScope,
    c: &crate::domain::attempt::Checkpoint,
) -> Result<Value, String> {
    if let Some(t) = &c.purged {
        return Err(format!("checkpoint {}: {}", c.sequence, t.describe()));
    }
    let (_, bytes) = runtime
        .artifact(scope, &c.adapter_state_ref)
        .map_err(|e| format!("checkpoint {}: {e}", c.sequence))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| format!("checkpoint {}'s state is not JSON: {e}", c.sequence))
}

/// `GET /attempts/{id}/checkpoints`: every checkpoint, with whether the
/// attempt could resume from the last one and, for a finished attempt,
/// the re-run form; with `from` and `to`, what changed in the adapter
/// state between those two checkpoints (a structural JSON diff).
pub async fn checkpoints(
    console: Console,
    Path(attempt_id): Path<String>,
    raw: RawQuery,
) -> Result<Response, PageError> {
    console.require(Scope::RunsRead)?;
    let scope = console.scope()?;
    let id = parse_uuid("attemptId", &attempt_id)?;
    let state = &console.state;
    let a = state.runtime.attempt(&scope, id)?;
    let checkpoints = state.runtime.checkpoints(&scope, id)?;
    let q = ListQuery::parse(&raw);
    let sequence = |name: &str| -> Result<Option<u32>, ApiError> {
        match q.get(name).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                ApiError::invalid(name, format!("{v:?} is not a checkpoint sequence number"))
            }),
        }
    };
    let mut compare = Compare {
        from: sequence("from")?,
        to: sequence("to")?,
        changes: None,
    };
    if let (Some(from), Some(to)) = (compare.from, compare.to) {
        let find = |n: u32| {
            checkpoints
                .iter()
                .find(|c| c.sequence == n)
                .ok_or_else(|| format!("attempt {id} has no checkpoint {n}"))
        };
        let pair = find(from).and_then(|a| Ok((a.clone(), find(to)?.clone())));
        // Read, parsed and compared off the async workers, within the
        // page's budget.
        let (runtime, s) = (state.runtime.clone(), scope.clone());
        compare.changes = Some(match pair {
            Err(why) => Err(why),
            Ok((a, b)) => tokio::task::spawn_blocking(move || {
                let before = checkpoint_state(&runtime, &s, &a)?;
                let after = checkpoint_state(&runtime, &s, &b)?;
                Ok(crate::domain::diff::diff(
                    &before,
                    &after,
                    crate::domain::diff::PAGE,
                ))
            })
            .await
            .map_err(ApiError::internal)?,
        });
    }
    let calls = state.runtime.calls(&scope, id)?;
    let resumable = (!a.state.is_terminal())
        .then(|| checkpoints.last())
        .flatten()
        .map(|c| match c.compatible_with(&a.adapter_version, a.checkpoint_format) {
            Ok(()) => format!(
                "the last checkpoint (#{}) matches the attempt's adapter {} and format {}: a resume continues from it",
                c.sequence, a.adapter_version, a.checkpoint_format
            ),
            Err(why) => format!(
                "{why}: a resume would fail (infrastructure) and start a new attempt from the step input"
            ),
        });
    let rows: Vec<CheckpointRow> = checkpoints
        .into_iter()
        .map(|c| CheckpointRow {
            blocked: crate::domain::rerun::checkpoint_blocker(
                &c,
                &a.adapter_version,
                a.checkpoint_format,
            ),
            effects_after: crate::domain::rerun::effects_after(&c, &calls)
                .iter()
                .map(|e| e.sequence)
                .collect(),
            c,
        })
        .collect();
    let rerun = if console.can(Scope::RunsOperate) && a.state.is_terminal() {
        let source = state.releases.get(&scope, &a.release_id)?;
        let releases = state
            .releases
            .list(Some(&scope))?
            .into_iter()
            .filter(|r| r.agent_id == a.agent_id && r.dispatchable().is_ok())
            .filter(|r| {
                source.as_ref().is_none_or(|s| {
                    crate::domain::release::version_order(&r.version, &s.version).is_ge()
                })
            })
            .map(|r| {
                let own = r.release_id == a.release_id;
                (r.release_id, r.version, own)
            })
            .collect();
        Some(RerunForm {
            blocked: crate::domain::rerun::attempt_blocker(&a, &calls),
            releases,
            effects: calls.into_iter().filter(|c| c.confirmed_effect()).collect(),
            preselected: rows
                .iter()
                .rev()
                .find(|r| r.blocked.is_none())
                .map(|r| r.c.sequence),
        })
    } else {
        None
    };
    render(&CheckpointsPage {
        l: console.layout(
            format!("Checkpoints of {}", short(&attempt_id)),
            "/attempts",
        ),
        id: id.to_string(),
        a,
        rows,
        resumable,
        rerun,
        compare,
    })
}

/// `POST /attempts/{id}/rerun`: a new run from the chosen checkpoint.
pub async fn rerun(
    console: Console,
    Path(attempt_id): Path<String>,
    raw: RawForm,
) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::RunsOperate)?;
    let scope = console.scope()?;
    let id = parse_uuid("attemptId", &attempt_id)?;
    let back = format!("/attempts/{id}/checkpoints");
    let request = (|| -> Result<rerun::RerunRequest, FieldError> {
        let sequence = match fields.get("checkpoint") {
            None => {
                return Err(FieldError::new(
                    "checkpoint",
                    "choose the checkpoint to start from",
                ));
            }
            Some(n) => n.parse::<u32>().map_err(|_| {
                FieldError::new("checkpoint", format!("{n:?} is not a checkpoint number"))
            })?,
        };
        Ok(rerun::RerunRequest {
            attempt_id: id,
            checkpoint_sequence: Some(sequence),
            release_id: fields.get("release").map(str::to_string),
            reissue: fields
                .all("reissue")
                .into_iter()
                .map(|c| crate::domain::ids::parse_uuid("reissue", c))
                .collect::<Result<_, _>>()?,
            request_id: None,
            by: console.by(),
        })
    })();
    let request = match request {
        Ok(r) => r,
        Err(e) => return Ok(console.done(&back, Err::<String, _>(e))),
    };
    let sequence = request.checkpoint_sequence.unwrap_or_default();
    match console.state.runs.rerun(&scope, request).await {
        Ok(run) => Ok(console.done(
            &format!("/runs/{}", run.run_id),
            Ok::<_, ApiError>(format!(
                "run {} starts from checkpoint {sequence} of attempt {id} with release {}",
                run.run_id, run.snapshot.release_id
            )),
        )),
        Err(e) => Ok(console.done(&back, Err::<String, _>(e))),
    }
}

/// `GET /artifacts/{hash}`: the whole content behind a hash of the
/// tenant looked at, sandboxed (see [`crate::api::runtime::artifact_response`]).
pub async fn artifact(console: Console, Path(hash): Path<String>) -> Result<Response, PageError> {
    console.require(Scope::RunsRead)?;
    let scope = console.scope()?;
    Ok(crate::api::runtime::artifact_response(
        &console.state,
        &scope,
        &hash,
    )?)
}

/// `POST /attempts/{id}/interrupt` (Operator).
pub async fn interrupt(
    console: Console,
    Path(attempt_id): Path<String>,
    raw: RawForm,
) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::RunsOperate)?;
    let scope = console.scope()?;
    let id = parse_uuid("attemptId", &attempt_id)?;
    let result = console
        .state
        .runtime
        .interrupt(
            &scope,
            id,
            &console.by(),
            fields.get("reason").unwrap_or_default(),
            InterruptSource::Interrupt,
        )
        .await
        .map(|a| {
            format!(
                "interrupt recorded; the attempt is {} and stops at its next safe point",
                a.state.as_str()
            )
        });
    Ok(console.done(&format!("/attempts/{id}"), result))
}

/// `POST /attempts/{id}/decisions/{decision}` (Reviewer): approve or reject
/// an approval, answer a question, choose an escalation's option.
pub async fn decide(
    console: Console,
    Path((attempt_id, decision_id)): Path<(String, String)>,
    raw: RawForm,
) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::RunsDecide)?;
    let scope = console.scope()?;
    let id = parse_uuid("attemptId", &attempt_id)?;
    let decision = parse_uuid("decisionId", &decision_id)?;
    let back = fields
        .get("back")
        .filter(|b| *b == "/decisions" || *b == crate::domain::notify::decision_page(id, decision))
        .map(str::to_string)
        .unwrap_or_else(|| format!("/attempts/{id}"));
    let runtime = &console.state.runtime;
    let by = console.by();
    let result = match fields.get("action") {
        // Accept, edit (approve with changed arguments), respond (decline
        // with words for the agent, which goes on) or reject.
        Some(action @ ("approve" | "edit" | "respond" | "reject")) => {
            let arguments = if action == "edit" {
                let d = runtime.decision(&scope, id, decision)?;
                let Some(form) = edit_form(runtime, &scope, &d) else {
                    let why = ApiError::invalid(
                        "action",
                        "the release's policy does not let a reviewer change this call's arguments",
                    );
                    return Ok(console.done(&back, Err::<String, _>(why)));
                };
                match form.read(|name| fields.all(name)) {
                    Ok(value) => Some(value),
                    Err(e) => return Ok(console.done(&back, Err::<String, ApiError>(e.into()))),
                }
            } else {
                None
            };
            runtime
                .decide(
                    &scope,
                    id,
                    decision,
                    crate::runtime::ApprovalVerdict {
                        approve: matches!(action, "approve" | "edit"),
                        by: by.clone(),
                        reason: fields.get("reason").map(str::to_string),
                        arguments,
                        respond: action == "respond",
                    },
                )
                .await
                .map(|a| {
                    let done = match action {
                        "approve" => "approved",
                        "edit" => "approved with the changed arguments",
                        "respond" => "answered the agent instead of making the call",
                        _ => "rejected",
                    };
                    format!("{done}; the attempt is {}", a.state.as_str())
                })
                .map_err(ApiError::from)
        }
        Some("answer") => {
            let choice = fields.get("choice").map(str::to_string);
            // A form's fields make the answer, by the question's schema.
            let from_form = choice.is_none()
                && (fields.has(crate::domain::form::ROOT)
                    || fields.all_keys().any(|k| k.starts_with("f.")));
            let answer = match runtime.decision(&scope, id, decision) {
                Ok(d) if from_form => {
                    let form = answer_form(&d);
                    match form.read(|name| fields.all(name)) {
                        Ok(value) if d.answer_schema.is_none() => {
                            let text = value.as_str().unwrap_or_default().trim().to_string();
                            (!text.is_empty()).then(|| {
                                canonical_json(
                                    &serde_json::from_str::<Value>(&text)
                                        .unwrap_or(Value::String(text)),
                                )
                            })
                        }
                        Ok(value) => Some(canonical_json(&value)),
                        Err(e) => {
                            return Ok(console.done(&back, Err::<String, ApiError>(e.into())));
                        }
                    }
                }
                _ => fields.get("answer").map(|text| {
                    let value = serde_json::from_str::<Value>(text)
                        .unwrap_or_else(|_| Value::String(text.to_string()));
                    canonical_json(&value)
                }),
            };
            if choice.is_none() && answer.is_none() {
                Err(ApiError::invalid(
                    "answer",
                    "give an answer or choose an option",
                ))
            } else {
                runtime
                    .answer(&scope, id, decision, &by, choice, answer)
                    .await
                    .map(|a| format!("answered; the attempt is {}", a.state.as_str()))
                    .map_err(ApiError::from)
            }
        }
        other => Err(ApiError::invalid(
            "action",
            format!(
                "{:?} is not one of approve, reject, answer",
                other.unwrap_or("")
            ),
        )),
    };
    Ok(console.done(&back, result))
}

/// `POST /attempts/{id}/calls/{call}/settle` (Operator): the effect of an
/// uncertain call happened or did not, with the reason.
pub async fn settle(
    console: Console,
    Path((attempt_id, call_id)): Path<(String, String)>,
    raw: RawForm,
) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::RunsOperate)?;
    let scope = console.scope()?;
    let id = parse_uuid("attemptId", &attempt_id)?;
    let call = parse_uuid("callId", &call_id)?;
    let back = if fields.get("back") == Some("/uncertain") {
        "/uncertain".to_string()
    } else {
        format!("/attempts/{id}")
    };
    let effect = match fields.get("effect") {
        Some("happened") => Effect::Happened,
        Some("did-not-happen") => Effect::DidNotHappen,
        other => {
            return Ok(console.done(
                &back,
                Err::<String, _>(ApiError::invalid(
                    "effect",
                    format!(
                        "{:?} is not one of happened, did-not-happen",
                        other.unwrap_or("")
                    ),
                )),
            ));
        }
    };
    let result = console
        .state
        .runs
        .settle_call(
            &scope,
            id,
            call,
            effect,
            fields.get("reason").unwrap_or_default(),
            fields.get("retry") == Some("on"),
            &console.by(),
        )
        .await
        .map(|run| {
            format!(
                "call settled ({}); the run is {}",
                effect.as_str(),
                run.state.as_str()
            )
        });
    Ok(console.done(&back, result))
}

// ---- decisions and uncertain calls -------------------------------------------

#[derive(Template)]
#[template(path = "console/decisions.html")]
struct DecisionsPage {
    l: Layout,
    /// Each waiting decision with what is decided.
    pending: Vec<DecisionView>,
    t: Table,
    can_decide: bool,
    /// Whether more than one approval waits: they can be decided at once.
    bulk: bool,
    /// How many wait beyond those shown ([`INBOX`]).
    more_pending: String,
    /// Only those the reader is expected to answer.
    mine: bool,
}

/// Waiting decisions the inbox shows at most, those of the oldest
/// attempts: each is a form with its question, so the page stays within
/// its budget however many wait.
const INBOX: usize = 100;

/// `GET /decisions`: the inbox of pending decisions, then the decided ones.
pub async fn decisions(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::RunsRead)?;
    let scope = console.scope()?;
    let q = ListQuery::parse(&raw);
    // "Mine": those whose assignee is the reader or one of the reader's
    // roles.
    let mine = q.get("mine").is_some();
    let roles: Vec<crate::domain::access::Role> = console.session.roles.iter().copied().collect();
    let pending: Vec<DecisionView> = console
        .state
        .runtime
        .pending_decisions(&scope, INBOX)?
        .into_iter()
        .filter(|d| {
            !mine
                || d.assignee
                    .as_ref()
                    .is_some_and(|a| a.includes(&console.session.username, &roles))
        })
        .map(|d| DecisionView::read(&console.state.runtime, &scope, d))
        .collect();
    let waiting = if pending.len() < INBOX {
        pending.len()
    } else {
        console.state.runtime.pending_decision_count(&scope)?
    };
    let more_pending = match waiting - pending.len() {
        0 => String::new(),
        n => format!(
            "… and {} more waiting, of later attempts: they show here as these are decided.",
            crate::console::thousands(n as u64)
        ),
    };
    let before = q.get("before");
    let mut decided = console
        .state
        .runtime
        .decided_decisions(&scope, before, PAGE_SIZE + 1)?;
    let older = (decided.len() > PAGE_SIZE).then(|| {
        decided.truncate(PAGE_SIZE);
        decided
            .last()
            .map(|d| crate::runtime::decision_key(d.attempt_id, d.decision_id))
            .unwrap_or_default()
    });
    let rows = decided
        .iter()
        .map(|d| {
            vec![
                Cell::id(d.attempt_id, format!("/attempts/{}", d.attempt_id)),
                Cell::text(d.kind.as_str()),
                Cell::text(&d.summary),
                Cell::State(d.status.as_str().to_string()),
                Cell::text(d.answered_by.clone().unwrap_or_default()),
                Cell::text(
                    d.choice
                        .clone()
                        .or_else(|| d.reason.clone())
                        .unwrap_or_default(),
                ),
                Cell::time(&d.requested_at),
                Cell::time_opt(&d.answered_at),
            ]
        })
        .collect();
    let t = q.history_table(
        "decided",
        "/decisions",
        &[
            "Attempt",
            "Kind",
            "Summary",
            "Status",
            "By",
            "Choice or reason",
            "Asked",
            "Decided",
        ],
        rows,
        vec![],
        "Nothing decided yet.",
        None,
        older,
    );
    let bulk = pending.iter().filter(|d| d.is_approval()).count() > 1;
    render(&DecisionsPage {
        l: console.layout("Decisions", "/decisions"),
        pending,
        t,
        can_decide: console.can(Scope::RunsDecide),
        bulk,
        more_pending,
        mine,
    })
}

/// `GET /uncertain`: calls whose effect nobody could confirm, with their
/// receipt, waiting for an operator's settlement.
pub async fn uncertain(console: Console, raw: RawQuery) -> Result<Response, PageError> {
    console.require(Scope::RunsRead)?;
    let scope = console.scope()?;
    let q = ListQuery::parse(&raw);
    let can_settle = console.can(Scope::RunsOperate);
    let mut rows = Vec::new();
    for c in console.state.runtime.unsettled_calls(&scope)? {
        {
            let agent = console
                .state
                .runtime
                .attempt(&scope, c.attempt_id)
                .map(|a| a.agent_id)
                .unwrap_or_default();
            let settled = c
                .settlement
                .as_ref()
                .map(|st| format!("{} by {}: {}", st.effect.as_str(), st.by, st.reason));
            let actions = if can_settle && settled.is_none() {
                Cell::Settle(format!(
                    "/attempts/{}/calls/{}/settle",
                    c.attempt_id, c.call_id
                ))
            } else {
                Cell::text(
                    settled
                        .clone()
                        .unwrap_or_else(|| "waiting for an Operator".into()),
                )
            };
            rows.push(vec![
                Cell::id(c.attempt_id, format!("/attempts/{}", c.attempt_id)),
                Cell::text(agent),
                Cell::text(format!("{} {}", c.kind.as_str(), c.target)),
                Cell::text(c.side_effect_class.map(|x| x.as_str()).unwrap_or("")),
                Cell::code(&c.request_hash),
                Cell::code(
                    c.receipt_ref
                        .clone()
                        .or(c.late_receipt_ref.clone())
                        .unwrap_or_default(),
                ),
                Cell::text(c.error.clone().unwrap_or_default()),
                Cell::time(&c.started_at),
                actions,
            ]);
        }
    }
    let t = q.table(
        "uncertain",
        "/uncertain",
        &[
            "Attempt",
            "Agent",
            "Call",
            "Class",
            "Request hash",
            "Receipt",
            "Why uncertain",
            "Started",
            "Settle",
        ],
        rows,
        vec![],
        "No uncertain calls: every call's effect is known.",
    );
    render(&ListPage {
        l: console.layout("Uncertain calls", "/uncertain"),
        intro: "A call in flight when its attempt stopped, whose effect could not be confirmed. It is never retried automatically: an Operator checks the receipt and the target system and settles it. The timeline's form also takes a reason and can start a new attempt when the effect did not happen.".into(),
        t,
    })
}

// ---- bulk actions ------------------------------------------------------------

/// Most rows one bulk action takes.
const MAX_BULK: usize = 200;

/// What a bulk action acts on: its list page and its form.
struct BulkKind {
    /// The column heading.
    noun: &'static str,
    one: &'static str,
    many: &'static str,
    /// Where the form posts.
    url: &'static str,
    /// The field naming each picked item.
    field: &'static str,
    /// The list page.
    back: &'static str,
}

const RUNS: BulkKind = BulkKind {
    noun: "Run",
    one: "run",
    many: "runs",
    url: "/runs/bulk",
    field: "run",
    back: "/runs",
};

const APPROVALS: BulkKind = BulkKind {
    noun: "Decision",
    one: "approval",
    many: "approvals",
    url: "/decisions/bulk",
    field: "decision",
    back: "/decisions",
};

/// One picked row of a bulk action and what confirming does to it.
struct BulkItem {
    id: String,
    /// The id, short.
    short: String,
    href: String,
    /// What the form sends for it.
    value: String,
    now: String,
    /// What confirming does to it, or why nothing.
    effect: Result<String, String>,
}

impl BulkItem {
    fn changes(&self) -> bool {
        self.effect.is_ok()
    }

    fn change(&self) -> String {
        match &self.effect {
            Ok(words) => words.clone(),
            Err(why) => format!("nothing: {why}"),
        }
    }
}

#[derive(Template)]
#[template(path = "console/bulk.html")]
struct BulkPage {
    l: Layout,
    kind: BulkKind,
    items: Vec<BulkItem>,
    changing: usize,
    action: String,
    reason: String,
    confirm: String,
}

/// The picked values of `kind`'s field, at least one and at most
/// [`MAX_BULK`].
fn picked<'a>(fields: &'a super::Fields, kind: &BulkKind) -> Result<Vec<&'a str>, ApiError> {
    let all: Vec<&str> = fields
        .all(kind.field)
        .into_iter()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect();
    if all.is_empty() {
        return Err(ApiError::invalid(
            kind.field,
            format!("pick at least one {}", kind.one),
        ));
    }
    if all.len() > MAX_BULK {
        return Err(ApiError::invalid(
            kind.field,
            format!(
                "{} picked; one bulk action takes at most {MAX_BULK}",
                all.len()
            ),
        ));
    }
    Ok(all)
}

/// The page that lists what confirming `verb` on `items` changes; nothing
/// has changed yet.
fn bulk_plan(
    console: &Console,
    kind: BulkKind,
    verb: &str,
    action: &str,
    reason: String,
    items: Vec<BulkItem>,
) -> Result<Response, PageError> {
    let changing = items.iter().filter(|i| i.changes()).count();
    let noun = if changing == 1 { kind.one } else { kind.many };
    render(&BulkPage {
        l: console.layout(format!("{verb} {} {}?", items.len(), kind.many), kind.back),
        confirm: format!("Confirm: {} {changing} {noun}", verb.to_lowercase()),
        kind,
        items,
        changing,
        action: action.to_string(),
        reason,
    })
}

/// Back to the list with what a confirmed bulk action did: how many were
/// done, and each refusal named.
fn bulk_outcome(
    console: &Console,
    kind: &BulkKind,
    verb: &str,
    total: usize,
    refused: Vec<String>,
) -> Response {
    let mut text = format!(
        "{verb} {} of {total} {}: done",
        total - refused.len(),
        kind.many
    );
    if !refused.is_empty() {
        text.push_str(&format!("; refused: {}", refused.join("; ")));
    }
    console.done(kind.back, Ok::<_, ApiError>(text))
}

/// `POST /runs/bulk`: cancels, holds or releases the holds of the picked
/// runs: first a page that lists what will change, then, confirmed, each
/// change as if made on its run's page (and audited so).
pub async fn bulk_runs(console: Console, raw: RawForm) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    let action = match RunAction::parse(fields.get("action").unwrap_or_default()) {
        Ok(a) => a,
        Err(e) => return Ok(console.done(RUNS.back, Err::<String, _>(e))),
    };
    console.require(action.scope())?;
    let scope = console.scope()?;
    let values = match picked(&fields, &RUNS) {
        Ok(v) => v,
        Err(e) => return Ok(console.done(RUNS.back, Err::<String, _>(e))),
    };
    let reason = fields.get("reason").unwrap_or_default().to_string();
    let mut items = Vec::new();
    let mut ids = Vec::new();
    for value in values {
        let id = parse_uuid("run", value)?;
        let run = console.state.runs.get(&scope, id)?;
        let now = match &run.hold {
            Some(h) => format!("{} (held: {})", run.state.as_str(), h.reason),
            None => run.state.as_str().to_string(),
        };
        items.push(BulkItem {
            short: short(&id.to_string()),
            id: id.to_string(),
            href: format!("/runs/{id}"),
            value: id.to_string(),
            now,
            effect: run.effect_of(action).map(str::to_string),
        });
        ids.push(id);
    }
    if !fields.has("confirm") {
        return bulk_plan(
            &console,
            RUNS,
            action.verb(),
            action.as_str(),
            reason,
            items,
        );
    }
    let by = console.by();
    let runs = &console.state.runs;
    let mut refused = Vec::new();
    for (item, id) in items.iter().zip(ids).filter(|(i, _)| i.changes()) {
        let result = match action {
            RunAction::Cancel => runs.cancel(&scope, id, &by, &reason).await.map(|_| ()),
            RunAction::Hold => runs.hold(&scope, id, &by, Some(&reason)).await.map(|_| ()),
            RunAction::Release => runs.hold(&scope, id, &by, None).await.map(|_| ()),
        };
        if let Err(e) = result {
            let why = super::describe(&ApiError::from(e).finish());
            refused.push(format!("run {}: {why}", item.id));
        }
    }
    let total = items.iter().filter(|i| i.changes()).count();
    Ok(bulk_outcome(&console, &RUNS, action.verb(), total, refused))
}

/// `POST /decisions/bulk`: approves or rejects the picked pending
/// approvals, after a page that lists what each approves.
pub async fn bulk_decisions(console: Console, raw: RawForm) -> Result<Response, PageError> {
    let fields = console.form(raw)?;
    console.require(Scope::RunsDecide)?;
    let scope = console.scope()?;
    let action = fields.get("action").unwrap_or_default().to_string();
    let (approve, verb) = match action.as_str() {
        "approve" => (true, "Approve"),
        "reject" => (false, "Reject"),
        other => {
            let e = ApiError::invalid(
                "action",
                format!("{other:?} is not a bulk decision: approve or reject"),
            );
            return Ok(console.done(APPROVALS.back, Err::<String, _>(e)));
        }
    };
    let values = match picked(&fields, &APPROVALS) {
        Ok(v) => v,
        Err(e) => return Ok(console.done(APPROVALS.back, Err::<String, _>(e))),
    };
    let reason = fields.get("reason").unwrap_or_default().to_string();
    let mut items = Vec::new();
    let mut keys = Vec::new();
    for value in values {
        let (attempt, decision) = value.split_once('/').ok_or_else(|| {
            ApiError::invalid(
                "decision",
                format!("{value:?} is not <attemptId>/<decisionId>"),
            )
        })?;
        let (attempt, decision) = (
            parse_uuid("decision", attempt)?,
            parse_uuid("decision", decision)?,
        );
        let d = console.state.runtime.decision(&scope, attempt, decision)?;
        let now = format!("{} {}", d.kind.as_str(), d.status.as_str());
        items.push(BulkItem {
            short: short(&decision.to_string()),
            id: decision.to_string(),
            href: format!("/attempts/{attempt}"),
            value: format!("{attempt}/{decision}"),
            effect: if d.awaits_approval() {
                Ok(format!("{action}d: {}", d.summary))
            } else {
                Err(format!("it is {now}"))
            },
            now,
        });
        keys.push((attempt, decision));
    }
    if !fields.has("confirm") {
        return bulk_plan(&console, APPROVALS, verb, &action, reason, items);
    }
    let by = console.by();
    let why = Some(reason).filter(|r| !r.is_empty());
    let mut refused = Vec::new();
    for (_, (attempt, decision)) in items.iter().zip(keys).filter(|(i, _)| i.changes()) {
        let runtime = &console.state.runtime;
        if let Err(e) = runtime
            .decide(
                &scope,
                attempt,
                decision,
                crate::runtime::ApprovalVerdict::plain(approve, &by, why.clone()),
            )
            .await
        {
            let why = super::describe(&ApiError::from(e).finish());
            refused.push(format!("decision {decision}: {why}"));
        }
    }
    let total = items.iter().filter(|i| i.changes()).count();
    Ok(bulk_outcome(&console, &APPROVALS, verb, total, refused))
}
