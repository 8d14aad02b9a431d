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
        vec!["user", "create", "--help"],
        vec!["user", "list", "--help"],
        vec!["user", "disable", "--help"],
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
    // Creating a credential says which scopes exist and which one makes a
    // platform client a PlatformAdmin.
    let out = run(agentbay().args(["client", "create", "--help"]));
    let help = String::from_utf8_lossy(&out.stdout);
    for scope in agentbay::domain::access::Scope::ALL {
        assert!(help.contains(scope.as_str()), "{scope} missing: {help}");
    }
    assert!(
        help.contains("tenant platform holding agentbay.platform acts as PlatformAdmin"),
        "{help}"
    );
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
fn init_twice_keeps_the_first_credential_and_shows_it_until_used() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let first = init(&data);
    let out = run(agentbay().args(["init", "--json", "--data-dir"]).arg(&data));
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["already_initialised"], true);
    // Not used yet: the same secrets again, never new ones.
    assert_eq!(v["client_id"], first.id.as_str());
    assert_eq!(v["client_secret"], first.secret.as_str());
}

#[tokio::test]
async fn console_users_are_made_on_the_command_line_offline_and_online() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = run(agentbay().args(["init", "--json", "--data-dir"]).arg(&data));
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["console_username"], "admin");
    let admin_password = v["console_password"].as_str().unwrap().to_string();
    assert_eq!(admin_password.len(), 24);
    let admin = Credential {
        id: v["client_id"].as_str().unwrap().into(),
        secret: v["client_secret"].as_str().unwrap().into(),
    };

    // Offline: the store is opened directly; the password comes from a file
    // so that it never shows on a command line.
    let password_file = dir.path().join("pw");
    std::fs::write(&password_file, "a long enough password\n").unwrap();
    let out = run(agentbay()
        .args([
            "user",
            "create",
            "--tenant",
            "platform",
            "--username",
            "pat",
            "--role",
            "PlatformAdmin",
            "--password-file",
        ])
        .arg(&password_file)
        .arg("--data-dir")
        .arg(&data));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("password:"),
        "a given password is not printed"
    );
    let out = run(agentbay()
        .args([
            "user",
            "create",
            "--tenant",
            "platform",
            "--username",
            "bad",
            "--role",
            "Boss",
            "--data-dir",
        ])
        .arg(&data));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown role \"Boss\""));

    // Online: through the running appliance.
    let a = Appliance::serve(dir.path(), &data, admin);
    let token = a.admin_token().await;
    let (status, _) = a
        .put(
            &token,
            "/platform/tenants/acme",
            serde_json::json!({"edition": "team"}),
        )
        .await;
    assert_eq!(status, 200);
    let out = run(agentbay()
        .args([
            "user",
            "create",
            "--tenant",
            "acme",
            "--username",
            "rita",
            "--role",
            "Reviewer",
            "--json",
            "--data-dir",
        ])
        .arg(&data));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rita_password = v["password"].as_str().unwrap().to_string();
    assert_eq!(v["roles"], serde_json::json!(["Reviewer"]));
    let out = run(agentbay()
        .args(["user", "list", "--json", "--data-dir"])
        .arg(&data));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["username"].as_str().unwrap())
        .collect();
    for name in ["admin", "pat", "rita"] {
        assert!(names.contains(&name), "{names:?}");
    }

    // Every one of them signs in to the console.
    let client = crate::console::client(&a);
    for (name, password) in [
        ("admin", admin_password.as_str()),
        ("pat", "a long enough password"),
        ("rita", rita_password.as_str()),
    ] {
        let r = client
            .post(format!("{}/signin", a.url))
            .form(&[("username", name), ("password", password)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 303, "{name} signs in");
    }
    let out = run(agentbay()
        .args(["user", "disable", "--tenant", "acme", "rita", "--data-dir"])
        .arg(&data));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = client
        .post(format!("{}/signin", a.url))
        .form(&[("username", "rita"), ("password", rita_password.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "a disabled user cannot sign in");
}

/// With `log.dir` the log goes to a file a day there, JSON lines, the
/// oldest files beyond `log.keep_files` removed; nothing of it (and no
/// secret) on standard error. A directory it cannot make is refused at
/// start, naming the key and the path.
#[tokio::test]
async fn the_log_goes_to_a_file_a_day_in_log_dir() {
    let logs = tempfile::tempdir().unwrap();
    let dir = logs.path().join("logs");
    std::fs::create_dir(&dir).unwrap();
    let old: Vec<String> = (1..=6)
        .map(|day| format!("agentbay.2020-01-0{day}.log"))
        .collect();
    for name in &old {
        std::fs::write(dir.join(name), "{}\n").unwrap();
        // Creation times in order of the names.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // A directory the site made keeps the mode it gave it.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    crate::common::hand_to_appliance(logs.path());
    let dir_text = dir.to_str().unwrap();
    let mut appliance = Appliance::start_with(
        &[],
        &[
            ("AGENTBAY_LOG__DIR", dir_text),
            ("AGENTBAY_LOG__KEEP_FILES", "3"),
        ],
    );
    let token = appliance.admin_token().await;
    assert!(!token.is_empty());
    assert!(appliance.terminate().await.success());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode, 0o755,
            "the mode of a log.dir the appliance did not make: {mode:o}"
        );
    }

    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert!(files.len() <= 3, "keep_files 3 left {files:?}");
    assert!(
        !files.contains(&old[0]) && files.contains(&old[5]),
        "the oldest go first: {files:?}"
    );
    let current: Vec<&String> = files.iter().filter(|f| !old.contains(f)).collect();
    assert_eq!(current.len(), 1, "one file for today: {files:?}");
    let name = current[0];
    assert!(
        name.starts_with("agentbay.") && name.ends_with(".log"),
        "{name}"
    );
    let text = std::fs::read_to_string(dir.join(name)).unwrap();
    let messages: Vec<String> = text
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line}"));
            v["message"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    assert!(
        messages.iter().any(|m| m == "shutting down"),
        "{messages:?}"
    );
    assert!(
        messages.iter().any(|m| m.starts_with("agentbay stopped")),
        "{messages:?}"
    );
    assert!(
        !text.contains(&appliance.admin.secret),
        "a secret in the log"
    );
    assert!(
        !appliance.log().contains("shutting down"),
        "the log went to standard error too: {}",
        appliance.log()
    );

    // A log directory under a file cannot be made: the start is refused.
    let blocker = logs.path().join("a-file");
    std::fs::write(&blocker, "").unwrap();
    let bad = blocker.join("logs");
    let out = run(agentbay()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&appliance.data_dir)
        .env("AGENTBAY_LOG__DIR", &bad));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("log.dir") && err.contains(bad.to_str().unwrap()),
        "{err}"
    );
}
