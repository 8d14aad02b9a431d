//! Exactly one outcome under concurrency, checked from the outside.
//!
//! External adapters, lease clients and a submitter drive the real
//! appliance over HTTPS with short attempt leases and fast reconciliation,
//! the way a busy site does: adapters claim, start, checkpoint, call tools,
//! report outcomes (valid, failed, invalid then valid, repeated), and now
//! and then walk away mid-attempt so that others resume it or the
//! reconciler settles it. Every acknowledged reply is journaled. Then the
//! appliance's state is read back and compared with the journal:
//!
//! - every acknowledged checkpoint is still there;
//! - every acknowledged outcome is the attempt's stored state and hash;
//! - no attempt has two `attempt-outcome-reported` events, and every
//!   acknowledged outcome has its one event;
//! - fencing tokens only increase (per attempt across resumes, per step
//!   across attempts);
//! - no step has an attempt after one that Succeeded, nor two Succeeded;
//! - every acknowledged lease release is stored as released, and every
//!   pool's counters equal the sums over its leases;
//! - the ledger's token sums are exact: each attempt holds at least the
//!   tokens of its acknowledged model calls and at most those of the calls
//!   it sent; each run's sum is the sum of its attempts'; the tenant's
//!   usage report is the sum over every run.
//!
//! CI runs a short load; `CONSISTENCY_LOAD_SECONDS=300` runs a long one.
//! The second test kills the appliance with SIGKILL in the middle of the
//! load and restarts it on the same data directory. The third runs two
//! appliances on one PostgreSQL store, drives the load through the
//! standby (which forwards it to the active one), kills the active one
//! with SIGKILL in the middle of the load, and checks the same things
//! once the standby has taken over.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agentbay::control::{Transport, pinned_transport};
use agentbay::proto::agentbay::adapter::v1 as ad;
use agentbay::proto::agentbay::capacity::v1 as cap;
use agentbay::proto::agentbay::runs::v1 as rn;
use connectrpc::ErrorCode;
use connectrpc::client::ClientConfig;
use parking_lot::{Mutex, RwLock};
use serde_json::{Value, json};

use crate::common::{Appliance, Credential};
use crate::releases::{demo_key, pack, upload, variant};

const RELEASE: &str = "triage-load-1.0.0";
const ADAPTERS: usize = 8;
const LEASE_CLIENTS: usize = 6;
const LIVE_RUNS: usize = 10;

/// The appliance's settings under test: leases short enough that lapses,
/// resumes and reconciliation happen every few seconds.
const ENV: &[(&str, &str)] = &[
    ("AGENTBAY_RUNTIME__ATTEMPT_LEASE_SECONDS", "3"),
    ("AGENTBAY_RUNTIME__HEARTBEAT_SECONDS", "1"),
    ("AGENTBAY_RUNTIME__RECONCILE_INTERVAL_SECONDS", "1"),
    ("AGENTBAY_RUNTIME__INTERRUPT_GRACE_SECONDS", "2"),
    ("AGENTBAY_CAPACITY__LEASE_TTL_SECONDS", "5"),
    ("AGENTBAY_CAPACITY__EXPIRE_INTERVAL_SECONDS", "1"),
    // The store reopens itself often, so that reopens happen under the
    // load and around the kill.
    ("AGENTBAY_STORE__SNAPSHOT_EVERY_MB", "1"),
];

