//! Security over real HTTPS against the real binary: the authorization
//! matrix of every REST route and RPC method, management actions by scope,
//! bounded connections and secret checks, private files, redirects that
//! stay on the appliance, and client errors that are never 5xx.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use agentbay::api::rpc::{Access, METHOD_ACCESS, RPC_METHODS};
use agentbay::domain::access::{Role, Scope};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{self, Appliance, problem};

/// What a REST route requires.
#[derive(Clone, Copy, Debug)]
enum Needs {
    /// Anyone, without a token.
    Public,
    /// A token holding the scope.
    Scope(Scope),
}

/// One REST operation of the matrix: what it needs, and a request that
/// aims at the other tenant's objects (`None`: the route addresses only the
/// caller's own tenant, so there is nothing of another tenant to name).
struct RestCase {
    needs: Needs,
    path: String,
    body: Option<Value>,
    other_tenant: Option<String>,
}

/// Ids of the victim tenant's objects.
struct Victim {
    run: String,
    attempt: String,
    /// A call of `attempt`.
    call: String,
    /// The content hash of the run's input.
    artifact: String,
    lease: String,
    release: String,
    pool: String,
    client: String,
}

/// The REST table: every operation of `/openapi.json` outside the RPC
/// paths must be here (a new route without an entry fails the test).
fn rest_table(v: &Victim) -> HashMap<&'static str, RestCase> {
    use Needs::{Public, Scope as S};
    let case = |needs, path: &str, body: Option<Value>, other: Option<String>| RestCase {
        needs,
        path: path.to_string(),
        body,
        other_tenant: other,
    };
    let pool = json!({"kind": "agent-runtime", "securityBoundary": "shared", "region": "local",
                      "nodeProfile": "small", "minSize": 1, "maxSize": 2});
    let hook = json!({"url": "https://hooks.example/agentbay", "events": ["run.ended"]});
    let some_hook = "/factory/webhooks/0190f0c4-0000-7000-8000-000000000001";
    HashMap::from([
        (
            "GET /factory/audit",
            case(
                S(Scope::Admin),
                "/factory/audit",
                None,
                Some("/factory/audit?tenant=demo".into()),
            ),
        ),
        (
            "GET /factory/audit/verify",
            case(S(Scope::Platform), "/factory/audit/verify", None, None),
        ),
        (
            "GET /factory/webhooks",
            case(
                S(Scope::Admin),
                "/factory/webhooks",
                None,
                Some("/factory/webhooks?tenant=demo".into()),
            ),
        ),
        (
            "POST /factory/webhooks",
            case(
                S(Scope::Admin),
                "/factory/webhooks",
                Some(hook.clone()),
                Some("/factory/webhooks?tenant=demo".into()),
            ),
        ),
        (
            "GET /factory/webhooks/{endpointId}",
            case(
                S(Scope::Admin),
                some_hook,
                None,
                Some(format!("{some_hook}?tenant=demo")),
            ),
        ),
        (
            "PUT /factory/webhooks/{endpointId}",
            case(
                S(Scope::Admin),
                some_hook,
                Some(hook.clone()),
                Some(format!("{some_hook}?tenant=demo")),
            ),
        ),
        (
            "DELETE /factory/webhooks/{endpointId}",
            case(
                S(Scope::Admin),
                some_hook,
                None,
                Some(format!("{some_hook}?tenant=demo")),
            ),
        ),
        (
            "POST /factory/webhooks/{endpointId}/rotate-secret",
            case(
                S(Scope::Admin),
                &format!("{some_hook}/rotate-secret"),
                None,
                Some(format!("{some_hook}/rotate-secret?tenant=demo")),
            ),
        ),
        (
            "GET /factory/webhooks/{endpointId}/deliveries",
            case(
                S(Scope::Admin),
                &format!("{some_hook}/deliveries"),
                None,
                Some(format!("{some_hook}/deliveries?tenant=demo")),
            ),
        ),
        (
            "POST /factory/webhooks/{endpointId}/deliveries/{messageId}/redeliver",
            case(
                S(Scope::Admin),
                &format!("{some_hook}/deliveries/evt_1/redeliver"),
                None,
                Some(format!(
                    "{some_hook}/deliveries/evt_1/redeliver?tenant=demo"
                )),
            ),
        ),
        ("GET /healthz", case(Public, "/healthz", None, None)),
        ("GET /readyz", case(Public, "/readyz", None, None)),
        (
            "POST /oauth/token",
            case(Public, "/oauth/token", None, None),
        ),
        (
            "GET /events",
            case(
                S(Scope::EventsRead),
                "/events?until=0",
                None,
                Some("/events?tenant=demo&until=0".into()),
            ),
        ),
        (
            "GET /events/head",
            case(
                S(Scope::EventsRead),
                "/events/head",
                None,
                Some("/events/head?tenant=demo".into()),
            ),
        ),
        (
            "GET /metrics",
            case(
                S(Scope::MetricsRead),
                "/metrics",
                None,
                Some("/metrics".into()),
            ),
        ),
        (
            "GET /factory/capacity/accounting",
            case(
                S(Scope::CapacityRead),
                "/factory/capacity/accounting",
                None,
                Some("/factory/capacity/accounting?tenant=demo".into()),
            ),
        ),
        (
            "GET /factory/usage",
            case(
                S(Scope::RunsRead),
                "/factory/usage",
                None,
                Some("/factory/usage?tenant=demo".into()),
            ),
        ),
        (
            "GET /factory/capacity/leases",
            case(
                S(Scope::CapacityRead),
                "/factory/capacity/leases",
                None,
                Some("/factory/capacity/leases?tenant=demo".into()),
            ),
        ),
        (
            "GET /factory/capacity/leases/{leaseId}",
            case(
                S(Scope::CapacityRead),
                &format!("/factory/capacity/leases/{}", v.lease),
                None,
                Some(format!("/factory/capacity/leases/{}", v.lease)),
            ),
        ),
        (
            "GET /factory/capacity/pools",
            case(
                S(Scope::CapacityRead),
                "/factory/capacity/pools",
                None,
                None,
            ),
        ),
        (
            "PUT /factory/capacity/pools/{poolId}",
            case(
                S(Scope::CapacityAdmin),
                "/factory/capacity/pools/matrix-pool",
                Some(pool.clone()),
                Some(format!("/factory/capacity/pools/{}", v.pool)),
            ),
        ),
        (
            "GET /factory/capacity/pools/{poolId}/queue",
            case(
                S(Scope::CapacityRead),
                &format!("/factory/capacity/pools/{}/queue", v.pool),
                None,
                Some(format!("/factory/capacity/pools/{}/queue", v.pool)),
            ),
        ),
        (
            "GET /factory/capacity/queue",
            case(
                S(Scope::CapacityRead),
                "/factory/capacity/queue",
                None,
                Some("/factory/capacity/queue?tenant=demo".into()),
            ),
        ),
        (
            "GET /factory/capacity/quotas",
            case(
                S(Scope::CapacityRead),
                "/factory/capacity/quotas",
                None,
                Some("/factory/capacity/quotas?tenant=demo".into()),
            ),
        ),
        (
            "PUT /factory/capacity/quotas/{scope}",
            case(
                S(Scope::CapacityAdmin),
                "/factory/capacity/quotas/project.globex.default",
                Some(json!({"concurrentRuns": 1})),
                Some("/factory/capacity/quotas/project.demo.support".into()),
            ),
        ),
        (
            "GET /platform/tenants",
            case(
                S(Scope::Platform),
                "/platform/tenants",
                None,
                Some("/platform/tenants".into()),
            ),
        ),
        (
            "GET /platform/tenants/{tenantId}",
            case(
                S(Scope::CapacityRead),
                "/platform/tenants/globex",
                None,
                Some("/platform/tenants/demo".into()),
            ),
        ),
        (
            "PUT /platform/tenants/{tenantId}",
            case(
                S(Scope::Platform),
                "/platform/tenants/globex",
                Some(json!({"edition": "starter"})),
                Some("/platform/tenants/demo".into()),
            ),
        ),
        (
            "PUT /platform/tenants/{tenantId}/projects/{projectId}",
            case(
                S(Scope::Admin),
                "/platform/tenants/globex/projects/matrix",
                Some(json!({})),
                Some("/platform/tenants/demo/projects/matrix".into()),
            ),
        ),
        (
            "GET /runtime/attempts/{attemptId}",
            case(
                S(Scope::RunsRead),
                &format!("/runtime/attempts/{}", v.attempt),
                None,
                Some(format!("/runtime/attempts/{}", v.attempt)),
            ),
        ),
        (
            "GET /runtime/runs/{runId}/export",
            case(
                S(Scope::RunsRead),
                &format!("/runtime/runs/{}/export", v.run),
                None,
                Some(format!("/runtime/runs/{}/export", v.run)),
            ),
        ),
        (
            "GET /runtime/attempts/{attemptId}/checkpoints",
            case(
                S(Scope::RunsRead),
                &format!("/runtime/attempts/{}/checkpoints", v.attempt),
                None,
                Some(format!("/runtime/attempts/{}/checkpoints", v.attempt)),
            ),
        ),
        (
            "GET /runtime/attempts/{attemptId}/calls/{callId}",
            case(
                S(Scope::RunsRead),
                &format!("/runtime/attempts/{}/calls/{}", v.attempt, v.call),
                None,
                Some(format!("/runtime/attempts/{}/calls/{}", v.attempt, v.call)),
            ),
        ),
        (
            "GET /runtime/artifacts/{hash}",
            case(
                S(Scope::RunsRead),
                &format!("/runtime/artifacts/{}", v.artifact),
                None,
                Some(format!("/runtime/artifacts/{}", v.artifact)),
            ),
        ),
        (
            "GET /runtime/attempts/{attemptId}/watch",
            case(
                S(Scope::RunsRead),
                &format!("/runtime/attempts/{}/watch", v.attempt),
                None,
                Some(format!("/runtime/attempts/{}/watch", v.attempt)),
            ),
        ),
        (
            "GET /runtime/attempts/{attemptId}/text",
            case(
                S(Scope::RunsRead),
                &format!("/runtime/attempts/{}/text", v.attempt),
                None,
                Some(format!("/runtime/attempts/{}/text", v.attempt)),
            ),
        ),
        (
            "GET /runtime/releases",
            case(
                S(Scope::AssetsRead),
                "/runtime/releases",
                None,
                Some("/runtime/releases?tenant=demo".into()),
            ),
        ),
        // The bundle names its tenant inside; an import for another tenant
        // is refused after reading it (see the releases tests).
        (
            "POST /runtime/releases",
            case(
                S(Scope::AssetsAdmin),
                "/runtime/releases",
                Some(json!({})),
                None,
            ),
        ),
        (
            "GET /runtime/releases/{releaseId}",
            case(
                S(Scope::AssetsRead),
                &format!("/runtime/releases/{}", v.release),
                None,
                Some(format!("/runtime/releases/{}", v.release)),
            ),
        ),
        (
            "POST /runtime/releases/{releaseId}/deprecate",
            case(
                S(Scope::AssetsAdmin),
                &format!("/runtime/releases/{}/deprecate", v.release),
                Some(json!({"inFlightPolicy": "finish"})),
                Some(format!("/runtime/releases/{}/deprecate", v.release)),
            ),
        ),
        (
            "POST /runtime/releases/{releaseId}/revoke",
            case(
                S(Scope::AssetsAdmin),
                &format!("/runtime/releases/{}/revoke", v.release),
                Some(json!({"inFlightPolicy": "finish"})),
                Some(format!("/runtime/releases/{}/revoke", v.release)),
            ),
        ),
    ])
}

