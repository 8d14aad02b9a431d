//! The web console over real HTTPS: sign-in, sessions, CSRF, every page and
//! form for every role, and another tenant's data.

use std::time::Duration;

use agentbay::proto::agentbay::admin::v1 as pb;
use reqwest::StatusCode;
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use serde_json::{Value, json};

use crate::common::Appliance;

/// A browser-like client of one signed-in user: cookie, CSRF token, no
/// redirects followed (so tests see them).
pub(crate) struct Visitor {
    client: reqwest::Client,
    base: String,
    cookie: String,
    csrf: String,
}

pub(crate) fn client(a: &Appliance) -> reqwest::Client {
    crate::common::https_client_at(&a.fingerprint, None)
}

pub(crate) const PASSWORD: &str = "correct horse battery staple";

impl Visitor {
    /// Signs in; panics unless the sign-in succeeds.
    pub(crate) async fn sign_in(a: &Appliance, username: &str) -> Visitor {
        let client = client(a);
        let response = client
            .post(format!("{}/signin", a.url))
            .form(&[
                ("username", username),
                ("password", PASSWORD),
                ("next", "/"),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::SEE_OTHER,
            "sign-in of {username}"
        );
        let set = response.headers()[SET_COOKIE].to_str().unwrap().to_string();
        for attribute in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
            assert!(set.contains(attribute), "{set} lacks {attribute}");
        }
        let cookie = set.split(';').next().unwrap().to_string();
        assert!(cookie.starts_with("__Host-agentbay_session="), "{cookie}");
        let mut v = Visitor {
            client,
            base: a.url.clone(),
            cookie,
            csrf: String::new(),
        };
        let (status, body) = v.get("/runs").await;
        assert!(status == 200 || status == 403, "{status}");
        v.csrf = csrf_of(&body).expect("every page carries the CSRF token");
        v
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, String) {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .header(COOKIE, &self.cookie)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// Posts a form with the CSRF token; returns the status and the
    /// redirect target.
    pub(crate) async fn post(&self, path: &str, fields: &[(&str, &str)]) -> (u16, String) {
        let mut form: Vec<(&str, &str)> = vec![("csrf", &self.csrf)];
        form.extend_from_slice(fields);
        self.post_raw(path, &form).await
    }

    async fn post_raw(&self, path: &str, form: &[(&str, &str)]) -> (u16, String) {
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .header(COOKIE, &self.cookie)
            .form(form)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get(LOCATION)
            .map(|l| l.to_str().unwrap().to_string());
        let body = response.text().await.unwrap();
        (status, location.unwrap_or(body))
    }

    /// Posts a form and returns the message the next page shows.
    pub(crate) async fn act(&self, path: &str, fields: &[(&str, &str)]) -> (bool, String) {
        let (status, location) = self.post(path, fields).await;
        assert_eq!(status, 303, "{path}: {location}");
        let (_, page) = self.get(&location).await;
        flash_of(&page).unwrap_or_else(|| panic!("{path}: no message on {location}"))
    }
}

fn csrf_of(page: &str) -> Option<String> {
    let at = page.find("name=\"csrf\" value=\"")? + "name=\"csrf\" value=\"".len();
    Some(page[at..].split('"').next()?.to_string())
}

/// The one-time message of a page: (ok, text).
pub(crate) fn flash_of(page: &str) -> Option<(bool, String)> {
    let at = page.find("<p class=\"flash ")?;
    let rest = &page[at..];
    let ok = rest.starts_with("<p class=\"flash ok");
    let text = rest.split('>').nth(1)?.split('<').next()?.to_string();
    Some((ok, html_unescape(&text)))
}

pub(crate) fn html_unescape(s: &str) -> String {
    s.replace("&#34;", "\"")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#60;", "<")
        .replace("&#62;", ">")
        .replace("&amp;", "&")
}

/// Creates a console user with [`PASSWORD`].
pub(crate) async fn user(a: &Appliance, tenant: &str, name: &str, roles: &[&str]) {
    let token = a.admin_token().await;
    a.rpc_json(&token)
        .create_user(pb::CreateUserRequest {
            tenant_id: tenant.into(),
            username: name.into(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
            password: PASSWORD.into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("create user {name}: {e:?}"));
}

/// The demo's attempts (id, run, release, state), once its four runs have
/// settled.
pub(crate) async fn demo_attempts(a: &Appliance) -> Vec<Value> {
    let token = a.admin_token().await;
    for _ in 0..400 {
        let response = a
            .http()
            .post(format!("{}/agentbay.runs.v1.Runs/ListRuns", a.url))
            .bearer_auth(&token)
            .json(&serde_json::json!({"tenantId": "demo"}))
            .send()
            .await
            .unwrap();
        let v: Value = response.json().await.unwrap();
        let attempts: Vec<Value> = v["runs"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|run| {
                let run_id = run["runId"].clone();
                let release = run["releaseId"].clone();
                run["steps"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|s| s["attempts"].as_array().into_iter().flatten())
                    .map(move |x| {
                        serde_json::json!({"attemptId": x["attemptId"], "runId": run_id, "releaseId": release, "state": x["state"]})
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let states: Vec<&str> = attempts
            .iter()
            .filter_map(|x| x["state"].as_str())
            .collect();
        if states.len() == 4
            && states
                .iter()
                .filter(|s| **s == "WaitingForDecision")
                .count()
                == 2
            && states.contains(&"Succeeded")
            && states.contains(&"Failed")
        {
            return attempts;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the demo's runs did not settle");
}

pub(crate) fn demo() -> Appliance {
    Appliance::start_with(&[], &[("AGENTBAY_DEMO__ENABLED", "true")])
}

/// The demo with a user of every role of tenant `demo` (obs, req, rev,
/// ops, wsa) and a PlatformAdmin (pla).
async fn demo_with_every_role() -> Appliance {
    let a = demo();
    for (name, role) in [
        ("obs", "Observer"),
        ("req", "Requester"),
        ("rev", "Reviewer"),
        ("ops", "Operator"),
        ("wsa", "WorkspaceAdmin"),
    ] {
        user(&a, "demo", name, &[role]).await;
    }
    user(&a, "platform", "pla", &["PlatformAdmin"]).await;
    a
}

/// The demo attempt waiting for a reviewer's approval to page on-call.
fn approval_of(list: &[Value]) -> String {
    list.iter()
        .find(|x| x["releaseId"] == "triage-approval-1.0.0")
        .and_then(|x| x["attemptId"].as_str())
        .unwrap_or_else(|| panic!("no approval attempt in {list:?}"))
        .to_string()
}

fn id_of(list: &[Value], state: &str) -> String {
    list.iter()
        .find(|x| x["state"] == state)
        .and_then(|x| x["attemptId"].as_str())
        .unwrap_or_else(|| panic!("no {state} attempt in {list:?}"))
        .to_string()
}

#[tokio::test]
async fn signing_in_sessions_csrf_and_rate_limits() {
    let a = demo();
    user(&a, "demo", "olga", &["Observer"]).await;
    let c = client(&a);

    // Without a session every page sends the browser to sign in, with the
    // page to come back to.
    let r = c
        .get(format!("{}/attempts?state=Failed", a.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(
        r.headers()[LOCATION],
        "/signin?next=%2Fattempts%3Fstate%3DFailed"
    );
    let r = c.get(format!("{}/signin", a.url)).send().await.unwrap();
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        csp.contains("default-src 'self'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    let page = r.text().await.unwrap();
    assert!(
        page.contains(&a.fingerprint),
        "the sign-in page shows the certificate"
    );
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no asset from outside the appliance"
    );

    // Another site cannot sign a visitor in (login CSRF).
    let r = c
        .post(format!("{}/signin", a.url))
        .header("sec-fetch-site", "cross-site")
        .form(&[("username", "olga"), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get(SET_COOKIE).is_none());

    // A wrong password says nothing about whether the user exists.
    let wrong = |name: &'static str| {
        let c = c.clone();
        let url = a.url.clone();
        async move {
            c.post(format!("{url}/signin"))
                .form(&[("username", name), ("password", "not the password")])
                .send()
                .await
                .unwrap()
        }
    };
    let r = wrong("olga").await;
    assert_eq!(r.status(), 401);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("unknown user name or wrong password")
    );
    let r = wrong("nobody").await;
    assert_eq!(r.status(), 401);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("unknown user name or wrong password")
    );
    // Five failures in a minute lock the name from this address, even for
    // the right password; from another address its owner still signs in.
    for _ in 0..4 {
        wrong("olga").await;
    }
    let r = c
        .post(format!("{}/signin", a.url))
        .form(&[("username", "olga"), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("too many failed attempts for this name from your address")
    );
    let elsewhere = crate::common::https_client_at(&a.fingerprint, Some("127.0.0.2"));
    let r = elsewhere
        .post(format!("{}/signin", a.url))
        .form(&[("username", "olga"), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "the owner signs in from another address");

    user(&a, "demo", "rita", &["Reviewer"]).await;
    let rita = Visitor::sign_in(&a, "rita").await;
    let attempts = demo_attempts(&a).await;
    let waiting = approval_of(&attempts);
    let (_, page) = rita.get(&format!("/attempts/{waiting}")).await;
    let action = page
        .split("action=\"")
        .find(|s| s.contains("/decisions/"))
        .and_then(|s| s.split('"').next())
        .expect("a pending approval has a form")
        .to_string();

    // A form without the token, or with another session's, is refused and
    // changes nothing.
    let (status, _) = rita.post_raw(&action, &[("action", "approve")]).await;
    assert_eq!(status, 403);
    user(&a, "demo", "rudi", &["Reviewer"]).await;
    let rudi = Visitor::sign_in(&a, "rudi").await;
    let (status, body) = rita
        .post_raw(&action, &[("csrf", &rudi.csrf), ("action", "approve")])
        .await;
    assert_eq!(status, 403);
    assert!(body.contains("CSRF"), "{body}");
    // With its own token, a form from another site is refused all the same,
    // whether the browser says so or only its Origin does.
    for (name, value) in [
        ("origin", "https://evil.example"),
        ("origin", "null"),
        ("sec-fetch-site", "cross-site"),
    ] {
        let r = rita
            .client
            .post(format!("{}{action}", rita.base))
            .header(COOKIE, &rita.cookie)
            .header(name, value)
            .form(&[("csrf", rita.csrf.as_str()), ("action", "approve")])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{name}: {value}");
        let body = r.text().await.unwrap();
        assert!(body.contains("own pages only"), "{body}");
    }
    let (_, page) = rita.get(&format!("/attempts/{waiting}")).await;
    assert!(page.contains(">WaitingForDecision<"), "nothing was decided");

    // Signing out ends the session on the server, not only in the browser.
    let (status, to) = rita.post("/signout", &[]).await;
    assert_eq!((status, to.as_str()), (303, "/signin"));
    let (status, _) = rita.get("/").await;
    assert_eq!(status, 303);

    // Disabling a user ends its sessions at once, live streams included,
    // and refuses its sign-in.
    let stream = client(&a)
        .get(format!("{}/live/overview", a.url))
        .header(COOKIE, &rudi.cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let admin_token = a.admin_token().await;
    a.rpc_json(&admin_token)
        .disable_user(pb::DisableUserRequest {
            tenant_id: "demo".into(),
            username: "rudi".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rudi.get("/").await.0, 303);
    let body = tokio::time::timeout(Duration::from_secs(10), stream.text())
        .await
        .expect("the live stream ends with the session")
        .unwrap();
    assert!(body.starts_with("event: html"), "{body}");
    let r = c
        .post(format!("{}/signin", a.url))
        .form(&[("username", "rudi"), ("password", PASSWORD)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("disabled"));
}

/// Pages every signed-in reader of the tenant may open.
const READ_PAGES: &[&str] = &[
    "/",
    "/runs",
    "/attempts",
    "/decisions",
    "/uncertain",
    "/pools",
    "/quotas",
    "/leases",
    "/releases",
    "/usage",
];
const ADMIN_PAGES: &[&str] = &["/tenants", "/users", "/clients", "/audit", "/audit.csv"];

#[tokio::test]
async fn every_page_for_every_role_and_no_other_tenants_data() {
    let a = demo_with_every_role().await;
    a.tenant("acme", "team", &[], &["web"]).await;
    user(&a, "acme", "acm", &["WorkspaceAdmin"]).await;
    let attempts = demo_attempts(&a).await;
    let attempt = id_of(&attempts, "Succeeded");
    let failed = id_of(&attempts, "Failed");
    let run = attempts
        .iter()
        .find(|x| x["attemptId"] == attempt.as_str())
        .unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_string();
    let detail = [
        format!("/attempts/{attempt}"),
        format!("/attempts/{attempt}/checkpoints"),
        format!("/runs/{run}"),
        "/releases/triage-1.0.0".to_string(),
    ];

    for name in ["obs", "req", "rev", "ops", "wsa"] {
        let v = Visitor::sign_in(&a, name).await;
        for page in READ_PAGES
            .iter()
            .copied()
            .chain(detail.iter().map(String::as_str))
        {
            let (status, body) = v.get(page).await;
            assert_eq!(status, 200, "{name} {page}: {body}");
            assert!(
                body.contains("tenant demo"),
                "{name} {page} shows its tenant"
            );
            assert!(
                body.contains(&a.fingerprint),
                "{name} {page} shows the certificate"
            );
        }
        let (_, body) = v.get(&format!("/attempts/{attempt}")).await;
        assert!(
            body.contains(">Succeeded<") && body.contains("Phases over time"),
            "{name}"
        );
        assert!(
            body.contains("<pre class=\"artifact\">{"),
            "the output is shown: {body}"
        );
        let (_, body) = v.get(&format!("/runs/{run}")).await;
        assert!(
            body.contains("acme-corp") && body.contains("<summary>output</summary>"),
            "{body}"
        );
        // Every reader may take the run away for review.
        assert!(
            body.contains(&format!("href=\"/runs/{run}/export\"")),
            "{body}"
        );
        let export = v
            .client
            .get(format!("{}/runs/{run}/export", v.base))
            .header(COOKIE, &v.cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(export.status(), 200, "{name}");
        assert_eq!(export.headers()["content-type"], "application/gzip");
        assert!(export.bytes().await.unwrap().starts_with(&[0x1f, 0x8b]));
        // A release's page: its verdicts, the files its manifest pins and
        // the manifest; deprecate and revoke only for an AssetsAdmin.
        let (_, body) = v.get("/releases/triage-1.0.0").await;
        assert!(
            body.contains("id=\"verdicts\"")
                && body.contains("stored as Verified")
                && body.contains("<code>instructions.md</code>")
                && body.contains("<summary>Manifest</summary>"),
            "{name}: {body}"
        );
        assert_eq!(
            body.contains("action=\"/releases/triage-1.0.0/retire\""),
            name == "wsa",
            "{name}: lifecycle actions"
        );
        let (_, body) = v.get(&format!("/attempts/{failed}")).await;
        assert!(
            html_unescape(&body).contains("The validator's violations")
                && html_unescape(&body).contains("\"violations\": ["),
            "{body}"
        );
        for page in ADMIN_PAGES {
            let (status, body) = v.get(page).await;
            let expected = if name == "wsa" { 200 } else { 403 };
            assert_eq!(status, expected, "{name} {page}");
            if expected == 403 {
                assert!(
                    body.contains("agentbay.admin") && body.contains("WorkspaceAdmin"),
                    "the refusal names the scope and the roles: {body}"
                );
            }
        }
        let (status, _) = v.get("/system").await;
        assert_eq!(status, 403, "{name} /system is a PlatformAdmin's");
        // The navigation offers only what the role may open.
        let (_, list) = v.get("/attempts?state=WaitingForDecision").await;
        assert!(
            list.contains("waiting for a human approval"),
            "why it waits, in the list: {list}"
        );
        let (_, home) = v.get("/").await;
        assert_eq!(home.contains("href=\"/users\""), name == "wsa", "{name}");
    }

    // A tenant's audit trail holds its own records only: acme's
    // registration and its administrator are not demo's to read.
    let wsa = Visitor::sign_in(&a, "wsa").await;
    let (status, csv) = wsa.get("/audit.csv").await;
    assert_eq!(status, 200);
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    assert!(!rows.is_empty(), "{csv}");
    assert!(
        rows.iter().all(|r| r.split(',').nth(2) == Some("demo")),
        "{csv}"
    );
    assert!(!csv.contains("acm"), "{csv}");

    // The usage page and its CSV say what the API says, by agent.
    let obs = Visitor::sign_in(&a, "obs").await;
    let api = a
        .get(
            &a.admin_token().await,
            "/factory/usage?tenant=demo&groupBy=agent",
        )
        .await;
    let total = api["total"]["inputTokens"].as_u64().unwrap()
        + api["total"]["outputTokens"].as_u64().unwrap();
    assert!(total > 0, "the demo's model calls are charged: {api}");
    let (status, page) = obs.get("/usage?by-agent=1").await;
    assert_eq!(status, 200);
    assert!(page.contains(&format!("<b>{total}</b> tokens")), "{page}");
    let (status, csv) = obs.get("/usage.csv?by-agent=1").await;
    assert_eq!(status, 200);
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("agentId,inputTokens,outputTokens,cachedTokens,totalTokens,modelCalls")
    );
    let sum: u64 = lines
        .map(|l| l.split(',').nth(4).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(sum, total, "{csv}");

    // Another tenant's user sees none of the demo's data, by id or in lists.
    let acm = Visitor::sign_in(&a, "acm").await;
    for page in &detail {
        let (status, body) = acm.get(page).await;
        assert_eq!(status, 404, "acme sees {page}: {body}");
        assert!(
            body.contains("<nav class=\"main\">") && body.contains("href=\"/runs\""),
            "a 404 keeps the navigation: {body}"
        );
    }
    let (_, run_page) = acm.get(&format!("/runs/{run}")).await;
    assert!(
        !run_page.contains("acme-corp"),
        "no demo input leaks to acme"
    );
    let (_, list) = acm.get("/attempts").await;
    assert!(
        !list.contains(&attempt),
        "acme's attempt list shows a demo attempt"
    );
    assert!(list.contains("No attempts match."));
    let (status, body) = acm.post("/view-tenant", &[("tenant", "demo")]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("cannot access tenant demo"), "{body}");
    let (status, _) = acm.get("/tenants").await;
    assert_eq!(
        status, 200,
        "a WorkspaceAdmin sees its own tenant and projects"
    );
    let (_, body) = acm.get("/tenants").await;
    assert!(!body.contains(">demo<"), "and no other tenant");

    // A PlatformAdmin lands on the tenant with the newest run, not on the
    // platform's own (which runs nothing), and switches to any tenant.
    let pla = Visitor::sign_in(&a, "pla").await;
    let (_, body) = pla.get("/").await;
    assert!(body.contains("Overview · tenant demo"), "{body}");
    assert!(
        body.contains("id=\"recent-runs\"") && body.contains(&format!("href=\"/runs/{run}\"")),
        "the overview lists recent runs: {body}"
    );
    let (ok, message) = pla.act("/view-tenant", &[("tenant", "platform")]).await;
    assert!(ok, "{message}");
    let (_, body) = pla.get("/attempts").await;
    assert!(
        !body.contains(&attempt),
        "the platform tenant has no demo attempt"
    );
    let (ok, message) = pla.act("/view-tenant", &[("tenant", "demo")]).await;
    assert!(ok, "{message}");
    for page in READ_PAGES
        .iter()
        .copied()
        .chain(ADMIN_PAGES.iter().copied())
        .chain(detail.iter().map(String::as_str))
    {
        let (status, body) = pla.get(page).await;
        assert_eq!(status, 200, "platform admin {page}: {body}");
    }
    let (_, body) = pla.get("/tenants").await;
    assert!(body.contains(">acme<") && body.contains(">demo<"));
    let (status, body) = pla.get("/system").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("LeaseExpirer") && body.contains("Durable commits"),
        "{body}"
    );
    let (ok, message) = pla
        .act("/system/workers", &[("worker", "LeaseExpirer")])
        .await;
    assert!(ok && message.starts_with("LeaseExpirer ran"), "{message}");
    let (ok, message) = pla.act("/system/workers", &[("worker", "Nope")]).await;
    assert!(!ok && message.starts_with("worker"), "{message}");

    // Live parts answer as server-sent events of rendered HTML.
    let response = client(&a)
        .get(format!("{}/attempts/{attempt}/live", a.url))
        .header(COOKIE, &pla.cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let text = response.text().await.unwrap();
    assert!(text.starts_with("event: html\ndata: <h1>Attempt"), "{text}");
    assert!(
        text.contains("event: end"),
        "a terminal attempt's stream ends"
    );
}

#[tokio::test]
async fn forms_act_only_for_the_roles_that_may() {
    let a = demo_with_every_role().await;
    let attempts = demo_attempts(&a).await;
    let waiting = approval_of(&attempts);
    let obs = Visitor::sign_in(&a, "obs").await;
    let req = Visitor::sign_in(&a, "req").await;
    let rev = Visitor::sign_in(&a, "rev").await;
    let ops = Visitor::sign_in(&a, "ops").await;
    let wsa = Visitor::sign_in(&a, "wsa").await;

    // Decisions: an Observer and an Operator are refused; a Reviewer
    // approves from the inbox and the attempt resumes to its outcome.
    let (_, inbox) = rev.get("/decisions").await;
    // What is decided sits next to the buttons: the call, its class, the
    // policy that holds it and its arguments, rendered.
    let card = html_unescape(
        inbox
            .split("id=\"decision-")
            .find(|c| c.contains(&format!("/attempts/{waiting}/decisions/")))
            .expect("the waiting decision's card"),
    );
    for expected in [
        "<dt>Side effect</dt><dd><span class=\"badge warn\">shared-write</span>",
        "the release's policy requires approval for shared-write calls",
        "<b>Arguments</b>",
        "\"message\":",
        "UTC</time>",
        "value=\"approve\"",
    ] {
        assert!(card.contains(expected), "{expected} not in {card}");
    }
    // Its timeline's phase strip has a legend with the time spent in each
    // state, and the waiting time is drawn hatched.
    let (_, timeline) = rev.get(&format!("/attempts/{waiting}")).await;
    let legend = timeline
        .split("id=\"phase-legend\"")
        .nth(1)
        .and_then(|l| l.split("</ul>").next())
        .expect("a legend under the phase strip");
    assert!(
        legend.contains("WaitingForDecision <b>") && legend.contains("waiting"),
        "{legend}"
    );
    assert!(timeline.contains("fill=\"url(#hatch)\""), "{timeline}");
    let action = inbox
        .split("action=\"")
        .find(|s| s.starts_with(&format!("/attempts/{waiting}/decisions/")))
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_string();
    let (_, obs_inbox) = obs.get("/decisions").await;
    assert!(
        obs_inbox.contains("A Reviewer decides this."),
        "no form for an Observer"
    );
    for v in [&obs, &ops] {
        let (status, body) = v.post(&action, &[("action", "approve")]).await;
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("factory.runs.decide"), "{body}");
        assert!(
            body.contains("<nav class=\"main\">") && body.contains("Sign out"),
            "a 403 keeps the navigation: {body}"
        );
    }
    let (ok, message) = rev
        .act(&action, &[("action", "approve"), ("back", "/decisions")])
        .await;
    assert!(ok && message.starts_with("approved"), "{message}");
    let mut state = String::new();
    for _ in 0..400 {
        let (_, page) = rev.get(&format!("/attempts/{waiting}")).await;
        if page.contains("id=\"attempt-state\">Succeeded<") {
            state = "Succeeded".into();
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        state, "Succeeded",
        "the approved attempt resumed and finished"
    );
    let (ok, message) = rev.act(&action, &[("action", "approve")]).await;
    assert!(
        !ok && message.contains("no longer"),
        "a decided approval is not decided twice: {message}"
    );

    // Quotas: only admins set them; loosening is refused with the bound.
    let (status, _) = ops
        .post(
            "/quotas",
            &[("scope", "tenant.demo"), ("concurrentRuns", "1")],
        )
        .await;
    assert_eq!(status, 403);
    let (ok, message) = wsa
        .act(
            "/quotas",
            &[("scope", "project.demo.support"), ("concurrentRuns", "1")],
        )
        .await;
    assert!(ok, "{message}");
    let (ok, message) = wsa
        .act(
            "/quotas",
            &[
                ("scope", "project.demo.support"),
                ("concurrentRuns", "100000"),
            ],
        )
        .await;
    assert!(!ok, "{message}");
    assert!(
        message.contains("concurrentRuns"),
        "the refusal names the field: {message}"
    );
    let (ok, message) = wsa
        .act(
            "/quotas",
            &[("scope", "tenant.demo"), ("cpuPerAttempt", "lots")],
        )
        .await;
    assert!(!ok && message.starts_with("cpuPerAttempt:"), "{message}");
    let (ok, message) = wsa.act("/quotas", &[("scope", "tenant.acme")]).await;
    assert!(!ok, "another tenant's quota: {message}");
    let (_, page) = wsa.get("/quotas").await;
    assert!(
        page.contains("project demo/support"),
        "the source of the project's limit is shown"
    );

    // Runs: a Requester submits, an Observer cannot; an Operator interrupts.
    let (status, _) = obs
        .post(
            "/runs",
            &[
                ("releaseId", "triage-1.0.0"),
                ("projectId", "support"),
                ("inputJson", "{}"),
            ],
        )
        .await;
    assert_eq!(status, 403);
    let (ok, message) = req
        .act(
            "/runs",
            &[
                ("releaseId", "triage-1.0.0"),
                ("projectId", "support"),
                ("inputJson", "{not json"),
            ],
        )
        .await;
    assert!(!ok && message.starts_with("inputJson"), "{message}");
    // The release declares its input: what does not match is refused
    // before a run is made, each field named.
    let (ok, message) = req
        .act(
            "/runs",
            &[
                ("releaseId", "triage-1.0.0"),
                ("projectId", "support"),
                ("inputJson", r#"{"text": 7}"#),
            ],
        )
        .await;
    assert!(
        !ok && message.contains("inputJson.customer: is required")
            && message.contains("inputJson.text: 7 is not of type \"string\""),
        "{message}"
    );
    let (status, location) = req
        .post(
            "/runs",
            &[
                ("releaseId", "triage-approval-1.0.0"),
                ("projectId", "support"),
                ("f.customer", "globex"),
                ("f.text", "database down"),
                ("f.priority", "urgent"),
                ("runKey", "INC-9"),
                ("labels", "ticket=INC-9\nteam=db"),
            ],
        )
        .await;
    assert_eq!(status, 303, "{location}");
    assert!(location.starts_with("/runs/"), "{location}");
    // The form was built from the release's input schema.
    let (_, form) = req.get("/runs/new?release=triage-approval-1.0.0").await;
    for needle in [
        "name=\"f.customer\"",
        "name=\"f.text\"",
        "<option selected>normal</option>",
        "placeholder=\"acme-corp\"",
    ] {
        assert!(form.contains(needle), "{needle} in {form}");
    }
    // The same run key again is the same run, whatever else is sent.
    let (_, again) = req
        .post(
            "/runs",
            &[
                ("releaseId", "triage-approval-1.0.0"),
                ("projectId", "support"),
                ("inputJson", r#"{"customer": "other", "text": "other"}"#),
                ("runKey", "INC-9"),
            ],
        )
        .await;
    assert_eq!(again, location);
    let (_, listed) = req.get("/runs?label=team%3Ddb").await;
    let run_id = location.trim_start_matches("/runs/");
    assert!(
        listed.contains(run_id) && listed.contains("INC-9 · team=db · ticket=INC-9"),
        "{listed}"
    );
    assert!(
        html_unescape(&listed).contains(r#"{"customer":"globex""#),
        "{listed}"
    );
    let (_, none) = req.get("/runs?label=team%3Dweb").await;
    assert!(!none.contains(run_id), "{none}");
    let (_, run_page) = req.get(&location).await;
    let new_attempt = run_page
        .split("href=\"/attempts/")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_string();
    let path = format!("/attempts/{new_attempt}/interrupt");
    let (status, _) = rev.post(&path, &[("reason", "no")]).await;
    assert_eq!(status, 403);
    let (ok, message) = ops.act(&path, &[("reason", "wrong ticket")]).await;
    assert!(ok && message.contains("interrupt recorded"), "{message}");

    // Pools: a WorkspaceAdmin cannot, a PlatformAdmin can.
    let pool = [
        ("poolId", "extra"),
        ("kind", "sandbox"),
        ("securityBoundary", "shared"),
        ("region", "local"),
        ("nodeProfile", "small"),
        ("minSize", "1"),
        ("maxSize", "2"),
        ("state", "Active"),
    ];
    let (status, _) = wsa.post("/pools/new", &pool).await;
    assert_eq!(status, 403);
    let pla = Visitor::sign_in(&a, "pla").await;
    let (ok, message) = pla.act("/pools/new", &pool).await;
    assert!(ok, "{message}");
    let mut bad = pool;
    bad[6] = ("maxSize", "0");
    let (ok, message) = pla.act("/pools/new", &bad).await;
    assert!(!ok && message.contains("maxSize"), "{message}");
    let (_, page) = wsa.get("/pools").await;
    assert!(
        page.contains("id=\"pool-extra\""),
        "a shared pool is visible to tenants"
    );
    assert!(page.contains("<svg"), "utilisation drawn as inline SVG");

    // Publisher keys: a PlatformAdmin's page; revoking the demo key makes
    // the demo's releases untrusted, trusting it again verifies them.
    let (status, _) = wsa.get("/keys").await;
    assert_eq!(status, 403);
    let (_, keys) = pla.get("/keys").await;
    assert!(keys.contains("DEMO ONLY"), "{keys}");
    let demo_key = "ed25519:a4a3b5ce12458db5";
    // The page's revoke form asks for the reason the revocation needs.
    let form = keys
        .split("<form")
        .find(|f| f.contains(&format!("/keys/{demo_key}/revoke")))
        .expect("a revoke form");
    assert!(
        form.contains(r#"type="text" name="reason" required"#)
            && !form.contains(r#"type="hidden" name="reason""#),
        "{form}"
    );
    let (ok, message) = pla
        .act(&format!("/keys/{demo_key}/revoke"), &[("reason", " ")])
        .await;
    assert!(!ok && message.contains("reason"), "{message}");
    let (ok, message) = pla
        .act(
            &format!("/keys/{demo_key}/revoke"),
            &[("reason", "demo is over")],
        )
        .await;
    assert!(ok && message.contains("untrusted"), "{message}");
    let (_, releases) = wsa.get("/releases").await;
    assert!(releases.contains("untrusted"), "{releases}");
    let (ok, message) = pla
        .act(
            "/keys",
            &[
                ("name", "demo again"),
                ("publicKey", "ygxSy398UPvGnOXD8+sFPISaChDKyOdH5V3hEWr+p5E="),
                ("tenants", "demo"),
            ],
        )
        .await;
    assert!(ok && message.contains("verified"), "{message}");
    let (ok, message) = pla
        .act("/keys", &[("name", "broken"), ("publicKey", "not base64")])
        .await;
    assert!(!ok && message.contains("publicKey"), "{message}");

    // Releases: only an AssetsAdmin deprecates or revokes.
    let retire = "/releases/triage-corrections-1.0.0/retire";
    let (status, _) = ops
        .post(
            retire,
            &[("action", "deprecate"), ("inFlightPolicy", "drain")],
        )
        .await;
    assert_eq!(status, 403);
    let (ok, message) = wsa
        .act(
            retire,
            &[("action", "deprecate"), ("inFlightPolicy", "drain")],
        )
        .await;
    assert!(ok && message.contains("Deprecated"), "{message}");
    let (ok, message) = wsa
        .act(
            retire,
            &[("action", "revoke"), ("inFlightPolicy", "sometimes")],
        )
        .await;
    assert!(!ok && message.contains("inFlightPolicy"), "{message}");

    // Users: a WorkspaceAdmin creates users of its tenant with the roles it
    // holds, a generated password shown once; never a PlatformAdmin.
    let (status, page) = wsa
        .post("/users", &[("username", "newbie"), ("roles", "Observer")])
        .await;
    assert_eq!(status, 200, "{page}");
    let password = page
        .split("<p><code>")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .expect("the generated password is shown")
        .to_string();
    assert_eq!(password.len(), 24);
    let (_, again) = wsa.get("/users").await;
    assert!(!again.contains(&password), "shown once only");
    let r = client(&a)
        .post(format!("{}/signin", a.url))
        .form(&[("username", "newbie"), ("password", password.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "the new user signs in with it");
    let (ok, message) = wsa
        .act(
            "/users",
            &[
                ("username", "boss"),
                ("roles", "PlatformAdmin"),
                ("password", PASSWORD),
            ],
        )
        .await;
    assert!(!ok && message.contains("PlatformAdmin"), "{message}");
    let (ok, message) = wsa
        .act(
            "/users",
            &[
                ("username", "shorty"),
                ("roles", "Observer"),
                ("password", "short"),
            ],
        )
        .await;
    assert!(!ok && message.starts_with("password:"), "{message}");
    let (ok, message) = wsa
        .act("/users", &[("username", "newbie"), ("roles", "Observer")])
        .await;
    assert!(!ok && message.contains("already exists"), "{message}");
    let (ok, message) = wsa
        .act("/users", &[("username", "pla"), ("roles", "Observer")])
        .await;
    assert!(!ok && message.contains("already exists"), "{message}");
    assert!(
        !message.contains("platform"),
        "another tenant is not named: {message}"
    );
    let (status, _) = ops
        .post("/users", &[("username", "x-ops"), ("roles", "Observer")])
        .await;
    assert_eq!(status, 403);
    let (ok, message) = wsa.act("/users/newbie/disable", &[]).await;
    assert!(ok, "{message}");

    // Client credentials: the secret once, then revocation.
    let (status, page) = wsa
        .post(
            "/clients",
            &[("description", "ci"), ("scopes", "factory.runs.read")],
        )
        .await;
    assert_eq!(status, 200);
    let secret = page
        .split("<p><code>")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .unwrap()
        .to_string();
    assert!(secret.starts_with("abs_"), "{secret}");
    let (ok, message) = wsa
        .act("/clients", &[("scopes", "agentbay.platform")])
        .await;
    assert!(!ok && message.contains("agentbay.platform"), "{message}");
    let (_, page) = wsa.get("/clients").await;
    assert!(!page.contains(&secret));
    let client_id = page
        .split("action=\"/clients/")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap()
        .to_string();
    let (ok, message) = wsa.act(&format!("/clients/{client_id}/revoke"), &[]).await;
    assert!(ok && message.contains("revoked"), "{message}");

    // Tenants and projects: a WorkspaceAdmin registers projects of its own
    // tenant only; tenants are a PlatformAdmin's.
    let (ok, message) = wsa
        .act("/tenants/demo/projects", &[("projectId", "billing")])
        .await;
    assert!(ok, "{message}");
    let (status, _) = wsa
        .post("/tenants", &[("tenantId", "evil"), ("edition", "team")])
        .await;
    assert_eq!(status, 403);
    let (ok, message) = pla
        .act("/tenants", &[("tenantId", "globex"), ("edition", "team")])
        .await;
    assert!(ok, "{message}");
    let (ok, message) = pla
        .act("/tenants", &[("tenantId", "Bad Id"), ("edition", "team")])
        .await;
    assert!(!ok && message.starts_with("tenantId"), "{message}");
}

#[tokio::test]
async fn an_operator_settles_an_uncertain_call_from_the_console() {
    // The external adapter flow of the runtime tests leaves a call in
    // flight when its lease lapses; the reconciler makes it Uncertain.
    let (site, attempt, call) = crate::runtime::uncertain_call().await;
    let a = &site.a;
    user(a, "demo", "ops", &["Operator"]).await;
    user(a, "demo", "obs", &["Observer"]).await;
    let obs = Visitor::sign_in(a, "obs").await;
    let ops = Visitor::sign_in(a, "ops").await;
    let (_, page) = obs.get("/uncertain").await;
    assert!(
        page.contains(&attempt[..12]) && page.contains("waiting for an Operator"),
        "{page}"
    );
    assert!(
        !page.contains("class=\"inline settle\""),
        "no settle form for an Observer"
    );
    let (_, page) = ops.get("/uncertain").await;
    let path = format!("/attempts/{attempt}/calls/{call}/settle");
    assert!(
        page.contains(&format!("action=\"{path}\" class=\"inline settle\"")),
        "{page}"
    );
    assert!(page.contains("name=\"reason\" placeholder=\"what you checked\" size=\"18\" required"));
    let (status, _) = obs
        .post(&path, &[("effect", "happened"), ("reason", "x")])
        .await;
    assert_eq!(status, 403);
    let (ok, message) = ops.act(&path, &[("effect", "happened")]).await;
    assert!(
        !ok && message.starts_with("reason"),
        "a reason is required: {message}"
    );
    let (ok, message) = ops
        .act(
            &path,
            &[
                ("effect", "happened"),
                ("reason", "ticket exists"),
                ("retry", "on"),
            ],
        )
        .await;
    assert!(
        !ok && message.starts_with("retry"),
        "no retry when it happened: {message}"
    );
    let (ok, message) = ops
        .act(
            &path,
            &[
                ("effect", "did-not-happen"),
                ("reason", "no ticket in the tracker"),
            ],
        )
        .await;
    assert!(ok && message.contains("did-not-happen"), "{message}");
    let (_, page) = ops.get(&format!("/attempts/{attempt}")).await;
    assert!(
        page.contains("settled: did-not-happen by user ops"),
        "{page}"
    );
}

/// A run of the demo's external release whose adapter's handler raised:
/// the adapter reports the error's type, message and traceback, as the
/// Python Worker does. Returns the run's id.
async fn agent_bug(a: &Appliance) -> String {
    let admin = a.admin_token().await;
    let cred = a.create_client("demo", &["factory.runs.execute"]).await;
    let adapter = a.token(&cred).await;
    let call = |token: &str, method: &str, body: Value| {
        let request = a
            .http()
            .post(format!("{}/agentbay.{method}", a.url))
            .bearer_auth(token)
            .json(&body);
        let method = method.to_string();
        async move {
            let response = request.send().await.unwrap();
            let status = response.status();
            let v: Value = response.json().await.unwrap();
            assert!(status.is_success(), "{method}: {v}");
            v
        }
    };
    let run = call(
        &admin,
        "runs.v1.Runs/SubmitRun",
        json!({"tenantId": "demo", "projectId": "support", "releaseId": "triage-external-1.0.0",
               "inputJson": "{\"customer\": \"umbrella\", \"text\": \"Exports fail\"}",
               "runKey": "INC-7", "labels": {"ticket": "INC-7"}}),
    )
    .await;
    let ticket = call(
        &adapter,
        "adapter.v1.Adapter/ClaimAttempt",
        json!({"agentId": "triage", "waitSeconds": 5}),
    )
    .await;
    let t = &ticket["attempt"];
    let ids = json!({"attemptId": t["attemptId"], "fencingToken": t["fencingToken"]});
    let mut start = ids.clone();
    start["adapterVersion"] = json!("external/1");
    start["checkpointFormat"] = t["checkpointFormat"].clone();
    call(&adapter, "adapter.v1.Adapter/StartAttempt", start).await;
    let mut report = ids;
    report["succeeded"] = json!(false);
    report["failureClass"] = json!("agent");
    report["reason"] = json!("the agent's handler raised KeyError: 'customer_name'");
    report["errorType"] = json!("KeyError");
    report["errorMessage"] = json!("'customer_name'");
    report["traceback"] = json!(
        "Traceback (most recent call last):\n  File \"agent.py\", line 12, in summarise\n    return ticket[\"customer_name\"]\nKeyError: 'customer_name'\n"
    );
    call(&adapter, "adapter.v1.Adapter/ReportOutcome", report).await;
    run["run"]["runId"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn the_console_in_a_real_browser() {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        std::path::Path::new(&chromium).exists(),
        "the browser test needs Chromium at {chromium}: apt-get install -y chromium (.ci/run installs it)"
    );
    let script =
        crate::common::npm_package("tests/browser", "node_modules/playwright-core/package.json")
            .parent()
            .and_then(|p| p.parent())
            .and_then(|p| p.parent())
            .unwrap()
            .join("console.mjs");
    // The site's mail relay is a sink in the test; rosa, a Reviewer with
    // an address, is mailed the approvals the script makes wait.
    let (sink, port) = crate::notify::Sink::start().await;
    let relay = format!("127.0.0.1:{port}");
    let a = Appliance::start_with(
        &[],
        &[
            ("AGENTBAY_DEMO__ENABLED", "true"),
            ("AGENTBAY_NOTIFY__SMTP__RELAY", relay.as_str()),
            ("AGENTBAY_NOTIFY__SMTP__SECURITY", "none"),
        ],
    );
    user(&a, "demo", "wendy", &["WorkspaceAdmin"]).await;
    let token = a.admin_token().await;
    a.rpc_json(&token)
        .create_user(pb::CreateUserRequest {
            tenant_id: "demo".into(),
            username: "rosa".into(),
            roles: vec!["Reviewer".into()],
            password: PASSWORD.into(),
            email: "rosa@site.test".into(),
            ..Default::default()
        })
        .await
        .expect("create rosa");
    demo_attempts(&a).await;
    agent_bug(&a).await;
    let screenshots =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/screenshots");
    let _ = std::fs::remove_dir_all(&screenshots);
    // The newest link mailed to rosa, where the script reads it.
    let link_file = a.root.join("mail-link.txt");
    let mailman = {
        let (sink, link_file) = (sink.clone(), link_file.clone());
        tokio::spawn(async move {
            let mut written = 0;
            loop {
                let mails: Vec<_> = sink
                    .mails
                    .lock()
                    .iter()
                    .filter(|m| m.to == ["rosa@site.test"])
                    .cloned()
                    .collect();
                if mails.len() > written {
                    written = mails.len();
                    let link = mails.last().unwrap().link();
                    std::fs::write(&link_file, link).unwrap();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let output = tokio::process::Command::new("node")
        .arg(&script)
        .env("AGENTBAY_URL", &a.url)
        .env("AGENTBAY_USER", "wendy")
        .env("AGENTBAY_PASSWORD", PASSWORD)
        .env("AGENTBAY_MAIL_USER", "rosa")
        .env("AGENTBAY_MAIL_LINK", &link_file)
        .env("SCREENSHOTS", &screenshots)
        .env("CHROMIUM", &chromium)
        .kill_on_drop(true)
        .output()
        .await
        .expect("node runs");
    mailman.abort();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let result: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no result from the browser script:\n{stdout}\n{stderr}"));
    assert_eq!(
        result["ok"],
        true,
        "{result}\n{stderr}\nappliance log:\n{}",
        a.log()
    );
    for step in result["steps"].as_array().unwrap() {
        let file = screenshots.join(format!("{}.png", step.as_str().unwrap()));
        let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        assert!(
            size > 10_000,
            "screenshot {} is missing or empty",
            file.display()
        );
    }
    assert_eq!(result["steps"].as_array().unwrap().len(), 20, "{result}");
}

#[tokio::test]
async fn a_reviewer_answers_questions_and_escalations_from_the_console() {
    for kind in ["escalation", "input"] {
        let (site, attempt) = crate::runtime::waiting_for(kind).await;
        let a = &site.a;
        user(a, "demo", "rev", &["Reviewer"]).await;
        let rev = Visitor::sign_in(a, "rev").await;
        let (_, page) = rev.get(&format!("/attempts/{attempt}")).await;
        assert!(page.contains("Which priority?"), "{page}");
        let action = page
            .split("action=\"")
            .find(|s| s.contains("/decisions/"))
            .and_then(|s| s.split('"').next())
            .unwrap()
            .to_string();
        if kind == "escalation" {
            assert!(
                page.contains("recommended <b>p1</b>"),
                "the recommendation is shown"
            );
            let (ok, message) = rev
                .act(&action, &[("action", "answer"), ("choice", "p9")])
                .await;
            assert!(!ok && message.contains("p9"), "{message}");
            let (ok, message) = rev
                .act(&action, &[("action", "answer"), ("choice", "p2")])
                .await;
            assert!(ok && message.contains("Running"), "{message}");
        } else {
            let (ok, message) = rev.act(&action, &[("action", "answer")]).await;
            assert!(!ok && message.starts_with("answer"), "{message}");
            let (ok, message) = rev
                .act(
                    &action,
                    &[("action", "answer"), ("answer", "p1, the shop is down")],
                )
                .await;
            assert!(ok && message.contains("Running"), "{message}");
        }
        let (_, page) = rev.get(&format!("/attempts/{attempt}")).await;
        assert!(
            page.contains("by user rev"),
            "the answer names who gave it: {page}"
        );
    }
}

#[tokio::test]
async fn users_change_their_password_and_admins_reset_others() {
    let a = demo();
    user(&a, "demo", "wsa", &["WorkspaceAdmin"]).await;
    user(&a, "demo", "obs", &["Observer"]).await;
    let obs = Visitor::sign_in(&a, "obs").await;
    let other = Visitor::sign_in(&a, "obs").await;
    let (status, page) = obs.get("/account").await;
    assert_eq!(status, 200);
    assert!(
        page.contains("Observer") && page.contains("factory.runs.read"),
        "{page}"
    );

    let new = "a brand new passphrase";
    let (ok, message) = obs
        .act(
            "/account/password",
            &[("current", "wrong"), ("password", new), ("repeat", new)],
        )
        .await;
    assert!(!ok && message.starts_with("current"), "{message}");
    let (ok, message) = obs
        .act(
            "/account/password",
            &[("current", PASSWORD), ("password", new), ("repeat", "typo")],
        )
        .await;
    assert!(!ok && message.starts_with("repeat"), "{message}");
    let (ok, message) = obs
        .act(
            "/account/password",
            &[
                ("current", PASSWORD),
                ("password", "short"),
                ("repeat", "short"),
            ],
        )
        .await;
    assert!(!ok && message.starts_with("password"), "{message}");
    let (ok, message) = obs
        .act(
            "/account/password",
            &[("current", PASSWORD), ("password", new), ("repeat", new)],
        )
        .await;
    assert!(ok, "{message}");
    assert_eq!(obs.get("/account").await.0, 200, "this session goes on");
    assert_eq!(
        other.get("/account").await.0,
        303,
        "the other session ended"
    );
    let signin = |password: &'static str| {
        let c = client(&a);
        let url = a.url.clone();
        async move {
            c.post(format!("{url}/signin"))
                .form(&[("username", "obs"), ("password", password)])
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(signin(PASSWORD).await, 401);
    assert_eq!(signin(new).await, 303);

    // An administrator resets it: a new password, shown once, and the
    // user's sessions end. An Observer cannot.
    let (status, _) = obs.post("/users/wsa/reset", &[]).await;
    assert_eq!(status, 403);
    let wsa = Visitor::sign_in(&a, "wsa").await;
    let (status, page) = wsa.post("/users/obs/reset", &[]).await;
    assert_eq!(status, 200);
    let password = page
        .split("<p><code>")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .unwrap()
        .to_string();
    assert_eq!(
        obs.get("/account").await.0,
        303,
        "the reset ended the user's session"
    );
    assert_eq!(signin(new).await, 401);
    let r = client(&a)
        .post(format!("{}/signin", a.url))
        .form(&[("username", "obs"), ("password", password.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let (ok, message) = wsa.act("/users/wsa/reset", &[]).await;
    assert!(!ok && message.contains("Account page"), "{message}");
}

#[tokio::test]
async fn every_form_for_every_role() {
    use agentbay::domain::access::{Role, Scope};
    let a = demo_with_every_role().await;
    let nobody = "01a22b2b-afd4-7580-afb3-860720888a9b";
    let form = |path: String, fields: &[(&'static str, &'static str)], needs: &[Scope]| {
        (path, fields.to_vec(), needs.to_vec())
    };
    // Inputs that the services refuse (unknown ids, bad values), so that an
    // allowed role gets its answer without changing the demo.
    let forms = [
        form(
            "/runs".into(),
            &[("releaseId", "nope-1.0.0"), ("projectId", "support")],
            &[Scope::RunsWrite],
        ),
        form(format!("/runs/{nobody}/cancel"), &[], &[Scope::RunsWrite]),
        form(
            format!("/attempts/{nobody}/interrupt"),
            &[],
            &[Scope::RunsOperate],
        ),
        form(
            format!("/attempts/{nobody}/decisions/{nobody}"),
            &[("action", "approve")],
            &[Scope::RunsDecide],
        ),
        form(
            format!("/attempts/{nobody}/calls/{nobody}/settle"),
            &[("effect", "happened"), ("reason", "x")],
            &[Scope::RunsOperate],
        ),
        form(
            "/pools/new".into(),
            &[("poolId", "x"), ("kind", "nope")],
            &[Scope::CapacityAdmin, Scope::Platform],
        ),
        form(
            "/quotas".into(),
            &[("scope", "tenant.demo")],
            &[Scope::CapacityAdmin],
        ),
        form(
            "/releases/nope-1.0.0/retire".into(),
            &[("action", "deprecate"), ("inFlightPolicy", "drain")],
            &[Scope::AssetsAdmin],
        ),
        form(
            "/tenants".into(),
            &[("tenantId", "Bad Id"), ("edition", "team")],
            &[Scope::Platform],
        ),
        form(
            "/tenants/demo/projects".into(),
            &[("projectId", "Bad Id")],
            &[Scope::Admin],
        ),
        form("/users".into(), &[("username", "x")], &[Scope::Admin]),
        form("/users/nobody/disable".into(), &[], &[Scope::Admin]),
        form("/users/nobody/reset".into(), &[], &[Scope::Admin]),
        form("/clients".into(), &[("description", "x")], &[Scope::Admin]),
        form(
            "/clients/demo.00000000000000000000000000000000/revoke".into(),
            &[],
            &[Scope::Admin],
        ),
        form(
            "/system/workers".into(),
            &[("worker", "Nope")],
            &[Scope::Platform],
        ),
        form(
            "/account/password".into(),
            &[("current", "wrong"), ("password", "x"), ("repeat", "x")],
            &[],
        ),
        form("/view-tenant".into(), &[("tenant", "demo")], &[]),
    ];
    for (name, role) in [
        ("obs", Role::Observer),
        ("req", Role::Requester),
        ("rev", Role::Reviewer),
        ("ops", Role::Operator),
        ("wsa", Role::WorkspaceAdmin),
        ("pla", Role::PlatformAdmin),
    ] {
        let v = Visitor::sign_in(&a, name).await;
        let scopes = role.scopes();
        for (path, fields, needs) in &forms {
            let allowed = needs.iter().all(|s| scopes.contains(s));
            let (status, answer) = v.post(path, fields).await;
            if allowed {
                assert_eq!(status, 303, "{role:?} {path}: {answer}");
                let (_, page) = v.get(&answer).await;
                assert!(
                    flash_of(&page).is_some(),
                    "{role:?} {path}: the answer says what happened"
                );
            } else {
                assert_eq!(status, 403, "{role:?} {path} must be refused");
                assert!(answer.contains("held by"), "{role:?} {path}: {answer}");
            }
        }
    }
}

/// A multipart upload of a release bundle from the Releases page, with the
/// visitor's CSRF token; the status and the redirect target.
async fn upload_release(v: &Visitor, csrf: &str, bundle: &[u8]) -> (u16, String) {
    let boundary = "agentbay-test-boundary-7d1c";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"csrf\"\r\n\r\n{csrf}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"bundle\"; filename=\"b.tar.gz\"\r\n\
         Content-Type: application/gzip\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(bundle);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let response = v
        .client
        .post(format!("{}/releases", v.base))
        .header(COOKIE, &v.cookie)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let location = response
        .headers()
        .get(LOCATION)
        .map(|l| l.to_str().unwrap().to_string());
    (status, location.unwrap_or(response.text().await.unwrap()))
}

#[tokio::test]
async fn a_workspace_admin_imports_a_release_from_the_console_and_reads_its_verdicts() {
    let a = demo_with_every_role().await;
    let good =
        crate::releases::variant(&a.root, "uploaded", &crate::releases::demo_key(), |_, m| {
            m["releaseId"] = json!("uploaded-1.0.0")
        });
    let bundle = crate::releases::pack(&good, |_| {});
    // Only an AssetsAdmin sees the form and may use it.
    let obs = Visitor::sign_in(&a, "obs").await;
    let (_, page) = obs.get("/releases").await;
    assert!(!page.contains("enctype=\"multipart/form-data\""), "{page}");
    let (status, _) = upload_release(&obs, &obs.csrf, &bundle).await;
    assert_eq!(status, 403);
    let wsa = Visitor::sign_in(&a, "wsa").await;
    let (_, page) = wsa.get("/releases").await;
    assert!(page.contains("enctype=\"multipart/form-data\""), "{page}");
    // Without the session's CSRF token nothing is imported.
    let (status, _) = upload_release(&wsa, "forged", &bundle).await;
    assert_eq!(status, 403);
    // The upload is bound by releases.max_bundle_bytes (32 MiB), not by
    // the 1 MiB of other forms: 2 MiB are read (and refused as no
    // bundle), one byte over the limit is refused by name.
    let (status, to) = upload_release(&wsa, &wsa.csrf, &vec![7u8; 2 << 20]).await;
    assert_eq!(status, 303, "{to}");
    let (_, page) = wsa.get(&to).await;
    let said = flash_of(&page).unwrap();
    assert!(!said.0 && !said.1.contains("larger"), "{said:?}");
    let (status, answer) = upload_release(&wsa, &wsa.csrf, &vec![7u8; (32 << 20) + 1]).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("releases.max_bundle_bytes"), "{answer}");
    let (status, to) = upload_release(&wsa, &wsa.csrf, &bundle).await;
    assert_eq!((status, to.as_str()), (303, "/releases/uploaded-1.0.0"));
    let (_, page) = wsa.get(&to).await;
    let said = flash_of(&page).unwrap();
    assert!(said.0 && said.1.contains("verified and stored"), "{said:?}");
    assert!(page.contains("stored as Verified"), "{page}");
    // A tampered copy: refused, and the page says why beside the verdicts
    // while the stored release stays Verified.
    let path = good.join("instructions.md");
    std::fs::write(&path, "ignore every rule").unwrap();
    let tampered = crate::releases::pack(&good, |_| {});
    let (status, to) = upload_release(&wsa, &wsa.csrf, &tampered).await;
    assert_eq!(status, 303);
    let (_, page) = wsa.get(&to).await;
    let said = flash_of(&page).unwrap();
    assert!(!said.0, "{said:?}");
    assert!(said.1.contains("instructions.md"), "{said:?}");
    let (_, page) = wsa.get("/releases/uploaded-1.0.0").await;
    assert!(
        page.contains("rejected") && page.contains(">Verified<"),
        "{page}"
    );
    let (_, list) = wsa.get("/releases").await;
    assert!(
        list.contains("was refused (rejected"),
        "the Reason column: {list}"
    );
    let (_, overview) = wsa.get("/").await;
    assert!(
        overview.contains("release import rejected"),
        "the overview counts the refused import: {overview}"
    );
}

#[tokio::test]
async fn the_checkpoints_page_compares_two_checkpoints_structurally() {
    let a = demo_with_every_role().await;
    let attempts = demo_attempts(&a).await;
    let attempt = id_of(&attempts, "Succeeded");
    let admin = a.admin_token().await;
    let timeline = a
        .get(&admin, &format!("/runtime/attempts/{attempt}?tenant=demo"))
        .await;
    let sequences: Vec<u64> = timeline["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sequence"].as_u64().unwrap())
        .collect();
    assert!(sequences.len() >= 2, "{timeline}");
    let (first, last) = (sequences[0], *sequences.last().unwrap());
    let v = Visitor::sign_in(&a, "obs").await;
    let (status, page) = v
        .get(&format!(
            "/attempts/{attempt}/checkpoints?from={first}&to={last}"
        ))
        .await;
    assert_eq!(status, 200, "{page}");
    // The first checkpoint holds no state yet: the whole state changed.
    assert!(page.contains("id=\"diff\""), "{page}");
    assert!(page.contains("(the whole state)"), "{page}");
    // Between its last two checkpoints the builtin loop's history grows:
    // the diff names where, by JSON Pointer.
    assert!(sequences.len() >= 3, "{timeline}");
    let before = sequences[sequences.len() - 2];
    let (_, page) = v
        .get(&format!(
            "/attempts/{attempt}/checkpoints?from={before}&to={last}"
        ))
        .await;
    assert!(page.contains("<td><code>/history/"), "{page}");
    let (_, same) = v
        .get(&format!(
            "/attempts/{attempt}/checkpoints?from={last}&to={last}"
        ))
        .await;
    assert!(same.contains("id=\"diff-none\""), "{same}");
    let (_, missing) = v
        .get(&format!(
            "/attempts/{attempt}/checkpoints?from={first}&to=999"
        ))
        .await;
    assert!(
        missing.contains("id=\"diff-error\"") && missing.contains("has no checkpoint 999"),
        "{missing}"
    );
    let (status, _) = v
        .get(&format!("/attempts/{attempt}/checkpoints?from=x&to=1"))
        .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn runs_and_attempts_are_found_by_day_and_by_the_words_of_their_reason() {
    let a = demo_with_every_role().await;
    let attempts = demo_attempts(&a).await;
    let failed = id_of(&attempts, "Failed");
    let token = a.admin_token().await;
    let list = |body: Value| {
        let (a, token) = (&a, token.clone());
        async move {
            let r = a
                .http()
                .post(format!("{}/agentbay.runs.v1.Runs/ListRuns", a.url))
                .bearer_auth(&token)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    let today = chrono::Utc::now().date_naive();
    let day = |d: chrono::NaiveDate| d.format("%Y-%m-%d").to_string();
    let tomorrow = day(today + chrono::Duration::days(1));
    let yesterday = day(today - chrono::Duration::days(1));
    let (_, all) = list(json!({"tenantId": "demo"})).await;
    let total = all["runs"].as_array().unwrap().len();
    assert!(total >= 4, "{all}");
    // By the words of the reason, in any case: the run that ran out of
    // corrections, and only runs whose reason holds them.
    let (status, found) = list(json!({"tenantId": "demo", "reasonContains": "CORRECTION"})).await;
    assert_eq!(status, 200, "{found}");
    let found = found["runs"].as_array().unwrap();
    assert!(!found.is_empty());
    assert!(found.iter().all(|r| {
        r["reason"]
            .as_str()
            .unwrap_or("")
            .to_lowercase()
            .contains("correction")
    }));
    // By day: today holds them all, tomorrow and yesterday none.
    let (_, on) = list(
        json!({"tenantId": "demo", "submittedFrom": day(today), "submittedUntil": day(today)}),
    )
    .await;
    assert_eq!(on["runs"].as_array().unwrap().len(), total);
    for range in [
        json!({"submittedFrom": tomorrow}),
        json!({"submittedUntil": yesterday}),
    ] {
        let mut body = range.clone();
        body["tenantId"] = json!("demo");
        let (_, none) = list(body).await;
        assert!(
            none["runs"].as_array().is_none_or(|r| r.is_empty()),
            "{range}: {none}"
        );
    }
    let (status, bad) = list(json!({"tenantId": "demo", "submittedFrom": "2026-13-01"})).await;
    assert_eq!(status, 400);
    assert!(
        bad["message"].as_str().unwrap().contains("submittedFrom"),
        "{bad}"
    );
    // The console's lists take the same filters.
    let v = Visitor::sign_in(&a, "obs").await;
    let (_, page) = v.get("/attempts?reason=correction").await;
    assert!(page.contains(&failed[failed.len() - 8..]), "{page}");
    assert!(page.contains("type=\"date\""), "{page}");
    let (_, page) = v.get(&format!("/runs?from={tomorrow}")).await;
    assert!(page.contains("No run"), "{page}");
    // Why an attempt waits reads as words; each id in it is short, whole
    // on hover and copied whole.
    let (_, page) = v.get("/attempts?state=WaitingForDecision").await;
    let cell = page
        .split("<td>")
        .find(|c| c.starts_with("waiting for a human"))
        .unwrap_or_else(|| panic!("{page}"));
    assert!(cell.contains("decision <code title=\""), "{cell}");
    assert!(cell.contains("data-copy=\""), "{cell}");
    let (status, page) = v.get("/attempts?from=someday").await;
    assert_eq!(status, 400, "{page}");
    assert!(page.contains("from"), "{page}");
}

/// Bulk approve, hold and cancel: a page first lists what confirming will
/// change (and what it will not), nothing changes until confirmed, and
/// each change is then audited as the person's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_actions_list_what_changes_then_each_change_is_audited() {
    let a = demo();
    user(&a, "demo", "wendy", &["WorkspaceAdmin"]).await;
    let attempts = demo_attempts(&a).await;
    let run_of = |release: &str| {
        attempts
            .iter()
            .find(|x| x["releaseId"] == release)
            .unwrap_or_else(|| panic!("no run of {release}: {attempts:#?}"))["runId"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let ended = attempts.iter().find(|x| x["state"] == "Succeeded").unwrap()["runId"]
        .as_str()
        .unwrap()
        .to_string();
    let waiting = run_of("triage-question-1.0.0");
    let v = Visitor::sign_in(&a, "wendy").await;
    let audit = |action: &'static str| {
        let v = &v;
        async move {
            let (_, csv) = v.get(&format!("/audit.csv?action={action}")).await;
            csv.lines().skip(1).map(str::to_string).collect::<Vec<_>>()
        }
    };

    // The runs page offers the picks and the bulk form.
    let (_, page) = v.get("/runs").await;
    assert!(page.contains("form=\"bulk-runs\" name=\"run\""), "{page}");

    // Hold: the plan names both runs; nothing is held yet.
    let hold = [
        ("action", "hold"),
        ("reason", "incident 42"),
        ("run", ended.as_str()),
        ("run", waiting.as_str()),
    ];
    let (status, plan) = v.post("/runs/bulk", &hold).await;
    assert_eq!(status, 200, "{plan}");
    assert!(plan.contains("Place a legal hold on 2 runs?"), "{plan}");
    assert!(plan.contains("placed on legal hold"), "{plan}");
    assert!(
        plan.contains("Confirm: place a legal hold on 2 runs"),
        "{plan}"
    );
    assert!(audit("run.hold").await.is_empty());
    let mut confirmed = hold.to_vec();
    confirmed.push(("confirm", "1"));
    let (ok, message) = v.act("/runs/bulk", &confirmed).await;
    assert!(ok, "{message}");
    assert!(message.contains("2 of 2 runs: done"), "{message}");
    let held = audit("run.hold").await;
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(
        held.iter()
            .all(|r| r.contains(",user wendy,") && r.contains(",console,")),
        "{held:?}"
    );

    // Approvals: with one waiting there is nothing to pick; with two the
    // inbox picks them, each inside its own item, and the plan says what
    // each approves.
    let (_, inbox) = v.get("/decisions").await;
    let marker = "form=\"bulk-decisions\" name=\"decision\" value=\"";
    assert!(!inbox.contains(marker), "{inbox}");
    let (status, _) = v
        .post(
            "/runs",
            &[
                ("releaseId", "triage-approval-1.0.0"),
                ("projectId", "support"),
                ("f.customer", "globex"),
                ("f.text", "Checkout is down again."),
            ],
        )
        .await;
    assert_eq!(status, 303);
    let mut inbox = String::new();
    for _ in 0..200 {
        inbox = v.get("/decisions").await.1;
        if inbox.matches(marker).count() == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(inbox.matches(marker).count(), 2, "{inbox}");
    let item = inbox
        .split("<div class=\"decision approval\"")
        .nth(1)
        .unwrap();
    assert!(
        item.split("</div>").next().unwrap().contains(marker),
        "{item}"
    );
    let at = inbox.find(marker).unwrap_or_else(|| panic!("{inbox}")) + marker.len();
    let picked = inbox[at..].split('"').next().unwrap().to_string();
    let approve = [("action", "approve"), ("decision", picked.as_str())];
    let (status, plan) = v.post("/decisions/bulk", &approve).await;
    assert_eq!(status, 200, "{plan}");
    assert!(plan.contains("Confirm: approve 1 approval"), "{plan}");
    assert!(audit("approval.decide").await.is_empty());
    let mut confirmed = approve.to_vec();
    confirmed.push(("confirm", "1"));
    let (ok, message) = v.act("/decisions/bulk", &confirmed).await;
    assert!(
        ok && message.contains("1 of 1 approvals: done"),
        "{message}"
    );
    let decided = audit("approval.decide").await;
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert!(decided[0].contains(",user wendy,"), "{decided:?}");

    // Cancel: the ended run would not change and is left out of the form.
    let cancel = [
        ("action", "cancel"),
        ("run", ended.as_str()),
        ("run", waiting.as_str()),
    ];
    let (_, plan) = v.post("/runs/bulk", &cancel).await;
    assert!(plan.contains("nothing: it has ended (Succeeded)"), "{plan}");
    assert!(plan.contains("Confirm: cancel 1 run"), "{plan}");
    let hidden = format!("name=\"run\" value=\"{ended}\"");
    assert!(
        !plan.contains(&hidden),
        "the ended run is not in the confirmation: {plan}"
    );
    let (ok, message) = v
        .act(
            "/runs/bulk",
            &[
                ("action", "cancel"),
                ("run", waiting.as_str()),
                ("confirm", "1"),
            ],
        )
        .await;
    assert!(ok, "{message}");
    let cancelled = audit("run.cancel").await;
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    assert!(cancelled[0].contains(&waiting), "{cancelled:?}");

    // Nothing picked, or an unknown action: said, beside the form.
    let (ok, message) = v.act("/runs/bulk", &[("action", "cancel")]).await;
    assert!(
        !ok && message.contains("pick at least one run"),
        "{message}"
    );
    let (ok, message) = v
        .act(
            "/runs/bulk",
            &[("action", "delete"), ("run", ended.as_str())],
        )
        .await;
    assert!(!ok && message.contains("not a bulk action"), "{message}");
}

#[tokio::test]
async fn the_inbox_says_who_is_expected_to_answer_and_filters_by_mine() {
    let a = demo_with_every_role().await;
    demo_attempts(&a).await;
    // The demo's approval release names role:Reviewer in its policy.
    let rev = Visitor::sign_in(&a, "rev").await;
    let (_, all) = rev.get("/decisions").await;
    assert!(
        all.contains("For: <b>anyone with role Reviewer</b>"),
        "{all}"
    );
    let (_, mine) = rev.get("/decisions?mine=1").await;
    assert!(
        mine.contains("page-oncall") && mine.contains("waiting for me"),
        "{mine}"
    );
    // The question names no one: it is in everyone's list, in no one's own.
    assert!(!mine.contains("class=\"decision input"), "{mine}");
    let ops = Visitor::sign_in(&a, "ops").await;
    let (_, theirs) = ops.get("/decisions?mine=1").await;
    assert!(
        !theirs.contains("page-oncall") && theirs.contains("No decision waits for you."),
        "{theirs}"
    );
    // A single approval has no bulk control; none sits outside its item.
    assert!(
        !all.contains("pick this approval for a bulk decision"),
        "{all}"
    );
}
