//! Client credentials, tokens, scopes and tenant isolation.

use agentbay::proto::agentbay::admin::v1 as pb;
use connectrpc::ErrorCode;

use crate::common::{Appliance, problem};

#[tokio::test]
async fn tokens_are_issued_with_basic_or_form_credentials() {
    let a = Appliance::start();
    let http = a.http();
    let url = format!("{}/oauth/token", a.url);

    let basic = http
        .post(&url)
        .basic_auth(&a.admin.id, Some(&a.admin.secret))
        .form(&[("grant_type", "client_credentials")])
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), 200);
    assert_eq!(basic.headers()["cache-control"], "no-store");
    let body: serde_json::Value = basic.json().await.unwrap();
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["expires_in"], 900);
    assert!(
        body["scope"]
            .as_str()
            .unwrap()
            .contains("agentbay.platform")
    );

    let form = http
        .post(&url)
        .form(&[
            ("grant_type", "client_credentials"),
            ("client_id", &a.admin.id),
            ("client_secret", &a.admin.secret),
            ("scope", "factory.runs.read agentbay.events.read"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), 200);
    let body: serde_json::Value = form.json().await.unwrap();
    assert_eq!(body["scope"], "factory.runs.read agentbay.events.read");

    // A narrowed token carries only what it asked for.
    let narrowed = body["access_token"].as_str().unwrap();
    let err = a
        .rpc_json(narrowed)
        .list_clients(pb::ListClientsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::PermissionDenied);

    let both = http
        .post(&url)
        .basic_auth(&a.admin.id, Some(&a.admin.secret))
        .form(&[
            ("grant_type", "client_credentials"),
            ("client_id", a.admin.id.as_str()),
        ])
        .send()
        .await
        .unwrap();
    let (status, p) = problem(both).await;
    assert_eq!(status, 400);
    assert_eq!(p["error"], "invalid_request");

    let acme = a.create_client("acme", &["factory.runs.read"]).await;
    let beyond = http
        .post(&url)
        .basic_auth(&acme.id, Some(&acme.secret))
        .form(&[
            ("grant_type", "client_credentials"),
            ("scope", "factory.runs.write"),
        ])
        .send()
        .await
        .unwrap();
    let (status, p) = problem(beyond).await;
    assert_eq!(status, 400);
    assert_eq!(p["error"], "invalid_scope");
    assert!(
        p["detail"].as_str().unwrap().contains("factory.runs.write"),
        "{p}"
    );

    let grant = http
        .post(&url)
        .basic_auth(&acme.id, Some(&acme.secret))
        .form(&[("grant_type", "password")])
        .send()
        .await
        .unwrap();
    let (status, p) = problem(grant).await;
    assert_eq!(status, 400);
    assert_eq!(p["error"], "unsupported_grant_type");
    assert_eq!(p["field"], "grant_type");
}