/// The RPC table: a request aimed at the other tenant's objects per
/// method (`None`: the method addresses only the caller's own tenant).
/// Every method of [`METHOD_ACCESS`] must be here.
fn rpc_table(v: &Victim) -> HashMap<&'static str, Option<Value>> {
    let uuid = "0190e5a0-0000-7000-8000-000000000001";
    let adapter = |extra: Value| {
        let mut body = json!({"attemptId": v.attempt, "fencingToken": 1});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        Some(body)
    };
    HashMap::from([
        ("agentbay.admin.v1.Admin/GetVersion", None),
        (
            "agentbay.admin.v1.Admin/CreateClient",
            Some(json!({"tenantId": "demo", "scopes": ["factory.runs.read"]})),
        ),
        ("agentbay.admin.v1.Admin/ListClients", None),
        (
            "agentbay.admin.v1.Admin/RevokeClient",
            Some(json!({"clientId": v.client})),
        ),
        (
            "agentbay.admin.v1.Admin/CreateUser",
            Some(
                json!({"tenantId": "demo", "username": "mallory", "roles": ["Observer"],
                     "password": "correct horse battery staple"}),
            ),
        ),
        (
            "agentbay.admin.v1.Admin/ListUsers",
            Some(json!({"tenantId": "demo"})),
        ),
        (
            "agentbay.admin.v1.Admin/DisableUser",
            Some(json!({"tenantId": "demo", "username": "alice"})),
        ),
        (
            "agentbay.admin.v1.Admin/EnableUser",
            Some(json!({"tenantId": "demo", "username": "alice"})),
        ),
        (
            "agentbay.admin.v1.Admin/ResetUserPassword",
            Some(
                json!({"tenantId": "demo", "username": "alice", "password": "correct horse battery staple"}),
            ),
        ),
        (
            "agentbay.admin.v1.Admin/SetUserEmail",
            Some(json!({"tenantId": "demo", "username": "alice", "email": "alice@site.test"})),
        ),
        ("agentbay.admin.v1.Admin/Backup", Some(json!({}))),
        ("agentbay.admin.v1.Admin/WatchEvents", None),
        ("agentbay.admin.v1.Admin/GetEventsHead", None),
        (
            "agentbay.admin.v1.Admin/PutTenant",
            Some(json!({"tenantId": "demo", "edition": "starter"})),
        ),
        ("agentbay.admin.v1.Admin/ListTenants", Some(json!({}))),
        (
            "agentbay.admin.v1.Admin/TrustPublisherKey",
            Some(
                json!({"name": "stranger", "publicKey": "ygxSy398UPvGnOXD8+sFPISaChDKyOdH5V3hEWr+p5E="}),
            ),
        ),
        ("agentbay.admin.v1.Admin/ListPublisherKeys", Some(json!({}))),
        (
            "agentbay.admin.v1.Admin/RevokePublisherKey",
            Some(json!({"keyId": "ed25519:0000000000000000", "reason": "probe"})),
        ),
        (
            "agentbay.admin.v1.Admin/PutModelProfile",
            Some(
                json!({"profileId": "probe", "tenantId": "demo", "endpoint": "http://127.0.0.1:9/v1", "model": "m"}),
            ),
        ),
        ("agentbay.admin.v1.Admin/ListModelProfiles", Some(json!({}))),
        (
            "agentbay.admin.v1.Admin/ReloadConfiguration",
            Some(json!({})),
        ),
        (
            "agentbay.admin.v1.Admin/DeleteModelProfile",
            Some(json!({"profileId": "probe", "tenantId": "demo"})),
        ),
        (
            "agentbay.admin.v1.Admin/PutProject",
            Some(json!({"tenantId": "demo", "projectId": "x"})),
        ),
        (
            "agentbay.admin.v1.Admin/RunWorker",
            Some(json!({"name": "LeaseExpirer"})),
        ),
        (
            "agentbay.admin.v1.Admin/AdvanceClock",
            Some(json!({"seconds": 1})),
        ),
        (
            "agentbay.capacity.v1.Capacity/AcquireLease",
            Some(
                json!({"tenantId": "globex", "projectId": "default", "holderKind": "attempt",
                     "holderId": "matrix", "runId": "0190e5a0-0000-7000-8000-000000000001", "attemptId": "0190e5a0-0000-7000-8000-000000000001", "cpu": 1, "memoryGb": 1, "poolId": v.pool}),
            ),
        ),
        (
            "agentbay.capacity.v1.Capacity/RenewLease",
            Some(json!({"leaseId": v.lease})),
        ),
        (
            "agentbay.capacity.v1.Capacity/ReleaseLease",
            Some(json!({"leaseId": v.lease})),
        ),
        (
            "agentbay.runs.v1.Runs/SubmitRun",
            Some(json!({"projectId": "default", "releaseId": v.release, "inputJson": "{}"})),
        ),
        (
            "agentbay.runs.v1.Runs/GetRun",
            Some(json!({"runId": v.run})),
        ),
        (
            "agentbay.runs.v1.Runs/ListRuns",
            Some(json!({"tenantId": "demo"})),
        ),
        (
            "agentbay.runs.v1.Runs/GetUsage",
            Some(json!({"tenantId": "demo"})),
        ),
        (
            "agentbay.runs.v1.Runs/CancelRun",
            Some(json!({"runId": v.run})),
        ),
        (
            "agentbay.runs.v1.Runs/HoldRun",
            Some(json!({"runId": v.run, "reason": "case 1"})),
        ),
        (
            "agentbay.runs.v1.Runs/RerunFromCheckpoint",
            Some(json!({"attemptId": v.attempt})),
        ),
        (
            "agentbay.runs.v1.Runs/DecideApproval",
            Some(json!({"approvalId": uuid, "approve": true})),
        ),
        (
            "agentbay.runs.v1.Runs/SettleCall",
            Some(
                json!({"attemptId": v.attempt, "callId": uuid, "effect": "happened", "reason": "checked"}),
            ),
        ),
        (
            "agentbay.runtime.v1.Runtime/Interrupt",
            Some(json!({"attemptId": v.attempt})),
        ),
        (
            "agentbay.runtime.v1.Runtime/AnswerDecision",
            Some(json!({"attemptId": v.attempt, "decisionId": uuid, "choice": "yes"})),
        ),
        (
            "agentbay.runtime.v1.Runtime/WatchAttempt",
            Some(json!({"attemptId": v.attempt})),
        ),
        ("agentbay.adapter.v1.Adapter/ClaimAttempt", None),
        (
            "agentbay.adapter.v1.Adapter/StartAttempt",
            adapter(json!({"adapterVersion": "x"})),
        ),
        ("agentbay.adapter.v1.Adapter/Heartbeat", adapter(json!({}))),
        (
            "agentbay.adapter.v1.Adapter/BeginCall",
            adapter(json!({"kind": "model", "target": "m", "requestJson": "{}"})),
        ),
        (
            "agentbay.adapter.v1.Adapter/CompleteCall",
            adapter(json!({"callId": uuid, "ok": true})),
        ),
        (
            "agentbay.adapter.v1.Adapter/CallModel",
            adapter(json!({"messagesJson": "[{\"role\":\"user\",\"content\":\"hi\"}]"})),
        ),
        (
            "agentbay.adapter.v1.Adapter/StreamModel",
            adapter(json!({"messagesJson": "[{\"role\":\"user\",\"content\":\"hi\"}]"})),
        ),
        (
            "agentbay.adapter.v1.Adapter/AwaitCall",
            adapter(json!({"callId": uuid})),
        ),
        (
            "agentbay.adapter.v1.Adapter/Checkpoint",
            adapter(json!({"stateJson": "{}"})),
        ),
        (
            "agentbay.adapter.v1.Adapter/RequestDecision",
            adapter(json!({"kind": "input", "summary": "?"})),
        ),
        (
            "agentbay.adapter.v1.Adapter/AwaitDecision",
            adapter(json!({"decisionId": uuid})),
        ),
        (
            "agentbay.adapter.v1.Adapter/ReportOutcome",
            adapter(json!({"succeeded": true, "outputJson": "{}"})),
        ),
    ])
}

