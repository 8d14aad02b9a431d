//! A new decision told where people are: a mail through a real SMTP
//! conversation with the site's relay (a sink in the test) to each person
//! who may answer it, retried after a temporary refusal, given up after a
//! permanent one; and a ready chat text in the signed webhook message. The
//! link each carries opens the decision's page only after sign-in, only
//! for its person, once, and not after it expires.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use reqwest::header::{COOKIE, LOCATION};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use agentbay::proto::agentbay::admin::v1 as pb;

use crate::common::Appliance;
use crate::console::{PASSWORD, Visitor, flash_of, html_unescape};

/// One mail the sink took.
#[derive(Clone, Debug)]
pub(crate) struct Received {
    pub to: Vec<String>,
    /// The message as sent (headers and encoded body).
    pub data: String,
    /// Whether it came over TLS (after STARTTLS).
    pub secure: bool,
}

impl Received {
    /// The body, quoted-printable decoded (as a mail reader shows it).
    pub(crate) fn text(&self) -> String {
        let body = self
            .data
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .unwrap_or_default();
        if !self
            .data
            .to_ascii_lowercase()
            .contains("content-transfer-encoding: quoted-printable")
        {
            return body.replace("\r\n", "\n");
        }
        let joined = body.replace("=\r\n", "");
        let bytes = joined.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'='
                && i + 2 < bytes.len()
                && let Ok(b) = u8::from_str_radix(&joined[i + 1..i + 3], 16)
            {
                out.push(b);
                i += 3;
                continue;
            }
            out.push(bytes[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).replace("\r\n", "\n")
    }

    /// The header `name`'s value.
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        let head = self.data.split_once("\r\n\r\n")?.0;
        head.lines()
            .find(|l| {
                l.to_ascii_lowercase()
                    .starts_with(&format!("{}:", name.to_ascii_lowercase()))
            })
            .map(|l| l[name.len() + 1..].trim().to_string())
    }

    /// The link to a decision in the body.
    pub(crate) fn link(&self) -> String {
        let text = self.text();
        text.lines()
            .find(|l| l.contains("/l/"))
            .unwrap_or_else(|| panic!("no link in {text}"))
            .trim()
            .to_string()
    }
}

/// A site's SMTP relay, in the test: it speaks SMTP on a port of this
/// host (with STARTTLS when it has a certificate), keeps what it takes,
/// refuses recipients at `@bounce.test` for good (550) and answers the next
/// `temporary` DATA with 451.
#[derive(Default)]
pub(crate) struct Sink {
    pub mails: Mutex<Vec<Received>>,
    pub temporary: Mutex<usize>,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

/// A conversation's stream: the connection, plain or after STARTTLS.
trait Stream: tokio::io::AsyncBufRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<S: tokio::io::AsyncBufRead + tokio::io::AsyncWrite + Unpin + Send> Stream for S {}

impl Sink {
    /// A plain relay.
    pub(crate) async fn start() -> (Arc<Sink>, u16) {
        Sink::listen(Sink::default()).await
    }

    /// A relay that offers STARTTLS with a certificate for `localhost`;
    /// returns it, its port and the PEM of the CA that signed it.
    pub(crate) async fn start_tls() -> (Arc<Sink>, u16, String) {
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let der = rustls_pki_types::CertificateDer::from(ca.cert.der().to_vec());
        let key =
            rustls_pki_types::PrivateKeyDer::try_from(ca.signing_key.serialize_der()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![der], key)
        .unwrap();
        let sink = Sink {
            tls: Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
            ..Default::default()
        };
        let (sink, port) = Sink::listen(sink).await;
        (sink, port, ca.cert.pem())
    }

