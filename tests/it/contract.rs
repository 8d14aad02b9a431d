//! The published contract held against the running appliance: a
//! schema-based fuzzer (schemathesis, pinned in
//! `tests/contract/requirements.txt`) reads `/openapi.json` and sends what
//! it allows and what it forbids to every REST route and RPC method, with
//! a token of every scope a tenant's client may hold; any answer that
//! breaks the document (a 5xx, an undocumented status or body, valid data
//! refused, invalid data accepted) fails the test.

use std::process::Command;

use agentbay::domain::access::Scope;

use crate::common::{Appliance, schemathesis};

#[tokio::test]
async fn the_api_keeps_its_published_contract_under_a_fuzzer() {
    let st = schemathesis();
    // Long polls answer within a second, so the fuzzer's requests do not
    // wait out their timeout.
    let a = Appliance::start_with(
        &[],
        &[
            ("AGENTBAY_RUNTIME__MAX_WAIT_SECONDS", "1"),
            ("AGENTBAY_CAPACITY__MAX_WAIT_SECONDS", "1"),
        ],
    );
    // Every scope a tenant's client may hold.
    let scopes: Vec<&str> = Scope::ALL
        .iter()
        .filter(|s| !s.platform_only())
        .map(|s| s.as_str())
        .collect();
    let client = a.create_client("acme", &scopes).await;
    let token = a.token(&client).await;
    let doc = a
        .http()
        .get(format!("{}/openapi.json", a.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let spec = a.root.join("openapi.json");
    std::fs::write(&spec, doc).unwrap();
    let hooks = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/contract");
    // Run in the test's own directory: the fuzzer's caches stay out of the
    // checkout.
    let out = Command::new(&st)
        .current_dir(&a.root)
        .arg("run")
        .arg(&spec)
        .args(["--url", &a.url, "--tls-verify"])
        .arg(a.data_dir.join("tls/ca.pem"))
        .args(["-H", &format!("Authorization: Bearer {token}")])
        // The hooks' checks replace these (Connect's failed_precondition,
        // and streaming refusals in the end-of-stream message).
        .args([
            "--exclude-checks",
            "positive_data_acceptance,missing_required_header,ignored_auth",
        ])
        .args(["--max-examples", "10", "--seed", "1", "--workers", "1"])
        .env("SCHEMATHESIS_HOOKS", "hooks")
        .env("AGENTBAY_FUZZ_CLIENT", &client.id)
        .env("PYTHONPATH", &hooks)
        .env("NO_COLOR", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("schemathesis runs");
    let report = String::from_utf8_lossy(&out.stdout);
    let summary = report
        .lines()
        .rev()
        .find(|l| l.contains(" in "))
        .unwrap_or("");
    assert!(
        out.status.success(),
        "the fuzzer found contract violations ({summary}):\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It tested every operation, past authentication.
    let selected = report
        .lines()
        .find_map(|l| l.trim().strip_prefix("Operations:"))
        .expect("the report names the operations");
    let counts: Vec<&str> = selected
        .split_whitespace()
        .filter(|w| w.parse::<u32>().is_ok())
        .collect();
    assert!(
        counts.len() == 2 && counts[0] == counts[1] && counts[0] != "0",
        "{selected}"
    );
    // (403s are expected: the platform's operations refuse a tenant; and
    // the token endpoint refuses made-up credentials.)
    let refused: Vec<&str> = report
        .lines()
        .skip_while(|l| !l.starts_with("401 Unauthorized ("))
        .skip(1)
        .take_while(|l| l.starts_with("  - "))
        .collect();
    assert!(
        refused.iter().all(|l| *l == "  - POST /oauth/token"),
        "the token stopped working: {refused:?}"
    );
}