fn load_seconds() -> u64 {
    std::env::var("CONSISTENCY_LOAD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30)
}

/// A small deterministic generator per client: runs differ, reruns repeat
/// the same plans.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// 0..100.
    fn pct(&mut self) -> u64 {
        self.next() % 100
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Where the appliance answers now: it moves when it restarts.
struct Endpoint {
    url: String,
    fingerprint: String,
    generation: u64,
}

/// What every client shares.
struct Ctx {
    endpoint: RwLock<Endpoint>,
    token: RwLock<String>,
    credential: Credential,
    journal: Mutex<Journal>,
    stop: AtomicBool,
    acknowledged: AtomicU64,
    /// Calls the appliance told to come back (and that were made again).
    came_back: AtomicU64,
}

/// Clients for the current endpoint, rebuilt when it moves.
struct Clients {
    generation: u64,
    adapter: ad::AdapterClient<Transport>,
    runs: rn::RunsClient<Transport>,
    capacity: cap::CapacityClient<Transport>,
}

impl Ctx {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn ack(&self) {
        self.acknowledged.fetch_add(1, Ordering::Relaxed);
    }

    fn clients(&self) -> Clients {
        let e = self.endpoint.read();
        let config = ClientConfig::new(e.url.parse().unwrap())
            .with_codec_format(connectrpc::CodecFormat::Json)
            .with_default_header("authorization", format!("Bearer {}", self.token.read()));
        Clients {
            generation: e.generation,
            adapter: ad::AdapterClient::new(pinned_transport(&e.fingerprint), config.clone()),
            runs: rn::RunsClient::new(pinned_transport(&e.fingerprint), config.clone()),
            capacity: cap::CapacityClient::new(pinned_transport(&e.fingerprint), config),
        }
    }

    /// The clients to use now: the same ones while the endpoint stays.
    fn refresh(&self, clients: &mut Clients) {
        if clients.generation != self.endpoint.read().generation {
            *clients = self.clients();
        }
    }

    /// Makes a call again while the appliance says to come back (503 with
    /// Retry-After: nothing was done), as a well-behaved client does.
    async fn again<T, F>(&self, call: impl Fn() -> F) -> Result<T, connectrpc::ConnectError>
    where
        F: std::future::Future<Output = Result<T, connectrpc::ConnectError>>,
    {
        loop {
            match call().await {
                Err(e) if crate::common::told_to_come_back(&e) && !self.stopped() => {
                    self.came_back.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                answer => return answer,
            }
        }
    }

    /// After a failed call: while the appliance restarts, wait a little.
    async fn after_error(&self, e: &connectrpc::ConnectError) {
        if matches!(e.code, ErrorCode::Unavailable | ErrorCode::Unknown) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// One acknowledged claim of an attempt.
#[derive(Clone, Debug)]
struct Claim {
    attempt: String,
    token: u64,
    at: Instant,
}

/// One acknowledged outcome report that ended an attempt.
#[derive(Clone, Debug)]
struct Ended {
    attempt: String,
    state: String,
    hash: String,
}

/// Every acknowledged reply that later state must honour.
#[derive(Default)]
struct Journal {
    runs: BTreeSet<String>,
    claims: Vec<Claim>,
    /// (attempt, checkpoint sequence).
    checkpoints: BTreeSet<(String, u32)>,
    outcomes: Vec<Ended>,
    repeats: usize,
    /// Attempts an adapter walked away from on purpose with a call out:
    /// the only ones a load without faults may leave Uncertain.
    walked_with_call: BTreeSet<String>,
    leases_granted: BTreeSet<String>,
    leases_released: BTreeSet<String>,
    /// Tokens of model calls completed and acknowledged, and of those
    /// sent (acknowledged or not), per attempt.
    tokens_acked: BTreeMap<String, u64>,
    tokens_sent: BTreeMap<String, u64>,
    findings: Vec<String>,
}

impl Journal {
    fn finding(&mut self, what: String) {
        eprintln!("FINDING: {what}");
        self.findings.push(what);
    }
}

fn good_output(rng: &mut Rng) -> Value {
    let severity = ["low", "medium", "high"][rng.below(3) as usize];
    json!({"severity": severity, "summary": format!("ticket {}", rng.below(1000)), "paged": false})
}

/// An adapter: claims attempts of the agent and drives each as far as its
/// plan says, until the load stops.
async fn adapter(ctx: Arc<Ctx>, n: usize) {
    let mut rng = Rng::new(1000 + n as u64);
    let mut clients = ctx.clients();
    let mut session = 0;
    while !ctx.stopped() {
        ctx.refresh(&mut clients);
        session += 1;
        let claim = ad::ClaimAttemptRequest {
            agent_id: "triage".into(),
            session: format!("adapter-{n}-{session}"),
            wait_seconds: 1,
            ..Default::default()
        };
        let claimed = ctx
            .again(|| clients.adapter.claim_attempt(claim.clone()))
            .await;
        let ticket = match claimed {
            Ok(r) => match r.into_owned().attempt.into_option() {
                Some(t) => t,
                None => continue,
            },
            Err(e) => {
                ctx.after_error(&e).await;
                continue;
            }
        };
        ctx.ack();
        {
            let mut j = ctx.journal.lock();
            j.claims.push(Claim {
                attempt: ticket.attempt_id.clone(),
                token: ticket.fencing_token,
                at: Instant::now(),
            });
            // A run whose submission was cut off by the kill is known to
            // exist from the moment one of its attempts is claimed.
            j.runs.insert(ticket.run_id.clone());
        }
        if let Err(e) = drive(&ctx, &clients, &ticket, &mut rng).await {
            ctx.after_error(&e).await;
        }
    }
}

/// One adapter's hold on one attempt. Returns early (walking away from
/// the attempt) at the points its plan picks, and at the first error.
async fn drive(
    ctx: &Ctx,
    clients: &Clients,
    t: &ad::AttemptTicket,
    rng: &mut Rng,
) -> Result<(), connectrpc::ConnectError> {
    let client = &clients.adapter;
    let (id, token) = (t.attempt_id.clone(), t.fencing_token);
    let start = ad::StartAttemptRequest {
        attempt_id: id.clone(),
        fencing_token: token,
        adapter_version: t.adapter_version.clone(),
        checkpoint_format: t.checkpoint_format,
        ..Default::default()
    };
    ctx.again(|| client.start_attempt(start.clone())).await?;
    ctx.ack();
    if rng.pct() < 5 {
        return Ok(()); // walks away before doing anything
    }
    let checkpoint = |step: u64| {
        let id = id.clone();
        async move {
            let request = ad::CheckpointRequest {
                attempt_id: id.clone(),
                fencing_token: token,
                state_json: json!({"step": step}).to_string(),
                ..Default::default()
            };
            let cp = ctx
                .again(|| client.checkpoint(request.clone()))
                .await?
                .into_owned();
            ctx.ack();
            ctx.journal.lock().checkpoints.insert((id, cp.sequence));
            Ok::<_, connectrpc::ConnectError>(())
        }
    };
    for step in 0..=rng.below(3) {
        checkpoint(step).await?;
    }
    if rng.pct() < 60 {
        // A model call the adapter makes itself, with the usage its server
        // reported.
        let (input, output, cached) = (100 + rng.below(900), 1 + rng.below(99), rng.below(50));
        let begin = ad::BeginCallRequest {
            attempt_id: id.clone(),
            fencing_token: token,
            kind: "model".into(),
            target: t.model_profile_id.clone(),
            request_json: json!({"messages": [{"role": "user", "content": "triage"}]}).to_string(),
            context_tokens: 100,
            state_json: json!({"thinking": true}).to_string(),
            ..Default::default()
        };
        let m = ctx
            .again(|| client.begin_call(begin.clone()))
            .await?
            .into_owned();
        ctx.ack();
        if m.outcome == ad::BeginOutcome::STARTED {
            *ctx.journal
                .lock()
                .tokens_sent
                .entry(id.clone())
                .or_default() += input + output;
            let complete = ad::CompleteCallRequest {
                attempt_id: id.clone(),
                fencing_token: token,
                call_id: m.call_id.clone(),
                ok: true,
                result_json: json!({"content": "look it up"}).to_string(),
                state_json: json!({"thought": m.call_id}).to_string(),
                usage: buffa::MessageField::some(ad::ModelUsage {
                    input_tokens: input,
                    output_tokens: output,
                    cached_tokens: cached,
                    ..Default::default()
                }),
                latency_ms: 1 + rng.below(40),
                ..Default::default()
            };
            ctx.again(|| client.complete_call(complete.clone())).await?;
            ctx.ack();
            *ctx.journal
                .lock()
                .tokens_acked
                .entry(id.clone())
                .or_default() += input + output;
        }
    }
    if rng.pct() < 30 {
        let beat = ad::HeartbeatRequest {
            attempt_id: id.clone(),
            fencing_token: token,
            ..Default::default()
        };
        ctx.again(|| client.heartbeat(beat.clone())).await?;
        ctx.ack();
    }
    let write = rng.pct() < 50;
    let begin = ad::BeginCallRequest {
        attempt_id: id.clone(),
        fencing_token: token,
        kind: "tool".into(),
        target: if write {
            "update-ticket"
        } else {
            "lookup-ticket"
        }
        .into(),
        request_json: json!({"customer": "acme"}).to_string(),
        state_json: json!({"calling": write}).to_string(),
        ..Default::default()
    };
    let begun = ctx
        .again(|| client.begin_call(begin.clone()))
        .await?
        .into_owned();
    ctx.ack();
    if rng.pct() < 4 {
        // Walks away with the call out.
        ctx.journal.lock().walked_with_call.insert(id.clone());
        return Ok(());
    }
    tokio::time::sleep(Duration::from_millis(rng.below(150))).await;
    if begun.outcome == ad::BeginOutcome::STARTED {
        let complete = ad::CompleteCallRequest {
            attempt_id: id.clone(),
            fencing_token: token,
            call_id: begun.call_id.clone(),
            ok: true,
            result_json: json!({"tickets": rng.below(9)}).to_string(),
            receipt_json: json!({"receipt": begun.call_id}).to_string(),
            state_json: json!({"observed": begun.call_id}).to_string(),
            ..Default::default()
        };
        let done = ctx
            .again(|| client.complete_call(complete.clone()))
            .await?
            .into_owned();
        ctx.ack();
        if done.checkpoint_sequence > 0 {
            ctx.journal
                .lock()
                .checkpoints
                .insert((id.clone(), done.checkpoint_sequence));
        }
    }
    checkpoint(9).await?;
    if rng.pct() < 6 {
        return Ok(()); // walks away at a checkpoint: resumable
    }
    let plan = rng.pct();
    let report = |succeeded: bool, output: Value| ad::ReportOutcomeRequest {
        attempt_id: id.clone(),
        fencing_token: token,
        succeeded,
        output_json: if succeeded {
            output.to_string()
        } else {
            String::new()
        },
        failure_class: if succeeded { "" } else { "transient" }.into(),
        reason: if succeeded {
            ""
        } else {
            "the ticket system timed out"
        }
        .into(),
        ..Default::default()
    };
    let request = if plan < 10 {
        report(false, Value::Null)
    } else {
        if plan < 15 {
            // Invalid first: the validator asks for a correction.
            let invalid = report(true, json!({"severity": "catastrophic"}));
            let r = ctx
                .again(|| client.report_outcome(invalid.clone()))
                .await?
                .into_owned();
            ctx.ack();
            if r.verdict != ad::Verdict::CORRECT {
                ctx.journal.lock().finding(format!(
                    "attempt {id}: an invalid output got {:?}, not a correction",
                    r.verdict
                ));
            }
        }
        report(true, good_output(rng))
    };
    let r = ctx
        .again(|| client.report_outcome(request.clone()))
        .await?
        .into_owned();
    ctx.ack();
    {
        let mut j = ctx.journal.lock();
        if r.acknowledged {
            j.finding(format!(
                "attempt {id}: a first report was acknowledged as a repeat"
            ));
        }
        j.outcomes.push(Ended {
            attempt: id.clone(),
            state: r.state.clone(),
            hash: r.outcome_hash.clone(),
        });
    }
    // Whoever was told can read it back at once.
    let get = rn::GetRunRequest {
        run_id: t.run_id.clone(),
        ..Default::default()
    };
    let run = ctx
        .again(|| clients.runs.get_run(get.clone()))
        .await?
        .into_owned();
    let read = run
        .run
        .as_option()
        .and_then(|run| {
            run.steps
                .iter()
                .flat_map(|s| s.attempts.iter())
                .find(|a| a.attempt_id == id)
        })
        .map(|a| (a.state.clone(), a.outcome_hash.clone()));
    if read != Some((r.state.clone(), r.outcome_hash.clone())) {
        ctx.journal.lock().finding(format!(
            "attempt {id}: acknowledged {} ({}), read right after as {read:?}",
            r.state, r.outcome_hash
        ));
    }
    if rng.pct() < 15 {
        // The same report again is a repeat of the one outcome.
        let again = ctx
            .again(|| client.report_outcome(request.clone()))
            .await?
            .into_owned();
        ctx.ack();
        let mut j = ctx.journal.lock();
        j.repeats += 1;
        if !again.acknowledged || again.outcome_hash != r.outcome_hash {
            j.finding(format!(
                "attempt {id}: the same report again answered acknowledged={} hash {} (first {})",
                again.acknowledged, again.outcome_hash, r.outcome_hash
            ));
        }
    }
    Ok(())
}

/// A lease client: acquires sandbox or build capacity, renews it a few
/// times, releases it or lets it expire.
async fn lease_client(ctx: Arc<Ctx>, n: usize) {
    let mut rng = Rng::new(2000 + n as u64);
    let mut clients = ctx.clients();
    let (kind, pool) = if n.is_multiple_of(2) {
        ("sandbox", "sandboxes")
    } else {
        ("build", "builds")
    };
    let mut k = 0;
    while !ctx.stopped() {
        ctx.refresh(&mut clients);
        k += 1;
        let acquire = cap::AcquireLeaseRequest {
            project_id: "support".into(),
            holder_kind: kind.into(),
            holder_id: format!("lease-client-{n}-{k}"),
            pool_id: pool.into(),
            cpu: 0.25,
            memory_gb: 0.25,
            ..Default::default()
        };
        let granted = ctx
            .again(|| clients.capacity.acquire_lease(acquire.clone()))
            .await;
        let lease = match granted {
            Ok(r) => {
                ctx.ack();
                r.into_owned().lease.into_option().expect("a lease")
            }
            Err(e) => {
                ctx.after_error(&e).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        ctx.journal
            .lock()
            .leases_granted
            .insert(lease.lease_id.clone());
        let mut alive = true;
        for _ in 0..rng.below(4) {
            tokio::time::sleep(Duration::from_millis(200 + rng.below(600))).await;
            let renew = cap::RenewLeaseRequest {
                lease_id: lease.lease_id.clone(),
                ..Default::default()
            };
            let renewed = ctx
                .again(|| clients.capacity.renew_lease(renew.clone()))
                .await;
            if renewed.is_err() {
                alive = false;
                break;
            }
            ctx.ack();
        }
        if alive && rng.pct() >= 15 {
            let release = cap::ReleaseLeaseRequest {
                lease_id: lease.lease_id.clone(),
                ..Default::default()
            };
            let released = ctx
                .again(|| clients.capacity.release_lease(release.clone()))
                .await;
            if released.is_ok() {
                ctx.ack();
                ctx.journal
                    .lock()
                    .leases_released
                    .insert(lease.lease_id.clone());
            }
        }
    }
}

/// Keeps about [`LIVE_RUNS`] runs going.
async fn submitter(ctx: Arc<Ctx>) {
    let mut clients = ctx.clients();
    let mut live: Vec<String> = Vec::new();
    let mut n = 0;
    while !ctx.stopped() {
        ctx.refresh(&mut clients);
        let mut still = Vec::new();
        for run_id in live {
            let state = clients
                .runs
                .get_run(rn::GetRunRequest {
                    run_id: run_id.clone(),
                    ..Default::default()
                })
                .await
                .map(|r| r.into_owned().run.as_option().unwrap().state.clone());
            if state.is_err() || state.is_ok_and(|s| s == "Running") {
                still.push(run_id);
            }
        }
        live = still;
        while live.len() < LIVE_RUNS && !ctx.stopped() {
            n += 1;
            let submit = rn::SubmitRunRequest {
                project_id: "support".into(),
                release_id: RELEASE.into(),
                input_json: json!({"ticket": format!("load {n}")}).to_string(),
                ..Default::default()
            };
            match ctx.again(|| clients.runs.submit_run(submit.clone())).await {
                Ok(r) => {
                    ctx.ack();
                    let run_id = r.into_owned().run.as_option().unwrap().run_id.clone();
                    ctx.journal.lock().runs.insert(run_id.clone());
                    live.push(run_id);
                }
                Err(e) => {
                    ctx.after_error(&e).await;
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The appliance with the load's tenant, release and pools.
async fn site() -> (Appliance, Credential) {
    site_on(Appliance::start_with(&[], ENV)).await
}

/// The load's tenant, release and pools on an appliance.
async fn site_on(a: Appliance) -> (Appliance, Credential) {
    let workspace = a.tenant("demo", "team", &[], &["support"]).await;
    let cred = a
        .create_client(
            "demo",
            &[
                "factory.runs.read",
                "factory.runs.write",
                "factory.runs.execute",
                "factory.capacity.lease",
                "factory.capacity.read",
                "agentbay.events.read",
            ],
        )
        .await;
    let token = a.token(&workspace).await;
    let dir = tempfile::tempdir().unwrap();
    let bundle = variant(dir.path(), "load", &demo_key(), |_, m| {
        m["releaseId"] = json!(RELEASE);
        m["adapter"] = json!({"kind": "external", "version": "1"});
        let mut write_tool = m["tools"][0].clone();
        write_tool["id"] = json!("update-ticket");
        write_tool["description"] = json!("Adds a note to a ticket.");
        write_tool["sideEffectClass"] = json!("workspace-write");
        m["tools"].as_array_mut().unwrap().push(write_tool);
    });
    let (status, body) = upload(&a, &token, pack(&bundle, |_| {})).await;
    assert_eq!(status, 201, "{body}");
    let admin = a.admin_token().await;
    let pools = a.get(&admin, "/factory/capacity/pools").await;
    let region = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["poolId"] == "sandboxes")
        .map(|p| p["region"].clone())
        .expect("the default sandbox pool");
    let (status, body) = a
        .put(
            &admin,
            "/factory/capacity/pools/builds",
            json!({"kind": "build-runner", "securityBoundary": "shared", "region": region,
                   "nodeProfile": "small", "minSize": 1, "maxSize": 4}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    (a, cred)
}

/// What happens to the appliance in the middle of the load.
enum Disruption {
    None,
    /// SIGKILL, then a start on the same data directory.
    KillAndRestart,
    /// Whatever the closure does (kill the active appliance of a pair);
    /// the load goes on at the same address.
    Other(Box<dyn FnOnce() + Send>),
}

/// Runs the load for `seconds`, disrupted half-way.
async fn load(
    a: &mut Appliance,
    cred: Credential,
    seconds: u64,
    disruption: Disruption,
) -> Arc<Ctx> {
    let token = a.token(&cred).await;
    let ctx = Arc::new(Ctx {
        endpoint: RwLock::new(Endpoint {
            url: a.url.clone(),
            fingerprint: a.fingerprint.clone(),
            generation: 0,
        }),
        token: RwLock::new(token),
        credential: cred,
        journal: Mutex::new(Journal::default()),
        stop: AtomicBool::new(false),
        acknowledged: AtomicU64::new(0),
        came_back: AtomicU64::new(0),
    });
    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(submitter(ctx.clone())));
    for n in 0..ADAPTERS {
        tasks.push(tokio::spawn(adapter(ctx.clone(), n)));
    }
    for n in 0..LEASE_CLIENTS {
        tasks.push(tokio::spawn(lease_client(ctx.clone(), n)));
    }
    let started = Instant::now();
    if !matches!(disruption, Disruption::None) {
        tokio::time::sleep(Duration::from_secs(seconds / 2)).await;
        match disruption {
            Disruption::KillAndRestart => tokio::task::block_in_place(|| {
                a.kill9();
                a.restart();
            }),
            Disruption::Other(disrupt) => tokio::task::block_in_place(disrupt),
            Disruption::None => {}
        }
        let token = token_once_served(a, &ctx.credential).await;
        *ctx.token.write() = token;
        let mut e = ctx.endpoint.write();
        e.url = a.url.clone();
        e.fingerprint = a.fingerprint.clone();
        e.generation += 1;
        eprintln!("disrupted at {:?}", started.elapsed());
    }
    tokio::time::sleep(Duration::from_secs(seconds).saturating_sub(started.elapsed())).await;
    ctx.stop.store(true, Ordering::Release);
    for t in tasks {
        t.await.expect("a load client panicked");
    }
    ctx
}

/// A token, once the appliance serves again (a standby takes over within
/// its lease).
async fn token_once_served(a: &Appliance, credential: &Credential) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let response = a
            .http()
            .post(format!("{}/oauth/token", a.url))
            .basic_auth(&credential.id, Some(&credential.secret))
            .form(&[("grant_type", "client_credentials")])
            .send()
            .await;
        if let Ok(r) = response
            && r.status() == 200
        {
            let body: Value = r.json().await.unwrap();
            return body["access_token"].as_str().unwrap().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the appliance did not serve again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads the appliance back and compares it with the journal; returns the
/// findings.
/// What reading the state back found.
struct Checked {
    /// Every way the state breaks the journal.
    findings: Vec<String>,
    /// Attempts left Uncertain that no adapter walked away from with a
    /// call out: a load with no fault (or a fault the appliance rides
    /// out) leaves none.
    uncertain_unexplained: Vec<String>,
}

async fn check(a: &Appliance, ctx: &Ctx) -> Checked {
    let token = a.token(&ctx.credential).await;
    let clients = ctx.clients();
    let mut j = std::mem::take(&mut *ctx.journal.lock());
    let mut findings = std::mem::take(&mut j.findings);

    // Every run's attempts, as stored.
    struct Stored {
        state: String,
        token: u64,
        hash: String,
        tokens: u64,
    }
    let mut run_tokens_total = 0u64;
    let mut attempts: BTreeMap<String, Stored> = BTreeMap::new();
    let mut succeeded_runs = 0;
    let mut uncertain_unexplained = Vec::new();
    for run_id in &j.runs {
        let run = clients
            .runs
            .get_run(rn::GetRunRequest {
                run_id: run_id.clone(),
                ..Default::default()
            })
            .await
            .expect("get run")
            .into_owned();
        let run = run.run.as_option().unwrap();
        if run.state == "Succeeded" {
            succeeded_runs += 1;
        }
        let of_attempts: u64 = run
            .steps
            .iter()
            .flat_map(|s| s.attempts.iter())
            .map(|at| at.tokens.as_option().map_or(0, |t| t.total_tokens))
            .sum();
        let charged = run.tokens.as_option().map_or(0, |t| t.total_tokens);
        if charged != of_attempts {
            findings.push(format!(
                "run {run_id}: the ledger holds {charged} tokens, its attempts {of_attempts}"
            ));
        }
        run_tokens_total += charged;
        for step in &run.steps {
            let mut succeeded_at = None;
            for (i, at) in step.attempts.iter().enumerate() {
                if let Some(s) = &succeeded_at {
                    findings.push(format!(
                        "run {run_id}: attempt {} follows attempt {s}, which Succeeded",
                        at.attempt_id
                    ));
                }
                if at.state == "Succeeded" {
                    succeeded_at = Some(at.attempt_id.clone());
                }
                if i > 0 && at.fencing_token <= step.attempts[i - 1].fencing_token {
                    findings.push(format!(
                        "run {run_id}: attempt {} has token {}, not above the step's previous attempt's {}",
                        at.attempt_id,
                        at.fencing_token,
                        step.attempts[i - 1].fencing_token
                    ));
                }
                if at.state == "Uncertain" && !j.walked_with_call.contains(&at.attempt_id) {
                    uncertain_unexplained.push(at.attempt_id.clone());
                }
                attempts.insert(
                    at.attempt_id.clone(),
                    Stored {
                        state: at.state.clone(),
                        token: at.fencing_token,
                        hash: at.outcome_hash.clone(),
                        tokens: at.tokens.as_option().map_or(0, |t| t.total_tokens),
                    },
                );
            }
        }
    }

    // Tokens: what was acknowledged is charged, nothing beyond what was
    // sent, and the tenant's report is the sum over its runs.
    for (attempt, sent) in &j.tokens_sent {
        let acked = j.tokens_acked.get(attempt).copied().unwrap_or(0);
        let stored = attempts.get(attempt).map_or(0, |s| s.tokens);
        if stored < acked || stored > *sent {
            findings.push(format!(
                "attempt {attempt}: {stored} tokens charged; acknowledged {acked}, sent {sent}"
            ));
        }
    }
    let report = clients
        .runs
        .get_usage(rn::GetUsageRequest::default())
        .await
        .expect("get usage")
        .into_owned();
    let reported = report.total.as_option().map_or(0, |t| t.total_tokens);
    if reported != run_tokens_total {
        findings.push(format!(
            "the tenant's usage reports {reported} tokens, its runs hold {run_tokens_total}"
        ));
    }
    let acked_total: u64 = j.tokens_acked.values().sum();
    eprintln!(
        "tokens: {acked_total} acknowledged, {run_tokens_total} charged over {} runs",
        j.runs.len()
    );

    // Acknowledged outcomes are the stored ones.
    for o in &j.outcomes {
        match attempts.get(&o.attempt) {
            Some(s) if s.state == o.state && s.hash == o.hash => {}
            Some(s) => findings.push(format!(
                "attempt {}: acknowledged {} ({}), stored {} ({})",
                o.attempt, o.state, o.hash, s.state, s.hash
            )),
            None => findings.push(format!("attempt {}: acknowledged, not stored", o.attempt)),
        }
    }

    // Tokens only increase, per attempt, in the order the claims were
    // acknowledged.
    let mut claims = j.claims.clone();
    claims.sort_by_key(|c| c.at);
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for c in &claims {
        if let Some(prev) = last.insert(&c.attempt, c.token)
            && c.token <= prev
        {
            findings.push(format!(
                "attempt {}: claimed with token {} after token {prev}",
                c.attempt, c.token
            ));
        }
    }
    for (attempt, token) in &last {
        if let Some(s) = attempts.get(*attempt)
            && s.token < *token
        {
            findings.push(format!(
                "attempt {attempt}: stored token {} is below the acknowledged {token}",
                s.token
            ));
        }
    }

    // Acknowledged checkpoints are all there.
    let mut by_attempt: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (attempt, seq) in &j.checkpoints {
        by_attempt.entry(attempt).or_default().push(*seq);
    }
    let http = a.http();
    let get = |path: String| {
        let request = http.get(format!("{}{path}", a.url)).bearer_auth(&token);
        async move {
            let response = request.send().await.unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    for (attempt, seqs) in &by_attempt {
        let (status, stored) = get(format!("/runtime/attempts/{attempt}/checkpoints")).await;
        assert_eq!(status, 200, "{stored}");
        let have: BTreeSet<u64> = stored["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["sequence"].as_u64().unwrap())
            .collect();
        for seq in seqs {
            if !have.contains(&u64::from(*seq)) {
                findings.push(format!(
                    "attempt {attempt}: acknowledged checkpoint {seq} is gone (stored: {have:?})"
                ));
            }
        }
    }

    // One outcome event per attempt, the acknowledged one.
    let head = a.get(&token, "/events/head").await["sequence"]
        .as_u64()
        .unwrap();
    let stream = a
        .http()
        .get(format!(
            "{}/events?topic=execution.attempts.v1.attempt-outcome-reported&until={head}",
            a.url
        ))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut outcome_events: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for line in stream.lines() {
        if let Some(data) = line.strip_prefix("data: ") {
            let e: Value = serde_json::from_str(data).unwrap();
            let p = &e["payload"];
            outcome_events
                .entry(p["attemptId"].as_str().unwrap().to_string())
                .or_default()
                .push((
                    p["state"].as_str().unwrap().to_string(),
                    p["outcomeHash"].as_str().unwrap().to_string(),
                ));
        }
    }
    for (attempt, events) in &outcome_events {
        if events.len() > 1 {
            findings.push(format!(
                "attempt {attempt}: {} outcome events: {events:?}",
                events.len()
            ));
        }
    }
    for o in &j.outcomes {
        if outcome_events.get(&o.attempt).and_then(|e| e.first())
            != Some(&(o.state.clone(), o.hash.clone()))
        {
            findings.push(format!(
                "attempt {}: acknowledged {} ({}) has no such outcome event: {:?}",
                o.attempt,
                o.state,
                o.hash,
                outcome_events.get(&o.attempt)
            ));
        }
    }

    // Released leases stay released; granted ones are there; accounting
    // adds up.
    for lease in &j.leases_granted {
        let (status, stored) = get(format!("/factory/capacity/leases/{lease}")).await;
        if status != 200 {
            findings.push(format!("lease {lease}: acknowledged granted, not stored"));
            continue;
        }
        let state = stored["state"].as_str().unwrap_or_default().to_string();
        let released = j.leases_released.contains(lease);
        let fine = if released {
            state == "Released"
        } else {
            matches!(
                state.as_str(),
                "Granted" | "Active" | "Expired" | "Released"
            )
        };
        if !fine {
            findings.push(format!(
                "lease {lease}: acknowledged {}, stored {state}",
                if released { "released" } else { "granted" }
            ));
        }
    }
    let admin = a.admin_token().await;
    let accounting = a.get(&admin, "/factory/capacity/accounting").await;
    for pool in accounting["pools"].as_array().unwrap() {
        if pool["consistent"] != true {
            findings.push(format!("pool accounting differs from its leases: {pool}"));
        }
    }
    let metrics = a
        .http()
        .get(format!("{}/metrics", a.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let stale: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("agentbay_store_stale_writes_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum();

    let resumed = {
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for c in &j.claims {
            *per.entry(&c.attempt).or_default() += 1;
        }
        per.values().filter(|n| **n > 1).count()
    };
    eprintln!(
        "consistency: {} acknowledged operations; {} runs ({} succeeded), {} attempts, {} claims ({} attempts resumed), {} checkpoints, {} outcomes ({} repeats), {} outcome events, {} leases ({} released); {} stale writes refused; {} findings",
        ctx.acknowledged.load(Ordering::Relaxed),
        j.runs.len(),
        succeeded_runs,
        attempts.len(),
        j.claims.len(),
        resumed,
        j.checkpoints.len(),
        j.outcomes.len(),
        j.repeats,
        outcome_events.values().map(Vec::len).sum::<usize>(),
        j.leases_granted.len(),
        j.leases_released.len(),
        stale,
        findings.len()
    );
    assert!(
        j.outcomes.len() > 20 && resumed > 0,
        "the load must end attempts and resume some: {} outcomes, {resumed} resumed",
        j.outcomes.len()
    );
    Checked {
        findings,
        uncertain_unexplained,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adapters_never_lose_or_replace_an_acknowledged_write() {
    let (mut a, cred) = site().await;
    let ctx = load(&mut a, cred, load_seconds(), Disruption::None).await;
    let findings = check(&a, &ctx).await.findings;
    assert!(findings.is_empty(), "{}", findings.join("\n"));
    assert!(
        a.log().contains("store reopened"),
        "the store reopened itself under the load"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_in_the_middle_of_the_load_loses_or_replaces_nothing() {
    let (mut a, cred) = site().await;
    let seconds = load_seconds();
    let ctx = load(&mut a, cred, seconds, Disruption::KillAndRestart).await;
    let findings = check(&a, &ctx).await.findings;
    assert!(findings.is_empty(), "{}", findings.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_on_postgres_in_the_middle_of_the_load_loses_or_replaces_nothing() {
    use crate::ha::Node;
    let cluster = crate::pg::PgCluster::shared();
    let db = cluster.database();
    let tmp = tempfile::tempdir().unwrap();
    let mut active = Node::new("a", tmp.path(), &db).with_env(ENV);
    let mut standby = Node::new("b", tmp.path(), &db).with_env(ENV);
    let (admin, _) = crate::ha::start_pair(&mut active, &mut standby).await;
    let (_, cred) = site_on(active.appliance(&admin)).await;
    // Every client goes through the standby: forwarded until the active
    // appliance is killed, served by it once it took over.
    let mut through = standby.appliance(&admin);
    let seconds = load_seconds();
    let ctx = load(
        &mut through,
        cred,
        seconds,
        Disruption::Other(Box::new(move || active.kill9())),
    )
    .await;
    let (status, ready) = standby.readyz().await;
    assert_eq!(
        (status, ready["role"].as_str()),
        (200, Some("active")),
        "{ready}"
    );
    let findings = check(&through, &ctx).await.findings;
    assert!(findings.is_empty(), "{}", findings.join("\n"));
    assert!(
        ctx.acknowledged.load(Ordering::Relaxed) > 0,
        "the load ran through the pair"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_in_the_middle_of_the_load_is_ridden_out_by_the_same_appliance() {
    use crate::pg::{PgCluster, Shutdown};
    // A cluster of its own, synced, since it is restarted; the pair with
    // the default lease (10 s).
    let cluster = Arc::new(PgCluster::start(true));
    let db = cluster.database();
    let tmp = tempfile::tempdir().unwrap();
    let env: Vec<(&str, &str)> = ENV
        .iter()
        .copied()
        .chain([("AGENTBAY_STORE__POSTGRES__LEASE_SECONDS", "10")])
        .collect();
    let mut active = crate::ha::Node::new("a", tmp.path(), &db).with_env(&env);
    let mut standby = crate::ha::Node::new("b", tmp.path(), &db).with_env(&env);
    let (admin, ready) = crate::ha::start_pair(&mut active, &mut standby).await;
    let (_, cred) = site_on(active.appliance(&admin)).await;
    // Through the standby, which forwards to the active appliance.
    let mut through = standby.appliance(&admin);
    let restarts = Arc::new(Mutex::new(Vec::new()));
    let (pg, took) = (cluster.clone(), restarts.clone());
    let ctx = load(
        &mut through,
        cred,
        load_seconds(),
        Disruption::Other(Box::new(move || {
            // `pg_ctl restart -m fast`, then a crash and a start 3 s later.
            took.lock().push(pg.restart(Shutdown::Fast, Duration::ZERO));
            std::thread::sleep(Duration::from_secs(3));
            took.lock()
                .push(pg.restart(Shutdown::Immediate, Duration::from_secs(3)));
        })),
    )
    .await;
    let walked = ctx.journal.lock().walked_with_call.len();
    let checked = check(&through, &ctx).await;
    assert!(
        checked.findings.is_empty(),
        "{}",
        checked.findings.join("\n")
    );
    // No attempt was left Uncertain but those an adapter walked away from
    // with a call out.
    assert!(
        checked.uncertain_unexplained.is_empty(),
        "left Uncertain by the restarts: {:?}",
        checked.uncertain_unexplained
    );

    // The same appliance active, with the same epoch: it never stood down.
    let (status, after) = active.readyz().await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(after["role"], "active", "{after}");
    assert_eq!(
        after["leader"]["epoch"], ready["leader"]["epoch"],
        "{after}"
    );
    eprintln!(
        "postgres restarts under the load: down {:?}; {} replies acknowledged, {} calls told to come back and made again, {} attempts walked away from with a call out",
        restarts.lock(),
        ctx.acknowledged.load(Ordering::Relaxed),
        ctx.came_back.load(Ordering::Relaxed),
        walked
    );
}
