//! The Python SDK's own tests (pytest, `packaging/python/tests`) against
//! this build's binary: the wheel installed offline, the clients, the
//! Worker through every move and a SIGKILL, LangGraph on agentbay. Their
//! environment is `packaging/python/test-env.sh` (pinned, made once).

use std::path::Path;
use std::process::Command;

#[test]
fn the_python_sdk_passes_its_tests_against_the_appliance() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let made = Command::new(root.join("packaging/python/test-env.sh"))
        .output()
        .expect("packaging/python/test-env.sh runs");
    assert!(
        made.status.success(),
        "the Python test environment: {}{}",
        String::from_utf8_lossy(&made.stdout),
        String::from_utf8_lossy(&made.stderr)
    );
    let out = Command::new(root.join("target/python-test/bin/python"))
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"])
        .arg(root.join("packaging/python/tests"))
        .current_dir(root)
        .env("AGENTBAY_BIN", crate::common::binary())
        .output()
        .expect("pytest runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        !text.contains(" skipped"),
        "no SDK test may be skipped: {text}"
    );
    println!("{text}");
}
