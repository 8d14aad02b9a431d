//! The shipped Prometheus alert rules and Grafana dashboard
//! (`packaging/prometheus`, `packaging/grafana`): promtool accepts the
//! rules and their unit tests pass, and every series they read is one the
//! appliance exports (`src/telemetry.rs`, `names`) and README.md documents.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const RULES: &str = "packaging/prometheus/agentbay-rules.yml";
const RULE_TESTS: &str = "packaging/prometheus/agentbay-rules.test.yml";
const DASHBOARD: &str = "packaging/grafana/agentbay-dashboard.json";

fn shipped(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(shipped(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// promtool, from Debian's prometheus package (`PROMTOOL` names another).
fn promtool() -> String {
    let promtool = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    match Command::new(&promtool).arg("--version").output() {
        Ok(out) if out.status.success() => promtool,
        Ok(out) => panic!(
            "{promtool} --version failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "the alert rules are checked with promtool, which is not here ({promtool}: {e}): \
             install Debian's prometheus package (apt-get install -y prometheus; .ci/run installs it)"
        ),
    }
}

fn run_promtool(promtool: &str, args: &[&str], path: &str) {
    let out = Command::new(promtool)
        .args(args)
        .arg(shipped(path))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool {} {path} failed:\n--- stdout\n{}\n--- stderr\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn shipped_rules_check_and_their_unit_tests_pass() {
    let promtool = promtool();
    run_promtool(&promtool, &["check", "rules"], RULES);
    run_promtool(&promtool, &["test", "rules"], RULE_TESTS);
}

#[test]
fn every_rule_has_a_unit_test_where_it_fires_and_one_where_it_stays_quiet() {
    let rules: BTreeSet<String> = read(RULES)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|name| name.trim().to_string())
        .collect();
    assert!(rules.contains("AgentbayDown"), "no rules read from {RULES}");
    // Each `alertname:` of the tests is followed by its `exp_alerts:`.
    let (mut fires, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    let tests = read(RULE_TESTS);
    let mut lines = tests.lines().map(str::trim);
    while let Some(line) = lines.next() {
        let Some(name) = line.strip_prefix("alertname:") else {
            continue;
        };
        let expected = lines.next().unwrap_or_default();
        let set = match expected.strip_prefix("exp_alerts:").map(str::trim) {
            Some("[]") => &mut quiet,
            Some("") => &mut fires,
            _ => panic!("alertname {name} is not followed by its exp_alerts: {expected}"),
        };
        set.insert(name.trim().to_string());
    }
    for rule in &rules {
        assert!(
            fires.contains(rule),
            "{RULE_TESTS}: no case where {rule} fires"
        );
        assert!(
            quiet.contains(rule),
            "{RULE_TESTS}: no case where {rule} stays quiet (exp_alerts: [])"
        );
    }
    let unknown: Vec<_> = fires
        .union(&quiet)
        .filter(|n| !rules.contains(*n))
        .collect();
    assert!(unknown.is_empty(), "tests of no rule: {unknown:?}");
}

/// The `expr` of every rule: one line, or the block scalar that follows.
fn rule_exprs(yaml: &str) -> Vec<String> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let lines: Vec<&str> = yaml.lines().collect();
    let mut exprs = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if rest.starts_with('|') || rest.starts_with('>') {
            let mut block = String::new();
            while i < lines.len() && (lines[i].trim().is_empty() || indent(lines[i]) > indent(line))
            {
                block.push_str(lines[i]);
                block.push('\n');
                i += 1;
            }
            exprs.push(block);
        } else {
            exprs.push(rest.to_string());
        }
    }
    exprs
}

/// The names matching `(agentbay|connectsoft)_[a-z_]+` in a PromQL
/// expression, each starting where no name goes on before it.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let ident =
        |c: Option<u8>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b':');
    let mut names = BTreeSet::new();
    for (start, _) in expr.char_indices() {
        if ident(expr[..start].bytes().next_back()) {
            continue;
        }
        let rest = &expr[start..];
        if !(rest.starts_with("agentbay_") || rest.starts_with("connectsoft_")) {
            continue;
        }
        let prefix = rest.find('_').unwrap() + 1;
        let len = rest[prefix..]
            .bytes()
            .take_while(|c| c.is_ascii_lowercase() || *c == b'_')
            .count();
        if len > 0 {
            names.insert(rest[..prefix + len].to_string());
        }
    }
    names
}

