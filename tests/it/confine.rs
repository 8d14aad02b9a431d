//! Tools under their lease: what a tool process may use and reach, and what
//! it is told about the call it serves. The tools are a real MCP server
//! over stdio (`tests/tools/probe_mcp.py`) whose tools probe the process
//! they run in.

use serde_json::{Value, json};

use crate::builtin::{Site, answer};
use crate::common::Appliance;

/// Where the probe sits in its release's bundle (`toolFiles`).
const PROBE_FILE: &str = "tools/probe_mcp.py";

/// The probe MCP server's command line: the system's Python (a Python
/// manager's shim would need its own directories) running the release's
/// own copy of the probe, in its working directory's `release/`.
fn probe() -> Vec<String> {
    let python = if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    vec![python.into(), format!("release/{PROBE_FILE}")]
}

/// Imports a release that carries the probe among its files.
async fn import_probe(site: &Site, id: &str, responses: Value, edit: impl FnOnce(&mut Value)) {
    let (status, body) = try_import_probe(site, id, responses, edit).await;
    assert_eq!(status, 201, "{body}");
}

/// [`import_probe`], with the status and answer of the import.
async fn try_import_probe(
    site: &Site,
    id: &str,
    responses: Value,
    edit: impl FnOnce(&mut Value),
) -> (u16, Value) {
    let script = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/probe_mcp.py"),
    )
    .unwrap();
    site.try_import(id, responses, &[(PROBE_FILE, &script)], move |m| {
        m["toolFiles"] =
            json!([{"path": PROBE_FILE, "sha256": format!("sha256:{}", "0".repeat(64))}]);
        edit(m);
    })
    .await
}

/// The host's pid of a process that reported `pid` and its start time from
/// the PID namespace `ns` (its own, where the host gives tools one), while
/// it runs. The start time tells it from a process of a later namespace
/// that got the same number.
fn host_pid(pid: i64, ns: &str, started: u64) -> Option<i64> {
    let start_of = |dir: &std::path::Path| -> Option<u64> {
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(19)?
            .parse()
            .ok()
    };
    if std::fs::read_link("/proc/self/ns/pid").ok()?.to_str()? == ns {
        let dir = std::path::PathBuf::from(format!("/proc/{pid}"));
        return (start_of(&dir)? == started).then_some(pid);
    }
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let host: i64 = e.file_name().to_str()?.parse().ok()?;
        let link = std::fs::read_link(e.path().join("ns/pid")).ok()?;
        if link.to_str()? != ns {
            return None;
        }
        let status = std::fs::read_to_string(e.path().join("status")).ok()?;
        let inner: i64 = status
            .lines()
            .find(|l| l.starts_with("NSpid:"))?
            .split_whitespace()
            .last()?
            .parse()
            .ok()?;
        (inner == pid && start_of(&e.path())? == started).then_some(host)
    })
}

/// A release whose tools are the probe's `tools` (id = tool name), all of
/// class `read`, and whose scripted model calls `calls` in one turn.
async fn probe_release(site: &Site, id: &str, tools: &[(&str, bool)], calls: Value) {
    let server = probe();
    let tools: Vec<Value> = tools
        .iter()
        .map(|(name, sandbox)| {
            json!({"id": name, "name": name, "description": name, "sideEffectClass": "read",
                   "transport": "mcp-stdio", "command": server, "needsSandbox": sandbox,
                   "inputSchema": {"type": "object"}})
        })
        .collect();
    import_probe(
        site,
        id,
        json!([{"content": "probe", "toolCalls": calls}, answer("low", false)]),
        move |m| m["tools"] = Value::Array(tools),
    )
    .await;
}

/// Runs `release` to its end and returns each tool call of its attempt
/// with its content (`GET .../calls/{callId}`), in order.
async fn tool_calls(site: &Site, release: &str) -> Vec<Value> {
    let run_id = site.submit(release).await;
    let run = site.until(&run_id, "Succeeded").await;
    let attempt_id = run.steps[0].attempts[0].attempt_id.clone();
    let t = site.timeline(&attempt_id).await;
    let mut out = Vec::new();
    for c in t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "tool")
    {
        let path = format!(
            "/runtime/attempts/{attempt_id}/calls/{}",
            c["callId"].as_str().unwrap()
        );
        out.push(site.a.get(&site.token, &path).await);
    }
    out
}

#[tokio::test]
async fn every_mcp_call_carries_the_attempts_fence_in_its_meta() {
    let site = Site::start().await;
    probe_release(
        &site,
        "probe-meta",
        &[("meta", false)],
        json!([{"tool": "meta", "arguments": {}}, {"tool": "meta", "arguments": {}}]),
    )
    .await;
    let calls = tool_calls(&site, "probe-meta").await;
    assert_eq!(calls.len(), 2);
    for call in &calls {
        assert_eq!(call["status"], "completed", "{call}");
        let meta = &call["content"]["result"]["json"]["structured"]["meta"];
        assert_eq!(meta["agentbay/callId"], call["callId"], "{meta}");
        assert_eq!(
            meta["agentbay/fencingToken"], call["fencingToken"],
            "{meta}"
        );
        assert_eq!(meta["agentbay/fencingToken"], 1, "{meta}");
        assert_eq!(
            meta["agentbay/policyDecisionId"], call["policyDecisionId"],
            "{meta}"
        );
        assert!(
            meta["agentbay/attemptId"]
                .as_str()
                .is_some_and(|a| a.len() == 36),
            "{meta}"
        );
    }
    assert_ne!(calls[0]["callId"], calls[1]["callId"]);
}

/// A probe release of one tool with `descriptor` merged into its
/// declaration, called once with `arguments`.
async fn one_tool(site: &Site, id: &str, tool: &str, descriptor: Value, arguments: Value) {
    let server = probe();
    let mut t = json!({"id": tool, "name": tool, "description": tool, "sideEffectClass": "read",
                       "transport": "mcp-stdio", "command": server, "inputSchema": {"type": "object"}});
    for (k, v) in descriptor.as_object().unwrap() {
        t[k] = v.clone();
    }
    import_probe(
        site,
        id,
        json!([{"content": "probe", "toolCalls": [{"tool": tool, "arguments": arguments}]}, answer("low", false)]),
        move |m| {
            m["tools"] = json!([t]);
            m["policy"]["tools"] = json!({tool: "allow"});
        },
    )
    .await;
}

