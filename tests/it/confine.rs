//! Tools under their lease: what a tool process may use and reach, and what
//! it is told about the call it serves. The tools are a real MCP server
//! over stdio (`tests/tools/probe_mcp.py`) whose tools probe the process
//! they run in.

use serde_json::{Value, json};

use crate::builtin::{Site, answer};

/// The probe MCP server's command line: the system's Python (a Python
/// manager's shim would need its own directories).
fn probe() -> Vec<String> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/probe_mcp.py");
    let python = if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    vec![python.into(), script.display().to_string()]
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
    site.import(
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
