//! The attempt core over HTTPS with a real external-adapter client: runs,
//! calls, approvals, interrupts, fencing, exactly one outcome, corrections,
//! limits, decision expiry on the clock, and kill -9 in the middle of runs.

use agentbay::control::{Transport, pinned_transport};
use agentbay::proto::agentbay::adapter::v1 as ad;
use agentbay::proto::agentbay::runs::v1 as rn;
use agentbay::proto::agentbay::runtime::v1 as rt;
use connectrpc::client::ClientConfig;
use connectrpc::{CodecFormat, ErrorCode};
use serde_json::{Value, json};

use crate::common::{Appliance, Credential, events, metric};
use crate::releases::{demo_key, pack, upload, variant};

const AGENT: &str = "triage";
const RELEASE: &str = "triage-ext-1.0.0";

/// An appliance with the demo tenant, an external-adapter release of the
/// triage example, and clients for run control, the runtime and the
/// adapter.
pub(crate) struct Site {
    pub(crate) a: Appliance,
    /// The workspace administrator (capacity, releases).
    workspace: Credential,
    cred: Credential,
    token: String,
    _dir: tempfile::TempDir,
}

impl Site {
    async fn start(manual_clock: bool) -> Site {
        let a = if manual_clock {
            Appliance::start_manual_clock()
        } else {
            Appliance::start()
        };
        Site::on(a).await
    }

    /// A site whose appliance runs with extra environment.
    async fn start_with(env: &[(&str, &str)]) -> Site {
        Site::on(Appliance::start_with(&[], env)).await
    }

    async fn on(a: Appliance) -> Site {
        let workspace = a.tenant("demo", "team", &[], &["support"]).await;
        let cred = a
            .create_client(
                "demo",
                &[
                    "factory.runs.read",
                    "factory.runs.write",
                    "factory.runs.decide",
                    "factory.runs.operate",
                    "factory.runs.execute",
                    "factory.assets.read",
                    "factory.assets.admin",
                    "agentbay.events.read",
                ],
            )
            .await;
        let token = a.token(&cred).await;
        let dir = tempfile::tempdir().unwrap();
        let bundle = variant(dir.path(), "ext", &demo_key(), |_, m| {
            m["releaseId"] = json!(RELEASE);
            m["adapter"] = json!({"kind": "external", "version": "1"});
        });
        let (status, body) = upload(&a, &token, pack(&bundle, |_| {})).await;
        assert_eq!(status, 201, "{body}");
        Site {
            a,
            workspace,
            cred,
            token,
            _dir: dir,
        }
    }

