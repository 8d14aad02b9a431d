//! README.md's examples, run as a reader would paste them, so that they
//! cannot drift from the product.

use crate::common::Appliance;

/// The shell block that follows `<!-- readme-test: NAME -->` in README.md.
fn readme_block(name: &str) -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let marker = format!("<!-- readme-test: {name} -->");
    let after = &readme[readme.find(&marker).expect("the marker is in README.md") + marker.len()..];
    let body = after
        .split_once("```sh\n")
        .expect("a sh block follows the marker")
        .1;
    body.split_once("\n```")
        .expect("the block ends")
        .0
        .to_string()
}

#[tokio::test]
async fn the_api_examples_work_pasted_in_order_on_a_fresh_start() {
    // A fresh start with the demo, as README's first command gives.
    let a = Appliance::start_with(&[], &[("AGENTBAY_DEMO__ENABLED", "true")]);
    let block = readme_block("api");
    // What a reader changes: the secrets printed by the start, the address
    // it serves on, where the data directory is.
    let script: String = block
        .lines()
        .map(|line| {
            if line.starts_with("ID=") {
                format!("ID='{}' SECRET='{}'", a.admin.id, a.admin.secret)
            } else {
                line.replace("https://127.0.0.1:8443", &a.url)
                    .replace("$PWD/agentbay-data", &a.data_dir.display().to_string())
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(script.contains(&a.url), "the block names the address");
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "README's API examples failed:\n{script}\n--- stdout\n{stdout}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"version\""), "{stdout}");
    assert!(stdout.contains("\"tenantId\":\"acme\""), "{stdout}");
    assert!(stdout.contains("\"clientSecret\""), "{stdout}");
    assert!(stdout.contains("\"runs\""), "{stdout}");
    assert!(stdout.contains("\"checkpoints\""), "the timeline: {stdout}");
}

#[tokio::test]
async fn the_release_walk_through_works_pasted_in_order_on_a_fresh_start() {
    let a = Appliance::start_with(&[], &[("AGENTBAY_DEMO__ENABLED", "true")]);
    // Pasted beside the appliance's data directory, as README says; what
    // a reader of a checkout changes: where the examples are, and the
    // binary (`cargo run --release --`) standing for `agentbay`.
    let beside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&a.data_dir, beside.path().join("agentbay-data")).unwrap();
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/examples");
    let block = readme_block("releases");
    assert!(
        block.contains("/usr/share/doc/agentbay/examples"),
        "{block}"
    );
    let script = format!(
        "agentbay() {{ '{}' \"$@\"; }}\n{}",
        crate::common::binary(),
        block.replace("/usr/share/doc/agentbay/examples", examples)
    );
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(beside.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "README's release walk-through failed:\n{script}\n--- stdout\n{stdout}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The release is stored Verified, signed by the key just trusted.
    let admin = a.admin_token().await;
    let release = a
        .get(&admin, "/runtime/releases/my-triage-1.0.0?tenant=demo")
        .await;
    assert_eq!(release["state"], "Verified", "{release}");
    // The second `trust add` said what it did: it added acme.
    assert!(
        stdout.contains("added acme; it may sign for tenants acme, demo"),
        "{stdout}"
    );
}