/// The tool call of a one-tool run that ends in `state`, with its content.
async fn the_call(site: &Site, release: &str, state: &str) -> Value {
    let run_id = site.submit(release).await;
    let run = site.until(&run_id, state).await;
    assert_eq!(run.steps[0].attempts[0].state, state, "{run:?}");
    let attempt_id = run.steps[0].attempts[0].attempt_id.clone();
    let t = site.timeline(&attempt_id).await;
    let call = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "tool")
        .cloned()
        .unwrap_or_else(|| panic!("no tool call: {t}"));
    let path = format!(
        "/runtime/attempts/{attempt_id}/calls/{}",
        call["callId"].as_str().unwrap()
    );
    site.a.get(&site.token, &path).await
}

/// Whether the appliances the tests start run as root (the tests do, and
/// `AGENTBAY_TEST_AS` does not name another account).
fn running_as_root() -> bool {
    if crate::common::unprivileged_account().is_some() {
        return false;
    }
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// What the probe answered (`structured`), or the call's error.
fn answered(call: &Value) -> &Value {
    &call["content"]["result"]["json"]["structured"]
}

fn confinement(call: &Value) -> &Value {
    &call["content"]["receipt"]["json"]["confinement"]
}

#[tokio::test]
async fn a_tool_past_its_memory_is_killed_and_its_call_names_the_limit() {
    let site = Site::start().await;
    one_tool(
        &site,
        "probe-alloc",
        "alloc",
        json!({"needsSandbox": true, "memoryGb": 0.1, "cpu": 1}),
        json!({"mb": 400}),
    )
    .await;
    let call = the_call(&site, "probe-alloc", "Succeeded").await;
    assert_eq!(call["status"], "failed", "{call}");
    let bound = confinement(&call);
    if crate::common::unprivileged_account().is_some() {
        // As installed: the delegated subtree bounds it, and it has its own
        // network and processes, as the account the appliance runs as.
        assert!(
            bound["mechanism"].as_str().unwrap().starts_with("cgroup"),
            "{bound}"
        );
        assert_eq!(bound["network"], "loopback-only", "{bound}");
        assert_eq!(bound["processes"], "own-namespace", "{bound}");
        let user = bound["user"].as_str().unwrap();
        assert!(user.contains("of the subordinate range of"), "{bound}");
    }
    // /readyz says what this host enforces: the mechanism the call got.
    let ready: Value = site
        .a
        .http()
        .get(format!("{}/readyz", site.a.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["tools"]["mechanism"], bound["mechanism"], "{ready}");
    // So does the sandbox lease the tool ran under.
    let admin = site.a.admin_token().await;
    let leases = site
        .a
        .get(
            &admin,
            "/factory/capacity/leases?state=Released&tenant=demo",
        )
        .await;
    let sandbox = leases["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["holderKind"] == "sandbox")
        .unwrap_or_else(|| panic!("no sandbox lease: {leases}"));
    assert_eq!(sandbox["boundBy"], bound["mechanism"], "{sandbox}");
    assert!(ready["tools"]["files"].is_string(), "{ready}");
    let error = call["error"].as_str().unwrap();
    if bound["mechanism"].as_str().unwrap().starts_with("cgroup") {
        assert_eq!(bound["killedBy"], "oom", "{bound}");
        assert!(error.contains("memory limit"), "{error}");
        assert_eq!(bound["memoryBytes"], 107_374_182, "{bound}");
    } else {
        assert!(error.contains("MemoryError"), "{error}");
    }
}

/// `runtime.tool_pids_max` bounds the processes of a tool's tree: a tool
/// that forks past it is refused the surplus, and its call says the bound.
#[tokio::test]
async fn a_tool_forks_no_more_processes_than_its_bound() {
    let site = Site::on(Appliance::start_with(
        &[],
        &[("AGENTBAY_RUNTIME__TOOL_PIDS_MAX", "16")],
    ))
    .await;
    one_tool(
        &site,
        "probe-forks",
        "forks",
        json!({"needsSandbox": true}),
        json!({"n": 64}),
    )
    .await;
    let call = the_call(&site, "probe-forks", "Succeeded").await;
    assert_eq!(call["status"], "completed", "{call}");
    let bound = confinement(&call);
    assert_eq!(bound["pids"], 16, "{bound}");
    let seen = answered(&call);
    let started = seen["started"].as_i64().unwrap();
    if bound["mechanism"] == "rlimit" && running_as_root() {
        // RLIMIT_NPROC counts every process of the user and binds no root.
        return;
    }
    assert!(started < 16, "{seen}");
    assert!(
        seen["error"]
            .as_str()
            .is_some_and(|e| e.contains("Resource temporarily unavailable")),
        "{seen}"
    );
}

#[tokio::test]
async fn a_child_that_outlives_its_tool_is_gone_when_the_lease_ends() {
    let site = Site::start().await;
    one_tool(
        &site,
        "probe-spawn",
        "spawn",
        json!({"needsSandbox": true}),
        json!({"seconds": 300}),
    )
    .await;
    let call = the_call(&site, "probe-spawn", "Succeeded").await;
    assert_eq!(call["status"], "completed", "{call}");
    let child = host_pid(
        answered(&call)["child"].as_i64().unwrap(),
        answered(&call)["pidns"].as_str().unwrap(),
        answered(&call)["started"].as_u64().unwrap(),
    )
    .unwrap_or(-1);
    if confinement(&call)["mechanism"] == "rlimit" {
        // A process group cannot hold a child that starts its own
        // session: the weaker mechanism says what it is, and no more.
        assert!(confinement(&call)["group"].is_null(), "{call}");
        return;
    }
    // The child started a session of its own (out of its parent's process
    // group); the lease's end still took it.
    let gone = |pid: i64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')))
            .unwrap_or(true)
    };
    for _ in 0..100 {
        if gone(child) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(gone(child), "child {child} of the tool still runs");
}

#[tokio::test]
async fn a_busy_tool_under_half_a_cpu_gets_about_half_a_core() {
    let site = Site::start().await;
    one_tool(
        &site,
        "probe-spin",
        "spin",
        json!({"needsSandbox": true, "cpu": 0.5}),
        json!({"seconds": 3}),
    )
    .await;
    let call = the_call(&site, "probe-spin", "Succeeded").await;
    assert_eq!(call["status"], "completed", "{call}");
    let got = answered(&call);
    let share = got["cpu_seconds"].as_f64().unwrap() / got["wall_seconds"].as_f64().unwrap();
    if confinement(&call)["mechanism"]
        .as_str()
        .unwrap()
        .starts_with("cgroup")
    {
        assert!(
            share < 0.62,
            "a 0.5-CPU tool used {share:.2} of a core: {got}"
        );
        assert!(
            share > 0.2,
            "a 0.5-CPU tool used only {share:.2} of a core: {got}"
        );
        assert!(confinement(&call)["cpuSeconds"].as_f64().unwrap() > 0.5);
    }
}

#[tokio::test]
async fn a_tool_without_egress_reaches_no_host_port_and_one_with_egress_does() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // The site allows this one endpoint, by its exact host:port.
    let listed = format!("127.0.0.1:{port}");
    let site = Site::on(Appliance::start_with(
        &[],
        &[("AGENTBAY_RUNTIME__NETWORK_ALLOW", &listed)],
    ))
    .await;
    let target = json!({"host": "127.0.0.1", "port": port});
    one_tool(&site, "probe-closed", "connect", json!({}), target.clone()).await;
    let call = the_call(&site, "probe-closed", "Succeeded").await;
    let network = confinement(&call)["network"].as_str().unwrap().to_string();
    if network.starts_with("host (not isolated") {
        // This host cannot make a network namespace, and the call says so.
        assert_eq!(answered(&call)["connected"], true, "{call}");
        return;
    }
    assert_eq!(answered(&call)["connected"], false, "{call}");
    assert_eq!(network, "loopback-only");

    // A site endpoint the tool declares is reachable without egress,
    // through the appliance, at the same port on its own loopback.
    one_tool(
        &site,
        "probe-site",
        "connect",
        json!({"siteEndpoints": [format!("127.0.0.1:{port}")]}),
        target.clone(),
    )
    .await;
    let accepted = std::thread::spawn(move || listener.accept().map(|_| listener));
    let call = the_call(&site, "probe-site", "Succeeded").await;
    assert_eq!(answered(&call)["connected"], true, "{call}");
    assert!(
        confinement(&call)["network"]
            .as_str()
            .unwrap()
            .contains("site endpoints"),
        "{call}"
    );
    let listener = accepted
        .join()
        .unwrap()
        .expect("the endpoint saw the connection");

    // An endpoint the site does not list, such as the appliance's own
    // API, is a verdict at import that names it.
    let own = site.a.url.trim_start_matches("https://").to_string();
    let (status, body) =
        try_import_probe(&site, "probe-own-api", json!([answer("low", false)]), |m| {
            m["tools"] = json!([{"id": "connect", "name": "connect", "description": "c",
            "sideEffectClass": "read", "transport": "mcp-stdio", "command": probe(),
            "siteEndpoints": [own], "inputSchema": {"type": "object"}}]);
        })
        .await;
    assert_eq!(status, 422, "{body}");
    let text = body.to_string();
    assert!(
        text.contains(&format!(
            "site endpoint {own} is not in the site's network allowlist"
        )),
        "{text}"
    );

    // An egress pool of the tenant's own; a tool that declares egress is
    // placed there and keeps the host's network.
    let admin = site.a.admin_token().await;
    let (s, p) = site
        .a
        .put(
            &admin,
            "/factory/capacity/pools/demo-egress",
            json!({"tenantId": "demo", "kind": "sandbox", "securityBoundary": "tenant-dedicated",
                   "region": "local", "nodeProfile": "small", "minSize": 1, "maxSize": 2,
                   "internetEgress": true}),
        )
        .await;
    assert_eq!(s, 200, "{p}");
    one_tool(
        &site,
        "probe-open",
        "connect",
        json!({"needsSandbox": true, "needsEgress": true}),
        target,
    )
    .await;
    let call = the_call(&site, "probe-open", "Succeeded").await;
    assert_eq!(answered(&call)["connected"], true, "{call}");
    assert_eq!(confinement(&call)["network"], "host");
    drop(listener);
}

#[tokio::test]
async fn a_tool_reads_its_working_directory_and_never_the_data_dir() {
    let site = Site::start().await;
    let secret = site.a.data_dir.join("tls").join("ca.pem");
    assert!(secret.exists(), "{}", secret.display());
    one_tool(
        &site,
        "probe-read",
        "read",
        json!({}),
        json!({"path": secret.display().to_string()}),
    )
    .await;
    let call = the_call(&site, "probe-read", "Succeeded").await;
    let got = answered(&call);
    let files = confinement(&call)["files"].as_str().unwrap();
    if files.starts_with("not restricted") {
        // Without Landlock nothing keeps the tool out, and the call says so.
        assert!(files.contains("Landlock"), "{files}");
        return;
    }
    assert!(
        got["read"].is_null(),
        "the tool read {}: {got}",
        secret.display()
    );
    // The data dir does not exist in the tool's world (or, without one,
    // Landlock refuses it).
    let error = got["error"].as_str().unwrap();
    assert!(
        error.contains("No such file") || error.contains("Permission denied"),
        "{got}"
    );
    assert!(
        confinement(&call)["files"]
            .as_str()
            .unwrap()
            .starts_with("landlock"),
        "{call}"
    );
    // Nor the appliance's environment through /proc.
    let environ = format!("/proc/{}/environ", site.a.child.as_ref().unwrap().id());
    one_tool(
        &site,
        "probe-environ",
        "read",
        json!({}),
        json!({"path": environ}),
    )
    .await;
    let call = the_call(&site, "probe-environ", "Succeeded").await;
    if running_as_root() {
        // A root appliance's tools run as runtime.tool_user.
        assert_eq!(
            confinement(&call)["user"],
            "nobody (runtime.tool_user)",
            "{call}"
        );
    }
    assert!(
        answered(&call)["read"].is_null(),
        "the tool read {environ}: {call}"
    );
    one_tool(
        &site,
        "probe-write",
        "write",
        json!({}),
        json!({"path": "note.txt", "text": "kept"}),
    )
    .await;
    let call = the_call(&site, "probe-write", "Succeeded").await;
    assert_eq!(answered(&call)["written"], true, "{call}");
    // As root, the working directory is a tmpfs of runtime.tool_workdir_mb.
    let files = confinement(&call)["files"].as_str().unwrap();
    if running_as_root() {
        assert!(files.ends_with("a tmpfs of at most 1024 MiB"), "{files}");
    } else {
        assert!(files.contains("not size-limited"), "{files}");
    }
}

#[tokio::test]
async fn a_hung_tool_times_out_and_settles_by_its_class() {
    let site = Site::start().await;
    // A read: the call fails, the loop goes on to its answer.
    one_tool(
        &site,
        "probe-hang-read",
        "hang",
        json!({"timeoutSeconds": 1}),
        json!({}),
    )
    .await;
    let call = the_call(&site, "probe-hang-read", "Succeeded").await;
    assert_eq!(call["status"], "failed", "{call}");
    assert!(
        call["error"]
            .as_str()
            .unwrap()
            .contains("timed out after 1 s"),
        "{call}"
    );
    assert_eq!(
        call["content"]["receipt"]["json"]["confinement"]["killedBy"],
        "timeout"
    );
    // A write: its effect is unknown, so the call and the attempt are
    // Uncertain and it is never issued again.
    one_tool(
        &site,
        "probe-hang-write",
        "hang",
        json!({"timeoutSeconds": 1, "sideEffectClass": "shared-write"}),
        json!({}),
    )
    .await;
    let call = the_call(&site, "probe-hang-write", "Uncertain").await;
    assert_eq!(call["status"], "uncertain", "{call}");
    assert!(
        call["error"].as_str().unwrap().contains("timed out"),
        "{call}"
    );
}

#[tokio::test]
async fn tools_end_with_a_killed_appliance_or_at_its_next_start() {
    let mut site = Site::start().await;
    let server = probe();
    import_probe(
        &site,
        "probe-orphan",
        json!([
            {"content": "fork", "toolCalls": [{"tool": "spawn", "arguments": {"seconds": 300}}]},
            {"content": "wait", "toolCalls": [{"tool": "hang", "arguments": {}}]},
            answer("low", false)
        ]),
        move |m| {
            m["tools"] = json!(["spawn", "hang"].map(|t| json!({
                "id": t, "name": t, "description": t, "sideEffectClass": "read",
                "transport": "mcp-stdio", "command": server, "inputSchema": {"type": "object"}})));
        },
    )
    .await;
    let run_id = site.submit("probe-orphan").await;
    let run = site.until(&run_id, "WaitingForTool").await;
    let attempt_id = run.steps[0].attempts[0].attempt_id.clone();
    let t = site
        .timeline_until(&attempt_id, |t| {
            t["calls"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["target"] == "hang"))
        })
        .await;
    let spawn = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["target"] == "spawn")
        .unwrap();
    let path = format!(
        "/runtime/attempts/{attempt_id}/calls/{}",
        spawn["callId"].as_str().unwrap()
    );
    let call = site.a.get(&site.token, &path).await;
    let child = host_pid(
        answered(&call)["child"].as_i64().unwrap(),
        answered(&call)["pidns"].as_str().unwrap(),
        answered(&call)["started"].as_u64().unwrap(),
    )
    .unwrap_or(-1);
    let alive = |pid: i64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')))
            .unwrap_or(false)
    };
    assert!(alive(child), "the tool's child runs while its attempt does");
    let gone_within = |seconds: u64| async move {
        for _ in 0..seconds * 50 {
            if !alive(child) {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        false
    };
    if confinement(&call)["processes"] == "own-namespace" {
        // Its namespace's first process dies with the tool spawner, which
        // ends when the appliance does, and every process of the
        // namespace with it: nothing waits for the next start.
        site.a.kill9();
        assert!(
            gone_within(10).await,
            "the tool's child {child} ended with the killed appliance"
        );
        site.a.restart();
        return;
    }
    if !confinement(&call)["mechanism"]
        .as_str()
        .unwrap()
        .starts_with("cgroup")
    {
        return; // Only a cgroup finds a child that left its process group.
    }
    site.a.kill9();
    assert!(alive(child), "a kill -9 of the appliance leaves its tools");
    site.a.restart();
    assert!(
        gone_within(2).await,
        "the next start ended the tool's child {child}"
    );
}

/// The pids of the tool spawners `appliance` started (its children that
/// run `agentbay tool-spawner`).
fn spawners_of(appliance: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let parent = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split(' ').nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if parent == Some(appliance) && cmdline.split(|b| *b == 0).any(|arg| arg == b"tool-spawner")
        {
            found.push(pid);
        }
    }
    found
}