/// The metric names held by `src/telemetry.rs`'s `names` module.
fn exported_names() -> BTreeSet<String> {
    let telemetry = read("src/telemetry.rs");
    let module = telemetry
        .split_once("pub mod names {")
        .expect("src/telemetry.rs has its names module")
        .1;
    let module = module.split_once("\n}\n").map_or(module, |(m, _)| m);
    let names: BTreeSet<String> = module
        .lines()
        .filter(|l| l.trim_start().starts_with("pub const"))
        .filter_map(|l| l.split('"').nth(1))
        .map(str::to_string)
        .collect();
    assert!(
        names.contains("agentbay_http_requests_total"),
        "no names read from src/telemetry.rs: {names:?}"
    );
    names
}

/// The exported metric a series belongs to: itself, or the histogram whose
/// `_bucket`, `_sum` or `_count` series it is.
fn family(series: &str, exported: &BTreeSet<String>) -> Option<String> {
    if exported.contains(series) {
        return Some(series.to_string());
    }
    ["_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|suffix| series.strip_suffix(suffix))
        .find(|base| exported.contains(*base))
        .map(str::to_string)
}

/// Whether `name` occurs in `text` as a whole name (not as the start of a
/// longer one).
fn mentions(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].bytes().next_back();
        let after = text[at + name.len()..].bytes().next();
        let ident = |c: Option<u8>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_');
        !ident(before) && !ident(after)
    })
}

#[test]
fn every_series_the_rules_read_is_documented_and_exported() {
    let exported = exported_names();
    let readme = read("README.md");

    let rules: BTreeSet<String> = rule_exprs(&read(RULES))
        .iter()
        .flat_map(|e| metric_names(e.as_str()))
        .collect();
    for expected in [
        "agentbay_capacity_queue_oldest_wait_seconds",
        "agentbay_backup_last_success_timestamp_seconds",
        "agentbay_tool_kills_total",
    ] {
        assert!(
            rules.contains(expected),
            "{expected} not found in the rules' expressions: {rules:?}"
        );
    }
    let mut missing = Vec::new();
    for name in &rules {
        if !exported.contains(name) {
            missing.push(format!(
                "{name}: read by {RULES}, not a name in src/telemetry.rs (names)"
            ));
        }
        if !mentions(&readme, name) {
            missing.push(format!("{name}: read by {RULES}, not in README.md"));
        }
    }

    let dashboard: serde_json::Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    let mut exprs = Vec::new();
    let mut panels: Vec<&serde_json::Value> = dashboard["panels"]
        .as_array()
        .expect("the dashboard has panels")
        .iter()
        .collect();
    while let Some(panel) = panels.pop() {
        // A collapsed row holds its panels.
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.extend(target["expr"].as_str().map(str::to_string));
        }
    }
    let series: BTreeSet<String> = exprs
        .iter()
        .flat_map(|e| metric_names(e.as_str()))
        .collect();
    assert!(
        series.contains("agentbay_http_request_duration_seconds_bucket"),
        "the dashboard's series: {series:?}"
    );
    for name in &series {
        if family(name, &exported).is_none() {
            missing.push(format!(
                "{name}: read by {DASHBOARD}, not a name in src/telemetry.rs (names)"
            ));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn every_exported_series_is_in_the_readme() {
    let readme = read("README.md");
    let section = readme
        .split_once("## Alerts: metrics, rules and dashboard")
        .expect("README.md has its alerts section")
        .1;
    let section = section.split_once("\n## ").map_or(section, |(s, _)| s);
    let undocumented: Vec<_> = exported_names()
        .into_iter()
        .filter(|name| !mentions(section, name))
        .collect();
    assert!(
        undocumented.is_empty(),
        "series missing from the table of README.md's \"Alerts: metrics, rules and dashboard\": {undocumented:?}"
    );
}
