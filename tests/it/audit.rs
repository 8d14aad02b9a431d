//! The audit trail from outside: actions by API, RPC and console are
//! records with who, from where and what changed; a tenant reads only its
//! own; the chain checks over the API, on the command line, and after a
//! kill -9 in the middle of actions.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agentbay::proto::agentbay::admin::v1 as pb;
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::common::{Appliance, agentbay, run};

async fn records(a: &Appliance, token: &str, query: &str) -> Vec<Value> {
    a.get(token, &format!("/factory/audit?{query}"))
        .await
        .get("records")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn verify_cli(a: &Appliance) -> (bool, String) {
    let out = run(agentbay()
        .args(["audit", "verify", "--data-dir"])
        .arg(&a.data_dir));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_are_audited_with_who_where_and_what_changed_each_tenant_reading_its_own() {
    let a = Appliance::start();
    a.ensure_tenant("acme").await;
    a.ensure_tenant("beta").await;
    let platform = a.admin_token().await;

    // A value changed twice: the second record holds the first's value as before.
    for runs in [4, 2] {
        let (status, p) = a
            .put(
                &platform,
                "/factory/capacity/quotas/tenant.acme",
                json!({ "concurrentRuns": runs }),
            )
            .await;
        assert_eq!(status, 200, "{p}");
    }
    let quotas = records(&a, &platform, "action=quota.set&target=acme").await;
    assert_eq!(quotas.len(), 2, "{quotas:#?}");
    let (last, first) = (&quotas[0], &quotas[1]);
    assert_eq!(last["after"]["concurrentRuns"], 2, "{last}");
    assert_eq!(last["before"], first["after"], "{last}");
    assert!(last["sequence"].as_u64() > first["sequence"].as_u64());
    assert_eq!(last["via"], "api");
    assert_eq!(last["address"], "127.0.0.1");
    assert!(
        last["actor"].as_str().unwrap().starts_with("client "),
        "{last}"
    );

    // Through RPC: a client of acme with administration, one of beta.
    let acme_admin = a.create_client("acme", &["agentbay.admin"]).await;
    a.create_client("beta", &["agentbay.admin"]).await;
    let created = records(&a, &platform, "action=client.create").await;
    let acme_created = created
        .iter()
        .find(|r| r["target"] == acme_admin.id.as_str())
        .unwrap_or_else(|| panic!("{created:#?}"));
    assert_eq!(acme_created["via"], "rpc");
    assert_eq!(acme_created["tenantId"], "acme");

    // Sign-ins, refused and accepted, from the console.
    crate::console::user(&a, "acme", "wes", &["WorkspaceAdmin"]).await;
    let browser = a.http();
    for password in ["wrong-password", crate::console::PASSWORD] {
        let r = browser
            .post(format!("{}/signin", a.url))
            .form(&[("username", "wes"), ("password", password)])
            .send()
            .await
            .unwrap();
        assert!(
            [200, 303, 401].contains(&r.status().as_u16()),
            "{}",
            r.status()
        );
    }
    let signins = records(&a, &platform, "action=session").await;
    let actions: Vec<&str> = signins
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["session.sign-in", "session.sign-in-refused"],
        "{signins:#?}"
    );
    assert_eq!(signins[0]["tenantId"], "acme");
    assert_eq!(signins[0]["via"], "console");
    assert_eq!(signins[0]["actor"], "user wes");

    // acme's administrator reads acme's records only, and not beta's.
    let acme_token = a.token(&acme_admin).await;
    let own = records(&a, &acme_token, "limit=1000").await;
    assert!(!own.is_empty());
    assert!(own.iter().all(|r| r["tenantId"] == "acme"), "{own:#?}");
    let r = a
        .http()
        .get(format!("{}/factory/audit?tenant=beta", a.url))
        .bearer_auth(&acme_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = a
        .http()
        .get(format!("{}/factory/audit/verify", a.url))
        .bearer_auth(&acme_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // A bad parameter is named.
    let r = a
        .http()
        .get(format!("{}/factory/audit?from=yesterday", a.url))
        .bearer_auth(&platform)
        .send()
        .await
        .unwrap();
    let (status, p) = crate::common::problem(r).await;
    assert_eq!(status, 400);
    assert_eq!(p["field"], "from", "{p}");

    // Paging and CSV.
    let all = records(&a, &platform, "limit=1000").await;
    let page = a.get(&platform, "/factory/audit?limit=2").await;
    assert_eq!(page["records"].as_array().unwrap().len(), 2);
    let next = page["nextOlderThan"].as_u64().expect("a next page");
    let older = records(&a, &platform, &format!("limit=1000&olderThan={next}")).await;
    assert_eq!(older.len(), all.len() - 2);
    let csv = a
        .http()
        .get(format!("{}/factory/audit?format=csv&limit=1000", a.url))
        .bearer_auth(&platform)
        .send()
        .await
        .unwrap();
    assert!(
        csv.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv")
    );
    let csv = csv.text().await.unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("sequence,at,tenant,actor"));
    assert_eq!(lines.len(), all.len() + 1);

    // The chain checks, over the API and on the command line.
    let report = a.get(&platform, "/factory/audit/verify").await;
    assert!(report["broken"].is_null(), "{report}");
    assert_eq!(report["checked"].as_u64().unwrap() as usize, all.len());
    assert_eq!(report["head"], all[0]["hash"]);
    let (ok, out) = verify_cli(&a);
    assert!(ok, "{out}");
    assert!(out.contains("the audit trail is whole"), "{out}");
    assert!(out.contains(all[0]["hash"].as_str().unwrap()), "{out}");
}

/// Actions acknowledged before a kill -9 each have their record after it,
/// and the chain checks whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_is_whole_after_a_kill_9_in_the_middle_of_actions() {
    let mut a = Appliance::start();
    for t in ["t0", "t1"] {
        a.ensure_tenant(t).await;
    }
    let token = a.admin_token().await;
    let acknowledged = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..8 {
        let rpc = a.rpc_proto(&token);
        let acknowledged = acknowledged.clone();
        let stop = stop.clone();
        writers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let result = rpc
                    .create_client(pb::CreateClientRequest {
                        tenant_id: format!("t{}", w % 2),
                        scopes: vec!["factory.runs.read".into()],
                        ..Default::default()
                    })
                    .await;
                match result {
                    Ok(r) => {
                        let id = r.into_owned().client.as_option().unwrap().client_id.clone();
                        acknowledged.lock().insert(id);
                    }
                    Err(_) => break,
                }
            }
        }));
    }
    while acknowledged.lock().len() < 80 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    a.kill9();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acknowledged = acknowledged.lock().clone();

    // Offline, straight from the store.
    let (ok, out) = verify_cli(&a);
    assert!(ok, "{out}");
    assert!(out.contains("offline"), "{out}");

    a.restart();
    let token = a.admin_token().await;
    let audited: BTreeSet<String> = records(&a, &token, "action=client.create&limit=5000")
        .await
        .iter()
        .map(|r| r["target"].as_str().unwrap().to_string())
        .collect();
    let missing: Vec<_> = acknowledged.difference(&audited).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged actions have no audit record after kill -9: {missing:?}",
        missing.len()
    );
    let report = a.get(&token, "/factory/audit/verify").await;
    assert!(report["broken"].is_null(), "{report}");
    assert!(report["checked"].as_u64().unwrap() as usize >= acknowledged.len());
    // New actions go on from the chain's head.
    a.ensure_tenant("t2").await;
    let (ok, out) = verify_cli(&a);
    assert!(ok, "{out}");
}

