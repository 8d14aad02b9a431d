//! Capacity accounting over HTTPS: quotas, every denial reason, placement,
//! the clock-driven workers, isolation, concurrency and crash safety.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use agentbay::proto::agentbay::admin::v1 as admin_pb;
use agentbay::proto::agentbay::capacity::v1 as pb;
use connectrpc::ErrorCode;
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::common::{Appliance, metric};

fn acquire(project: &str, holder: &str, cpu: f64, memory: f64) -> pb::AcquireLeaseRequest {
    pb::AcquireLeaseRequest {
        project_id: project.into(),
        holder_kind: "attempt".into(),
        holder_id: holder.into(),
        cpu,
        memory_gb: memory,
        ..Default::default()
    }
}

fn waiting(mut r: pb::AcquireLeaseRequest) -> pb::AcquireLeaseRequest {
    r.wait = true;
    r
}

async fn lease(a: &Appliance, token: &str, request: pb::AcquireLeaseRequest) -> pb::Lease {
    a.capacity(token)
        .acquire_lease(request)
        .await
        .expect("acquire")
        .into_owned()
        .lease
        .as_option()
        .cloned()
        .expect("a lease")
}

async fn denial(
    a: &Appliance,
    token: &str,
    request: pb::AcquireLeaseRequest,
) -> (ErrorCode, String) {
    let err = a
        .capacity(token)
        .acquire_lease(request)
        .await
        .expect_err("a denial");
    (err.code, err.message.unwrap_or_default())
}

fn state(l: &pb::Lease) -> String {
    format!("{:?}", l.state.as_known().unwrap())
}

