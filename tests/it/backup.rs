//! Backup while serving, restore, and the restored appliance.

use std::collections::BTreeSet;

use agentbay::proto::agentbay::admin::v1 as pb;

use crate::common::{Appliance, agentbay, run};

async fn client_ids(a: &Appliance) -> BTreeSet<String> {
    let token = a.admin_token().await;
    a.rpc_json(&token)
        .list_clients(pb::ListClientsRequest::default())
        .await
        .unwrap()
        .into_owned()
        .clients
        .into_iter()
        .map(|c| c.client_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_serving_restores_into_a_working_appliance() {
    let mut a = Appliance::start();
    for i in 0..5 {
        a.create_client(&format!("t{i}"), &["factory.runs.read"])
            .await;
    }
    let before = client_ids(&a).await;

    // Writes keep coming while the backup runs.
    a.ensure_tenant("busy").await;
    let token = a.admin_token().await;
    let rpc = a.rpc_proto(&token);
    let writer = tokio::spawn(async move {
        for i in 0..20 {
            rpc.create_client(pb::CreateClientRequest {
                tenant_id: "busy".into(),
                scopes: vec!["factory.runs.read".into()],
                description: format!("during backup {i}"),
                ..Default::default()
            })
            .await
            .unwrap();
        }
    });
    let file = a.root.join("site.agentbay");
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
    assert!(String::from_utf8_lossy(&out.stdout).contains("through the running appliance"));
    writer.await.unwrap();

    let restored_dir = a.root.join("restored");
    let out = run(agentbay()
        .args(["restore"])
        .arg(&file)
        .arg("--data-dir")
        .arg(&restored_dir));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Restoring twice into the same directory is refused.
    let out = run(agentbay()
        .args(["restore"])
        .arg(&file)
        .arg("--data-dir")
        .arg(&restored_dir));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));

    a.terminate().await;
    let restored_root = a.root.join("restored-run");
    std::fs::create_dir_all(&restored_root).unwrap();
    let b = Appliance::serve(&restored_root, &restored_dir, a.admin.clone());
    // Same identity: certificate and bootstrap credential.
    assert_eq!(b.fingerprint, a.fingerprint);
    let after = client_ids(&b).await;
    assert!(
        before.is_subset(&after),
        "every client created before the backup is restored"
    );
    // A consistent snapshot: the busy writer's clients are a prefix of its
    // sequence (all or nothing per write, none torn).
    let busy = after.iter().filter(|id| id.starts_with("busy.")).count();
    assert!(busy <= 20);
}

#[tokio::test]
async fn an_offline_backup_needs_no_running_appliance() {
    let mut a = Appliance::start();
    a.create_client("acme", &["factory.runs.read"]).await;
    a.terminate().await;
    let file = a.root.join("offline.agentbay");
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
    assert!(String::from_utf8_lossy(&out.stdout).contains("offline"));
    // A damaged copy is refused and leaves nothing behind.
    let bytes = std::fs::read(&file).unwrap();
    let damaged = a.root.join("damaged.agentbay");
    std::fs::write(&damaged, &bytes[..bytes.len() - 40]).unwrap();
    let target = a.root.join("from-damaged");
    let out = run(agentbay()
        .args(["restore"])
        .arg(&damaged)
        .arg("--data-dir")
        .arg(&target));
    assert!(!out.status.success());
    assert!(!target.exists());
}

