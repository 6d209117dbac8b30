//! The main job end to end (scripts/main-job), twice in a row, on the real
//! Docker engine, real git and the local GitHub-compatible sink: two sandboxes
//! coordinate a contract change through the mediator, a person's answer comes
//! back, both branches are pushed, the log lands on the issue; the second run
//! rebuilds nothing, and neither leaves anything behind.

use std::path::Path;
use std::process::{Command, Stdio};

/// scripts/main-job, non-interactive (`--yes`), on the binaries under test.
fn main_job(work: &Path) -> Command {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_lw")).parent().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/main-job");
    let mut c = Command::new("bash");
    c.arg(&script).arg("--yes").arg("--work").arg(work);
    c.env("LW_BIN_DIR", bin_dir).stdin(Stdio::null());
    c
}

fn run_main_job(work: &Path) -> String {
    let o = main_job(work).output().expect("bash runs scripts/main-job");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        o.status.success(),
        "scripts/main-job failed ({:?}):\n{out}\n{err}",
        o.status
    );
    out
}

fn has_line(t: &str, parts: &[&str]) -> bool {
    t.lines().any(|l| parts.iter().all(|p| l.contains(p)))
}

#[test]
fn main_job_runs_twice_and_leaves_nothing_behind() {
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("main-job");
    let first = run_main_job(&work);
    println!("{first}");
    // Every message's path through the system.
    assert!(
        has_line(
            &first,
            &[
                "forward",
                "producer -> consumer",
                "contract-change",
                "scope overlaps"
            ]
        ),
        "{first}"
    );
    assert!(
        has_line(&first, &["read", "producer -> consumer", "consumer acked"]),
        "{first}"
    );
    assert!(
        has_line(&first, &["escalate", "consumer -> human", "question"]),
        "{first}"
    );
    assert!(
        has_line(&first, &["forward", "human -> consumer", "answer"]),
        "{first}"
    );
    // Both branches left by push, and together they keep the contract.
    assert!(
        has_line(
            &first,
            &["task/producer", "contract: user.name is now user.full_name"]
        ),
        "{first}"
    );
    assert!(
        has_line(&first, &["task/consumer", "fall back to user.name"]),
        "{first}"
    );
    assert!(
        first.contains("merged check:  ok: Hello, Ada Lovelace"),
        "{first}"
    );
    assert!(first.contains("Host checkout: untouched"), "{first}");
    assert!(first.contains("Left behind: 0 containers, 0 volumes, 0 sandboxes listed by lw-sandbox ls, 0 port leases."), "{first}");
    assert!(
        has_line(
            &first,
            &["lw-sync verify: the issue holds all 5 log entries, each once"]
        ),
        "{first}"
    );

    let second = run_main_job(&work);
    println!("{second}");
    assert!(
        second.contains("Image layers: 0 built this run (3 cached)."),
        "the second run rebuilt a layer:\n{second}"
    );
    assert!(second.contains("Left behind: 0 containers, 0 volumes, 0 sandboxes listed by lw-sandbox ls, 0 port leases."), "{second}");

    // lw doctor, run by the job after it cleaned up: nothing fails.
    for t in [&first, &second] {
        let doctor: String = t
            .lines()
            .skip_while(|l| !l.starts_with("lw doctor"))
            .take_while(|l| !l.starts_with("Steps:"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            has_line(&doctor, &["ok", "image", "layer deps is current"]),
            "{doctor}"
        );
        assert!(
            has_line(&doctor, &["ok", "github", "reads demo/contract-change#1"]),
            "{doctor}"
        );
        assert!(!doctor.contains("FAIL"), "{doctor}");
    }
}
