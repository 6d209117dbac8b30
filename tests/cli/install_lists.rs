//! Every command the workspace ships is built by scripts/install and has a
//! row in README.md's command table (`lw help` lists what install put next
//! to `lw`; a command missing there answers "not a command").

use std::path::Path;

/// The packages whose `[[bin]]`s are the product's commands (the test
/// tools' packages are not installed).
const PACKAGES: &[&str] = &[
    "Cargo.toml",
    "crates/mailbox/Cargo.toml",
    "crates/mcp/Cargo.toml",
    "crates/confine/Cargo.toml",
    "crates/model-proxy/Cargo.toml",
    "crates/cockpit/Cargo.toml",
    "crates/sync/Cargo.toml",
    "bins/lw-github-sink/Cargo.toml",
];

fn read(p: &str) -> String {
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(top.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// The `name` of each `[[bin]]` table of a manifest.
fn bins(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_bin = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin && let Some(v) = line.strip_prefix("name = ") {
            out.push(v.trim_matches('"').to_string());
        }
    }
    out
}

/// The words of a bash array assignment `NAME=(a b c)` in scripts/install.
fn array(script: &str, name: &str) -> Vec<String> {
    let line = script
        .lines()
        .find(|l| l.starts_with(&format!("{name}=(")))
        .unwrap_or_else(|| panic!("scripts/install has no {name}=( line"));
    let inner = &line[name.len() + 2..line.rfind(')').unwrap()];
    inner.split_whitespace().map(String::from).collect()
}

#[test]
fn every_command_is_installed_and_in_the_readme_table() {
    let commands: Vec<String> = PACKAGES.iter().flat_map(|p| bins(&read(p))).collect();
    assert!(commands.len() >= 16, "{commands:?}");
    let install = read("scripts/install");
    let mut installed = array(&install, "host");
    installed.extend(array(&install, "inside"));
    let readme = read("README.md");
    let mut missing = Vec::new();
    for c in &commands {
        if !installed.contains(c) {
            missing.push(format!("{c}: not built by scripts/install"));
        }
        if !readme.contains(&format!("| `{c}` |")) {
            missing.push(format!("{c}: no row in README.md's command table"));
        }
    }
    for i in &installed {
        if !commands.contains(i) {
            missing.push(format!("{i}: in scripts/install but no package builds it"));
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
    println!(
        "{} commands: all installed and in the README table",
        commands.len()
    );
}