/// Scheduled backups on the manual clock: one per interval, private,
/// rotated down to `backup.keep`, verified, reported by /readyz, checked by
/// `agentbay backup verify` (which refuses a damaged copy), and restorable.
#[tokio::test]
async fn scheduled_backups_appear_on_the_clock_rotate_verify_and_restore() {
    let holder = tempfile::tempdir().unwrap();
    let dir = holder.path().join("backups");
    let dir_text = dir.to_string_lossy().into_owned();
    let mut a = Appliance::start_with(
        &["--manual-clock"],
        &[
            ("AGENTBAY_BACKUP__DIR", dir_text.as_str()),
            ("AGENTBAY_BACKUP__KEEP", "2"),
            // A week: the clock's moves below never start a pass of their
            // own, so each pass is the test's.
            ("AGENTBAY_BACKUP__INTERVAL_MINUTES", "10080"),
        ],
    );
    a.ensure_tenant("acme").await;
    let mut runs = 0;
    for _ in 0..3 {
        a.advance(15 * 60).await;
        let pass = a.run_worker("ScheduledBackup").await;
        assert!(pass.ok, "{}", pass.message);
        assert!(pass.message.contains("verified"), "{}", pass.message);
        runs = pass.runs;
    }
    assert!(runs >= 3);
    // Complete backups only: a pass the clock started may be under way.
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".backup"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "rotated down to keep = 2: {files:?}");
    for f in &files {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", f.display());
    }
    let ready: serde_json::Value = a
        .http()
        .get(format!("{}/readyz", a.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let b = &ready["backup"];
    let newest = std::path::PathBuf::from(b["last"]["file"].as_str().unwrap());
    assert!(
        files.contains(&newest),
        "the last backup is one kept: {ready}"
    );
    assert_eq!(b["last"]["verified"], true);
    assert!(b["last"]["sizeBytes"].as_u64().unwrap() > 0);
    assert_eq!(b["ageSeconds"], 0, "taken at the clock's now");
    a.advance(600).await;
    let later: serde_json::Value = a
        .http()
        .get(format!("{}/readyz", a.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        later["backup"]["ageSeconds"], 600,
        "the age follows the clock"
    );

    let out = run(agentbay().args(["backup", "verify"]).arg(&newest));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("verified"));
    let bytes = std::fs::read(&newest).unwrap();
    let damaged = holder.path().join("damaged.backup");
    std::fs::write(&damaged, &bytes[..bytes.len() - 40]).unwrap();
    let out = run(agentbay().args(["backup", "verify"]).arg(&damaged));
    assert!(!out.status.success(), "a truncated backup does not verify");

    a.terminate().await;
    let restored = holder.path().join("restored");
    let out = run(agentbay()
        .args(["restore"])
        .arg(&newest)
        .arg("--data-dir")
        .arg(&restored));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let root = holder.path().join("restored-run");
    std::fs::create_dir_all(&root).unwrap();
    let b = Appliance::serve(&root, &restored, a.admin.clone());
    let token = b.admin_token().await;
    let tenants = b
        .rpc_json(&token)
        .list_tenants(pb::ListTenantsRequest::default())
        .await
        .unwrap()
        .into_owned();
    assert!(tenants.tenants.iter().any(|t| t.tenant_id == "acme"));
}

/// `agentbay compact` rewrites a stopped appliance's store and keeps every
/// record; a compaction cut off after the old store was moved aside is
/// finished by the next start, and one cut off during the copy discarded.
#[tokio::test]
async fn compaction_keeps_every_record_and_survives_a_crash_mid_swap() {
    let mut a = Appliance::start();
    for i in 0..5 {
        a.create_client(&format!("c{i}"), &["factory.runs.read"])
            .await;
    }
    let before = client_ids(&a).await;
    // Running: refused, naming what to do.
    let out = run(agentbay().args(["compact", "--data-dir"]).arg(&a.data_dir));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("stop the appliance first"));
    a.terminate().await;
    let out = run(agentbay().args(["compact", "--data-dir"]).arg(&a.data_dir));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("store compacted"));
    a.restart();
    assert_eq!(client_ids(&a).await, before);
    a.terminate().await;

    // A crash after the old store was moved aside: the complete copy and
    // its marker are there, the store is not.
    let store = a.data_dir.join("store");
    let copy = a.data_dir.join("store.compacted");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&store)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::rename(&store, a.data_dir.join("store.old")).unwrap();
    std::fs::write(a.data_dir.join("store.compacted.complete"), "complete\n").unwrap();
    a.restart();
    assert_eq!(client_ids(&a).await, before, "the swap was finished");
    a.terminate().await;
    assert!(!a.data_dir.join("store.old").exists());
    assert!(!a.data_dir.join("store.compacted.complete").exists());

    // A crash during the copy: no marker; the partial copy is discarded.
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::write(copy.join("db"), b"partial").unwrap();
    a.restart();
    assert_eq!(client_ids(&a).await, before);
    assert!(!copy.exists());
}