/// A Connect call over plain HTTPS: the Connect code of the answer
/// (`ok` for a success) and the HTTP status.
async fn connect_call(
    http: &reqwest::Client,
    url: &str,
    method: &str,
    token: Option<&str>,
    body: &Value,
) -> (String, u16) {
    let streaming = RPC_METHODS
        .iter()
        .any(|m| m.server_streaming && m.path() == method);
    let payload = serde_json::to_vec(body).unwrap();
    let mut request = http.post(format!("{url}/{method}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let request = if streaming {
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        framed.extend_from_slice(&payload);
        request
            .header("content-type", "application/connect+json")
            .body(framed)
    } else {
        request
            .header("content-type", "application/json")
            .body(payload)
    };
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let is_json = response
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap_or("").starts_with("application/json"));
    // A streaming call is answered in streaming framing, refusals too:
    // HTTP 200 and the error in the end-of-stream message.
    assert!(
        !(streaming && is_json),
        "{method} answered a Connect streaming call in unary framing (HTTP {status})"
    );
    if !streaming {
        let v: Value = response.json().await.unwrap_or(Value::Null);
        let code = if status == 200 {
            "ok".to_string()
        } else {
            v["code"].as_str().unwrap_or("?").to_string()
        };
        return (code, status);
    }
    // A stream: the first envelope that ends it carries the error.
    let mut response = response;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = response.chunk().await.unwrap() {
            buf.extend_from_slice(&chunk);
            if buf.len() >= 5 {
                let len = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
                if buf.len() >= 5 + len {
                    if buf[0] & 2 == 0 {
                        return "ok".to_string();
                    }
                    let message: Value = serde_json::from_slice(&buf[5..5 + len]).unwrap();
                    return message["error"]["code"]
                        .as_str()
                        .unwrap_or("ok")
                        .to_string();
                }
            }
        }
        "ok".to_string()
    })
    .await;
    (read.unwrap_or_else(|_| "ok".into()), status)
}

/// A client of `tenant` with `scopes`, and its token.
async fn token_with(a: &Appliance, tenant: &str, scopes: &BTreeSet<Scope>) -> String {
    let names: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    let credential = a.create_client(tenant, &names).await;
    a.token(&credential).await
}