/// Every tool is forked by the tool spawner, one child of the appliance
/// (as the appliance's own account); killed, it is started again for the
/// next tool, which runs as before.
#[tokio::test]
async fn a_killed_tool_spawner_is_started_again_for_the_next_tool() {
    let site = Site::start().await;
    let appliance = site.a.child.as_ref().unwrap().id();
    one_tool(&site, "probe-spawner", "whoami", json!({}), json!({})).await;
    let first = the_call(&site, "probe-spawner", "Succeeded").await;
    assert_eq!(
        answered(&first)["path"],
        "/usr/local/bin:/usr/bin:/bin",
        "{first}"
    );
    let spawners = spawners_of(appliance);
    assert_eq!(spawners.len(), 1, "one tool spawner: {spawners:?}");
    let owner = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix("Uid:")
                    .map(|u| u.split_whitespace().next().unwrap().to_string())
            })
            .unwrap()
    };
    assert_eq!(
        owner(spawners[0]),
        owner(appliance),
        "the spawner is the appliance's account"
    );
    // SAFETY: a signal to a process the test's appliance started.
    unsafe { libc::kill(spawners[0] as i32, libc::SIGKILL) };
    for _ in 0..250 {
        if spawners_of(appliance).is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        spawners_of(appliance).is_empty(),
        "the killed spawner was reaped"
    );
    let second = the_call(&site, "probe-spawner", "Succeeded").await;
    assert_eq!(
        answered(&second)["path"],
        "/usr/local/bin:/usr/bin:/bin",
        "{second}"
    );
    assert_eq!(
        confinement(&second)["processes"],
        confinement(&first)["processes"],
        "{second}"
    );
    let again = spawners_of(appliance);
    assert_eq!(again.len(), 1, "{again:?}");
    assert_ne!(again[0], spawners[0]);
}

