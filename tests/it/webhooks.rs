//! Webhooks against a real receiver on the site: signed (Standard
//! Webhooks), retried after a 500 with backoff, de-duplicable by id, only
//! the endpoint's tenant's messages, and every message delivered after a
//! kill -9 between the event and its delivery.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::builtin::{Site, answer};
use crate::common::Appliance;

/// One request the receiver saw.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub path: String,
    id: String,
    timestamp: String,
    signature: String,
    pub body: String,
    answered: u16,
}

#[derive(Default)]
pub(crate) struct Receiver {
    pub seen: Mutex<Vec<Seen>>,
    /// Requests still to answer with 500.
    fail: Mutex<usize>,
}

pub(crate) async fn receiver() -> (Arc<Receiver>, String) {
    let state = Arc::new(Receiver::default());
    let s = state.clone();
    let app = axum::Router::new().fallback(
        move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: String| {
            let s = s.clone();
            async move {
                let answered = {
                    let mut fail = s.fail.lock();
                    if *fail > 0 {
                        *fail -= 1;
                        500
                    } else {
                        204
                    }
                };
                let h = |k: &str| {
                    headers
                        .get(k)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string()
                };
                s.seen.lock().push(Seen {
                    path: uri.path().to_string(),
                    id: h("webhook-id"),
                    timestamp: h("webhook-timestamp"),
                    signature: h("webhook-signature"),
                    body,
                    answered,
                });
                axum::http::StatusCode::from_u16(answered).unwrap()
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (state, addr.to_string())
}

/// Whether `seen` carries a valid signature for `secret`.
fn verifies(seen: &Seen, secret: &str) -> bool {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
    let content = format!("{}.{}.{}", seen.id, seen.timestamp, seen.body);
    seen.signature.split(' ').any(|s| {
        s.strip_prefix("v1,")
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .is_some_and(|tag| ring::hmac::verify(&key, content.as_bytes(), &tag).is_ok())
    })
}

async fn delivered_for(r: &Receiver, path: &str, run_id: &str) -> Vec<Seen> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let all: Vec<Seen> = r
            .seen
            .lock()
            .iter()
            .filter(|s| s.path == path && s.body.contains(run_id))
            .cloned()
            .collect();
        if all.iter().any(|s| s.answered == 204) {
            return all;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no delivery of run {run_id} to {path}: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn webhooks_are_signed_retried_isolated_and_survive_kill_9() {
    let (r, host_port) = receiver().await;
    let site = Site::on(Appliance::start_with(
        &[],
        &[
            ("AGENTBAY_RUNTIME__NETWORK_ALLOW", host_port.as_str()),
            ("AGENTBAY_WEBHOOKS__RETRY_FIRST_SECONDS", "1"),
            ("AGENTBAY_WEBHOOKS__RETRY_MAX_SECONDS", "2"),
            ("AGENTBAY_WEBHOOKS__POLL_SECONDS", "1"),
        ],
    ))
    .await;
    let a = &site.a;
    let demo_admin = a
        .token(&a.create_client("demo", &["agentbay.admin"]).await)
        .await;
    a.tenant("globex", "team", &[], &["support"]).await;
    let globex_admin = a
        .token(&a.create_client("globex", &["agentbay.admin"]).await)
        .await;

    // The site's allowlist decides where an endpoint may point.
    let refused = a
        .http()
        .post(format!("{}/factory/webhooks", a.url))
        .bearer_auth(&demo_admin)
        .json(&json!({"url": "http://127.0.0.1:9/hook", "events": ["run.ended"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403, "the site's rule refuses it");
    let problem: Value = refused.json().await.unwrap();
    assert!(
        problem.to_string().contains("url"),
        "the refusal names the field: {problem}"
    );
    // A credential in the URL is refused by field, and not repeated.
    let refused = a
        .http()
        .post(format!("{}/factory/webhooks", a.url))
        .bearer_auth(&demo_admin)
        .json(&json!({"url": format!("http://pager:hunter22@{host_port}/x"), "events": ["run.ended"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let problem = refused.text().await.unwrap();
    assert!(
        problem.contains("url")
            && problem.contains("carries credentials")
            && !problem.contains("hunter22"),
        "{problem}"
    );

    let register = |token: String, path: &'static str| {
        let host_port = &host_port;
        async move {
            let r = a
                .http()
                .post(format!("{}/factory/webhooks", a.url))
                .bearer_auth(&token)
                .json(&json!({"url": format!("http://{host_port}{path}"),
                              "events": ["run.ended", "decision.requested"],
                              "description": "pager"}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
            r.json::<Value>().await.unwrap()
        }
    };
    let demo_hook = register(demo_admin.clone(), "/demo").await;
    let secret = demo_hook["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"), "{demo_hook}");
    let endpoint = demo_hook["endpointId"].as_str().unwrap().to_string();
    let globex_hook = register(globex_admin.clone(), "/globex").await;
    // The secret is shown once.
    let listed: Value = a.get(&demo_admin, "/factory/webhooks").await;
    assert_eq!(listed["endpoints"].as_array().unwrap().len(), 1, "{listed}");
    assert!(listed["endpoints"][0].get("secret").is_none(), "{listed}");

    // A run ends; the receiver answers 500 twice, then takes it.
    *r.fail.lock() = 2;
    site.import("hooked", json!([answer("low", false)]), |_| {})
        .await;
    let first = site.submit("hooked").await;
    site.until(&first, "Succeeded").await;
    let seen = delivered_for(&r, "/demo", &first).await;
    assert!(seen.len() >= 3, "two failures and a success: {seen:?}");
    let ids: std::collections::BTreeSet<&str> = seen.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(
        ids.len(),
        1,
        "every try carries the same webhook-id: {seen:?}"
    );
    for s in &seen {
        assert!(
            verifies(s, &secret),
            "a signature that does not verify: {s:?}"
        );
        let body: Value = serde_json::from_str(&s.body).unwrap();
        assert_eq!(body["type"], "run.ended");
        assert_eq!(body["tenantId"], "demo");
        assert_eq!(body["data"]["runId"], first.as_str());
    }
    // The tries are on the record, with their answers.
    let a = &site.a;
    let deliveries: Value = a
        .get(
            &demo_admin,
            &format!("/factory/webhooks/{endpoint}/deliveries"),
        )
        .await;
    let d = deliveries["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["body"].as_str().unwrap().contains(&first))
        .unwrap_or_else(|| panic!("{deliveries}"))
        .clone();
    assert_eq!(d["state"], "Delivered", "{d}");
    let statuses: Vec<u64> = d["tries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, vec![500, 500, 204], "{d}");
    // Another tenant's endpoint is not told of demo's run; demo's
    // endpoints are not listed to it.
    assert!(
        r.seen.lock().iter().all(|s| s.path != "/globex"),
        "globex heard of demo's run"
    );
    let other = a
        .http()
        .get(format!(
            "{}/factory/webhooks/{}/deliveries",
            a.url, endpoint
        ))
        .bearer_auth(&globex_admin)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
    let _ = globex_hook;

    // A kill -9 between the event and its delivery: the receiver is down
    // (500) while the second run ends, the appliance dies, the receiver
    // comes back, the appliance restarts and delivers.
    *r.fail.lock() = usize::MAX;
    let second = site.submit("hooked").await;
    site.until(&second, "Succeeded").await;
    let mut site = site;
    site.a.kill9();
    *r.fail.lock() = 0;
    site.a.restart();
    let seen = delivered_for(&r, "/demo", &second).await;
    let ok: Vec<&Seen> = seen.iter().filter(|s| s.answered == 204).collect();
    assert!(verifies(ok[0], &secret));
    // At least once, one id: a receiver that keeps ids has it once.
    let by_id: std::collections::BTreeSet<&str> = seen.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(by_id.len(), 1, "{seen:?}");
    let first_ids: std::collections::BTreeSet<String> = r
        .seen
        .lock()
        .iter()
        .filter(|s| s.body.contains(&first))
        .map(|s| s.id.clone())
        .collect();
    assert!(!first_ids.contains(ok[0].id.as_str()), "two runs, two ids");
}

#[tokio::test]
async fn metrics_show_a_failing_backup_dir_and_the_worker_that_backs_off() {
    let holder = tempfile::tempdir().unwrap();
    let dir = holder.path().join("backups");
    let dir_text = dir.to_string_lossy().into_owned();
    let a = Appliance::start_with(
        &["--manual-clock"],
        &[
            ("AGENTBAY_BACKUP__DIR", dir_text.as_str()),
            ("AGENTBAY_BACKUP__INTERVAL_MINUTES", "10080"),
            ("AGENTBAY_WORKERS__RETRY_DELAY_SECONDS", "30"),
        ],
    );
    let pass = a.run_worker("ScheduledBackup").await;
    assert!(pass.ok, "{}", pass.message);
    let value = crate::common::metric;
    let m = a.metrics().await;
    assert_eq!(value(&m, "agentbay_backup_enabled"), Some(1.0), "{m}");
    assert_eq!(value(&m, "agentbay_backup_last_result"), Some(1.0));
    let good = value(&m, "agentbay_backup_last_success_timestamp_seconds").unwrap();
    assert!(value(&m, "agentbay_disk_free_bytes{volume=\"backups\"}").unwrap() > 0.0);
    assert!(value(&m, "agentbay_disk_size_bytes{volume=\"data\"}").unwrap() > 0.0);
    // The backup directory is gone, a file in its place: the next pass
    // fails and the metrics say so.
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, b"not a directory").unwrap();
    a.advance(60).await;
    let pass = a.run_worker("ScheduledBackup").await;
    assert!(!pass.ok, "a backup into a file succeeded: {}", pass.message);
    let m = a.metrics().await;
    assert_eq!(value(&m, "agentbay_backup_last_result"), Some(0.0), "{m}");
    assert_eq!(
        value(&m, "agentbay_backup_last_success_timestamp_seconds"),
        Some(good),
        "the recovery point stays where the last good backup put it"
    );
    assert!(value(&m, "agentbay_backup_failures_total").unwrap() >= 1.0);
    assert!(
        value(
            &m,
            "agentbay_worker_failures_total{worker=\"ScheduledBackup\"}"
        )
        .unwrap()
            >= 1.0,
        "{m}"
    );
    assert_eq!(
        value(
            &m,
            "agentbay_worker_consecutive_failures{worker=\"ScheduledBackup\"}"
        ),
        Some(1.0)
    );
    // The retry is due 30 s later (fixed policy), not a week later.
    let ready: Value = a
        .http()
        .get(format!("{}/readyz", a.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let w = ready["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "ScheduledBackup")
        .unwrap()
        .clone();
    let next = chrono::DateTime::parse_from_rfc3339(w["nextRunAt"].as_str().unwrap()).unwrap();
    let last = chrono::DateTime::parse_from_rfc3339(w["lastFailureAt"].as_str().unwrap()).unwrap();
    assert_eq!((next - last).num_seconds(), 30, "{w}");
    assert!(!w["lastFailure"].as_str().unwrap().is_empty(), "{w}");
}

/// One tenant's 45 endpoints that accept a connection and never answer do
/// not hold back another tenant's delivery: a tenant's tries take at most
/// its share of the senders, one per endpoint. And a tenant's endpoints
/// are capped, the refusal naming the setting.
#[tokio::test]
async fn one_tenants_silent_endpoints_do_not_delay_another_tenants_delivery() {
    // Accepts, reads nothing, answers nothing.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_at = silent.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in silent.incoming() {
            held.push(s);
        }
    });
    let (r, host_port) = receiver().await;
    let allow = format!("{silent_at},{host_port}");
    let site = Site::on(Appliance::start_with(
        &[],
        &[
            ("AGENTBAY_RUNTIME__NETWORK_ALLOW", allow.as_str()),
            ("AGENTBAY_WEBHOOKS__POLL_SECONDS", "1"),
            ("AGENTBAY_WEBHOOKS__TIMEOUT_SECONDS", "30"),
            ("AGENTBAY_WEBHOOKS__MAX_ENDPOINTS_PER_TENANT", "45"),
        ],
    ))
    .await;
    let a = &site.a;
    let demo_admin = a
        .token(&a.create_client("demo", &["agentbay.admin"]).await)
        .await;
    let globex = site.other_tenant("globex").await;
    let globex_admin = a
        .token(&a.create_client("globex", &["agentbay.admin"]).await)
        .await;
    let register = |token: String, url: String| async move {
        a.http()
            .post(format!("{}/factory/webhooks", a.url))
            .bearer_auth(&token)
            .json(&json!({"url": url, "events": ["run.ended"]}))
            .send()
            .await
            .unwrap()
    };
    for i in 0..45 {
        let r = register(demo_admin.clone(), format!("http://{silent_at}/s{i}")).await;
        assert_eq!(r.status(), 201);
    }
    let over = register(demo_admin.clone(), format!("http://{silent_at}/s45")).await;
    assert_eq!(over.status(), 403);
    let said = over.text().await.unwrap();
    assert!(
        said.contains("webhooks.max_endpoints_per_tenant") && said.contains("45"),
        "{said}"
    );
    let r2 = register(globex_admin.clone(), format!("http://{host_port}/globex")).await;
    assert_eq!(r2.status(), 201);

    // demo's run ends first: 45 tries that hang for 30 s each.
    site.import("noisy", json!([answer("low", false)]), |_| {})
        .await;
    site.import_as(&globex, "globex", "quiet", json!([answer("low", false)]))
        .await;
    let noisy = site.submit("noisy").await;
    site.until(&noisy, "Succeeded").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Then globex's: its one delivery goes at once.
    let quiet = site.submit_as(&globex, "quiet").await;
    let ended = std::time::Instant::now();
    let seen = delivered_for(&r, "/globex", &quiet).await;
    let waited = ended.elapsed();
    assert_eq!(seen.len(), 1, "{seen:?}");
    println!("another tenant's delivery behind 45 silent endpoints: {waited:?}");
    assert!(
        waited < Duration::from_secs(10),
        "globex waited {waited:?} behind demo's silent endpoints"
    );
}