#[tokio::test]
async fn quotas_resolve_edition_tenant_project_and_only_tighten() {
    let a = Appliance::start();
    let acme = a.tenant("acme", "starter", &[], &["web"]).await;
    let token = a.token(&acme).await;
    let admin = a.admin_token().await;

    let q = a.get(&token, "/factory/capacity/quotas").await;
    assert_eq!(q["edition"], "starter");
    assert_eq!(q["tenant"]["effective"]["concurrentRuns"]["value"], 5);
    assert_eq!(
        q["tenant"]["effective"]["concurrentRuns"]["source"]["edition"],
        "starter"
    );

    let (status, p) = a
        .put(
            &admin,
            "/factory/capacity/quotas/tenant.acme",
            json!({"concurrentRuns": 30}),
        )
        .await;
    assert_eq!(status, 400, "{p}");
    assert_eq!(p["field"], "concurrentRuns");
    let detail = p["detail"].as_str().unwrap();
    assert!(
        detail.contains("requested 30") && detail.contains("edition starter allows at most 5"),
        "{detail}"
    );

    let (status, p) = a
        .put(
            &admin,
            "/factory/capacity/quotas/tenant.acme",
            json!({"concurrentRuns": 3}),
        )
        .await;
    assert_eq!(status, 200, "{p}");
    assert_eq!(p["effective"]["concurrentRuns"]["value"], 3);
    // Tenant limits follow authority: the tenant's own administrator can
    // neither raise nor clear what a PlatformAdmin set.
    for patch in [
        json!({"concurrentRuns": 5}),
        json!({"concurrentRuns": null}),
    ] {
        let (status, p) = a
            .put(&token, "/factory/capacity/quotas/tenant.acme", patch)
            .await;
        assert_eq!(status, 403, "{p}");
        assert!(
            p["detail"]
                .as_str()
                .unwrap()
                .contains("tenant limits are set by PlatformAdmins"),
            "{p}"
        );
    }
    let q = a.get(&token, "/factory/capacity/quotas").await;
    assert_eq!(q["tenant"]["effective"]["concurrentRuns"]["value"], 3);
    assert!(
        q["tenant"]["setBy"]
            .as_str()
            .unwrap()
            .starts_with("client platform."),
        "{q}"
    );
    assert!(q["tenant"]["setAt"].as_str().is_some(), "{q}");
    assert_eq!(q["editionSetBy"], "configuration");

    let (status, p) = a
        .put(
            &token,
            "/factory/capacity/quotas/project.acme.web",
            json!({"concurrentRuns": 4}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("tenant acme allows at most 3"),
        "{p}"
    );
    let (status, _) = a
        .put(
            &token,
            "/factory/capacity/quotas/project.acme.web",
            json!({"concurrentRuns": 2}),
        )
        .await;
    assert_eq!(status, 200);
    let q = a.get(&token, "/factory/capacity/quotas").await;
    let web = &q["projects"][0];
    assert_eq!(web["effective"]["concurrentRuns"]["value"], 2);
    assert_eq!(
        web["effective"]["concurrentRuns"]["source"]["level"],
        "project"
    );

    // Editions are the PlatformAdmin's.
    let (status, _) = a
        .put(
            &token,
            "/factory/capacity/quotas/edition.starter",
            json!({"concurrentRuns": 50}),
        )
        .await;
    assert_eq!(status, 403);
    let admin = a.admin_token().await;
    let (status, p) = a
        .put(
            &admin,
            "/factory/capacity/quotas/edition.starter",
            json!({"concurrentRuns": 2}),
        )
        .await;
    assert_eq!(status, 200, "{p}");
    // The tenant's 3 is now shadowed by the edition's 2.
    let q = a.get(&token, "/factory/capacity/quotas").await;
    assert_eq!(q["tenant"]["effective"]["concurrentRuns"]["value"], 2);
    assert_eq!(
        q["tenant"]["effective"]["concurrentRuns"]["source"]["level"],
        "edition"
    );
    let changed = crate::common::events(&a, &admin, "capacity.quotas.v1.quota-changed", 3).await;
    assert_eq!(
        changed.last().unwrap()["concurrentRuns"].as_f64(),
        Some(2.0)
    );

    // A foreign tenant's quota and unknown fields are refused by name.
    let (status, _) = a
        .put(
            &token,
            "/factory/capacity/quotas/tenant.globex",
            json!({"concurrentRuns": 1}),
        )
        .await;
    assert!(status == 403 || status == 404);
    let (status, p) = a
        .put(
            &token,
            "/factory/capacity/quotas/tenant.acme",
            json!({"concurentRuns": 1}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        p["detail"].as_str().unwrap().contains("concurentRuns"),
        "{p}"
    );
}

#[tokio::test]
async fn every_denial_names_its_limit_in_the_error_the_event_and_the_lease_list() {
    let a = Appliance::start_manual_clock();
    let acme = a.tenant("acme", "team", &[], &["web", "api"]).await;
    let token = a.token(&acme).await;
    let admin = a.admin_token().await;
    let (s, _) = a
        .put(
            &token,
            "/factory/capacity/quotas/project.acme.web",
            json!({"concurrentRuns": 2}),
        )
        .await;
    assert_eq!(s, 200);

    // concurrentRuns of a project.
    lease(&a, &token, acquire("web", "r1", 0.5, 1.0)).await;
    lease(&a, &token, acquire("web", "r2", 0.5, 1.0)).await;
    let (code, message) = denial(&a, &token, acquire("web", "r3", 0.5, 1.0)).await;
    assert_eq!(code, ErrorCode::ResourceExhausted);
    assert_eq!(message, "concurrentRuns of project web: 2 in use, limit 2");
    let exceeded = crate::common::events(&a, &token, "capacity.quotas.v1.quota-exceeded", 1).await;
    assert_eq!(exceeded[0]["limit"], message);
    assert_eq!(exceeded[0]["holderId"], "r3");
    let denied = a.get(&token, "/factory/capacity/leases?holderId=r3").await;
    assert_eq!(denied["leases"][0]["state"], "Denied");
    assert_eq!(denied["leases"][0]["reason"], message);
    assert_eq!(denied["leases"][0]["limitingQuota"], "concurrentRuns");
    // The Connect error carries the same facts as the problem document, as
    // a google.rpc.ErrorInfo detail.
    let err = a
        .capacity(&token)
        .acquire_lease(acquire("web", "r4", 0.5, 1.0))
        .await
        .expect_err("a denial");
    let info = err
        .details
        .iter()
        .find(|d| d.type_url == "google.rpc.ErrorInfo")
        .unwrap_or_else(|| panic!("an ErrorInfo detail: {err:?}"));
    let facts = info.debug.as_ref().expect("the facts as JSON");
    assert_eq!(facts["limitingQuota"], "concurrentRuns");
    let r4 = a.get(&token, "/factory/capacity/leases?holderId=r4").await;
    assert_eq!(facts["leaseId"], r4["leases"][0]["leaseId"]);

    // memoryGbPerAttempt of the tenant: never fits, denied even when waiting.
    let (s, _) = a
        .put(
            &admin,
            "/factory/capacity/quotas/tenant.acme",
            json!({"memoryGbPerAttempt": 4}),
        )
        .await;
    assert_eq!(s, 200);
    let (code, message) = denial(&a, &token, waiting(acquire("api", "big", 1.0, 8.0))).await;
    assert_eq!(code, ErrorCode::ResourceExhausted);
    assert_eq!(
        message,
        "memoryGbPerAttempt of tenant acme: requested 8, limit 4"
    );

    // A pool too small for the request, ever.
    let (code, message) = denial(&a, &token, waiting(acquire("api", "huge", 100.0, 1.0))).await;
    assert_eq!(code, ErrorCode::ResourceExhausted);
    // The default pool is sized from the host: what it offers is its
    // maxSize in small slots.
    let pools = a.get(&admin, "/factory/capacity/pools").await;
    let agents = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["poolId"] == "agents")
        .cloned()
        .expect("the default agents pool");
    let offers = agents["maxSize"].as_u64().unwrap() * 2;
    assert!(
        message.contains(&format!(
            "requested cpu 100, but the whole pool at maxSize offers {offers}"
        )),
        "{message} ({agents})"
    );

    // pool maxSize reached: a one-slot pool, filled, then a waiter.
    let (s, p) = a
        .put(
            &admin,
            "/factory/capacity/pools/tiny",
            json!({"kind": "agent-runtime", "securityBoundary": "shared", "region": "local",
                   "nodeProfile": "small", "minSize": 1, "maxSize": 1}),
        )
        .await;
    assert_eq!(s, 200, "{p}");
    let mut first = acquire("api", "t1", 2.0, 1.0);
    first.pool_id = "tiny".into();
    let t1 = lease(&a, &token, first).await;
    let mut second = waiting(acquire("api", "t2", 1.0, 1.0));
    second.pool_id = "tiny".into();
    let queued = lease(&a, &token, second).await;
    assert_eq!(state(&queued), "REQUESTED");
    assert_eq!(queued.queue_position, 1);
    assert!(
        queued.reason.starts_with("pool tiny: maxSize 1 reached"),
        "{}",
        queued.reason
    );
    let queue = a.get(&token, "/factory/capacity/pools/tiny/queue").await;
    assert_eq!(queue["queue"][0]["holderId"], "t2");
    assert_eq!(queue["queue"][0]["reason"], queued.reason);

    // The queue is a series by pool and by the limit that holds it, its
    // oldest wait read off the clock.
    let depth = |pool: &str, limit: &str| {
        format!("agentbay_capacity_queue_depth{{pool=\"{pool}\",limit=\"{limit}\"}}")
    };
    let oldest = |pool: &str, limit: &str| {
        format!("agentbay_capacity_queue_oldest_wait_seconds{{pool=\"{pool}\",limit=\"{limit}\"}}")
    };
    let m = a.metrics().await;
    assert_eq!(metric(&m, &depth("tiny", "pool")), Some(1.0), "{m}");
    assert_eq!(metric(&m, &oldest("tiny", "pool")), Some(0.0), "{m}");
    a.advance(5).await;
    // A waiter held by a project's quota is counted under that quota.
    let over = lease(&a, &token, waiting(acquire("web", "r5", 0.5, 1.0))).await;
    assert_eq!(state(&over), "REQUESTED");
    assert_eq!(over.limiting_quota, "concurrentRuns");
    a.advance(2).await;
    let m = a.metrics().await;
    assert_eq!(metric(&m, &oldest("tiny", "pool")), Some(7.0), "{m}");
    assert_eq!(
        metric(&m, &depth(&over.pool_id, "concurrentRuns")),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, &oldest(&over.pool_id, "concurrentRuns")),
        Some(2.0),
        "{m}"
    );
    // Served, a queue's series are gone: nothing waits there.
    a.capacity(&token)
        .release_lease(pb::ReleaseLeaseRequest {
            lease_id: t1.lease_id,
            ..Default::default()
        })
        .await
        .unwrap();
    let m = a.metrics().await;
    assert_eq!(metric(&m, &depth("tiny", "pool")), None, "{m}");

    // executionMinutesPerDay: one minute, used up by a running lease.
    let admin = a.admin_token().await;
    let (s, _) = a
        .put(
            &admin,
            "/factory/capacity/quotas/tenant.acme",
            json!({"executionMinutesPerDay": 1}),
        )
        .await;
    assert_eq!(s, 200);
    a.advance(61).await;
    let token = a.token(&acme).await;
    let (code, message) = denial(&a, &token, acquire("api", "late", 0.5, 0.5)).await;
    assert_eq!(code, ErrorCode::ResourceExhausted);
    assert!(
        message.starts_with("executionMinutesPerDay of tenant acme: "),
        "{message}"
    );
    assert!(message.ends_with(" of 1 used"), "{message}");
}

