//! lw-confine as a process: the filter is on the command it runs, whose
//! status passes through; its own errors have their documented statuses.
//! (Also what makes `cargo test` build lw-confine, which the sandbox suites
//! mount into gVisor sandboxes.)

use std::process::Command;

fn confine(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lw-confine"))
        .args(args)
        .output()
        .expect("lw-confine runs")
}

#[test]
fn the_command_runs_filtered_without_new_privileges_and_its_status_passes() {
    let o = confine(&["grep", "-E", "^(Seccomp|NoNewPrivs):", "/proc/self/status"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let status = String::from_utf8_lossy(&o.stdout);
    // 2: a filter is installed (SECCOMP_MODE_FILTER).
    assert!(status.lines().any(|l| l == "Seccomp:\t2"), "{status}");
    assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "{status}");
    assert_eq!(confine(&["sh", "-c", "exit 3"]).status.code(), Some(3));
    assert_eq!(
        confine(&["--", "sh", "-c", "exit 5"]).status.code(),
        Some(5)
    );
}

#[test]
fn its_own_errors_have_their_statuses() {
    assert_eq!(confine(&[]).status.code(), Some(64));
    assert_eq!(confine(&["--bogus"]).status.code(), Some(64));
    let missing = confine(&["no-such-command-lw"]);
    assert_eq!(missing.status.code(), Some(127));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no-such-command-lw"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
}
