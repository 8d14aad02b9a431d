//! The builtin execution adapter: the appliance runs the loop of the
//! specification itself for releases whose adapter is `builtin`.
//!
//! resolve -> build context -> plan (model call) -> tool calls -> observe
//! -> update state -> next step ... -> verify -> result.
//!
//! The loop is a driver task the attempt's grain hands the attempt to. It
//! makes every move through the same runtime operations an external
//! adapter uses (claim, start, begin and complete each call, decisions,
//! report), so fencing, the tool closure, policy and approvals, checkpoints,
//! limits, corrections, interrupts and the single outcome are enforced by
//! the grain exactly as for any adapter. The driver's state (the
//! conversation and the tool calls still to make) travels with every call
//! and is checkpointed after every observation: after a crash the attempt
//! resumes from its last checkpoint, and a call whose effect was not
//! confirmed is never made again (the attempt is Uncertain instead).

pub mod context;
pub mod mcp;
pub mod model;
pub mod tools;
pub mod words;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use uuid::Uuid;

use self::model::{Model, ModelError, ModelReply, ToolCall};
use super::release::ReleaseInfo;
use super::{
    BeginCall, BeginOutcome, Completion, DecisionAsk, Outcome, Report, Runtime, RuntimeError,
    Ticket,
};
use crate::domain::access::TenantScope;
use crate::domain::attempt::{
    AttemptPhase, CallFence, CallKind, DecisionKind, DecisionStatus, FailureClass, Gate,
};
use crate::domain::reach::Target;
use crate::domain::release::{ToolTransport, canonical_json};
use crate::domain::{DomainError, TenantId};

/// The adapter version and checkpoint format the builtin loop writes.
pub const ADAPTER_VERSION: &str = "builtin/1";
/// The checkpoint format of [`LoopState`].
pub const CHECKPOINT_FORMAT: u32 = 1;
/// Time the loop spends per step outside model and tool calls (histogram,
/// seconds).
pub const STEP_OVERHEAD: &str = "agentbay_builtin_step_overhead_seconds";
/// Step overheads kept for a measurement, when one is on.
static SAMPLES: parking_lot::Mutex<Option<Vec<Duration>>> = parking_lot::Mutex::new(None);

/// Starts keeping every step's overhead (for benchmarks), or stops and
/// returns what was kept.
pub fn sample_step_overheads(on: bool) -> Vec<Duration> {
    let mut samples = SAMPLES.lock();
    let kept = samples.take().unwrap_or_default();
    if on {
        *samples = Some(Vec::new());
    }
    kept
}

/// Model calls that fail transiently are tried this often in a row.
const MODEL_TRIES: u32 = 3;

/// What the loop carries from checkpoint to checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoopState {
    /// The conversation after the system message and the task (OpenAI chat
    /// messages: assistant turns, tool results, correction requests).
    pub history: Vec<Value>,
    /// Tool calls of the last model turn not yet made.
    pub pending: VecDeque<ToolCall>,
    /// Model answers observed: the scripted model's position.
    pub turns: u32,
}

impl LoopState {
    fn bytes(&self) -> Vec<u8> {
        canonical_json(&serde_json::to_value(self).expect("loop state serialises"))
    }
}

/// How long a model server may take to accept a connection.
const MODEL_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the executor: it takes the builtin attempts the grains hand it
/// and drives each in a task of its own.
pub fn start(runtime: Arc<Runtime>, mut rx: mpsc::UnboundedReceiver<(TenantId, Uuid)>) {
    tokio::spawn(async move {
        while let Some((tenant, attempt_id)) = rx.recv().await {
            let runtime = runtime.clone();
            tokio::spawn(async move {
                let scope = TenantScope::new(tenant);
                if let Err(e) = drive(&runtime, &scope, attempt_id).await {
                    tracing::debug!(attempt = %attempt_id, error = %e, "the builtin loop stopped");
                }
            });
        }
    });
}

/// The HTTP client for the site's model servers, one for the process.
fn model_http() -> &'static reqwest::Client {
    static HTTP: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    HTTP.get_or_init(|| {
        reqwest::Client::builder()
            .connect_timeout(MODEL_CONNECT_TIMEOUT)
            .build()
            .expect("an HTTP client for model servers")
    })
}

/// How long a streamed answer may go without a byte (read at every call:
/// reloadable).
fn stream_idle(runtime: &Runtime) -> Duration {
    Duration::from_secs(runtime.shared.config.get().model_stream_idle_seconds.max(1))
}

/// The model a release's profile calls: its scripted responses, or its
/// OpenAI-compatible endpoint (or none), with the site's key for it.
fn release_model(
    runtime: &Runtime,
    scope: &TenantScope,
    info: &ReleaseInfo,
) -> Result<Model, RuntimeError> {
    let profile = &info.manifest.model_profile;
    let responses = match &profile.responses {
        Some(_) => Some(runtime.shared.releases.artifact(
            scope,
            &info.release,
            "modelResponses",
        )?),
        None => None,
    };
    let api_key = profile
        .api_key_ref
        .as_deref()
        .and_then(|name| runtime.model_api_key(name));
    Model::of(profile, responses.as_deref(), api_key, stream_idle(runtime)).map_err(|e| {
        DomainError::FailedPrecondition(format!("model profile {}: {e}", profile.id)).into()
    })
}

/// The model of the next call: the site's profile for the release's
/// profile id when there is one (read at every call, so re-pointing a
/// profile moves the next call), else none and the release's own; and what
/// serves the call, in words, for its record.
fn serving(
    runtime: &Runtime,
    scope: &TenantScope,
    info: &ReleaseInfo,
    own: &Model,
) -> Result<Serving, RuntimeError> {
    let profile = &info.manifest.model_profile;
    let site = super::profiles::resolve(runtime.store(), scope.tenant(), &profile.id)?;
    let Some(site) = site else {
        let served = match own {
            Model::OpenAi {
                endpoints, model, ..
            } => format!(
                "{} (model {model}, the release's profile {})",
                endpoints.join(", "),
                profile.id
            ),
            Model::Scripted { .. } => {
                format!(
                    "the scripted responses of the release's profile {}",
                    profile.id
                )
            }
            Model::Unmapped { .. } => format!("nothing: profile {} is not mapped", profile.id),
        };
        return Ok(Serving {
            model: None,
            site: None,
            served_by: served,
        });
    };
    let api_key = site
        .api_key_ref
        .as_deref()
        .and_then(|name| runtime.model_api_key(name));
    // The site's server is named, never addressed: its address is the
    // site's, not the tenant's to see.
    let served = format!(
        "site model profile {} (model {}, for {})",
        site.profile_id,
        site.model,
        site.scope_text()
    );
    Ok(Serving {
        model: Some(Model::site(&site, profile, api_key, stream_idle(runtime))),
        site: Some(site),
        served_by: served,
    })
}