#[tokio::test]
async fn lowering_a_quota_never_revokes_and_new_grants_wait_until_use_drops() {
    let a = Appliance::start();
    let acme = a.tenant("acme", "team", &[], &["web"]).await;
    let token = a.token(&acme).await;
    let held: Vec<pb::Lease> = futures::future::join_all(
        (0..3).map(|i| lease(&a, &token, acquire("web", &format!("h{i}"), 0.5, 0.5))),
    )
    .await;
    let admin = a.admin_token().await;
    let (s, _) = a
        .put(
            &admin,
            "/factory/capacity/quotas/tenant.acme",
            json!({"concurrentRuns": 1}),
        )
        .await;
    assert_eq!(s, 200);
    // Nothing revoked: every lease still renews.
    for l in &held {
        let renewed = a
            .capacity(&token)
            .renew_lease(pb::RenewLeaseRequest {
                lease_id: l.lease_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_owned();
        assert_eq!(state(renewed.lease.as_option().unwrap()), "ACTIVE");
    }
    let queued = lease(&a, &token, waiting(acquire("web", "new", 0.5, 0.5))).await;
    assert_eq!(state(&queued), "REQUESTED");
    assert_eq!(
        queued.reason,
        "concurrentRuns of tenant acme: 3 in use, limit 1"
    );
    for l in &held[..2] {
        a.capacity(&token)
            .release_lease(pb::ReleaseLeaseRequest {
                lease_id: l.lease_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let still = lease(&a, &token, waiting(acquire("web", "new", 0.5, 0.5))).await;
    assert_eq!(
        still.lease_id, queued.lease_id,
        "asking again for the same holder follows its lease"
    );
    assert_eq!(
        still.reason,
        "concurrentRuns of tenant acme: 1 in use, limit 1"
    );
    // The last release wakes the waiter: it is granted without asking.
    let mut follow = waiting(acquire("web", "new", 0.5, 0.5));
    follow.wait_seconds = 10;
    let waiter = {
        let cap = a.capacity(&token);
        tokio::spawn(async move { cap.acquire_lease(follow).await.unwrap().into_owned() })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    a.capacity(&token)
        .release_lease(pb::ReleaseLeaseRequest {
            lease_id: held[2].lease_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let granted = waiter.await.unwrap();
    let granted = granted.lease.as_option().unwrap();
    assert_eq!(granted.lease_id, queued.lease_id);
    assert_eq!(state(granted), "GRANTED");
}

#[tokio::test]
async fn expiry_and_autoscaling_follow_the_clock() {
    let a = Appliance::start_manual_clock();
    let acme = a.tenant("acme", "team", &[], &["web"]).await;
    let admin = a.admin_token().await;
    let token = a.token(&acme).await;

    let held = lease(&a, &token, acquire("web", "beat", 0.5, 0.5)).await;
    a.advance(119).await;
    a.run_worker("LeaseExpirer").await;
    let l = a
        .get(
            &token,
            &format!("/factory/capacity/leases/{}", held.lease_id),
        )
        .await;
    assert_eq!(l["state"], "Granted");
    a.advance(2).await;
    a.run_worker("LeaseExpirer").await;
    let token = a.token(&acme).await;
    let l = a
        .get(
            &token,
            &format!("/factory/capacity/leases/{}", held.lease_id),
        )
        .await;
    assert_eq!(l["state"], "Expired");
    let err = a
        .capacity(&token)
        .renew_lease(pb::RenewLeaseRequest {
            lease_id: held.lease_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::FailedPrecondition);
    assert!(
        err.message
            .unwrap()
            .contains("expired; acquire a new lease")
    );
    let released =
        crate::common::events(&a, &admin, "capacity.leases.v1.capacity-lease-released", 1).await;
    assert_eq!(released[0]["state"], "Expired");
    assert_eq!(released[0]["executionSeconds"].as_f64(), Some(121.0));

    // Scale up on demand, within bounds.
    let (s, p) = a
        .put(
            &admin,
            "/factory/capacity/pools/burst",
            json!({"kind": "agent-runtime", "securityBoundary": "shared", "region": "local",
                   "nodeProfile": "small", "minSize": 1, "maxSize": 3}),
        )
        .await;
    assert_eq!(s, 200, "{p}");
    let mut granted = Vec::new();
    for i in 0..3 {
        let mut r = waiting(acquire("web", &format!("b{i}"), 2.0, 1.0));
        r.pool_id = "burst".into();
        r.wait_seconds = 10;
        let l = lease(&a, &token, r).await;
        assert_eq!(state(&l), "GRANTED", "{}", l.reason);
        granted.push(l);
    }
    let pool = a.get(&token, "/factory/capacity/pools").await;
    let burst = pool["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["poolId"] == "burst")
        .unwrap()
        .clone();
    assert_eq!(burst["currentSize"], 3);
    // Scale down one slot per pass as the clock moves.
    for l in &granted {
        a.capacity(&token)
            .release_lease(pb::ReleaseLeaseRequest {
                lease_id: l.lease_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    // The clock's next Autoscaler pass takes one slot away...
    let size = |doc: &Value| {
        doc["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["poolId"] == "burst")
            .unwrap()["currentSize"]
            .as_u64()
            .unwrap()
    };
    a.advance(120).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let token = a.token(&acme).await;
        if size(&a.get(&token, "/factory/capacity/pools").await) == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the clock did not drive the autoscaler"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ...and each further pass one more, down to the minimum.
    for expected in [1, 1] {
        a.run_worker("Autoscaler").await;
        let token = a.token(&acme).await;
        assert_eq!(
            size(&a.get(&token, "/factory/capacity/pools").await),
            expected
        );
    }
    let admin = a.admin_token().await;
    // The events tell the same story: created at 1, grown to 3, back to 1.
    let mut sizes = Vec::new();
    let mut stream = a
        .rpc_json(&admin)
        .watch_events(admin_pb::WatchEventsRequest {
            topics: vec!["capacity.pools.v1.worker-pool-state-changed".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    while !(sizes.contains(&3) && sizes.last() == Some(&1)) {
        let e = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .unwrap_or_else(|_| panic!("pool events so far: {sizes:?}"))
            .unwrap()
            .unwrap()
            .to_owned_message();
        let p = serde_json::to_value(e.payload.as_option().unwrap()).unwrap();
        if p["poolId"] == "burst" {
            sizes.push(p["currentSize"].as_f64().unwrap() as u64);
        }
    }
    assert_eq!(sizes.first(), Some(&1));
}

#[tokio::test]
async fn placement_keeps_boundaries_egress_and_residency() {
    let a = Appliance::start();
    let admin = a.admin_token().await;
    let acme = a.tenant("acme", "team", &[], &["web"]).await;
    let globex = a.tenant("globex", "team", &["eu-west"], &["web"]).await;
    let acme_token = a.token(&acme).await;
    let globex_token = a.token(&globex).await;

    // globex may only run in eu-west: the shared local pool is out.
    let err = a
        .capacity(&globex_token)
        .acquire_lease(acquire("web", "g1", 0.5, 0.5))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::FailedPrecondition);
    assert!(
        err.message
            .unwrap()
            .contains("outside the residency of tenant globex (eu-west)")
    );
    let (s, _) = a
        .put(
            &admin,
            "/factory/capacity/pools/eu-agents",
            json!({"kind": "agent-runtime", "securityBoundary": "shared", "region": "eu-west",
                   "nodeProfile": "small", "minSize": 1, "maxSize": 2}),
        )
        .await;
    assert_eq!(s, 200);
    let l = lease(&a, &globex_token, acquire("web", "g1", 0.5, 0.5)).await;
    assert_eq!(l.pool_id, "eu-agents");

    // Browser sessions need a pool that allows the internet: never a shared one.
    let browser = |holder: &str| pb::AcquireLeaseRequest {
        holder_kind: "browser-session".into(),
        ..acquire("web", holder, 1.0, 1.0)
    };
    let err = a
        .capacity(&acme_token)
        .acquire_lease(browser("b1"))
        .await
        .unwrap_err();
    let message = err.message.unwrap_or_default();
    assert!(
        message.contains("no browser-session pool exists"),
        "{message}"
    );
    let (s, p) = a
        .put(
            &admin,
            "/factory/capacity/pools/browsers",
            json!({"kind": "browser-session", "securityBoundary": "shared", "region": "local",
                   "nodeProfile": "small", "minSize": 1, "maxSize": 2, "internetEgress": true}),
        )
        .await;
    assert_eq!(s, 400);
    assert_eq!(p["field"], "internetEgress");
    let (s, p) = a
        .put(
            &admin,
            "/factory/capacity/pools/acme-browsers",
            json!({"tenantId": "acme", "kind": "browser-session", "securityBoundary": "tenant-dedicated",
                   "region": "local", "nodeProfile": "small", "minSize": 1, "maxSize": 2, "internetEgress": true}),
        )
        .await;
    assert_eq!(s, 200, "{p}");
    let l = lease(&a, &acme_token, browser("b1")).await;
    assert_eq!(l.pool_id, "acme-browsers");
    // The dedicated pool serves acme only, and does not exist for others:
    // no answer tells globex who owns it.
    let mut other = browser("gb1");
    other.pool_id = "acme-browsers".into();
    let err = a
        .capacity(&globex_token)
        .acquire_lease(other)
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::NotFound);
    let message = err.message.unwrap();
    assert!(
        message.contains("pool acme-browsers not found"),
        "{message}"
    );
    assert!(!message.contains("acme "), "{message}");
    // And nobody else sees it.
    let pools = a.get(&globex_token, "/factory/capacity/pools").await;
    assert!(
        pools["pools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["poolId"] != "acme-browsers")
    );
    let r = a
        .http()
        .get(format!(
            "{}/factory/capacity/pools/acme-browsers/queue",
            a.url
        ))
        .bearer_auth(&globex_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn another_tenants_leases_and_quotas_are_out_of_reach() {
    let a = Appliance::start();
    let acme = a.tenant("acme", "team", &[], &["web"]).await;
    let globex = a.tenant("globex", "team", &[], &["web"]).await;
    let acme_token = a.token(&acme).await;
    let globex_token = a.token(&globex).await;
    let l = lease(&a, &acme_token, acquire("web", "mine", 0.5, 0.5)).await;

    for err in [
        a.capacity(&globex_token)
            .renew_lease(pb::RenewLeaseRequest {
                lease_id: l.lease_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err(),
        a.capacity(&globex_token)
            .release_lease(pb::ReleaseLeaseRequest {
                lease_id: l.lease_id.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err(),
    ] {
        assert_eq!(err.code, ErrorCode::NotFound);
    }
    let mut for_acme = acquire("web", "sneaky", 0.5, 0.5);
    for_acme.tenant_id = "acme".into();
    let err = a
        .capacity(&globex_token)
        .acquire_lease(for_acme)
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::PermissionDenied);
    let r = a
        .http()
        .get(format!("{}/factory/capacity/quotas?tenant=acme", a.url))
        .bearer_auth(&globex_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let mine = a.get(&globex_token, "/factory/capacity/leases").await;
    assert!(mine["leases"].as_array().unwrap().is_empty());
    let r = a
        .http()
        .get(format!("{}/factory/capacity/accounting", a.url))
        .bearer_auth(&globex_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
}

/// Asserts the invariants on one accounting snapshot.
fn check_accounting(doc: &Value) {
    for pool in doc["pools"].as_array().unwrap() {
        assert_eq!(pool["consistent"], true, "pool counters drifted: {pool}");
        assert!(
            pool["grantedCpu"].as_f64().unwrap() <= pool["capacityCpu"].as_f64().unwrap() + 1e-9,
            "pool over capacity: {pool}"
        );
    }
    for u in doc["usage"].as_array().unwrap() {
        let limit = &u["limits"]["concurrentRuns"]["value"];
        if let Some(limit) = limit.as_u64() {
            assert!(
                u["concurrentRuns"].as_u64().unwrap() <= limit,
                "quota exceeded: {u}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_clients_never_exceed_a_pool_or_a_quota() {
    let a = Arc::new(Appliance::start());
    let admin = a.admin_token().await;
    let mut tokens = Vec::new();
    for (i, t) in ["t1", "t2", "t3", "t4"].iter().enumerate() {
        let c = a.tenant(t, "team", &[], &["p1", "p2"]).await;
        let token = a.token(&c).await;
        let (s, _) = a
            .put(
                &admin,
                &format!("/factory/capacity/quotas/tenant.{t}"),
                json!({"concurrentRuns": 3 + i}),
            )
            .await;
        assert_eq!(s, 200);
        let (s, _) = a
            .put(
                &token,
                &format!("/factory/capacity/quotas/project.{t}.p1"),
                json!({"concurrentRuns": 2}),
            )
            .await;
        assert_eq!(s, 200);
        tokens.push(token);
    }
    let (s, _) = a
        .put(
            &admin,
            "/factory/capacity/pools/agents-b",
            json!({"kind": "agent-runtime", "securityBoundary": "shared", "region": "local",
                   "nodeProfile": "medium", "minSize": 1, "maxSize": 2}),
        )
        .await;
    assert_eq!(s, 200);

    let stop = Arc::new(AtomicBool::new(false));
    let observations = Arc::new(AtomicU64::new(0));
    let checker = {
        let a = a.clone();
        let stop = stop.clone();
        let observations = observations.clone();
        let admin = admin.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let doc = a.get(&admin, "/factory/capacity/accounting").await;
                check_accounting(&doc);
                observations.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let ops = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..64)
        .map(|c| {
            let a = a.clone();
            let token = tokens[c % 4].clone();
            let ops = ops.clone();
            let grants = grants.clone();
            tokio::spawn(async move {
                let cap = a.capacity(&token);
                for i in 0..12 {
                    let project = if (c + i) % 3 == 0 { "p1" } else { "p2" };
                    let cpu = [0.5, 1.0, 1.5, 2.0][(c + i) % 4];
                    let mut r = waiting(acquire(project, &format!("c{c}-{i}"), cpu, 1.0));
                    r.wait_seconds = 2;
                    let got = match cap.acquire_lease(r).await {
                        Ok(r) => r.into_owned().lease.as_option().cloned().unwrap(),
                        Err(e) => panic!("acquire failed: {:?} {:?}", e.code, e.message),
                    };
                    ops.fetch_add(1, Ordering::Relaxed);
                    if state(&got) == "GRANTED" {
                        grants.lock().push(got.lease_id.clone());
                        cap.renew_lease(pb::RenewLeaseRequest {
                            lease_id: got.lease_id.clone(),
                            ..Default::default()
                        })
                        .await
                        .unwrap();
                        ops.fetch_add(1, Ordering::Relaxed);
                    }
                    // Release a grant, or withdraw a request still waiting.
                    let released = cap
                        .release_lease(pb::ReleaseLeaseRequest {
                            lease_id: got.lease_id.clone(),
                            ..Default::default()
                        })
                        .await
                        .unwrap()
                        .into_owned();
                    let ended = state(released.lease.as_option().unwrap());
                    assert!(
                        ended == "RELEASED"
                            || ended == "DENIED"
                            || ended == "GRANTED"
                            || ended == "ACTIVE",
                        "{ended}"
                    );
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    checker.await.unwrap();
    let total = ops.load(Ordering::Relaxed);
    assert!(total >= 64 * 12 * 2, "{total} operations");
    assert!(
        observations.load(Ordering::Relaxed) >= 5,
        "the checker observed too rarely"
    );
    assert!(
        grants.lock().len() >= 64,
        "too few grants: {}",
        grants.lock().len()
    );

    // Quiescent: everything given back, counters equal the (empty) sums.
    let doc = a.get(&admin, "/factory/capacity/accounting").await;
    check_accounting(&doc);
    for pool in doc["pools"].as_array().unwrap() {
        assert_eq!(pool["activeLeases"], 0, "{pool}");
    }
    let repairs = a.run_worker("AccountingReconciler").await;
    assert!(repairs.message.contains("match"), "{}", repairs.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_restarts_with_exact_accounting() {
    let mut a = Appliance::start();
    // Room for every kept grant (16 CPU), beyond what the host-sized
    // default offers.
    a.size_agents_pool(8).await;
    // The platform edition sets no quota: the pool is the only bound here.
    let acme = a.tenant("acme", "platform", &[], &["web"]).await;
    let token = a.token(&acme).await;
    let granted = Arc::new(Mutex::new(BTreeSet::new()));
    let queued = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..16 {
        let cap = a.capacity(&token);
        let granted = granted.clone();
        let queued = queued.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = waiting(acquire("web", &format!("k{c}-{i}"), 0.25, 0.25));
                let Ok(r) = cap.acquire_lease(r).await else {
                    break;
                };
                let l = r.into_owned().lease.as_option().cloned().unwrap();
                match state(&l).as_str() {
                    "GRANTED" => {
                        granted.lock().insert(l.lease_id.clone());
                    }
                    _ => {
                        queued.lock().insert(l.lease_id.clone());
                    }
                }
                // Keep every third grant; release the rest.
                if i % 3 != 0
                    && cap
                        .release_lease(pb::ReleaseLeaseRequest {
                            lease_id: l.lease_id.clone(),
                            ..Default::default()
                        })
                        .await
                        .is_err()
                {
                    break;
                }
                i += 1;
            }
        }));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while granted.lock().len() < 40 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} grants in 60 s",
            granted.lock().len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    a.kill9();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    a.restart();
    let admin = a.admin_token().await;
    let doc = a.get(&admin, "/factory/capacity/accounting").await;
    check_accounting(&doc);
    assert!(
        !a.log().contains("did not match its leases"),
        "counters were inconsistent after the crash"
    );
    // Every acknowledged grant and queued request is still there.
    let token = a.token(&acme).await;
    let leases = a.get(&token, "/factory/capacity/leases?limit=5000").await;
    let known: BTreeSet<String> = leases["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["leaseId"].as_str().unwrap().to_string())
        .collect();
    let lost: Vec<_> = granted.lock().difference(&known).cloned().collect();
    assert!(lost.is_empty(), "acknowledged grants lost: {lost:?}");
    let lost: Vec<_> = queued.lock().difference(&known).cloned().collect();
    assert!(lost.is_empty(), "acknowledged requests lost: {lost:?}");
    // Usage equals the leases that hold capacity.
    let holding = leases["leases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["state"] == "Granted" || l["state"] == "Active")
        .count();
    let usage = doc["usage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["tenantId"] == "acme" && u["projectId"].is_null())
        .unwrap()["concurrentRuns"]
        .as_u64()
        .unwrap();
    assert_eq!(usage as usize, holding);
    let repairs = a.run_worker("AccountingReconciler").await;
    assert!(repairs.message.contains("match"), "{}", repairs.message);
}

#[tokio::test]
async fn a_large_request_is_passed_over_a_bounded_number_of_times() {
    let a = Appliance::start();
    let admin = a.admin_token().await;
    let acme = a.tenant("acme", "platform", &[], &["web"]).await;
    let token = a.token(&acme).await;
    let (s, _) = a
        .put(
            &admin,
            "/factory/capacity/pools/one",
            json!({"kind": "agent-runtime", "securityBoundary": "shared", "region": "local",
                   "nodeProfile": "small", "minSize": 1, "maxSize": 1}),
        )
        .await;
    assert_eq!(s, 200);
    let in_pool = |mut r: pb::AcquireLeaseRequest| {
        r.pool_id = "one".into();
        r
    };
    // One cpu of two is held; a two-cpu request must wait for it.
    let anchor = lease(&a, &token, in_pool(acquire("web", "anchor", 1.0, 1.0))).await;
    let big = lease(
        &a,
        &token,
        in_pool(waiting(acquire("web", "big", 2.0, 1.0))),
    )
    .await;
    assert_eq!(state(&big), "REQUESTED");
    // Small requests fit beside the anchor and pass the big one... a few times.
    let mut passed = 0;
    loop {
        let small = lease(
            &a,
            &token,
            in_pool(waiting(acquire("web", &format!("small{passed}"), 1.0, 1.0))),
        )
        .await;
        if state(&small) != "GRANTED" {
            // From now on the pool holds the big request's share back.
            assert_eq!(small.queue_position, 2, "it queues behind the big one");
            assert_eq!(
                small.reason,
                "pool one: maxSize 1 reached (cpu 1 of 2 taken, 2 held back for a waiting request passed over too often, requested 1)"
            );
            break;
        }
        passed += 1;
        a.capacity(&token)
            .release_lease(pb::ReleaseLeaseRequest {
                lease_id: small.lease_id,
                ..Default::default()
            })
            .await
            .unwrap();
        assert!(
            passed <= 10,
            "the big request was passed over without bound"
        );
    }
    assert_eq!(passed, 4, "capacity.max_pass_over defaults to 4");
    // When the anchor goes, the big one is first.
    a.capacity(&token)
        .release_lease(pb::ReleaseLeaseRequest {
            lease_id: anchor.lease_id,
            ..Default::default()
        })
        .await
        .unwrap();
    let big = lease(
        &a,
        &token,
        in_pool(waiting(acquire("web", "big", 2.0, 1.0))),
    )
    .await;
    assert_eq!(state(&big), "GRANTED");

    // The specification's metrics are exported.
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
    for name in [
        "connectsoft_factory_capacity_pool_utilisation",
        "connectsoft_factory_capacity_leases_active",
        "connectsoft_factory_capacity_lease_wait",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
}

#[tokio::test]
async fn the_lease_list_pages_with_a_cursor_past_its_limit() {
    let a = Appliance::start_manual_clock();
    let acme = a.tenant("acme", "team", &[], &["web"]).await;
    let token = a.token(&acme).await;
    let mut made = BTreeSet::new();
    for i in 0..7 {
        let l = lease(&a, &token, acquire("web", &format!("h{i}"), 0.1, 0.1)).await;
        made.insert(l.lease_id.clone());
    }
    let mut seen = Vec::new();
    let mut path = "/factory/capacity/leases?limit=3".to_string();
    loop {
        let page = a.get(&token, &path).await;
        let leases = page["leases"].as_array().unwrap();
        assert!(leases.len() <= 3);
        seen.extend(
            leases
                .iter()
                .map(|l| l["leaseId"].as_str().unwrap().to_string()),
        );
        match page["nextBefore"].as_str() {
            Some(cursor) => {
                assert_eq!(leases.len(), 3, "a cursor only after a full page");
                path = format!("/factory/capacity/leases?limit=3&before={cursor}");
            }
            None => break,
        }
    }
    assert_eq!(seen.len(), 7, "every lease once: {seen:?}");
    assert!(
        seen.windows(2).all(|w| w[0] > w[1]),
        "newest first: {seen:?}"
    );
    assert_eq!(seen.iter().cloned().collect::<BTreeSet<_>>(), made);
    let bad = a
        .http()
        .get(format!(
            "{}/factory/capacity/leases?before=yesterday",
            a.url
        ))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let (status, problem) = crate::common::problem(bad).await;
    assert_eq!((status, problem["field"].as_str()), (400, Some("before")));
}

#[tokio::test]
async fn the_default_pools_fit_the_host_and_readyz_warns_of_pools_that_do_not() {
    let a = Appliance::start();
    let admin = a.admin_token().await;
    let ready = |a: &Appliance| {
        let http = a.http();
        let url = format!("{}/readyz", a.url);
        async move {
            let r = http.get(url).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = ready(&a).await;
    assert_eq!(status, 200, "{body}");
    let fit = &body["host"];
    // The host as this process sees it: its CPUs, and at most the
    // machine's memory (a control group may allow less).
    let cpus = std::thread::available_parallelism().unwrap().get() as f64;
    assert_eq!(fit["budget"]["host"]["cpus"], cpus, "{fit}");
    let total_gb = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap()
        / (1024.0 * 1024.0);
    let memory = fit["budget"]["host"]["memoryGb"].as_f64().unwrap();
    assert!(memory > 0.0 && memory <= total_gb + 0.01, "{fit}");

    // The zero-config pools promise no more than the host backs: its
    // memory less the appliance's reserve, its CPUs less the reserve
    // times the overcommit; each holds half, in small slots.
    assert_eq!(fit["warnings"], json!([]), "{fit}");
    assert_eq!(fit["localPools"], json!(["agents", "sandboxes"]), "{fit}");
    let pools = a.get(&admin, "/factory/capacity/pools").await;
    let promised: Vec<(f64, f64)> = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let n = p["maxSize"].as_f64().unwrap();
            assert_eq!(p["nodeProfile"], "small", "{p}");
            (2.0 * n, 4.0 * n)
        })
        .collect();
    let (cpu, mem): (f64, f64) = promised
        .iter()
        .fold((0.0, 0.0), |(c, m), (pc, pm)| (c + pc, m + pm));
    assert_eq!(fit["cpu"]["promised"], cpu, "{fit}");
    assert_eq!(fit["memoryGb"]["promised"], mem, "{fit}");
    assert!(
        mem <= (memory - 1.0).max(8.0),
        "{mem} GB of {memory} GB: {fit}"
    );
    assert!(
        cpu <= ((cpus - 0.5) * 8.0).max(4.0),
        "{cpu} CPU of {cpus}: {fit}"
    );
    assert!(
        a.banner()
            .contains("pools of this host (agents, sandboxes)"),
        "{}",
        a.banner()
    );

    let big = |region: &str| {
        json!({"kind": "sandbox", "securityBoundary": "shared", "region": region,
               "nodeProfile": "large", "minSize": 1, "maxSize": 1000})
    };
    // A pool in a region of its own is remote (a customer's machines):
    // counted against nothing here.
    let (s, p) = a
        .put(
            &admin,
            "/factory/capacity/pools/customer-box",
            big("customer-a"),
        )
        .await;
    assert_eq!(s, 200, "{p}");
    let (_, body) = ready(&a).await;
    assert_eq!(body["host"]["warnings"], json!([]), "{body}");
    assert_eq!(
        body["host"]["remotePools"],
        json!(["customer-box (customer-a)"]),
        "{body}"
    );

    // A pool of this host that promises more than it has: still ready,
    // but warned of, by name and by how much.
    let (s, p) = a
        .put(&admin, "/factory/capacity/pools/gpu-box", big("local"))
        .await;
    assert_eq!(s, 200, "{p}");
    let (status, body) = ready(&a).await;
    assert_eq!(status, 200, "{body}");
    let warnings = body["host"]["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    let cpu_warning = warnings[0].as_str().unwrap();
    assert!(
        cpu_warning.contains("gpu-box") && cpu_warning.contains("capacity.cpu_overcommit"),
        "{cpu_warning}"
    );
    let memory_warning = warnings[1].as_str().unwrap();
    assert!(
        memory_warning.contains(&format!("promise {} GB", mem + 16_000.0)),
        "{memory_warning}"
    );
}