    /// Sets limits of the project's quota as the workspace administrator.
    async fn project_quota(&self, patch: Value) {
        let admin = self.a.token(&self.workspace).await;
        let (status, body) = self
            .a
            .put(
                &admin,
                "/factory/capacity/quotas/project.demo.support",
                patch,
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    /// Moves the manual clock and takes a fresh token (the old one may
    /// have expired on the way).
    async fn advance(&mut self, seconds: u64) {
        self.a.advance(seconds).await;
        self.token = self.a.token(&self.cred).await;
    }

    fn config(&self) -> ClientConfig {
        ClientConfig::new(self.a.url.parse().unwrap())
            .with_codec_format(CodecFormat::Json)
            .with_default_header("authorization", format!("Bearer {}", self.token))
    }

    fn runs(&self) -> rn::RunsClient<Transport> {
        rn::RunsClient::new(pinned_transport(&self.a.fingerprint), self.config())
    }

    fn runtime(&self) -> rt::RuntimeClient<Transport> {
        rt::RuntimeClient::new(pinned_transport(&self.a.fingerprint), self.config())
    }

    fn adapter(&self) -> ad::AdapterClient<Transport> {
        ad::AdapterClient::new(pinned_transport(&self.a.fingerprint), self.config())
    }

    async fn submit(&self, input: Value, limits: Option<rn::Limits>) -> rn::Run {
        let r = self
            .runs()
            .submit_run(rn::SubmitRunRequest {
                project_id: "support".into(),
                release_id: RELEASE.into(),
                input_json: input.to_string(),
                limits: limits.map(buffa::MessageField::some).unwrap_or_default(),
                ..Default::default()
            })
            .await
            .expect("submit run")
            .into_owned();
        r.run.as_option().unwrap().clone()
    }

    async fn run(&self, run_id: &str) -> rn::Run {
        let r = self
            .runs()
            .get_run(rn::GetRunRequest {
                run_id: run_id.into(),
                ..Default::default()
            })
            .await
            .expect("get run")
            .into_owned();
        r.run.as_option().unwrap().clone()
    }

    /// Claims the next attempt of the triage agent and starts it.
    async fn claim_and_start(&self) -> Adapter {
        self.claim_and_start_agent(AGENT).await
    }

    /// Claims the next attempt of `agent` and starts it: an adapter's
    /// first steps.
    async fn claim_and_start_agent(&self, agent: &str) -> Adapter {
        let ticket = self
            .adapter()
            .claim_attempt(ad::ClaimAttemptRequest {
                agent_id: agent.into(),
                session: "test-adapter".into(),
                wait_seconds: 20,
                ..Default::default()
            })
            .await
            .expect("claim")
            .into_owned();
        let t = ticket
            .attempt
            .as_option()
            .expect("an attempt to claim")
            .clone();
        let status = self
            .adapter()
            .start_attempt(ad::StartAttemptRequest {
                attempt_id: t.attempt_id.clone(),
                fencing_token: t.fencing_token,
                adapter_version: t.adapter_version.clone(),
                checkpoint_format: t.checkpoint_format,
                ..Default::default()
            })
            .await
            .expect("start")
            .into_owned();
        assert_eq!(status.state, "Running");
        Adapter {
            client: self.adapter(),
            ticket: t,
        }
    }

    /// A reviewer approves or rejects.
    async fn decide(&self, approval_id: &str, approve: bool) {
        self.runs()
            .decide_approval(rn::DecideApprovalRequest {
                approval_id: approval_id.into(),
                approve,
                ..Default::default()
            })
            .await
            .expect("decide the approval");
    }

    async fn timeline(&self, attempt_id: &str) -> Value {
        self.a
            .get(&self.token, &format!("/runtime/attempts/{attempt_id}"))
            .await
    }
}

/// One external adapter's hold on one attempt.
struct Adapter {
    client: ad::AdapterClient<Transport>,
    ticket: ad::AttemptTicket,
}

impl Adapter {
    fn id(&self) -> String {
        self.ticket.attempt_id.clone()
    }

    /// A model call the adapter makes itself, reporting the usage its
    /// server counted.
    async fn own_model_call(&self, input: u64, output: u64) {
        let m = self
            .begin(
                "model",
                &self.ticket.model_profile_id,
                json!({"prompt": "p"}),
                "",
            )
            .await
            .expect("model call");
        assert_eq!(m.outcome, ad::BeginOutcome::STARTED, "{}", m.reason);
        self.client
            .complete_call(ad::CompleteCallRequest {
                attempt_id: self.id(),
                fencing_token: self.ticket.fencing_token,
                call_id: m.call_id.clone(),
                ok: true,
                result_json: json!({"text": "t"}).to_string(),
                usage: buffa::MessageField::some(ad::ModelUsage {
                    input_tokens: input,
                    output_tokens: output,
                    ..Default::default()
                }),
                latency_ms: 250,
                ..Default::default()
            })
            .await
            .expect("model result");
    }

    /// A model call of the release's scripted profile declaring
    /// `context_tokens` of context (0: none declared).
    async fn begin_model(
        &self,
        context_tokens: u32,
        request: Value,
    ) -> Result<ad::BeginCallResponse, connectrpc::ConnectError> {
        self.client
            .begin_call(ad::BeginCallRequest {
                attempt_id: self.id(),
                fencing_token: self.ticket.fencing_token,
                kind: "model".into(),
                target: "triage-scripted".into(),
                request_json: request.to_string(),
                context_tokens,
                ..Default::default()
            })
            .await
            .map(|r| r.into_owned())
    }

    async fn begin(
        &self,
        kind: &str,
        target: &str,
        request: Value,
        approval: &str,
    ) -> Result<ad::BeginCallResponse, connectrpc::ConnectError> {
        self.client
            .begin_call(ad::BeginCallRequest {
                attempt_id: self.id(),
                fencing_token: self.ticket.fencing_token,
                kind: kind.into(),
                target: target.into(),
                request_json: request.to_string(),
                context_tokens: 1200,
                approval_id: approval.into(),
                state_json: json!({"step": kind, "target": target}).to_string(),
                ..Default::default()
            })
            .await
            .map(|r| r.into_owned())
    }

    async fn complete(
        &self,
        call_id: &str,
        result: Value,
    ) -> Result<ad::CompleteCallResponse, connectrpc::ConnectError> {
        self.client
            .complete_call(ad::CompleteCallRequest {
                attempt_id: self.id(),
                fencing_token: self.ticket.fencing_token,
                call_id: call_id.into(),
                ok: true,
                result_json: result.to_string(),
                receipt_json: json!({"receipt": call_id, "server": "test"}).to_string(),
                state_json: json!({"observed": call_id}).to_string(),
                ..Default::default()
            })
            .await
            .map(|r| r.into_owned())
    }

    /// A model call and a read tool call, each completed.
    async fn think_and_look(&self) {
        let m = self
            .begin("model", "triage-scripted", json!({"prompt": "triage"}), "")
            .await
            .expect("model call");
        assert_eq!(m.outcome, ad::BeginOutcome::STARTED);
        self.complete(&m.call_id, json!({"text": "look up the customer"}))
            .await
            .expect("model result");
        let t = self
            .begin("tool", "lookup-ticket", json!({"customer": "acme"}), "")
            .await
            .expect("tool call");
        assert_eq!(t.outcome, ad::BeginOutcome::STARTED, "{}", t.reason);
        let done = self
            .complete(&t.call_id, json!({"tickets": 3}))
            .await
            .expect("tool result");
        assert_eq!(done.state, "Running");
        assert!(
            done.checkpoint_sequence >= 2,
            "a checkpoint follows every observed result"
        );
    }

    async fn report(
        &self,
        output: Value,
    ) -> Result<ad::ReportOutcomeResponse, connectrpc::ConnectError> {
        self.client
            .report_outcome(ad::ReportOutcomeRequest {
                attempt_id: self.id(),
                fencing_token: self.ticket.fencing_token,
                succeeded: true,
                output_json: output.to_string(),
                ..Default::default()
            })
            .await
            .map(|r| r.into_owned())
    }
}

fn good_output() -> Value {
    json!({"severity": "high", "summary": "Checkout is down for acme", "paged": false})
}

fn code(e: &connectrpc::ConnectError) -> ErrorCode {
    e.code
}

#[tokio::test]
async fn an_external_adapter_runs_an_attempt_to_one_verified_outcome() {
    let site = Site::start(false).await;
    let run = site.submit(json!({"ticket": "checkout fails"}), None).await;
    assert_eq!(run.state, "Running");
    let attempt = &run.steps[0].attempts[0];
    assert_eq!(attempt.fencing_token, 1);

    let adapter = site.claim_and_start().await;
    assert_eq!(adapter.ticket.run_id, run.run_id);
    assert_eq!(
        serde_json::from_str::<Value>(&adapter.ticket.input_json).unwrap(),
        json!({"ticket": "checkout fails"})
    );
    adapter.think_and_look().await;

    // A tool outside the release's closure is refused and recorded.
    let refused = adapter.begin("tool", "rm-rf", json!({}), "").await.unwrap();
    assert_eq!(refused.outcome, ad::BeginOutcome::REFUSED);
    assert!(
        refused.reason.contains("outside the release's closure"),
        "{}",
        refused.reason
    );
    // Arguments that do not match the tool's input schema, too.
    let bad = adapter
        .begin("tool", "lookup-ticket", json!({"who": 1}), "")
        .await
        .unwrap();
    assert_eq!(bad.outcome, ad::BeginOutcome::REFUSED);
    assert!(bad.reason.contains("customer"), "{}", bad.reason);

    let done = adapter.report(good_output()).await.unwrap();
    assert_eq!(done.verdict, ad::Verdict::VERIFIED);
    assert_eq!(done.state, "Succeeded");
    assert!(done.outcome_hash.starts_with("sha256:"));

    // The same report again is acknowledged; a different one is rejected.
    let again = adapter.report(good_output()).await.unwrap();
    assert!(again.acknowledged);
    assert_eq!(again.outcome_hash, done.outcome_hash);
    let other = adapter
        .report(json!({"severity": "low", "summary": "x", "paged": false}))
        .await
        .unwrap_err();
    assert_eq!(code(&other), ErrorCode::FailedPrecondition, "{other:?}");
    assert!(
        other
            .message
            .as_deref()
            .unwrap_or("")
            .contains("already reported")
    );

    // A stale token is refused with `aborted` and recorded.
    let stale = adapter
        .client
        .heartbeat(ad::HeartbeatRequest {
            attempt_id: adapter.id(),
            fencing_token: 0,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(code(&stale), ErrorCode::Aborted);

    let run = site.run(&run.run_id).await;
    assert_eq!(run.state, "Succeeded");
    assert_eq!(
        serde_json::from_str::<Value>(&run.output_json).unwrap(),
        good_output()
    );

    let timeline = site.timeline(&adapter.id()).await;
    assert_eq!(timeline["state"], "Succeeded");
    let calls = timeline["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert_eq!(calls[0]["kind"], "model");
    assert_eq!(calls[1]["status"], "completed");
    assert!(
        calls[1]["requestHash"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    assert!(
        calls[1]["receiptRef"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    assert_eq!(calls[2]["status"], "failed");
    assert!(
        timeline["staleRefusals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["presented"] == 0)
    );
    let checkpoints = site
        .a
        .get(
            &site.token,
            &format!("/runtime/attempts/{}/checkpoints", adapter.id()),
        )
        .await;
    let cps = checkpoints["checkpoints"].as_array().unwrap();
    assert!(cps.len() >= 3, "start + after each observation: {cps:?}");
    assert!(cps.iter().all(|c| c["adapterVersion"] == "external/1"));

    // The spec's metrics.
    let admin = site.a.admin_token().await;
    let metrics = site
        .a
        .http()
        .get(format!("{}/metrics", site.a.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "connectsoft_factory_runtime_attempt_duration",
        "connectsoft_factory_runtime_calls",
        "connectsoft_factory_runtime_checkpoints_written",
        "connectsoft_factory_runtime_attempts_active",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
    assert!(
        metrics.contains(
            r#"connectsoft_factory_runtime_calls{tenant="demo",kind="tool",status="failed"} 2"#
        ),
        "{metrics}"
    );

    // The spec's events, with their payloads.
    let outcome = events(
        &site.a,
        &site.token,
        "execution.attempts.v1.attempt-outcome-reported",
        1,
    )
    .await;
    assert_eq!(outcome[0]["state"], "Succeeded");
    assert_eq!(outcome[0]["toolCalls"].as_f64(), Some(1.0));
    let started = events(
        &site.a,
        &site.token,
        "execution.attempts.v1.attempt-started",
        1,
    )
    .await;
    assert_eq!(started[0]["fencingToken"].as_f64(), Some(1.0));
}

#[tokio::test]
async fn a_gated_call_waits_for_approval_then_runs_and_a_rejection_fails_the_attempt() {
    let site = Site::start(false).await;
    let run = site.submit(json!({"ticket": "outage"}), None).await;
    let adapter = site.claim_and_start().await;
    let page = json!({"message": "checkout down"});
    let ask = adapter
        .begin("tool", "page-oncall", page.clone(), "")
        .await
        .unwrap();
    assert_eq!(ask.outcome, ad::BeginOutcome::APPROVAL_REQUIRED);
    let timeline = site.timeline(&adapter.id()).await;
    assert_eq!(timeline["state"], "WaitingForDecision");
    assert!(
        timeline["waitingReason"]
            .as_str()
            .unwrap()
            .contains(&ask.decision_id)
    );

    // Nothing can be issued while it waits.
    let busy = adapter
        .begin("model", "triage-scripted", json!({}), "")
        .await
        .unwrap_err();
    assert_eq!(code(&busy), ErrorCode::FailedPrecondition);

    let decided = site
        .runs()
        .decide_approval(rn::DecideApprovalRequest {
            approval_id: ask.approval_id.clone(),
            approve: true,
            reason: "on-call knows".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert_eq!(decided.attempt.as_option().unwrap().state, "Running");
    let status = adapter
        .client
        .await_decision(ad::AwaitDecisionRequest {
            attempt_id: adapter.id(),
            fencing_token: adapter.ticket.fencing_token,
            decision_id: ask.decision_id.clone(),
            wait_seconds: 5,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert_eq!(status.status, "approved");

    // The approval allows exactly the proposed call.
    let other = adapter
        .begin(
            "tool",
            "page-oncall",
            json!({"message": "something else"}),
            &ask.approval_id,
        )
        .await
        .unwrap_err();
    assert_eq!(code(&other), ErrorCode::FailedPrecondition);
    let go = adapter
        .begin("tool", "page-oncall", page.clone(), &ask.approval_id)
        .await
        .unwrap();
    assert_eq!(go.outcome, ad::BeginOutcome::STARTED);
    assert!(
        !go.checkpoint_id.is_empty(),
        "a checkpoint precedes a gated call"
    );
    adapter
        .complete(&go.call_id, json!({"paged": true}))
        .await
        .unwrap();
    let again = adapter
        .begin("tool", "page-oncall", page.clone(), &ask.approval_id)
        .await
        .unwrap_err();
    assert!(again.message.unwrap_or_default().contains("used already"));
    let done = adapter
        .report(json!({"severity": "high", "summary": "paged", "paged": true}))
        .await
        .unwrap();
    assert_eq!(done.verdict, ad::Verdict::VERIFIED);
    assert_eq!(site.run(&run.run_id).await.state, "Succeeded");
    let decided = events(
        &site.a,
        &site.token,
        "execution.approvals.v1.approval-decided",
        1,
    )
    .await;
    assert_eq!(decided[0]["decision"], "approved");

    // Another run: rejected -> Failed(policy), and no new attempt.
    let run = site.submit(json!({"ticket": "maybe"}), None).await;
    let adapter = site.claim_and_start().await;
    let ask = adapter
        .begin("tool", "page-oncall", page, "")
        .await
        .unwrap();
    site.runs()
        .decide_approval(rn::DecideApprovalRequest {
            approval_id: ask.approval_id.clone(),
            approve: false,
            reason: "not at night".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let run = site.run(&run.run_id).await;
    assert_eq!(run.state, "Failed");
    assert_eq!(run.steps[0].attempts.len(), 1);
    let a = &run.steps[0].attempts[0];
    assert_eq!(a.failure_class, "policy");
    assert!(
        a.failure_reason.contains("not at night"),
        "{}",
        a.failure_reason
    );
}

/// A site with an attempt of tenant `demo` interrupted during an approved
/// tool call: the call is uncertain. Returns the attempt and call ids.
pub(crate) async fn uncertain_call() -> (Site, String, String) {
    let site = Site::start(false).await;
    site.submit(json!({"ticket": "t"}), None).await;
    let adapter = site.claim_and_start().await;
    let page = json!({"message": "m"});
    let ask = adapter
        .begin("tool", "page-oncall", page.clone(), "")
        .await
        .unwrap();
    site.decide(&ask.approval_id, true).await;
    let go = adapter
        .begin("tool", "page-oncall", page, &ask.approval_id)
        .await
        .unwrap();
    let stopped = site
        .runtime()
        .interrupt(rt::InterruptRequest {
            attempt_id: adapter.id(),
            reason: "wrong customer".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert_eq!(stopped.state, "Uncertain");
    let attempt = adapter.id();
    (site, attempt, go.call_id.to_string())
}

#[tokio::test]
async fn an_interrupt_during_a_tool_call_leaves_it_uncertain_until_an_operator_settles_it() {
    let site = Site::start(false).await;
    let run = site.submit(json!({"ticket": "t"}), None).await;
    let adapter = site.claim_and_start().await;
    let page = json!({"message": "m"});
    let ask = adapter
        .begin("tool", "page-oncall", page.clone(), "")
        .await
        .unwrap();
    site.decide(&ask.approval_id, true).await;
    let go = adapter
        .begin("tool", "page-oncall", page, &ask.approval_id)
        .await
        .unwrap();
    assert_eq!(
        site.timeline(&adapter.id()).await["state"],
        "WaitingForTool"
    );

    let stopped = site
        .runtime()
        .interrupt(rt::InterruptRequest {
            attempt_id: adapter.id(),
            reason: "wrong customer".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert_eq!(stopped.state, "Uncertain");
    assert!(stopped.observed);

    // The adapter's late result is kept as evidence and refused.
    let late = adapter
        .complete(&go.call_id, json!({"paged": true}))
        .await
        .unwrap_err();
    assert_eq!(code(&late), ErrorCode::Aborted);
    // No call starts after the interruption.
    let after = adapter
        .begin("model", "triage-scripted", json!({}), "")
        .await
        .unwrap_err();
    assert_eq!(code(&after), ErrorCode::Aborted);

    let timeline = site.timeline(&adapter.id()).await;
    let call = timeline["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["callId"] == go.call_id.as_str())
        .unwrap()
        .clone();
    assert_eq!(call["status"], "uncertain");
    assert!(
        call["lateReceiptRef"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    let held = site.run(&run.run_id).await;
    assert_eq!(held.state, "Uncertain");
    // The call waiting for its settlement is a series an alert reads.
    let m = site.a.metrics().await;
    let uncertain = "agentbay_uncertain_calls{tenant=\"demo\"}";
    assert_eq!(metric(&m, uncertain), Some(1.0), "{m}");
    assert!(
        metric(
            &m,
            "agentbay_uncertain_call_oldest_seconds{tenant=\"demo\"}"
        )
        .is_some()
    );
    assert_eq!(
        held.steps[0].attempts.len(),
        1,
        "an uncertain call is never retried automatically"
    );

    // An operator settles it: the effect did not happen, try again.
    let refused = site
        .runs()
        .settle_call(rn::SettleCallRequest {
            attempt_id: adapter.id(),
            call_id: go.call_id.clone(),
            effect: "happened".into(),
            reason: "pager log shows the page".into(),
            retry: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(code(&refused), ErrorCode::InvalidArgument);
    let settled = site
        .runs()
        .settle_call(rn::SettleCallRequest {
            attempt_id: adapter.id(),
            call_id: go.call_id.clone(),
            effect: "did-not-happen".into(),
            reason: "pager log is empty".into(),
            retry: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    let run = settled.run.as_option().unwrap();
    assert_eq!(run.state, "Running");
    let m = site.a.metrics().await;
    assert_eq!(metric(&m, uncertain), Some(0.0), "settled: {m}");
    assert_eq!(run.steps[0].attempts.len(), 2);
    assert_eq!(run.steps[0].attempts[1].fencing_token, 2);
    let settled_call = events(
        &site.a,
        &site.token,
        "execution.attempts.v1.call-settled",
        1,
    )
    .await;
    assert_eq!(settled_call[0]["effect"], "did-not-happen");
}

#[tokio::test]
async fn corrections_run_out_into_a_validation_failure_with_the_feedback() {
    let site = Site::start(false).await;
    let run = site.submit(json!({"ticket": "t"}), None).await;
    let adapter = site.claim_and_start().await;
    let bad = json!({"severity": "urgent", "summary": "x", "paged": false});
    for left in [1, 0] {
        let r = adapter.report(bad.clone()).await.unwrap();
        assert_eq!(r.verdict, ad::Verdict::CORRECT);
        assert_eq!(r.corrections_left, left);
        assert!(r.feedback.contains("/severity"), "{}", r.feedback);
    }
    let r = adapter.report(bad).await.unwrap();
    assert_eq!(r.verdict, ad::Verdict::EXHAUSTED);
    assert_eq!(r.state, "Failed");
    let timeline = site.timeline(&adapter.id()).await;
    assert_eq!(timeline["correctionCount"], 2);
    assert_eq!(timeline["failure"]["class"], "validation");
    assert!(
        timeline["failure"]["feedbackRef"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    // Validation is not worth another attempt.
    let run = site.run(&run.run_id).await;
    assert_eq!(run.state, "Failed");
    assert_eq!(run.steps[0].attempts.len(), 1);
}

#[tokio::test]
async fn each_limit_fails_the_attempt_naming_it() {
    let mut site = Site::start(true).await;
    let limits = |f: &dyn Fn(&mut rn::Limits)| {
        let mut l = rn::Limits::default();
        f(&mut l);
        Some(l)
    };
    // maxModelCalls
    let run = site
        .submit(json!({}), limits(&|l| l.max_model_calls = 1))
        .await;
    let adapter = site.claim_and_start().await;
    let m = adapter
        .begin("model", "triage-scripted", json!({}), "")
        .await
        .unwrap();
    adapter.complete(&m.call_id, json!({})).await.unwrap();
    let e = adapter
        .begin("model", "triage-scripted", json!({}), "")
        .await
        .unwrap_err();
    assert_eq!(code(&e), ErrorCode::ResourceExhausted);
    assert!(e.message.unwrap_or_default().contains("maxModelCalls 1"));
    let run = site.run(&run.run_id).await;
    assert_eq!(run.steps[0].attempts[0].failure_class, "budget");

    // maxToolCalls
    site.submit(json!({}), limits(&|l| l.max_tool_calls = 1))
        .await;
    let adapter = site.claim_and_start().await;
    let t = adapter
        .begin("tool", "lookup-ticket", json!({"customer": "a"}), "")
        .await
        .unwrap();
    adapter.complete(&t.call_id, json!({})).await.unwrap();
    let e = adapter
        .begin("tool", "lookup-ticket", json!({"customer": "a"}), "")
        .await
        .unwrap_err();
    assert!(e.message.unwrap_or_default().contains("maxToolCalls 1"));

    // maxContextTokens (the adapter declares 1200 tokens per model call)
    site.submit(json!({}), limits(&|l| l.max_context_tokens = 1000))
        .await;
    let adapter = site.claim_and_start().await;
    let e = adapter
        .begin("model", "triage-scripted", json!({}), "")
        .await
        .unwrap_err();
    assert!(
        e.message
            .unwrap_or_default()
            .contains("maxContextTokens 1000")
    );

    // What an adapter declares never replaces what is measured: a request
    // of about 2,000 tokens declared as 1 is still over 1,000.
    site.submit(json!({}), limits(&|l| l.max_context_tokens = 1000))
        .await;
    let adapter = site.claim_and_start().await;
    let e = adapter
        .begin_model(1, json!({"prompt": "p".repeat(8_000)}))
        .await
        .unwrap_err();
    assert!(
        e.message
            .unwrap_or_default()
            .contains("maxContextTokens 1000")
    );
    // A usage past what one call can use is refused by field and limit.
    site.submit(json!({}), limits(&|_| {})).await;
    let adapter = site.claim_and_start().await;
    let m = adapter
        .begin_model(0, json!({"prompt": "p"}))
        .await
        .unwrap();
    assert_eq!(m.outcome, ad::BeginOutcome::STARTED, "{}", m.reason);
    let e = adapter
        .client
        .complete_call(ad::CompleteCallRequest {
            attempt_id: adapter.id(),
            fencing_token: adapter.ticket.fencing_token,
            call_id: m.call_id.clone(),
            ok: true,
            result_json: json!({"text": "t"}).to_string(),
            usage: buffa::MessageField::some(ad::ModelUsage {
                input_tokens: u64::MAX,
                output_tokens: 5,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(code(&e), ErrorCode::InvalidArgument);
    let message = e.message.unwrap_or_default();
    assert!(
        message.contains("usage.inputTokens") && message.contains("16000000"),
        "{message}"
    );

    // Limits may only tighten the release's contract.
    let e = site
        .runs()
        .submit_run(rn::SubmitRunRequest {
            project_id: "support".into(),
            release_id: RELEASE.into(),
            input_json: "{}".into(),
            limits: buffa::MessageField::some(rn::Limits {
                max_minutes: 999,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(code(&e), ErrorCode::InvalidArgument);
    assert!(e.message.unwrap_or_default().contains("limits.maxMinutes"));

    // maxMinutes counts active time, on the clock.
    let run = site.submit(json!({}), limits(&|l| l.max_minutes = 2)).await;
    let adapter = site.claim_and_start().await;
    // The adapter keeps its lease with heartbeats while time passes.
    for _ in 0..3 {
        site.advance(41).await;
        let beat = site
            .adapter()
            .heartbeat(ad::HeartbeatRequest {
                attempt_id: adapter.id(),
                fencing_token: adapter.ticket.fencing_token,
                ..Default::default()
            })
            .await;
        if beat.is_err() {
            break;
        }
    }
    let mut state = String::new();
    for _ in 0..50 {
        state = site.run(&run.run_id).await.steps[0].attempts[0]
            .state
            .clone();
        if state == "TimedOut" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(state, "TimedOut");
    let e = adapter
        .begin("model", "triage-scripted", json!({}), "")
        .await
        .unwrap_err();
    assert_eq!(code(&e), ErrorCode::Aborted);
}

/// A site with an attempt of tenant `demo` waiting for a decision of
/// `kind` ("escalation" with options p1 and p2, p1 recommended, or "input"
/// with none). Returns the attempt id.
pub(crate) async fn waiting_for(kind: &str) -> (Site, String) {
    let site = Site::start(false).await;
    site.submit(json!({}), None).await;
    let adapter = site.claim_and_start().await;
    let escalation = kind == "escalation";
    adapter
        .client
        .request_decision(ad::RequestDecisionRequest {
            attempt_id: adapter.id(),
            fencing_token: adapter.ticket.fencing_token,
            kind: kind.into(),
            question_json: json!({"q": "which priority?"}).to_string(),
            summary: "Which priority?".into(),
            options: if escalation {
                vec!["p1".into(), "p2".into()]
            } else {
                vec![]
            },
            recommendation: if escalation {
                "p1".into()
            } else {
                String::new()
            },
            ..Default::default()
        })
        .await
        .unwrap();
    let id = adapter.id();
    (site, id)
}

#[tokio::test]
async fn an_unanswered_decision_expires_on_the_clock_and_an_answer_resumes() {
    let mut site = Site::start(true).await;
    let run = site.submit(json!({}), None).await;
    let adapter = site.claim_and_start().await;
    let ask = |kind: &str| ad::RequestDecisionRequest {
        attempt_id: adapter.id(),
        fencing_token: adapter.ticket.fencing_token,
        kind: kind.into(),
        question_json: json!({"q": "which priority?"}).to_string(),
        summary: "Which priority?".into(),
        options: vec!["p1".into(), "p2".into()],
        recommendation: "p1".into(),
        ..Default::default()
    };
    let d = adapter
        .client
        .request_decision(ask("escalation"))
        .await
        .unwrap()
        .into_owned();
    let wrong = site
        .runtime()
        .answer_decision(rt::AnswerDecisionRequest {
            attempt_id: adapter.id(),
            decision_id: d.decision_id.clone(),
            choice: "p9".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(code(&wrong), ErrorCode::InvalidArgument);
    let answered = site
        .runtime()
        .answer_decision(rt::AnswerDecisionRequest {
            attempt_id: adapter.id(),
            decision_id: d.decision_id.clone(),
            choice: "p2".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert_eq!(answered.state, "Running");

    let mut input = ask("input");
    input.options.clear();
    input.recommendation.clear();
    adapter.client.request_decision(input).await.unwrap();
    // The time left to the soonest expiry is a series per tenant, read off
    // the clock: a day for an input question, ten minutes later on.
    let expiry = "agentbay_decision_next_expiry_seconds{tenant=\"demo\"}";
    let m = site.a.metrics().await;
    assert_eq!(metric(&m, expiry), Some(86_400.0), "{m}");
    site.advance(1430 * 60).await;
    let m = site.a.metrics().await;
    assert_eq!(metric(&m, expiry), Some(600.0), "{m}");
    site.advance(11 * 60).await;
    let mut a = rn::Attempt::default();
    for _ in 0..50 {
        a = site.run(&run.run_id).await.steps[0].attempts[0].clone();
        if a.state == "Failed" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(a.state, "Failed");
    assert!(
        a.failure_reason.contains("InputTimeoutMinutes"),
        "{}",
        a.failure_reason
    );
    let m = site.a.metrics().await;
    assert_eq!(metric(&m, expiry), None, "nothing waits any more: {m}");
}

#[tokio::test]
async fn kill_9_in_the_middle_of_runs_loses_nothing_and_reissues_nothing() {
    let mut site = Site::start(true).await;
    // A: a read tool call in flight.
    let run_a = site.submit(json!({"n": "a"}), None).await;
    let a = site.claim_and_start().await;
    let call_a = a
        .begin("tool", "lookup-ticket", json!({"customer": "a"}), "")
        .await
        .unwrap();
    // B: running after a checkpoint.
    let run_b = site.submit(json!({"n": "b"}), None).await;
    let b = site.claim_and_start().await;
    b.think_and_look().await;
    // C: waiting for an approval.
    let run_c = site.submit(json!({"n": "c"}), None).await;
    let c = site.claim_and_start().await;
    let ask_c = c
        .begin("tool", "page-oncall", json!({"message": "c"}), "")
        .await
        .unwrap();
    // D: a gated call in flight whose adapter never comes back.
    let run_d = site.submit(json!({"n": "d"}), None).await;
    let d = site.claim_and_start().await;
    let ask_d = d
        .begin("tool", "page-oncall", json!({"message": "d"}), "")
        .await
        .unwrap();
    site.decide(&ask_d.approval_id, true).await;
    let go_d = d
        .begin(
            "tool",
            "page-oncall",
            json!({"message": "d"}),
            &ask_d.approval_id,
        )
        .await
        .unwrap();
    assert_eq!(go_d.outcome, ad::BeginOutcome::STARTED);

    site.a.kill9();
    site.a.restart();
    let (a, b, c) = (
        Adapter {
            client: site.adapter(),
            ticket: a.ticket,
        },
        Adapter {
            client: site.adapter(),
            ticket: b.ticket,
        },
        Adapter {
            client: site.adapter(),
            ticket: c.ticket,
        },
    );

    // A: the adapter delivers its result with the same token.
    a.complete(&call_a.call_id, json!({"tickets": 1}))
        .await
        .expect("A resumes");
    assert_eq!(a.report(good_output()).await.unwrap().state, "Succeeded");
    // B: resumes from its checkpoint and finishes.
    let cps = site.timeline(&b.id()).await["checkpoints"]
        .as_array()
        .unwrap()
        .len();
    assert!(cps >= 3);
    assert_eq!(b.report(good_output()).await.unwrap().state, "Succeeded");
    // C: its approval is still pending and can be decided.
    site.decide(&ask_c.approval_id, false).await;
    let seen = c
        .client
        .await_decision(ad::AwaitDecisionRequest {
            attempt_id: c.id(),
            fencing_token: c.ticket.fencing_token,
            decision_id: ask_c.decision_id.clone(),
            wait_seconds: 5,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert_eq!(seen.status, "rejected");
    assert_eq!(seen.attempt_state, "Failed");
    // D: nobody comes back for the gated call: once its lease lapses the
    // reconciler settles it as Uncertain; the call is not issued again.
    site.advance(90).await;
    site.a.run_worker("OrphanedAttemptReconciler").await;
    let d_timeline = site.timeline(&d.id()).await;
    assert_eq!(d_timeline["state"], "Uncertain", "{d_timeline}");

    for (run, state) in [
        (&run_a, "Succeeded"),
        (&run_b, "Succeeded"),
        (&run_c, "Failed"),
        (&run_d, "Uncertain"),
    ] {
        let r = site.run(&run.run_id).await;
        assert_eq!(r.state, state, "run {}", run.run_id);
        assert_eq!(r.steps[0].attempts.len(), 1, "no attempt was started twice");
    }
    let d_calls: Vec<Value> = d_timeline["calls"].as_array().unwrap().clone();
    assert_eq!(
        d_calls
            .iter()
            .filter(|c| c["target"] == "page-oncall" && c["status"] != "failed")
            .count(),
        1
    );
    // Exactly one outcome per attempt.
    let outcomes = events(
        &site.a,
        &site.token,
        "execution.attempts.v1.attempt-outcome-reported",
        4,
    )
    .await;
    let mut ids: Vec<&str> = outcomes
        .iter()
        .map(|e| e["attemptId"].as_str().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), outcomes.len());
}

#[tokio::test]
async fn a_supervisor_delegates_to_a_child_run_within_the_depth_limit_and_its_run_slot() {
    let site = Site::start(false).await;
    // One run slot for the project: a child run runs in its supervisor's.
    site.project_quota(json!({"concurrentRuns": 1})).await;
    let dir = tempfile::tempdir().unwrap();
    let helper = variant(dir.path(), "helper", &demo_key(), |_, m| {
        m["releaseId"] = json!("helper-ext-1.0.0");
        m["agentId"] = json!("helper");
        m["adapter"] = json!({"kind": "external", "version": "1"});
    });
    let (status, body) = upload(&site.a, &site.token, pack(&helper, |_| {})).await;
    assert_eq!(status, 201, "{body}");

    let limits = rn::Limits {
        max_sub_agent_depth: 1,
        ..Default::default()
    };
    let run = site.submit(json!({"ticket": "t"}), Some(limits)).await;
    let parent = site.claim_and_start().await;
    let call = parent
        .begin(
            "sub-agent",
            "helper-ext-1.0.0",
            json!({"purpose": "summarise", "ticket": "t"}),
            "",
        )
        .await
        .unwrap();
    assert_eq!(call.outcome, ad::BeginOutcome::STARTED);
    assert!(!call.child_run_id.is_empty());
    let child_run = site.run(&call.child_run_id).await;
    assert_eq!(child_run.depth, 1);
    assert_eq!(child_run.parent_run_id, run.run_id);
    let delegated = events(
        &site.a,
        &site.token,
        "execution.attempts.v1.sub-agent-delegated",
        1,
    )
    .await;
    assert_eq!(delegated[0]["childAgentId"], "helper");

    // The child runs under its own adapter, in its supervisor's run slot;
    // it may not delegate deeper.
    let child = site.claim_and_start_agent("helper").await;
    let slot = site.timeline(&child.id()).await["capacity"].clone();
    assert_eq!(slot["runSlot"], run.run_id.as_str(), "{slot}");
    assert_eq!(slot["runSlotHeld"], true, "{slot}");
    let deeper = child
        .begin("sub-agent", "helper-ext-1.0.0", json!({}), "")
        .await
        .unwrap_err();
    assert_eq!(code(&deeper), ErrorCode::ResourceExhausted);
    assert!(
        deeper
            .message
            .unwrap_or_default()
            .contains("maxSubAgentDepth 1")
    );

    // The supervisor observes the child's outcome as the call's result.
    let result = parent
        .client
        .await_call(ad::AwaitCallRequest {
            attempt_id: parent.id(),
            fencing_token: parent.ticket.fencing_token,
            call_id: call.call_id.clone(),
            wait_seconds: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert_eq!(result.status, "failed");
    assert!(result.error.contains("Failed"), "{}", result.error);
    let done = parent.report(good_output()).await.unwrap();
    assert_eq!(done.state, "Succeeded");
    assert_eq!(site.run(&run.run_id).await.state, "Succeeded");

    // A second delegation whose child succeeds hands its output back. The
    // child's tokens are its supervisor's run's too.
    let run = site.submit(json!({"ticket": "u"}), None).await;
    let parent = site.claim_and_start().await;
    parent.own_model_call(1000, 100).await;
    let call = parent
        .begin("sub-agent", "helper-ext-1.0.0", json!({"ticket": "u"}), "")
        .await
        .unwrap();
    let child = site.claim_and_start_agent("helper").await;
    child.own_model_call(300, 30).await;
    child.own_model_call(200, 20).await;
    child.report(good_output()).await.unwrap();
    let child_run = site.run(&call.child_run_id).await;
    let parent_run = site.run(&run.run_id).await;
    let total = |t: Option<&rn::TokenUsage>| t.unwrap().total_tokens;
    assert_eq!(total(child_run.tokens.as_option()), 550);
    assert_eq!(total(child_run.tokens_with_children.as_option()), 550);
    assert_eq!(
        total(parent_run.tokens.as_option()),
        1100,
        "its own attempts'"
    );
    assert_eq!(
        total(parent_run.tokens_with_children.as_option()),
        1650,
        "with its child's"
    );
    let timeline = site.timeline(&child.id()).await;
    let model = timeline["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "model")
        .unwrap()
        .clone();
    assert_eq!(model["latencyMs"], 250, "the latency the adapter measured");
    let result = parent
        .client
        .await_call(ad::AwaitCallRequest {
            attempt_id: parent.id(),
            fencing_token: parent.ticket.fencing_token,
            call_id: call.call_id.clone(),
            wait_seconds: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert_eq!(result.status, "completed");
    assert_eq!(
        serde_json::from_str::<Value>(&result.result_json).unwrap(),
        good_output()
    );
    // Cancelling the supervisor's run reaches the runs it delegated to.
    let call = parent
        .begin("sub-agent", "helper-ext-1.0.0", json!({"ticket": "v"}), "")
        .await
        .unwrap();
    site.runs()
        .cancel_run(rn::CancelRunRequest {
            run_id: run.run_id.clone(),
            reason: "customer withdrew".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(site.run(&run.run_id).await.state, "Cancelled");
    assert_eq!(site.run(&call.child_run_id).await.state, "Cancelled");
}

#[tokio::test]
async fn a_lapsed_adapter_is_fenced_off_and_resuming_needs_a_compatible_checkpoint() {
    let mut site = Site::start(true).await;
    let run = site.submit(json!({"ticket": "t"}), None).await;
    let first = site.claim_and_start().await;
    first
        .client
        .checkpoint(ad::CheckpointRequest {
            attempt_id: first.id(),
            fencing_token: first.ticket.fencing_token,
            state_json: json!({"plan": ["look", "answer"]}).to_string(),
            phase: "Planning".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    // The first adapter goes silent; its lease lapses.
    site.advance(61).await;
    let ticket = site
        .adapter()
        .claim_attempt(ad::ClaimAttemptRequest {
            agent_id: AGENT.into(),
            session: "second-adapter".into(),
            wait_seconds: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    let t = ticket.attempt.as_option().expect("resumable").clone();
    assert_eq!(t.attempt_id, first.id());
    assert!(t.resumed);
    assert_eq!(t.fencing_token, 2);
    assert_eq!(
        serde_json::from_str::<Value>(&t.state_json).unwrap(),
        json!({"plan": ["look", "answer"]})
    );
    // The old holder is fenced off.
    let stale = first
        .begin("model", "triage-scripted", json!({}), "")
        .await
        .unwrap_err();
    assert_eq!(code(&stale), ErrorCode::Aborted);
    assert!(
        stale
            .message
            .unwrap_or_default()
            .contains("fencing token 1 is stale")
    );
    // An adapter that cannot read the checkpoint may not resume: the
    // attempt fails (infrastructure) and a new one starts from the input.
    let refused = site
        .adapter()
        .start_attempt(ad::StartAttemptRequest {
            attempt_id: t.attempt_id.clone(),
            fencing_token: t.fencing_token,
            adapter_version: "external/2".into(),
            checkpoint_format: 2,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(code(&refused), ErrorCode::FailedPrecondition);
    let run = site.run(&run.run_id).await;
    let attempts = &run.steps[0].attempts;
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].failure_class, "infrastructure");
    assert_eq!(attempts[1].fencing_token, 3);
    let fresh = site.claim_and_start().await;
    assert!(!fresh.ticket.resumed);
    assert_eq!(
        serde_json::from_str::<Value>(&fresh.ticket.input_json).unwrap(),
        json!({"ticket": "t"})
    );
}

#[tokio::test]
async fn an_orphaned_attempt_is_settled_even_when_the_appliance_restarts_faster_than_its_lease() {
    let mut site = Site::start_with(&[
        ("AGENTBAY_RUNTIME__ATTEMPT_LEASE_SECONDS", "6"),
        ("AGENTBAY_RUNTIME__HEARTBEAT_SECONDS", "1"),
        ("AGENTBAY_RUNTIME__RECONCILE_INTERVAL_SECONDS", "1"),
    ])
    .await;
    let run = site.submit(json!({"ticket": "t"}), None).await;
    let adapter = site.claim_and_start().await;
    let last_contact = std::time::Instant::now();
    // The adapter is gone; the appliance crashes every second and a half,
    // for longer than the adapter's lease.
    while last_contact.elapsed() < std::time::Duration::from_secs(7) {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        site.a.kill9();
        site.a.restart();
    }
    let restarted = std::time::Instant::now();
    // The lease counts from the adapter's last contact, not from a
    // restart: it has lapsed, and the reconciler settles the attempt within
    // a pass or two, long before a lease renewed by the restart would end.
    site.token = site.a.token(&site.cred).await;
    loop {
        let run = site.run(&run.run_id).await;
        let first = &run.steps[0].attempts[0];
        assert_eq!(first.attempt_id, adapter.id());
        if first.state == "Cancelled" {
            assert!(
                first.failure_reason.contains("lapsed"),
                "{}",
                first.failure_reason
            );
            break;
        }
        assert!(
            restarted.elapsed() < std::time::Duration::from_secs(5),
            "attempt still {} {:?} after the last restart",
            first.state,
            restarted.elapsed()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn an_attempt_can_be_watched_over_connect_streaming_and_sse() {
    let site = Site::start(false).await;
    site.submit(json!({"ticket": "t"}), None).await;
    let adapter = site.claim_and_start().await;
    let live = site.watch(&adapter.id(), 0).await;
    let sse = site
        .a
        .http()
        .get(format!(
            "{}/runtime/attempts/{}/watch",
            site.a.url,
            adapter.id()
        ))
        .bearer_auth(&site.token)
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    assert!(
        sse.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    // A fast burst: calls, phases in a row, checkpoints, the outcome.
    adapter.think_and_look().await;
    for (i, phase) in ["Planning", "Observing", "Verifying"].iter().enumerate() {
        adapter
            .client
            .checkpoint(ad::CheckpointRequest {
                attempt_id: adapter.id(),
                fencing_token: adapter.ticket.fencing_token,
                state_json: json!({"i": i}).to_string(),
                phase: phase.to_string(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    adapter.report(good_output()).await.unwrap();

    let live = live.await.unwrap();
    let first = &live[0];
    assert!(
        first.topic.is_empty(),
        "the first update is the attempt now"
    );
    assert_eq!(first.state, "Running");
    let last = live.last().unwrap();
    assert_eq!(last.state, "Succeeded");
    assert!(last.checkpoints >= 6);
    assert!(last.outcome_hash.starts_with("sha256:"));

    // Every phase change and checkpoint arrived, in order, none coalesced:
    // the same as the attempt's history and as a watcher who comes late.
    let events: Vec<&rt::AttemptUpdate> = live[1..].iter().collect();
    assert!(
        events.windows(2).all(|w| w[0].sequence < w[1].sequence),
        "in outbox order"
    );
    let payload = |u: &rt::AttemptUpdate| serde_json::from_str::<Value>(&u.event_json).unwrap();
    let phases: Vec<(String, String)> = events
        .iter()
        .filter(|u| u.topic == "execution.attempts.v1.attempt-phase-changed")
        .map(|u| {
            let p = payload(u);
            (
                p["state"].as_str().unwrap().to_string(),
                p["phase"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let t = site.timeline(&adapter.id()).await;
    let history: Vec<(String, String)> = t["phases"].as_array().unwrap()[1..]
        .iter()
        .map(|m| {
            (
                m["state"].as_str().unwrap().to_string(),
                m["phase"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(phases, history, "every phase change, in order");
    assert!(phases.iter().any(|(_, p)| p == "Verifying"));
    let checkpoints: Vec<u64> = events
        .iter()
        .filter(|u| u.topic == "execution.attempts.v1.attempt-checkpointed")
        .map(|u| payload(u)["sequence"].as_u64().unwrap())
        .collect();
    let stored = t["checkpoints"].as_array().unwrap().len() as u64;
    assert_eq!(
        checkpoints,
        (1..=stored).collect::<Vec<_>>(),
        "every checkpoint"
    );
    assert_eq!(
        events.last().unwrap().topic,
        "execution.attempts.v1.attempt-outcome-reported"
    );
    let late = site.watch(&adapter.id(), 0).await.await.unwrap();
    let sequences = |u: &[rt::AttemptUpdate]| u[1..].iter().map(|u| u.sequence).collect::<Vec<_>>();
    assert_eq!(
        sequences(&late),
        sequences(&live),
        "the late watcher reads the same"
    );
    // Resumed from the middle: exactly the rest.
    let middle = events[events.len() / 2].sequence;
    let resumed = site.watch(&adapter.id(), middle).await.await.unwrap();
    assert_eq!(
        sequences(&resumed),
        sequences(&live)
            .into_iter()
            .filter(|s| *s > middle)
            .collect::<Vec<_>>()
    );

    let body = tokio::time::timeout(std::time::Duration::from_secs(10), sse.text())
        .await
        .expect("the SSE stream ends with the attempt")
        .unwrap();
    assert!(body.contains("event: attempt"), "{body}");
    assert!(body.contains("\"state\":\"Succeeded\""), "{body}");
}

impl Site {
    /// Watches an attempt from `after`; the handle gives every update once
    /// the stream has ended.
    async fn watch(
        &self,
        attempt_id: &str,
        after: u64,
    ) -> tokio::task::JoinHandle<Vec<rt::AttemptUpdate>> {
        let mut stream = self
            .runtime()
            .watch_attempt(rt::WatchAttemptRequest {
                attempt_id: attempt_id.into(),
                after_sequence: after,
                ..Default::default()
            })
            .await
            .unwrap();
        // The first update arrives before the stream is handed over, so
        // the watch is open before anything else happens.
        let first = stream.message().await.unwrap().unwrap().to_owned_message();
        tokio::spawn(async move {
            let mut updates = vec![first];
            loop {
                let next =
                    tokio::time::timeout(std::time::Duration::from_secs(10), stream.message())
                        .await
                        .expect("an update within 10 s")
                        .unwrap();
                match next {
                    Some(u) => updates.push(u.to_owned_message()),
                    None => return updates,
                }
            }
        })
    }
}

#[tokio::test]
async fn a_watched_attempt_says_what_a_human_is_asked() {
    let (site, attempt) = waiting_for("escalation").await;
    let mut stream = site
        .runtime()
        .watch_attempt(rt::WatchAttemptRequest {
            attempt_id: attempt.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let update = tokio::time::timeout(std::time::Duration::from_secs(10), stream.message())
        .await
        .expect("an update within 10 s")
        .unwrap()
        .expect("the current state first")
        .to_owned_message();
    assert_eq!(update.state, "WaitingForDecision");
    let pending = update
        .pending_decision
        .as_option()
        .expect("the structured decision");
    assert_eq!(pending.kind, "escalation");
    assert_eq!(pending.options, ["p1", "p2"]);
    assert_eq!(pending.recommendation, "p1");
    assert!(pending.question.contains("which priority?"), "{pending:?}");
    assert!(!pending.decision_id.is_empty());
}

#[tokio::test]
async fn a_waiting_attempt_names_its_quota_and_a_failed_renewal_pauses_until_renewed() {
    let site = Site::start(false).await;
    let admin = site.a.token(&site.workspace).await;
    site.project_quota(json!({"concurrentRuns": 1})).await;
    site.submit(json!({"n": 1}), None).await;
    let first = site.claim_and_start().await;

    // The first attempt loses its capacity lease, and a new one is
    // refused (cpuPerAttempt now below what it asks). Its run keeps its
    // run slot: the second run still waits on concurrentRuns.
    let lease = site.timeline(&first.id()).await["capacity"]["leaseId"]
        .as_str()
        .unwrap()
        .to_string();
    site.project_quota(json!({"cpuPerAttempt": 0.1})).await;
    site.a
        .capacity(&admin)
        .release_lease(
            agentbay::proto::agentbay::capacity::v1::ReleaseLeaseRequest {
                lease_id: lease,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    site.a.run_worker("LeaseHeartbeat").await;
    assert_eq!(
        site.timeline(&first.id()).await["capacity"]["runSlotHeld"],
        true
    );
    // It pauses at its next checkpoint, and no call starts while paused.
    let cp = first
        .client
        .checkpoint(ad::CheckpointRequest {
            attempt_id: first.id(),
            fencing_token: first.ticket.fencing_token,
            state_json: json!({"at": "pause"}).to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert_eq!(cp.state, "Paused");
    let paused = first
        .begin("model", "triage-scripted", json!({}), "")
        .await
        .unwrap_err();
    assert_eq!(code(&paused), ErrorCode::Unavailable);
    // A documented wait, told when to come back: the log says so at INFO,
    // not as a failure.
    let deferred = |log: &str| {
        log.lines().any(|l| {
            l.contains("INFO") && l.contains("request deferred") && l.contains("BeginCall")
        })
    };
    for _ in 0..50 {
        if deferred(&site.a.log()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let log = site.a.log();
    assert!(deferred(&log), "{log}");
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("BeginCall")),
        "{log}"
    );
    let timeline = site.timeline(&first.id()).await;
    assert!(
        timeline["waitingReason"]
            .as_str()
            .unwrap()
            .contains("paused"),
        "{timeline}"
    );

    // Capacity comes back: the next heartbeat renews and it runs again.
    site.project_quota(json!({"cpuPerAttempt": null})).await;
    site.a.run_worker("LeaseHeartbeat").await;
    assert_eq!(site.timeline(&first.id()).await["state"], "Running");
    let go = first
        .begin("model", "triage-scripted", json!({}), "")
        .await
        .unwrap();
    assert_eq!(go.outcome, ad::BeginOutcome::STARTED);

    // A second run waits for the run slot and says why.
    let second = site.submit(json!({"n": 2}), None).await;
    let mut waiting = rn::Attempt::default();
    for _ in 0..100 {
        waiting = site.run(&second.run_id).await.steps[0].attempts[0].clone();
        if waiting.queue_position == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(waiting.state, "Claimed");
    assert_eq!(waiting.queue_position, 1);
    assert_eq!(waiting.limiting_quota, "concurrentRuns");
    assert!(
        waiting.waiting_reason.contains("waiting for capacity")
            && waiting.waiting_reason.contains("queue position 1"),
        "{}",
        waiting.waiting_reason
    );
}

/// Waits until `f` holds for the attempt's timeline.
async fn timeline_until(site: &Site, attempt_id: &str, f: impl Fn(&Value) -> bool) -> Value {
    let mut t = Value::Null;
    for _ in 0..100 {
        t = site.timeline(attempt_id).await;
        if f(&t) {
            return t;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the attempt's timeline never got there: {t}");
}

/// The first attempt of a run, once it has been dispatched.
async fn first_attempt(site: &Site, run_id: &str) -> rn::Attempt {
    for _ in 0..100 {
        let run = site.run(run_id).await;
        if let Some(a) = run.steps.first().and_then(|s| s.attempts.first()) {
            return a.clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("run {run_id} has no attempt");
}

#[tokio::test]
async fn a_run_keeps_its_slot_through_a_human_wait_while_its_cpu_serves_another_project() {
    let mut site = Site::start(true).await;
    site.a.tenant("demo", "team", &[], &["ops"]).await;
    let admin = site.a.token(&site.workspace).await;
    site.project_quota(json!({"concurrentRuns": 1})).await;
    let run = site.submit(json!({"n": 1}), None).await;
    let first = site.claim_and_start().await;
    let d = first
        .client
        .request_decision(ad::RequestDecisionRequest {
            attempt_id: first.id(),
            fencing_token: first.ticket.fencing_token,
            kind: "escalation".into(),
            question_json: json!({"q": "which priority?"}).to_string(),
            summary: "Which priority?".into(),
            options: vec!["p1".into(), "p2".into()],
            recommendation: "p1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();

    // Past runtime.return_capacity_after_seconds the waiting attempt gives
    // its CPU and memory back; its run keeps the project's one run slot.
    site.advance(61).await;
    let t = timeline_until(&site, &first.id(), |t| t["capacity"]["granted"] == false).await;
    assert_eq!(t["state"], "WaitingForDecision");
    assert_eq!(t["capacity"]["runSlotHeld"], true, "{t}");
    assert_eq!(t["capacity"]["runSlot"], run.run_id.as_str());
    let gap = &t["capacity"]["gaps"][0];
    assert!(
        gap["reason"]
            .as_str()
            .unwrap()
            .contains("for human escalation decision"),
        "{gap}"
    );
    let quotas = site.a.get(&admin, "/factory/capacity/quotas").await;
    let support = quotas["projects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["projectId"] == "support")
        .unwrap_or_else(|| panic!("{quotas}"));
    assert_eq!(support["usage"]["concurrentRuns"], 1, "{support}");
    assert_eq!(
        support["usage"]["cpuInUse"].as_f64(),
        Some(0.0),
        "{support}"
    );

    // Another run of the project cannot start: the slot is held.
    let second = site.submit(json!({"n": 2}), None).await;
    let waiting = first_attempt(&site, &second.run_id).await;
    let waiting = timeline_until(&site, &waiting.attempt_id, |t| {
        t["capacity"]["limitingQuota"] == "concurrentRuns"
    })
    .await;
    assert_eq!(waiting["state"], "Claimed");
    assert!(
        waiting["capacity"]["reason"]
            .as_str()
            .unwrap()
            .contains("concurrentRuns of project support: 1 in use, limit 1"),
        "{waiting}"
    );

    // A run of another project uses the CPU meanwhile.
    let other = site
        .runs()
        .submit_run(rn::SubmitRunRequest {
            project_id: "ops".into(),
            release_id: RELEASE.into(),
            input_json: json!({"n": 3}).to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    let other = first_attempt(&site, &other.run.as_option().unwrap().run_id).await;
    let other = timeline_until(&site, &other.attempt_id, |t| {
        t["capacity"]["granted"] == true
    })
    .await;
    assert_eq!(other["projectId"], "ops");

    // The answer comes: the first attempt takes CPU again (no new slot)
    // and goes on; the second run still waits for the slot.
    site.runtime()
        .answer_decision(rt::AnswerDecisionRequest {
            attempt_id: first.id(),
            decision_id: d.decision_id.clone(),
            choice: "p2".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let t = timeline_until(&site, &first.id(), |t| t["capacity"]["granted"] == true).await;
    assert_eq!(t["state"], "Running");
    let go = first
        .begin("model", "triage-scripted", json!({}), "")
        .await
        .unwrap();
    assert_eq!(go.outcome, ad::BeginOutcome::STARTED, "{}", go.reason);
    first
        .complete(&go.call_id, json!({"text": "p2"}))
        .await
        .unwrap();
    let again = site.timeline(waiting["attemptId"].as_str().unwrap()).await;
    assert_eq!(
        again["capacity"]["limitingQuota"], "concurrentRuns",
        "{again}"
    );

    // The first run ends: its slot goes to the second.
    first.report(good_output()).await.unwrap();
    let started = timeline_until(&site, waiting["attemptId"].as_str().unwrap(), |t| {
        t["capacity"]["granted"] == true
    })
    .await;
    assert_eq!(started["capacity"]["runSlotHeld"], true);
    let accounting = site
        .a
        .get(&site.a.admin_token().await, "/factory/capacity/accounting")
        .await;
    let line = accounting["usage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["tenantId"] == "demo" && u["projectId"] == "support")
        .unwrap_or_else(|| panic!("{accounting}"));
    assert_eq!(line["concurrentRuns"], 1, "{line}");
    let reconciled = site.a.run_worker("AccountingReconciler").await;
    assert!(
        reconciled.message.contains("run slot(s) held by live runs"),
        "{reconciled:?}"
    );
}

#[tokio::test]
async fn revocation_interrupts_running_attempts_and_tenants_stay_apart() {
    let site = Site::start(false).await;
    let run = site.submit(json!({"ticket": "t"}), None).await;
    let adapter = site.claim_and_start().await;

    // Another tenant sees nothing of it and cannot act on it.
    let other = site
        .a
        .create_client(
            "acme",
            &[
                "factory.runs.read",
                "factory.runs.execute",
                "factory.runs.operate",
            ],
        )
        .await;
    let other_token = site.a.token(&other).await;
    let r = site
        .a
        .http()
        .get(format!("{}/runtime/attempts/{}", site.a.url, adapter.id()))
        .bearer_auth(&other_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let config = ClientConfig::new(site.a.url.parse().unwrap())
        .with_codec_format(CodecFormat::Json)
        .with_default_header("authorization", format!("Bearer {other_token}"));
    let foreign = rt::RuntimeClient::new(pinned_transport(&site.a.fingerprint), config.clone())
        .interrupt(rt::InterruptRequest {
            attempt_id: adapter.id(),
            reason: "not mine".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(code(&foreign), ErrorCode::NotFound);
    let claimed = ad::AdapterClient::new(pinned_transport(&site.a.fingerprint), config)
        .claim_attempt(ad::ClaimAttemptRequest {
            agent_id: AGENT.into(),
            wait_seconds: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert!(claimed.attempt.as_option().is_none());

    // Revoked with in-flight policy interrupt: the running attempt stops at
    // its adapter's next call.
    let r = site
        .a
        .http()
        .post(format!("{}/runtime/releases/{RELEASE}/revoke", site.a.url))
        .bearer_auth(&site.token)
        .json(&json!({"inFlightPolicy": "interrupt"}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["inFlight"]["interrupted"], 1, "{body}");
    let stopped = adapter
        .begin("model", "triage-scripted", json!({}), "")
        .await
        .unwrap_err();
    assert_eq!(code(&stopped), ErrorCode::Aborted);
    assert!(stopped.message.unwrap_or_default().contains("revocation"));
    let run = site.run(&run.run_id).await;
    assert_eq!(run.state, "Cancelled");
    assert_eq!(run.steps[0].attempts.len(), 1);
    // And no new run is dispatched.
    let refused = site
        .runs()
        .submit_run(rn::SubmitRunRequest {
            project_id: "support".into(),
            release_id: RELEASE.into(),
            input_json: "{}".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(code(&refused), ErrorCode::FailedPrecondition, "{refused:?}");
}

#[tokio::test]
async fn the_compactor_keeps_the_last_and_the_evidence_checkpoints() {
    let mut site = Site::start(true).await;
    site.submit(json!({"ticket": "t"}), None).await;
    let adapter = site.claim_and_start().await;
    adapter.think_and_look().await;
    let page = json!({"message": "m"});
    let ask = adapter
        .begin("tool", "page-oncall", page.clone(), "")
        .await
        .unwrap();
    site.decide(&ask.approval_id, true).await;
    let go = adapter
        .begin("tool", "page-oncall", page, &ask.approval_id)
        .await
        .unwrap();
    adapter.complete(&go.call_id, json!({})).await.unwrap();
    adapter.report(good_output()).await.unwrap();
    let path = format!("/runtime/attempts/{}/checkpoints", adapter.id());
    let before = site.a.get(&site.token, &path).await;
    let all = before["checkpoints"].as_array().unwrap().len();
    assert!(all >= 5, "{before}");

    // Inside the retention window nothing goes.
    site.a.run_worker("CheckpointCompactor").await;
    assert_eq!(
        site.a.get(&site.token, &path).await["checkpoints"]
            .as_array()
            .unwrap()
            .len(),
        all
    );
    site.advance(8 * 86_400).await;
    site.a.run_worker("CheckpointCompactor").await;
    let after = site.a.get(&site.token, &path).await;
    let kept = after["checkpoints"].as_array().unwrap();
    assert_eq!(kept.len(), 2, "{after}");
    assert!(
        kept.iter()
            .any(|c| c["evidence"] == true && c["checkpointId"] == go.checkpoint_id.as_str())
    );
    assert!(
        kept.iter()
            .any(|c| c["checkpointId"] == after["lastCheckpointId"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_attempt_gives_back_its_capacity_even_before_it_heard_of_its_lease() {
    // In-process, so that submissions and cancellations come faster than
    // the answers to the attempts' capacity requests.
    use agentbay::app::{self, Clocks};
    use agentbay::domain::access::TenantScope;
    use agentbay::domain::tenant::TenantSpec;
    use agentbay::domain::{ProjectId, TenantId};
    let dir = tempfile::tempdir().unwrap();
    let config = agentbay::config::Config {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".parse().unwrap(),
        demo: agentbay::config::DemoConfig { enabled: false },
        ..Default::default()
    };
    let running = app::start(config, Clocks::system()).await.unwrap();
    let state = running.state.clone();
    let tenant = TenantId::parse("demo").unwrap();
    state
        .capacity
        .put_tenant(
            tenant.clone(),
            TenantSpec {
                edition: "platform".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let project = ProjectId::parse("support").unwrap();
    state
        .capacity
        .put_project(tenant.clone(), project.clone(), None)
        .await
        .unwrap();
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("packaging/examples/releases/triage-external");
    // Signed as the demo signs it: with this data directory's own demo key.
    let pair = agentbay::releases::signing::instance_demo_pair(&state.config.data_dir).unwrap();
    let bundle = agentbay::releases::bundle::Bundle::from_dir(&example, &state.releases.limits)
        .unwrap()
        .signed(&pair)
        .unwrap();
    let report = state.releases.check(&bundle);
    state.releases.record(bundle, report, "test").await.unwrap();
    let scope = TenantScope::new(tenant);
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let (state, scope, project) = (state.clone(), scope.clone(), project.clone());
            tokio::spawn(async move {
                for i in 0..5 {
                    let run = state
                        .runs
                        .submit(
                            &scope,
                            agentbay::runs::RunRequest {
                                project_id: project.clone(),
                                release_id: "triage-external-1.0.0".into(),
                                input: json!({"customer": format!("c{w}-{i}"), "text": "t"}),
                                limits: None,
                                max_attempts: 0,
                                max_corrections: None,
                                request_id: None,
                                run_key: None,
                                labels: Default::default(),
                                environment_id: None,
                                submitted_by: "test".into(),
                            },
                        )
                        .await
                        .unwrap();
                    state
                        .runs
                        .cancel(&scope, run.run_id, "test", "changed my mind")
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let mut live = usize::MAX;
    for _ in 0..400 {
        let leases = state
            .capacity
            .leases(Some(&scope), &Default::default(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(leases.len(), 80, "one lease request per attempt");
        live = leases
            .iter()
            .filter(|l| !l.lease.state.is_terminal())
            .count();
        if live == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(live, 0, "every cancelled attempt gave its capacity back");
    drop(state);
    running.stop().await.unwrap();
}

/// Retention over the real binary on the manual clock: payloads past
/// retention become tombstones that the API and timelines show; a held
/// run's, a live attempt's and content another run still refers to stay;
/// history goes after its own retention; and afterwards the store's
/// derived state (indexes, counts, reference counts, content owners) is
/// exactly what its records say.
#[tokio::test]
async fn retention_purges_what_expired_and_spares_the_held_the_live_and_the_shared() {
    let a = Appliance::start_with(
        &["--manual-clock"],
        // A decision can wait longer than the payload retention.
        &[("AGENTBAY_RUNTIME__INPUT_TIMEOUT_MINUTES", "200000")],
    );
    let mut site = Site::on(a).await;
    let input = json!({"ticket": "retained?"});
    // Two finished runs with the same input and output: shared content.
    let mut finished = Vec::new();
    for _ in 0..2 {
        let run = site.submit(input.clone(), None).await;
        let adapter = site.claim_and_start().await;
        adapter.think_and_look().await;
        adapter.report(good_output()).await.expect("report");
        finished.push((run.run_id.clone(), adapter.id()));
    }
    let (plain, plain_attempt) = finished[0].clone();
    let (held, _) = finished[1].clone();
    let hold = site
        .runs()
        .hold_run(rn::HoldRunRequest {
            run_id: held.clone(),
            reason: "case 4711".into(),
            ..Default::default()
        })
        .await
        .expect("hold")
        .into_owned();
    assert_eq!(hold.run.as_option().unwrap().hold.reason, "case 4711");
    let no_reason = site
        .runs()
        .hold_run(rn::HoldRunRequest {
            run_id: plain.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(no_reason.message.unwrap_or_default().contains("reason"));
    // A live attempt waiting for a person, with the same input.
    let live = site.submit(input.clone(), None).await;
    let waiting = site.claim_and_start().await;
    waiting.think_and_look().await;
    waiting
        .client
        .request_decision(ad::RequestDecisionRequest {
            attempt_id: waiting.id(),
            fencing_token: waiting.ticket.fencing_token,
            kind: "input".into(),
            question_json: json!({"q": "which customer?"}).to_string(),
            summary: "Which customer?".into(),
            ..Default::default()
        })
        .await
        .expect("ask");
    let output_before = site.run(&plain).await.output_json;
    assert!(!output_before.is_empty());

    // 31 days on: past the 30-day payload retention.
    site.advance(31 * 86_400).await;
    let pass = site.a.run_worker("Purger").await;
    assert!(pass.ok, "{}", pass.message);
    let purged = site.run(&plain).await;
    assert!(
        purged
            .purged
            .contains("by the payload retention of tenant demo (30 days)"),
        "{}",
        purged.purged
    );
    assert!(purged.output_json.is_empty(), "the content is gone");
    assert!(purged.output_ref.starts_with("sha256:"), "the hash stays");
    let timeline = site.timeline(&plain_attempt).await;
    assert!(
        timeline
            .to_string()
            .contains("payload retention of tenant demo"),
        "{timeline}"
    );
    // A call's content reads as its tombstone; the hashes stay.
    let tool = timeline["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["target"] == "lookup-ticket")
        .unwrap()
        .clone();
    let call = site
        .a
        .get(
            &site.token,
            &format!(
                "/runtime/attempts/{plain_attempt}/calls/{}",
                tool["callId"].as_str().unwrap()
            ),
        )
        .await;
    let request = &call["content"]["request"];
    assert_eq!(request["state"], "purged", "{call}");
    assert_eq!(request["hash"], tool["requestHash"]);
    assert!(
        request["purged"]
            .as_str()
            .unwrap()
            .contains("payload retention of tenant demo"),
        "{call}"
    );
    // The held run keeps everything, including the output it shares.
    let kept = site.run(&held).await;
    assert!(kept.purged.is_empty());
    assert_eq!(kept.output_json, output_before, "shared content survives");
    // The live attempt is untouched and goes on with its state.
    let live_now = site.run(&live.run_id).await;
    assert!(live_now.purged.is_empty());
    assert_eq!(live_now.state, "Running");

    // Released, the held run's payloads go at the next pass, and with them
    // the last reference to the shared output.
    site.runs()
        .hold_run(rn::HoldRunRequest {
            run_id: held.clone(),
            release: true,
            ..Default::default()
        })
        .await
        .expect("release the hold");
    let pass = site.a.run_worker("Purger").await;
    assert!(
        pass.message.contains("1 run payloads tombstoned"),
        "{}",
        pass.message
    );
    let released = site.run(&held).await;
    assert!(!released.purged.is_empty() && released.output_json.is_empty());

    // 91 days on: past the 90-day history retention, the finished runs go.
    site.advance(60 * 86_400).await;
    let pass = site.a.run_worker("Purger").await;
    assert!(pass.ok, "{}", pass.message);
    for id in [&plain, &held] {
        let gone = site
            .runs()
            .get_run(rn::GetRunRequest {
                run_id: id.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(code(&gone), ErrorCode::NotFound);
    }
    let listed = site
        .runs()
        .list_runs(rn::ListRunsRequest::default())
        .await
        .unwrap()
        .into_owned();
    let ids: Vec<&str> = listed.runs.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, [live.run_id.as_str()], "only the live run is left");

    // Offline, the store's derived state matches its records exactly.
    site.a.terminate().await;
    let store = agentbay::store::Store::open(
        &site.a.data_dir.join("store"),
        &agentbay::store::StoreOptions::default(),
    )
    .unwrap();
    let problems = store.audit().unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
    store.close().unwrap();
}

/// ListRuns reads through indexes now; every filter, paged, returns exactly
/// the rows a full scan filtered by hand returns, in the same order.
#[tokio::test]
async fn list_pages_through_indexes_return_what_a_full_scan_returns() {
    let site = Site::start(false).await;
    site.a.tenant("demo", "team", &[], &["billing"]).await;
    let mut submitted = Vec::new();
    for i in 0..14 {
        let project = if i % 2 == 0 { "support" } else { "billing" };
        let run = site
            .runs()
            .submit_run(rn::SubmitRunRequest {
                project_id: project.into(),
                release_id: RELEASE.into(),
                input_json: json!({"i": i}).to_string(),
                ..Default::default()
            })
            .await
            .expect("submit")
            .into_owned();
        let id = run.run.as_option().unwrap().run_id.clone();
        if i % 3 == 0 {
            site.runs()
                .cancel_run(rn::CancelRunRequest {
                    run_id: id.clone(),
                    reason: "not needed".into(),
                    ..Default::default()
                })
                .await
                .expect("cancel");
        }
        submitted.push(id);
    }
    let list = |filter: rn::ListRunsRequest| {
        let runs = site.runs();
        async move {
            let mut out = Vec::new();
            let mut after = String::new();
            loop {
                let page = runs
                    .list_runs(rn::ListRunsRequest {
                        page_size: 4,
                        page_after: after.clone(),
                        ..filter.clone()
                    })
                    .await
                    .expect("list")
                    .into_owned();
                out.extend(
                    page.runs
                        .iter()
                        .map(|r| (r.run_id.clone(), r.state.clone(), r.project_id.clone())),
                );
                if page.next_page_after.is_empty() {
                    return out;
                }
                after = page.next_page_after;
            }
        }
    };
    let all = list(rn::ListRunsRequest::default()).await;
    let mut newest_first = submitted.clone();
    newest_first.reverse();
    assert_eq!(
        all.iter().map(|r| r.0.clone()).collect::<Vec<_>>(),
        newest_first,
        "the table scan is every run, newest first"
    );
    type Row = (String, String, String);
    type Keep = Box<dyn Fn(&Row) -> bool>;
    let cases: Vec<(rn::ListRunsRequest, Keep)> = vec![
        (
            rn::ListRunsRequest {
                state: "Cancelled".into(),
                ..Default::default()
            },
            Box::new(|r| r.1 == "Cancelled"),
        ),
        (
            rn::ListRunsRequest {
                state: "Running".into(),
                ..Default::default()
            },
            Box::new(|r| r.1 == "Running"),
        ),
        (
            rn::ListRunsRequest {
                project_id: "billing".into(),
                ..Default::default()
            },
            Box::new(|r| r.2 == "billing"),
        ),
        (
            rn::ListRunsRequest {
                project_id: "billing".into(),
                state: "Cancelled".into(),
                ..Default::default()
            },
            Box::new(|r| r.2 == "billing" && r.1 == "Cancelled"),
        ),
        (
            rn::ListRunsRequest {
                release_id: RELEASE.into(),
                ..Default::default()
            },
            Box::new(|_| true),
        ),
        (
            rn::ListRunsRequest {
                agent_id: AGENT.into(),
                state: "Running".into(),
                ..Default::default()
            },
            Box::new(|r| r.1 == "Running"),
        ),
    ];
    for (filter, keep) in cases {
        let want: Vec<_> = all.iter().filter(|r| keep(r)).cloned().collect();
        assert!(!want.is_empty());
        assert_eq!(list(filter.clone()).await, want, "{filter:?}");
    }
}

/// kill -9 while the Purger works through small batches: after a restart
/// and another pass, every expired payload is gone, and the store's derived
/// state is exact: no reference to content that is gone, no content that
/// nothing holds.
#[tokio::test]
async fn kill_9_in_the_middle_of_a_purge_leaves_no_dangling_reference_and_no_orphan() {
    let a = Appliance::start_with(
        &["--manual-clock"],
        &[
            ("AGENTBAY_RETENTION__PURGE_BATCH_RECORDS", "10"),
            ("AGENTBAY_RETENTION__PURGE_PAUSE_MS", "30"),
        ],
    );
    let mut site = Site::on(a).await;
    let mut runs = Vec::new();
    for i in 0..12 {
        let run = site.submit(json!({"ticket": i}), None).await;
        let adapter = site.claim_and_start().await;
        adapter.think_and_look().await;
        adapter.report(good_output()).await.expect("report");
        runs.push(run.run_id);
    }
    // The move starts the Purger on its own; the kill lands while it works.
    site.a.advance(31 * 86_400).await;
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    site.a.kill9();
    site.a.restart();
    // A manual clock starts again from the wall clock: move it again.
    site.advance(31 * 86_400).await;
    let pass = site.a.run_worker("Purger").await;
    assert!(pass.ok, "{}", pass.message);
    for id in &runs {
        let run = site.run(id).await;
        assert!(
            !run.purged.is_empty(),
            "run {id} ({}) was not purged by the pass: {}",
            run.state,
            pass.message
        );
        assert!(run.output_json.is_empty());
    }
    site.a.terminate().await;
    let store = agentbay::store::Store::open(
        &site.a.data_dir.join("store"),
        &agentbay::store::StoreOptions::default(),
    )
    .unwrap();
    let problems = store.audit().unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
    store.close().unwrap();
}

impl Site {
    async fn rerun(
        &self,
        attempt_id: &str,
        checkpoint_sequence: u32,
        release_id: &str,
    ) -> Result<rn::Run, connectrpc::ConnectError> {
        self.runs()
            .rerun_from_checkpoint(rn::RerunFromCheckpointRequest {
                attempt_id: attempt_id.into(),
                checkpoint_sequence,
                release_id: release_id.into(),
                ..Default::default()
            })
            .await
            .map(|r| r.into_owned().run.as_option().unwrap().clone())
    }

    /// Imports a variant of the triage example with `edit` applied.
    async fn import_variant(&self, name: &str, edit: impl FnOnce(&mut Value)) {
        let bundle = variant(self._dir.path(), name, &demo_key(), |_, m| edit(m));
        let (status, body) = upload(&self.a, &self.token, pack(&bundle, |_| {})).await;
        assert_eq!(status, 201, "{body}");
    }
}

#[tokio::test]
async fn an_external_adapter_resumes_a_re_run_from_the_handed_over_state() {
    let site = Site::start(false).await;
    site.submit(json!({"ticket": "t"}), None).await;
    let adapter = site.claim_and_start().await;
    adapter.think_and_look().await;
    let attempt = adapter.id();
    let t = site.timeline(&attempt).await;
    let lookup = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["target"] == "lookup-ticket")
        .unwrap()["callId"]
        .clone();
    let after_lookup = t["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["reason"] == "after-observation" && c["callId"] == lookup)
        .and_then(|c| c["sequence"].as_u64())
        .expect("a checkpoint after the lookup") as u32;

    // A live attempt is not re-run.
    let live = site.rerun(&attempt, after_lookup, "").await.unwrap_err();
    assert_eq!(code(&live), ErrorCode::FailedPrecondition, "{live}");
    assert!(live.to_string().contains("finished attempt"), "{live}");

    // It pages (approved, confirmed), then fails.
    let page = json!({"message": "m"});
    let ask = adapter
        .begin("tool", "page-oncall", page.clone(), "")
        .await
        .unwrap();
    site.decide(&ask.approval_id, true).await;
    let go = adapter
        .begin("tool", "page-oncall", page.clone(), &ask.approval_id)
        .await
        .unwrap();
    assert_eq!(go.outcome, ad::BeginOutcome::STARTED);
    adapter
        .complete(&go.call_id, json!({"paged": "alice"}))
        .await
        .unwrap();
    adapter
        .client
        .report_outcome(ad::ReportOutcomeRequest {
            attempt_id: attempt.clone(),
            fencing_token: adapter.ticket.fencing_token,
            succeeded: false,
            failure_class: "policy".into(),
            reason: "it paged about the wrong customer".into(),
            ..Default::default()
        })
        .await
        .unwrap();

    // A release whose adapter cannot read the checkpoint (the builtin
    // loop's), and another agent's, are refused with the reason.
    site.import_variant("builtin-2", |m| {
        m["releaseId"] = json!("triage-2.0.0");
        m["version"] = json!("2.0.0");
    })
    .await;
    let incompatible = site
        .rerun(&attempt, after_lookup, "triage-2.0.0")
        .await
        .unwrap_err();
    assert!(
        incompatible.to_string().contains("external/1")
            && incompatible.to_string().contains("builtin/1"),
        "{incompatible}"
    );
    site.import_variant("other-agent", |m| {
        m["releaseId"] = json!("other-1.0.0");
        m["agentId"] = json!("other");
        m["adapter"] = json!({"kind": "external", "version": "1"});
    })
    .await;
    let other = site
        .rerun(&attempt, after_lookup, "other-1.0.0")
        .await
        .unwrap_err();
    assert!(other.to_string().contains("agent other"), "{other}");

    // From the checkpoint after the lookup: the adapter is handed that
    // state, with a new attempt and fencing token.
    let rerun = site
        .rerun(&attempt, after_lookup, "")
        .await
        .expect("re-run");
    let resumed = site.claim_and_start().await;
    let ticket = &resumed.ticket;
    assert_eq!(ticket.run_id, rerun.run_id);
    assert_ne!(ticket.attempt_id, attempt);
    assert!(ticket.resumed);
    let state: Value = serde_json::from_str(&ticket.state_json).unwrap();
    assert_eq!(state, json!({"observed": lookup}));
    assert_eq!(ticket.rerun_of_attempt_id, attempt);
    assert_eq!(ticket.rerun_of_checkpoint_sequence, after_lookup);
    // The page the source confirmed is answered, not issued (no approval
    // is asked either).
    let replay = resumed
        .begin("tool", "page-oncall", page.clone(), "")
        .await
        .unwrap();
    assert_eq!(
        replay.outcome,
        ad::BeginOutcome::REPLAYED,
        "{}",
        replay.reason
    );
    assert_eq!(replay.replayed_from_call_id, go.call_id);
    let result: Value = serde_json::from_str(&replay.result_json).unwrap();
    assert_eq!(result, json!({"paged": "alice"}));
    let verdict = resumed.report(good_output()).await.unwrap();
    assert_eq!(verdict.state, "Succeeded");
    assert_eq!(site.run(&rerun.run_id).await.state, "Succeeded");
    // The source run lists its re-runs.
    let source = site.run(&rerun.rerun_of.as_option().unwrap().run_id).await;
    assert_eq!(source.rerun_ids, vec![rerun.run_id.clone()]);

    // An uncertain call must be settled before a re-run; settled as
    // happened, it is a confirmed effect that is not issued again.
    site.submit(json!({"ticket": "u"}), None).await;
    let third = site.claim_and_start().await;
    let ask = third
        .begin("tool", "page-oncall", page.clone(), "")
        .await
        .unwrap();
    site.decide(&ask.approval_id, true).await;
    let open = third
        .begin("tool", "page-oncall", page.clone(), &ask.approval_id)
        .await
        .unwrap();
    site.runtime()
        .interrupt(rt::InterruptRequest {
            attempt_id: third.id(),
            reason: "stop".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let unsettled = site.rerun(&third.id(), 0, "").await.unwrap_err();
    assert!(
        unsettled.to_string().contains("uncertain") && unsettled.to_string().contains("settle"),
        "{unsettled}"
    );
    site.runs()
        .settle_call(rn::SettleCallRequest {
            attempt_id: third.id(),
            call_id: open.call_id.clone(),
            effect: "happened".into(),
            reason: "alice was paged".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    site.rerun(&third.id(), 0, "")
        .await
        .expect("re-run once settled");
    let fourth = site.claim_and_start().await;
    let replay = fourth.begin("tool", "page-oncall", page, "").await.unwrap();
    assert_eq!(
        replay.outcome,
        ad::BeginOutcome::REPLAYED,
        "{}",
        replay.reason
    );
    assert_eq!(replay.replayed_from_call_id, open.call_id);
}

/// The grain's call-timeout reminder, on the appliance's clock: an
/// adapter's tool call that outlasts `runtime.tool_timeout_seconds` (300)
/// settles by its class without the adapter. A read fails and the attempt
/// goes on; a call with effects is Uncertain with its attempt. (The
/// adapter's hold lasts an hour here, so that only the timeout acts.)
#[tokio::test]
async fn the_grain_times_out_an_adapters_tool_call_by_its_class() {
    let mut site = Site::on(Appliance::start_with(
        &["--manual-clock"],
        &[("AGENTBAY_RUNTIME__ATTEMPT_LEASE_SECONDS", "3600")],
    ))
    .await;
    site.submit(json!({"ticket": "slow"}), None).await;
    let adapter = site.claim_and_start().await;
    let look = adapter
        .begin("tool", "lookup-ticket", json!({"customer": "acme"}), "")
        .await
        .unwrap();
    assert_eq!(look.outcome, ad::BeginOutcome::STARTED);
    site.advance(299).await;
    let t = site.timeline(&adapter.id()).await;
    assert_eq!(t["state"], "WaitingForTool", "not yet: {t}");
    site.advance(2).await;
    let call = |t: &Value, id: &str| {
        t["calls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["callId"] == id)
            .cloned()
            .unwrap()
    };
    let mut t = site.timeline(&adapter.id()).await;
    for _ in 0..100 {
        if call(&t, &look.call_id)["status"] == "failed" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        t = site.timeline(&adapter.id()).await;
    }
    let c = call(&t, &look.call_id);
    assert_eq!(c["status"], "failed", "{c}");
    assert_eq!(
        c["error"], "tool lookup-ticket timed out after 300 s",
        "{c}"
    );
    assert_eq!(
        t["state"], "Running",
        "a read's timeout leaves the attempt going"
    );
    // The late answer is refused: the call is settled.
    let late = adapter
        .complete(&look.call_id, json!({"open": 2}))
        .await
        .unwrap_err();
    assert!(
        late.message.unwrap_or_default().contains("failed"),
        "late answer"
    );

    // A call with effects: approved, started, then silent past its timeout.
    let page = json!({"message": "checkout down"});
    let ask = adapter
        .begin("tool", "page-oncall", page.clone(), "")
        .await
        .unwrap();
    assert_eq!(ask.outcome, ad::BeginOutcome::APPROVAL_REQUIRED);
    site.decide(&ask.approval_id, true).await;
    let go = adapter
        .begin("tool", "page-oncall", page, &ask.approval_id)
        .await
        .unwrap();
    assert_eq!(go.outcome, ad::BeginOutcome::STARTED);
    site.advance(301).await;
    let mut t = site.timeline(&adapter.id()).await;
    for _ in 0..100 {
        if t["state"] == "Uncertain" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        t = site.timeline(&adapter.id()).await;
    }
    assert_eq!(t["state"], "Uncertain", "{t}");
    assert_eq!(call(&t, &go.call_id)["status"], "uncertain");
}

#[tokio::test]
async fn a_run_exported_for_review_holds_everything_with_hashes_and_opens_offline() {
    let site = Site::start(false).await;
    let run = site.submit(json!({"ticket": "t-1"}), None).await;
    let adapter = site.claim_and_start().await;
    adapter.think_and_look().await;
    adapter.report(good_output()).await.unwrap();
    let response = site
        .a
        .http()
        .get(format!("{}/runtime/runs/{}/export", site.a.url, run.run_id))
        .bearer_auth(&site.token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/gzip");
    let bytes = response.bytes().await.unwrap();
    // Unpacked as a reviewer would, offline.
    let dir = tempfile::tempdir().unwrap();
    tar::Archive::new(flate2::read::GzDecoder::new(&bytes[..]))
        .unpack(dir.path())
        .unwrap();
    let root = dir.path().join(format!("run-{}", run.run_id));
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(root.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["format"], "agentbay.run-export/v1");
    assert_eq!(manifest["runId"], run.run_id);
    // Every file is listed with its hash, and every hash holds.
    let files = manifest["files"].as_array().unwrap();
    let mut listed = std::collections::BTreeSet::new();
    for f in files {
        let path = f["path"].as_str().unwrap();
        let content = std::fs::read(root.join(path)).unwrap();
        use sha2::Digest;
        let hash = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&content)));
        assert_eq!(f["sha256"], hash.as_str(), "{path}");
        assert_eq!(f["bytes"], content.len(), "{path}");
        listed.insert(path.to_string());
    }
    for path in ["index.html", "run.json", "release-verdicts.json"] {
        assert!(listed.contains(path), "{path}: {listed:?}");
    }
    let attempt = format!("attempts/{}.json", adapter.id());
    assert!(listed.contains(&attempt), "{listed:?}");
    // The calls' content is inside, by its hash: what the timeline names.
    let timeline: Value =
        serde_json::from_slice(&std::fs::read(root.join(&attempt)).unwrap()).unwrap();
    let calls = timeline["calls"].as_array().unwrap();
    assert!(!calls.is_empty(), "{timeline}");
    for c in calls {
        let request = c["requestHash"].as_str().unwrap();
        assert!(
            listed.contains(&format!("artifacts/{}", &request[7..])),
            "the request of call {} is in the export",
            c["callId"]
        );
    }
    let html = std::fs::read_to_string(root.join("index.html")).unwrap();
    assert!(
        html.contains(&run.run_id) && html.contains("artifacts/"),
        "{html}"
    );
    assert!(!html.contains("<script"), "the page needs no script");
    // The story, readable without the JSON beside it: the input, each
    // call, the output.
    assert!(
        html.contains("&quot;ticket&quot;: &quot;t-1&quot;")
            || html.contains("&#34;ticket&#34;: &#34;t-1&#34;"),
        "{html}"
    );
    assert!(html.contains("Checkout is down for acme"), "{html}");
    assert!(
        html.contains("Phases:") && html.contains("href=\"artifacts/"),
        "{html}"
    );
    // The command line writes the same file through the running appliance.
    let file = dir.path().join("by-cli.tar.gz");
    let out = crate::common::run(
        crate::common::agentbay()
            .args([
                "run",
                "export",
                &run.run_id,
                "--tenant",
                &run.tenant_id,
                "-o",
            ])
            .arg(&file)
            .arg("--data-dir")
            .arg(&site.a.data_dir),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names = Vec::new();
    for entry in tar::Archive::new(flate2::read::GzDecoder::new(
        std::fs::File::open(&file).unwrap(),
    ))
    .entries()
    .unwrap()
    {
        names.push(entry.unwrap().path().unwrap().display().to_string());
    }
    assert!(
        names.iter().any(|n| n.ends_with("manifest.json"))
            && names.iter().any(|n| n.ends_with(&attempt)),
        "{names:?}"
    );
    // Another tenant cannot take it.
    site.a.tenant("globex", "team", &[], &["ops"]).await;
    let reader = site.a.create_client("globex", &["factory.runs.read"]).await;
    let token = site.a.token(&reader).await;
    let r = site
        .a
        .http()
        .get(format!("{}/runtime/runs/{}/export", site.a.url, run.run_id))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

/// The appliance's peak resident memory since the last reset, in bytes,
/// and a reset: what a request made from hostile input costs at most.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

fn reset_peak_rss(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak");
}

/// The review's hostile shapes, within budgets: a checkpoint comparison of
/// two deep states whose every leaf changed lists its budget and counts
/// the rest, and exports of a run of large checkpoints stream, at most two
/// at once for a tenant; the appliance's peak memory is measured around
/// each.
#[tokio::test]
async fn what_the_appliance_builds_from_hostile_checkpoints_stays_within_its_budget() {
    let site = Site::start(false).await;
    let pid = site.a.child.as_ref().unwrap().id();
    crate::console::user(&site.a, "demo", "olga", &["Observer"]).await;
    let run = site.submit(json!({}), None).await;
    let adapter = site.claim_and_start().await;
    // One tool call observed with `state`: a checkpoint of it.
    let checkpoint = |state: String| {
        let adapter = &adapter;
        async move {
            let t = adapter
                .begin("tool", "lookup-ticket", json!({"customer": "a"}), "")
                .await
                .unwrap();
            assert_eq!(t.outcome, ad::BeginOutcome::STARTED, "{}", t.reason);
            adapter
                .client
                .complete_call(ad::CompleteCallRequest {
                    attempt_id: adapter.id(),
                    fencing_token: adapter.ticket.fencing_token,
                    call_id: t.call_id.clone(),
                    ok: true,
                    result_json: "{}".into(),
                    state_json: state,
                    ..Default::default()
                })
                .await
                .unwrap();
        }
    };
    // 100 nested objects of 20-character keys over 15,000 numbers: every
    // leaf's path is 2 KB long.
    let deep = |leaf: u32| {
        let mut v = json!(vec![leaf; 15_000]);
        for i in 0..100 {
            v = json!({ format!("level-{i:014}"): v });
        }
        v.to_string()
    };
    checkpoint(deep(1)).await;
    checkpoint(deep(2)).await;
    let timeline = site
        .a
        .get(&site.token, &format!("/runtime/attempts/{}", adapter.id()))
        .await;
    let sequences: Vec<u64> = timeline["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sequence"].as_u64().unwrap())
        .collect();
    let (from, to) = (
        sequences[sequences.len() - 2],
        sequences[sequences.len() - 1],
    );
    let v = crate::console::Visitor::sign_in(&site.a, "olga").await;
    reset_peak_rss(pid);
    let before = peak_rss(pid);
    let (status, page) = v
        .get(&format!(
            "/attempts/{}/checkpoints?from={from}&to={to}",
            adapter.id()
        ))
        .await;
    let diff_peak = peak_rss(pid).saturating_sub(before);
    assert_eq!(status, 200);
    assert!(
        page.contains("id=\"diff-more\"") && page.contains("and 14,500 more changes"),
        "{}",
        &page[..page.len().min(3000)]
    );
    assert!(page.len() < 1 << 20, "the page is {} bytes", page.len());
    println!(
        "checkpoint comparison: page {} bytes, peak +{} MiB",
        page.len(),
        diff_peak >> 20
    );
    assert!(
        diff_peak < 64 << 20,
        "the comparison took {} MiB",
        diff_peak >> 20
    );

    // Sixteen checkpoints of 0.9 MB each (what the export carries), of
    // text that compresses no better than a real state.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for i in 0..16 {
        let blob: String = (0..900_000)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                char::from(b"0123456789abcdef"[(seed & 15) as usize])
            })
            .collect();
        checkpoint(json!({"n": i, "blob": blob}).to_string()).await;
    }
    let url = format!("{}/runtime/runs/{}/export", site.a.url, run.run_id);
    let http = site.a.http();
    reset_peak_rss(pid);
    let before = peak_rss(pid);
    let (first, second) = (
        http.get(&url)
            .bearer_auth(&site.token)
            .send()
            .await
            .unwrap(),
        http.get(&url)
            .bearer_auth(&site.token)
            .send()
            .await
            .unwrap(),
    );
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    // A third at once is refused, naming the limit.
    let third = http
        .get(&url)
        .bearer_auth(&site.token)
        .send()
        .await
        .unwrap();
    assert_eq!(third.status(), 429);
    let body = third.text().await.unwrap();
    assert!(body.contains("2 run exports in progress"), "{body}");
    let (a, b) = (first.bytes().await.unwrap(), second.bytes().await.unwrap());
    let export_peak = peak_rss(pid).saturating_sub(before);
    assert!(
        a.len() > 100_000 && b.len() > 100_000,
        "{} {}",
        a.len(),
        b.len()
    );
    let mut unpacked = 0u64;
    let mut names = Vec::new();
    for entry in tar::Archive::new(flate2::read::GzDecoder::new(&a[..]))
        .entries()
        .unwrap()
    {
        let entry = entry.unwrap();
        unpacked += entry.header().size().unwrap();
        names.push(entry.path().unwrap().display().to_string());
    }
    assert!(unpacked > 16 * 900_000, "{unpacked}");
    assert!(
        names.last().unwrap().ends_with("manifest.json"),
        "{names:?}"
    );
    println!(
        "two exports of {} MB each at once: peak +{} MiB",
        unpacked / 1_000_000,
        export_peak >> 20
    );
    assert!(
        export_peak < 32 << 20,
        "two exports took {} MiB",
        export_peak >> 20
    );
    // Once they are done, another may start.
    let again = http
        .get(&url)
        .bearer_auth(&site.token)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
}
