//! HTTP conventions: problem+json, limits, content types, headers, the
//! published contract.

use serde_json::Value;

use crate::common::{Appliance, problem};

#[tokio::test]
async fn malformed_json_and_oversize_bodies_are_named() {
    let a = Appliance::start();
    let token = a.admin_token().await;
    let http = a.http();

    let malformed = http
        .post(format!("{}/agentbay.admin.v1.Admin/CreateClient", a.url))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body("{\"tenantId\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), 400);
    let body: serde_json::Value = malformed.json().await.unwrap();
    assert_eq!(body["code"], "invalid_argument");

    let big = "x".repeat(2 * 1024 * 1024);
    let oversize = http
        .post(format!("{}/agentbay.admin.v1.Admin/CreateClient", a.url))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(format!("{{\"description\":\"{big}\"}}"))
        .send()
        .await
        .unwrap();
    let status = oversize.status().as_u16();
    let body: serde_json::Value = oversize.json().await.unwrap();
    assert!(status == 413 || status == 429, "{status}");
    assert_eq!(body["code"], "resource_exhausted", "{body}");

    let oversize_form = http
        .post(format!("{}/oauth/token", a.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("grant_type=client_credentials&pad={big}"))
        .send()
        .await
        .unwrap();
    let (status, p) = problem(oversize_form).await;
    assert_eq!(status, 413);
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("http.max_body_bytes"),
        "{p}"
    );

    let wrong_type = http
        .post(format!("{}/oauth/token", a.url))
        .header("content-type", "application/json")
        .body("{\"grant_type\":\"client_credentials\"}")
        .send()
        .await
        .unwrap();
    let (status, p) = problem(wrong_type).await;
    assert_eq!(status, 415);
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("x-www-form-urlencoded"),
        "{p}"
    );

    let wrong_rpc_type = http
        .post(format!("{}/agentbay.admin.v1.Admin/GetVersion", a.url))
        .bearer_auth(&token)
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_rpc_type.status(), 415);
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_problem_json() {
    let a = Appliance::start();
    let (status, p) = problem(
        a.http()
            .get(format!("{}/no/such/page", a.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404);
    assert!(p["detail"].as_str().unwrap().contains("/no/such/page"));
    let (status, p) = problem(
        a.http()
            .delete(format!("{}/healthz", a.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 405);
    assert_eq!(p["code"], "method-not-allowed");

    // An RPC path: POST only, a content type it speaks, a token before any
    // stream; each refusal says what it needs.
    let token = a.admin_token().await;
    let rpc = format!("{}/agentbay.runs.v1.Runs/GetRun", a.url);
    for method in [
        reqwest::Method::GET,
        reqwest::Method::PUT,
        reqwest::Method::DELETE,
    ] {
        let r = a
            .http()
            .request(method.clone(), &rpc)
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405, "{method}");
        assert_eq!(r.headers()["allow"], "POST", "{method}");
        let body: Value = r.json().await.unwrap();
        assert!(body["message"].as_str().unwrap().contains("POST"), "{body}");
    }
    let r = a
        .http()
        .post(&rpc)
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let body: Value = r.json().await.unwrap();
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("application/json")
            && body["message"].as_str().unwrap().contains("none was sent"),
        "{body}"
    );
    let r = a
        .http()
        .post(format!("{}/agentbay.admin.v1.Admin/WatchEvents", a.url))
        .header("content-type", "application/connect+json")
        .body(vec![0u8, 0, 0, 0, 2, b'{', b'}'])
        .send()
        .await
        .unwrap();
    // No stream starts without a token; the refusal is a Connect stream's
    // end message, as every streaming error is.
    assert_eq!(r.status(), 200);
    let body = r.bytes().await.unwrap();
    assert_eq!(body[0], 2, "an end-of-stream envelope");
    let end: Value = serde_json::from_slice(&body[5..]).unwrap();
    assert_eq!(end["error"]["code"], "unauthenticated", "{end}");
}

#[tokio::test]
async fn pages_carry_security_headers_and_the_console_answers() {
    let a = Appliance::start();
    let response = a.http().get(&a.url).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    assert!(
        headers["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("default-src 'self'")
    );
    assert!(headers.contains_key("strict-transport-security"));
    assert_eq!(headers["x-content-type-options"], "nosniff");
    let html = response.text().await.unwrap();
    assert!(
        html.contains(&a.fingerprint),
        "the console shows the certificate fingerprint"
    );
    let css = a
        .http()
        .get(format!("{}/static/console.css", a.url))
        .send()
        .await
        .unwrap();
    assert_eq!(css.headers()["content-type"], "text/css; charset=utf-8");
}

#[tokio::test]
async fn the_contract_is_published() {
    let a = Appliance::start();
    let doc: serde_json::Value = a
        .http()
        .get(format!("{}/openapi.json", a.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for route in ["/oauth/token", "/events", "/healthz", "/readyz", "/metrics"] {
        assert!(
            paths.contains_key(route),
            "{route} missing from /openapi.json"
        );
    }
    for method in [
        "GetVersion",
        "CreateClient",
        "ListClients",
        "RevokeClient",
        "Backup",
        "WatchEvents",
    ] {
        let path = format!("/agentbay.admin.v1.Admin/{method}");
        assert!(
            paths.contains_key(&path),
            "{path} missing from /openapi.json"
        );
    }
    let files: Vec<String> = a
        .http()
        .get(format!("{}/proto/", a.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(files.contains(&"/proto/agentbay/admin/v1/admin.proto".to_string()));
    let proto = a
        .http()
        .get(format!("{}/proto/agentbay/admin/v1/admin.proto", a.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(proto.contains("service Admin"));
}

#[tokio::test]
async fn probes_and_metrics() {
    let a = Appliance::start();
    let http = a.http();
    let health: serde_json::Value = http
        .get(format!("{}/healthz", a.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    let ready = http.get(format!("{}/readyz", a.url)).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let ready: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(ready["store"], "ok");
    assert!(
        ready["workers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["name"] == "Purger")
    );

    let token = a.admin_token().await;
    let metrics = http
        .get(format!("{}/metrics", a.url))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().await.unwrap();
    assert!(text.contains("agentbay_http_requests_total"), "{text}");
    assert!(text.contains("agentbay_store_commits_total"), "{text}");
    assert!(text.contains("agentbay_auth_tokens_issued_total"), "{text}");
}
