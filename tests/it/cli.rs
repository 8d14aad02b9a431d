//! The command line: help, version, client management online and offline.

use crate::common::{Appliance, Credential, agentbay, init, run};

#[test]
fn every_command_has_help() {
    for args in [
        vec!["--help"],
        vec!["serve", "--help"],
        vec!["init", "--help"],
        vec!["backup", "--help"],
        vec!["restore", "--help"],
        vec!["client", "--help"],
        vec!["client", "create", "--help"],
        vec!["client", "list", "--help"],
        vec!["client", "revoke", "--help"],
        vec!["version", "--help"],
        vec!["tenant", "put", "--help"],
        vec!["tenant", "list", "--help"],
        vec!["project", "put", "--help"],
    ] {
        let out = run(agentbay().args(&args));
        assert!(out.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage"),
            "{args:?}"
        );
    }
    let out = run(agentbay().arg("version"));
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}

fn create_json(data_dir: &std::path::Path, tenant: &str, scope: &str) -> (Credential, String) {
    let out = run(agentbay()
        .args([
            "client",
            "create",
            "--tenant",
            tenant,
            "--scope",
            scope,
            "--json",
            "--data-dir",
        ])
        .arg(data_dir));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        Credential {
            id: v["client_id"].as_str().unwrap().into(),
            secret: v["client_secret"].as_str().unwrap().into(),
        },
        v["tenant_id"].as_str().unwrap().into(),
    )
}

#[tokio::test]
async fn clients_are_created_online_and_offline_alike() {
    // Offline: no appliance runs.
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let admin = init(&data);
    // Credentials refer to registered tenants only.
    let out = run(agentbay()
        .args([
            "client",
            "create",
            "--tenant",
            "acme",
            "--scope",
            "factory.runs.read",
            "--data-dir",
        ])
        .arg(&data));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("tenant acme is not registered"));
    let out = run(agentbay()
        .args([
            "tenant",
            "put",
            "acme",
            "--edition",
            "starter",
            "--data-dir",
        ])
        .arg(&data));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (offline, tenant) = create_json(&data, "acme", "agentbay.events.read");
    assert_eq!(tenant, "acme");
    assert!(offline.id.starts_with("acme."));

    // Online: the same command goes through the running appliance.
    let a = Appliance::serve(tmp.path(), &data, admin);
    let (online, _) = create_json(&data, "acme", "factory.runs.read");
    for credential in [&offline, &online] {
        let token = a.token(credential).await;
        assert!(!token.is_empty());
    }
    let out = run(agentbay()
        .args(["client", "list", "--json", "--data-dir"])
        .arg(&data));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["client_id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&offline.id.as_str()) && ids.contains(&online.id.as_str()));

    let out = run(agentbay()
        .args(["client", "revoke", &online.id, "--data-dir"])
        .arg(&data));
    assert!(out.status.success());
    let refused = a
        .http()
        .post(format!("{}/oauth/token", a.url))
        .basic_auth(&online.id, Some(&online.secret))
        .form(&[("grant_type", "client_credentials")])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);

    // Bad input names the flag.
    let out = run(agentbay()
        .args([
            "client",
            "create",
            "--tenant",
            "acme",
            "--scope",
            "factory.everything",
            "--data-dir",
        ])
        .arg(&data));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("factory.everything"), "{stderr}");
}

#[test]
fn init_twice_keeps_the_first_credential() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    init(&data);
    let out = run(agentbay().args(["init", "--json", "--data-dir"]).arg(&data));
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["already_initialised"], true);
    assert!(v.get("client_secret").is_none());
}