#[tokio::test]
async fn a_wrong_secret_is_refused_with_401_and_then_rate_limited() {
    let a = Appliance::start();
    let http = a.http();
    let url = format!("{}/oauth/token", a.url);
    let wrong = http
        .post(&url)
        .basic_auth(&a.admin.id, Some("abs_not-the-secret"))
        .form(&[("grant_type", "client_credentials")])
        .send()
        .await
        .unwrap();
    assert!(wrong.headers().contains_key("www-authenticate"));
    let (status, p) = problem(wrong).await;
    assert_eq!(status, 401);
    assert_eq!(p["code"], "unauthenticated");
    assert_eq!(p["error"], "invalid_client");
    // The same answer for an id that does not exist: nothing to probe.
    let unknown = http
        .post(&url)
        .basic_auth("acme.00000000000000000000000000000000", Some("x"))
        .form(&[("grant_type", "client_credentials")])
        .send()
        .await
        .unwrap();
    let (status, p2) = problem(unknown).await;
    assert_eq!(status, 401);
    assert_eq!(p2["detail"], p["detail"]);

    // Five failures of one client id from one address in a minute: the
    // sixth attempt from there is not even checked.
    let attempt = |http: reqwest::Client, secret: String| {
        let url = url.clone();
        let id = a.admin.id.clone();
        async move {
            http.post(&url)
                .basic_auth(&id, Some(secret))
                .form(&[("grant_type", "client_credentials")])
                .send()
                .await
                .unwrap()
        }
    };
    for _ in 0..4 {
        let r = attempt(http.clone(), "abs_wrong".into()).await;
        assert_eq!(r.status(), 401);
    }
    let limited = attempt(http.clone(), a.admin.secret.clone()).await;
    assert!(limited.headers().contains_key("retry-after"));
    let (status, p) = problem(limited).await;
    assert_eq!(status, 429);
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("too many failed attempts for this name from your address"),
        "{p}"
    );
    // Nobody elsewhere can lock the client out: failures from many other
    // addresses slow its checks down (a second each) but the right secret
    // still gets a token.
    for source in 2..5 {
        let other =
            crate::common::https_client_at(&a.fingerprint, Some(&format!("127.0.0.{source}")));
        for _ in 0..2 {
            let r = attempt(other.clone(), "abs_wrong".into()).await;
            assert_eq!(r.status(), 401);
        }
    }
    let owner = crate::common::https_client_at(&a.fingerprint, Some("127.0.0.9"));
    let started = std::time::Instant::now();
    let r = attempt(owner, a.admin.secret.clone()).await;
    assert_eq!(
        r.status(),
        200,
        "the right secret from elsewhere still works"
    );
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(1),
        "a name over its failure limit is checked after a delay"
    );
}

#[tokio::test]
async fn requests_without_a_valid_token_get_401_naming_what_is_missing() {
    let a = Appliance::start();
    let http = a.http();
    let none = http.get(format!("{}/events", a.url)).send().await.unwrap();
    assert_eq!(
        none.headers()["www-authenticate"],
        "Bearer realm=\"agentbay\""
    );
    let (status, p) = problem(none).await;
    assert_eq!(status, 401);
    assert!(
        p["detail"].as_str().unwrap().contains("Authorization"),
        "{p}"
    );

    let garbage = http
        .get(format!("{}/events", a.url))
        .bearer_auth("not.a.token")
        .send()
        .await
        .unwrap();
    let (status, _) = problem(garbage).await;
    assert_eq!(status, 401);

    let err = a
        .rpc_proto("forged")
        .get_version(pb::GetVersionRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Unauthenticated);
}