/// What serves a model call: the site's model for the release's profile
/// and its profile, or none (the release's own); and what serves it, in
/// words, for its record.
struct Serving {
    model: Option<Model>,
    site: Option<crate::domain::model_profile::SiteModelProfile>,
    served_by: String,
}

/// Asks every server of a profile that is down whether it answers again
/// (`GET /models`): any HTTP answer but one that says it cannot serve now
/// (429, 502, 503, 504: a server still loading its model) means it does.
pub(crate) async fn probe_model_server(endpoints: &[String]) -> bool {
    for endpoint in endpoints {
        let asked = model_http()
            .get(format!("{endpoint}/models"))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if let Ok(answer) = asked
            && !matches!(answer.status().as_u16(), 429 | 502 | 503 | 504)
        {
            return true;
        }
    }
    false
}

/// Sends one chat completion to `model`: a model endpoint the release
/// names is reached only where the site allows it (`reach`), at the
/// addresses just checked; the site's own profiles (`reach` None) are the
/// site's.
async fn ask_model(
    model: &Model,
    reach: Option<&crate::domain::reach::SiteReach>,
    messages: &[Value],
    tools: &[Value],
    turn: u32,
    fence: &CallFence,
    sink: &crate::runtime::text::TextSink,
) -> Result<ModelReply, ModelError> {
    let pinned = match model {
        // A release names one endpoint.
        Model::OpenAi { endpoints, .. } if let Some(reach) = reach => Some(
            crate::runtime::reach::pinned_client(
                reach,
                "model endpoint",
                endpoints.first().map_or("", String::as_str),
                MODEL_CONNECT_TIMEOUT,
            )
            .await,
        ),
        _ => None,
    };
    let answer = match &pinned {
        Some(Err(why)) => Err(ModelError::Fatal(why.clone())),
        Some(Ok(client)) => {
            model
                .complete(client, messages, tools, turn, fence, Some(sink))
                .await
        }
        None => {
            model
                .complete(model_http(), messages, tools, turn, fence, Some(sink))
                .await
        }
    };
    match &answer {
        Ok(reply) => sink.answered(reply.content.as_deref()),
        Err(e) => sink.failed(&e.to_string()),
    }
    if let (None, Model::OpenAi { endpoints, .. }) = (reach, model) {
        let outcome = match &answer {
            Ok(reply) if reply.route.is_some() => "moved",
            Ok(_) => "answered",
            Err(ModelError::Transient(_)) => "failed",
            Err(ModelError::Unavailable(_)) => "unavailable",
            Err(ModelError::Fatal(_)) => "refused",
        };
        let server =
            crate::runtime::servers::label_of(endpoints.first().map_or("", String::as_str));
        metrics::counter!(crate::telemetry::names::MODEL_SERVER_CALLS, "server" => server, "outcome" => outcome)
            .increment(1);
    }
    answer
}

/// What served a call that answered: the profile, and which of its
/// servers when another was tried first.
fn served(reply: &ModelReply, served_by: &str) -> String {
    match &reply.route {
        Some(route) => format!("{served_by}: {route}"),
        None => served_by.to_string(),
    }
}

/// The receipt of a model call that answered.
fn model_receipt(reply: &ModelReply, served_by: &str) -> Value {
    let served_by = served(reply, served_by);
    json!({
        "schema": "model-invocation-v1", "model": reply.model,
        "inputTokens": reply.input_tokens, "outputTokens": reply.output_tokens,
        "cachedTokens": reply.cached_tokens,
        "latencyMs": reply.latency_ms, "servedBy": served_by,
    })
}

/// An external adapter's model call (`Adapter/CallModel`).
pub struct ModelAsk {
    /// The conversation, OpenAI chat messages.
    pub messages: Vec<Value>,
    /// The tools the model may ask for, OpenAI function definitions.
    pub tools: Vec<Value>,
    /// The context size the adapter declares (else estimated).
    pub context_tokens: Option<u32>,
    /// The adapter's state for the checkpoint after the answer.
    pub state: Option<Vec<u8>>,
}

/// What an external adapter's model call came to.
pub struct ModelTurn {
    /// How the begin ended (started, refused, replayed).
    pub begun: super::Begun,
    /// The answer (started and answered, or replayed).
    pub reply: Option<ModelReply>,
    /// What served the call, in words.
    pub served_by: String,
    /// The completion (checkpoint, interrupt) of a started call.
    pub completed: Option<super::Completed>,
}