/// `runtime.confinement = "rlimit"`: the weaker mechanism still bounds a
/// tool's memory (its address space), and every call says which mechanism
/// bound it.
#[tokio::test]
async fn the_weaker_mechanism_bounds_memory_and_says_so() {
    let site = Site::on(Appliance::start_with(
        &[],
        &[("AGENTBAY_RUNTIME__CONFINEMENT", "rlimit")],
    ))
    .await;
    one_tool(
        &site,
        "probe-alloc-rlimit",
        "alloc",
        json!({"needsSandbox": true, "memoryGb": 0.1}),
        json!({"mb": 400}),
    )
    .await;
    let call = the_call(&site, "probe-alloc-rlimit", "Succeeded").await;
    let bound = confinement(&call);
    assert_eq!(bound["mechanism"], "rlimit", "{call}");
    assert!(bound["group"].is_null(), "{call}");
    assert_eq!(call["status"], "failed", "{call}");
    let error = call["error"].as_str().unwrap();
    assert!(error.contains("MemoryError"), "{error}");
}

/// A sandbox lease is renewed while its tool runs; when it ends all the
/// same (here an operator releases it), the tool's process tree ends with
/// it and the call fails saying why.
#[tokio::test]
async fn a_tool_ends_with_its_sandbox_lease() {
    let site = Site::on(Appliance::start_with(
        &[],
        &[("AGENTBAY_RUNTIME__HEARTBEAT_SECONDS", "1")],
    ))
    .await;
    one_tool(
        &site,
        "probe-lease-end",
        "hang",
        json!({"needsSandbox": true, "timeoutSeconds": 600}),
        json!({}),
    )
    .await;
    let run_id = site.submit("probe-lease-end").await;
    let run = site.until(&run_id, "WaitingForTool").await;
    let attempt_id = run.steps[0].attempts[0].attempt_id.clone();
    let pid_file = site
        .a
        .data_dir
        .join("work")
        .join(&attempt_id)
        .join("home")
        .join("hang.pid");
    let mut pid = None;
    for _ in 0..200 {
        if let Ok(text) = std::fs::read_to_string(&pid_file)
            && let [inner, ns, started] = text.split_whitespace().collect::<Vec<_>>()[..]
            && let (Ok(inner), Ok(started)) = (inner.parse(), started.parse())
        {
            pid = host_pid(inner, ns, started);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let pid = pid.expect("the hung tool wrote its pid");
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    // Its uid, as the host sees it, is not the appliance's: a
    // peer-credential check tells them apart.
    let uid_of = |pid: u32| -> Option<u32> {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()?
            .lines()
            .find(|l| l.starts_with("Uid:"))?
            .split_whitespace()
            .nth(2)?
            .parse()
            .ok()
    };
    let appliance = site.a.child.as_ref().unwrap().id();
    let (tool_uid, appliance_uid) = (uid_of(pid as u32), uid_of(appliance));
    assert!(tool_uid.is_some() && appliance_uid.is_some());
    assert_ne!(
        tool_uid, appliance_uid,
        "the tool {pid} runs as the appliance's uid"
    );

    let admin = site.a.admin_token().await;
    let leases = site
        .a
        .get(
            &admin,
            "/factory/capacity/leases?tenant=demo&state=Granted&state=Active",
        )
        .await;
    let lease = leases["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["holderKind"] == "sandbox")
        .unwrap_or_else(|| panic!("no live sandbox lease: {leases}"))["leaseId"]
        .as_str()
        .unwrap()
        .to_string();
    // A holder of the tenant's leases gives it back.
    let holder = site
        .a
        .create_client("demo", &["factory.capacity.lease"])
        .await;
    let holder = site.a.token(&holder).await;
    let released = site
        .a
        .http()
        .post(format!(
            "{}/agentbay.capacity.v1.Capacity/ReleaseLease",
            site.a.url
        ))
        .bearer_auth(&holder)
        .json(&json!({"leaseId": lease}))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), 200, "{}", released.text().await.unwrap());

    let run = site.until(&run_id, "Succeeded").await;
    assert_eq!(
        run.state, "Succeeded",
        "the loop goes on after the failed call: {run:?}"
    );
    let t = site.timeline(&attempt_id).await;
    let call = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["target"] == "hang")
        .unwrap();
    assert_eq!(call["status"], "failed", "{call}");
    assert!(
        call["error"].as_str().unwrap().contains("sandbox lease"),
        "{call}"
    );
    let gone = |pid: i64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')))
            .unwrap_or(true)
    };
    assert!(gone(pid), "the tool {pid} outlived its lease");
}