    async fn listen(sink: Sink) -> (Arc<Sink>, u16) {
        let sink = Arc::new(sink);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let s = sink.clone();
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let _ = s.serve(socket).await;
                });
            }
        });
        (sink, port)
    }

    async fn serve(&self, socket: tokio::net::TcpStream) -> std::io::Result<()> {
        let mut plain = BufReader::new(socket);
        plain.write_all(b"220 sink.test ESMTP\r\n").await?;
        if !self.session(&mut plain, false).await? {
            return Ok(());
        }
        let Some(acceptor) = &self.tls else {
            return Ok(());
        };
        let secured = acceptor.accept(plain.into_inner()).await?;
        self.session(&mut BufReader::new(secured), true).await?;
        Ok(())
    }

    /// One conversation; true when the client asked for STARTTLS.
    async fn session(&self, s: &mut impl Stream, secure: bool) -> std::io::Result<bool> {
        let mut to = Vec::new();
        loop {
            let mut line = String::new();
            if s.read_line(&mut line).await? == 0 {
                return Ok(false);
            }
            let upper = line.to_ascii_uppercase();
            let answer: &[u8] = if upper.starts_with("EHLO") {
                if self.tls.is_some() && !secure {
                    b"250-sink.test\r\n250-8BITMIME\r\n250 STARTTLS\r\n"
                } else {
                    b"250-sink.test\r\n250 8BITMIME\r\n"
                }
            } else if upper.starts_with("STARTTLS") && self.tls.is_some() && !secure {
                s.write_all(b"220 go ahead\r\n").await?;
                s.flush().await?;
                return Ok(true);
            } else if upper.starts_with("MAIL FROM") {
                to.clear();
                b"250 ok\r\n"
            } else if upper.starts_with("RCPT TO") {
                let address = line[8..]
                    .trim()
                    .trim_start_matches(':')
                    .trim()
                    .trim_matches(['<', '>'])
                    .to_string();
                if address.ends_with("@bounce.test") {
                    b"550 5.1.1 no such mailbox\r\n"
                } else {
                    to.push(address);
                    b"250 ok\r\n"
                }
            } else if upper.starts_with("DATA") {
                s.write_all(b"354 go on\r\n").await?;
                s.flush().await?;
                let mut data = String::new();
                loop {
                    let mut l = String::new();
                    if s.read_line(&mut l).await? == 0 {
                        return Ok(false);
                    }
                    if l == ".\r\n" {
                        break;
                    }
                    data.push_str(l.strip_prefix('.').unwrap_or(&l));
                }
                let refuse = {
                    let mut t = self.temporary.lock();
                    let refuse = *t > 0;
                    *t = t.saturating_sub(1);
                    refuse
                };
                if refuse {
                    b"451 4.3.0 try again later\r\n"
                } else {
                    self.mails.lock().push(Received {
                        to: std::mem::take(&mut to),
                        data,
                        secure,
                    });
                    b"250 queued\r\n"
                }
            } else if upper.starts_with("QUIT") {
                s.write_all(b"221 bye\r\n").await?;
                s.flush().await?;
                return Ok(false);
            } else {
                b"250 ok\r\n"
            };
            s.write_all(answer).await?;
            s.flush().await?;
        }
    }

    /// The mails whose text contains `needle`, once at least `n` came.
    pub(crate) async fn wait_for(&self, a: &Appliance, needle: &str, n: usize) -> Vec<Received> {
        for _ in 0..200 {
            let got: Vec<Received> = self
                .mails
                .lock()
                .iter()
                .filter(|m| m.text().contains(needle))
                .cloned()
                .collect();
            if got.len() >= n {
                return got;
            }
            a.run_worker("Notifier").await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "fewer than {n} mails about {needle}: {:?}\n{}",
            self.mails.lock(),
            a.log()
        );
    }
}

/// The path of a link (`/l/<token>`), from its full address.
fn path_of(link: &str) -> String {
    link[link.find("/l/").unwrap()..].to_string()
}

