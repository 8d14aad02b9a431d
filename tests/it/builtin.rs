//! The builtin adapter: the appliance runs the loop of releases whose
//! adapter is `builtin`, under the same invariants as any adapter.

use std::path::{Path, PathBuf};

use agentbay::control::{Transport, pinned_transport};
use agentbay::proto::agentbay::runs::v1 as rn;
use connectrpc::CodecFormat;
use connectrpc::client::ClientConfig;
use serde_json::{Value, json};

use crate::common::{Appliance, Credential, agentbay, run};
use crate::releases::{demo_key, example, pack, upload};

/// A builtin release: the triage example with `responses` as its scripted
/// model, and `edit` applied to its manifest.
fn release(
    root: &Path,
    id: &str,
    responses: Value,
    files: &[(&str, &[u8])],
    edit: impl FnOnce(&mut Value),
) -> PathBuf {
    let dir = root.join(id);
    crate::common::copy_tree(&example(), &dir);
    for (path, bytes) in files {
        let target = dir.join(path);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, bytes).unwrap();
    }
    std::fs::write(
        dir.join("model/responses.json"),
        serde_json::to_vec_pretty(&json!({ "responses": responses })).unwrap(),
    )
    .unwrap();
    let path = dir.join("manifest.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    m["releaseId"] = json!(id);
    edit(&mut m);
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let out = run(agentbay()
        .args(["release", "sign"])
        .arg(&dir)
        .arg("--key")
        .arg(demo_key())
        .arg("--update-hashes"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

pub(crate) struct Site {
    pub(crate) a: Appliance,
    pub(crate) cred: Credential,
    pub(crate) token: String,
    dir: tempfile::TempDir,
}

impl Site {
    pub(crate) async fn start() -> Site {
        Site::on(Appliance::start()).await
    }

    pub(crate) async fn on(a: Appliance) -> Site {
        a.tenant("demo", "team", &[], &["support"]).await;
        let cred = a
            .create_client(
                "demo",
                &[
                    "factory.runs.read",
                    "factory.runs.write",
                    "factory.runs.decide",
                    "factory.runs.operate",
                    "factory.assets.read",
                    "factory.assets.admin",
                ],
            )
            .await;
        let token = a.token(&cred).await;
        Site {
            a,
            cred,
            token,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// Another tenant on the same appliance, with its project `support`:
    /// a token with the same scopes as the demo's.
    pub(crate) async fn other_tenant(&self, tenant: &str) -> String {
        self.a.tenant(tenant, "team", &[], &["support"]).await;
        let cred = self
            .a
            .create_client(
                tenant,
                &[
                    "factory.runs.read",
                    "factory.runs.write",
                    "factory.assets.read",
                    "factory.assets.admin",
                ],
            )
            .await;
        // Its own publisher key, trusted for it alone.
        let key = self.dir.path().join(format!("{tenant}-publisher"));
        let out = run(agentbay().args(["release", "keygen", "--out"]).arg(&key));
        assert!(out.status.success());
        let out = run(agentbay()
            .args(["trust", "add", "--name", tenant, "--public-key-file"])
            .arg(key.with_extension("pub"))
            .args(["--tenant", tenant, "--data-dir"])
            .arg(&self.a.data_dir));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.a.token(&cred).await
    }

    /// Imports a release of `tenant` as the holder of `token`, signed by
    /// the key [`Site::other_tenant`] trusted for it.
    pub(crate) async fn import_as(&self, token: &str, tenant: &str, id: &str, responses: Value) {
        self.import_as_with(token, tenant, id, responses, |_| {})
            .await
    }

    /// [`Site::import_as`], its manifest edited by `edit` first.
    pub(crate) async fn import_as_with(
        &self,
        token: &str,
        tenant: &str,
        id: &str,
        responses: Value,
        edit: impl FnOnce(&mut Value),
    ) {
        let dir = release(self.dir.path(), &format!("{id}-as"), responses, &[], |m| {
            m["releaseId"] = json!(id);
            m["tenantId"] = json!(tenant);
            edit(m);
        });
        let key = self.dir.path().join(format!("{tenant}-publisher.key"));
        let out = run(agentbay()
            .args(["release", "sign"])
            .arg(&dir)
            .arg("--key")
            .arg(&key)
            .arg("--update-hashes"));
        assert!(out.status.success());
        let (status, body) = upload(&self.a, token, pack(&dir, |_| {})).await;
        assert_eq!(status, 201, "{body}");
    }

    /// Submits a run as the holder of `token` (another tenant's).
    pub(crate) async fn submit_as(&self, token: &str, release: &str) -> String {
        self.submit_with(token, release).await
    }

    pub(crate) async fn import(&self, id: &str, responses: Value, edit: impl FnOnce(&mut Value)) {
        let (status, body) = self.try_import(id, responses, &[], edit).await;
        assert_eq!(status, 201, "{body}");
    }

    /// Imports a release with extra files in its bundle (list them in the
    /// manifest's `toolFiles`); the status and the answer.
    pub(crate) async fn try_import(
        &self,
        id: &str,
        responses: Value,
        files: &[(&str, &[u8])],
        edit: impl FnOnce(&mut Value),
    ) -> (u16, Value) {
        let dir = release(self.dir.path(), id, responses, files, edit);
        upload(&self.a, &self.token, pack(&dir, |_| {})).await
    }

    fn runs(&self) -> rn::RunsClient<Transport> {
        self.runs_as(&self.token)
    }

    fn runs_as(&self, token: &str) -> rn::RunsClient<Transport> {
        let config = ClientConfig::new(self.a.url.parse().unwrap())
            .with_codec_format(CodecFormat::Json)
            .with_default_header("authorization", format!("Bearer {token}"));
        rn::RunsClient::new(pinned_transport(&self.a.fingerprint), config)
    }

    pub(crate) async fn submit(&self, release: &str) -> String {
        self.submit_with(&self.token, release).await
    }

    async fn submit_with(&self, token: &str, release: &str) -> String {
        let r = self
            .runs_as(token)
            .submit_run(rn::SubmitRunRequest {
                project_id: "support".into(),
                release_id: release.into(),
                input_json: json!({"customer": "acme", "text": "checkout is slow"}).to_string(),
                ..Default::default()
            })
            .await
            .expect("submit")
            .into_owned();
        r.run.as_option().unwrap().run_id.clone()
    }

    /// A run as the holder of `token` (another tenant's) reads it, again
    /// while the appliance says to come back.
    pub(crate) async fn run_as(&self, token: &str, run_id: &str) -> rn::Run {
        let runs = self.runs_as(token);
        let read = loop {
            let read = runs
                .get_run(rn::GetRunRequest {
                    run_id: run_id.into(),
                    ..Default::default()
                })
                .await;
            match read {
                Err(e) if crate::common::told_to_come_back(&e) => {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                read => break read,
            }
        };
        read.expect("get run")
            .into_owned()
            .run
            .as_option()
            .unwrap()
            .clone()
    }

    pub(crate) async fn run(&self, run_id: &str) -> rn::Run {
        self.run_as(&self.token, run_id).await
    }

    /// Waits until the run's last attempt is in `state` (or the run is).
    /// For an ended state, until the run has ended too: an attempt ends
    /// a moment before its run records the outcome.
    pub(crate) async fn until(&self, run_id: &str, state: &str) -> rn::Run {
        const ENDED: [&str; 3] = ["Succeeded", "Failed", "Cancelled"];
        for _ in 0..300 {
            let r = self.run(run_id).await;
            let a = r.steps[0].attempts.last().map(|a| a.state.clone());
            let reached = a.as_deref() == Some(state) || r.state == state;
            if reached && (!ENDED.contains(&state) || ENDED.contains(&r.state.as_str())) {
                return r;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!(
            "run {run_id} never reached {state}: {:?}",
            self.run(run_id).await
        );
    }

    pub(crate) async fn timeline(&self, attempt_id: &str) -> Value {
        self.a
            .get(&self.token, &format!("/runtime/attempts/{attempt_id}"))
            .await
    }

    /// What served each model call of the run's first attempt
    /// (`servedBy`, in order).
    pub(crate) async fn served_by(&self, run: &rn::Run) -> Vec<String> {
        let t = self.timeline(&run.steps[0].attempts[0].attempt_id).await;
        t["calls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["kind"] == "model")
            .map(|c| c["servedBy"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// Waits until the attempt's timeline satisfies `ready`, and returns it
    /// (the last one read when it never does, for the caller's assertion).
    pub(crate) async fn timeline_until(
        &self,
        attempt_id: &str,
        ready: impl Fn(&Value) -> bool,
    ) -> Value {
        let mut t = self.timeline(attempt_id).await;
        for _ in 0..200 {
            if ready(&t) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            t = self.timeline(attempt_id).await;
        }
        t
    }
}

/// The calls of an attempt's timeline to `target`, in order.
pub(crate) fn calls_to(timeline: &Value, target: &str) -> Vec<Value> {
    timeline["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["target"] == target)
        .cloned()
        .collect()
}

pub(crate) fn answer(severity: &str, paged: bool) -> Value {
    json!({"content": json!({"severity": severity, "summary": "checked", "paged": paged}).to_string()})
}

#[tokio::test]
async fn the_appliance_runs_a_builtin_release_to_a_verified_outcome() {
    let site = Site::start().await;
    site.import(
        "triage-ok",
        json!([
            {"content": "Looking", "toolCalls": [
                {"tool": "lookup-ticket", "arguments": {"customer": "acme"}},
                {"tool": "rm-rf", "arguments": {}}
            ]},
            answer("medium", false)
        ]),
        |m| m["tools"][0]["needsSandbox"] = json!(true),
    )
    .await;
    let run_id = site.submit("triage-ok").await;
    let run = site.until(&run_id, "Succeeded").await;
    assert_eq!(run.state, "Succeeded", "{run:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&run.output_json).unwrap()["severity"],
        "medium"
    );
    let t = site.timeline(&run.steps[0].attempts[0].attempt_id).await;
    let calls = t["calls"].as_array().unwrap();
    let kinds: Vec<(&str, &str)> = calls
        .iter()
        .map(|c| (c["target"].as_str().unwrap(), c["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("triage-scripted", "completed"),
            ("lookup-ticket", "completed"),
            ("rm-rf", "failed"),
            ("triage-scripted", "completed"),
        ]
    );
    assert!(
        calls[2]["error"]
            .as_str()
            .unwrap()
            .contains("outside the release's closure")
    );
    assert!(
        calls[0]["receiptRef"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    assert_eq!(t["adapterVersion"], "builtin/1");
    // Every phase of the loop is on the timeline, each with its duration:
    // the context is built before each model call, and the loop's
    // checkpoints are written in Checkpointing.
    let phases: Vec<&str> = t["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    let position = |name: &str| phases.iter().position(|p| *p == name);
    let building = position("BuildingContext").expect("BuildingContext is on the timeline");
    assert_eq!(phases[building + 1], "Calling", "{phases:?}");
    assert!(position("Checkpointing").is_some(), "{phases:?}");
    assert!(
        phases.iter().filter(|p| **p == "BuildingContext").count() >= 2,
        "one context per model call: {phases:?}"
    );
    for p in t["phases"].as_array().unwrap() {
        assert!(p["durationMs"].as_i64().unwrap() >= 0, "{p}");
    }
    let checkpoints = t["checkpoints"].as_array().unwrap();
    assert!(
        checkpoints.iter().any(|c| c["phase"] == "Checkpointing"),
        "the loop's checkpoints record the phase they were written in: {checkpoints:?}"
    );
    // The sandboxed tool ran under a capacity lease of kind sandbox.
    let admin = site.a.admin_token().await;
    let leases = site
        .a
        .get(
            &admin,
            "/factory/capacity/leases?tenant=demo&state=released",
        )
        .await;
    let attempt_id = run.steps[0].attempts[0].attempt_id.clone();
    assert!(
        leases["leases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["holderKind"] == "sandbox"
                && l["holderId"].as_str().unwrap().starts_with(&attempt_id)),
        "{leases}"
    );
    let checkpoints = t["checkpoints"].as_array().unwrap();
    assert!(checkpoints.len() >= 4, "{checkpoints:?}");
    assert!(
        checkpoints
            .iter()
            .all(|c| c["adapterVersion"] == "builtin/1")
    );

    // What each call asked and answered, from the artifact store.
    let call = |i: usize| {
        let path = format!(
            "/runtime/attempts/{attempt_id}/calls/{}",
            calls[i]["callId"].as_str().unwrap()
        );
        let (a, token) = (&site.a, site.token.clone());
        async move { a.get(&token, &path).await }
    };
    let first = call(0).await;
    let roles: Vec<&str> = first["content"]["conversation"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user"], "{first}");
    let asked: Vec<&str> = first["content"]["reply"]["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tool"].as_str().unwrap())
        .collect();
    assert_eq!(asked, ["lookup-ticket", "rm-rf"], "{first}");
    assert_eq!(
        first["content"]["receipt"]["json"]["schema"],
        "model-invocation-v1"
    );
    let lookup = call(1).await;
    assert_eq!(
        lookup["content"]["request"]["json"],
        json!({"customer": "acme"})
    );
    assert_eq!(lookup["content"]["result"]["state"], "present", "{lookup}");
    assert_eq!(lookup["requestHash"], calls[1]["requestHash"]);
    let last = call(3).await;
    let answered: Vec<&str> = last["content"]["conversation"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["answers"].as_str().unwrap_or(""))
        .collect();
    assert!(answered.contains(&"lookup-ticket"), "{last}");

    // The whole artifact: as stored, sandboxed, the tenant's only.
    let hash = calls[1]["requestHash"].as_str().unwrap();
    let whole = site
        .a
        .http()
        .get(format!("{}/runtime/artifacts/{hash}", site.a.url))
        .bearer_auth(&site.token)
        .send()
        .await
        .unwrap();
    assert_eq!(whole.status(), 200);
    assert_eq!(whole.headers()["content-type"], "application/json");
    assert!(
        whole.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .starts_with("sandbox"),
    );
    assert_eq!(
        whole.json::<Value>().await.unwrap(),
        json!({"customer": "acme"})
    );
    let bad = site
        .a
        .http()
        .get(format!("{}/runtime/artifacts/sha256:nothex", site.a.url))
        .bearer_auth(&site.token)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("hash"));
    site.a.tenant("other", "team", &[], &["p"]).await;
    let other = site.a.create_client("other", &["factory.runs.read"]).await;
    let other = site.a.token(&other).await;
    for path in [
        format!("/runtime/artifacts/{hash}"),
        format!(
            "/runtime/attempts/{attempt_id}/calls/{}",
            calls[1]["callId"].as_str().unwrap()
        ),
    ] {
        let response = site
            .a
            .http()
            .get(format!("{}{path}", site.a.url))
            .bearer_auth(&other)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{path} from another tenant");
    }

    // The console's attempt page shows the same, readable.
    crate::console::user(&site.a, "demo", "vera", &["Observer"]).await;
    let vera = crate::console::Visitor::sign_in(&site.a, "vera").await;
    let (status, page) = vera.get(&format!("/attempts/{attempt_id}")).await;
    assert_eq!(status, 200);
    let page = crate::console::html_unescape(&page);
    for expected in [
        "conversation and reply of call 1",
        "asks for <b>lookup-ticket</b>",
        "\"customer\": \"acme\"",
        &format!("href=\"/artifacts/{hash}\""),
    ] {
        assert!(page.contains(expected), "{expected} not on the page");
    }
    let (status, body) = vera.get(&format!("/artifacts/{hash}")).await;
    assert_eq!((status, body.as_str()), (200, "{\"customer\":\"acme\"}"));
}

#[tokio::test]
async fn a_gated_tool_waits_for_approval_and_corrections_run_out() {
    let site = Site::start().await;
    site.import(
        "triage-page",
        json!([
            {"content": "Paging", "toolCalls": [{"tool": "page-oncall", "arguments": {"message": "checkout down"}}]},
            answer("high", true)
        ]),
        |_| {},
    )
    .await;
    site.import(
        "triage-bad",
        json!([
            {"content": "{\"severity\": \"urgent\"}"},
            {"content": "not json at all"},
            {"content": "{\"severity\": \"high\", \"summary\": \"\", \"paged\": false}"}
        ]),
        |_| {},
    )
    .await;
    let paged = site.submit("triage-page").await;
    let bad = site.submit("triage-bad").await;

    let waiting = site.until(&paged, "WaitingForDecision").await;
    let attempt = waiting.steps[0].attempts[0].attempt_id.clone();
    let t = site.timeline(&attempt).await;
    assert!(t["waitingReason"].as_str().unwrap().contains("page-oncall"));
    // What is asked, structured, in every read of the waiting attempt.
    let pending = waiting.steps[0].attempts[0]
        .pending_decision
        .as_option()
        .expect("GetRun shows the pending decision")
        .clone();
    assert_eq!(pending.kind, "approval");
    assert_eq!(
        pending.decision_id,
        waiting.steps[0].attempts[0].pending_decision_id
    );
    let call = pending
        .proposed_call
        .as_option()
        .expect("the proposed call");
    assert_eq!(call.kind, "tool");
    assert_eq!(call.target, "page-oncall");
    assert!(!call.side_effect_class.is_empty());
    let arguments: serde_json::Value = serde_json::from_str(&call.arguments_json).unwrap();
    assert_eq!(arguments, json!({"message": "checkout down"}));
    assert!(!pending.expires_at.is_empty());
    let rest = &t["pendingDecision"];
    assert_eq!(rest["decisionId"], pending.decision_id.as_str());
    assert_eq!(rest["approvalId"], pending.approval_id.as_str());
    assert_eq!(rest["proposedCall"]["arguments"], arguments);
    // Neither id: the error names the field.
    let err = site
        .runs()
        .decide_approval(rn::DecideApprovalRequest {
            approve: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("decisionId"), "{err}");
    // Decided by the decision id ListRuns and GetRun show.
    site.runs()
        .decide_approval(rn::DecideApprovalRequest {
            decision_id: pending.decision_id.clone(),
            approve: true,
            reason: "yes".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let done = site.until(&paged, "Succeeded").await;
    assert_eq!(done.state, "Succeeded");
    let t = site.timeline(&attempt).await;
    let page = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["target"] == "page-oncall" && c["status"] == "completed")
        .cloned()
        .expect("the approved page ran");
    assert!(
        page["preCheckpointId"].is_string(),
        "a checkpoint precedes the gated call"
    );
    assert!(page["approvalId"].is_string());

    let failed = site.until(&bad, "Failed").await;
    let a = &failed.steps[0].attempts[0];
    assert_eq!(a.failure_class, "validation");
    assert_eq!(a.correction_count, 2);
    assert_eq!(failed.state, "Failed");
}

/// The pending decision of a run that waits for one.
async fn pending_of(site: &Site, run: &str) -> rn::PendingDecision {
    let waiting = site.until(run, "WaitingForDecision").await;
    waiting.steps[0].attempts[0]
        .pending_decision
        .as_option()
        .expect("a pending decision")
        .clone()
}

#[tokio::test]
async fn a_reviewer_approves_a_call_with_changed_arguments_where_the_policy_allows_and_that_call_is_made()
 {
    let site = Site::start().await;
    let page = json!([
        {"content": "Paging", "toolCalls": [{"tool": "page-oncall", "arguments": {"message": "checkout down"}}]},
        answer("high", true)
    ]);
    site.import("triage-fixed", page.clone(), |_| {}).await;
    site.import("triage-editable", page, |m| {
        m["policy"]["editable"] = json!(["page-oncall"]);
    })
    .await;
    let decide = |decision: &str, arguments: &str| rn::DecideApprovalRequest {
        decision_id: decision.to_string(),
        approve: true,
        reason: "page the database team instead".into(),
        arguments_json: arguments.to_string(),
        ..Default::default()
    };

    // A release whose policy does not list the tool: its arguments stand.
    let fixed = site.submit("triage-fixed").await;
    let pending = pending_of(&site, &fixed).await;
    let err = site
        .runs()
        .decide_approval(decide(&pending.decision_id, r#"{"message": "other"}"#))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("policy.editable"), "{err}");

    // Where it does: arguments that do not fit the tool are refused,
    // naming them; fitting ones are approved, and that call is made.
    let editable = site.submit("triage-editable").await;
    let pending = pending_of(&site, &editable).await;
    let err = site
        .runs()
        .decide_approval(decide(&pending.decision_id, r#"{"text": "no message"}"#))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("arguments") && err.to_string().contains("message"),
        "{err}"
    );
    let edited = json!({"message": "database down: page the DBA on call"});
    site.runs()
        .decide_approval(decide(&pending.decision_id, &edited.to_string()))
        .await
        .unwrap();
    let done = site.until(&editable, "Succeeded").await;
    let attempt = &done.steps[0].attempts[0].attempt_id;
    let t = site.timeline(attempt).await;
    let pages = calls_to(&t, "page-oncall");
    assert_eq!(pages.len(), 1, "one call, the approved one: {pages:?}");
    let made = site
        .a
        .get(
            &site.token,
            &format!(
                "/runtime/attempts/{attempt}/calls/{}",
                pages[0]["callId"].as_str().unwrap()
            ),
        )
        .await;
    assert_eq!(made["content"]["request"]["json"], edited, "{made}");
    // The decision keeps what was proposed and what was approved.
    let decision = &t["decisions"][0];
    assert_eq!(decision["status"], "approved");
    assert_eq!(
        decision["answeredBy"].as_str().map(|s| !s.is_empty()),
        Some(true)
    );
    assert_eq!(decision["reason"], "page the database team instead");
    assert!(decision["editedRequestHash"].is_string(), "{decision}");
    assert_ne!(
        decision["editedRequestHash"], decision["proposal"]["requestHash"],
        "{decision}"
    );
}

#[tokio::test]
async fn a_reviewer_responds_instead_of_approving_and_the_loop_goes_on_without_the_call() {
    let site = Site::start().await;
    site.import(
        "triage-respond",
        json!([
            {"content": "Paging", "toolCalls": [{"tool": "page-oncall", "arguments": {"message": "checkout down"}}]},
            answer("medium", false)
        ]),
        |_| {},
    )
    .await;
    let run = site.submit("triage-respond").await;
    let pending = pending_of(&site, &run).await;
    // A response needs words for the agent.
    let err = site
        .runs()
        .decide_approval(rn::DecideApprovalRequest {
            decision_id: pending.decision_id.clone(),
            respond: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("reason"), "{err}");
    site.runs()
        .decide_approval(rn::DecideApprovalRequest {
            decision_id: pending.decision_id.clone(),
            respond: true,
            reason: "no page: the payments team is already on it".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let done = site.until(&run, "Succeeded").await;
    let attempt = &done.steps[0].attempts[0].attempt_id;
    let t = site.timeline(attempt).await;
    assert!(
        calls_to(&t, "page-oncall")
            .iter()
            .all(|c| c["status"] != "completed"),
        "the call was not made: {t}"
    );
    let decision = &t["decisions"][0];
    assert_eq!(decision["status"], "rejected");
    assert_eq!(decision["responded"], true);
    // The model's next turn heard the reviewer.
    let last_model = calls_to(&t, "triage-scripted").last().cloned().unwrap();
    let content = site
        .a
        .get(
            &site.token,
            &format!(
                "/runtime/attempts/{attempt}/calls/{}",
                last_model["callId"].as_str().unwrap()
            ),
        )
        .await;
    assert!(
        content
            .to_string()
            .contains("the payments team is already on it"),
        "{content}"
    );
}

#[tokio::test]
async fn kill_9_during_a_builtin_loop_resumes_or_settles_and_reissues_nothing() {
    let mut site = Site::start().await;
    // A slow read tool: abandoned by the crash, the attempt resumes.
    site.import(
        "triage-slow-read",
        json!([
            {"content": "wait", "toolCalls": [{"tool": "lookup-ticket", "arguments": {"customer": "acme", "ms": 4000}}]},
            answer("low", false)
        ]),
        |m| m["tools"][0]["name"] = json!("sleep"),
    )
    .await;
    // A slow shared-write tool (allowed without approval): in flight at
    // the crash, its effect cannot be confirmed.
    site.import(
        "triage-slow-write",
        json!([
            {"content": "page", "toolCalls": [{"tool": "page-oncall", "arguments": {"message": "m", "ms": 4000}}]},
            answer("high", true)
        ]),
        |m| {
            m["tools"][1]["name"] = json!("sleep");
            m["policy"]["tools"] = json!({"page-oncall": "allow"});
        },
    )
    .await;
    let read = site.submit("triage-slow-read").await;
    let write = site.submit("triage-slow-write").await;
    site.until(&read, "WaitingForTool").await;
    site.until(&write, "WaitingForTool").await;
    site.a.kill9();
    site.a.restart();
    site.token = site.a.token(&site.cred).await;

    let resumed = site.until(&read, "Succeeded").await;
    assert_eq!(resumed.steps[0].attempts.len(), 1, "resumed, not restarted");
    let a = &resumed.steps[0].attempts[0];
    assert_eq!(a.fencing_token, 2, "the resumed loop holds the next token");
    let t = site.timeline(&a.attempt_id).await;
    let statuses: Vec<&str> = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert!(statuses.contains(&"abandoned"), "{statuses:?}");

    let settled = site.until(&write, "Uncertain").await;
    assert_eq!(settled.state, "Uncertain");
    let t = site
        .timeline(&settled.steps[0].attempts[0].attempt_id)
        .await;
    let pages = calls_to(&t, "page-oncall");
    assert_eq!(pages.len(), 1, "the unconfirmed call is not made again");
    assert_eq!(pages[0]["status"], "uncertain");
}

#[tokio::test]
async fn a_zero_config_start_shows_the_demo_runs_once() {
    let mut a = Appliance::start_with(&[], &[("AGENTBAY_DEMO__ENABLED", "true")]);
    let cred = a.create_client("demo", &["factory.runs.read"]).await;
    let token = a.token(&cred).await;
    let list = |a: &Appliance, token: String| {
        let config = ClientConfig::new(a.url.parse().unwrap())
            .with_codec_format(CodecFormat::Json)
            .with_default_header("authorization", format!("Bearer {token}"));
        let client = rn::RunsClient::new(pinned_transport(&a.fingerprint), config);
        async move {
            client
                .list_runs(rn::ListRunsRequest::default())
                .await
                .unwrap()
                .into_owned()
                .runs
        }
    };
    let mut states = Vec::new();
    for _ in 0..200 {
        let runs = list(&a, token.clone()).await;
        states = runs
            .iter()
            .map(|r| {
                let at = &r.steps[0].attempts[0];
                (
                    r.release_id.clone(),
                    at.state.clone(),
                    at.failure_class.clone(),
                )
            })
            .collect::<Vec<_>>();
        states.sort();
        if states.len() == 4
            && states
                .iter()
                .all(|(_, s, _)| s == "Succeeded" || s == "WaitingForDecision" || s == "Failed")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        states,
        vec![
            ("triage-1.0.0".into(), "Succeeded".into(), String::new()),
            (
                "triage-approval-1.0.0".into(),
                "WaitingForDecision".into(),
                String::new()
            ),
            (
                "triage-corrections-1.0.0".into(),
                "Failed".into(),
                "validation".into()
            ),
            (
                "triage-question-1.0.0".into(),
                "WaitingForDecision".into(),
                String::new()
            ),
        ]
    );
    let banner = std::fs::read_to_string(a.root.join("serve.out")).unwrap();
    assert!(
        banner.contains("demo: tenant demo with 4 example runs")
            && banner.contains("asks the support lead a question"),
        "{banner}"
    );
    a.kill9();
    a.restart();
    let token = a.token(&cred).await;
    let runs = list(&a, token).await;
    assert_eq!(runs.len(), 4, "seeded once");

    // The question survives the restart; an answer outside its schema is
    // refused by name, a good one is the model's observation.
    let question = runs
        .iter()
        .find(|r| r.release_id == "triage-question-1.0.0")
        .unwrap();
    let attempt = &question.steps[0].attempts[0];
    let pending = attempt.pending_decision.as_option().unwrap().clone();
    assert_eq!(pending.kind, "input");
    assert!(pending.question.contains("How many"), "{pending:?}");
    assert!(pending.answer_schema_json.contains("affectedUsers"));
    let reviewer = a
        .create_client("demo", &["factory.runs.decide", "factory.runs.read"])
        .await;
    let token = a.token(&reviewer).await;
    let answer = |json: &str| {
        let (a, token) = (&a, token.clone());
        let body = serde_json::json!({
            "attemptId": attempt.attempt_id, "decisionId": pending.decision_id, "answerJson": json,
        });
        async move {
            a.http()
                .post(format!(
                    "{}/agentbay.runtime.v1.Runtime/AnswerDecision",
                    a.url
                ))
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    let refused = answer(r#"{"affectedUsers": "many"}"#).await;
    assert_eq!(refused.status(), 400);
    let text = refused.text().await.unwrap();
    assert!(
        text.contains("answerJson") && text.contains("answer schema"),
        "{text}"
    );
    let ok = answer(r#"{"affectedUsers": 40, "since": "09:00"}"#).await;
    assert_eq!(ok.status(), 200, "{}", ok.text().await.unwrap());
    let admin = a.admin_token().await;
    let mut t = Value::Null;
    for _ in 0..200 {
        t = a
            .get(
                &admin,
                &format!("/runtime/attempts/{}?tenant=demo", attempt.attempt_id),
            )
            .await;
        if t["state"] == "Succeeded" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(t["state"], "Succeeded", "{t}");
}

#[tokio::test]
async fn the_builtin_loop_escalates_and_the_policy_decides_whether_it_may_ask() {
    let site = Site::start().await;
    let escalate = |id: &str, class: &str| {
        let class = class.to_string();
        let id = id.to_string();
        move |m: &mut Value| {
            m["releaseId"] = json!(id);
            m["tools"].as_array_mut().unwrap().push(json!({
                "id": "escalate-to-lead", "transport": "builtin", "name": "escalate",
                "sideEffectClass": class, "description": "Hands a choice to the lead.",
                "inputSchema": {"type": "object", "required": ["question", "options"]},
            }));
            m["policy"]["sideEffects"]["production"] = json!("deny");
        }
    };
    let script = json!([
        {"content": "Two ways to go", "toolCalls": [{"tool": "escalate-to-lead", "arguments": {
            "question": "Roll back the release or wait for the fix?",
            "options": ["roll back", "wait"], "recommendation": "roll back"}}]},
        answer("high", false)
    ]);
    site.import(
        "triage-escalate",
        script.clone(),
        escalate("triage-escalate", "read"),
    )
    .await;
    site.import(
        "triage-denied",
        script,
        escalate("triage-denied", "production"),
    )
    .await;

    let run = site.submit("triage-escalate").await;
    let waiting = site.until(&run, "WaitingForDecision").await;
    let pending = waiting.steps[0].attempts[0]
        .pending_decision
        .as_option()
        .unwrap()
        .clone();
    assert_eq!(pending.kind, "escalation");
    assert_eq!(pending.options, ["roll back", "wait"]);
    assert_eq!(pending.recommendation, "roll back");
    assert!(pending.question.contains("Roll back"), "{pending:?}");
    let body = json!({
        "attemptId": waiting.steps[0].attempts[0].attempt_id,
        "decisionId": pending.decision_id, "choice": "wait",
    });
    let r = site
        .a
        .http()
        .post(format!(
            "{}/agentbay.runtime.v1.Runtime/AnswerDecision",
            site.a.url
        ))
        .bearer_auth(&site.token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let done = site.until(&run, "Succeeded").await;
    assert_eq!(done.state, "Succeeded");
    // The choice came back to the model as the tool's observation.
    let t = site
        .timeline(&waiting.steps[0].attempts[0].attempt_id)
        .await;
    assert_eq!(t["decisions"][0]["choice"], "wait", "{t}");
    assert_eq!(
        t["decisions"][0]["toolCallId"]
            .as_str()
            .map(|s| !s.is_empty()),
        Some(true),
        "{t}"
    );

    // A policy that denies the tool's class: the model is told, nobody is
    // asked.
    let run = site.submit("triage-denied").await;
    let done = site.until(&run, "Succeeded").await;
    let t = site.timeline(&done.steps[0].attempts[0].attempt_id).await;
    assert!(
        t["decisions"].as_array().unwrap().is_empty(),
        "nobody was asked: {t}"
    );
}

/// One scripted answer of the test model server.
#[derive(Clone)]
enum Reply {
    /// 200 with a chat completion: text content, or tool calls.
    Chat(Value),
    /// This status and body.
    Status(u16, &'static str),
    /// Nothing for this long, then a chat completion.
    Slow(u64, Value),
    /// 200 with these chat completion chunks as server-sent events, then
    /// `data: [DONE]`, each after `ms`.
    Stream(u64, Vec<Value>),
    /// 200, the first of these chunks, then nothing for ever.
    Stall(Value),
}

/// An OpenAI-compatible chat-completions server on an ephemeral port that
/// answers from a script and records what it was asked.
struct ModelServer {
    url: String,
    requests: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
    /// The requests it is answering now, and the most it answered at once.
    load: std::sync::Arc<(
        std::sync::atomic::AtomicUsize,
        std::sync::atomic::AtomicUsize,
    )>,
    /// The server's task: aborted, it stops listening.
    serving: tokio::task::JoinHandle<()>,
}

impl ModelServer {
    /// Stops listening (a restart's first half): its port refuses
    /// connections until a server is bound there again.
    async fn stop(self) -> std::net::SocketAddr {
        self.serving.abort();
        let _ = self.serving.await;
        self.url
            .trim_start_matches("http://")
            .trim_end_matches("/v1")
            .parse()
            .unwrap()
    }

    /// A site whose network allowlist names this server by its exact
    /// `host:port` (it listens on loopback).
    async fn site(&self) -> Site {
        self.site_with(&[]).await
    }

    /// [`ModelServer::site`] with more environment.
    async fn site_with(&self, env: &[(&str, &str)]) -> Site {
        let host_port = self
            .url
            .trim_start_matches("http://")
            .trim_end_matches("/v1")
            .to_string();
        let mut all = vec![("AGENTBAY_RUNTIME__NETWORK_ALLOW", host_port.as_str())];
        all.extend_from_slice(env);
        Site::on(Appliance::start_with(&[], &all)).await
    }
}

async fn model_server(script: Vec<Reply>) -> ModelServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    model_server_on(listener, script).await
}

/// [`model_server`] on `listener`: a server that comes up where one was
/// down.
async fn model_server_on(listener: tokio::net::TcpListener, script: Vec<Reply>) -> ModelServer {
    use axum::extract::State;
    use axum::response::IntoResponse;
    use futures::StreamExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    type Shared = (
        std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<Reply>>>,
        std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
        std::sync::Arc<(AtomicUsize, AtomicUsize)>,
    );
    async fn chat(
        State((script, seen, load)): State<Shared>,
        headers: axum::http::HeaderMap,
        body: axum::Json<Value>,
    ) -> axum::response::Response {
        // Requests being answered now, and the most at once.
        let now = load.0.fetch_add(1, Ordering::SeqCst) + 1;
        load.1.fetch_max(now, Ordering::SeqCst);
        let answer = answer_chat(script, seen, headers, body).await;
        load.0.fetch_sub(1, Ordering::SeqCst);
        answer
    }
    async fn answer_chat(
        script: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<Reply>>>,
        seen: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
        headers: axum::http::HeaderMap,
        body: axum::Json<Value>,
    ) -> axum::response::Response {
        // The request as asked, with the attempt's fence headers under
        // `_headers`.
        let mut request = body.0;
        request["_headers"] = headers
            .iter()
            .filter(|(k, _)| k.as_str().starts_with("agentbay-"))
            .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap())))
            .collect::<serde_json::Map<_, _>>()
            .into();
        seen.lock().unwrap().push(request);
        let next = script.lock().unwrap().pop_front();
        match next {
            Some(Reply::Chat(v)) => axum::Json(v).into_response(),
            Some(Reply::Status(code, text)) => {
                (axum::http::StatusCode::from_u16(code).unwrap(), text).into_response()
            }
            Some(Reply::Slow(ms, v)) => {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                axum::Json(v).into_response()
            }
            Some(Reply::Stream(ms, chunks)) => {
                let events = chunks
                    .into_iter()
                    .map(|c| format!("data: {c}\n\n"))
                    .chain(["data: [DONE]\n\n".to_string()]);
                let body = futures::stream::iter(events).then(move |e| async move {
                    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                    Ok::<_, std::convert::Infallible>(e)
                });
                (
                    [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                    axum::body::Body::from_stream(body),
                )
                    .into_response()
            }
            Some(Reply::Stall(first)) => {
                let body = futures::stream::iter([Ok::<_, std::convert::Infallible>(format!(
                    "data: {first}\n\n"
                ))])
                .chain(futures::stream::pending());
                (
                    [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                    axum::body::Body::from_stream(body),
                )
                    .into_response()
            }
            None => (axum::http::StatusCode::GONE, "script over").into_response(),
        }
    }
    let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let load = std::sync::Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let state: Shared = (
        std::sync::Arc::new(std::sync::Mutex::new(script.into())),
        requests.clone(),
        load.clone(),
    );
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(chat))
        .with_state(state);
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let serving = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    ModelServer {
        url,
        requests,
        load,
        serving,
    }
}

fn completion(content: Option<&str>, tool_calls: Value) -> Value {
    json!({
        "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": tool_calls}}],
        "usage": {"prompt_tokens": 321, "completion_tokens": 12},
    })
}

fn openai_profile(url: &str) -> impl FnOnce(&mut Value) + '_ {
    move |m: &mut Value| {
        m["modelProfile"] = json!({
            "id": "site-llm",
            "kind": "openai-compatible",
            "endpoint": url,
            "model": "test-model",
            "timeoutSeconds": 1,
            "responses": m["modelProfile"]["responses"].clone(),
        });
    }
}

#[tokio::test]
async fn an_openai_compatible_model_server_drives_the_loop_with_retries_and_corrections() {
    let ok = json!({"severity": "low", "summary": "slow checkout", "paged": false}).to_string();
    let server = model_server(vec![
        Reply::Chat(completion(
            None,
            json!([{"id": "c1", "type": "function", "function": {"name": "lookup-ticket", "arguments": "{\"customer\":\"acme\"}"}}]),
        )),
        Reply::Status(503, "overloaded"),
        Reply::Chat(completion(Some("not json"), Value::Null)),
        Reply::Chat(completion(Some(&ok), Value::Null)),
    ])
    .await;
    let site = server.site().await;
    site.import("triage-llm", json!([]), openai_profile(&server.url))
        .await;
    let run_id = site.submit("triage-llm").await;
    let run = site.until(&run_id, "Succeeded").await;
    assert_eq!(run.state, "Succeeded", "{run:?}");
    let a = &run.steps[0].attempts[0];
    assert_eq!(a.correction_count, 1, "the malformed answer was corrected");
    let t = site.timeline(&a.attempt_id).await;
    let models: Vec<&str> = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "model")
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        models,
        vec!["completed", "failed", "completed", "completed"]
    );

    let requests = server.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 4);
    assert_eq!(requests[0]["model"], "test-model");
    // Every model request carries the attempt's fence: its id, fencing
    // token, the call's id (each call its own) and the policy decision.
    let model_calls: Vec<&Value> = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "model")
        .collect();
    for (request, call) in requests.iter().zip(&model_calls) {
        let h = &request["_headers"];
        assert_eq!(h["agentbay-attempt-id"], a.attempt_id.as_str(), "{h}");
        assert_eq!(h["agentbay-fencing-token"], "1", "{h}");
        assert_eq!(h["agentbay-call-id"], call["callId"], "{h}");
        assert_eq!(
            h["agentbay-policy-decision-id"], call["policyDecisionId"],
            "{h}"
        );
    }
    assert_eq!(requests[0]["tools"][0]["function"]["name"], "lookup-ticket");
    assert_eq!(requests[0]["messages"][0]["role"], "system");
    // The tool result went back to the model with its call id.
    let second = requests[1]["messages"].as_array().unwrap();
    assert!(
        second
            .iter()
            .any(|m| m["role"] == "tool" && m["tool_call_id"] == "c1")
    );
    // The correction told the model what was wrong.
    let last = requests[3]["messages"].as_array().unwrap();
    assert!(last.iter().any(|m| {
        m["role"] == "user"
            && m["content"]
                .as_str()
                .unwrap_or("")
                .contains("output contract")
    }));
}

#[tokio::test]
async fn a_model_server_that_stays_slow_fails_the_attempt_as_transient_and_another_starts() {
    let slow = completion(Some("{}"), Value::Null);
    let ok = json!({"severity": "low", "summary": "fine", "paged": false}).to_string();
    let server = model_server(vec![
        Reply::Slow(1500, slow.clone()),
        Reply::Slow(1500, slow.clone()),
        Reply::Slow(1500, slow),
        Reply::Chat(completion(Some(&ok), Value::Null)),
    ])
    .await;
    let site = server.site().await;
    site.import("triage-slow-llm", json!([]), openai_profile(&server.url))
        .await;
    let run_id = site.submit("triage-slow-llm").await;
    let run = site.until(&run_id, "Succeeded").await;
    assert_eq!(run.steps[0].attempts.len(), 2, "{run:?}");
    let first = &run.steps[0].attempts[0];
    assert_eq!(first.state, "Failed");
    assert_eq!(first.failure_class, "transient");
    assert!(
        first.failure_reason.contains("3 tries"),
        "{}",
        first.failure_reason
    );
    assert_eq!(run.steps[0].attempts[1].fencing_token, 2);
}

/// The MCP test server from npm (`tests/mcp`; `.ci/run` installs it, and
/// the first test that needs it does when it is missing).
fn mcp_server() -> Vec<String> {
    let index = crate::common::npm_package(
        "tests/mcp",
        "node_modules/@modelcontextprotocol/server-everything/dist/index.js",
    );
    vec!["node".into(), index.display().to_string(), "stdio".into()]
}

/// Where the MCP test server's files are: its tools declare it in
/// `readPaths`, and the site allows it (`runtime.tool_read_allow`).
fn mcp_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp")
        .display()
        .to_string()
}

/// A site whose tools may read the MCP test server's files.
async fn mcp_site() -> Site {
    Site::on(Appliance::start_with(
        &[],
        &[("AGENTBAY_RUNTIME__TOOL_READ_ALLOW", &mcp_dir())],
    ))
    .await
}

fn mcp_servers_running() -> usize {
    let out = std::process::Command::new("pgrep")
        .args(["-f", "server-everything/dist/index.js"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[tokio::test]
async fn mcp_tools_over_stdio_pass_the_policy_gate_and_stop_with_the_attempt() {
    let site = mcp_site().await;
    let dir = mcp_dir();
    let server = mcp_server();
    let tools = move |m: &mut Value| {
        m["tools"] = json!([
            {"id": "mcp-echo", "name": "echo", "description": "Echoes", "sideEffectClass": "read",
             "transport": "mcp-stdio", "command": server, "readPaths": [dir],
             "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}},
            {"id": "mcp-sum", "name": "get-sum", "description": "Adds", "sideEffectClass": "external",
             "transport": "mcp-stdio", "command": server, "readPaths": [dir],
             "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}},
            {"id": "mcp-long", "name": "trigger-long-running-operation", "description": "Works long",
             "sideEffectClass": "shared-write", "transport": "mcp-stdio", "command": server, "readPaths": [dir],
             "inputSchema": {"type": "object", "properties": {"duration": {"type": "number"}, "steps": {"type": "number"}}}},
        ]);
        m["policy"]["tools"] = json!({"mcp-long": "allow", "mcp-sum": "deny"});
    };
    site.import(
        "triage-mcp",
        json!([
            {"content": "look", "toolCalls": [
                {"tool": "mcp-echo", "arguments": {"message": "hello"}},
                {"tool": "mcp-sum", "arguments": {"a": 1, "b": 2}}
            ]},
            answer("low", false)
        ]),
        tools.clone(),
    )
    .await;
    let run_id = site.submit("triage-mcp").await;
    let run = site.until(&run_id, "Succeeded").await;
    assert_eq!(run.state, "Succeeded", "{run:?}");
    let t = site.timeline(&run.steps[0].attempts[0].attempt_id).await;
    let calls = t["calls"].as_array().unwrap();
    let echo = calls.iter().find(|c| c["target"] == "mcp-echo").unwrap();
    assert_eq!(echo["status"], "completed");
    assert!(echo["resultHash"].as_str().unwrap().starts_with("sha256:"));
    let sum = calls.iter().find(|c| c["target"] == "mcp-sum").unwrap();
    assert_eq!(sum["status"], "failed");
    assert!(sum["error"].as_str().unwrap().contains("denies"), "{sum}");

    // A long shared-write MCP call, interrupted: Uncertain, and its server
    // process is stopped.
    site.import(
        "triage-mcp-long",
        json!([
            {"content": "work", "toolCalls": [{"tool": "mcp-long", "arguments": {"duration": 30, "steps": 3}}]},
            answer("low", false)
        ]),
        tools,
    )
    .await;
    let run_id = site.submit("triage-mcp-long").await;
    let waiting = site.until(&run_id, "WaitingForTool").await;
    let attempt = waiting.steps[0].attempts[0].attempt_id.clone();
    for _ in 0..100 {
        if mcp_servers_running() > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        mcp_servers_running() > 0,
        "the MCP server runs during the call"
    );
    let config = ClientConfig::new(site.a.url.parse().unwrap())
        .with_codec_format(CodecFormat::Json)
        .with_default_header("authorization", format!("Bearer {}", site.token));
    agentbay::proto::agentbay::runtime::v1::RuntimeClient::new(
        pinned_transport(&site.a.fingerprint),
        config,
    )
    .interrupt(agentbay::proto::agentbay::runtime::v1::InterruptRequest {
        attempt_id: attempt.clone(),
        reason: "stop".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let run = site.until(&run_id, "Uncertain").await;
    assert_eq!(run.state, "Uncertain");
    let mut left = usize::MAX;
    for _ in 0..100 {
        left = mcp_servers_running();
        if left == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        left, 0,
        "the MCP server process was stopped with the attempt"
    );
}

#[tokio::test]
async fn the_model_delegates_to_a_child_run_and_limits_stop_the_loop() {
    let site = Site::start().await;
    site.import(
        "helper",
        json!([{"content": json!({"severity": "low", "summary": "child says fine", "paged": false}).to_string()}]),
        |m| m["agentId"] = json!("helper"),
    )
    .await;
    site.import(
        "supervisor",
        json!([
            {"content": "ask", "toolCalls": [{"tool": "ask-helper", "arguments": {
                "release": "helper", "purpose": "second opinion", "input": {"customer": "acme", "text": "t"}}}]},
            answer("low", false)
        ]),
        |m| {
            m["tools"] = json!([{"id": "ask-helper", "name": "delegate", "description": "Asks the helper agent",
                "sideEffectClass": "read", "transport": "builtin", "inputSchema": {"type": "object"}}]);
        },
    )
    .await;
    let run_id = site.submit("supervisor").await;
    let run = site.until(&run_id, "Succeeded").await;
    assert_eq!(run.state, "Succeeded", "{run:?}");
    let t = site.timeline(&run.steps[0].attempts[0].attempt_id).await;
    let delegation = &t["delegations"][0];
    assert_eq!(delegation["childAgentId"], "helper");
    assert_eq!(delegation["status"], "Succeeded");
    let sub = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "sub-agent")
        .unwrap()
        .clone();
    assert_eq!(sub["status"], "completed");
    let child = site.run(delegation["childRunId"].as_str().unwrap()).await;
    assert_eq!(child.state, "Succeeded");
    assert_eq!(child.depth, 1);

    // A release whose contract allows one model call cannot take two turns.
    site.import(
        "triage-one-call",
        json!([
            {"content": "look", "toolCalls": [{"tool": "lookup-ticket", "arguments": {"customer": "a"}}]},
            answer("low", false)
        ]),
        |m| m["contract"]["limits"]["maxModelCalls"] = json!(1),
    )
    .await;
    let run_id = site.submit("triage-one-call").await;
    let run = site.until(&run_id, "Failed").await;
    let a = &run.steps[0].attempts[0];
    assert_eq!(a.failure_class, "budget", "{}", a.failure_reason);
    assert!(
        a.failure_reason.contains("maxModelCalls 1"),
        "{}",
        a.failure_reason
    );
}

#[tokio::test]
async fn mcp_tools_over_streamable_http_on_the_site() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = std::process::Command::new(&mcp_server()[0])
        .arg(&mcp_server()[1])
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the MCP server never listened on {port}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let url = format!("http://127.0.0.1:{port}/mcp");
    let listed = format!("127.0.0.1:{port}");
    let site = Site::on(Appliance::start_with(
        &[],
        &[("AGENTBAY_RUNTIME__NETWORK_ALLOW", &listed)],
    ))
    .await;
    site.import(
        "triage-mcp-http",
        json!([
            {"content": "add", "toolCalls": [{"tool": "sum", "arguments": {"a": 2, "b": 40}}]},
            answer("low", false)
        ]),
        |m| {
            m["tools"] = json!([{"id": "sum", "name": "get-sum", "description": "Adds", "sideEffectClass": "read",
                "transport": "mcp-http", "url": url,
                "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}]);
        },
    )
    .await;
    let run_id = site.submit("triage-mcp-http").await;
    let run = site.until(&run_id, "Succeeded").await;
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(run.state, "Succeeded", "{run:?}");
    let t = site.timeline(&run.steps[0].attempts[0].attempt_id).await;
    let sum = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["target"] == "sum")
        .unwrap()
        .clone();
    assert_eq!(sum["status"], "completed", "{sum}");
}

#[tokio::test]
async fn a_human_who_takes_long_holds_no_compute_and_the_answer_asks_for_it_again() {
    let site = Site::on(Appliance::start_manual_clock()).await;
    // The agents pool has room for one attempt's CPU: compute, not run
    // slots, is what the runs wait for here.
    let admin = site.a.admin_token().await;
    let (status, body) = site
        .a
        .put(
            &admin,
            "/factory/capacity/pools/agents",
            json!({"kind": "agent-runtime", "securityBoundary": "shared", "region": "local",
                   "nodeProfile": "small", "minSize": 1, "maxSize": 1}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let whole_node = |m: &mut Value| m["contract"]["cpu"] = json!(2.0);
    site.import(
        "triage-page",
        json!([
            {"content": "Paging", "toolCalls": [{"tool": "page-oncall", "arguments": {"message": "checkout down"}}]},
            answer("high", true)
        ]),
        whole_node,
    )
    .await;
    site.import("triage-quick", json!([answer("low", false)]), whole_node)
        .await;
    let reader = site
        .a
        .create_client("demo", &["factory.capacity.read"])
        .await;
    let capacity_token = site.a.token(&reader).await;
    let lease = |id: String| {
        let a = &site.a;
        let token = capacity_token.clone();
        async move {
            a.get(&token, &format!("/factory/capacity/leases/{id}"))
                .await
        }
    };

    // The first run waits for a human while it holds the pool's CPU.
    let paged = site.submit("triage-page").await;
    let waiting = site.until(&paged, "WaitingForDecision").await;
    let attempt = waiting.steps[0].attempts[0].attempt_id.clone();
    let decision = waiting.steps[0].attempts[0].pending_decision_id.clone();
    let t = site.timeline(&attempt).await;
    let first_lease = t["capacity"]["leaseId"].as_str().unwrap().to_string();
    assert_eq!(t["capacity"]["granted"], true);
    let quick = site.submit("triage-quick").await;
    let queued = site.until(&quick, "Claimed").await;
    let quick_attempt = queued.steps[0].attempts[0].attempt_id.clone();
    let qt = site
        .timeline_until(&quick_attempt, |t| {
            t["capacity"]["queuePosition"].is_number()
        })
        .await;
    assert!(
        qt["waitingReason"]
            .as_str()
            .unwrap()
            .contains("pool agents: maxSize 1 reached"),
        "{qt}"
    );

    // Past the grace, the lease goes back: the other run gets it. The
    // first run keeps its run slot.
    site.a.advance(61).await;
    let done = site.until(&quick, "Succeeded").await;
    assert_eq!(done.state, "Succeeded");
    let t = site.timeline(&attempt).await;
    assert_eq!(t["state"], "WaitingForDecision");
    assert_eq!(t["capacity"]["granted"], false, "{t}");
    assert_eq!(t["capacity"]["gaps"][0]["leaseId"], first_lease.as_str());
    assert!(
        t["waitingReason"]
            .as_str()
            .unwrap()
            .contains(&format!("capacity lease {first_lease} given back")),
        "{t}"
    );
    assert_eq!(lease(first_lease.clone()).await["state"], "Released");
    assert_eq!(t["capacity"]["runSlotHeld"], true, "{t}");

    // A third run takes the capacity and waits for its own human.
    let other = site.submit("triage-page").await;
    let other_waiting = site.until(&other, "WaitingForDecision").await;
    let other_decision = other_waiting.steps[0].attempts[0]
        .pending_decision_id
        .clone();

    // The answer asks for compute again, and says that it queues, where
    // and behind what; no call is made meanwhile.
    site.runs()
        .decide_approval(rn::DecideApprovalRequest {
            decision_id: decision.clone(),
            approve: true,
            reason: "go".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let t = site
        .timeline_until(&attempt, |t| t["capacity"]["queuePosition"].is_number())
        .await;
    assert_eq!(t["state"], "Running", "{t}");
    let why = t["waitingReason"].as_str().unwrap();
    assert!(
        why.contains("waiting for capacity again") && why.contains("maxSize 1 reached"),
        "{why}"
    );
    assert_eq!(t["capacity"]["queuePosition"], 1, "{t}");
    assert!(t["capacity"]["gaps"][0]["requestedAt"].is_string(), "{t}");
    assert!(
        !t["calls"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["target"] == "page-oncall" && c["status"] == "completed"),
        "no call without capacity: {t}"
    );

    // The other human is slow too: its lease goes back, and the answered
    // attempt gets capacity and finishes.
    site.a.advance(61).await;
    let done = site.until(&paged, "Succeeded").await;
    assert_eq!(done.state, "Succeeded");
    let t = site.timeline(&attempt).await;
    let gap = &t["capacity"]["gaps"][0];
    assert!(gap["grantedAt"].is_string(), "{t}");
    let second = gap["newLeaseId"].as_str().unwrap();
    assert_ne!(second, first_lease);
    assert_eq!(lease(second.to_string()).await["state"], "Released");
    let o = site
        .timeline(&other_waiting.steps[0].attempts[0].attempt_id)
        .await;
    assert_eq!(o["capacity"]["granted"], false, "{o}");
    site.runs()
        .decide_approval(rn::DecideApprovalRequest {
            decision_id: other_decision,
            approve: false,
            reason: "not needed".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    site.until(&other, "Failed").await;
}

#[tokio::test]
async fn the_site_maps_a_releases_model_profile_and_re_points_it_at_run_time() {
    let answer = |s: &str| {
        Reply::Chat(completion(
            Some(&json!({"severity": s, "summary": "checked", "paged": false}).to_string()),
            Value::Null,
        ))
    };
    // The release's own endpoint, and two model servers of the site.
    let release_default = model_server(vec![answer("low")]).await;
    let first = model_server(vec![answer("medium")]).await;
    let second = model_server(vec![answer("high")]).await;
    // Only the release's own endpoint needs the site's allowance: the
    // site's profiles are the site's.
    let site = release_default.site().await;
    site.import(
        "triage-llm",
        json!([]),
        openai_profile(&release_default.url),
    )
    .await;

    // Unmapped: the release's endpoint serves, and the record says so.
    let run_id = site.submit("triage-llm").await;
    let done = site.until(&run_id, "Succeeded").await;
    let by = site.served_by(&done).await;
    assert!(
        by[0].starts_with(&release_default.url) && by[0].contains("the release's profile site-llm"),
        "{by:?}"
    );

    // Mapped for every tenant through the running appliance: the next
    // call goes to the site's server, without a new release.
    let map = |url: &str, extra: &[&str]| {
        put_profile(&site.a.data_dir, url, extra);
    };
    map(&first.url, &[]);
    let run_id = site.submit("triage-llm").await;
    let done = site.until(&run_id, "Succeeded").await;
    let by = site.served_by(&done).await;
    // The tenant reads which site profile served it, never its address.
    assert!(
        by[0].starts_with("site model profile site-llm")
            && by[0].contains("for every tenant")
            && !by[0].contains(&first.url),
        "{by:?}"
    );
    assert_eq!(first.requests.lock().unwrap()[0]["model"], "site-model");

    // Re-pointed for this tenant only: its next call goes to the second.
    map(&second.url, &["--tenant", "demo"]);
    let run_id = site.submit("triage-llm").await;
    let done = site.until(&run_id, "Succeeded").await;
    let by = site.served_by(&done).await;
    assert!(
        by[0].contains("for tenant demo") && !by[0].contains(&second.url),
        "{by:?}"
    );
    assert_eq!(second.requests.lock().unwrap().len(), 1);
    assert_eq!(
        first.requests.lock().unwrap().len(),
        1,
        "nothing more went to the first"
    );
    let listed = run_cli(&["model", "list"], &site.a.data_dir);
    assert!(
        listed.contains(&first.url) && listed.contains(&second.url),
        "{listed}"
    );

    // A bad mapping is refused by field, and changes nothing.
    let out = run(agentbay()
        .args([
            "model",
            "put",
            "site-llm",
            "--endpoint",
            "ftp://x",
            "--model",
            "m",
        ])
        .arg("--data-dir")
        .arg(&site.a.data_dir));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("endpoint"));
    // A credential in the URL is refused, without repeating it, and told
    // where a key goes.
    let out = run(agentbay()
        .args([
            "model",
            "put",
            "site-llm",
            "--endpoint",
            "http://svc:s3cret-key@127.0.0.1:9/v1",
            "--model",
            "m",
        ])
        .arg("--data-dir")
        .arg(&site.a.data_dir));
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("endpoint")
            && said.contains("runtime.model_api_keys")
            && !said.contains("s3cret-key"),
        "{said}"
    );
    assert!(
        run_cli(&["model", "list"], &site.a.data_dir).contains(&second.url),
        "the mapping stays"
    );
}

/// The chunks of a streamed chat completion: `content` in pieces of
/// `piece` characters, then the usage in a last chunk of its own.
fn stream_of(content: &str, piece: usize, input: u64, output: u64) -> Vec<Value> {
    let chars: Vec<char> = content.chars().collect();
    let mut chunks: Vec<Value> = chars
        .chunks(piece)
        .map(|c| {
            json!({"model": "test-model", "choices": [{"index": 0, "delta": {"content": c.iter().collect::<String>()}}]})
        })
        .collect();
    chunks.push(json!({"model": "test-model", "choices": [], "usage": {"prompt_tokens": input, "completion_tokens": output}}));
    chunks
}

/// Model servers are asked for streamed answers: the pieces make the
/// answer, the usage of the last chunk is what the call is charged, and a
/// stream that stalls is given up on after
/// `runtime.model_stream_idle_seconds`, not after the whole timeout.
#[tokio::test]
async fn a_streamed_answer_is_put_together_and_a_stalled_stream_is_given_up_on() {
    let ok =
        json!({"severity": "low", "summary": "streamed in pieces", "paged": false}).to_string();
    let server = model_server(vec![
        Reply::Stall(json!({"model": "test-model", "choices": [{"index": 0, "delta": {"content": "{\"sev"}}]})),
        Reply::Stream(20, stream_of(&ok, 7, 410, 23)),
    ])
    .await;
    let site = server
        .site_with(&[("AGENTBAY_RUNTIME__MODEL_STREAM_IDLE_SECONDS", "1")])
        .await;
    site.import("triage-llm", json!([]), openai_profile(&server.url))
        .await;
    // The site's profile gives the call a minute; the stall is seen in a
    // second.
    put_profile(&site.a.data_dir, &server.url, &["--timeout-seconds", "60"]);
    let run_id = site.submit("triage-llm").await;
    let run = site.until(&run_id, "Succeeded").await;
    let a = &run.steps[0].attempts[0];
    let t = site.timeline(&a.attempt_id).await;
    let models: Vec<&Value> = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "model")
        .collect();
    assert_eq!(models.len(), 2, "{models:?}");
    assert_eq!(models[0]["status"], "failed");
    let stalled = models[0]["error"].as_str().unwrap_or_default();
    assert!(
        stalled.contains("sent nothing for 1 s") && stalled.contains("model_stream_idle_seconds"),
        "{stalled}"
    );
    assert!(
        models[0]["latencyMs"].as_u64().is_none_or(|ms| ms < 30_000),
        "given up on after the idle time, not the minute: {}",
        models[0]
    );
    assert_eq!(models[1]["status"], "completed");
    assert_eq!(models[1]["usage"]["inputTokens"], 410, "{}", models[1]);
    assert_eq!(models[1]["usage"]["outputTokens"], 23, "{}", models[1]);
    let requests = server.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1]["stream"], true);
    assert_eq!(requests[1]["stream_options"]["include_usage"], true);
    assert_eq!(run.state, "Succeeded");
}

/// A site model server's limit holds for every caller: six attempts
/// whose calls each take half a second, on a server that takes two at
/// once, never have more than two in flight there; the others wait
/// paused, saying for what and where they are in its queue; all succeed.
///
/// `AGENTBAY_MODEL_QUEUE=ATTEMPTS,LIMIT` (e.g. `32,4`) runs it with more
/// and prints the queue's figures.
#[tokio::test]
async fn a_model_servers_limit_holds_and_a_waiting_attempt_says_why() {
    let (attempts, limit): (usize, usize) = std::env::var("AGENTBAY_MODEL_QUEUE")
        .ok()
        .and_then(|v| {
            let (a, l) = v.split_once(',')?;
            Some((a.parse().ok()?, l.parse().ok()?))
        })
        .unwrap_or((6, 2));
    let ok = json!({"severity": "low", "summary": "queued", "paged": false}).to_string();
    let server = model_server(
        (0..attempts)
            .map(|_| Reply::Slow(500, completion(Some(&ok), Value::Null)))
            .collect(),
    )
    .await;
    let site = server.site().await;
    site.import("triage-llm", json!([]), |m| {
        openai_profile(&server.url)(m);
        // They all fit the default pool at once.
        m["contract"]["cpu"] = json!(0.05);
        m["contract"]["memoryGb"] = json!(0.05);
    })
    .await;
    let limit_text = limit.to_string();
    let out = put_profile(
        &site.a.data_dir,
        &server.url,
        &["--max-concurrent", &limit_text],
    );
    assert!(out.contains(&format!("{limit} calls at once")), "{out}");
    let started = std::time::Instant::now();
    let mut runs = Vec::new();
    for _ in 0..attempts {
        runs.push(site.submit("triage-llm").await);
    }
    // While they run, one of them waits for the server and says why.
    let mut why = None;
    for _ in 0..200 {
        for run_id in &runs {
            let r = site.run(run_id).await;
            let Some(a) = r.steps[0].attempts.last() else {
                continue;
            };
            let t = site.timeline(&a.attempt_id).await;
            if let Some(reason) = t["pauseReason"].as_str()
                && reason.contains("waiting for model server")
            {
                why = Some((t["state"].clone(), reason.to_string()));
            }
        }
        if why.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (state, why) = why.expect("an attempt waited for the model server");
    // The System page shows the server, its limits and its queue.
    crate::console::user(&site.a, "platform", "pla", &["PlatformAdmin"]).await;
    let pla = crate::console::Visitor::sign_in(&site.a, "pla").await;
    let (status, page) = pla.get("/system").await;
    assert_eq!(status, 200);
    let servers = page
        .split("id=\"model-servers\"")
        .nth(1)
        .expect("the model servers table");
    assert!(
        servers.contains("site-llm")
            && servers.contains(&server.url)
            && servers.contains(&format!("{limit} calls at once"))
            && servers.contains(" in flight")
            && servers.contains("every tenant"),
        "{servers}"
    );
    assert_eq!(state, "Paused", "{why}");
    assert!(
        why.contains(&format!(
            "of site model profile site-llm: {limit} of {limit} calls in flight; position "
        )) && !why.contains(&server.url),
        "{why}"
    );
    let mut paused_ms = Vec::new();
    for run_id in &runs {
        let done = site.until(run_id, "Succeeded").await;
        assert_eq!(
            done.steps[0].attempts.len(),
            1,
            "no attempt failed: {done:?}"
        );
        // How long it waited paused for the server.
        let t = site.timeline(&done.steps[0].attempts[0].attempt_id).await;
        paused_ms.push(
            t["phases"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["state"] == "Paused")
                .map(|p| p["durationMs"].as_u64().unwrap_or(0))
                .sum::<u64>(),
        );
    }
    let took = started.elapsed();
    assert_eq!(
        server.requests.lock().unwrap().len(),
        attempts,
        "no call made twice"
    );
    let peak = server.load.1.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        peak <= limit,
        "{peak} calls at once at a server that takes {limit}"
    );
    assert_eq!(peak, limit, "the server was used to its limit");
    paused_ms.sort();
    println!(
        "{attempts} attempts, calls of 0.5 s, a server that takes {limit}: at most {peak} at once at the server; all done in {:.1} s (ideal {:.1} s); waited paused: {} of them, median {} ms, longest {} ms",
        took.as_secs_f64(),
        attempts.div_ceil(limit) as f64 * 0.5,
        paused_ms.iter().filter(|ms| **ms > 0).count(),
        paused_ms[paused_ms.len() / 2],
        paused_ms.last().unwrap()
    );
}

/// Two tenants share a server that takes one call at a time: one submits
/// ten times more than the other, and the other's runs still go in turn
/// with the first one's, not after all of them.
#[tokio::test]
async fn a_tenant_that_queues_more_does_not_starve_another_at_a_model_server() {
    let ok = json!({"severity": "low", "summary": "fair", "paged": false}).to_string();
    let server = model_server(
        (0..12)
            .map(|_| Reply::Slow(200, completion(Some(&ok), Value::Null)))
            .collect(),
    )
    .await;
    let site = server.site().await;
    let small = |m: &mut Value| {
        openai_profile(&server.url)(m);
        m["contract"]["cpu"] = json!(0.05);
        m["contract"]["memoryGb"] = json!(0.05);
    };
    site.import("triage-llm", json!([]), small).await;
    let other = site.other_tenant("globex").await;
    site.import_as_with(&other, "globex", "triage-llm", json!([]), small)
        .await;
    put_profile(&site.a.data_dir, &server.url, &["--max-concurrent", "1"]);
    let mut many = Vec::new();
    for _ in 0..10 {
        many.push(site.submit("triage-llm").await);
    }
    let mut few = Vec::new();
    for _ in 0..2 {
        few.push(site.submit_as(&other, "triage-llm").await);
    }
    for run_id in &many {
        site.until(run_id, "Succeeded").await;
    }
    let mut globex = Vec::new();
    for run_id in &few {
        let r = site.run_as(&other, run_id).await;
        globex.push(r.steps[0].attempts[0].attempt_id.clone());
    }
    // The order the server answered the attempts in.
    let answered: Vec<String> = server
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| {
            r["_headers"]["agentbay-attempt-id"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    let positions: Vec<usize> = globex
        .iter()
        .filter_map(|a| answered.iter().position(|t| t == a))
        .collect();
    assert_eq!(
        positions.len(),
        2,
        "both of globex's runs were served: {answered:?}"
    );
    // Queued behind ten of demo's, each of globex's goes within the next
    // few turns, not after all ten.
    assert!(
        positions.iter().all(|p| *p < 7),
        "globex's calls were answered at {positions:?} of {}",
        answered.len()
    );
}

/// A site model server that is down holds the attempts that need it:
/// they wait paused, saying so, through a minute of the manual clock,
/// and run on their own when it answers, no attempt failed and no call
/// made twice at it; past `runtime.model_outage_max_minutes` an attempt
/// still waiting fails `model-unavailable`.
#[tokio::test]
async fn attempts_wait_out_a_model_server_outage_and_give_up_only_past_its_limit() {
    let down = closed_port();
    let url = format!("http://{down}/v1");
    let mut site = Site::on(Appliance::start_with(
        &["--manual-clock"],
        &[("AGENTBAY_RUNTIME__NETWORK_ALLOW", &down.to_string())],
    ))
    .await;
    site.import("triage-llm", json!([]), |m| {
        openai_profile(&url)(m);
        m["contract"]["cpu"] = json!(0.25);
        m["contract"]["memoryGb"] = json!(0.25);
    })
    .await;
    let map = |url: &str| put_profile(&site.a.data_dir, url, &[]);
    map(&url);
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(site.submit("triage-llm").await);
    }
    let paused = |t: &Value| {
        t["state"] == "Paused"
            && t["pauseReason"]
                .as_str()
                .is_some_and(|r| r.contains("is down since") && r.contains("site-llm"))
    };
    for run_id in &runs {
        let r = site.until(run_id, "Paused").await;
        let t = site
            .timeline_until(&r.steps[0].attempts[0].attempt_id, paused)
            .await;
        assert!(paused(&t), "{t}");
        assert!(
            !t["pauseReason"]
                .as_str()
                .unwrap()
                .contains(&down.to_string()),
            "the tenant never reads the site's address: {t}"
        );
    }
    // A minute of outage fails nothing.
    site.a.advance(60).await;
    for run_id in &runs {
        let r = site.run(run_id).await;
        assert_eq!(r.steps[0].attempts.len(), 1, "{r:?}");
        assert_eq!(r.steps[0].attempts[0].state, "Paused", "{r:?}");
    }
    // The server comes back where it was: the attempts run on their own.
    let ok = json!({"severity": "low", "summary": "after the outage", "paged": false}).to_string();
    let server = model_server_on(
        tokio::net::TcpListener::bind(down).await.unwrap(),
        (0..3)
            .map(|_| Reply::Chat(completion(Some(&ok), Value::Null)))
            .collect(),
    )
    .await;
    for run_id in &runs {
        let done = site.until(run_id, "Succeeded").await;
        assert_eq!(
            done.steps[0].attempts.len(),
            1,
            "no attempt failed: {done:?}"
        );
        assert_eq!(done.steps[0].attempts[0].state, "Succeeded");
    }
    assert_eq!(
        server.requests.lock().unwrap().len(),
        3,
        "each call reached the server once"
    );

    // Down past the limit: the attempt still waiting fails, and says why.
    let gone = closed_port();
    map(&format!("http://{gone}/v1"));
    let run_id = site.submit("triage-llm").await;
    let r = site.until(&run_id, "Paused").await;
    site.timeline_until(&r.steps[0].attempts[0].attempt_id, paused)
        .await;
    site.a.advance(31 * 60).await;
    // Half an hour on, the tenant's token has expired too.
    site.token = site.a.token(&site.cred).await;
    let failed = site.until(&run_id, "Failed").await;
    let a = &failed.steps[0].attempts[0];
    assert_eq!(a.failure_class, "model-unavailable", "{failed:?}");
    assert!(
        a.failure_reason.contains("did not answer for 31 minutes")
            && a.failure_reason.contains("model_outage_max_minutes = 30"),
        "{}",
        a.failure_reason
    );
    assert_eq!(
        failed.steps[0].attempts.len(),
        1,
        "not tried again: {failed:?}"
    );
}

/// A site profile lists servers in order: a call moves on only when a
/// server says it cannot serve now (its port closed, 503), records each
/// move in `servedBy` without an address, and never moves on a request
/// the server calls wrong (400).
#[tokio::test]
async fn a_profile_falls_back_only_when_a_server_cannot_serve_now_and_says_so() {
    let answer = Reply::Chat(completion(
        Some(&json!({"severity": "low", "summary": "checked", "paged": false}).to_string()),
        Value::Null,
    ));
    let release_default = model_server(vec![]).await;
    let busy = model_server(vec![Reply::Status(503, "loading the model")]).await;
    let good = model_server(vec![answer.clone()]).await;
    let closed = format!("http://{}/v1", closed_port());
    let site = release_default.site().await;
    site.import(
        "triage-llm",
        json!([]),
        openai_profile(&release_default.url),
    )
    .await;
    let out = put_profile(
        &site.a.data_dir,
        &closed,
        &["--fallback", &busy.url, "--fallback", &good.url],
    );
    assert!(out.contains(&format!("then {}", good.url)), "{out}");
    let run_id = site.submit("triage-llm").await;
    let done = site.until(&run_id, "Succeeded").await;
    let by = site.served_by(&done).await;
    assert_eq!(by.len(), 1, "one call, served once: {by:?}");
    assert!(
        by[0].starts_with("site model profile site-llm")
            && by[0].contains("server 3 of 3")
            && by[0].contains("server 1 could not serve")
            && by[0].contains("server 2 could not serve (503"),
        "{by:?}"
    );
    for url in [&closed, &busy.url, &good.url] {
        assert!(!by[0].contains(url.as_str()), "no address: {by:?}");
    }
    assert_eq!(busy.requests.lock().unwrap().len(), 1);
    assert_eq!(good.requests.lock().unwrap().len(), 1);

    // A request the first server calls wrong is the answer: the next
    // server is never asked.
    let wrong = model_server(vec![
        Reply::Status(400, "context too long"),
        Reply::Status(400, "context too long"),
        Reply::Status(400, "context too long"),
    ])
    .await;
    let spare = model_server(vec![answer]).await;
    put_profile(&site.a.data_dir, &wrong.url, &["--fallback", &spare.url]);
    let run_id = site.submit("triage-llm").await;
    site.until(&run_id, "Failed").await;
    assert!(!wrong.requests.lock().unwrap().is_empty());
    assert_eq!(
        spare.requests.lock().unwrap().len(),
        0,
        "a 400 never moves the call"
    );
}

/// Maps the profile `site-llm` to model `site-model` at `url` through the
/// running appliance, with `extra` arguments: what the CLI printed.
/// A model server restarted under load, in real time: the attempts whose
/// calls find it gone wait, paused, and succeed when it is back; none
/// fails and no call is made twice. `AGENTBAY_MODEL_RESTART=SECONDS,RUNS`
/// sets how long it is down and how many runs it takes (default 3 s, 16;
/// `60,32` for a minute's restart under 32 runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_server_restart_under_load_is_waited_out() {
    let (down_for, n) = std::env::var("AGENTBAY_MODEL_RESTART")
        .ok()
        .and_then(|v| {
            let (s, n) = v.split_once(',')?;
            Some((s.parse::<u64>().ok()?, n.parse::<usize>().ok()?))
        })
        .unwrap_or((3, 16));
    let ok = json!({"severity": "low", "summary": "served", "paged": false}).to_string();
    let script = |n: usize| {
        (0..n)
            .map(|_| Reply::Chat(completion(Some(&ok), Value::Null)))
            .collect::<Vec<_>>()
    };
    let server = model_server(script(1)).await;
    let url = server.url.clone();
    let site = server.site().await;
    // Small attempts, so that the host-sized default pool holds them all.
    site.a.size_agents_pool(8).await;
    site.import("triage-llm", json!([]), |m| {
        openai_profile(&url)(m);
        m["contract"]["cpu"] = json!(0.25);
        m["contract"]["memoryGb"] = json!(0.25);
    })
    .await;
    put_profile(&site.a.data_dir, &url, &[]);
    let warm = site.submit("triage-llm").await;
    site.until(&warm, "Succeeded").await;

    // The server goes away; the runs come while it is away.
    let addr = server.stop().await;
    let stopped = std::time::Instant::now();
    let mut runs = Vec::new();
    for _ in 0..n {
        runs.push(site.submit("triage-llm").await);
    }
    tokio::time::sleep(std::time::Duration::from_secs(down_for).saturating_sub(stopped.elapsed()))
        .await;
    // Just before it is back: the attempts wait, paused, none failed.
    let mut paused = 0;
    for run_id in &runs {
        let r = site.run(run_id).await;
        assert_eq!(r.steps[0].attempts.len(), 1, "{r:?}");
        assert_ne!(r.steps[0].attempts[0].state, "Failed", "{r:?}");
        if r.steps[0].attempts[0].state == "Paused" {
            paused += 1;
        }
    }
    let back = model_server_on(
        tokio::net::TcpListener::bind(addr).await.unwrap(),
        script(n),
    )
    .await;
    let restarted = std::time::Instant::now();
    let deadline = restarted + std::time::Duration::from_secs(90);
    for run_id in &runs {
        let done = loop {
            let r = site.run(run_id).await;
            if r.state != "Running" {
                break r;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{run_id} did not end within 90 s of the restart: {r:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        };
        assert_eq!(done.state, "Succeeded", "{done:?}");
        assert_eq!(
            done.steps[0].attempts.len(),
            1,
            "no attempt failed: {done:?}"
        );
    }
    let requests = back.requests.lock().unwrap().len();
    assert_eq!(requests, n, "each call reached the server once");
    eprintln!(
        "model server restart: down {:.1} s under {n} runs; {n} succeeded on their first attempt, 0 failed; {paused} were waiting paused just before it was back; all done {:.1} s after it was back; {requests} requests at the server",
        restarted.duration_since(stopped).as_secs_f64(),
        restarted.elapsed().as_secs_f64()
    );
}

fn put_profile(data: &Path, url: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "model",
        "put",
        "site-llm",
        "--endpoint",
        url,
        "--model",
        "site-model",
    ];
    args.extend_from_slice(extra);
    let out = run_cli(&args, data);
    assert!(out.contains("through the running appliance"), "{out}");
    out
}

/// A loopback address nothing listens on (a server that is down).
fn closed_port() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// Runs the CLI on a data directory and returns its output, failing on an
/// error.
fn run_cli(args: &[&str], data: &Path) -> String {
    let out = run(agentbay().args(args).arg("--data-dir").arg(data));
    assert!(
        out.status.success(),
        "agentbay {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn the_running_configuration_reloads_on_sighup_and_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agentbay.toml");
    let write = |text: &str| std::fs::write(&file, text).unwrap();
    write("[runtime]\ninput_timeout_minutes = 30\n");
    let site = Site::on(Appliance::start_with(
        &["--config", file.to_str().unwrap()],
        &[],
    ))
    .await;
    site.import(
        "triage-page",
        json!([
            {"content": "Paging", "toolCalls": [{"tool": "page-oncall", "arguments": {"message": "down"}}]},
            answer("high", true)
        ]),
        |_| {},
    )
    .await;
    // How long the decision of a new run may wait, in minutes.
    let timeout = || async {
        let run = site.submit("triage-page").await;
        let waiting = site.until(&run, "WaitingForDecision").await;
        let d = waiting.steps[0].attempts[0]
            .pending_decision
            .as_option()
            .unwrap()
            .clone();
        let at = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap();
        (at(&d.expires_at) - at(&d.requested_at)).num_minutes()
    };
    assert_eq!(timeout().await, 30);

    // On request: the reloadable key is in force for the next decision,
    // the other one is named and keeps its running value.
    write("[runtime]\ninput_timeout_minutes = 90\n[http]\nmax_body_bytes = 2000000\n");
    let out = run(agentbay()
        .arg("reload")
        .arg("--data-dir")
        .arg(&site.a.data_dir));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("in force now: runtime.input_timeout_minutes"),
        "{said}"
    );
    assert!(
        said.contains("needs a restart (keeps its running value): http.max_body_bytes"),
        "{said}"
    );
    assert_eq!(timeout().await, 90);

    // A bad file is refused whole, by key, and the running one stays.
    write("[runtime]\ninput_timeout_minutes = 0\n");
    let out = run(agentbay()
        .arg("reload")
        .arg("--data-dir")
        .arg(&site.a.data_dir));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("runtime.input_timeout_minutes")
            && err.contains("running configuration stays"),
        "{err}"
    );
    assert_eq!(timeout().await, 90);

    // SIGHUP does the same.
    write("[runtime]\ninput_timeout_minutes = 45\n");
    let pid = site.a.child.as_ref().unwrap().id();
    let before = site.a.log().matches("configuration reloaded").count();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    for _ in 0..200 {
        if site.a.log().matches("configuration reloaded").count() > before {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(timeout().await, 45);

    // Trusted keys from the file: a release signed by a new site key is
    // Untrusted until the file names the key and the appliance reloads.
    let key = dir.path().join("site");
    let out = run(agentbay().args(["release", "keygen", "--out"]).arg(&key));
    assert!(out.status.success());
    let signed =
        crate::releases::variant(dir.path(), "signed", &key.with_extension("key"), |_, m| {
            m["releaseId"] = json!("triage-site-1.0.0");
        });
    let (status, body) = upload(&site.a, &site.token, pack(&signed, |_| {})).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["release"]["state"], "Untrusted");
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    write(&format!(
        "[runtime]\ninput_timeout_minutes = 45\n[[releases.trusted_keys]]\nname = \"site\"\npublic_key = \"{}\"\ntenants = [\"demo\"]\n",
        public.trim()
    ));
    let out = run(agentbay()
        .arg("reload")
        .arg("--data-dir")
        .arg(&site.a.data_dir));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("in force now: releases.trusted_keys"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let got = site
        .a
        .get(&site.token, "/runtime/releases/triage-site-1.0.0")
        .await;
    assert_eq!(got["state"], "Verified", "{got}");

    // The capacity lease TTL and the log level take effect too.
    let reader = site
        .a
        .create_client("demo", &["factory.capacity.read", "factory.runs.read"])
        .await;
    let reader = site.a.token(&reader).await;
    let lease_ttl = || async {
        let run_id = site.submit("triage-page").await;
        let waiting = site.until(&run_id, "WaitingForDecision").await;
        let t = site
            .timeline(&waiting.steps[0].attempts[0].attempt_id)
            .await;
        let lease = site
            .a
            .get(
                &reader,
                &format!(
                    "/factory/capacity/leases/{}",
                    t["capacity"]["leaseId"].as_str().unwrap()
                ),
            )
            .await;
        let at = |v: &Value| chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap()).unwrap();
        (at(&lease["expiresAt"]) - at(&lease["grantedAt"])).num_seconds()
    };
    assert_eq!(lease_ttl().await, 120);
    write(&format!(
        "[runtime]\ninput_timeout_minutes = 45\n[[releases.trusted_keys]]\nname = \"site\"\npublic_key = \"{}\"\ntenants = [\"demo\"]\n[capacity]\nlease_ttl_seconds = 600\n[log]\nlevel = \"warn\"\n",
        public.trim()
    ));
    let out = run(agentbay()
        .arg("reload")
        .arg("--data-dir")
        .arg(&site.a.data_dir));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("in force now: capacity.lease_ttl_seconds")
            && said.contains("in force now: log.level"),
        "{said}"
    );
    assert_eq!(lease_ttl().await, 600);
    // At level warn, the next reload's info line is not logged.
    let before = site.a.log().matches("configuration reloaded").count();
    let out = run(agentbay()
        .arg("reload")
        .arg("--data-dir")
        .arg(&site.a.data_dir));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing changed"));
    assert_eq!(
        site.a.log().matches("configuration reloaded").count(),
        before
    );
    let log = site.a.log();
    assert!(
        !log.contains("\"level\":\"ERROR\"") && !log.contains(" ERROR "),
        "{log}"
    );
}

/// The reloadable keys of capacity, authentication and retention, each
/// seen doing its work on the running appliance.
#[tokio::test]
async fn reloaded_editions_sign_in_limits_and_retention_take_effect() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agentbay.toml");
    let write = |text: &str| std::fs::write(&file, text).unwrap();
    let gold = "[capacity.edition_defaults.gold]\nconcurrent_runs = 3\n";
    write(&format!(
        "[capacity.edition_defaults.team]\nconcurrent_runs = 1\n{gold}"
    ));
    let mut site = Site::on(Appliance::start_with(
        &["--config", file.to_str().unwrap(), "--manual-clock"],
        &[],
    ))
    .await;
    let reload = |expect_ok: bool| {
        let out = run(agentbay()
            .arg("reload")
            .arg("--data-dir")
            .arg(&site.a.data_dir));
        assert_eq!(
            out.status.success(),
            expect_ok,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    site.import(
        "triage-page",
        json!([
            {"content": "Paging", "toolCalls": [{"tool": "page-oncall", "arguments": {"message": "down"}}]},
            answer("high", true)
        ]),
        |_| {},
    )
    .await;
    site.import("triage-quick", json!([answer("low", false)]), |_| {})
        .await;

    // Edition defaults: the team edition allows one run; a second queues
    // behind concurrentRuns until a reload raises it.
    let paged = site.submit("triage-page").await;
    site.until(&paged, "WaitingForDecision").await;
    let quick = site.submit("triage-quick").await;
    let queued = site.until(&quick, "Claimed").await;
    let t = site
        .timeline_until(&queued.steps[0].attempts[0].attempt_id, |t| {
            t["capacity"]["queuePosition"].is_number()
        })
        .await;
    assert!(
        t["waitingReason"]
            .as_str()
            .unwrap()
            .contains("concurrentRuns"),
        "{t}"
    );
    write(&format!(
        "[capacity.edition_defaults.team]\nconcurrent_runs = 2\n{gold}"
    ));
    let said = reload(true);
    assert!(
        said.contains("in force now: capacity.edition_defaults.team.concurrent_runs"),
        "{said}"
    );
    let done = site.until(&quick, "Succeeded").await;
    assert_eq!(done.state, "Succeeded", "the queued run got capacity");
    let admin = site.a.admin_token().await;
    let quotas = site
        .a
        .get(&admin, "/factory/capacity/quotas?tenant=demo")
        .await;
    assert_eq!(
        quotas["tenant"]["effective"]["concurrentRuns"]["value"], 2,
        "{quotas}"
    );

    // An edition a tenant has cannot go; the refusal names it and the
    // tenant, and nothing changes.
    site.a.tenant("acme", "gold", &[], &["p"]).await;
    write("[capacity.edition_defaults.team]\nconcurrent_runs = 5\n");
    let said = reload(false);
    assert!(
        said.contains("capacity.edition_defaults.gold")
            && said.contains("acme")
            && said.contains("running configuration stays"),
        "{said}"
    );
    let quotas = site
        .a
        .get(&admin, "/factory/capacity/quotas?tenant=demo")
        .await;
    assert_eq!(
        quotas["tenant"]["effective"]["concurrentRuns"]["value"], 2,
        "the refused file changed nothing: {quotas}"
    );

    // Authentication: the token lifetime and the failure limits.
    let token_response = |secret: String| {
        let a = &site.a;
        let id = site.cred.id.clone();
        async move {
            a.http()
                .post(format!("{}/oauth/token", a.url))
                .basic_auth(id, Some(secret))
                .form(&[("grant_type", "client_credentials")])
                .send()
                .await
                .unwrap()
        }
    };
    let ok = token_response(site.cred.secret.clone()).await;
    assert_eq!(ok.json::<Value>().await.unwrap()["expires_in"], 900);
    let auth = format!(
        "{gold}[capacity.edition_defaults.team]\nconcurrent_runs = 2\n[auth]\ntoken_ttl_seconds = 300\n"
    );
    write(&auth);
    let said = reload(true);
    assert!(
        said.contains("in force now: auth.token_ttl_seconds"),
        "{said}"
    );
    let ok = token_response(site.cred.secret.clone()).await;
    assert_eq!(ok.json::<Value>().await.unwrap()["expires_in"], 300);
    // One failure is under the default limit of 5 failures per name and
    // source; after a reload to 1, the same failure refuses the pair.
    let wrong = token_response("wrong".into()).await;
    assert_eq!(wrong.status(), 401);
    let ok = token_response(site.cred.secret.clone()).await;
    assert_eq!(ok.status(), 200);
    let auth = format!("{auth}failures_per_name_and_source = 1\n");
    write(&auth);
    let said = reload(true);
    assert!(
        said.contains("in force now: auth.failures_per_name_and_source"),
        "{said}"
    );
    let refused = token_response(site.cred.secret.clone()).await;
    assert_eq!(refused.status(), 429, "over the new limit of 1");

    // Retention: a finished run's payload stays under the 30-day default
    // and goes once a reload shortens it.
    site.a.advance(3 * 86_400).await;
    site.token = site.a.token(&site.cred).await;
    let pass = site.a.run_worker("Purger").await;
    assert!(pass.ok, "{}", pass.message);
    assert!(site.run(&quick).await.purged.is_empty());
    write(&format!("{auth}[retention]\npayload_days = 2\n"));
    let said = reload(true);
    assert!(
        said.contains("in force now: retention.payload_days"),
        "{said}"
    );
    let pass = site.a.run_worker("Purger").await;
    assert!(pass.ok, "{}", pass.message);
    let purged = site.run(&quick).await;
    assert!(
        purged
            .purged
            .contains("by the payload retention of tenant demo (2 days)"),
        "{}",
        purged.purged
    );
}

/// The checkpoint of `timeline` written for `reason` around `call_id`.
fn checkpoint_around(timeline: &Value, reason: &str, call_id: &Value) -> u64 {
    timeline["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["reason"] == reason && c["callId"] == *call_id)
        .and_then(|c| c["sequence"].as_u64())
        .unwrap_or_else(|| panic!("no {reason} checkpoint for call {call_id}: {timeline}"))
}

#[tokio::test]
async fn a_failed_run_is_re_run_from_a_checkpoint_with_a_fixed_release_and_pages_nobody_twice() {
    let site = Site::start().await;
    let page = json!({"content": "Paging", "toolCalls": [{"tool": "page-oncall", "arguments": {"message": "checkout down"}}]});
    let release = |version: &'static str| {
        move |m: &mut Value| {
            m["version"] = json!(version);
            m["policy"]["tools"]["page-oncall"] = json!("allow");
        }
    };
    // 1.0.0 pages, then never answers in the contract's shape.
    site.import(
        "triage-v1",
        json!([page, {"content": "not json"}, {"content": "still not"}, {"content": "nope"}]),
        release("1.0.0"),
    )
    .await;
    // 1.1.0 answers right after the page.
    site.import(
        "triage-v2",
        json!([page, answer("high", true)]),
        release("1.1.0"),
    )
    .await;
    site.import("triage-v0", json!([answer("low", false)]), release("0.9.0"))
        .await;
    let source = site.submit("triage-v1").await;
    let failed = site.until(&source, "Failed").await;
    assert_eq!(failed.state, "Failed");
    let attempt = failed.steps[0].attempts[0].attempt_id.clone();
    let t = site.timeline(&attempt).await;
    let paged = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["target"] == "page-oncall" && c["status"] == "completed")
        .cloned()
        .expect("the source attempt paged");
    let before_page = checkpoint_around(&t, "before-gated-call", &paged["callId"]);

    // An older release, or one whose adapter cannot read the checkpoint,
    // is refused with the reason.
    let older = site
        .runs()
        .rerun_from_checkpoint(rn::RerunFromCheckpointRequest {
            attempt_id: attempt.clone(),
            release_id: "triage-v0".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        older.to_string().contains("releaseId") && older.to_string().contains("older"),
        "{older}"
    );
    let missing = site
        .runs()
        .rerun_from_checkpoint(rn::RerunFromCheckpointRequest {
            attempt_id: attempt.clone(),
            checkpoint_sequence: 999,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        missing.to_string().contains("checkpointSequence"),
        "{missing}"
    );

    // From the checkpoint before the page, with the fixed release: the page
    // the source confirmed is not made again, and the run succeeds.
    let rerun = site
        .runs()
        .rerun_from_checkpoint(rn::RerunFromCheckpointRequest {
            attempt_id: attempt.clone(),
            checkpoint_sequence: before_page as u32,
            release_id: "triage-v2".into(),
            request_id: "fix-1".into(),
            ..Default::default()
        })
        .await
        .expect("re-run")
        .into_owned()
        .run
        .as_option()
        .unwrap()
        .clone();
    let origin = rerun.rerun_of.as_option().expect("the origin").clone();
    assert_eq!(origin.run_id, source);
    assert_eq!(origin.attempt_id, attempt);
    assert_eq!(origin.checkpoint_sequence as u64, before_page);
    assert_eq!(origin.release_id, "triage-v1");
    assert_eq!(rerun.release_id, "triage-v2");
    let done = site.until(&rerun.run_id, "Succeeded").await;
    assert_eq!(done.state, "Succeeded", "{done:?}");
    let new_attempt = done.steps[0].attempts[0].attempt_id.clone();
    assert_ne!(new_attempt, attempt);
    let nt = site.timeline(&new_attempt).await;
    assert_eq!(nt["rerunOf"]["attemptId"], attempt.as_str());
    let replayed = calls_to(&nt, "page-oncall");
    assert_eq!(replayed.len(), 1, "{nt}");
    assert_eq!(replayed[0]["status"], "completed");
    assert_eq!(replayed[0]["replayOf"]["callId"], paged["callId"]);
    assert_eq!(replayed[0]["resultHash"], paged["resultHash"]);
    assert_eq!(replayed[0]["receiptRef"], paged["receiptRef"]);
    assert_eq!(
        nt["calls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["kind"] == "model")
            .count(),
        1,
        "the loop resumed after the first model turn: {nt}"
    );
    // The first checkpoint of the re-run holds the source checkpoint's
    // state.
    let source_state = t["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["sequence"] == before_page)
        .unwrap()["adapterStateRef"]
        .clone();
    assert_eq!(nt["checkpoints"][0]["adapterStateRef"], source_state);
    // The same request again is the same run; the source is unchanged.
    let again = site
        .runs()
        .rerun_from_checkpoint(rn::RerunFromCheckpointRequest {
            attempt_id: attempt.clone(),
            checkpoint_sequence: before_page as u32,
            release_id: "triage-v2".into(),
            request_id: "fix-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert_eq!(again.run.as_option().unwrap().run_id, rerun.run_id);
    let after = site.run(&source).await;
    assert_eq!(after.state, "Failed");
    assert_eq!(
        after.steps[0].attempts.len(),
        failed.steps[0].attempts.len()
    );
    assert!(after.rerun_of.as_option().is_none());

    // Named on purpose, the page is issued again (a new call, no replay).
    let bogus = site
        .runs()
        .rerun_from_checkpoint(rn::RerunFromCheckpointRequest {
            attempt_id: attempt.clone(),
            checkpoint_sequence: before_page as u32,
            release_id: "triage-v2".into(),
            reissue_call_ids: vec![new_attempt.clone()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(bogus.to_string().contains("reissueCallIds"), "{bogus}");

    // The console: an Operator re-runs from the checkpoints page.
    crate::console::user(&site.a, "demo", "oper", &["Operator"]).await;
    let op = crate::console::Visitor::sign_in(&site.a, "oper").await;
    let (status, page_html) = op.get(&format!("/attempts/{attempt}/checkpoints")).await;
    assert_eq!(status, 200);
    assert!(
        page_html.contains("Re-run from a checkpoint") && page_html.contains("triage-v2"),
        "{page_html}"
    );
    let paged_id = paged["callId"].as_str().unwrap();
    assert!(
        page_html.contains(paged_id),
        "the page lists the confirmed page call"
    );
    let checkpoint = before_page.to_string();
    let (status, location) = op
        .post(
            &format!("/attempts/{attempt}/rerun"),
            &[
                ("checkpoint", checkpoint.as_str()),
                ("release", "triage-v2"),
                ("reissue", paged_id),
            ],
        )
        .await;
    assert_eq!(status, 303);
    assert!(location.starts_with("/runs/"), "{location}");
    let reissued = location.trim_start_matches("/runs/").to_string();
    let (_, run_page) = op.get(&location).await;
    assert!(run_page.contains("Re-run of"), "{run_page}");
    assert!(run_page.contains("issued again on purpose"), "{run_page}");
    let (_, source_page) = op.get(&format!("/runs/{source}")).await;
    assert!(
        source_page.contains(&reissued[reissued.len() - 8..]),
        "the source run lists its re-runs"
    );
    let done = site.until(&reissued, "Succeeded").await;
    let rt = site.timeline(&done.steps[0].attempts[0].attempt_id).await;
    let page_again = rt["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["target"] == "page-oncall")
        .cloned()
        .expect("the page");
    assert_eq!(page_again["status"], "completed");
    assert!(
        page_again["replayOf"].is_null(),
        "issued, not replayed: {rt}"
    );

    // The command line, through the running appliance.
    let out = run_cli(
        &[
            "run",
            "rerun",
            &attempt,
            "--tenant",
            "demo",
            "--checkpoint",
            &checkpoint,
            "--release",
            "triage-v2",
        ],
        &site.a.data_dir,
    );
    assert!(
        out.contains(&format!(
            "starts from checkpoint {checkpoint} of attempt {attempt}"
        )),
        "{out}"
    );
    let cli_run = out.split_whitespace().nth(1).unwrap().to_string();
    assert_eq!(site.until(&cli_run, "Succeeded").await.state, "Succeeded");
}

/// A collector on the test's side: every span the appliance exports over
/// OTLP HTTP/protobuf.
async fn collector() -> (
    String,
    std::sync::Arc<parking_lot::Mutex<Vec<opentelemetry_proto::tonic::trace::v1::Span>>>,
) {
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use prost::Message;
    let spans = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        kept.lock().extend(scope.spans);
                    }
                }
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, spans)
}

/// A span attribute as text (strings as they are, numbers printed).
fn attribute(span: &opentelemetry_proto::tonic::trace::v1::Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    let value = span
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?;
    Some(match value.value.as_ref()? {
        V::StringValue(s) => s.clone(),
        V::IntValue(i) => i.to_string(),
        V::BoolValue(b) => b.to_string(),
        V::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

#[tokio::test]
async fn the_loops_genai_spans_and_the_request_spans_reach_the_sites_collector() {
    let (url, spans) = collector().await;
    let site = Site::on(Appliance::start_with(
        &[],
        &[("AGENTBAY_TELEMETRY__OTLP_ENDPOINT", url.as_str())],
    ))
    .await;
    site.import(
        "triage-traced",
        json!([
            {"content": "Looking", "toolCalls": [{"tool": "lookup-ticket", "arguments": {"customer": "acme"}}]},
            answer("low", false)
        ]),
        |_| {},
    )
    .await;
    let run = site.submit("triage-traced").await;
    let done = site.until(&run, "Succeeded").await;
    let attempt = done.steps[0].attempts[0].attempt_id.clone();
    let ours = |name: &str| -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
        spans
            .lock()
            .iter()
            .filter(|s| {
                s.name.starts_with(name)
                    && attribute(s, "attempt.id").as_deref() == Some(attempt.as_str())
            })
            .cloned()
            .collect()
    };
    for _ in 0..100 {
        if ours("chat").len() >= 2 && !ours("invoke_agent").is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let agent = ours("invoke_agent");
    assert_eq!(
        agent.len(),
        1,
        "one attempt span among {:?}; log: {}",
        spans
            .lock()
            .iter()
            .map(|s| s.name.clone())
            .collect::<Vec<_>>(),
        site.a.log()
    );
    let agent = &agent[0];
    assert_eq!(agent.name, "invoke_agent triage");
    assert_eq!(attribute(agent, "run.id").as_deref(), Some(run.as_str()));
    let chats = ours("chat");
    assert_eq!(chats.len(), 2, "one span per model call");
    let tools = ours("execute_tool");
    assert_eq!(tools.len(), 1, "one span per tool call");
    for span in chats.iter().chain(&tools) {
        assert_eq!(span.trace_id, agent.trace_id, "one trace per attempt");
        assert_eq!(
            span.parent_span_id, agent.span_id,
            "children of the attempt"
        );
        assert_eq!(attribute(span, "run.id").as_deref(), Some(run.as_str()));
        assert!(
            attribute(span, "checkpoint.sequence")
                .and_then(|s| s.parse::<u32>().ok())
                .is_some_and(|n| n >= 1),
            "{span:?}"
        );
    }
    let chat = &chats[0];
    assert_eq!(
        attribute(chat, "gen_ai.operation.name").as_deref(),
        Some("chat")
    );
    assert!(attribute(chat, "gen_ai.request.model").is_some());
    assert!(attribute(chat, "gen_ai.usage.input_tokens").is_some());
    assert!(chat.end_time_unix_nano >= chat.start_time_unix_nano);
    let tool = &tools[0];
    assert_eq!(tool.name, "execute_tool lookup-ticket");
    assert_eq!(
        attribute(tool, "gen_ai.tool.name").as_deref(),
        Some("lookup-ticket")
    );
    // The appliance's own request spans, by route, with the status.
    let submitted = spans
        .lock()
        .iter()
        .find(|s| s.name == "POST agentbay.runs.v1.Runs/SubmitRun")
        .cloned()
        .expect("the SubmitRun request span");
    assert_eq!(
        attribute(&submitted, "http.response.status_code").as_deref(),
        Some("200")
    );
    // No content on any span.
    for span in spans.lock().iter() {
        for a in &span.attributes {
            let text = format!("{:?}", a.value);
            assert!(
                !text.contains("checkout is slow") && !text.contains("acme"),
                "content on span {}: {text}",
                span.name
            );
        }
    }
}

/// A scripted answer with the usage its server would report.
fn counted(content: Value, input: u64, output: u64, cached: u64) -> Value {
    json!({"content": content.to_string(), "usage": {
        "prompt_tokens": input, "completion_tokens": output,
        "prompt_tokens_details": {"cached_tokens": cached}}})
}

#[tokio::test]
async fn each_model_call_charges_its_tokens_to_the_attempt_the_run_and_the_tenants_day() {
    let site = Site::start().await;
    site.import(
        "triage-counted",
        json!([
            {"content": "Looking", "toolCalls": [{"tool": "lookup-ticket", "arguments": {"customer": "acme"}}],
             "usage": {"prompt_tokens": 1200, "completion_tokens": 40,
                       "prompt_tokens_details": {"cached_tokens": 1000}}},
            counted(json!({"severity": "low", "summary": "checked", "paged": false}), 1500, 60, 0)
        ]),
        |_| {},
    )
    .await;
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(site.submit("triage-counted").await);
    }
    for run_id in &runs {
        assert_eq!(site.until(run_id, "Succeeded").await.state, "Succeeded");
    }
    // Per call: tokens and latency on the timeline.
    let run = site.run(&runs[0]).await;
    let attempt = &run.steps[0].attempts[0];
    let t = site.timeline(&attempt.attempt_id).await;
    let models: Vec<&Value> = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "model")
        .collect();
    assert_eq!(models.len(), 2);
    assert_eq!(
        models[0]["usage"],
        json!({"inputTokens": 1200, "outputTokens": 40, "cachedTokens": 1000, "modelCalls": 1})
    );
    assert!(models[0]["latencyMs"].is_number(), "{}", models[0]);
    let tool = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "tool")
        .unwrap();
    assert!(tool["usage"].is_null(), "a tool call charges no tokens");
    // Per attempt and per run.
    assert_eq!(t["usage"]["tokens"]["inputTokens"], 2700);
    assert_eq!(t["usage"]["tokens"]["outputTokens"], 100);
    let tokens = attempt.tokens.as_option().unwrap();
    assert_eq!((tokens.total_tokens, tokens.model_calls), (2800, 2));
    let own = run.tokens.as_option().unwrap();
    assert_eq!((own.total_tokens, own.cached_tokens), (2800, 1000));
    assert_eq!(
        run.tokens_with_children.as_option().unwrap().total_tokens,
        2800
    );

    // Per tenant, day and agent: the API, the CSV and the metrics agree.
    let today = chrono::Utc::now().date_naive().to_string();
    let report = site
        .a
        .get(&site.token, "/factory/usage?groupBy=day,project,agent")
        .await;
    assert_eq!(report["rows"].as_array().unwrap().len(), 1, "{report}");
    let row = &report["rows"][0];
    assert_eq!(row["day"], today.as_str());
    assert_eq!(row["projectId"], "support");
    assert_eq!(row["agentId"], "triage");
    assert_eq!(row["totalTokens"], 3 * 2800);
    assert_eq!(row["usage"]["modelCalls"], 6);
    assert_eq!(report["total"]["cachedTokens"], 3000);
    let csv = site
        .a
        .http()
        .get(format!(
            "{}/factory/usage?groupBy=day,project,agent&format=csv",
            site.a.url
        ))
        .bearer_auth(&site.token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        csv,
        format!(
            "day,projectId,agentId,inputTokens,outputTokens,cachedTokens,totalTokens,modelCalls\n\
             {today},support,triage,8100,300,3000,8400,6\n"
        )
    );
    let rpc = site
        .runs()
        .get_usage(rn::GetUsageRequest {
            group_by: "release".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert_eq!(rpc.rows.len(), 1);
    assert_eq!(rpc.rows[0].release_id, "triage-counted");
    assert_eq!(
        rpc.rows[0].usage.as_option().unwrap().total_tokens,
        report["total"]["inputTokens"].as_u64().unwrap() + 300
    );
    let bad = site
        .runs()
        .get_usage(rn::GetUsageRequest {
            group_by: "week".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let message = bad.message.unwrap_or_default();
    assert!(
        message.starts_with("groupBy: \"week\""),
        "the wrong field is named: {message}"
    );
    let metrics = site.a.metrics().await;
    assert!(
        metrics.contains(
            "agentbay_model_tokens_total{tenant=\"demo\",agent=\"triage\",kind=\"cached\"} 3000"
        ),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("model_"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        metrics.contains("agentbay_model_call_seconds_count{tenant=\"demo\",agent=\"triage\"} 6")
    );
    // The quota page shows today's tokens.
    let quotas = site
        .a
        .get(
            &site.a.admin_token().await,
            "/factory/capacity/quotas?tenant=demo",
        )
        .await;
    assert_eq!(quotas["tenant"]["usage"]["tokensToday"], 8400, "{quotas}");
}

#[tokio::test]
async fn a_token_budget_ends_the_attempt_before_the_call_that_would_pass_it() {
    let site = Site::start().await;
    site.import(
        "triage-budget",
        json!([
            {"content": "Looking", "toolCalls": [{"tool": "lookup-ticket", "arguments": {"customer": "acme"}}],
             "usage": {"prompt_tokens": 900, "completion_tokens": 50}},
            counted(json!({"severity": "low", "summary": "checked", "paged": false}), 900, 50, 0)
        ]),
        |m| m["contract"]["limits"]["maxTotalTokens"] = json!(1200),
    )
    .await;
    let run_id = site.submit("triage-budget").await;
    let run = site.until(&run_id, "TimedOut").await;
    let a = &run.steps[0].attempts[0];
    assert_eq!(a.state, "TimedOut", "{a:?}");
    assert_eq!(a.failure_class, "budget");
    assert!(
        a.failure_reason
            .contains("maxTotalTokens 1200 would be exceeded: 950 tokens used"),
        "{}",
        a.failure_reason
    );
    // The second model call was refused, not made: only the first is charged.
    let t = site.timeline(&a.attempt_id).await;
    let last = t["calls"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["kind"].as_str(), last["status"].as_str()),
        (Some("model"), Some("failed"))
    );
    assert!(last["usage"].is_null());
    assert_eq!(t["usage"]["tokens"]["modelCalls"], 1);
    let report = site.a.get(&site.token, "/factory/usage").await;
    assert_eq!(report["total"]["inputTokens"], 900);
}

#[tokio::test]
async fn a_daily_token_quota_pauses_the_attempt_until_the_day_turns_and_names_itself() {
    let mut site = Site::on(Appliance::start_manual_clock()).await;
    let admin = site.a.admin_token().await;
    let (status, body) = site
        .a
        .put(
            &admin,
            "/factory/capacity/quotas/project.demo.support",
            json!({"tokensPerDay": 1000}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Tighten-only: a project cannot loosen its tenant's.
    let (status, _) = site
        .a
        .put(
            &admin,
            "/factory/capacity/quotas/tenant.demo",
            json!({"tokensPerDay": 5000}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, body) = site
        .a
        .put(
            &admin,
            "/factory/capacity/quotas/project.demo.support",
            json!({"tokensPerDay": 6000}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "tokensPerDay", "{body}");
    site.import(
        "triage-quota",
        json!([
            {"content": "Looking", "toolCalls": [{"tool": "lookup-ticket", "arguments": {"customer": "acme"}}],
             "usage": {"prompt_tokens": 900, "completion_tokens": 150}},
            counted(json!({"severity": "low", "summary": "checked", "paged": false}), 100, 10, 0)
        ]),
        |_| {},
    )
    .await;
    let run_id = site.submit("triage-quota").await;
    // 1050 used of 1000 after the first call: the second is refused and
    // the attempt pauses, naming the quota.
    let run = site.until(&run_id, "Paused").await;
    let attempt = run.steps[0].attempts[0].attempt_id.clone();
    let t = site.timeline(&attempt).await;
    let why = t["waitingReason"].as_str().unwrap();
    assert!(
        why.contains("tokensPerDay of project support: 1050 of 1000 used today"),
        "{why}"
    );
    let refused = t["calls"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(refused["kind"], "model");
    assert!(refused["error"].as_str().unwrap().contains("tokensPerDay"));
    // A lease heartbeat does not resume it; the next UTC day does.
    site.a.run_worker("LeaseHeartbeat").await;
    assert_eq!(site.timeline(&attempt).await["state"], "Paused");
    let now = chrono::Utc::now();
    let to_midnight = (now
        .date_naive()
        .succ_opt()
        .unwrap()
        .and_hms_opt(0, 0, 5)
        .unwrap()
        .and_utc()
        - now)
        .num_seconds() as u64;
    site.a.advance(to_midnight).await;
    site.token = site.a.token(&site.cred).await;
    let done = site.until(&run_id, "Succeeded").await;
    assert_eq!(done.state, "Succeeded");
    let report = site
        .a
        .get(
            &site.token,
            &format!("/factory/usage?from={}", now.date_naive()),
        )
        .await;
    assert_eq!(
        report["rows"].as_array().unwrap().len(),
        2,
        "two days: {report}"
    );
    assert_eq!(report["rows"][0]["totalTokens"], 1050);
    assert_eq!(report["rows"][1]["totalTokens"], 110);
}

#[tokio::test]
async fn a_daily_token_quota_fails_the_attempt_when_the_site_says_so() {
    let site = Site::on(Appliance::start_with(
        &[],
        &[("AGENTBAY_RUNTIME__WHEN_TOKENS_RUN_OUT", "fail")],
    ))
    .await;
    let admin = site.a.admin_token().await;
    let (status, body) = site
        .a
        .put(
            &admin,
            "/factory/capacity/quotas/tenant.demo",
            json!({"tokensPerDay": 500}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    site.import(
        "triage-quota-fail",
        json!([
            {"content": "Looking", "toolCalls": [{"tool": "lookup-ticket", "arguments": {"customer": "acme"}}],
             "usage": {"prompt_tokens": 400, "completion_tokens": 150}},
            counted(json!({"severity": "low", "summary": "checked", "paged": false}), 100, 10, 0)
        ]),
        |_| {},
    )
    .await;
    let run_id = site.submit("triage-quota-fail").await;
    let run = site.until(&run_id, "Failed").await;
    let a = &run.steps[0].attempts.last().unwrap();
    assert_eq!(a.failure_class, "budget");
    assert!(
        a.failure_reason
            .contains("tokensPerDay of tenant demo: 550 of 500 used today (UTC)")
            && a.failure_reason
                .contains("runtime.when_tokens_run_out = fail"),
        "{}",
        a.failure_reason
    );
}
