//! Crash safety and the data directory's guards.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agentbay::proto::agentbay::admin::v1 as pb;
use parking_lot::Mutex;

use crate::common::{Appliance, agentbay, init, run, spawn_serve};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_write() {
    let mut a = Appliance::start();
    for t in ["t0", "t1", "t2", "t3"] {
        a.ensure_tenant(t).await;
    }
    let token = a.admin_token().await;
    let acknowledged = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..16 {
        let rpc = a.rpc_proto(&token);
        let acknowledged = acknowledged.clone();
        let stop = stop.clone();
        writers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let result = rpc
                    .create_client(pb::CreateClientRequest {
                        tenant_id: format!("t{}", w % 4),
                        scopes: vec!["factory.runs.read".into()],
                        description: format!("writer {w} #{n}"),
                        ..Default::default()
                    })
                    .await;
                match result {
                    // Acknowledged: it must survive.
                    Ok(r) => {
                        acknowledged
                            .lock()
                            .insert(r.into_owned().client.as_option().unwrap().client_id.clone());
                    }
                    // The process died under this request: no promise made.
                    Err(_) => break,
                }
                n += 1;
            }
        }));
    }
    // Kill while writes are in flight, after a good number were acknowledged.
    while acknowledged.lock().len() < 120 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    a.kill9();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    let acknowledged = acknowledged.lock().clone();
    assert!(acknowledged.len() >= 120);

    a.restart();
    let token = a.admin_token().await;
    let listed: BTreeSet<String> = a
        .rpc_json(&token)
        .list_clients(pb::ListClientsRequest::default())
        .await
        .unwrap()
        .into_owned()
        .clients
        .into_iter()
        .map(|c| c.client_id)
        .collect();
    let lost: Vec<_> = acknowledged.difference(&listed).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost after kill -9: {lost:?}",
        lost.len()
    );

    // Every acknowledged creation also has its event, in order, no gaps.
    let mut stream = a
        .rpc_proto(&token)
        .watch_events(pb::WatchEventsRequest::default())
        .await
        .unwrap();
    let mut seqs = Vec::new();
    let mut created = BTreeSet::new();
    while !acknowledged.is_subset(&created) {
        let e = stream.message().await.unwrap().unwrap().to_owned_message();
        seqs.push(e.sequence);
        if let Some(id) = e
            .payload
            .as_option()
            .and_then(|p| p.fields.get("clientId"))
            .and_then(|v| v.as_str())
        {
            created.insert(id.to_string());
        }
    }
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert!(acknowledged.is_subset(&created));
}

#[tokio::test]
async fn a_second_process_on_the_same_data_dir_is_refused() {
    let a = Appliance::start();
    let out = run(agentbay()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&a.data_dir));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("already in use"), "{stderr}");
    assert!(
        stderr.contains(&a.url),
        "the message names the running appliance: {stderr}"
    );
    // Restore never writes into a live directory either.
    let out = run(agentbay()
        .args(["restore", "/nonexistent.backup", "--data-dir"])
        .arg(&a.data_dir));
    assert!(!out.status.success());
}

#[tokio::test]
async fn a_store_from_a_newer_version_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    init(&data);
    {
        // What a future agentbay would leave behind.
        let db = agentbay::store::open_sled(&data.join("store"), None).unwrap();
        db.open_tree("meta")
            .unwrap()
            .insert("schema_version", &99u32.to_be_bytes())
            .unwrap();
        db.flush().unwrap();
    }
    let mut child = spawn_serve(tmp.path(), &data, &[]);
    let status = child.wait().unwrap();
    assert!(!status.success());
    let log = std::fs::read_to_string(tmp.path().join("serve.err")).unwrap();
    assert!(log.contains("schema version 99"), "{log}");
    assert!(log.contains("newer agentbay"), "{log}");
}

#[tokio::test]
async fn a_directory_that_is_not_agentbays_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("thesis.tex"), "precious").unwrap();
    let out = run(agentbay().args(["init", "--data-dir"]).arg(tmp.path()));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not an agentbay data directory"),
        "{stderr}"
    );
    assert!(stderr.contains("thesis.tex"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("thesis.tex")).unwrap(),
        "precious"
    );
}

#[tokio::test]
async fn bad_configuration_stops_the_start_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("agentbay.toml");
    std::fs::write(&config, "[http]\nmax_body = 10\n").unwrap();
    let out = run(agentbay().args(["serve", "--config"]).arg(&config));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("http.max_body"), "{stderr}");
    assert!(stderr.contains("unknown field"), "{stderr}");

    let out = run(agentbay()
        .args(["serve", "--data-dir"])
        .arg(tmp.path().join("d"))
        .env("AGENTBAY_LISTEN", "everywhere"));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`listen`") && stderr.contains("AGENTBAY_LISTEN"),
        "{stderr}"
    );
}

#[tokio::test]
async fn sigterm_drains_and_stops_cleanly() {
    let mut a = Appliance::start();
    a.create_client("acme", &["factory.runs.read"]).await;
    let status = a.terminate().await;
    assert!(status.success(), "{status:?}");
    assert!(a.log().contains("every acknowledged write is on disk"));
    assert!(!a.data_dir.join("run/appliance.json").exists());
    assert!(!a.data_dir.join("run/admin.token").exists());
    // And it starts again on the same data with the same certificate.
    let fingerprint = a.fingerprint.clone();
    a.restart();
    assert_eq!(a.fingerprint, fingerprint);
}
