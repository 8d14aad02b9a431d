//! Helpers shared by the integration tests: the real binary on an
//! ephemeral port with a temporary data directory, and HTTPS clients that
//! pin its generated certificate.

#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use agentbay::control::{Transport, pinned_transport};
use agentbay::proto::agentbay::admin::v1 as pb;
use agentbay::proto::agentbay::capacity::v1 as capacity_pb;
use agentbay::store::datadir::RuntimeInfo;
use connectrpc::client::ClientConfig;
use connectrpc::{CodecFormat, Protocol};
use serde_json::Value;

/// The binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_agentbay")
}

/// A command for the binary with no AGENTBAY_* from the test environment.
pub fn agentbay() -> Command {
    let mut cmd = Command::new(binary());
    for (key, _) in std::env::vars() {
        if key.starts_with("AGENTBAY_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("AGENTBAY_LOG__FORMAT", "json");
    if let Ok(level) = std::env::var("TEST_APPLIANCE_LOG") {
        cmd.env("AGENTBAY_LOG__LEVEL", level);
    }
    cmd
}

/// Runs a command to completion.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("the binary runs")
}

/// A client id and its secret.
#[derive(Clone, Debug)]
pub struct Credential {
    pub id: String,
    pub secret: String,
}

/// The demo publisher key the tests sign demo releases with: every data
/// directory [`init`] makes holds it as its own demo key (where an
/// appliance would make one at its first start).
pub fn test_demo_key() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/keys/demo-publisher.key")
}