/// Makes a model call for an external adapter through the same gate and
/// the same routing as the builtin loop: begin (limits, policy, context
/// size), the site's model server for the release's profile, the usage in
/// the receipt, complete with a checkpoint. A scripted profile answers
/// with the response after the conversation's assistant messages.
pub async fn adapter_model_call(
    runtime: &Runtime,
    scope: &TenantScope,
    attempt: &crate::domain::attempt::ExecutionAttempt,
    token: u64,
    ask: ModelAsk,
) -> Result<ModelTurn, RuntimeError> {
    let attempt_id = attempt.attempt_id;
    let info = runtime.shared.release_info(scope, &attempt.release_id)?;
    let own = release_model(runtime, scope, &info)?;
    let Serving {
        model: site_model,
        site,
        served_by,
    } = serving(runtime, scope, &info, &own)?;
    let begun = runtime
        .begin_call(
            scope,
            attempt_id,
            token,
            BeginCall {
                kind: CallKind::Model,
                target: info.manifest.model_profile.id.clone(),
                request: json!({"messages": ask.messages, "tools": ask.tools}),
                // At least the request's estimate (the grain's rule).
                context_tokens: ask.context_tokens,
                approval_id: None,
                state: ask.state.clone(),
                context_since: None,
                in_process: false,
                approval_asked: false,
            },
        )
        .await?;
    let (call_id, true) = (begun.call_id, begun.outcome == BeginOutcome::Started) else {
        let reply = begun
            .result
            .as_deref()
            .and_then(|r| serde_json::from_slice::<ModelReply>(r).ok());
        return Ok(ModelTurn {
            begun,
            reply,
            served_by,
            completed: None,
        });
    };
    let call_id = call_id.expect("a started call has an id");
    let fence = CallFence {
        attempt_id,
        fencing_token: begun.fencing_token,
        call_id,
        policy_decision_id: begun.policy_decision_id,
    };
    let turn = ask
        .messages
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .count() as u32;
    let reach = runtime
        .shared
        .releases
        .site()
        .reach(scope.tenant().as_str());
    let model = site_model.as_ref().unwrap_or(&own);
    let sink = crate::runtime::text::TextSink::new(
        runtime.shared.text.clone(),
        scope.tenant(),
        attempt_id,
        call_id,
    );
    let answer = ask_model(
        model,
        site_model.is_none().then_some(&reach),
        &ask.messages,
        &ask.tools,
        turn,
        &fence,
        &sink,
    )
    .await;
    let (ok, result, receipt, error) = match &answer {
        Ok(reply) => (
            true,
            Some(canonical_json(&serde_json::to_value(reply).expect("json"))),
            model_receipt(reply, &served_by),
            None,
        ),
        Err(e) => (
            false,
            None,
            json!({"schema": "model-invocation-v1", "error": e.to_string(), "servedBy": served_by}),
            Some(e.to_string()),
        ),
    };
    let completed = runtime
        .complete_call(
            scope,
            attempt_id,
            token,
            Completion {
                call_id,
                ok,
                result,
                receipt: Some(canonical_json(&receipt)),
                error,
                state: ask.state,
                usage: answer.as_ref().ok().map(ModelReply::usage),
                latency_ms: answer.as_ref().ok().map(|r| r.latency_ms),
            },
        )
        .await?;
    match answer {
        Ok(reply) => Ok(ModelTurn {
            begun,
            served_by: served(&reply, &served_by),
            reply: Some(reply),
            completed: Some(completed),
        }),
        Err(ModelError::Unavailable(e)) if site.is_some() => {
            if let Some(site) = &site {
                runtime.shared.servers.mark_down(site, &e);
            }
            Err(DomainError::Unavailable(format!(
                "the model server is down ({e}); the call {call_id} is recorded as failed, and the attempt waits, paused, until the server answers: make the call again then"
            ))
            .into())
        }
        Err(ModelError::Transient(e) | ModelError::Unavailable(e)) => {
            Err(DomainError::Unavailable(format!(
                "the model server did not answer ({e}); the call {call_id} is recorded as failed and may be made again"
            ))
            .into())
        }
        Err(ModelError::Fatal(e)) => Err(DomainError::FailedPrecondition(format!(
            "the model call {call_id} failed: {e}"
        ))
        .into()),
    }
}

/// One attempt's loop, from claim to outcome.
async fn drive(
    runtime: &Runtime,
    scope: &TenantScope,
    attempt_id: Uuid,
) -> Result<(), RuntimeError> {
    let Some(ticket) = runtime.claim_builtin(scope, attempt_id).await? else {
        return Ok(());
    };
    let a = &ticket.attempt;
    let info = runtime.shared.release_info(scope, &a.release_id)?;
    let loop_ = Loop::new(runtime, scope, &ticket, info)?;
    let attempt = runtime
        .start_attempt(
            scope,
            a.attempt_id,
            a.fencing_token,
            ADAPTER_VERSION.into(),
            CHECKPOINT_FORMAT,
            Some(loop_.context_ref.clone()),
        )
        .await?;
    let _ = attempt;
    let state = match &ticket.state {
        Some(bytes) if ticket.resumed => serde_json::from_slice(bytes).unwrap_or_default(),
        _ => LoopState::default(),
    };
    // The attempt's span: its model and tool calls are its children.
    let span = tracing::info_span!(
        "invoke_agent",
        otel.name = %format!("invoke_agent {}", a.agent_id),
        otel.kind = "internal",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = %a.agent_id,
        gen_ai.agent.version = %a.release_id,
        run.id = %a.run_id,
        attempt.id = %a.attempt_id,
        checkpoint.sequence = ticket.checkpoint_sequence,
    );
    let result = tracing::Instrument::instrument(loop_.run(state), span).await;
    loop_.mcp.close().await;
    result
}

struct Loop<'a> {
    runtime: &'a Runtime,
    scope: &'a TenantScope,
    attempt_id: Uuid,
    run_id: Uuid,
    token: u64,
    info: Arc<ReleaseInfo>,
    model: Model,
    instructions: String,
    skills: Vec<(String, String)>,
    input: Value,
    tools: Vec<Value>,
    budget: u32,
    context_ref: String,
    project_id: crate::domain::ProjectId,
    mcp: mcp::McpServers,
    /// Nanoseconds spent waiting for models and tools in the current step.
    outside: std::sync::atomic::AtomicU64,
}

