//! Failover time of an active/standby pair on PostgreSQL: the active
//! appliance is killed (kill -9) again and again, and each time the time
//! until the standby answers `/readyz` as the ready active appliance is
//! measured; the killed one is started again and stands by for the next
//! round. Prints p50 and max.
//!
//! `cargo bench --bench failover`; `AGENTBAY_BENCH_KILLS` sets the number
//! of kills (default 20), `AGENTBAY_BENCH_LEASE` the lease in seconds
//! (default 10, the packaged default), `AGENTBAY_BIN` the binary (default
//! target/release/agentbay). Needs a PostgreSQL server installed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

struct Node {
    name: &'static str,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    fingerprint: String,
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn binary() -> String {
    std::env::var("AGENTBAY_BIN").unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/release/agentbay")
            .display()
            .to_string()
    })
}

/// The binary, with none of the bench's own `AGENTBAY_` settings.
fn agentbay_command() -> Command {
    let mut cmd = Command::new(binary());
    for (key, _) in std::env::vars() {
        if key.starts_with("AGENTBAY_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

impl Node {
    fn new(name: &'static str, root: &Path) -> Node {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Node {
            name,
            dir: root.join(name),
            port,
            child: None,
            fingerprint: String::new(),
        }
    }

    fn start(&mut self, db: &str, lease: u64) {
        std::fs::create_dir_all(&self.dir).unwrap();
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("serve.err"))
            .unwrap();
        let child = agentbay_command()
            .args(["serve", "--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .env("AGENTBAY_DEMO__ENABLED", "false")
            .env("AGENTBAY_STORE__BACKEND", "postgres")
            .env("AGENTBAY_STORE__POSTGRES__URL", db)
            .env("AGENTBAY_STORE__POSTGRES__NODE_NAME", self.name)
            .env(
                "AGENTBAY_STORE__POSTGRES__ADVERTISE_URL",
                format!("https://127.0.0.1:{}", self.port),
            )
            .env("AGENTBAY_STORE__POSTGRES__LEASE_SECONDS", lease.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (set AGENTBAY_BIN)", binary()));
        let info = self.dir.join("data/run/appliance.json");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(bytes) = std::fs::read(&info)
                && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes)
                && v["pid"] == child.id()
            {
                self.fingerprint = v["certificateFingerprint"].as_str().unwrap().to_string();
                break;
            }
            assert!(Instant::now() < deadline, "{} did not start", self.name);
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Its role when `/readyz` answers: `active` only when ready.
    async fn role(&self, http: &reqwest::Client) -> Option<String> {
        let r = http
            .get(format!("https://127.0.0.1:{}/readyz", self.port))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?;
        let ready = r.status() == 200;
        let body: serde_json::Value = r.json().await.ok()?;
        let role = body["role"].as_str()?.to_string();
        (role != "active" || ready).then_some(role)
    }

    fn client(&self) -> reqwest::Client {
        let mut tls = agentbay::tls::pinned_client_config(&self.fingerprint);
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .build()
            .unwrap()
    }

    async fn wait_for(&self, role: &str) -> Duration {
        let http = self.client();
        let start = Instant::now();
        loop {
            if self.role(&http).await.as_deref() == Some(role) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{} did not become {role}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn main() {
    agentbay::tls::install_crypto_provider();
    let Some(cluster) = common::postgres() else {
        return;
    };
    let kills = env_number("AGENTBAY_BENCH_KILLS", 20);
    let lease = env_number("AGENTBAY_BENCH_LEASE", 10);
    let db = cluster.database();
    let root = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut nodes = [Node::new("a", root.path()), Node::new("b", root.path())];
    // The pair's key, made on one and copied to the other.
    let made = agentbay_command()
        .args(["cluster", "init", "--data-dir"])
        .arg(nodes[0].dir.join("data"))
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "cluster init: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let key = agentbay::store::datadir::PAIR_KEY_FILE;
    std::fs::create_dir_all(nodes[1].dir.join("data")).unwrap();
    std::fs::copy(
        nodes[0].dir.join("data").join(key),
        nodes[1].dir.join("data").join(key),
    )
    .unwrap();
    nodes[0].start(&db, lease);
    runtime.block_on(nodes[0].wait_for("active"));
    nodes[1].start(&db, lease);
    runtime.block_on(nodes[1].wait_for("standby"));
    let mut times = Vec::new();
    let mut active = 0;
    for _ in 0..kills {
        let standby = 1 - active;
        nodes[active].kill9();
        let took = runtime.block_on(nodes[standby].wait_for("active"));
        times.push(took);
        nodes[active].start(&db, lease);
        runtime.block_on(nodes[active].wait_for("standby"));
        active = standby;
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "failover after kill -9 of the active appliance, lease {lease} s, {kills} kills: p50 {:.0} ms, max {:.0} ms (min {:.0} ms)",
        ms(times[times.len() / 2]),
        ms(*times.last().unwrap()),
        ms(times[0])
    );
}
