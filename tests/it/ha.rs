//! Two appliances on one PostgreSQL store: one active, the other standing
//! by and forwarding, and the standby taking over when the active one is
//! killed (kill -9) or cut off from PostgreSQL; and the active one
//! keeping its role through a PostgreSQL restart shorter than its lease. A real PostgreSQL from Debian's packages, started in a
//! temporary directory (`tests/common/pg.rs`).

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use agentbay::proto::agentbay::admin::v1 as pb;
use serde_json::Value;

use crate::common::{self, Appliance, Credential};
use crate::pg::PgCluster;

/// The lease the tests give the pair: short, so a takeover is quick.
const LEASE_SECONDS: u64 = 3;

/// One appliance of the pair.
pub struct Node {
    name: &'static str,
    root: PathBuf,
    data_dir: PathBuf,
    port: u16,
    db_url: String,
    child: Option<Child>,
    fingerprint: String,
    env: Vec<(String, String)>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Node {
    /// A node of the pair whose nodes live under `root`: the first one
    /// made runs `agentbay cluster init`, the others get a copy of its
    /// pair key, as an operator copies it.
    pub fn new(name: &'static str, root: &Path, db_url: &str) -> Node {
        let shared_key = root.join("pair.key");
        let root = root.join(name);
        std::fs::create_dir_all(&root).unwrap();
        let data_dir = root.join("data");
        let key = data_dir.join(agentbay::store::datadir::PAIR_KEY_FILE);
        if shared_key.exists() {
            std::fs::create_dir_all(&data_dir).unwrap();
            std::fs::copy(&shared_key, &key).unwrap();
        } else {
            let out = common::run(
                common::agentbay()
                    .args(["cluster", "init", "--data-dir"])
                    .arg(&data_dir),
            );
            assert!(
                out.status.success(),
                "cluster init: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                String::from_utf8_lossy(&out.stdout).contains("made the pair key"),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );
            std::fs::copy(&key, &shared_key).unwrap();
        }
        Node {
            name,
            data_dir,
            root,
            port: free_port(),
            db_url: db_url.to_string(),
            child: None,
            fingerprint: String::new(),
            env: Vec::new(),
        }
    }

    /// With more settings in its environment.
    pub fn with_env(mut self, env: &[(&str, &str)]) -> Node {
        self.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self
    }

    fn command(&self) -> std::process::Command {
        let mut cmd = common::agentbay();
        cmd.env("AGENTBAY_DEMO__ENABLED", "false")
            .env("AGENTBAY_STORE__BACKEND", "postgres")
            .env("AGENTBAY_STORE__POSTGRES__URL", &self.db_url)
            .env("AGENTBAY_STORE__POSTGRES__NODE_NAME", self.name)
            .env("AGENTBAY_STORE__POSTGRES__ADVERTISE_URL", self.url())
            .env(
                "AGENTBAY_STORE__POSTGRES__LEASE_SECONDS",
                LEASE_SECONDS.to_string(),
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// `agentbay init` on the shared store: the bootstrap credential.
    pub fn init(&self) -> Credential {
        let out = common::run(
            self.command()
                .args(["init", "--json", "--data-dir"])
                .arg(&self.data_dir),
        );
        assert!(
            out.status.success(),
            "init failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.give_demo_key();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        Credential {
            id: v["client_id"].as_str().unwrap().to_string(),
            secret: v["client_secret"].as_str().unwrap().to_string(),
        }
    }

    pub fn start(&mut self) {
        let file = |name: &str| {
            std::fs::File::options()
                .create(true)
                .append(true)
                .open(self.root.join(name))
                .unwrap()
        };
        let child = self
            .command()
            .args(["serve", "--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file("serve.out")))
            .stderr(Stdio::from(file("serve.err")))
            .spawn()
            .unwrap();
        let mut child = child;
        let path = self.data_dir.join("run/appliance.json");
        let deadline = Instant::now() + Duration::from_secs(30);
        let info = loop {
            if let Ok(bytes) = std::fs::read(&path)
                && let Ok(info) =
                    serde_json::from_slice::<agentbay::store::datadir::RuntimeInfo>(&bytes)
                && info.pid == child.id()
            {
                break info;
            }
            let exited = child.try_wait().unwrap();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "{} did not start ({exited:?}): {}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        self.fingerprint = info.certificate_fingerprint;
        self.child = Some(child);
        self.give_demo_key();
    }

    /// The test publisher's key as the appliance's demo key, as
    /// `common::init` gives every test appliance (read when it becomes
    /// active; a standby's data directory gets it once it exists).
    fn give_demo_key(&self) {
        let key = self
            .data_dir
            .join(agentbay::releases::signing::DEMO_KEY_FILE);
        if !key.exists() {
            std::fs::create_dir_all(key.parent().unwrap()).unwrap();
            std::fs::copy(common::test_demo_key(), &key).unwrap();
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("serve.err")).unwrap_or_default()
    }

    /// `/readyz`: its status and body.
    pub async fn readyz(&self) -> (u16, Value) {
        let r = common::https_client(&self.fingerprint)
            .get(format!("{}/readyz", self.url()))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        match r {
            Ok(r) => (r.status().as_u16(), r.json().await.unwrap_or(Value::Null)),
            Err(_) => (0, Value::Null),
        }
    }

    /// Waits until `/readyz` says `role` (and ready when active).
    pub async fn wait_for_role(&self, role: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let (status, body) = self.readyz().await;
            let ok = body["role"] == role && (role != "active" || status == 200);
            if ok {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not become {role} within {within:?}: {status} {body}\n{}",
                self.name,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The id of the pair key in its data directory, as `/readyz` shows it.
    pub fn readyz_of_key(&self) -> Value {
        let text =
            std::fs::read_to_string(self.data_dir.join(agentbay::store::datadir::PAIR_KEY_FILE))
                .unwrap();
        Value::from(
            agentbay::domain::cluster::PairKey::parse(&text)
                .unwrap()
                .id(),
        )
    }

    /// The node as the shared test helpers see an appliance.
    pub fn appliance(&self, admin: &Credential) -> Appliance {
        Appliance::remote(&self.url(), &self.fingerprint, admin.clone())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `agentbay init` on `active`, then `active` started and active, then
/// `standby` started and standing by: the bootstrap credential and the
/// active one's readiness.
pub async fn start_pair(active: &mut Node, standby: &mut Node) -> (Credential, Value) {
    let admin = active.init();
    active.start();
    let ready = active
        .wait_for_role("active", Duration::from_secs(30))
        .await;
    standby.start();
    standby
        .wait_for_role("standby", Duration::from_secs(30))
        .await;
    (admin, ready)
}

/// A client credential's token request from `source` through `node`.
async fn token_from(node: &Node, source: &str, id: &str, secret: &str) -> reqwest::Response {
    common::https_client_at(&node.fingerprint, Some(source))
        .post(format!("{}/oauth/token", node.url()))
        .basic_auth(id, Some(secret))
        .form(&[("grant_type", "client_credentials")])
        .send()
        .await
        .unwrap()
}

/// Registers `tenant` from `source` through `node`, with extra headers.
async fn put_tenant_from(
    node: &Node,
    source: &str,
    token: &str,
    tenant: &str,
    headers: &[(&str, &str)],
) {
    let mut request = common::https_client_at(&node.fingerprint, Some(source))
        .post(format!("{}/agentbay.admin.v1.Admin/PutTenant", node.url()))
        .bearer_auth(token)
        .json(&serde_json::json!({"tenantId": tenant, "edition": "team"}));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let r = request.send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

/// The address the audit trail recorded for the action on `target`.
async fn audited_address(a: &Appliance, target: &str) -> String {
    let token = a.admin_token().await;
    let trail = a.get(&token, "/factory/audit?limit=200").await;
    let record = trail["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["target"].as_str().is_some_and(|t| t.contains(target)))
        .unwrap_or_else(|| panic!("no record for {target}: {trail}"))
        .clone();
    record["address"].as_str().unwrap().to_string()
}

async fn client_addresses_are_the_clients_own_through_the_standby(
    a: &Node,
    b: &Node,
    admin: &Credential,
) {
    // `auth.failures_per_name_and_source` is 5.
    for _ in 0..5 {
        let r = token_from(b, "127.0.0.2", &admin.id, "abs_wrong").await;
        assert_eq!(r.status(), 401);
    }
    let locked = token_from(b, "127.0.0.2", &admin.id, &admin.secret).await;
    assert_eq!(
        locked.status(),
        429,
        "the address that failed is locked out"
    );
    let elsewhere = token_from(b, "127.0.0.9", &admin.id, &admin.secret).await;
    assert_eq!(
        elsewhere.status(),
        200,
        "another client through the same standby is not locked out"
    );
    let token = elsewhere.json::<Value>().await.unwrap()["access_token"]
        .as_str()
        .unwrap()
        .to_string();
    put_tenant_from(b, "127.0.0.9", &token, "seen-via-standby", &[]).await;
    // A client that sends the forwarding headers itself is not believed.
    put_tenant_from(
        a,
        "127.0.0.3",
        &token,
        "claims-to-be-forwarded",
        &[
            ("x-agentbay-forwarded-for", "192.0.2.66"),
            ("x-agentbay-forwarded-by", "b"),
            ("x-agentbay-pair-proof", "1.00"),
        ],
    )
    .await;
    let via_a = a.appliance(admin);
    assert_eq!(
        audited_address(&via_a, "seen-via-standby").await,
        "127.0.0.9"
    );
    assert_eq!(
        audited_address(&via_a, "claims-to-be-forwarded").await,
        "127.0.0.3"
    );
}

async fn tenants(a: &Appliance) -> Vec<String> {
    let token = a.admin_token().await;
    a.rpc_json(&token)
        .list_tenants(pb::ListTenantsRequest::default())
        .await
        .expect("list tenants")
        .into_owned()
        .tenants
        .into_iter()
        .map(|t| t.tenant_id)
        .collect()
}

#[tokio::test]
async fn a_standby_forwards_and_takes_over_when_the_active_appliance_is_killed() {
    let cluster = PgCluster::shared();
    let db = cluster.database();
    let tmp = tempfile::tempdir().unwrap();
    let mut a = Node::new("a", tmp.path(), &db);
    let mut b = Node::new("b", tmp.path(), &db);
    let admin = a.init();
    a.start();
    let ready = a.wait_for_role("active", Duration::from_secs(30)).await;
    let first_epoch = ready["leader"]["epoch"].as_i64().unwrap();
    assert_eq!(ready["leader"]["node"], "a");
    b.start();
    let standby = b.wait_for_role("standby", Duration::from_secs(30)).await;
    assert_eq!(standby["active"]["node"], "a", "{standby}");
    assert_eq!(standby["active"]["url"], a.url());
    assert_eq!(standby["ready"], false);

    // Through either address, over Connect and REST: B forwards to A.
    let (via_a, via_b) = (a.appliance(&admin), b.appliance(&admin));
    let mut acknowledged = Vec::new();
    for i in 0..6 {
        let via = if i % 2 == 0 { &via_a } else { &via_b };
        let tenant = format!("t{i}");
        via.ensure_tenant(&tenant).await;
        acknowledged.push(tenant);
    }
    let token = via_b.admin_token().await;
    let trail = via_b.get(&token, "/factory/audit?limit=50").await;
    assert!(trail.to_string().contains("t5"), "{trail}");
    assert_eq!(
        standby["pairKey"],
        a.readyz_of_key(),
        "both hold the key cluster init made: {standby}"
    );

    // Through the standby, the active appliance sees each client's own
    // address: failures from one address lock that address out, no other.
    client_addresses_are_the_clients_own_through_the_standby(&a, &b, &admin).await;

    // Half-sent requests flood the standby (137 connections that send
    // three bytes of a TLS record and wait): its connection layer drops
    // them, and they hold nothing the takeover needs.
    let standby_at = b.url().trim_start_matches("https://").to_string();
    let mut flood = Vec::new();
    for _ in 0..137 {
        if let Ok(mut s) = std::net::TcpStream::connect(&standby_at) {
            use std::io::Write;
            let _ = s.write_all(&[0x16, 0x03, 0x01]);
            flood.push(s);
        }
    }

    // kill -9 the active appliance: B takes over within the lease.
    a.kill9();
    let killed = Instant::now();
    let active = b
        .wait_for_role("active", Duration::from_secs(LEASE_SECONDS + 12))
        .await;
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(15), "the takeover took {took:?}");
    eprintln!(
        "takeover after kill -9, with {} half-sent connections on the standby: {took:?}",
        flood.len()
    );
    drop(flood);
    assert_eq!(active["leader"]["node"], "b");
    let epoch = active["leader"]["epoch"].as_i64().unwrap();
    assert!(
        epoch > first_epoch,
        "epochs only increase: {first_epoch} then {epoch}"
    );

    // Every acknowledged write is there.
    let held = tenants(&via_b).await;
    for t in &acknowledged {
        assert!(
            held.contains(t),
            "{t} was acknowledged and is gone: {held:?}"
        );
    }

    // A comes back as the standby, and forwards to B.
    a.start();
    let standby = a.wait_for_role("standby", Duration::from_secs(30)).await;
    assert_eq!(standby["active"]["node"], "b", "{standby}");
    let via_a = a.appliance(&admin);
    via_a.ensure_tenant("after").await;
    assert!(tenants(&via_b).await.contains(&"after".to_string()));
}

#[tokio::test]
async fn a_leader_row_rewritten_outside_the_pair_is_refused_by_the_standby_and_stands_the_active_down()
 {
    let cluster = PgCluster::shared();
    let db = cluster.database();
    let tmp = tempfile::tempdir().unwrap();
    let mut a = Node::new("a", tmp.path(), &db);
    let mut b = Node::new("b", tmp.path(), &db);
    let (admin, _) = start_pair(&mut a, &mut b).await;
    a.appliance(&admin).ensure_tenant("before").await;

    // Someone with the database's password points the row at a server of
    // theirs, without the pair key: the signature no longer matches.
    let impostor = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    impostor.set_nonblocking(true).unwrap();
    let impostor_url = format!("https://{}", impostor.local_addr().unwrap());
    cluster.psql_in(
        &db,
        &format!(
            "UPDATE agentbay_leader SET url = '{impostor_url}', fingerprint = 'sha256:{}',
             expires_at = now() + interval '1 hour'",
            "0".repeat(64)
        ),
    );

    // The standby does not believe it, says so, and forwards nothing.
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let (status, body) = b.readyz().await;
        if body["store"]
            .as_str()
            .is_some_and(|s| s.contains("does not believe"))
        {
            assert_eq!(status, 503);
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "the standby believed the row: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(refused["active"].is_null(), "{refused}");
    assert!(
        refused["store"].as_str().unwrap().contains("signature"),
        "{refused}"
    );
    let forwarded = common::https_client(&b.fingerprint)
        .get(format!("{}/factory/tenants", b.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(forwarded.status(), 503);

    // The active appliance finds its row changed at its next renewal and
    // stands down, loudly; it does not believe the row either.
    let down = a
        .wait_for_role("standby", Duration::from_secs(LEASE_SECONDS + 5))
        .await;
    assert!(down["active"].is_null(), "{down}");
    assert!(
        a.log()
            .contains("the leader row was rewritten by someone other than this appliance"),
        "{}",
        a.log()
    );
    assert!(
        impostor.accept().is_err(),
        "no appliance of the pair connected to the address the rewritten row named"
    );

    // Once that row's lease ends, one of the pair takes the store with a
    // row it signs, and everything acknowledged is there.
    cluster.psql_in(&db, "UPDATE agentbay_leader SET expires_at = '-infinity'");
    let deadline = Instant::now() + Duration::from_secs(15);
    let (active, standby) = loop {
        let ((sa, _), (sb, _)) = (a.readyz().await, b.readyz().await);
        match (sa, sb) {
            (200, _) => break (&a, &b),
            (_, 200) => break (&b, &a),
            _ => {}
        }
        assert!(Instant::now() < deadline, "nobody took the store over");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The other believes the new row at its next try.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = standby.readyz().await;
        if body["active"]["node"] == active.name {
            assert_eq!(body["role"], "standby", "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the standby does not believe the row {} signed: {body}",
            active.name
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let via_standby = standby.appliance(&admin);
    assert!(tenants(&via_standby).await.contains(&"before".to_string()));
}

/// A TCP relay to PostgreSQL that a test can cut: once cut it forwards
/// nothing and answers nothing, and new connections hang, as packets are
/// lost in a network partition.
struct Relay {
    port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Relay {
    async fn start(target: u16) -> Relay {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(AtomicBool::new(false));
        let relay_cut = cut.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let cut = relay_cut.clone();
                tokio::spawn(async move {
                    if cut.load(Ordering::SeqCst) {
                        // Held open, never answered.
                        std::future::pending::<()>().await;
                    }
                    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let pump = |cut: std::sync::Arc<AtomicBool>| {
                        move |mut from: tokio::net::tcp::OwnedReadHalf,
                              mut to: tokio::net::tcp::OwnedWriteHalf| async move {
                            let mut buf = vec![0u8; 16 * 1024];
                            loop {
                                let n = match from.read(&mut buf).await {
                                    Ok(0) | Err(_) => return,
                                    Ok(n) => n,
                                };
                                if cut.load(Ordering::SeqCst) {
                                    std::future::pending::<()>().await;
                                }
                                if to.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    };
                    let up = tokio::spawn(pump(cut.clone())(cr, sw));
                    let down = tokio::spawn(pump(cut)(sr, cw));
                    let _ = tokio::join!(up, down);
                });
            }
        });
        Relay { port, cut }
    }

    fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn mend(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

// The relay runs on the test's runtime while the test blocks on the
// appliances' start: two workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_appliance_cut_off_from_postgres_stops_acting_before_the_standby_takes_over() {
    let cluster = PgCluster::shared();
    let db = cluster.database();
    let relay = Relay::start(cluster.port).await;
    let through_relay = db.replace(
        &format!("127.0.0.1:{}", cluster.port),
        &format!("127.0.0.1:{}", relay.port),
    );
    let tmp = tempfile::tempdir().unwrap();
    let mut a = Node::new("a", tmp.path(), &through_relay);
    let mut b = Node::new("b", tmp.path(), &db);
    let (admin, _) = start_pair(&mut a, &mut b).await;
    let via_b = b.appliance(&admin);
    via_b.ensure_tenant("before-the-cut").await;

    relay.cut();
    let cut_at = Instant::now();
    let mut a_stopped = None;
    let b_active = loop {
        if a_stopped.is_none() {
            let (status, body) = a.readyz().await;
            if !(status == 200 && body["role"] == "active") {
                a_stopped = Some(cut_at.elapsed());
            }
        }
        let (status, body) = b.readyz().await;
        if status == 200 && body["role"] == "active" {
            break cut_at.elapsed();
        }
        assert!(
            cut_at.elapsed() < Duration::from_secs(20),
            "b did not take over: {body}\n{}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let a_stopped = a_stopped.expect("a stopped acting before b took over");
    eprintln!("partition: a stopped acting after {a_stopped:?}, b active after {b_active:?}");
    // a stopped before b took over; it stops by its own clock, a margin
    // before its lease can run out on PostgreSQL's (what the test sees of
    // it lags on a loaded machine, so the log says why it stopped).
    assert!(a_stopped <= b_active);
    assert!(
        a.log().contains("could not be renewed in time"),
        "{}",
        a.log()
    );
    assert!(
        tenants(&via_b)
            .await
            .contains(&"before-the-cut".to_string())
    );
    via_b.ensure_tenant("after-the-cut").await;

    // Mended, a stands by and, once it reads the leader row again, names
    // b as the active appliance.
    relay.mend();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let standby = a.wait_for_role("standby", Duration::from_secs(40)).await;
        if standby["active"]["node"] == "b" {
            break;
        }
        assert!(Instant::now() < deadline, "{standby}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(a.log().contains("stops acting"), "{}", a.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_is_ridden_out_by_the_active_appliance() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::sync::{Arc, Mutex};

    use serde_json::json;

    use crate::pg::Shutdown;

    // A cluster of its own, synced, since it is restarted; the pair with
    // the default lease (10 s), which a restart of a second or two is
    // well inside.
    let cluster = PgCluster::start(true);
    let db = cluster.database();
    let tmp = tempfile::tempdir().unwrap();
    let env = [("AGENTBAY_STORE__POSTGRES__LEASE_SECONDS", "10")];
    let mut a = Node::new("a", tmp.path(), &db).with_env(&env);
    let mut b = Node::new("b", tmp.path(), &db).with_env(&env);
    let (admin, ready) = start_pair(&mut a, &mut b).await;
    let epoch = ready["leader"]["epoch"].clone();
    assert!(epoch.as_i64().is_some_and(|e| e > 0), "{ready}");

    // Builtin loops whose tool, a shared write that runs 3 s, is out when
    // PostgreSQL restarts: had the appliance stood down, its process
    // would have been killed and the call left Uncertain.
    let site = crate::builtin::Site::on(a.appliance(&admin)).await;
    site.import(
        "triage-slow-write",
        json!([
            {"content": "page", "toolCalls": [{"tool": "page-oncall", "arguments": {"message": "m", "ms": 3000}}]},
            crate::builtin::answer("high", true)
        ]),
        |m| {
            m["tools"][1]["name"] = json!("sleep");
            m["policy"]["tools"] = json!({"page-oncall": "allow"});
        },
    )
    .await;

    // Eight writers through both addresses all along: an acknowledged
    // write stays, and a refused one was told to come back (503 with
    // Retry-After: nothing was done), never left unknown.
    let nodes = [a.appliance(&admin), b.appliance(&admin)];
    let token = nodes[0].admin_token().await;
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let come_back = Arc::new(AtomicUsize::new(0));
    let other = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..8 {
        let rpc = nodes[w % 2].rpc_json(&token);
        let (acknowledged, come_back, other, stop) = (
            acknowledged.clone(),
            come_back.clone(),
            other.clone(),
            stop.clone(),
        );
        writers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(SeqCst) {
                let tenant = format!("w{w}-{i}");
                let put = rpc
                    .put_tenant(pb::PutTenantRequest {
                        tenant_id: tenant.clone(),
                        edition: "team".into(),
                        ..Default::default()
                    })
                    .await;
                match put {
                    Ok(_) => acknowledged.lock().unwrap().push(tenant),
                    Err(e) if common::told_to_come_back(&e) => {
                        come_back.fetch_add(1, SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => other.lock().unwrap().push(format!("{tenant}: {e}")),
                }
                i += 1;
            }
        }));
    }
    let count = || acknowledged.lock().unwrap().len();
    // `pg_ctl restart -m fast`; then a crash and a start 4 s later, as a
    // failover's pause.
    for (mode, down) in [
        (Shutdown::Fast, Duration::ZERO),
        (Shutdown::Immediate, Duration::from_secs(4)),
    ] {
        let runs = [
            site.submit("triage-slow-write").await,
            site.submit("triage-slow-write").await,
            site.submit("triage-slow-write").await,
        ];
        for run in &runs {
            site.until(run, "WaitingForTool").await;
        }
        let (before, told_before) = (count(), come_back.load(SeqCst));
        let took = tokio::task::block_in_place(|| cluster.restart(mode, down));
        let deadline = Instant::now() + Duration::from_secs(30);
        while count() < before + 40 {
            assert!(
                Instant::now() < deadline,
                "writes did not resume after the {mode:?} restart: {} acknowledged\n{}",
                count(),
                a.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for run in &runs {
            let done = site.until(run, "Succeeded").await;
            assert_eq!(done.state, "Succeeded", "{done:?}");
            assert_eq!(done.steps[0].attempts.len(), 1, "one attempt: {done:?}");
            let t = site.timeline(&done.steps[0].attempts[0].attempt_id).await;
            let pages = crate::builtin::calls_to(&t, "page-oncall");
            assert_eq!(pages.len(), 1, "the tool ran once: {t}");
            assert_eq!(pages[0]["status"], "completed", "{t}");
        }
        eprintln!(
            "postgres restart ({mode:?}): down {:.2} s; {} writes acknowledged before, {} after; {} requests told to come back",
            took.as_secs_f64(),
            before,
            count() - before,
            come_back.load(SeqCst) - told_before
        );
    }
    stop.store(true, SeqCst);
    for w in writers {
        w.await.unwrap();
    }
    let other = other.lock().unwrap().clone();
    assert!(
        other.is_empty(),
        "refusals that did not say to come back: {other:?}"
    );

    // The same appliance, with the same epoch: it never stood down.
    let (status, after) = a.readyz().await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(after["role"], "active", "{after}");
    assert_eq!(after["leader"]["epoch"], epoch, "{after}");
    let (_, standby) = b.readyz().await;
    assert_eq!(standby["role"], "standby", "{standby}");
    assert!(a.log().contains("PostgreSQL answers again"), "{}", a.log());
    assert!(!a.log().contains("stops acting"), "{}", a.log());
    let held = tenants(&nodes[0]).await;
    for t in acknowledged.lock().unwrap().iter() {
        assert!(held.contains(t), "{t} was acknowledged and is gone");
    }
    drop((a, b));
}

/// Waits until an appliance on the PostgreSQL store serves as the active
/// one (its runtime file is written when it stands by too).
async fn wait_until_active(a: &Appliance) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = a.http().get(format!("{}/readyz", a.url)).send().await.ok();
        if let Some(r) = r
            && r.status() == 200
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the appliance did not become active: {}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_moves_between_sled_and_postgres_verified_and_backups_restore_across() {
    let cluster = PgCluster::shared();
    let db = cluster.database();
    let mut first = Appliance::start();
    for t in ["m1", "m2", "m3"] {
        first.ensure_tenant(t).await;
    }
    assert!(first.terminate().await.success());
    let pg = |url: &str| {
        vec![
            (
                "AGENTBAY_STORE__BACKEND".to_string(),
                "postgres".to_string(),
            ),
            ("AGENTBAY_STORE__POSTGRES__URL".to_string(), url.to_string()),
        ]
    };

    // sled -> PostgreSQL, verified table by table: the PostgreSQL store
    // needs a pair key, which `cluster init` makes.
    let out = common::run(
        common::agentbay()
            .args(["cluster", "init", "--data-dir"])
            .arg(&first.data_dir),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = common::run(
        common::agentbay()
            .args([
                "store",
                "migrate",
                "--to",
                "postgres",
                "--json",
                "--data-dir",
            ])
            .arg(&first.data_dir)
            .env("AGENTBAY_STORE__POSTGRES__URL", &db),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tenants_copied = report["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["table"] == "tenants")
        .unwrap()
        .clone();
    assert!(tenants_copied["records"].as_u64().unwrap() >= 4, "{report}");
    assert!(
        tenants_copied["sha256"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    // A store is there now: a second move into it is refused.
    let again = common::run(
        common::agentbay()
            .args(["store", "migrate", "--to", "postgres", "--data-dir"])
            .arg(&first.data_dir)
            .env("AGENTBAY_STORE__POSTGRES__URL", &db),
    );
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already holds records"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    // The appliance on PostgreSQL has everything; a backup of it...
    let env = pg(&db);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut on_pg =
        Appliance::serve_with(&first.root, &first.data_dir, first.admin.clone(), &[], &env);
    wait_until_active(&on_pg).await;
    let held = tenants(&on_pg).await;
    for t in ["m1", "m2", "m3"] {
        assert!(held.contains(&t.to_string()), "{t}: {held:?}");
    }
    on_pg.ensure_tenant("m4").await;
    let backup = first.root.join("from-postgres.backup");
    let out = common::run(
        common::agentbay()
            .arg("backup")
            .arg(&backup)
            .arg("--data-dir")
            .arg(&first.data_dir),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(on_pg.terminate().await.success());

    // ...restores into another, empty PostgreSQL store.
    let db2 = cluster.database();
    let restored = first.root.join("restored");
    let out = common::run(
        common::agentbay()
            .arg("restore")
            .arg(&backup)
            .arg("--data-dir")
            .arg(&restored)
            .envs(pg(&db2)),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    assert!(
        restored
            .join(agentbay::store::datadir::PAIR_KEY_FILE)
            .exists(),
        "the backup carries the pair key"
    );

    // PostgreSQL -> sled, into the restored data directory, which holds
    // no sled store.
    let out = common::run(
        common::agentbay()
            .args(["store", "migrate", "--to", "sled", "--data-dir"])
            .arg(&restored)
            .envs(pg(&db2)),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("read back"));
    let mut back_on_sled =
        Appliance::serve_with(&first.root, &restored, first.admin.clone(), &[], &[]);
    let held = tenants(&back_on_sled).await;
    for t in ["m1", "m2", "m3", "m4"] {
        assert!(held.contains(&t.to_string()), "{t}: {held:?}");
    }
    assert!(back_on_sled.terminate().await.success());
}

#[tokio::test]
async fn a_hung_active_appliance_is_replaced_and_commits_nothing_when_it_wakes() {
    let cluster = PgCluster::shared();
    let db = cluster.database();
    let tmp = tempfile::tempdir().unwrap();
    let mut a = Node::new("a", tmp.path(), &db);
    let mut b = Node::new("b", tmp.path(), &db);
    let (admin, first) = start_pair(&mut a, &mut b).await;
    let via_b = b.appliance(&admin);
    via_b.ensure_tenant("before-the-hang").await;

    // SIGSTOP: a keeps its connections and its sessions, and renews nothing.
    let pid = a.child.as_ref().unwrap().id().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let hung = Instant::now();
    let active = b
        .wait_for_role("active", Duration::from_secs(LEASE_SECONDS + 12))
        .await;
    eprintln!("takeover from a hung appliance: {:?}", hung.elapsed());
    assert!(
        active["leader"]["epoch"].as_i64() > first["leader"]["epoch"].as_i64(),
        "{active}"
    );
    via_b.ensure_tenant("during-the-hang").await;

    // Woken, a finds its lease gone: it stops acting and stands by.
    assert!(
        std::process::Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let standby = a.wait_for_role("standby", Duration::from_secs(40)).await;
    assert_eq!(standby["active"]["node"], "b", "{standby}");
    let held = tenants(&via_b).await;
    for t in ["before-the-hang", "during-the-hang"] {
        assert!(held.contains(&t.to_string()), "{t}: {held:?}");
    }
    let (status, body) = b.readyz().await;
    assert_eq!(
        (status, body["role"].as_str()),
        (200, Some("active")),
        "{body}"
    );
}
