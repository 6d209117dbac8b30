//! lw-model-proxy as a command: its arguments, its settings and its exit
//! statuses (64 for an argument, 78 for a missing or bad setting).  The
//! proxy's traffic is tested by the product's tests/agent/model_proxy.rs,
//! which runs the command this crate builds: cargo builds a package's
//! binaries for `cargo test` only when the package has an integration test,
//! so this file is also what puts target/<profile>/lw-model-proxy there.

use std::process::{Command, Output};

fn proxy(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lw-model-proxy"));
    cmd.args(args).env_clear();
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("lw-model-proxy runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn help_names_every_required_setting_and_version_is_the_crates() {
    let help = proxy(&["--help"], &[]);
    assert_eq!(help.status.code(), Some(0), "{}", stderr(&help));
    let text = String::from_utf8_lossy(&help.stdout);
    for k in [
        "LW_MODEL_UPSTREAM",
        "LW_MODEL_ENDPOINT",
        "LW_MODEL_KEY_HEADER",
    ] {
        assert!(text.contains(k), "--help does not name {k}:\n{text}");
    }
    let version = proxy(&["--version"], &[]);
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("lw-model-proxy {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn an_argument_is_64_naming_it() {
    let out = proxy(&["--listen=0.0.0.0:1"], &[]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("'--listen=0.0.0.0:1'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_missing_or_bad_setting_is_78_naming_the_setting() {
    let ok = [
        ("LW_MODEL_UPSTREAM", "https://api.example.test"),
        ("LW_MODEL_ENDPOINT", "POST /v1/messages"),
        ("LW_MODEL_KEY_HEADER", "x-api-key"),
    ];
    // Each required setting left out in turn.
    for skip in 0..ok.len() {
        let env: Vec<_> = ok
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != skip)
            .map(|(_, kv)| *kv)
            .collect();
        let out = proxy(&[], &env);
        assert_eq!(
            out.status.code(),
            Some(78),
            "without {}: {}",
            ok[skip].0,
            stderr(&out)
        );
        assert!(stderr(&out).contains(ok[skip].0), "{}", stderr(&out));
    }
    // Values a typo or a hostile kit file could give.
    let bad = [
        ("LW_MODEL_UPSTREAM", "ftp://api.example.test"),
        ("LW_MODEL_UPSTREAM", "https://api.example.test:port"),
        ("LW_MODEL_ENDPOINT", ""),
        ("LW_MODEL_MAX_RPM", "twenty"),
    ];
    for (k, v) in bad {
        let mut env: Vec<_> = ok.iter().filter(|(name, _)| *name != k).copied().collect();
        env.push((k, v));
        let out = proxy(&[], &env);
        assert_eq!(out.status.code(), Some(78), "{k}={v}: {}", stderr(&out));
        assert!(stderr(&out).contains(k), "{k}={v}: {}", stderr(&out));
    }
}
