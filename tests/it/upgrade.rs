//! Upgrades from every earlier store: `tests/fixtures/stores/schema-<n>.tar.gz`
//! holds a data directory as the agentbay of schema `n` wrote it (tenants,
//! runs in their states, attempts with checkpoints and calls, decisions,
//! leases, releases, events, artifacts). This build opens each: it backs
//! the store up as found, migrates it, serves it, and every record reads
//! back with its derived entries complete.
//!
//! The fixtures are written by [`generate_store_fixture`], run against the
//! binary of each schema version by `tests/fixtures/stores/generate.sh`; a
//! change that raises the schema version adds its fixture in the same
//! commit (the test fails until it does).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{self, Credential};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stores")
}

/// The key count of every non-empty tree of the sled store at `store`,
/// by tree name, read with sled alone (no agentbay code interprets it;
/// `open_sled` only reads whether the store was written compressed).
fn raw_trees(store: &Path) -> BTreeMap<String, usize> {
    let db = agentbay::store::open_sled(store, None).expect("sled opens");
    let mut out = BTreeMap::new();
    for name in db.tree_names() {
        let tree = db.open_tree(&name).unwrap();
        if !tree.is_empty() {
            out.insert(String::from_utf8_lossy(&name).into_owned(), tree.len());
        }
    }
    out
}

/// The schema version and last writer a store's meta tree records.
fn raw_meta(store: &Path) -> (u32, Option<String>) {
    let db = agentbay::store::open_sled(store, None).expect("sled opens");
    let meta = db.open_tree("meta").unwrap();
    let schema = u32::from_be_bytes(
        meta.get("schema_version")
            .unwrap()
            .expect("a schema version")
            .as_ref()
            .try_into()
            .unwrap(),
    );
    let writer = meta
        .get("agentbay_version")
        .unwrap()
        .map(|v| String::from_utf8_lossy(&v).into_owned());
    (schema, writer)
}

/// Whether a run's attempt waits for a person (an approval or an answer).
fn awaits_person(run: &Value) -> bool {
    run["steps"].as_array().into_iter().flatten().any(|step| {
        step["attempts"].as_array().into_iter().flatten().any(|a| {
            a["pendingDecisionId"]
                .as_str()
                .is_some_and(|d| !d.is_empty())
        })
    })
}

/// A command for `binary` with no AGENTBAY_* from the test's environment.
fn command(binary: &Path) -> Command {
    let mut cmd = Command::new(binary);
    for (key, _) in std::env::vars() {
        if key.starts_with("AGENTBAY_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// When a store was last written: the latest modification time of its
/// files (tar keeps them), a second on.
fn last_written(store: &Path) -> chrono::DateTime<chrono::Utc> {
    fn latest(dir: &Path) -> std::time::SystemTime {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    latest(&e.path())
                } else {
                    e.metadata().unwrap().modified().unwrap()
                }
            })
            .max()
            .unwrap_or(std::time::UNIX_EPOCH)
    }
    chrono::DateTime::<chrono::Utc>::from(latest(store)) + chrono::Duration::seconds(1)
}

/// A served appliance of any version: its process, address and pinned
/// client.
struct Served {
    child: Child,
    url: String,
    http: reqwest::Client,
}

impl Served {
    /// Serves `data_dir` with `binary` (demo as the binary's default)
    /// and waits until it says where it listens.
    fn start(binary: &Path, root: &Path, data_dir: &Path, args: &[&str]) -> Served {
        let log = std::fs::File::create(root.join("serve.log")).unwrap();
        let child = command(binary)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("serve starts");
        let info = common::wait_for_runtime_info(data_dir, child.id());
        Served {
            child,
            url: info.url,
            http: common::https_client(&info.certificate_fingerprint),
        }
    }

    async fn token(&self, credential: &Credential) -> String {
        common::token(&self.http, &self.url, credential).await
    }