/// An unauthenticated flood of refused sign-ins with megabyte names adds
/// a bounded trail: the first refusal of the minute, with the name cut to
/// 64 characters, and one record of how many followed once the minute is
/// over; the store barely grows.
#[tokio::test]
async fn refused_sign_ins_with_huge_names_are_bounded_and_counted_per_minute() {
    let a = Appliance::start_manual_clock();
    let platform = a.admin_token().await;
    let size = |dir: &std::path::Path| -> u64 {
        walkdir(dir)
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    };
    let before = size(&a.data_dir);
    let browser = a.http();
    let mut refused = 0;
    for i in 0..15 {
        let name = format!("{i:02}{}", "x".repeat(1_000_000));
        let r = browser
            .post(format!("{}/signin", a.url))
            .form(&[("username", name.as_str()), ("password", "wrong-password")])
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let page = r.text().await.unwrap();
        assert!([401, 429].contains(&status), "{status}");
        assert!(
            page.len() < 100_000,
            "the refusal page echoes {} bytes",
            page.len()
        );
        refused += usize::from(status == 401);
    }
    assert!(refused >= 2, "{refused} refusals");
    let kept = records(&a, &platform, "action=session.sign-in-refused").await;
    assert_eq!(
        kept.len(),
        1,
        "one record until the minute is over: {kept:#?}"
    );
    let target = kept[0]["target"].as_str().unwrap();
    assert_eq!(target, format!("00{}", "x".repeat(62)));
    assert_eq!(kept[0]["actor"], format!("user {target}"));

    a.advance(61).await;
    let mut counted = Vec::new();
    for _ in 0..50 {
        counted = records(&a, &platform, "action=session.sign-in-refused").await;
        if counted.len() == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(counted.len(), 2, "{counted:#?}");
    let detail = counted[0]["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(&format!(
            "{} more refused sign-ins from 127.0.0.1",
            refused - 1
        )),
        "{detail}"
    );
    assert!(counted[0]["target"].as_str().unwrap().len() < 8 * 66 + 20);
    // A name a spreadsheet would take as a formula is exported as text.
    let r = browser
        .post(format!("{}/signin", a.url))
        .form(&[
            ("username", "=HYPERLINK(\"https://x.invalid\")"),
            ("password", "wrong-password"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let csv = browser
        .get(format!(
            "{}/factory/audit?format=csv&action=session.sign-in-refused",
            a.url
        ))
        .bearer_auth(&platform)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        csv.contains("\"'=hyperlink(\"\"https://x.invalid\"\")\""),
        "{csv}"
    );
    assert!(!csv.contains(",=hyperlink"), "{csv}");
    let grown = size(&a.data_dir).saturating_sub(before);
    eprintln!("15 sign-ins refused with 1 MB names: the data directory grew by {grown} bytes");
    assert!(grown < 8 << 20, "the store grew by {grown} bytes");
}

fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walkdir(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// What was noted elsewhere is checked: the first record and a head hash.
/// A noted head no kept record has fails the check, by name.
#[tokio::test]
async fn verify_checks_the_noted_first_record_and_head() {
    let a = Appliance::start();
    a.ensure_tenant("acme").await;
    let platform = a.admin_token().await;
    for runs in [4, 2] {
        let (status, p) = a
            .put(
                &platform,
                "/factory/capacity/quotas/tenant.acme",
                json!({ "concurrentRuns": runs }),
            )
            .await;
        assert_eq!(status, 200, "{p}");
    }
    let report = a.get(&platform, "/factory/audit/verify").await;
    let head = report["head"].as_str().unwrap().to_string();
    let first = report["first"].as_u64().unwrap();
    let verify = |args: Vec<String>| {
        run(agentbay()
            .args(["audit", "verify", "--data-dir"])
            .arg(&a.data_dir)
            .args(args))
    };
    let out = verify(vec![
        "--expect-first".into(),
        first.to_string(),
        "--expect-head".into(),
        head.clone(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gone = format!("sha256:{}", "0".repeat(64));
    let out = verify(vec!["--expect-head".into(), gone.clone()]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("NOT AS EXPECTED") && said.contains(&gone),
        "{said}"
    );
    let r = a
        .http()
        .get(format!("{}/factory/audit/verify?expectFirst=x", a.url))
        .bearer_auth(&platform)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("expectFirst"));
}

/// Actions that change no record are audited too: a backup taken, a store
/// restored, a worker run by hand.
#[tokio::test]
async fn backups_restores_and_worker_runs_are_audited() {
    let a = Appliance::start();
    let platform = a.admin_token().await;
    a.run_worker("Purger").await;
    let file = a.root.join("audited.agentbay");
    let out = run(agentbay()
        .args(["backup"])
        .arg(&file)
        .arg("--data-dir")
        .arg(&a.data_dir));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let actions: Vec<String> = records(&a, &platform, "limit=100")
        .await
        .iter()
        .map(|r| r["action"].as_str().unwrap().to_string())
        .collect();
    for action in ["worker.run", "backup.create"] {
        assert!(actions.iter().any(|a| a == action), "{action}: {actions:?}");
    }
    let restored = a.root.join("restored");
    let out = run(agentbay()
        .args(["restore"])
        .arg(&file)
        .arg("--data-dir")
        .arg(&restored));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(agentbay()
        .args(["audit", "export", "--format", "json", "--data-dir"])
        .arg(&restored));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("backup.restore"), "{text}");
}