/// The victim tenant `demo`'s objects: the demo's runs and release, a
/// dedicated pool, a lease and a credential.
async fn victim(a: &Appliance, admin: &str) -> Victim {
    let http = a.http();
    let (_, runs) = a
        .http()
        .post(format!("{}/agentbay.runs.v1.Runs/ListRuns", a.url))
        .bearer_auth(admin)
        .json(&json!({"tenantId": "demo"}))
        .send()
        .await
        .map(|r| (r.status(), r))
        .unwrap();
    let runs: Value = runs.json().await.unwrap();
    let run = &runs["runs"][0];
    let attempt = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["attempts"].as_array().unwrap().iter())
        .next_back()
        .expect("a run has attempts")["attemptId"]
        .as_str()
        .unwrap()
        .to_string();
    // The demo's runs make calls at once; wait for the attempt's first.
    let mut call = String::new();
    for _ in 0..400 {
        let t = a
            .get(admin, &format!("/runtime/attempts/{attempt}?tenant=demo"))
            .await;
        if let Some(id) = t["calls"][0]["callId"].as_str() {
            call = id.to_string();
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(!call.is_empty(), "the demo attempt {attempt} made no call");
    let releases = a.get(admin, "/runtime/releases?tenant=demo").await;
    let release = releases["releases"][0]["releaseId"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, p) = a
        .put(
            admin,
            "/factory/capacity/pools/demo-dedicated",
            json!({"tenantId": "demo", "kind": "agent-runtime", "securityBoundary": "tenant-dedicated",
                   "region": "local", "nodeProfile": "small", "minSize": 1, "maxSize": 1}),
        )
        .await;
    assert_eq!(s, 200, "{p}");
    let lease = a
        .capacity(admin)
        .acquire_lease(
            agentbay::proto::agentbay::capacity::v1::AcquireLeaseRequest {
                tenant_id: "demo".into(),
                project_id: "support".into(),
                holder_kind: "attempt".into(),
                holder_id: "victim".into(),
                cpu: 0.5,
                memory_gb: 0.5,
                pool_id: "demo-dedicated".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .into_owned();
    let client = a.create_client("demo", &["factory.runs.read"]).await;
    drop(http);
    Victim {
        run: run["runId"].as_str().unwrap().to_string(),
        artifact: run["inputRef"].as_str().unwrap().to_string(),
        attempt,
        call,
        lease: lease.lease.as_option().unwrap().lease_id.clone(),
        release,
        pool: "demo-dedicated".into(),
        client: client.id,
    }
}

#[tokio::test]
async fn every_route_and_method_refuses_the_anonymous_the_unentitled_and_other_tenants() {
    let a = crate::console::demo();
    let admin = a.admin_token().await;
    let v = victim(&a, &admin).await;
    a.tenant("globex", "starter", &["local"], &["default"])
        .await;
    let grantable: BTreeSet<Scope> = Scope::ALL
        .iter()
        .copied()
        .filter(|s| !s.platform_only())
        .collect();
    let globex = token_with(&a, "globex", &grantable).await;
    let mut lacking: HashMap<Scope, String> = HashMap::new();
    for scope in Scope::ALL {
        let mut set = grantable.clone();
        set.remove(scope);
        let token = if set.len() == grantable.len() {
            globex.clone()
        } else {
            token_with(&a, "globex", &set).await
        };
        lacking.insert(*scope, token);
    }
    let http = a.http();
    let mut failures = Vec::new();

    // REST: the table covers every operation of the published contract.
    let openapi: Value = http
        .get(format!("{}/openapi.json", a.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let table = rest_table(&v);
    let mut seen = BTreeSet::new();
    for (path, ops) in openapi["paths"].as_object().unwrap() {
        if path.starts_with("/agentbay.") {
            continue;
        }
        for method in ops.as_object().unwrap().keys() {
            let key = format!("{} {path}", method.to_uppercase());
            let Some(case) = table.get(key.as_str()) else {
                failures.push(format!("{key}: no entry in the authorization matrix"));
                continue;
            };
            seen.insert(key.clone());
            let Needs::Scope(scope) = case.needs else {
                continue;
            };
            let send = |token: Option<&str>, path: &str| {
                let mut r = http.request(
                    method.to_uppercase().parse().unwrap(),
                    format!("{}{path}", a.url),
                );
                if let Some(t) = token {
                    r = r.bearer_auth(t);
                }
                if let Some(body) = &case.body {
                    r = r.json(body);
                }
                r.send()
            };
            let status = send(None, &case.path).await.unwrap().status().as_u16();
            if status != 401 {
                failures.push(format!("{key} without a token: {status}, not 401"));
            }
            let status = send(Some(&lacking[&scope]), &case.path)
                .await
                .unwrap()
                .status()
                .as_u16();
            if status != 403 {
                failures.push(format!("{key} without {scope}: {status}, not 403"));
            }
            if let Some(other) = &case.other_tenant {
                let status = send(Some(&globex), other).await.unwrap().status().as_u16();
                if status != 403 && status != 404 {
                    failures.push(format!(
                        "{key} at tenant demo's {other}: {status}, not 403/404"
                    ));
                }
            }
        }
    }
    for key in table.keys() {
        if !seen.contains(*key) {
            failures.push(format!("{key}: in the matrix but not in /openapi.json"));
        }
    }

    // RPC: every method of the access table.
    let rpc = rpc_table(&v);
    for (method, access) in METHOD_ACCESS {
        let Some(other) = rpc.get(method) else {
            failures.push(format!("{method}: no entry in the authorization matrix"));
            continue;
        };
        let body = other.clone().unwrap_or(json!({}));
        let (code, status) = connect_call(&http, &a.url, method, None, &body).await;
        if code != "unauthenticated" || status >= 500 {
            failures.push(format!("{method} without a token: {code} ({status})"));
        }
        if let Access::Scope(scope) = access {
            let (code, status) =
                connect_call(&http, &a.url, method, Some(&lacking[scope]), &body).await;
            if code != "permission_denied" || status >= 500 {
                failures.push(format!("{method} without {scope}: {code} ({status})"));
            }
        }
        if let Some(other) = other {
            let (code, status) = connect_call(&http, &a.url, method, Some(&globex), other).await;
            if !matches!(code.as_str(), "permission_denied" | "not_found") || status >= 500 {
                failures.push(format!(
                    "{method} at tenant demo's objects: {code} ({status})"
                ));
            }
        }
    }
    for method in rpc.keys() {
        if !METHOD_ACCESS.iter().any(|(m, _)| m == method) {
            failures.push(format!("{method}: in the matrix but not a method"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A PlatformAdmin acts on a tenant's run by naming the tenant; another
    // tenant naming it is refused.
    for release in [false, true] {
        let body =
            json!({"runId": v.run, "tenantId": "demo", "reason": "case 2", "release": release});
        let (code, status) = connect_call(
            &http,
            &a.url,
            "agentbay.runs.v1.Runs/HoldRun",
            Some(&admin),
            &body,
        )
        .await;
        assert_eq!((code.as_str(), status), ("ok", 200), "{body}");
        let (code, _) = connect_call(
            &http,
            &a.url,
            "agentbay.runs.v1.Runs/HoldRun",
            Some(&globex),
            &body,
        )
        .await;
        assert_eq!(code, "permission_denied", "{body}");
    }
    assert!(
        !a.log().contains("\"level\":\"ERROR\"") && !a.log().contains(" ERROR "),
        "no probe is an internal error:\n{}",
        a.log()
    );
}

const PASSWORD: &str = "correct horse battery staple";

#[tokio::test]
async fn management_follows_the_callers_scopes_for_every_pair_of_roles() {
    let a = Appliance::start();
    let admin = a.admin_token().await;
    let rpc = |token: &str| {
        let http = a.http();
        let url = a.url.clone();
        let token = token.to_string();
        move |method: &'static str, body: Value| {
            let http = http.clone();
            let url = url.clone();
            let token = token.clone();
            async move {
                let full = format!("agentbay.admin.v1.Admin/{method}");
                let r = http
                    .post(format!("{url}/{full}"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let v: Value = r.json().await.unwrap_or(Value::Null);
                (status, v)
            }
        }
    };
    let as_admin = rpc(&admin);

    // The last active PlatformAdmin user and credential stay.
    // (Connect answers failed_precondition with HTTP 400.)
    let (_, v) = as_admin(
        "DisableUser",
        json!({"tenantId": "platform", "username": "admin"}),
    )
    .await;
    assert_eq!(v["code"], "failed_precondition", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("last active PlatformAdmin"),
        "{v}"
    );
    let (_, v) = as_admin("RevokeClient", json!({"clientId": a.admin.id})).await;
    assert_eq!(v["code"], "failed_precondition", "{v}");
    // A credential with agentbay.platform alone manages nothing: it does
    // not count as another PlatformAdmin.
    let (s, v) = as_admin(
        "CreateClient",
        json!({"tenantId": "platform", "scopes": ["agentbay.platform"]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (_, v) = as_admin("RevokeClient", json!({"clientId": a.admin.id})).await;
    assert_eq!(v["code"], "failed_precondition", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("last active PlatformAdmin"),
        "{v}"
    );

    let roles = [
        Role::Observer,
        Role::Requester,
        Role::Reviewer,
        Role::Operator,
        Role::WorkspaceAdmin,
        Role::PlatformAdmin,
    ];
    let mut callers = HashMap::new();
    for caller in roles {
        callers.insert(caller, token_with(&a, "platform", &caller.scopes()).await);
    }
    let mut failures = Vec::new();
    let mut checked = 0;
    for caller in roles {
        let as_caller = rpc(&callers[&caller]);
        let caller_scopes = caller.scopes();
        for target in roles {
            let target_scopes = target.scopes();
            let missing: Vec<Scope> = target_scopes.difference(&caller_scopes).copied().collect();
            let allowed = caller_scopes.contains(&Scope::Admin) && missing.is_empty();
            let name = format!("t-{}-{}", caller.as_str(), target.as_str()).to_lowercase();
            let (s, v) = as_admin(
                "CreateUser",
                json!({"tenantId": "platform", "username": name, "roles": [target.as_str()],
                       "password": PASSWORD}),
            )
            .await;
            assert_eq!(s, 200, "{v}");
            let scopes: Vec<&str> = target_scopes.iter().map(|s| s.as_str()).collect();
            let (s, v) = as_admin(
                "CreateClient",
                json!({"tenantId": "platform", "scopes": scopes}),
            )
            .await;
            assert_eq!(s, 200, "{v}");
            let client = v["client"]["clientId"].as_str().unwrap().to_string();
            let user = json!({"tenantId": "platform", "username": name});
            let mut with_password = user.clone();
            with_password["password"] = json!("another long enough password");
            let actions: Vec<(&str, Value)> = vec![
                (
                    "CreateUser",
                    json!({"tenantId": "platform", "username": format!("{name}-new"),
                           "roles": [target.as_str()], "password": PASSWORD}),
                ),
                (
                    "CreateClient",
                    json!({"tenantId": "platform", "scopes": scopes}),
                ),
                ("ResetUserPassword", with_password),
                ("SetUserEmail", {
                    let mut with_email = user.clone();
                    with_email["email"] = json!(format!("{name}@site.test"));
                    with_email
                }),
                ("DisableUser", user.clone()),
                ("EnableUser", user.clone()),
                ("RevokeClient", json!({"clientId": client})),
            ];
            for (action, body) in actions {
                if action == "EnableUser" {
                    // Whatever the caller's disable did, the user is
                    // disabled before the caller tries to enable it.
                    let _ = as_admin("DisableUser", user.clone()).await;
                }
                let (s, v) = as_caller(action, body).await;
                checked += 1;
                let what = format!("{} {action} on a {}", caller.as_str(), target.as_str());
                if allowed {
                    if s != 200 {
                        failures.push(format!("{what}: {s} {v}, should be allowed"));
                    }
                } else if s != 403 {
                    failures.push(format!("{what}: {s} {v}, should be 403"));
                } else if caller_scopes.contains(&Scope::Admin) {
                    // Refused by the rule: the answer names a scope the
                    // caller lacks.
                    let message = v["message"].as_str().unwrap_or_default();
                    if !missing.iter().any(|m| message.contains(m.as_str())) {
                        failures.push(format!("{what}: {message:?} names no missing scope"));
                    }
                }
            }
        }
    }
    assert_eq!(checked, 6 * 6 * 7);
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Every such action is an event with its actor.
    let events = common::events(&a, &admin, "agentbay.admin.v1.user-disabled", 3).await;
    let text = serde_json::to_string(&events).unwrap();
    assert!(text.contains("platform."), "the actor is named: {text}");
}

/// A TLS connection to the appliance, ALPN as given.
async fn tls(
    a: &Appliance,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut config = agentbay::tls::pinned_client_config(&a.fingerprint);
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let addr = a.url.trim_start_matches("https://");
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    connector
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap()
}

/// Seconds until the server closes the connection (EOF or error).
async fn closed_after<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, limit: Duration) -> f64 {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    started.elapsed().as_secs_f64()
}

#[tokio::test]
async fn slow_idle_and_surplus_connections_are_closed_while_requests_go_on() {
    let a = Appliance::start_with(
        &[],
        &[
            ("AGENTBAY_HTTP__HEADER_READ_TIMEOUT_SECONDS", "1"),
            ("AGENTBAY_HTTP__IDLE_TIMEOUT_SECONDS", "2"),
        ],
    );
    let healthy = || async {
        let r = a
            .http()
            .get(format!("{}/healthz", a.url))
            .send()
            .await
            .unwrap();
        r.status().as_u16()
    };
    // A slow-header client: a byte every 300 ms, never a whole head.
    let mut slow = tls(&a, &[b"http/1.1"]).await;
    let slow_task = tokio::spawn(async move {
        let started = Instant::now();
        for b in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaa".iter() {
            if slow.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let rest = closed_after(&mut slow, Duration::from_secs(10)).await;
        started.elapsed().as_secs_f64().max(rest)
    });
    // An idle HTTP/1.1 connection after one request.
    let mut idle = tls(&a, &[b"http/1.1"]).await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    let idle_task =
        tokio::spawn(async move { closed_after(&mut idle, Duration::from_secs(10)).await });
    // An idle HTTP/2 connection: closed with no stream open.
    let h2_conn = tls(&a, &[b"h2"]).await;
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(h2_conn),
    )
    .await
    .unwrap();
    let h2_task = tokio::spawn(async move {
        let started = Instant::now();
        let _ = tokio::time::timeout(Duration::from_secs(10), connection).await;
        started.elapsed().as_secs_f64()
    });
    let response = sender
        .send_request(
            http::Request::get(format!("{}/healthz", a.url))
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    drop(response);
    // Normal requests are served meanwhile.
    for _ in 0..5 {
        assert_eq!(healthy().await, 200);
    }
    let slow_closed = slow_task.await.unwrap();
    let idle_closed = idle_task.await.unwrap();
    let h2_closed = h2_task.await.unwrap();
    assert!(
        slow_closed < 4.0,
        "slow header closed after {slow_closed:.1} s"
    );
    assert!(
        (1.5..5.0).contains(&idle_closed),
        "idle closed after {idle_closed:.1} s"
    );
    assert!(
        (1.5..5.0).contains(&h2_closed),
        "HTTP/2 idle closed after {h2_closed:.1} s"
    );
}

#[tokio::test]
async fn a_trickled_body_is_cut_at_its_deadline() {
    let a = Appliance::start_with(&[], &[("AGENTBAY_HTTP__BODY_READ_TIMEOUT_SECONDS", "2")]);
    let mut conn = tls(&a, &[b"http/1.1"]).await;
    let started = Instant::now();
    conn.write_all(
        b"POST /oauth/token HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 200\r\n\r\ngrant_type=",
    )
    .await
    .unwrap();
    // A byte every 300 ms: the body would take a minute.
    let (mut read, mut write) = tokio::io::split(conn);
    let trickle = tokio::spawn(async move {
        for _ in 0..200 {
            if write.write_all(b"a").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), read.read_to_end(&mut answer)).await;
    let took = started.elapsed().as_secs_f64();
    trickle.abort();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("http.body_read_timeout_seconds"),
        "{answer}"
    );
    assert!((1.5..15.0).contains(&took), "cut after {took:.1} s");
}

#[tokio::test]
async fn a_connection_over_the_cap_is_closed_at_once_and_logged() {
    let a = Appliance::start_with(&[], &[("AGENTBAY_HTTP__MAX_CONNECTIONS", "8")]);
    let addr = a.url.trim_start_matches("https://").to_string();
    // Nine connections at once: whichever the appliance takes last (they
    // are accepted concurrently) is closed at once; eight stay open.
    let mut held = Vec::new();
    for _ in 0..9 {
        held.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    let mut lived = Vec::new();
    for c in &mut held {
        lived.push(closed_after(c, Duration::from_millis(500)).await);
    }
    let closed = lived.iter().filter(|s| **s < 0.4).count();
    assert_eq!(closed, 1, "lifetimes over the cap of eight: {lived:?}");
    assert!(
        a.log()
            .contains("connection limit (http.max_connections) is reached"),
        "{}",
        a.log()
    );
    // Once the held ones end, requests are served again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ok = a
            .http()
            .get(format!("{}/healthz", a.url))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200);
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "served again after the held end");
    }
}

/// The resident-memory high-water mark of a process, in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        / 1024
}

#[tokio::test]
async fn floods_of_unknown_paths_and_sign_ins_leave_metrics_and_memory_bounded() {
    let a = Appliance::start();
    let admin = a.admin_token().await;
    observer(&a, &admin, "olga").await;
    let series = |text: &str| -> usize {
        text.lines()
            .filter(|l| l.starts_with("agentbay_http_requests_total{"))
            .count()
    };
    let http = a.http();
    let scrape = || async {
        http.get(format!("{}/metrics", a.url))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    // Warm both answers once, then flood.
    for path in ["/a.b/c", "/nothing"] {
        http.get(format!("{}{path}", a.url)).send().await.unwrap();
        http.post(format!("{}{path}", a.url)).send().await.unwrap();
    }
    let before = series(&scrape().await);
    let flood: Vec<_> = (0..3000)
        .map(|i| {
            let http = http.clone();
            let url = match i % 3 {
                0 => format!("{}/x{i}.y/z{i}", a.url),
                1 => format!("{}/nothing/{i}", a.url),
                _ => format!("{}/agentbay.admin.v1.Admin/Nope{i}", a.url),
            };
            async move { http.post(url).send().await.unwrap().status().as_u16() }
        })
        .collect();
    let statuses = futures::future::join_all(flood).await;
    assert!(statuses.iter().all(|s| (400..500).contains(s)));
    let after = scrape().await;
    assert!(
        series(&after) <= before + 2,
        "{} series before, {} after",
        before,
        series(&after)
    );
    assert!(!after.contains("x1.y") && !after.contains("Nope1"));

    // A flood of sign-ins with made-up names from many addresses: the
    // hashing gate bounds memory, the right password still signs in.
    let pid = a.child.as_ref().unwrap().id();
    let baseline = peak_rss_mib(pid);
    let signins: Vec<_> = (0..400)
        .map(|i| {
            let source = format!("127.0.{}.{}", 1 + i / 200, 2 + i % 200);
            let c = common::https_client_at(&a.fingerprint, Some(&source));
            let url = format!("{}/signin", a.url);
            async move {
                c.post(url)
                    .form(&[
                        ("username", format!("nobody{i}")),
                        ("password", "guess".into()),
                    ])
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            }
        })
        .collect();
    let statuses = futures::future::join_all(signins).await;
    let limited = statuses.iter().filter(|s| **s == 429).count();
    let refused = statuses.iter().filter(|s| **s == 401).count();
    assert_eq!(limited + refused, statuses.len(), "{statuses:?}");
    let peak = peak_rss_mib(pid);
    println!(
        "sign-in flood: 400 concurrent, {refused} checked (401), {limited} refused (429); peak RSS {peak} MiB (before {baseline} MiB)"
    );
    // Six argon2id checks of 19 MiB at once (auth.hash_memory_mb = 128),
    // plus connections and buffers.
    assert!(
        peak <= baseline + 128 + 64,
        "peak {peak} MiB, baseline {baseline} MiB"
    );
    let c = common::https_client_at(&a.fingerprint, Some("127.0.1.2"));
    let r = c
        .post(format!("{}/signin", a.url))
        .form(&[("username", "olga"), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "the right password still signs in");
}

async fn observer(a: &Appliance, admin: &str, name: &str) {
    a.rpc_json(admin)
        .create_user(agentbay::proto::agentbay::admin::v1::CreateUserRequest {
            tenant_id: "platform".into(),
            username: name.into(),
            roles: vec!["Observer".into()],
            password: PASSWORD.into(),
            ..Default::default()
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn secrets_are_private_whatever_the_umask() {
    let a = Appliance::start();
    let mode = |p: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    };
    // A backup made under umask 022 holds every key and hash: 0600.
    let backup = a.root.join("site.agentbay");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask 022 && exec {} backup {} --data-dir {}",
            common::binary(),
            backup.display(),
            a.data_dir.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&backup), 0o600);
    let restored = a.root.join("restored");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask 022 && exec {} restore {} --data-dir {}",
            common::binary(),
            backup.display(),
            restored.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for dir in [&a.data_dir, &restored] {
        assert_eq!(mode(dir), 0o700, "{}", dir.display());
        for entry in walk(dir) {
            let m = mode(&entry);
            let name = entry
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .to_string();
            if entry.is_dir() {
                assert_eq!(m, 0o700, "{name}");
            } else if name == "tls/ca.pem" {
                assert_eq!(m, 0o644, "clients need the CA certificate");
            } else if name != "lock" {
                assert_eq!(m & 0o077, 0, "{name} is {m:o}");
            }
        }
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

#[tokio::test]
async fn sign_in_sends_the_browser_back_only_to_the_appliance() {
    let a = Appliance::start();
    let admin = a.admin_token().await;
    observer(&a, &admin, "olga").await;
    let c = common::https_client_at(&a.fingerprint, None);
    for (next, expected) in [
        ("/attempts?state=Failed", "/attempts?state=Failed"),
        ("/%09/evil.example/x", "/%09/evil.example/x"),
        ("/\t/evil.example/x", "/"),
        ("/\n/evil.example", "/"),
        ("/\r\nSet-Cookie: x=y", "/"),
        ("//evil.example/x", "/"),
        ("/\\evil.example", "/"),
        ("\\\\evil.example", "/"),
        ("https://evil.example/", "/"),
        ("/ /evil.example", "/"),
        ("javascript:alert(1)", "/"),
        ("", "/"),
    ] {
        // The form carries `next` as the browser sent it in the query.
        let query = serde_urlencoded::to_string([("next", next)]).unwrap();
        let page = c
            .get(format!("{}/signin?{query}", a.url))
            .send()
            .await
            .unwrap();
        assert_eq!(page.status(), 200, "{next:?}");
        let r = c
            .post(format!("{}/signin", a.url))
            .form(&[("username", "olga"), ("password", PASSWORD), ("next", next)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 303, "{next:?}");
        assert_eq!(r.headers()["location"], expected, "{next:?}");
    }
}

#[tokio::test]
async fn client_mistakes_are_4xx_with_the_reason_never_5xx() {
    let a = Appliance::start();
    let admin = a.admin_token().await;
    a.tenant("acme", "starter", &["local"], &["default"]).await;
    let http = a.http();
    // CancelRun of a run that does not exist.
    let (code, status) = connect_call(
        &http,
        &a.url,
        "agentbay.runs.v1.Runs/CancelRun",
        Some(&admin),
        &json!({"runId": "0190e5a0-0000-7000-8000-0000000000ff"}),
    )
    .await;
    assert_eq!((code.as_str(), status), ("not_found", 404));
    // A unary call to a streaming method names the content type to use.
    let r = http
        .post(format!(
            "{}/agentbay.runtime.v1.Runtime/WatchAttempt",
            a.url
        ))
        .bearer_auth(&admin)
        .json(&json!({"attemptId": "0190e5a0-0000-7000-8000-0000000000ff"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "invalid_argument");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("application/connect+json"),
        "{v}"
    );
    // An RPC body that is not an object (the decoder would read an array
    // positionally).
    for body in [
        json!([]),
        json!(["0190e5a0-0000-7000-8000-0000000000ff", "acme"]),
    ] {
        let (code, status) = connect_call(
            &http,
            &a.url,
            "agentbay.runs.v1.Runs/GetRun",
            Some(&admin),
            &body,
        )
        .await;
        assert_eq!((code.as_str(), status), ("invalid_argument", 400), "{body}");
    }
    // A Connect JSON body is held to its message: a misspelt field, at any
    // depth, and a value of the wrong type or range are refused naming the
    // field; the proto name of a field is proto3 JSON too; a gzipped body
    // is judged by its JSON.
    for (method, body, field) in [
        (
            "agentbay.runs.v1.Runs/ListRuns",
            json!({"tenantID": "acme"}),
            "tenantID",
        ),
        (
            "agentbay.runs.v1.Runs/ListRuns",
            json!({"pageSize": -1}),
            "pageSize",
        ),
        (
            "agentbay.admin.v1.Admin/CreateUser",
            json!({"tenantId": "acme", "username": "u1", "roles": "Observer"}),
            "roles",
        ),
        (
            "agentbay.adapter.v1.Adapter/Heartbeat",
            json!({"attemptId": "0190e5a0-0000-7000-8000-0000000000ff", "fencingToken": "-1"}),
            "fencingToken",
        ),
    ] {
        let r = http
            .post(format!("{}/{method}", a.url))
            .bearer_auth(&admin)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{method} {body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["code"], "invalid_argument", "{v}");
        let message = v["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("{field}:")), "{method}: {v}");
    }
    let (code, status) = connect_call(
        &http,
        &a.url,
        "agentbay.runs.v1.Runs/ListRuns",
        Some(&admin),
        &json!({"tenant_id": "acme", "page_size": 5}),
    )
    .await;
    assert_eq!((code.as_str(), status), ("ok", 200));
    let gzipped = {
        use std::io::Write as _;
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(br#"{"tenantId": "acme"}"#).unwrap();
        z.finish().unwrap()
    };
    let r = http
        .post(format!("{}/agentbay.runs.v1.Runs/ListRuns", a.url))
        .bearer_auth(&admin)
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(gzipped)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // A query key a route does not take is named with the route's own.
    for (path, route) in [
        ("/events/head?x=1", "/events/head (tenant)"),
        ("/events/head?after=1", "/events/head (tenant)"),
        ("/events?x=1", "/events (after, topic, tenant, until)"),
    ] {
        let r = http
            .get(format!("{}{path}", a.url))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{path}");
        let p: Value = r.json().await.unwrap();
        assert!(p["detail"].as_str().unwrap().contains(route), "{path}: {p}");
    }
    // The framework's own refusals are problem documents too, and a
    // refusal does not echo a huge value whole.
    let r = http
        .get(format!("{}/runtime/attempts/%ff%fe", a.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "application/problem+json"
    );
    let long = "x".repeat(40_000);
    let r = http
        .get(format!("{}/runtime/attempts/{long}", a.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error());
    let text = r.text().await.unwrap();
    assert!(text.len() < 4_000, "{} bytes", text.len());
    // A lease for a run or attempt that is not the tenant's is refused as
    // for an unknown id.
    for ids in [
        json!({"runId": "0190e5a0-0000-7000-8000-0000000000ff"}),
        json!({"attemptId": "0190e5a0-0000-7000-8000-0000000000ff"}),
    ] {
        let mut body = json!({"tenantId": "acme", "projectId": "default", "holderKind": "attempt",
            "holderId": "h1", "cpu": 0.1, "memoryGb": 0.1});
        body.as_object_mut()
            .unwrap()
            .extend(ids.as_object().unwrap().clone());
        let (code, status) = connect_call(
            &http,
            &a.url,
            "agentbay.capacity.v1.Capacity/AcquireLease",
            Some(&admin),
            &body,
        )
        .await;
        assert_eq!((code.as_str(), status), ("not_found", 404), "{body}");
    }
    // A quota that is not a whole number of thousandths.
    let (s, p) = a
        .put(
            &admin,
            "/factory/capacity/quotas/tenant.acme",
            json!({"cpuPerAttempt": 1e-300}),
        )
        .await;
    assert_eq!(s, 400, "{p}");
    assert_eq!(p["field"], "cpuPerAttempt");
    // A body that is not an object.
    let (s, p) = a.put(&admin, "/platform/tenants/acme", json!([])).await;
    assert_eq!(s, 400, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("JSON object"), "{p}");
    // Oversize over HTTP/2, as over HTTP/1.1: 413 problem+json.
    let big = "a".repeat(2 * 1024 * 1024);
    let r = http
        .put(format!("{}/platform/tenants/acme", a.url))
        .bearer_auth(&admin)
        .json(&json!({"displayName": big}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    let (s, p) = problem(r).await;
    assert_eq!(s, 413, "{p}");
    assert_eq!(p["code"], "payload-too-large");
    // A reason longer than kept is refused by name.
    let (code, status) = connect_call(
        &http,
        &a.url,
        "agentbay.runtime.v1.Runtime/Interrupt",
        Some(&admin),
        &json!({"attemptId": "0190e5a0-0000-7000-8000-0000000000ff", "reason": "x".repeat(5000)}),
    )
    .await;
    assert_eq!((code.as_str(), status), ("invalid_argument", 400));
    assert!(!a.log().contains("ERROR"), "{}", a.log());
}

#[tokio::test]
async fn metrics_are_a_platform_scrape() {
    let a = Appliance::start();
    let admin = a.admin_token().await;
    a.ensure_tenant("acme").await;
    // A tenant cannot be given the scope at all.
    let (code, status) = connect_call(
        &a.http(),
        &a.url,
        "agentbay.admin.v1.Admin/CreateClient",
        Some(&admin),
        &json!({"tenantId": "acme", "scopes": ["agentbay.metrics.read"]}),
    )
    .await;
    assert!(
        matches!(code.as_str(), "invalid_argument" | "permission_denied"),
        "{code} {status}"
    );
    let acme = a.create_client("acme", &["agentbay.admin"]).await;
    let acme = a.token(&acme).await;
    let r = a
        .http()
        .get(format!("{}/metrics", a.url))
        .bearer_auth(&acme)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let scraper = a
        .create_client("platform", &["agentbay.metrics.read"])
        .await;
    let scraper = a.token(&scraper).await;
    let r = a
        .http()
        .get(format!("{}/metrics", a.url))
        .bearer_auth(&scraper)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("agentbay_http_requests_total")
    );
}

#[tokio::test]
async fn a_rotated_token_key_refuses_every_earlier_token() {
    let mut a = Appliance::start();
    let old = a.admin_token().await;
    let rotate = |a: &Appliance| {
        common::run(
            common::agentbay()
                .args(["rotate-token-key", "--data-dir"])
                .arg(&a.data_dir),
        )
    };
    let out = rotate(&a);
    assert!(!out.status.success(), "refused while the appliance runs");
    assert!(String::from_utf8_lossy(&out.stderr).contains("stop it first"));
    a.terminate().await;
    let out = rotate(&a);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    a.restart();
    let status = |token: String| {
        let http = a.http();
        let url = format!("{}/factory/capacity/pools", a.url);
        async move {
            http.get(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(status(old).await, 401);
    assert_eq!(status(a.admin_token().await).await, 200);
}

/// A zero-config start trusts no key whose private half is public: the
/// demo tenant trusts this appliance's own demo key, made at its first
/// start (owner-only in the data dir), which signs the example releases;
/// a release signed with a published key is untrusted.
#[tokio::test]
async fn the_demo_trusts_its_own_key_and_no_published_one() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let out = common::run(
        common::agentbay()
            .args(["init", "--json", "--data-dir"])
            .arg(&data),
    );
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let admin = common::Credential {
        id: v["client_id"].as_str().unwrap().into(),
        secret: v["client_secret"].as_str().unwrap().into(),
    };
    let a = Appliance::serve_with(
        tmp.path(),
        &data,
        admin,
        &[],
        &[("AGENTBAY_DEMO__ENABLED", "true")],
    );
    let own = data.join(agentbay::releases::signing::DEMO_KEY_FILE);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&own).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", own.display());
    assert_ne!(
        std::fs::read(&own).unwrap(),
        std::fs::read(common::test_demo_key()).unwrap(),
        "the demo key is this appliance's own"
    );
    let token = a.admin_token().await;
    let mut releases = Value::Null;
    for _ in 0..200 {
        releases = a.get(&token, "/runtime/releases?tenant=demo").await;
        if releases["releases"]
            .as_array()
            .is_some_and(|r| r.len() >= 5)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listed = releases["releases"].as_array().unwrap();
    assert_eq!(listed.len(), 5, "{releases}");
    for r in listed {
        assert_eq!(r["state"], "Verified", "{r}");
    }
    // The formerly published demo key signs for nobody here.
    let dir = tempfile::tempdir().unwrap();
    let bundle =
        crate::releases::variant(dir.path(), "foreign", &common::test_demo_key(), |_, m| {
            m["releaseId"] = json!("foreign-1.0.0");
        });
    let (status, body) =
        crate::releases::upload(&a, &token, crate::releases::pack(&bundle, |_| {})).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("untrusted"), "{body}");
}

/// Where a release may connect is the site's allowlist: an `mcp-http`
/// server or a model endpoint at an unlisted or internal target is a
/// verdict at import; a URL prefix does not open loopback (only an exact
/// host:port does); a listed server that redirects does not lead the
/// appliance on; a target the site stops allowing (a reload) is refused at
/// call time; a refused connection is told in words.
#[tokio::test]
async fn a_release_reaches_only_what_the_sites_allowlist_names() {
    use crate::builtin::{Site, answer};
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed); // Nothing listens there now: a connection is refused.
    // An internal listener: nothing of a release may reach it.
    let internal = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    internal.set_nonblocking(true).unwrap();
    let internal_port = internal.local_addr().unwrap().port();
    // A model server the site lists, which sends every request on to the
    // internal listener.
    let redirector = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let model_port = redirector.local_addr().unwrap().port();
    let to = format!("http://127.0.0.1:{internal_port}/v1/chat/completions");
    let app = axum::Router::new().fallback(move || {
        let to = to.clone();
        async move { axum::response::Redirect::temporary(&to) }
    });
    tokio::spawn(async move { axum::serve(redirector, app).await.unwrap() });

    let etc = tempfile::tempdir().unwrap();
    let file = etc.path().join("agentbay.toml");
    let allow = |entries: &[String]| {
        let list: Vec<String> = entries.iter().map(|e| format!("{e:?}")).collect();
        std::fs::write(
            &file,
            format!("[runtime]\nnetwork_allow = [{}]\n", list.join(", ")),
        )
        .unwrap();
    };
    // A name of this host for 127.0.0.1, listed exactly by name: what it
    // resolves to is judged, so it opens no loopback listener.
    let alias = loopback_alias();
    let listed = [
        format!("127.0.0.1:{port}"),
        format!("http://127.0.0.1:{internal_port}/"),
        format!("127.0.0.1:{model_port}"),
        format!("{alias}:{internal_port}"),
    ];
    allow(&listed);
    crate::common::hand_to_appliance(etc.path());
    let site = Site::on(Appliance::start_with(
        &["--config", file.to_str().unwrap()],
        &[],
    ))
    .await;
    let http_tool = |url: String| {
        move |m: &mut Value| {
            m["tools"] = json!([{"id": "remote", "name": "remote", "description": "r",
                "sideEffectClass": "read", "transport": "mcp-http", "url": url,
                "inputSchema": {"type": "object"}}]);
        }
    };
    let model = |url: String| {
        move |m: &mut Value| {
            m["modelProfile"] = json!({
                "id": "site-llm", "kind": "openai-compatible", "endpoint": url,
                "model": "test-model", "timeoutSeconds": 2,
                "responses": m["modelProfile"]["responses"].clone(),
            });
        }
    };
    let calls = json!([{"content": "call", "toolCalls": [{"tool": "remote", "arguments": {}}]}, answer("low", false)]);
    // Not listed: refused at import, the target named.
    for (id, edit, said) in [
        (
            "mcp-unlisted",
            Box::new(http_tool("http://127.0.0.1:18999/internal-admin".into()))
                as Box<dyn FnOnce(&mut Value)>,
            "MCP server http://127.0.0.1:18999/internal-admin is not in the site's network allowlist",
        ),
        (
            "model-metadata",
            Box::new(model("http://169.254.169.254/latest".into())),
            "model endpoint http://169.254.169.254/latest is not in the site's network allowlist",
        ),
    ] {
        let (status, body) = site.try_import(id, calls.clone(), &[], edit).await;
        assert_eq!(status, 422, "{body}");
        assert!(body.to_string().contains(said), "{body}");
    }
    // Listed by a URL prefix only: loopback needs the exact host:port.
    let (status, body) = site
        .try_import(
            "mcp-prefix",
            calls.clone(),
            &[],
            http_tool(format!("http://127.0.0.1:{internal_port}/admin")),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("only an exact"), "{body}");
    // Listed exactly, nothing listening: the call fails in words.
    site.import(
        "mcp-listed",
        calls.clone(),
        http_tool(format!("http://127.0.0.1:{port}/mcp")),
    )
    .await;
    let tool_call = |t: &Value, kind: &str| {
        t["calls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} call: {t}"))
            .clone()
    };
    let run_id = site.submit("mcp-listed").await;
    let run = site.until(&run_id, "Succeeded").await;
    let t = site.timeline(&run.steps[0].attempts[0].attempt_id).await;
    let call = tool_call(&t, "tool");
    let error = call["error"].as_str().unwrap();
    assert_eq!(call["status"], "failed", "{call}");
    assert!(
        error.contains(&format!(
            "connection refused (connecting to 127.0.0.1:{port})"
        )),
        "{error}"
    );
    assert!(!error.contains("::"), "a Rust type in the error: {error}");
    // A listed model server that redirects: the redirect is not followed,
    // and the internal listener hears nothing.
    site.import(
        "model-redirects",
        json!([]),
        model(format!("http://127.0.0.1:{model_port}/v1")),
    )
    .await;
    let run_id = site.submit("model-redirects").await;
    let run = site.until(&run_id, "Failed").await;
    let t = site.timeline(&run.steps[0].attempts[0].attempt_id).await;
    let call = tool_call(&t, "model");
    assert!(call["error"].as_str().unwrap().contains("307"), "{call}");
    assert!(
        internal.accept().is_err(),
        "the redirect reached the internal listener"
    );
    // A model endpoint listed exactly by a name that resolves to
    // 127.0.0.1: imported (nothing is resolved at import), refused when
    // the call resolves it, and the internal listener hears nothing.
    site.import(
        "model-by-alias",
        json!([]),
        model(format!("http://{alias}:{internal_port}/v1")),
    )
    .await;
    let run_id = site.submit("model-by-alias").await;
    let run = site.until(&run_id, "Failed").await;
    let t = site.timeline(&run.steps[0].attempts[0].attempt_id).await;
    let call = tool_call(&t, "model");
    let error = call["error"].as_str().unwrap();
    assert!(
        error.contains("only an exact entry that writes the address and port"),
        "{call}"
    );
    assert!(
        internal.accept().is_err(),
        "a name for 127.0.0.1 reached the internal listener"
    );
    // The site stops allowing the MCP server (a reload): the stored
    // release is refused at call time.
    allow(&listed[1..]);
    let out = crate::common::run(
        crate::common::agentbay()
            .arg("reload")
            .arg("--data-dir")
            .arg(&site.a.data_dir),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run_id = site.submit("mcp-listed").await;
    let run = site.until(&run_id, "Succeeded").await;
    let t = site.timeline(&run.steps[0].attempts[0].attempt_id).await;
    let call = tool_call(&t, "tool");
    assert_eq!(call["status"], "failed", "{call}");
    assert!(
        call["error"]
            .as_str()
            .unwrap()
            .contains("is not in the site's network allowlist"),
        "{call}"
    );
}

/// A name of this host, other than `localhost`, that resolves to
/// loopback only (Debian gives the host's own name 127.0.1.1), or
/// `localhost` where there is none.
fn loopback_alias() -> String {
    use std::net::ToSocketAddrs;
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let loopback_only = |name: &str| {
        (name, 80)
            .to_socket_addrs()
            .map(|a| {
                let a: Vec<_> = a.collect();
                !a.is_empty() && a.iter().all(|a| a.ip().is_loopback())
            })
            .unwrap_or(false)
    };
    [hostname.as_str(), "ip6-localhost"]
        .into_iter()
        .find(|n| !n.is_empty() && *n != "localhost" && loopback_only(n))
        .unwrap_or("localhost")
        .to_string()
}

/// A compressed upload is counted decompressed as it streams: zeros that
/// would end a tar archive at once still count, and past the cap the
/// upload is refused as too large, naming it, and nothing is stored.
#[tokio::test]
async fn a_gzip_bomb_upload_is_refused_as_too_large_naming_the_cap() {
    use std::io::Write;
    let a = Appliance::start_with(
        &[],
        &[
            ("AGENTBAY_RELEASES__MAX_BUNDLE_BYTES", "1048576"),
            ("AGENTBAY_RELEASES__MAX_FILE_BYTES", "524288"),
        ],
    );
    let token = a.admin_token().await;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..64 {
        gz.write_all(&zeros).unwrap();
    }
    let bomb = gz.finish().unwrap();
    assert!(bomb.len() < 256 * 1024, "{}", bomb.len());
    let (status, body) = crate::releases::upload(&a, &token, bomb).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body.to_string().contains("releases.max_bundle_bytes"),
        "{body}"
    );
    let listed = a.get(&token, "/runtime/releases").await;
    assert_eq!(listed["releases"], json!([]), "{listed}");
}