/// GET without following redirects: (status, Location or body).
async fn get(a: &Appliance, cookie: Option<&str>, path: &str) -> (u16, String) {
    let mut request = crate::console::client(a).get(format!("{}{path}", a.url));
    if let Some(c) = cookie {
        request = request.header(COOKIE, c);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let location = response
        .headers()
        .get(LOCATION)
        .map(|l| l.to_str().unwrap().to_string());
    let body = response.text().await.unwrap();
    (status, location.unwrap_or(body))
}

/// Signs in through the form with `next`; returns the cookie and where
/// the sign-in leads.
async fn sign_in_to(a: &Appliance, username: &str, next: &str) -> (String, String) {
    let response = crate::console::client(a)
        .post(format!("{}/signin", a.url))
        .form(&[
            ("username", username),
            ("password", PASSWORD),
            ("next", next),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 303, "sign-in of {username}");
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let to = response.headers()[LOCATION].to_str().unwrap().to_string();
    (cookie, to)
}

/// Submits a run of the demo's approval release (it waits for a
/// Reviewer to approve paging on-call); returns its id.
async fn submit_approval(a: &Appliance, token: &str) -> String {
    let submitted: Value = a
        .http()
        .post(format!("{}/agentbay.runs.v1.Runs/SubmitRun", a.url))
        .bearer_auth(token)
        .json(&json!({"tenantId": "demo", "projectId": "support", "releaseId": "triage-approval-1.0.0",
                      "inputJson": "{\"customer\": \"initech\", \"text\": \"the pager is silent\"}"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    submitted["run"]["runId"]
        .as_str()
        .unwrap_or_else(|| panic!("{submitted}"))
        .to_string()
}

#[tokio::test]
async fn a_new_decision_is_mailed_to_who_may_answer_with_a_link_that_opens_once_after_sign_in() {
    let (sink, port) = Sink::start().await;
    let (hooks, hook_addr) = crate::webhooks::receiver().await;
    let relay = format!("127.0.0.1:{port}");
    let a = Appliance::start_with(
        &["--manual-clock"],
        &[
            ("AGENTBAY_DEMO__ENABLED", "true"),
            ("AGENTBAY_NOTIFY__SMTP__RELAY", relay.as_str()),
            ("AGENTBAY_NOTIFY__SMTP__SECURITY", "none"),
            ("AGENTBAY_NOTIFY__SMTP__FROM", "agentbay@bay.test"),
            ("AGENTBAY_RUNTIME__NETWORK_ALLOW", hook_addr.as_str()),
        ],
    );
    let admin = a.admin_token().await;
    let rpc = a.rpc_json(&admin);
    // Who may answer the demo's approvals (its policy: role:Reviewer),
    // with and without an address, and who may not.
    for (name, role, email) in [
        ("rev", "Reviewer", "rev@site.test"),
        ("rita", "Reviewer", ""),
        ("rex", "Reviewer", ""),
        ("obs", "Observer", "obs@site.test"),
        ("wsa", "WorkspaceAdmin", "wsa@site.test"),
        ("ray", "Reviewer", "ray@site.test"),
    ] {
        rpc.create_user(pb::CreateUserRequest {
            tenant_id: "demo".into(),
            username: name.into(),
            roles: vec![role.into()],
            password: PASSWORD.into(),
            email: email.into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("create user {name}: {e:?}"));
    }
    // An address is checked and named; rita's is set later, over the API
    // (and bounces).
    let bad = rpc
        .set_user_email(pb::SetUserEmailRequest {
            tenant_id: "demo".into(),
            username: "rita".into(),
            email: "rita at site".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        format!("{bad:?}").contains("email") && format!("{bad:?}").contains("not a mail address"),
        "{bad:?}"
    );
    let set = rpc
        .set_user_email(pb::SetUserEmailRequest {
            tenant_id: "demo".into(),
            username: "rita".into(),
            email: "rita@bounce.test".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_owned();
    assert_eq!(set.user.as_option().unwrap().email, "rita@bounce.test");
    // A chat endpoint of the tenant hears of new decisions.
    let hook = a
        .http()
        .post(format!("{}/factory/webhooks", a.url))
        .bearer_auth(&admin)
        .json(&json!({"url": format!("http://{hook_addr}/chat"), "events": ["decision.requested"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(hook.status(), 201, "{}", hook.text().await.unwrap());

    // The relay refuses the first mail for now: it is tried again.
    *sink.temporary.lock() = 1;
    let run = submit_approval(&a, &admin).await;
    // The first try met the 451; the clock moves past the backoff.
    for _ in 0..100 {
        a.run_worker("Notifier").await;
        if *sink.temporary.lock() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(*sink.temporary.lock(), 0, "the relay was never tried");
    a.advance(31).await;
    let mails = sink.wait_for(&a, &run, 2).await;
    let mut to: Vec<String> = mails.iter().flat_map(|m| m.to.clone()).collect();
    to.sort();
    assert_eq!(
        to,
        vec!["ray@site.test", "rev@site.test"],
        "the Reviewers with an address; no Observer, no one outside the assignee role"
    );
    let rev_mail = mails
        .iter()
        .find(|m| m.to == ["rev@site.test"])
        .unwrap()
        .clone();
    let subject = rev_mail.header("Subject").unwrap();
    assert!(
        subject.starts_with("An approval waits in demo:"),
        "{subject}"
    );
    assert!(
        rev_mail
            .header("From")
            .unwrap()
            .contains("agentbay@bay.test"),
        "{:?}",
        rev_mail.header("From")
    );
    let text = rev_mail.text();
    assert!(
        text.contains("Call: tool page-oncall")
            && text.contains("For: anyone with role Reviewer")
            && text.contains("Open it, sign in and decide:"),
        "{text}"
    );
    let link = rev_mail.link();
    assert!(link.starts_with("https://"), "{link}");
    let path = path_of(&link);

    // The decision's page lists who was told and how it went, once the
    // link opens it; rita's mail was refused for good and not retried.
    // Without a session, the link leads to the sign-in, and back.
    let (status, to) = get(&a, None, &path).await;
    assert_eq!(status, 303);
    assert!(to.starts_with("/signin?next=%2Fl%2F"), "{to}");
    // Someone else signed in: refused, and the link stays unused.
    let (ray, _) = sign_in_to(&a, "ray", "/").await;
    let (status, page) = get(&a, Some(&ray), &path).await;
    assert_eq!(status, 403, "{page}");
    assert!(
        html_unescape(&page).contains("This link was sent to rev"),
        "{page}"
    );
    // A changed link is not ours.
    let mut forged = path.clone();
    forged.push('x');
    let (status, page) = get(&a, Some(&ray), &forged).await;
    assert_eq!(status, 400, "{page}");
    // rev signs in from the link and lands on the decision.
    let (rev, next) = sign_in_to(&a, "rev", &path).await;
    assert_eq!(next, path, "the sign-in comes back to the link");
    let (status, decision_page) = get(&a, Some(&rev), &path).await;
    assert_eq!(status, 303);
    assert!(
        decision_page.starts_with("/attempts/") && decision_page.contains("/decisions/"),
        "{decision_page}"
    );
    let (status, page) = get(&a, Some(&rev), &decision_page).await;
    assert_eq!(status, 200);
    let page = html_unescape(&page);
    assert!(
        page.contains("page-oncall") && page.contains("Accept"),
        "{page}"
    );
    assert!(
        page.contains("rev <rev@site.test>") && page.contains("ray <ray@site.test>"),
        "{page}"
    );
    assert!(
        page.contains("rita <rita@bounce.test>") && page.contains("gave up"),
        "the bounced mail is shown given up: {page}"
    );
    assert!(page.contains("550"), "with the relay's words: {page}");
    // The link opened once: a second opening is refused, to the inbox.
    let (status, to) = get(&a, Some(&rev), &path).await;
    assert_eq!((status, to.as_str()), (303, "/decisions"));
    let (_, inbox) = get(&a, Some(&rev), "/decisions").await;
    let (ok, flash) = flash_of(&inbox).unwrap();
    assert!(!ok && flash.contains("already opened"), "{flash}");

    // The chat message: a ready text with a link of its own.
    let chat = loop {
        let seen = hooks
            .seen
            .lock()
            .iter()
            .find(|s| s.path == "/chat" && s.body.contains(&run))
            .cloned();
        if let Some(s) = seen {
            break s;
        }
        a.run_worker("WebhookDispatcher").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let body: Value = serde_json::from_str(&chat.body).unwrap();
    let chat_text = body["text"].as_str().unwrap();
    let chat_link = body["data"]["link"].as_str().unwrap();
    assert!(
        chat_text.starts_with("An approval waits in demo:") && chat_text.ends_with(chat_link),
        "{body}"
    );
    assert_ne!(chat_link, link, "each message has a link of its own");
    // Anyone of the tenant who signs in may open a channel's link, once;
    // it decides nothing by itself.
    let (status, to) = get(&a, Some(&ray), &path_of(chat_link)).await;
    assert_eq!((status, to.as_str()), (303, decision_page.as_str()));

    // ray decides on the page; the decision comes back to it.
    let v = Visitor::sign_in(&a, "ray").await;
    let (status, back) = v
        .post(
            &decision_page,
            &[
                ("action", "approve"),
                ("reason", "on-call knows"),
                ("back", decision_page.as_str()),
            ],
        )
        .await;
    assert_eq!((status, back.as_str()), (303, decision_page.as_str()));
    let (_, page) = v.get(&decision_page).await;
    assert!(html_unescape(&page).contains("by user ray"), "{page}");

    // ray's own mail link, after its time: expired.
    let ray_mail = mails
        .iter()
        .find(|m| m.to == ["ray@site.test"])
        .unwrap()
        .clone();
    a.advance(73 * 3600).await;
    // (Sessions end sooner: ray signs in again.)
    let (ray, _) = sign_in_to(&a, "ray", "/").await;
    let (status, to) = get(&a, Some(&ray), &path_of(&ray_mail.link())).await;
    assert_eq!((status, to.as_str()), (303, "/decisions"));
    let (_, inbox) = get(&a, Some(&ray), "/decisions").await;
    let (_, flash) = flash_of(&inbox).unwrap();
    assert!(flash.contains("expired"), "{flash}");
    // A link's text and token are never in the log.
    let token = &path["/l/".len()..];
    assert!(!a.log().contains(token), "the token is in the log");
}

#[tokio::test]
async fn mail_leaves_the_host_over_starttls_checked_against_the_sites_ca() {
    let (sink, port, ca) = Sink::start_tls().await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("mail-ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let relay = format!("localhost:{port}");
    // Only the default security (STARTTLS, required) and the site's CA.
    let a = Appliance::start_with(
        &[],
        &[
            ("AGENTBAY_DEMO__ENABLED", "true"),
            ("AGENTBAY_NOTIFY__SMTP__RELAY", relay.as_str()),
            ("AGENTBAY_NOTIFY__SMTP__CA_FILE", ca_file.to_str().unwrap()),
        ],
    );
    let admin = a.admin_token().await;
    a.rpc_json(&admin)
        .create_user(pb::CreateUserRequest {
            tenant_id: "demo".into(),
            username: "rev".into(),
            roles: vec!["Reviewer".into()],
            password: PASSWORD.into(),
            email: "rev@site.test".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let run = submit_approval(&a, &admin).await;
    let mails = sink.wait_for(&a, &run, 1).await;
    assert!(mails[0].secure, "the mail came in the clear");
    assert_eq!(mails[0].to, ["rev@site.test"]);
}