#[tokio::test]
async fn a_missing_scope_is_403_naming_the_scope() {
    let a = Appliance::start();
    let reader = a.create_client("acme", &["factory.capacity.read"]).await;
    let token = a.token(&reader).await;

    let events = a
        .http()
        .get(format!("{}/events", a.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let (status, p) = problem(events).await;
    assert_eq!(status, 403);
    assert_eq!(p["code"], "permission-denied");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("agentbay.events.read"),
        "{p}"
    );

    let metrics = a
        .http()
        .get(format!("{}/metrics", a.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 403);

    let err = a
        .rpc_json(&token)
        .create_client(pb::CreateClientRequest {
            tenant_id: "acme".into(),
            scopes: vec!["factory.capacity.read".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::PermissionDenied);
    assert!(err.message.unwrap().contains("agentbay.admin"));

    // Any valid token may ask what it is.
    let me = a
        .rpc_proto(&token)
        .get_version(pb::GetVersionRequest::default())
        .await
        .unwrap()
        .into_owned();
    assert_eq!(me.caller_tenant_id, "acme");
    assert_eq!(me.caller_scopes, vec!["factory.capacity.read"]);
}

#[tokio::test]
async fn another_tenants_data_is_out_of_reach() {
    let a = Appliance::start();
    let acme_admin = a
        .create_client("acme", &["agentbay.admin", "agentbay.events.read"])
        .await;
    let globex = a.create_client("globex", &["factory.runs.read"]).await;
    let token = a.token(&acme_admin).await;
    let rpc = a.rpc_json(&token);

    let err = rpc
        .revoke_client(pb::RevokeClientRequest {
            client_id: globex.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::PermissionDenied);
    assert!(err.message.unwrap().contains("cannot access tenant globex"));

    let err = rpc
        .create_client(pb::CreateClientRequest {
            tenant_id: "globex".into(),
            scopes: vec!["agentbay.admin".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::PermissionDenied);

    // Nobody grants what they do not hold, not even in their own tenant.
    let err = rpc
        .create_client(pb::CreateClientRequest {
            tenant_id: "acme".into(),
            scopes: vec!["factory.capacity.admin".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::PermissionDenied);
    assert!(err.message.unwrap().contains("factory.capacity.admin"));

    let listed = rpc
        .list_clients(pb::ListClientsRequest::default())
        .await
        .unwrap()
        .into_owned();
    assert!(listed.clients.iter().all(|c| c.tenant_id == "acme"));
    assert!(!listed.clients.iter().any(|c| c.client_id == globex.id));

    let events = a
        .http()
        .get(format!("{}/events?tenant=globex", a.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let (status, p) = problem(events).await;
    assert_eq!(status, 403);
    assert!(p["detail"].as_str().unwrap().contains("globex"), "{p}");

    // The PlatformAdmin crosses tenants.
    let admin = a.admin_token().await;
    let all = a
        .rpc_json(&admin)
        .list_clients(pb::ListClientsRequest::default())
        .await
        .unwrap()
        .into_owned();
    assert!(all.clients.iter().any(|c| c.client_id == globex.id));
}

#[tokio::test]
async fn a_revoked_client_loses_its_tokens_at_once() {
    let a = Appliance::start();
    let client = a.create_client("acme", &["agentbay.events.read"]).await;
    let token = a.token(&client).await;
    let admin = a.admin_token().await;
    let revoked = a
        .rpc_proto(&admin)
        .revoke_client(pb::RevokeClientRequest {
            client_id: client.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert!(!revoked.client.as_option().unwrap().revoked_at.is_empty());
    // Idempotent.
    a.rpc_proto(&admin)
        .revoke_client(pb::RevokeClientRequest {
            client_id: client.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();

    let r = a
        .http()
        .get(format!("{}/events", a.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    let (status, p) = problem(r).await;
    assert_eq!(status, 401);
    assert!(p["detail"].as_str().unwrap().contains("revoked"), "{p}");
    let again = a
        .http()
        .post(format!("{}/oauth/token", a.url))
        .basic_auth(&client.id, Some(&client.secret))
        .form(&[("grant_type", "client_credentials")])
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 401);
}

/// The bootstrap secrets as `serve` printed them, one entry per start that
/// printed them: (client id, client secret, admin password).
/// The secrets printed on standard output by the first `starts` starts
/// that served. A start writes its runtime file (what `restart` waits for)
/// a moment before it prints, so this waits for the line each start prints
/// last.
fn printed_secrets(root: &std::path::Path, starts: usize) -> Vec<(String, String, String)> {
    let read = || std::fs::read_to_string(root.join("serve.out")).unwrap_or_default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut out = read();
    while out.matches(" serving https://").count() < starts {
        assert!(
            std::time::Instant::now() < deadline,
            "start {starts} printed nothing: {out}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        out = read();
    }
    let value = |line: &str, key: &str| line.trim().strip_prefix(key).map(|v| v.trim().to_string());
    let mut found = Vec::new();
    let mut current = (String::new(), String::new());
    for line in out.lines() {
        if let Some(v) = value(line, "client_id:") {
            current.0 = v;
        } else if let Some(v) = value(line, "client_secret:") {
            current.1 = v;
        } else if let Some(v) = value(line, "password:") {
            found.push((current.0.clone(), current.1.clone(), v));
        }
    }
    found
}

#[tokio::test]
async fn bootstrap_secrets_survive_a_failed_start_and_show_until_first_use() {
    use crate::common::{Credential, agentbay, run};
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");

    // The port is taken: the start fails before it makes anything.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = run(agentbay()
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(&data)
        .env("AGENTBAY_DEMO__ENABLED", "false"));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot listen on 127.0.0.1:{port}")),
        "{stderr}"
    );
    assert!(
        !data.join("store").exists(),
        "nothing is made before the bind"
    );
    drop(taken);

    // The first start that serves prints them, on standard output; the log
    // (standard error) holds none of them.
    let nobody = Credential {
        id: String::new(),
        secret: String::new(),
    };
    let mut a = Appliance::serve_with(tmp.path(), &data, nobody, &[], &[]);
    let first = printed_secrets(tmp.path(), 1);
    assert_eq!(first.len(), 1, "printed once");
    let sealed = data.join("bootstrap.sealed");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&sealed).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let bytes = std::fs::read(&sealed).unwrap();
        let secret = first[0].1.as_bytes();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret),
            "the copy is sealed, not the secret in the clear"
        );
    }

    // Unused: the next start prints the same secrets again, and `agentbay
    // init` shows them too.
    a.terminate().await;
    a.restart();
    assert_eq!(printed_secrets(tmp.path(), 2), vec![first[0].clone(); 2]);
    a.terminate().await;
    let shown = run(agentbay().args(["init", "--json", "--data-dir"]).arg(&data));
    assert!(shown.status.success());
    let v: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(v["client_id"], first[0].0.as_str());
    assert_eq!(v["client_secret"], first[0].1.as_str());
    assert_eq!(v["console_password"], first[0].2.as_str());
    a.restart();
    assert_eq!(printed_secrets(tmp.path(), 3).len(), 3);
    let log = a.log();
    for secret in [&first[0].1, &first[0].2] {
        assert!(!log.contains(secret.as_str()), "a secret in the log");
    }

    // The first token deletes the copy; no later start prints them.
    let credential = Credential {
        id: first[0].0.clone(),
        secret: first[0].1.clone(),
    };
    a.token(&credential).await;
    assert!(!sealed.exists(), "the first use deletes the sealed copy");
    a.terminate().await;
    a.restart();
    assert_eq!(
        printed_secrets(tmp.path(), 4).len(),
        3,
        "not printed once used"
    );
    // The credential itself still works.
    a.token(&credential).await;
}

#[tokio::test]
async fn a_reset_admin_password_is_not_shown_again_and_signs_in() {
    use crate::common::{agentbay, run};
    let mut a = Appliance::start();
    let sealed = a.data_dir.join("bootstrap.sealed");
    assert!(sealed.exists(), "init's secrets are unused");
    // Online, through the running appliance: a new password, printed once.
    let out = run(agentbay()
        .args([
            "user",
            "reset-password",
            "--tenant",
            "platform",
            "admin",
            "--data-dir",
        ])
        .arg(&a.data_dir));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let password = stdout.lines().last().unwrap().trim().to_string();
    assert_eq!(password.len(), 24, "{stdout}");
    // The sealed admin password no longer works: the next start does not
    // show stale secrets, and deletes them.
    a.terminate().await;
    let before = std::fs::read_to_string(a.root.join("serve.out")).unwrap();
    a.restart();
    let after = std::fs::read_to_string(a.root.join("serve.out")).unwrap();
    assert_eq!(
        after[before.len()..].matches("client_secret:").count(),
        0,
        "{after}"
    );
    assert!(!sealed.exists());
    let signin = crate::common::https_client_at(&a.fingerprint, None)
        .post(format!("{}/signin", a.url))
        .form(&[
            ("username", "admin"),
            ("password", password.as_str()),
            ("next", "/"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(signin.status(), 303, "the new password signs in");

    // Offline, with the appliance stopped, from a file: nothing printed.
    a.terminate().await;
    let file = a.root.join("new-password");
    std::fs::write(&file, "correct horse battery staple\n").unwrap();
    let out = run(agentbay()
        .args(["user", "reset-password", "--tenant", "platform", "admin"])
        .arg("--password-file")
        .arg(&file)
        .arg("--data-dir")
        .arg(&a.data_dir));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("offline"), "{stdout}");
    assert!(!stdout.contains("correct horse"), "{stdout}");
    a.restart();
    let signin = crate::common::https_client_at(&a.fingerprint, None)
        .post(format!("{}/signin", a.url))
        .form(&[
            ("username", "admin"),
            ("password", "correct horse battery staple"),
            ("next", "/"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(signin.status(), 303, "the password from the file signs in");
}
