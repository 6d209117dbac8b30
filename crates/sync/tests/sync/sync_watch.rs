//! lw-sync --watch: entries renamed into the log are mirrored as they
//! arrive, and a cron run alongside the watcher never posts one twice.

use support::sync as sync_support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use sync_support::*;

/// Waits until the server holds every entry (the server is the event here;
/// this bounds the wait, it does not replace it).
fn wait_for(env: &Env, names: &[String], limit: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        let counts = env.section_counts(1);
        if names.iter().all(|n| counts.contains_key(n)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn the_watcher_mirrors_new_entries_and_cron_alongside_it_adds_no_duplicate() {
    let env = Env::new("watch");
    let mut names: Vec<String> = append_n(&env.log(), 3, "before")
        .into_iter()
        .map(|e| e.name)
        .collect();
    let mut w = env
        .sync_cmd(&["--watch", "--interval", "3600"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_for(&env, &names, Duration::from_secs(20)),
        "the backlog was not synced"
    );
    // Arrivals while it watches: Log::append renames into log/new.
    for round in 0..5 {
        names.extend(
            append_n(&env.log(), 2, &format!("round {round}"))
                .into_iter()
                .map(|e| e.name),
        );
        // A cron run at the same time.
        let o = env.sync(&["--once"]);
        assert!(o.status.success(), "{}", text(&o.stderr));
    }
    assert!(
        wait_for(&env, &names, Duration::from_secs(20)),
        "arrivals were not synced"
    );
    // Without cron: only the watcher's events can sync these (its timer is an hour).
    let alone: Vec<String> = append_n(&env.log(), 2, "alone")
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.extend(alone.iter().cloned());
    assert!(
        wait_for(&env, &alone, Duration::from_secs(20)),
        "the watcher missed a rename into log/new"
    );
    w.kill().unwrap();
    w.wait().unwrap();
    let counts = env.section_counts(1);
    let dup = counts.values().filter(|&&c| c > 1).count();
    println!(
        "watch: {} entries, {} comments, duplicated {dup}",
        names.len(),
        env.comments(1).len()
    );
    assert_eq!(dup, 0);
    assert_eq!(counts.len(), names.len());
}