impl<'a> Loop<'a> {
    fn new(
        runtime: &'a Runtime,
        scope: &'a TenantScope,
        ticket: &Ticket,
        info: Arc<ReleaseInfo>,
    ) -> Result<Loop<'a>, RuntimeError> {
        let releases = &runtime.shared.releases;
        let release = &info.release;
        let text = |role: &str| -> Result<String, RuntimeError> {
            Ok(String::from_utf8_lossy(&releases.artifact(scope, release, role)?).into_owned())
        };
        let manifest = &info.manifest;
        let model = release_model(runtime, scope, &info)?;
        let mut skills = Vec::new();
        for s in &manifest.skills {
            skills.push((s.id.clone(), text(&format!("skill:{}", s.id))?));
        }
        let tools: Vec<Value> = manifest
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.id, "description": t.description, "parameters": t.input_schema,
                }})
            })
            .collect();
        let instructions = text("instructions")?;
        let input: Value = serde_json::from_slice(&ticket.input).unwrap_or(Value::Null);
        let first = context::build(&instructions, &skills, &input, &[], u32::MAX);
        let context_ref = crate::domain::attempt::json_hash(&Value::Array(first.messages));
        let attempt = ticket.attempt.attempt_id.to_string();
        #[cfg(unix)]
        let mcp = mcp::McpServers::new(runtime.shared.confiner.clone(), attempt);
        #[cfg(not(unix))]
        let mcp = mcp::McpServers::new(attempt);
        Ok(Loop {
            runtime,
            scope,
            attempt_id: ticket.attempt.attempt_id,
            run_id: ticket.attempt.run_id,
            token: ticket.attempt.fencing_token,
            budget: ticket.attempt.limits.max_context_tokens,
            info,
            model,
            instructions,
            skills,
            input,
            tools,
            context_ref,
            project_id: ticket.attempt.project_id.clone(),
            mcp,
            outside: std::sync::atomic::AtomicU64::new(0),
        })
    }

    async fn run(&self, mut state: LoopState) -> Result<(), RuntimeError> {
        loop {
            // One step: the last turn's tool calls (also after a resume),
            // then the next model call. Its time minus the model's and the
            // tools' own is the loop's overhead.
            let step = Instant::now();
            self.outside.store(0, Ordering::Relaxed);
            while let Some(call) = state.pending.front().cloned() {
                self.tool(&mut state, &call).await?;
            }
            let reply = self.plan(&mut state).await?;
            let overhead = step
                .elapsed()
                .saturating_sub(Duration::from_nanos(self.outside.load(Ordering::Relaxed)));
            metrics::histogram!(STEP_OVERHEAD).record(overhead.as_secs_f64());
            if let Some(samples) = SAMPLES.lock().as_mut() {
                samples.push(overhead);
            }
            if !state.pending.is_empty() {
                continue;
            }
            // No tool calls: the answer. The runtime verifies it.
            let text = reply.content.unwrap_or_default();
            let output = serde_json::from_str(text.trim()).unwrap_or(Value::String(text));
            let reported = self
                .runtime
                .report(
                    self.scope,
                    self.attempt_id,
                    self.token,
                    Report {
                        succeeded: true,
                        output: Some(output),
                        failure_class: None,
                        reason: None,
                        error: None,
                    },
                )
                .await?;
            match reported.verdict {
                Outcome::Correct { feedback, left } => {
                    state.history.push(json!({"role": "user", "content": format!(
                        "Your answer does not satisfy the output contract: {feedback}. \
                         Answer again with only the corrected JSON ({left} more correction{} allowed).",
                        if left == 1 { "" } else { "s" }
                    )}));
                    self.checkpoint(&state).await?;
                }
                _ => return Ok(()),
            }
        }
    }

    /// The model call of one turn, with transient errors tried again; the
    /// answer and its tool calls join the state, which is checkpointed
    /// with the observation.
    async fn plan(&self, state: &mut LoopState) -> Result<ModelReply, RuntimeError> {
        let mut tries = 0;
        loop {
            tries += 1;
            let context_since = self.runtime.shared.clock.now();
            let ctx = context::build(
                &self.instructions,
                &self.skills,
                &self.input,
                &state.history,
                self.budget,
            );
            let request = json!({"messages": ctx.messages, "tools": self.tools});
            let Serving {
                model: site_model,
                site,
                served_by,
            } = self.model_now()?;
            let model = site_model.as_ref().unwrap_or(&self.model);
            let begun = self
                .begin(BeginCall {
                    kind: CallKind::Model,
                    target: self.info.manifest.model_profile.id.clone(),
                    request,
                    context_tokens: Some(ctx.tokens),
                    approval_id: None,
                    state: Some(state.bytes()),
                    context_since: Some(context_since),
                    in_process: true,
                    approval_asked: false,
                })
                .await?;
            let call_id = begun
                .call_id
                .ok_or_else(|| self.refused(begun.reason.clone()))?;
            if begun.outcome != BeginOutcome::Started {
                return Err(self.refused(begun.reason));
            }
            let model_name = self
                .info
                .manifest
                .model_profile
                .model
                .as_deref()
                .unwrap_or(&self.info.manifest.model_profile.id);
            let span = tracing::info_span!(
                "chat",
                otel.name = %format!("chat {model_name}"),
                otel.kind = "client",
                gen_ai.operation.name = "chat",
                gen_ai.provider.name = "openai",
                gen_ai.request.model = %model_name,
                gen_ai.response.model = tracing::field::Empty,
                gen_ai.usage.input_tokens = tracing::field::Empty,
                gen_ai.usage.output_tokens = tracing::field::Empty,
                run.id = %self.run_id,
                attempt.id = %self.attempt_id,
                checkpoint.sequence = self.checkpoint_sequence(),
                phase = "Calling",
            );
            let started = Instant::now();
            let sink = crate::runtime::text::TextSink::new(
                self.runtime.shared.text.clone(),
                self.scope.tenant(),
                self.attempt_id,
                call_id,
            );
            // The span covers the model call itself, not just its setup.
            let answer = tracing::Instrument::instrument(
                ask_model(
                    model,
                    site_model.is_none().then_some(&self.site()),
                    &ctx.messages,
                    &self.tools,
                    state.turns,
                    &self.fence(&begun, call_id),
                    &sink,
                ),
                span.clone(),
            )
            .await;
            self.outside
                .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            match answer {
                Ok(reply) => {
                    span.record("gen_ai.response.model", reply.model.as_str());
                    span.record("gen_ai.usage.input_tokens", reply.input_tokens);
                    span.record("gen_ai.usage.output_tokens", reply.output_tokens);
                    let receipt = model_receipt(&reply, &served_by);
                    let mut next = state.clone();
                    next.turns += 1;
                    let mut assistant = json!({"role": "assistant", "content": reply.content});
                    if !reply.tool_calls.is_empty() {
                        assistant["tool_calls"] = Value::Array(
                            reply
                                .tool_calls
                                .iter()
                                .map(|c| {
                                    json!({"id": c.id, "type": "function", "function": {
                                        "name": c.tool, "arguments": c.arguments.to_string(),
                                    }})
                                })
                                .collect(),
                        );
                    }
                    next.history.push(assistant);
                    next.pending.extend(reply.tool_calls.iter().cloned());
                    self.complete(
                        call_id,
                        true,
                        Some(serde_json::to_value(&reply).expect("json")),
                        receipt,
                        None,
                        &next,
                        Some(&reply),
                    )
                    .await?;
                    *state = next;
                    return Ok(reply);
                }
                Err(e) => {
                    let receipt = json!({"schema": "model-invocation-v1", "error": e.to_string(), "servedBy": served_by});
                    self.complete(
                        call_id,
                        false,
                        None,
                        receipt,
                        Some(e.to_string()),
                        state,
                        None,
                    )
                    .await?;
                    // A site's server that cannot serve now is down: the
                    // next call waits, paused, until it answers, and this
                    // try is not counted.
                    if let (ModelError::Unavailable(why), Some(site)) = (&e, &site) {
                        self.runtime.shared.servers.mark_down(site, why);
                        tries -= 1;
                        continue;
                    }
                    let transient =
                        matches!(e, ModelError::Transient(_) | ModelError::Unavailable(_));
                    if transient && tries < MODEL_TRIES {
                        tokio::time::sleep(Duration::from_millis(200 * u64::from(tries))).await;
                        continue;
                    }
                    let class = if transient {
                        FailureClass::Transient
                    } else {
                        FailureClass::Infrastructure
                    };
                    self.fail(
                        class,
                        format!(
                            "model call failed after {tries} tr{}: {e}",
                            if tries == 1 { "y" } else { "ies" }
                        ),
                    )
                    .await?;
                    return Err(self.refused(Some(e.to_string())));
                }
            }
        }
    }

    /// The model of the next call and what serves it ([`serving`]).
    fn model_now(&self) -> Result<Serving, RuntimeError> {
        serving(self.runtime, self.scope, &self.info, &self.model)
    }

    /// One tool call through the gate; its observation joins the state,
    /// which is checkpointed with it.
    async fn tool(&self, state: &mut LoopState, call: &ToolCall) -> Result<(), RuntimeError> {
        let delegates = self.info.tool(&call.tool).is_some_and(|(t, _)| {
            t.transport == ToolTransport::Builtin && t.name.as_deref() == Some("delegate")
        });
        if delegates {
            return self.delegate(state, call).await;
        }
        let asks = self
            .info
            .tool(&call.tool)
            .filter(|(t, _)| t.transport == ToolTransport::Builtin)
            .and_then(|(t, _)| match t.name.as_deref() {
                Some("ask") => Some(DecisionKind::Input),
                Some("escalate") => Some(DecisionKind::Escalation),
                _ => None,
            });
        if let Some(kind) = asks {
            return self.ask_human(state, call, kind).await;
        }
        let mut approval = None;
        // A reviewer may approve the call with changed arguments: from then
        // on the call is the approved one, and no other.
        let mut approved: Option<ToolCall> = None;
        loop {
            let call = approved.as_ref().unwrap_or(call);
            let begun = self
                .begin(BeginCall {
                    kind: CallKind::Tool,
                    target: call.tool.clone(),
                    request: call.arguments.clone(),
                    context_tokens: None,
                    approval_id: approval,
                    state: Some(state.bytes()),
                    context_since: None,
                    in_process: true,
                    approval_asked: false,
                })
                .await?;
            match begun.outcome {
                BeginOutcome::Refused => {
                    let why =
                        json!({"error": format!("refused: {}", begun.reason.unwrap_or_default())});
                    *state = observed(state, call, &why);
                    return self.checkpoint(state).await;
                }
                BeginOutcome::Replayed => {
                    *state = observed(state, call, &replayed_result(&begun));
                    return self.checkpoint(state).await;
                }
                BeginOutcome::ApprovalRequired => {
                    let decision_id = begun.decision_id.expect("an approval has a decision");
                    let decision = self.await_decision(decision_id).await?;
                    if decision.responded {
                        // The reviewer answered instead: no call, the
                        // model hears why and goes on.
                        let why = json!({"declined": format!(
                            "a reviewer declined this call and answered: {}",
                            decision.reason.as_deref().unwrap_or("")
                        )});
                        *state = observed(state, call, &why);
                        return self.checkpoint(state).await;
                    }
                    if decision.status != DecisionStatus::Approved {
                        // Rejected or expired: the attempt has failed.
                        return Err(
                            self.refused(Some(format!("approval {}", decision.status.as_str())))
                        );
                    }
                    if let Some(hash) = &decision.edited_request_hash {
                        let bytes = self.runtime.content(self.scope, hash)?.ok_or_else(|| {
                            DomainError::Broken(format!(
                                "the approved arguments {hash} are not in the artifact store"
                            ))
                        })?;
                        let arguments = serde_json::from_slice(&bytes).map_err(|e| {
                            DomainError::Broken(format!("the approved arguments {hash}: {e}"))
                        })?;
                        approved = Some(ToolCall {
                            arguments,
                            ..call.clone()
                        });
                    }
                    approval = begun.approval_id;
                }
                BeginOutcome::Started => {
                    let call_id = begun.call_id.expect("a started call has an id");
                    // The tool runs until it answers or the attempt ends
                    // (interrupted, timed out): then it is dropped, and an
                    // MCP server's child process with it.
                    let started = Instant::now();
                    let span = tracing::info_span!(
                        "execute_tool",
                        otel.name = %format!("execute_tool {}", call.tool),
                        otel.kind = "internal",
                        gen_ai.operation.name = "execute_tool",
                        gen_ai.tool.name = %call.tool,
                        gen_ai.tool.call.id = %call.id,
                        gen_ai.tool.type = "function",
                        run.id = %self.run_id,
                        attempt.id = %self.attempt_id,
                        checkpoint.sequence = self.checkpoint_sequence(),
                        phase = "Calling",
                    );
                    let fence = self.fence(&begun, call_id);
                    let outcome = tokio::select! {
                        out = tracing::Instrument::instrument(self.execute(call, &fence), span) => {
                            self.outside.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                            out
                        }
                        _ = self.ended() => {
                            return Err(self.refused(Some("the attempt ended during the tool call".into())));
                        }
                    };
                    let Some(open) = self.open_call(call_id) else {
                        // The grain's call-timeout reminder settled it
                        // first: a read failed (the loop goes on), a call
                        // with effects ended the attempt Uncertain.
                        if self
                            .runtime
                            .view(self.scope, self.attempt_id)
                            .is_ok_and(|v| v.attempt.state.is_terminal())
                        {
                            return Err(self.refused(Some("the tool call timed out".into())));
                        }
                        *state =
                            observed(state, call, &json!({"error": "the tool call timed out"}));
                        return self.checkpoint(state).await;
                    };
                    let (ok, result, receipt, error) = match outcome {
                        Ok(out) => (true, out.result, out.receipt, None),
                        // A call with effects that outlasted its timeout
                        // may have had them: it is never issued again.
                        Err(e) if e.timed_out && open.effect_unconfirmed() => {
                            self.runtime
                                .call_timed_out(
                                    self.scope,
                                    self.attempt_id,
                                    self.token,
                                    call_id,
                                    e.message.clone(),
                                )
                                .await?;
                            return Err(self.refused(Some(e.message)));
                        }
                        Err(e) => (
                            false,
                            json!({"error": e.message}),
                            json!({"tool": call.tool, "error": e.message, "confinement": e.confinement}),
                            Some(e.message),
                        ),
                    };
                    let next = observed(state, call, &result);
                    self.complete(call_id, ok, Some(result), receipt, error, &next, None)
                        .await?;
                    *state = next;
                    return Ok(());
                }
            }
        }
    }

    /// The release's `ask` and `escalate` tools: the model stops for a
    /// human. `ask` takes `{"question": ..., "answerSchema"?: {...}}`,
    /// `escalate` takes `{"question": ..., "options": [...],
    /// "recommendation"?: ...}`. The release's policy decides whether the
    /// model may (the tool's side-effect class; `deny` refuses it). The
    /// answer, or the option chosen, is the tool's observation; an expired
    /// question fails the attempt. A resumed loop finds the decision its
    /// call already asked instead of asking again.
    async fn ask_human(
        &self,
        state: &mut LoopState,
        call: &ToolCall,
        kind: DecisionKind,
    ) -> Result<(), RuntimeError> {
        let refuse = |why: String| json!({"error": format!("refused: {why}")});
        let Some((tool, schema)) = self.info.tool(&call.tool) else {
            unreachable!("asks only for a tool of the release");
        };
        let refusal = self
            .info
            .manifest
            .policy
            .denial(&call.tool, tool.side_effect_class)
            .or_else(|| super::release::argument_mismatch(schema, &call.tool, &call.arguments));
        if let Some(why) = refusal {
            *state = observed(state, call, &refuse(why));
            return self.checkpoint(state).await;
        }
        let asked = self
            .runtime
            .decisions(self.scope, self.attempt_id)?
            .into_iter()
            .find(|d| d.tool_call_id.as_deref() == Some(call.id.as_str()));
        let decision_id = match asked {
            Some(d) => d.decision_id,
            None => {
                let args = &call.arguments;
                let text = |key: &str| args.get(key).and_then(Value::as_str).map(str::to_string);
                let options: Vec<String> = args
                    .get("options")
                    .and_then(Value::as_array)
                    .map(|o| {
                        o.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                let question = Value::String(text("question").unwrap_or_default());
                let ask = DecisionAsk {
                    kind,
                    question: Some(canonical_json(&question)),
                    summary: match kind {
                        DecisionKind::Escalation => format!(
                            "tool {} escalates: choose one of {} options",
                            call.tool,
                            options.len()
                        ),
                        _ => format!("tool {} asks a human for input", call.tool),
                    },
                    options,
                    recommendation: text("recommendation"),
                    answer_schema: args.get("answerSchema").cloned(),
                    tool_call_id: Some(call.id.clone()),
                    assignee: text("assignee"),
                };
                match self
                    .runtime
                    .request_decision(self.scope, self.attempt_id, self.token, ask)
                    .await
                {
                    Ok(d) => d.decision_id,
                    // A question the appliance cannot put (no options, a
                    // broken schema): the model learns why.
                    Err(RuntimeError::Domain(DomainError::Invalid(e))) => {
                        *state = observed(state, call, &refuse(e.to_string()));
                        return self.checkpoint(state).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let status = self.await_decision(decision_id).await?.status;
        if status != DecisionStatus::Answered {
            // Expired (the attempt has failed) or cancelled.
            return Err(self.refused(Some(format!("question {}", status.as_str()))));
        }
        let d = self
            .runtime
            .decision(self.scope, self.attempt_id, decision_id)?;
        let answer = d
            .answer_ref
            .as_ref()
            .and_then(|r| {
                self.runtime
                    .store()
                    .read_artifact(self.scope, r)
                    .ok()
                    .flatten()
            })
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        let observation = json!({
            "answer": answer, "choice": d.choice, "answeredBy": d.answered_by,
        });
        *state = observed(state, call, &observation);
        self.checkpoint(state).await
    }

    /// The release's `delegate` tool: a child run of another release of
    /// the tenant (`{"release": ..., "input": ..., "purpose": ...}`), whose
    /// outcome comes back as the observation. Depth and the child release
    /// are checked by the runtime; the child runs under its own policy.
    async fn delegate(&self, state: &mut LoopState, call: &ToolCall) -> Result<(), RuntimeError> {
        let release = call
            .arguments
            .get("release")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut request = call.arguments.get("input").cloned().unwrap_or(json!({}));
        if let (Some(obj), Some(purpose)) = (request.as_object_mut(), call.arguments.get("purpose"))
        {
            obj.entry("purpose").or_insert(purpose.clone());
        }
        let begun = self
            .begin(BeginCall {
                kind: CallKind::SubAgent,
                target: release.to_string(),
                request,
                context_tokens: None,
                approval_id: None,
                state: Some(state.bytes()),
                context_since: None,
                in_process: true,
                approval_asked: false,
            })
            .await?;
        let observation = match (begun.outcome, begun.call_id) {
            (BeginOutcome::Started, Some(call_id)) => {
                let started = Instant::now();
                let record = loop {
                    let record = self
                        .runtime
                        .await_call(
                            self.scope,
                            self.attempt_id,
                            self.token,
                            call_id,
                            Duration::from_secs(300),
                        )
                        .await?;
                    if record.status != crate::domain::attempt::CallStatus::Issued {
                        break record;
                    }
                };
                self.outside
                    .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                let output = record
                    .result_hash
                    .as_ref()
                    .and_then(|r| {
                        self.runtime
                            .store()
                            .read_artifact(self.scope, r)
                            .ok()
                            .flatten()
                    })
                    .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
                json!({"childRun": begun.child_run_id, "status": record.status.as_str(), "output": output, "error": record.error})
            }
            (BeginOutcome::Replayed, _) => {
                json!({"status": "completed", "output": replayed_result(&begun), "replayedFromCall": begun.replayed_from})
            }
            _ => json!({"error": format!("refused: {}", begun.reason.unwrap_or_default())}),
        };
        *state = observed(state, call, &observation);
        self.checkpoint(state).await
    }

    /// `call_id` while it is still the attempt's open call.
    fn open_call(&self, call_id: Uuid) -> Option<crate::domain::attempt::OpenCall> {
        self.runtime
            .view(self.scope, self.attempt_id)
            .ok()
            .and_then(|v| v.attempt.open_call.clone())
            .filter(|c| c.call_id == call_id)
    }

    /// What a started call carries to the server that serves it.
    fn fence(&self, begun: &crate::runtime::Begun, call_id: Uuid) -> CallFence {
        CallFence {
            attempt_id: self.attempt_id,
            fencing_token: begun.fencing_token,
            call_id,
            policy_decision_id: begun.policy_decision_id,
        }
    }

    /// Runs a tool of the release: a sandboxed tool under a sandbox lease
    /// of its own, given back once its process tree is gone.
    async fn execute(
        &self,
        call: &ToolCall,
        fence: &CallFence,
    ) -> Result<tools::ToolOutput, tools::ToolError> {
        let Some((t, _)) = self.info.tool(&call.tool) else {
            return Err(format!("tool {} is not in the release", call.tool).into());
        };
        let name = t.name.clone().unwrap_or_else(|| t.id.clone());
        let sandbox = if t.needs_sandbox {
            Some(self.sandbox(t, &call.id).await?)
        } else {
            None
        };
        let run = self.run_tool(t, &name, call, fence, sandbox.as_ref().map(|(_, b)| *b));
        let out = match &sandbox {
            None => run.await,
            // The sandbox lease is renewed while the tool runs; should it
            // end all the same (expired, revoked), the tool's process tree
            // ends with it (dropping the call drops its server).
            Some((lease, _)) => tokio::select! {
                out = run => out,
                why = self.hold(*lease) => Err(format!(
                    "tool {} stopped: its sandbox lease {lease} ended ({why}); its process tree was killed",
                    call.tool
                )
                .into()),
            },
        };
        // The lease says what bound the process that ran under it.
        let bound = match &out {
            Ok(o) => o.receipt["confinement"]["mechanism"].as_str(),
            Err(e) => e.confinement.as_ref().and_then(|c| c["mechanism"].as_str()),
        };
        let lease = match &sandbox {
            Some((lease, _)) => Some(*lease),
            None => self
                .runtime
                .view(self.scope, self.attempt_id)
                .ok()
                .and_then(|v| v.attempt.capacity_lease_id),
        };
        if let (Some(mechanism), Some(lease)) = (bound, lease)
            && let Err(e) = self
                .runtime
                .shared
                .capacity
                .bind(self.scope, lease, mechanism)
                .await
        {
            tracing::debug!(lease = %lease, error = %e, "recording what binds a lease");
        }
        if let Some((lease, _)) = sandbox {
            let _ = self
                .runtime
                .shared
                .capacity
                .release(self.scope, lease)
                .await;
        }
        out
    }

    /// Renews a sandbox lease every heartbeat while a tool runs under it;
    /// returns why, once it cannot be renewed.
    async fn hold(&self, lease: Uuid) -> String {
        loop {
            let every = self.runtime.config().heartbeat_seconds.max(1);
            tokio::time::sleep(Duration::from_secs(every)).await;
            match self.runtime.shared.capacity.renew(self.scope, lease).await {
                Ok(view) if view.lease.state.holds_capacity() => {}
                Ok(view) => return format!("it is {:?}", view.lease.state),
                Err(e) => return e.to_string(),
            }
        }
    }

    /// A capacity lease of kind sandbox for one tool call, sized and
    /// placed as the tool declares, and what it grants.
    async fn sandbox(
        &self,
        t: &crate::domain::release::ToolDescriptor,
        call_id: &str,
    ) -> Result<(Uuid, mcp::Bounds), String> {
        use crate::capacity::{AcquireRequest, CapacityError};
        use crate::domain::capacity::{HolderKind, LeaseRequest};
        let request = LeaseRequest {
            tenant_id: self.scope.tenant().clone(),
            project_id: self.project_id.clone(),
            run_id: None,
            attempt_id: Some(self.attempt_id),
            run_slot: None,
            holder_kind: HolderKind::Sandbox,
            holder_id: format!("{}:{call_id}", self.attempt_id),
            cpu: t.cpu.unwrap_or(crate::domain::amount::Amount::units(1)),
            memory_gb: t
                .memory_gb
                .unwrap_or(crate::domain::amount::Amount::units(1)),
            internet_egress: t.needs_egress,
        };
        loop {
            let acquired = self
                .runtime
                .shared
                .capacity
                .acquire(AcquireRequest {
                    request: request.clone(),
                    pool_id: None,
                    wait: true,
                    wait_for: Duration::from_secs(30),
                })
                .await;
            match acquired {
                Ok(view) if view.lease.state.holds_capacity() => {
                    return Ok((view.lease.lease_id, mcp::Bounds::of(&view.lease)));
                }
                Ok(view) if view.lease.state.is_terminal() => {
                    return Err(format!("no sandbox: lease {} ended", view.lease.lease_id));
                }
                Ok(_) => continue,
                Err(CapacityError::Denied { limit, .. }) => {
                    return Err(format!("no sandbox capacity: {limit}"));
                }
                Err(e) => return Err(format!("no sandbox capacity: {e}")),
            }
        }
    }

    async fn run_tool(
        &self,
        t: &crate::domain::release::ToolDescriptor,
        name: &str,
        call: &ToolCall,
        fence: &CallFence,
        sandbox: Option<mcp::Bounds>,
    ) -> Result<tools::ToolOutput, tools::ToolError> {
        let name = name.to_string();
        let config = self.runtime.config();
        let timeout = Duration::from_secs(t.timeout_seconds.unwrap_or(config.tool_timeout_seconds));
        match t.transport {
            ToolTransport::Builtin => {
                Ok(tools::run(&name, &call.arguments, self.runtime.shared.clock.now()).await?)
            }
            ToolTransport::McpStdio => {
                let bounds = match sandbox {
                    Some(b) => b,
                    None => self.attempt_bounds(),
                };
                let site = self.site();
                let mut endpoints = Vec::new();
                for (host, port) in t.endpoints()? {
                    let target = Target {
                        host: host.to_ascii_lowercase(),
                        port,
                        url: None,
                    };
                    let addresses =
                        crate::runtime::reach::resolve_allowed(&site, "site endpoint", &target)
                            .await?;
                    endpoints.push((host, port, addresses));
                }
                let mut read_paths = Vec::new();
                for p in &t.read_paths {
                    if let Some(why) = crate::domain::reach::read_path_refusal(
                        p,
                        &site.protected,
                        &site.read_allow,
                    ) {
                        return Err(why.into());
                    }
                    read_paths.push(std::path::PathBuf::from(p));
                }
                self.release_files().await?;
                self.mcp
                    .call_stdio(
                        &t.command,
                        &name,
                        &call.arguments,
                        fence,
                        bounds,
                        &mcp::Reach {
                            endpoints: &endpoints,
                            read_paths: &read_paths,
                        },
                        sandbox.is_some(),
                        timeout,
                        &config,
                    )
                    .await
            }
            ToolTransport::McpHttp => match &t.url {
                Some(url) => {
                    // Checked at every call (the site may have stopped
                    // allowing it); a new connection goes to the addresses
                    // just checked.
                    let client = crate::runtime::reach::pinned_client(
                        &self.site(),
                        "MCP server",
                        url,
                        MODEL_CONNECT_TIMEOUT,
                    )
                    .await?;
                    self.mcp
                        .call_http(url, client, &name, &call.arguments, fence, timeout)
                        .await
                }
                None => Err(format!("tool {} declares no url", t.id).into()),
            },
        }
    }

    /// The site's rules for this attempt's release, as they stand now.
    fn site(&self) -> crate::domain::reach::SiteReach {
        self.runtime
            .shared
            .releases
            .site()
            .reach(self.scope.tenant().as_str())
    }

    /// Puts the release's own files (its `toolFiles`, as signed) in the
    /// attempt's working directory under `release/`, once.
    async fn release_files(&self) -> Result<(), tools::ToolError> {
        let manifest = &self.info.manifest;
        if manifest.tool_files.is_empty() {
            return Ok(());
        }
        let mut files = Vec::new();
        for f in &manifest.tool_files {
            let bytes = self
                .runtime
                .shared
                .releases
                .artifact(self.scope, &self.info.release, &format!("file:{}", f.path))
                .map_err(|e| format!("the release's file {} cannot be read: {e}", f.path))?;
            files.push((f.path.clone(), bytes));
        }
        self.mcp
            .put_release_files(files, &self.runtime.config())
            .map_err(|e| {
                format!("the release's files cannot be put in the working directory: {e}").into()
            })
    }

    /// What the attempt's own capacity lease grants its tools' processes
    /// (1 CPU and 1 GB without egress when it holds none).
    fn attempt_bounds(&self) -> mcp::Bounds {
        let lease = self
            .runtime
            .view(self.scope, self.attempt_id)
            .ok()
            .and_then(|v| v.attempt.capacity_lease_id)
            .and_then(|id| self.runtime.shared.capacity.lease(self.scope, id).ok());
        match lease {
            Some(l) => mcp::Bounds::of(&l),
            None => mcp::Bounds {
                cpu: crate::domain::amount::Amount::units(1),
                memory_gb: crate::domain::amount::Amount::units(1),
                egress: false,
            },
        }
    }

    /// Resolves once the attempt has ended.
    async fn ended(&self) {
        let Ok(mut rx) = self.runtime.watch(self.scope, self.attempt_id) else {
            return;
        };
        loop {
            if rx.borrow_and_update().attempt.state.is_terminal() {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    async fn await_decision(
        &self,
        decision_id: Uuid,
    ) -> Result<crate::domain::attempt::DecisionRequest, RuntimeError> {
        // A human's wait may outlast the attempt's capacity lease (it is
        // given back after runtime.return_capacity_after_seconds): no tool
        // process runs without one, so the servers stop now and the next
        // call starts them again.
        self.mcp.stop().await;
        loop {
            let (d, _) = self
                .runtime
                .await_decision(
                    self.scope,
                    self.attempt_id,
                    self.token,
                    decision_id,
                    Duration::from_secs(300),
                )
                .await?;
            if d.status != DecisionStatus::Pending {
                return Ok(d);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn complete(
        &self,
        call_id: Uuid,
        ok: bool,
        result: Option<Value>,
        receipt: Value,
        error: Option<String>,
        state: &LoopState,
        answer: Option<&ModelReply>,
    ) -> Result<(), RuntimeError> {
        self.runtime
            .complete_call(
                self.scope,
                self.attempt_id,
                self.token,
                Completion {
                    call_id,
                    ok,
                    result: result.map(|r| canonical_json(&r)),
                    receipt: Some(canonical_json(&receipt)),
                    error,
                    state: Some(state.bytes()),
                    usage: answer.map(ModelReply::usage),
                    latency_ms: answer.map(|r| r.latency_ms),
                },
            )
            .await?;
        Ok(())
    }

    /// The sequence of the attempt's latest checkpoint (for spans).
    fn checkpoint_sequence(&self) -> u32 {
        self.runtime
            .attempt(self.scope, self.attempt_id)
            .map_or(0, |a| a.usage.checkpoints)
    }

    async fn checkpoint(&self, state: &LoopState) -> Result<(), RuntimeError> {
        self.runtime
            .checkpoint(
                self.scope,
                self.attempt_id,
                self.token,
                state.bytes(),
                Some(AttemptPhase::Checkpointing),
            )
            .await?;
        Ok(())
    }

    async fn fail(&self, class: FailureClass, reason: String) -> Result<(), RuntimeError> {
        self.runtime
            .report(
                self.scope,
                self.attempt_id,
                self.token,
                Report {
                    succeeded: false,
                    output: None,
                    failure_class: Some(class),
                    reason: Some(reason),
                    error: None,
                },
            )
            .await?;
        Ok(())
    }

    /// BeginCall, waiting while the attempt may make no calls for now
    /// (paused, or waiting for capacity again after a human decision)
    /// until it may, or has ended.
    async fn begin(&self, call: BeginCall) -> Result<crate::runtime::Begun, RuntimeError> {
        let mut again = 0;
        loop {
            let result = self
                .runtime
                .begin_call(self.scope, self.attempt_id, self.token, call.clone())
                .await;
            let Err(e) = &result else {
                return result;
            };
            let Ok(mut rx) = self.runtime.watch(self.scope, self.attempt_id) else {
                return result;
            };
            let blocked = |v: &crate::runtime::AttemptView| {
                matches!(
                    v.attempt.gate(),
                    Err(Gate::Paused(_)) | Err(Gate::NoCapacity(_))
                )
            };
            if !blocked(&rx.borrow_and_update()) {
                // Refused because it waited, and it no longer does (its
                // turn at a model server came at once): begin again.
                if matches!(e, RuntimeError::Domain(DomainError::Waiting(_))) && again < 100 {
                    again += 1;
                    continue;
                }
                return result;
            }
            tracing::debug!(attempt = %self.attempt_id, reason = %e, "the builtin loop waits before its next call");
            // Paused or without capacity: its tools' processes stop too.
            self.mcp.stop().await;
            loop {
                if rx.changed().await.is_err() {
                    return result;
                }
                let v = rx.borrow_and_update();
                if v.attempt.state.is_terminal() || !blocked(&v) {
                    break;
                }
            }
        }
    }

    fn refused(&self, why: Option<String>) -> RuntimeError {
        DomainError::Aborted(format!(
            "the builtin loop of attempt {} stopped: {}",
            self.attempt_id,
            why.unwrap_or_default()
        ))
        .into()
    }
}

/// The state after a tool call's observation.
/// The result a replayed call observes: the source call's.
fn replayed_result(begun: &super::Begun) -> Value {
    begun
        .result
        .as_deref()
        .and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or(Value::Null)
}

fn observed(state: &LoopState, call: &ToolCall, result: &Value) -> LoopState {
    let mut next = state.clone();
    next.pending.pop_front();
    next.history.push(json!({
        "role": "tool", "tool_call_id": call.id, "name": call.tool,
        "content": result.to_string(),
    }));
    next
}