/// The example release `name` of `packaging/examples/releases`, signed
/// with [`test_demo_key`]: the examples ship unsigned (an appliance signs
/// them with its own demo key as it seeds them), so the tests sign a copy
/// once per test process, as a developer would.
pub fn signed_example(name: &str) -> PathBuf {
    static ROOT: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let root = ROOT.get_or_init(|| {
        let root = tempfile::tempdir().unwrap();
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/examples/releases");
        for entry in std::fs::read_dir(&examples).unwrap() {
            let entry = entry.unwrap();
            let dir = root.path().join(entry.file_name());
            copy_tree(&entry.path(), &dir);
            let out = run(agentbay()
                .args(["release", "sign"])
                .arg(&dir)
                .arg("--key")
                .arg(test_demo_key()));
            assert!(
                out.status.success(),
                "signing the example {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        root
    });
    let dir = root.path().join(name);
    assert!(dir.is_dir(), "no example release {name}");
    dir
}

/// Copies the directory tree `from` to `to`.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Initialises `data_dir` and returns the bootstrap credential.
pub fn init(data_dir: &Path) -> Credential {
    let out = run(agentbay()
        .args(["init", "--json", "--data-dir"])
        .arg(data_dir));
    assert!(
        out.status.success(),
        "init failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = data_dir.join(agentbay::releases::signing::DEMO_KEY_FILE);
    std::fs::create_dir_all(key.parent().unwrap()).unwrap();
    std::fs::copy(test_demo_key(), &key).unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).expect("init --json prints JSON");
    Credential {
        id: v["client_id"].as_str().unwrap().to_string(),
        secret: v["client_secret"].as_str().unwrap().to_string(),
    }
}

/// A running appliance.
pub struct Appliance {
    pub root: PathBuf,
    pub data_dir: PathBuf,
    pub child: Option<Child>,
    pub url: String,
    pub fingerprint: String,
    pub admin: Credential,
    args: Vec<String>,
    env: Vec<(String, String)>,
    _tmp: Option<tempfile::TempDir>,
}

impl Appliance {
    /// A new data directory, initialised, served.
    pub fn start() -> Appliance {
        Appliance::start_with(&[], &[])
    }

    /// A new appliance on a manual clock (moved with [`Appliance::advance`]).
    pub fn start_manual_clock() -> Appliance {
        Appliance::start_with(&["--manual-clock"], &[])
    }

    /// A new appliance with extra `serve` arguments and environment.
    pub fn start_with(args: &[&str], env: &[(&str, &str)]) -> Appliance {
        let tmp = tempfile::tempdir().unwrap();
        let data_dir = tmp.path().join("data");
        let admin = init(&data_dir);
        let child = spawn_serve_with(tmp.path(), &data_dir, args, env);
        let info = wait_for_runtime_info(&data_dir, child.id());
        Appliance {
            root: tmp.path().to_path_buf(),
            data_dir,
            child: Some(child),
            url: info.url,
            fingerprint: info.certificate_fingerprint,
            admin,
            args: args.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            _tmp: Some(tmp),
        }
    }

    /// Serves an existing data directory with extra arguments and
    /// environment.
    pub fn serve_with(
        root: &Path,
        data_dir: &Path,
        admin: Credential,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Appliance {
        let child = spawn_serve_with(root, data_dir, args, env);
        let info = wait_for_runtime_info(data_dir, child.id());
        Appliance {
            root: root.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            child: Some(child),
            url: info.url,
            fingerprint: info.certificate_fingerprint,
            admin,
            args: args.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            _tmp: None,
        }
    }

    /// An appliance another helper runs, reached at `url`: this value
    /// neither starts nor stops it.
    pub fn remote(url: &str, fingerprint: &str, admin: Credential) -> Appliance {
        Appliance {
            root: PathBuf::new(),
            data_dir: PathBuf::new(),
            child: None,
            url: url.to_string(),
            fingerprint: fingerprint.to_string(),
            admin,
            args: Vec::new(),
            env: Vec::new(),
            _tmp: None,
        }
    }

    /// Serves an existing data directory.
    pub fn serve(root: &Path, data_dir: &Path, admin: Credential) -> Appliance {
        let child = spawn_serve(root, data_dir, &[]);
        let info = wait_for_runtime_info(data_dir, child.id());
        Appliance {
            root: root.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            child: Some(child),
            url: info.url,
            fingerprint: info.certificate_fingerprint,
            admin,
            args: Vec::new(),
            env: Vec::new(),
            _tmp: None,
        }
    }

    /// Kills the process with SIGKILL: no shutdown path runs.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Sends SIGTERM and waits for the exit.
    pub async fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the appliance did not stop after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Restarts with other environment (after a kill or a stop).
    pub fn restart_with_env(&mut self, env: &[(&str, &str)]) {
        self.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.restart();
    }

    /// Restarts on the same data directory (after a kill or a stop).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop it first");
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let child = spawn_serve_with(&self.root, &self.data_dir, &args, &env);
        let info = wait_for_runtime_info(&self.data_dir, child.id());
        self.url = info.url;
        self.fingerprint = info.certificate_fingerprint;
        self.child = Some(child);
    }

    /// What the appliance printed on its standard output so far (the
    /// start banner).
    pub fn banner(&self) -> String {
        std::fs::read_to_string(self.root.join("serve.out")).unwrap_or_default()
    }

    /// The appliance's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("serve.err")).unwrap_or_default()
    }

    /// An HTTPS client that trusts exactly this appliance's certificate.
    pub fn http(&self) -> reqwest::Client {
        https_client(&self.fingerprint)
    }

    /// A bearer token for a credential.
    pub async fn token(&self, credential: &Credential) -> String {
        token(&self.http(), &self.url, credential).await
    }

    /// A token of the bootstrap PlatformAdmin.
    pub async fn admin_token(&self) -> String {
        self.token(&self.admin.clone()).await
    }

    /// An Admin RPC client with the given codec and protocol.
    pub fn rpc_with(
        &self,
        token: &str,
        codec: CodecFormat,
        protocol: Protocol,
    ) -> pb::AdminClient<Transport> {
        let config = ClientConfig::new(self.url.parse().unwrap())
            .with_codec_format(codec)
            .with_protocol(protocol)
            .with_default_header("authorization", format!("Bearer {token}"));
        pb::AdminClient::new(pinned_transport(&self.fingerprint), config)
    }

    /// An Admin RPC client speaking Connect with JSON.
    pub fn rpc_json(&self, token: &str) -> pb::AdminClient<Transport> {
        self.rpc_with(token, CodecFormat::Json, Protocol::Connect)
    }

    /// An Admin RPC client speaking Connect with binary protobuf.
    pub fn rpc_proto(&self, token: &str) -> pb::AdminClient<Transport> {
        self.rpc_with(token, CodecFormat::Proto, Protocol::Connect)
    }

    /// Registers a tenant (team edition, any region) if it is not yet.
    pub async fn ensure_tenant(&self, tenant: &str) {
        let token = self.admin_token().await;
        let rpc = self.rpc_json(&token);
        let known = rpc
            .list_tenants(pb::ListTenantsRequest::default())
            .await
            .expect("list tenants")
            .into_owned();
        if known.tenants.iter().any(|t| t.tenant_id == tenant) {
            return;
        }
        rpc.put_tenant(pb::PutTenantRequest {
            tenant_id: tenant.into(),
            edition: "team".into(),
            ..Default::default()
        })
        .await
        .expect("register tenant");
    }

    /// Creates a client credential through the RPC and returns it,
    /// registering its tenant first.
    pub async fn create_client(&self, tenant: &str, scopes: &[&str]) -> Credential {
        self.ensure_tenant(tenant).await;
        let token = self.admin_token().await;
        let response = self
            .rpc_json(&token)
            .create_client(pb::CreateClientRequest {
                tenant_id: tenant.into(),
                scopes: scopes.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            })
            .await
            .expect("create client")
            .into_owned();
        Credential {
            id: response.client.as_option().unwrap().client_id.clone(),
            secret: response.client_secret,
        }
    }
}

impl Appliance {
    /// A Capacity RPC client.
    pub fn capacity(&self, token: &str) -> capacity_pb::CapacityClient<Transport> {
        let config = ClientConfig::new(self.url.parse().unwrap())
            .with_codec_format(CodecFormat::Json)
            .with_default_header("authorization", format!("Bearer {token}"));
        capacity_pb::CapacityClient::new(pinned_transport(&self.fingerprint), config)
    }

    /// GET a JSON document, expecting 200.
    pub async fn get(&self, token: &str, path: &str) -> Value {
        let r = self
            .http()
            .get(format!("{}{path}", self.url))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// The `/metrics` page, as the appliance's administrator reads it.
    pub async fn metrics(&self) -> String {
        let admin = self.admin_token().await;
        self.http()
            .get(format!("{}/metrics", self.url))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// PUT a JSON body; the status and the JSON answer.
    /// Sets the default `agents` pool (shared, this host's region, small
    /// slots) to `max_size` slots, for a load that needs more than the
    /// host-sized default.
    pub async fn size_agents_pool(&self, max_size: u32) {
        let admin = self.admin_token().await;
        let (status, body) = self
            .put(
                &admin,
                "/factory/capacity/pools/agents",
                serde_json::json!({"kind": "agent-runtime", "securityBoundary": "shared",
                       "region": "local", "nodeProfile": "small", "minSize": 1, "maxSize": max_size}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    pub async fn put(&self, token: &str, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http()
            .put(format!("{}{path}", self.url))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Runs one pass of a worker and waits for it.
    pub async fn run_worker(&self, name: &str) -> pb::RunWorkerResponse {
        let token = self.admin_token().await;
        self.rpc_json(&token)
            .run_worker(pb::RunWorkerRequest {
                name: name.into(),
                ..Default::default()
            })
            .await
            .expect("run worker")
            .into_owned()
    }

    /// Moves a manual clock forward.
    pub async fn advance(&self, seconds: u64) {
        let token = self.admin_token().await;
        self.rpc_json(&token)
            .advance_clock(pb::AdvanceClockRequest {
                seconds,
                ..Default::default()
            })
            .await
            .expect("advance the clock");
    }

    /// Registers a tenant with an edition, residency and projects, and
    /// returns a credential with every scope a workspace needs.
    pub async fn tenant(
        &self,
        tenant: &str,
        edition: &str,
        regions: &[&str],
        projects: &[&str],
    ) -> Credential {
        let token = self.admin_token().await;
        let rpc = self.rpc_json(&token);
        rpc.put_tenant(pb::PutTenantRequest {
            tenant_id: tenant.into(),
            edition: edition.into(),
            residency_regions: regions.iter().map(|r| r.to_string()).collect(),
            ..Default::default()
        })
        .await
        .expect("register tenant");
        for p in projects {
            rpc.put_project(pb::PutProjectRequest {
                tenant_id: tenant.into(),
                project_id: p.to_string(),
                ..Default::default()
            })
            .await
            .expect("register project");
        }
        self.create_client(
            tenant,
            &[
                "factory.capacity.lease",
                "factory.capacity.read",
                "factory.capacity.admin",
                "agentbay.admin",
                "agentbay.events.read",
                "factory.assets.read",
                "factory.assets.admin",
            ],
        )
        .await
    }
}

impl Drop for Appliance {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `serve` on an ephemeral port with output to files under `root`.
pub fn spawn_serve(root: &Path, data_dir: &Path, extra_env: &[(&str, &str)]) -> Child {
    spawn_serve_with(root, data_dir, &[], extra_env)
}

/// [`spawn_serve`] with extra arguments.
pub fn spawn_serve_with(
    root: &Path,
    data_dir: &Path,
    args: &[&str],
    extra_env: &[(&str, &str)],
) -> Child {
    let out = File::options()
        .create(true)
        .append(true)
        .open(root.join("serve.out"))
        .unwrap();
    let err = File::options()
        .create(true)
        .append(true)
        .open(root.join("serve.err"))
        .unwrap();
    let mut cmd = agentbay();
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    // Tests build their own tenants; the demo is tested on its own.
    cmd.env("AGENTBAY_DEMO__ENABLED", "false");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    if let Some(account) = unprivileged_account() {
        as_unprivileged(&mut cmd, root, data_dir, &account);
    }
    cmd.spawn().expect("serve starts")
}

/// The account the appliances of this test run serve as, as the package
/// runs them (`AGENTBAY_TEST_AS`: an unprivileged account; unset: the
/// account the tests run as).
pub fn unprivileged_account() -> Option<String> {
    std::env::var("AGENTBAY_TEST_AS")
        .ok()
        .filter(|a| !a.is_empty())
}

/// Makes `cmd` serve as `account`, inside a cgroup subtree delegated to
/// it, the way systemd's `Delegate=` hands one to the packaged service:
/// on a v2-only host a group of the tests' own group with its controllers
/// enabled, on a v1 host a group under each controller's hierarchy; both
/// given to the account. The data directory is the account's too.
fn as_unprivileged(cmd: &mut Command, root: &Path, data_dir: &Path, account: &str) {
    use std::os::unix::process::CommandExt;
    let (uid, gid) = account_ids(account);
    // The account passes through the tests' temporary directory to its
    // own data directory (the tests read it as root).
    std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    chown_tree(data_dir, uid, gid);
    let procs = delegate_cgroups(root, uid, gid);
    let procs: Vec<std::ffi::CString> = procs
        .iter()
        .map(|p| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap())
        .collect();
    // SAFETY: between fork and exec only system calls on data prepared
    // here (open, write, close, setgroups, setgid, setuid).
    unsafe {
        cmd.pre_exec(move || {
            for p in &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
            }
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn account_ids(account: &str) -> (libc::uid_t, libc::gid_t) {
    let name = std::ffi::CString::new(account).unwrap();
    // SAFETY: getpwnam's answer is read at once.
    unsafe {
        let pw = libc::getpwnam(name.as_ptr());
        assert!(
            !pw.is_null(),
            "AGENTBAY_TEST_AS={account} is not an account here"
        );
        ((*pw).pw_uid, (*pw).pw_gid)
    }
}

/// Gives the tree at `path` to the account the appliances serve as, when
/// that is not the tests' own (`AGENTBAY_TEST_AS`): what a site makes
/// readable to the packaged service is the service account's to read.
pub fn hand_to_appliance(path: &Path) {
    if let Some(account) = unprivileged_account() {
        let (uid, gid) = account_ids(&account);
        chown_tree(path, uid, gid);
    }
}

fn chown_tree(path: &Path, uid: libc::uid_t, gid: libc::gid_t) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
    if path.is_dir() && !path.is_symlink() {
        for e in std::fs::read_dir(path).unwrap().flatten() {
            chown_tree(&e.path(), uid, gid);
        }
    }
}

/// The `cgroup.procs` files of a group made for one appliance and given to
/// the account (its directory and the files it writes to add processes
/// and children), one per hierarchy.
fn delegate_cgroups(root: &Path, uid: libc::uid_t, gid: libc::gid_t) -> Vec<PathBuf> {
    let name = format!(
        "agentbay-test-{}",
        root.file_name()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches('.')
    );
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut v1: Vec<(String, PathBuf)> = Vec::new();
    let mut v2 = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let point = PathBuf::from(left.split(' ').nth(4).unwrap());
        let mut r = right.split(' ');
        match (r.next(), r.nth(1)) {
            (Some("cgroup2"), _) => v2 = Some(point),
            (Some("cgroup"), Some(options)) => {
                for o in options.split(',') {
                    if ["cpu", "cpuacct", "memory", "pids"].contains(&o) {
                        v1.push((o.to_string(), point.clone()));
                    }
                }
            }
            _ => {}
        }
    }
    let own_path = |controller: &str| -> String {
        own.lines()
            .find_map(|l| {
                let mut p = l.splitn(3, ':');
                let _ = p.next();
                let cs = p.next()?;
                let path = p.next()?;
                (cs.split(',').any(|c| c == controller)).then(|| path.to_string())
            })
            .unwrap_or_else(|| "/".into())
    };
    let give = |dir: &Path| {
        std::fs::create_dir_all(dir).unwrap();
        for f in ["", "cgroup.procs", "tasks", "cgroup.subtree_control"] {
            let p = if f.is_empty() {
                dir.to_path_buf()
            } else {
                dir.join(f)
            };
            if p.exists() {
                std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
            }
        }
        dir.join("cgroup.procs")
    };
    let mut procs = Vec::new();
    if v1.is_empty() {
        let mount = v2.expect("a cgroup hierarchy");
        let base = mount.join(own_path("").trim_start_matches('/'));
        // Its controllers for its children, as systemd enables them for a
        // delegated unit.
        // A group that holds processes cannot give controllers to its
        // children: the appliance's group then goes beside the tests'
        // own, under their parent, whose controllers the tests' group has.
        let dir =
            if std::fs::write(base.join("cgroup.subtree_control"), "+cpu +memory +pids").is_ok() {
                base.join(&name)
            } else {
                base.parent().unwrap_or(&base).join(&name)
            };
        procs.push(give(&dir));
    } else {
        let mut seen: Vec<PathBuf> = Vec::new();
        for (controller, mount) in &v1 {
            if seen.contains(mount) {
                continue;
            }
            seen.push(mount.clone());
            let dir = mount
                .join(own_path(controller).trim_start_matches('/'))
                .join(&name);
            procs.push(give(&dir));
        }
    }
    procs
}

/// Waits until the process `pid` has written where it listens.
pub fn wait_for_runtime_info(data_dir: &Path, pid: u32) -> RuntimeInfo {
    let path = data_dir.join("run/appliance.json");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(bytes) = std::fs::read(&path)
            && let Ok(info) = serde_json::from_slice::<RuntimeInfo>(&bytes)
            && info.pid == pid
        {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "the appliance did not start within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A bearer token for a credential from the appliance at `url`.
pub async fn token(http: &reqwest::Client, url: &str, credential: &Credential) -> String {
    let response = http
        .post(format!("{url}/oauth/token"))
        .basic_auth(&credential.id, Some(&credential.secret))
        .form(&[("grant_type", "client_credentials")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "token request failed");
    let body: Value = response.json().await.unwrap();
    body["access_token"].as_str().unwrap().to_string()
}

/// An HTTPS client pinned to a certificate fingerprint.
/// Whether the appliance answered "come back" (Unavailable with
/// Retry-After): nothing was done, and the same call may be made again.
pub fn told_to_come_back(e: &connectrpc::ConnectError) -> bool {
    e.code == connectrpc::ErrorCode::Unavailable && e.response_headers().contains_key("retry-after")
}

pub fn https_client(fingerprint: &str) -> reqwest::Client {
    https_client_builder(fingerprint, None).build().unwrap()
}

/// An HTTPS client pinned to a certificate fingerprint that does not follow
/// redirects, connecting from a given loopback address (127.0.0.2, …:
/// another source to the appliance) or the default one.
pub fn https_client_at(fingerprint: &str, source: Option<&str>) -> reqwest::Client {
    https_client_builder(fingerprint, source)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn https_client_builder(fingerprint: &str, source: Option<&str>) -> reqwest::ClientBuilder {
    let mut tls = agentbay::tls::pinned_client_config(fingerprint);
    // HTTP/2 when the server offers it, as browsers and agents do.
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .local_address(source.map(|s| s.parse::<std::net::IpAddr>().unwrap()))
}

/// The payloads of the first `n` events of a topic, from the start.
pub async fn events(a: &Appliance, token: &str, topic: &str, n: usize) -> Vec<Value> {
    let mut stream = a
        .rpc_json(token)
        .watch_events(pb::WatchEventsRequest {
            topics: vec![topic.into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let e = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .unwrap_or_else(|_| panic!("{n} {topic} events within 10 s; got {}", out.len()))
            .unwrap()
            .unwrap()
            .to_owned_message();
        out.push(serde_json::to_value(e.payload.as_option().unwrap()).unwrap());
    }
    out
}

/// Reads a problem+json response, checking its content type.
pub async fn problem(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    assert_eq!(content_type, "application/problem+json", "status {status}");
    (status, response.json().await.unwrap())
}

/// A file of the npm package installed under `dir` (relative to the crate):
/// `.ci/run` installs the packages, and the first test that needs one does
/// when it is missing (`npm ci`, one installer at a time across test
/// processes).
pub fn npm_package(dir: &str, file: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let path = dir.join(file);
    if !path.exists() {
        let lock = dir.join(".installing");
        if std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
            .is_ok()
        {
            let status = Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--prefix"])
                .arg(&dir)
                .status();
            let _ = std::fs::remove_file(&lock);
            assert!(
                status.is_ok_and(|s| s.success()),
                "installing the npm packages failed: npm ci --prefix {}",
                dir.display()
            );
        }
        for _ in 0..1200 {
            if path.exists() && !lock.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    assert!(
        path.exists(),
        "{} is missing: npm ci --prefix {}",
        path.display(),
        dir.display()
    );
    path
}

/// The schemathesis command line (`st`), pinned by
/// `tests/contract/requirements.txt`: `$SCHEMATHESIS` when set, else a
/// virtual environment under the target directory that the first test to
/// need it makes (`python3 -m venv` and `pip install`, one installer at a
/// time across test processes; again when the pins change).
pub fn schemathesis() -> PathBuf {
    if let Ok(st) = std::env::var("SCHEMATHESIS") {
        return PathBuf::from(st);
    }
    let pins = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/contract/requirements.txt");
    let wanted = std::fs::read_to_string(&pins).expect("tests/contract/requirements.txt");
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("schemathesis");
    let st = venv.join(if cfg!(windows) {
        "Scripts/st.exe"
    } else {
        "bin/st"
    });
    let installed = venv.join("requirements.txt");
    let current = || std::fs::read_to_string(&installed).ok().as_deref() == Some(wanted.as_str());
    if !current() {
        let lock = Path::new(env!("CARGO_TARGET_TMPDIR")).join("schemathesis.installing");
        if std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
            .is_ok()
        {
            let _ = std::fs::remove_dir_all(&venv);
            let made = Command::new("python3")
                .arg("-m")
                .arg("venv")
                .arg(&venv)
                .status();
            let pip = venv.join(if cfg!(windows) {
                "Scripts/pip.exe"
            } else {
                "bin/pip"
            });
            let status = made.and_then(|made| {
                assert!(
                    made.success(),
                    "python3 -m venv {} failed (Debian: apt-get install -y python3-venv)",
                    venv.display()
                );
                Command::new(&pip)
                    .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
                    .arg(&pins)
                    .status()
            });
            let ok = status.is_ok_and(|s| s.success());
            if ok {
                std::fs::write(&installed, &wanted).expect("record the installed pins");
            }
            let _ = std::fs::remove_file(&lock);
            assert!(
                ok,
                "installing schemathesis failed: pip install -r {}",
                pins.display()
            );
        }
        for _ in 0..3000 {
            if current() && !lock.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    assert!(st.exists(), "{} is missing", st.display());
    st
}

/// The value of one series in a `/metrics` page, `series` written as the
/// page writes it (`name{label="value",...}`, labels in its order); `None`
/// when the page has no such line.
pub fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
