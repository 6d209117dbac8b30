//! SIGKILL lw-sync at random moments while 1,000 messages sync and the
//! server drops connections after committing comments: no duplicate, no loss.
//!
//! The 1 s spacing between writes is lowered with the documented testing knob
//! LW_SYNC_MIN_WRITE_INTERVAL_MS (the minute and hour windows scale with it);
//! crates/sync/tests/sync/sync_limits.rs checks the real spacing.

use support::seeded;

use support::sync as sync_support;

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use sync_support::*;

fn random_below(n: u64) -> u64 {
    seeded::below(n)
}

#[test]
fn sigkill_200_times_while_1000_messages_sync() {
    let env = Env::new("kill");
    env.faults(
        json!([{ "kind": "drop_after_commit", "method": "POST", "count": 0, "probability": 0.15 }]),
    );
    let log = env.log();
    let mut names = Vec::new();
    let (mut kills, mut finished, mut runs) = (0, 0, 0);
    while kills < 210 {
        if names.len() < 1000 {
            names.extend(append_n(&log, 5, "kill test").into_iter().map(|e| e.name));
        }
        let mut child = env
            .sync_cmd(&["--once", "--batch", "4"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        runs += 1;
        // The moment of the kill is what is random here; nothing waits on it.
        std::thread::sleep(Duration::from_micros(random_below(120_000)));
        match child.try_wait().unwrap() {
            Some(_) => finished += 1,
            None => {
                child.kill().unwrap(); // SIGKILL
                kills += 1;
            }
        }
        child.wait().unwrap();
        assert!(runs < 5000, "too few kills landed: {kills} in {runs} runs");
    }
    while names.len() < 1000 {
        names.extend(append_n(&log, 5, "kill test").into_iter().map(|e| e.name));
    }
    // Let it finish undisturbed (the drops continue).
    let mut done = false;
    for _ in 0..50 {
        let o = env.sync(&["--once", "--batch", "4"]);
        runs += 1;
        if o.status.success() {
            let counts = env.section_counts(1);
            if names.iter().all(|n| counts.contains_key(n)) {
                done = true;
                break;
            }
        }
    }
    assert!(done, "the log never finished syncing");
    let counts = env.section_counts(1);
    let duplicated = counts.values().filter(|&&c| c > 1).count();
    let missing = names.iter().filter(|n| !counts.contains_key(*n)).count();
    let (reqs, _) = env.requests();
    let drops = reqs
        .iter()
        .filter(|r| r["fault"] == "drop_after_commit")
        .count();
    let comments = env.comments(1).len();
    let posts = reqs.iter().filter(|r| r["method"] == "POST").count();
    // Each listing is a reconciliation: a run that found an intent whose
    // outcome it did not know (a kill mid-post, or a dropped connection).
    let listings = reqs
        .iter()
        .filter(|r| {
            r["method"] == "GET"
                && r["path"].as_str().unwrap().contains("/comments")
                && !r["path"].as_str().unwrap().contains("&page=")
        })
        .count();
    println!(
        "kill test: seed {}, messages {}, kills {kills}, runs {runs} ({finished} finished before the kill), drop-after-commit faults {drops}, POSTs {posts}, reconciliations {listings}, comments {comments}, duplicated {duplicated}, missing {missing}",
        seeded::seed(),
        names.len()
    );
    assert_eq!(names.len(), 1000);
    assert_eq!(duplicated, 0);
    assert_eq!(missing, 0);
    assert!(kills >= 200);
    assert!(drops > 0, "the fault never fired");
    let o = env.sync(&["verify"]);
    assert!(
        o.status.success(),
        "verify: {}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
}