    /// A Connect JSON call: the answer, or the error as text.
    async fn rpc(&self, token: &str, method: &str, body: Value) -> Result<Value, String> {
        let response = self
            .http
            .post(format!("{}/{method}", self.url))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            Ok(body)
        } else {
            Err(format!("{status}: {body}"))
        }
    }

    /// Every run of a tenant, by id.
    async fn runs(&self, token: &str, tenant: &str) -> BTreeMap<String, Value> {
        let mut out = BTreeMap::new();
        let mut page = String::new();
        loop {
            let mut request = json!({"tenantId": tenant, "pageSize": 100});
            if !page.is_empty() {
                request["pageToken"] = json!(page);
            }
            let answer = self
                .rpc(token, "agentbay.runs.v1.Runs/ListRuns", request)
                .await
                .unwrap_or_else(|e| panic!("listing the runs of {tenant}: {e}"));
            for run in answer["runs"].as_array().into_iter().flatten() {
                out.insert(run["runId"].as_str().unwrap().to_string(), run.clone());
            }
            match answer["nextPageToken"].as_str() {
                Some(next) if !next.is_empty() => page = next.to_string(),
                _ => return out,
            }
        }
    }

    /// SIGTERM, and the exit.
    fn stop(mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A test that fails leaves no appliance running.
impl Drop for Served {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Writes the fixture of the binary `AGENTBAY_FIXTURE_BIN` (default: this
/// build) into `tests/fixtures/stores/schema-<n>.tar.gz`, `n` being the
/// schema its store ends at. Drives the binary only through what every
/// version offers: `init --json`, its demo, the Connect JSON API and
/// SIGTERM; a step an older version lacks is skipped and said.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "writes a fixture; run by tests/fixtures/stores/generate.sh"]
async fn generate_store_fixture() {
    let binary = std::env::var_os("AGENTBAY_FIXTURE_BIN")
        .filter(|b| !b.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(common::binary()));
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("fixture");
    let data = root.join("data");
    std::fs::create_dir_all(&root).unwrap();
    let out = command(&binary)
        .args(["init", "--json", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let init: Value = serde_json::from_slice(&out.stdout).unwrap();
    let admin = Credential {
        id: init["client_id"].as_str().unwrap().into(),
        secret: init["client_secret"].as_str().unwrap().into(),
    };
    std::fs::write(
        root.join("credential.json"),
        serde_json::to_vec_pretty(&json!({"client_id": admin.id, "client_secret": admin.secret}))
            .unwrap(),
    )
    .unwrap();

    let a = Served::start(&binary, &root, &data, &[]);
    let token = a.token(&admin).await;
    let said = |step: &str, result: Result<Value, String>| match result {
        Ok(_) => println!("fixture: {step}"),
        Err(e) => println!("fixture: {step}: skipped ({e})"),
    };
    // The demo's runs reach the states they rest in: succeeded, waiting
    // for an approval, waiting for an answer, failed.
    let settled = |runs: &BTreeMap<String, Value>| {
        runs.len() >= 3
            && runs
                .values()
                .all(|r| r["state"] != "Running" || awaits_person(r))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut demo = a.runs(&token, "demo").await;
    while !settled(&demo) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        demo = a.runs(&token, "demo").await;
    }
    let release = demo
        .values()
        .find(|r| {
            r["releaseId"]
                .as_str()
                .is_some_and(|id| id.contains("triage"))
        })
        .or_else(|| demo.values().next())
        .map(|r| (r["releaseId"].clone(), r["projectId"].clone()))
        .expect("the demo submitted runs");

    // A tenant of its own, a client, and a project.
    said(
        "tenant acme",
        a.rpc(
            &token,
            "agentbay.admin.v1.Admin/PutTenant",
            json!({"tenantId": "acme", "displayName": "Acme", "edition": "team"}),
        )
        .await,
    );
    said(
        "project acme/web",
        a.rpc(
            &token,
            "agentbay.admin.v1.Admin/PutProject",
            json!({"tenantId": "acme", "projectId": "web", "displayName": "Web"}),
        )
        .await,
    );
    // Clients of the tenants, as their agents and people hold them: runs
    // are submitted and leases taken in a tenant's own name.
    let client = |tenant: &'static str, scopes: &'static [&'static str]| {
        let a = &a;
        let token = token.clone();
        async move {
            let made = a
                .rpc(
                    &token,
                    "agentbay.admin.v1.Admin/CreateClient",
                    json!({"tenantId": tenant, "scopes": scopes, "description": "fixture"}),
                )
                .await
                .unwrap_or_else(|e| panic!("a client of {tenant}: {e}"));
            let credential = Credential {
                id: made["client"]["clientId"].as_str().unwrap().into(),
                secret: made["clientSecret"].as_str().unwrap().into(),
            };
            a.token(&credential).await
        }
    };
    let acme = client("acme", &["factory.capacity.lease", "factory.capacity.read"]).await;
    let demo_token = client(
        "demo",
        &[
            "factory.runs.read",
            "factory.runs.write",
            "factory.runs.operate",
            "factory.runs.decide",
        ],
    )
    .await;
    // Leases: one held, one released.
    let acquire = |holder: &str| {
        json!({"tenantId": "acme", "projectId": "web", "holderKind": "sandbox",
               "holderId": holder, "cpu": 1.0, "memoryGb": 1.0})
    };
    let held = a
        .rpc(
            &acme,
            "agentbay.capacity.v1.Capacity/AcquireLease",
            acquire("held"),
        )
        .await;
    said("lease held", held);
    let released = a
        .rpc(
            &acme,
            "agentbay.capacity.v1.Capacity/AcquireLease",
            acquire("released"),
        )
        .await;
    if let Ok(lease) = &released {
        let id = lease["lease"]["leaseId"].clone();
        said(
            "lease released",
            a.rpc(
                &acme,
                "agentbay.capacity.v1.Capacity/ReleaseLease",
                json!({"leaseId": id}),
            )
            .await,
        );
    }
    // Runs a person ended or held.
    let submit = |n: u32| {
        json!({"tenantId": "demo", "projectId": release.1, "releaseId": release.0,
               "inputJson": "{\"customer\": \"fixture\", \"text\": \"Search is slow.\"}",
               "requestId": format!("fixture-{n}")})
    };
    for (n, (action, method)) in [
        ("cancelled", "agentbay.runs.v1.Runs/CancelRun"),
        ("held", "agentbay.runs.v1.Runs/HoldRun"),
    ]
    .into_iter()
    .enumerate()
    {
        match a
            .rpc(
                &demo_token,
                "agentbay.runs.v1.Runs/SubmitRun",
                submit(n as u32),
            )
            .await
        {
            Ok(run) => {
                let id = run["run"]["runId"].clone();
                said(
                    &format!("run {action}"),
                    a.rpc(
                        &demo_token,
                        method,
                        json!({"tenantId": "demo", "runId": id, "reason": "fixture"}),
                    )
                    .await,
                );
            }
            Err(e) => println!("fixture: run {action}: skipped ({e})"),
        }
    }
    // One more run left to finish on its own.
    said(
        "run submitted",
        a.rpc(&demo_token, "agentbay.runs.v1.Runs/SubmitRun", submit(9))
            .await,
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (id, run) in a.runs(&token, "demo").await {
        println!("fixture: run {id} {}", run["state"]);
    }
    a.stop();

    let (schema, _) = raw_meta(&data.join("store"));
    // What a run leaves that is not data: where it listened, its pid.
    let _ = std::fs::remove_dir_all(data.join("run"));
    let target = fixtures_dir().join(format!("schema-{schema}.tar.gz"));
    std::fs::create_dir_all(fixtures_dir()).unwrap();
    let status = Command::new("tar")
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-czf",
        ])
        .arg(&target)
        .arg("-C")
        .arg(&root)
        .args(["credential.json", "data"])
        .status()
        .unwrap();
    assert!(status.success());
    println!(
        "fixture: wrote {} ({} bytes; trees {:?})",
        target.display(),
        std::fs::metadata(&target).unwrap().len(),
        raw_trees(&data.join("store"))
    );
}

/// Every earlier store (and this version's own) opens with this build:
/// backed up as found, migrated, served, every record read back and every
/// derived entry complete.
#[tokio::test(flavor = "multi_thread")]
async fn every_earlier_store_is_backed_up_migrated_and_served() {
    let current = agentbay::store::SCHEMA_VERSION;
    for schema in 1..=current {
        let fixture = fixtures_dir().join(format!("schema-{schema}.tar.gz"));
        assert!(
            fixture.exists(),
            "no fixture store for schema {schema}: run tests/fixtures/stores/generate.sh with the binary that writes it"
        );
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let status = Command::new("tar")
            .arg("-xzf")
            .arg(&fixture)
            .arg("-C")
            .arg(root)
            .status()
            .unwrap();
        assert!(status.success());
        let data = root.join("data");
        let store = data.join("store");
        let credential: Value =
            serde_json::from_slice(&std::fs::read(root.join("credential.json")).unwrap()).unwrap();
        let admin = Credential {
            id: credential["client_id"].as_str().unwrap().into(),
            secret: credential["client_secret"].as_str().unwrap().into(),
        };
        // Before anything opens it (opening writes).
        let written = last_written(&store);
        let before = raw_trees(&store);
        let (found, writer) = raw_meta(&store);
        assert_eq!(
            found,
            schema,
            "{} holds a store of schema {found}",
            fixture.display()
        );
        for table in [
            "tenants",
            "runs",
            "attempts",
            "checkpoints",
            "call_records",
            "decisions",
            "capacity_leases",
            "loaded_releases",
            "outbox",
            "artifacts",
        ] {
            let n = before.get(table).copied().unwrap_or(0);
            assert!(
                n > 0,
                "the schema {schema} fixture has no {table}: {before:?}"
            );
        }

        // The first command of this build to open it (any command does, as
        // the service's start does): every record reads back, derived
        // entries are complete.
        let out = common::run(
            common::agentbay()
                .args(["check", "--json", "--data-dir"])
                .arg(&data),
        );
        let check: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "schema {schema}: check: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert!(out.status.success(), "schema {schema}: {check}");
        assert_eq!(check["problems"], json!([]), "schema {schema}");
        assert_eq!(check["schemaVersion"], current);
        for (table, n) in check["records"].as_object().unwrap() {
            let found = before.get(table).copied().unwrap_or(0);
            assert_eq!(
                n.as_u64().unwrap() as usize,
                found,
                "schema {schema}: table {table} reads back every record"
            );
        }
        // Backed up as found, before anything changed: the backup holds
        // exactly the fixture's records, at its schema.
        let backups: Vec<_> = std::fs::read_dir(data.join("backups"))
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        let upgraded = writer.as_deref() != Some(env!("CARGO_PKG_VERSION")) || schema < current;
        if upgraded {
            let label = match &writer {
                Some(v) => format!("before-upgrade-from-agentbay-{v}-schema-{schema}-"),
                None => format!("before-upgrade-from-schema-{schema}-"),
            };
            let backup = backups
                .iter()
                .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(&label))
                .unwrap_or_else(|| panic!("schema {schema}: no {label}… backup in {backups:?}"));
            let restored = root.join("restored");
            let summary = agentbay::store::restore_into(backup, &restored).unwrap();
            assert_eq!(summary.schema_version, schema);
            assert_eq!(
                summary.records as usize,
                before.values().sum::<usize>(),
                "schema {schema}: the backup holds every record found"
            );
            assert_eq!(raw_trees(&restored.join("store")), before);
            assert_eq!(raw_meta(&restored.join("store")).0, schema);
        } else {
            assert!(backups.is_empty(), "no upgrade, no backup: {backups:?}");
        }

        // Served by this build.
        // On a clock standing where the fixture was left: its decisions
        // still wait, however long ago it was written.
        let a = Served::start(
            Path::new(common::binary()),
            root,
            &data,
            &["--manual-clock-at", &written.to_rfc3339()],
        );
        let ready: Value = a
            .http
            .get(format!("{}/readyz", a.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(ready["ready"], true, "schema {schema}: {ready}");
        assert_eq!(ready["schemaVersion"], current, "schema {schema}: {ready}");
        let token = a.token(&admin).await;
        let mut runs = 0;
        let mut states = std::collections::BTreeSet::new();
        let mut waiting = 0;
        for tenant in ["demo", "acme"] {
            for (id, run) in a.runs(&token, tenant).await {
                runs += 1;
                states.insert(run["state"].as_str().unwrap_or("").to_string());
                waiting += usize::from(awaits_person(&run));
                let one = a
                    .rpc(
                        &token,
                        "agentbay.runs.v1.Runs/GetRun",
                        json!({"tenantId": tenant, "runId": id}),
                    )
                    .await
                    .unwrap_or_else(|e| panic!("schema {schema}: run {id}: {e}"));
                assert_eq!(one["run"]["runId"], id.as_str());
            }
        }
        assert_eq!(runs, before["runs"], "schema {schema}: every run is served");
        assert!(
            ["Succeeded", "Failed", "Running"]
                .iter()
                .all(|s| states.contains(*s)),
            "schema {schema}: runs in their states: {states:?}"
        );
        assert!(
            waiting >= 1,
            "schema {schema}: the runs waiting for a person still wait"
        );
        a.stop();

        // Serving changed it (leases of live attempts, run slots): still
        // consistent.
        let out = common::run(
            common::agentbay()
                .args(["check", "--json", "--data-dir"])
                .arg(&data),
        );
        assert!(
            out.status.success(),
            "schema {schema} after serving: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
