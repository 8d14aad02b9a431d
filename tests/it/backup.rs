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