/// While the attempt waits for a human its servers stop (its capacity
/// lease may be given back meanwhile), and the next call starts them
/// again.
#[tokio::test]
async fn a_tools_server_stops_while_its_attempt_waits_for_a_human() {
    let site = Site::start().await;
    let server = probe();
    import_probe(
        &site,
        "probe-wait",
        json!([
            {"content": "look", "toolCalls": [{"tool": "whoami", "arguments": {}}]},
            {"content": "note", "toolCalls": [{"tool": "write", "arguments": {"path": "n.txt", "text": "x"}}]},
            answer("low", false)
        ]),
        move |m| {
            m["tools"] = json!([
                {"id": "whoami", "name": "whoami", "description": "who", "sideEffectClass": "read",
                 "transport": "mcp-stdio", "command": server, "inputSchema": {"type": "object"}},
                {"id": "write", "name": "write", "description": "write", "sideEffectClass": "shared-write",
                 "transport": "mcp-stdio", "command": server, "inputSchema": {"type": "object"}},
            ]);
            m["policy"]["tools"] = json!({"write": "require-approval"});
        },
    )
    .await;
    let run_id = site.submit("probe-wait").await;
    let run = site.until(&run_id, "WaitingForDecision").await;
    let attempt_id = run.steps[0].attempts[0].attempt_id.clone();
    let t = site.timeline(&attempt_id).await;
    let whoami = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["target"] == "whoami")
        .unwrap();
    let path = format!(
        "/runtime/attempts/{attempt_id}/calls/{}",
        whoami["callId"].as_str().unwrap()
    );
    let call = site.a.get(&site.token, &path).await;
    let pid = host_pid(
        answered(&call)["pid"].as_i64().unwrap(),
        answered(&call)["pidns"].as_str().unwrap(),
        answered(&call)["started"].as_u64().unwrap(),
    )
    // None: it has stopped already (its namespace is gone with it).
    .unwrap_or(-1);
    let gone = |pid: i64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')))
            .unwrap_or(true)
    };
    for _ in 0..100 {
        if gone(pid) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        gone(pid),
        "the server {pid} runs while its attempt waits for a human"
    );
    let approval = t["pendingDecision"]["approvalId"]
        .as_str()
        .unwrap()
        .to_string();
    let decided = site
        .a
        .http()
        .post(format!(
            "{}/agentbay.runs.v1.Runs/DecideApproval",
            site.a.url
        ))
        .bearer_auth(&site.token)
        .json(&json!({"approvalId": approval, "approve": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(decided.status(), 200, "{}", decided.text().await.unwrap());
    let run = site.until(&run_id, "Succeeded").await;
    assert_eq!(run.state, "Succeeded", "{run:?}");
    let t = site.timeline(&attempt_id).await;
    let write = t["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["target"] == "write" && c["status"] == "completed");
    assert!(
        write.is_some(),
        "the approved call ran on a fresh server: {t}"
    );
}

/// No grant comes from a tool's arguments, and nothing at, above or below
/// a protected path (the data dir with its keys, tokens, store and work
/// root; the backups) is readable, whatever the release names. What the
/// site allows (`runtime.tool_read_allow`) is readable when declared.
#[tokio::test]
async fn a_tool_reads_no_protected_path_whatever_its_release_names() {
    let outside = tempfile::tempdir().unwrap();
    let shared = outside.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(shared.join("reference.txt"), "site data").unwrap();
    let backups = outside.path().join("backups");
    std::fs::create_dir_all(&backups).unwrap();
    std::fs::write(backups.join("agentbay-old.backup"), "a backup").unwrap();
    // The configuration, in a directory of its own beside what it names.
    let etc = outside.path().join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    let config = etc.join("agentbay.toml");
    std::fs::write(&config, "[log]\nlevel = \"info\"\n").unwrap();
    std::fs::write(etc.join("client.secret"), "a secret beside it").unwrap();
    crate::common::hand_to_appliance(outside.path());
    let site = Site::on(Appliance::start_with(
        &["--config", config.to_str().unwrap()],
        &[
            (
                "AGENTBAY_RUNTIME__TOOL_READ_ALLOW",
                shared.to_str().unwrap(),
            ),
            ("AGENTBAY_BACKUP__DIR", backups.to_str().unwrap()),
        ],
    ))
    .await;
    let data = site.a.data_dir.clone();
    let mut secrets: Vec<String> = ["tls", "run"]
        .iter()
        .flat_map(|d| std::fs::read_dir(data.join(d)).unwrap().flatten())
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    assert!(secrets.iter().any(|p| p.ends_with("ca.key")), "{secrets:?}");
    secrets.push(data.join("store").join("db").display().to_string());
    secrets.push(backups.join("agentbay-old.backup").display().to_string());
    secrets.push(config.display().to_string());
    secrets.push(etc.join("client.secret").display().to_string());
    // Another attempt's working directory.
    let other = data.join("work").join("another-attempt");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "another tenant's work").unwrap();
    crate::common::hand_to_appliance(&data.join("work"));
    secrets.push(other.join("notes.txt").display().to_string());
    // A link inside what the site allows that points at a protected
    // directory grants nothing: the rule judges what a path resolves to.
    std::os::unix::fs::symlink(data.join("tls"), shared.join("tls-link")).unwrap();
    secrets.push(shared.join("tls-link").join("ca.key").display().to_string());
    // Every argument names a protected path; none becomes a grant.
    let mut command = probe();
    command.extend(secrets.iter().cloned());
    command.extend(
        [data.join("work"), backups.clone(), data.join("tls")].map(|p| p.display().to_string()),
    );
    let reads: Vec<Value> = secrets
        .iter()
        .map(|p| json!({"tool": "read", "arguments": {"path": p}}))
        .chain([json!({"tool": "read", "arguments": {"path": shared.join("reference.txt")}})])
        .collect();
    let tool = |command: Vec<String>, read_paths: Value| {
        json!([{"id": "read", "name": "read", "description": "read", "sideEffectClass": "read",
                "transport": "mcp-stdio", "command": command, "readPaths": read_paths,
                "inputSchema": {"type": "object"}}])
    };
    let (c, r) = (command.clone(), reads.clone());
    import_probe(
        &site,
        "probe-protected",
        json!([{"content": "read", "toolCalls": r}, answer("low", false)]),
        move |m| m["tools"] = tool(c, json!([])),
    )
    .await;
    let calls = tool_calls(&site, "probe-protected").await;
    assert_eq!(calls.len(), secrets.len() + 1);
    if confinement(&calls[0])["files"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", calls[0]))
        .starts_with("not restricted")
    {
        return; // No Landlock here, and the call says so.
    }
    for (call, path) in calls.iter().zip(secrets.iter().chain([&String::new()])) {
        assert!(
            answered(call)["read"].is_null(),
            "the tool read {path}: {call}"
        );
    }
    // Declared and allowed: readable.
    let shared_path = shared.display().to_string();
    let (c, r) = (command, reads);
    import_probe(
        &site,
        "probe-allowed",
        json!([{"content": "read", "toolCalls": r}, answer("low", false)]),
        move |m| m["tools"] = tool(c, json!([shared_path])),
    )
    .await;
    let calls = tool_calls(&site, "probe-allowed").await;
    let last = calls.last().unwrap();
    assert_eq!(answered(last)["read"], 9, "{last}");
    for call in &calls[..calls.len() - 1] {
        assert!(answered(call)["read"].is_null(), "{call}");
    }
    // A release that declares a protected path is refused at import,
    // the path named.
    for declared in [
        data.join("tls"),
        data.clone(),
        backups.clone(),
        data.join("work"),
        etc.clone(),
        config.clone(),
    ] {
        let d = declared.display().to_string();
        let (status, body) = try_import_probe(&site, "probe-declares", json!([]), move |m| {
            m["tools"] = tool(probe(), json!([d]));
        })
        .await;
        assert_eq!(status, 422, "{body}");
        assert!(
            body.to_string().contains("protected path"),
            "{}: {body}",
            declared.display()
        );
    }
}

/// A tool gets a PID namespace and /proc of its own where the host allows
/// it: it sees no host process and cannot signal the appliance; its PATH is
/// the fixed one.
#[tokio::test]
async fn a_tool_sees_no_host_process_and_has_the_fixed_path() {
    let site = Site::start().await;
    let appliance = site.a.child.as_ref().unwrap().id();
    probe_release(
        &site,
        "probe-processes",
        &[("whoami", false), ("processes", false)],
        json!([{"tool": "whoami", "arguments": {}},
               {"tool": "processes", "arguments": {"pid": appliance}}]),
    )
    .await;
    let calls = tool_calls(&site, "probe-processes").await;
    assert_eq!(
        answered(&calls[0])["path"],
        "/usr/local/bin:/usr/bin:/bin",
        "{}",
        calls[0]
    );
    let processes = confinement(&calls[1])["processes"]
        .as_str()
        .unwrap()
        .to_string();
    if processes != "own-namespace" {
        assert!(processes.contains("not isolated"), "{processes}");
        return;
    }
    let seen = answered(&calls[1]);
    let pids: Vec<i64> = seen["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_i64().unwrap())
        .collect();
    assert!(pids.len() <= 3, "the tool sees {pids:?}");
    assert!(!pids.contains(&i64::from(appliance)), "{pids:?}");
    assert!(
        seen["signal_error"]
            .as_str()
            .is_some_and(|e| e.contains("No such process")),
        "{seen}"
    );
}

/// A tool lives in a world built for it: it reaches no Unix-domain socket
/// of the host (one the test makes under a temporary directory and under
/// /run, and PostgreSQL's peer-authenticated one), its `/` holds only what
/// was built, it reads none of the host's accounts or the data dir, opens
/// no netlink, packet or vsock socket, traces nobody, and runs as a uid
/// that is not the appliance's. The receipt names each layer.
#[tokio::test]
async fn a_tool_reaches_no_host_socket_file_or_identity() {
    use std::os::unix::net::UnixListener;
    let sockets = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        sockets.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mut paths = vec![sockets.path().join("open.sock")];
    let mut listeners = vec![UnixListener::bind(&paths[0]).unwrap()];
    if running_as_root() || crate::common::unprivileged_account().is_some() {
        let run =
            std::path::PathBuf::from(format!("/run/agentbay-probe-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&run);
        if let Ok(l) = UnixListener::bind(&run) {
            listeners.push(l);
            paths.push(run);
        }
    }
    for p in &paths {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        // Reachable from outside a tool's world: the probe below means
        // something.
        assert!(
            std::os::unix::net::UnixStream::connect(p).is_ok(),
            "{}",
            p.display()
        );
    }
    if crate::pg::installed() {
        let cluster = crate::pg::PgCluster::shared();
        assert!(cluster.socket().exists(), "{}", cluster.socket().display());
        paths.push(cluster.socket());
    }
    let site = Site::start().await;
    let data = site.a.data_dir.clone();
    let mut calls: Vec<Value> = paths
        .iter()
        .map(|p| json!({"tool": "unix", "arguments": {"path": p}}))
        .collect();
    let reads = [
        "/etc/shadow".to_string(),
        data.join("tls").join("ca.key").display().to_string(),
    ];
    let lists = ["/", "/run", "/var", "/root", "/home", "/dev"]
        .map(String::from)
        .into_iter()
        .chain([data.display().to_string()]);
    calls.extend(
        reads
            .iter()
            .map(|p| json!({"tool": "read", "arguments": {"path": p}})),
    );
    let lists: Vec<String> = lists.collect();
    calls.extend(
        lists
            .iter()
            .map(|p| json!({"tool": "listdir", "arguments": {"path": p}})),
    );
    calls.push(json!({"tool": "families", "arguments": {}}));
    calls.push(json!({"tool": "ptrace", "arguments": {}}));
    calls.push(json!({"tool": "ids", "arguments": {}}));
    probe_release(
        &site,
        "probe-world",
        &[
            ("unix", false),
            ("read", false),
            ("listdir", false),
            ("families", false),
            ("ptrace", false),
            ("ids", false),
        ],
        Value::Array(calls),
    )
    .await;
    let got = tool_calls(&site, "probe-world").await;
    let mut got = got.iter();
    let receipt = confinement(got.clone().next().unwrap()).clone();
    assert!(
        receipt["filesystem"]
            .as_str()
            .unwrap()
            .starts_with("own-root"),
        "{receipt}"
    );
    assert!(
        receipt["syscalls"]
            .as_str()
            .unwrap()
            .starts_with("seccomp filter agentbay-tools/"),
        "{receipt}"
    );
    assert!(
        !receipt["user"].as_str().unwrap().starts_with("shares"),
        "{receipt}"
    );
    for p in &paths {
        let call = got.next().unwrap();
        assert_eq!(
            answered(call)["connected"],
            false,
            "{}: {call}",
            p.display()
        );
    }
    for p in &reads {
        let call = got.next().unwrap();
        assert!(answered(call)["read"].is_null(), "{p}: {call}");
    }
    let built = [
        "bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr", "var",
    ];
    for p in &lists {
        let call = got.next().unwrap();
        let entries = &answered(call)["entries"];
        match p.as_str() {
            "/" => {
                let names: Vec<&str> = entries
                    .as_array()
                    .unwrap_or_else(|| panic!("{call}"))
                    .iter()
                    .map(|e| e.as_str().unwrap())
                    .collect();
                assert!(names.iter().all(|n| built.contains(n)), "/ holds {names:?}");
                assert!(
                    names.contains(&"usr") && names.contains(&"tmp"),
                    "{names:?}"
                );
            }
            "/var" => assert_eq!(entries, &json!(["tmp"]), "{call}"),
            "/dev" => {
                let names: Vec<&str> = entries
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| e.as_str().unwrap())
                    .collect();
                for n in &names {
                    assert!(
                        [
                            "null", "zero", "full", "random", "urandom", "tty", "fd", "stdin",
                            "stdout", "stderr"
                        ]
                        .contains(n),
                        "/dev holds {n}: {names:?}"
                    );
                }
            }
            _ => {
                assert!(entries.is_null(), "{p}: {call}");
                assert_eq!(
                    answered(call)["errno"],
                    2,
                    "{p} exists for the tool: {call}"
                );
            }
        }
    }
    let families = answered(got.next().unwrap()).clone();
    for f in ["AF_NETLINK", "AF_PACKET", "AF_VSOCK"] {
        assert_eq!(families[f]["opened"], false, "{families}");
        assert_eq!(families[f]["errno"], 1, "{f} is not EPERM: {families}");
    }
    let traced = answered(got.next().unwrap()).clone();
    assert_eq!(traced["attached"], false, "{traced}");
    assert_eq!(traced["errno"], 1, "{traced}");
    let ids = answered(got.next().unwrap()).clone();
    assert_ne!(ids["uid"], 0, "{ids}");
    // Its working directory is its own.
    assert_eq!(ids["cwd_owner"], ids["uid"], "{ids}");
    for p in paths.iter().filter(|p| p.starts_with("/run")) {
        let _ = std::fs::remove_file(p);
    }
    drop(listeners);
}

/// A PostgreSQL store reached over a Unix socket, while tools would run as
/// the appliance's own uid (a root appliance whose `runtime.tool_user` is
/// empty), is refused at start, before the store is opened: the message
/// names the key and the fix, and nothing waits for the database.
#[tokio::test]
async fn a_postgres_store_over_a_socket_is_refused_while_tools_share_the_uid() {
    if !running_as_root() {
        // As an unprivileged account with a subordinate range, tools have
        // a uid of their own: nothing to refuse.
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let socket_dir = tmp.path().join("pg-socket");
    let mut child = crate::common::agentbay()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(tmp.path().join("data"))
        .env("AGENTBAY_DEMO__ENABLED", "false")
        .env("AGENTBAY_STORE__BACKEND", "postgres")
        .env(
            "AGENTBAY_STORE__POSTGRES__URL",
            format!(
                "postgresql://agentbay@localhost/agentbay?host={}",
                socket_dir.display()
            ),
        )
        .env("AGENTBAY_RUNTIME__TOOL_USER", "")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut status = None;
    for _ in 0..600 {
        if let Some(s) = child.try_wait().unwrap() {
            status = Some(s);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let Some(status) = status else {
        let _ = child.kill();
        panic!("the appliance waited for the database instead of refusing to start");
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("store.postgres.url connects over the Unix socket")
            && stderr.contains(&socket_dir.display().to_string())
            && stderr.contains("runtime.tool_user"),
        "{stderr}"
    );
}

/// A tool started by a process made ahead is the second process of its
/// PID namespace, the first one staying after it: when the tool ends,
/// what it left running in its namespace has ended before the tool's end
/// is told, its exit status is the tool's own, and nothing of the
/// namespace runs on but that first process, alone in the tool's group.
#[tokio::test]
async fn what_a_tool_leaves_running_has_ended_when_its_end_is_told() {
    use agentbay::domain::amount::Amount;
    use agentbay::runtime::confine::{Confiner, Request};
    if !running_as_root() {
        return;
    }
    agentbay::runtime::confine::spawner::set_program(std::path::Path::new(env!(
        "CARGO_BIN_EXE_agentbay"
    )));
    let dir = tempfile::tempdir().unwrap();
    let confiner = Confiner::detect(dir.path().join("work"), vec![dir.path().join("data")]);
    let config = agentbay::config::RuntimeConfig::default();
    if confiner.host(&config).processes != "a PID namespace and /proc of its own for every tool" {
        return;
    }
    let workdir = confiner.workdir("leaves", &config).unwrap();
    let start = |argv: Vec<String>| {
        let (confiner, config, workdir) = (&confiner, &config, &workdir);
        async move {
            let request = Request {
                argv: &argv,
                cpu: Amount::units(1),
                memory_gb: Amount::units(1),
                egress: false,
                workdir,
                endpoints: &[],
                read_paths: &[],
            };
            confiner.start(&request, config).await.unwrap()
        }
    };
    // The first start sets what the spawner makes ahead; after a quiet
    // moment the next is started by a process made ahead.
    let (tool, _cage) = start(vec!["/bin/true".into()]).await;
    assert!(tool.wait().await.unwrap().success());
    let mut started = None;
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let (tool, cage) = start(vec![
            "/bin/sh".into(),
            "-c".into(),
            "sleep 300 & sleep 300 & exit 3".into(),
        ])
        .await;
        if tool.first {
            started = Some((tool, cage));
            break;
        }
        tool.wait().await.unwrap();
    }
    let (tool, cage) = started.expect("a tool started by a process made ahead");
    let first = tool.pid;
    let namespace = std::fs::read_link(format!("/proc/{first}/ns/pid")).unwrap();
    let status = tool.wait().await.unwrap();
    assert_eq!(status.code(), Some(3), "{status:?}");
    let in_namespace: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/pid")).is_ok_and(|ns| ns == namespace)
                && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')))
        })
        .collect();
    assert_eq!(
        in_namespace,
        vec![first],
        "left running in the tool's namespace"
    );
    drop(cage);
    confiner.remove_workdir("leaves");
    confiner.end_all();
}
