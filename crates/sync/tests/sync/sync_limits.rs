//! Rate limits as GitHub documents them, with the real 1 s spacing: writes at
//! least 1 s apart, and no request inside a window the server blocked
//! (retry-after on 403 and 429, an exhausted primary limit), across runs.

use support::sync as sync_support;

use serde_json::{Value, json};
use sync_support::*;

fn writes_gap_ms(reqs: &[Value]) -> Option<f64> {
    let t: Vec<f64> = reqs
        .iter()
        .filter(|r| r["write"] == true)
        .map(|r| r["t_ms"].as_f64().unwrap())
        .collect();
    t.windows(2).map(|w| w[1] - w[0]).reduce(f64::min)
}

#[test]
fn writes_are_1s_apart_and_no_request_falls_in_a_blocked_window() {
    let env = Env::new("limits");
    env.faults(json!([
        { "kind": "secondary", "status": 403, "retry_after": 2, "method": "POST", "skip": 1, "count": 1 },
        { "kind": "secondary", "status": 429, "retry_after": 1, "method": "POST", "skip": 2, "count": 1 },
        { "kind": "primary", "retry_after": 1, "method": "GET", "count": 1 }
    ]));
    let entries = append_n(&env.log(), 4, "paced");
    let real = |args: &[&str]| {
        env.sync_cmd(args)
            .env_remove("LW_SYNC_MIN_WRITE_INTERVAL_MS")
            .output()
            .unwrap()
    };
    let o = real(&["--once", "--batch", "1"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // A long retry-after, then runs that must not send inside it.
    env.faults(json!([{ "kind": "secondary", "status": 403, "retry_after": 4, "method": "POST", "count": 1 }]));
    append_n(&env.log(), 1, "blocked");
    let o = real(&["--once", "--max-wait", "1"]);
    assert_eq!(o.status.code(), Some(75), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("try again later"),
        "{}",
        text(&o.stderr)
    );
    let before = env.requests().0.len();
    let o = real(&["--once", "--max-wait", "1"]);
    assert_eq!(o.status.code(), Some(75));
    assert_eq!(
        env.requests().0.len(),
        before,
        "a run inside the window sends nothing"
    );
    let o = real(&["--once"]);
    assert!(o.status.success(), "{}", text(&o.stderr));

    let (reqs, windows) = env.requests();
    let inside = reqs.iter().filter(|r| r["in_window"] == true).count();
    let gap = writes_gap_ms(&reqs).unwrap();
    let writes = reqs.iter().filter(|r| r["write"] == true).count();
    println!(
        "limits: requests {}, writes {writes}, smallest gap between writes {gap:.0} ms (limit 1000 ms, ratio {:.2}), blocked windows {}, requests inside them {inside}",
        reqs.len(),
        gap / 1000.0,
        windows.len()
    );
    assert_eq!(windows.len(), 4, "{windows:?}");
    assert_eq!(inside, 0, "{reqs:#?}");
    assert!(gap >= 1000.0, "{gap}");
    let counts = env.section_counts(1);
    assert!(entries.iter().all(|e| counts.get(&e.name) == Some(&1)));
    assert_eq!(counts.values().sum::<usize>(), 5);
}

#[test]
fn a_secondary_limit_without_headers_backs_off_a_minute_then_exponentially() {
    // Scaled: with a 20 ms interval, GitHub's "one minute" is 1.2 s.
    let env = Env::new("secondary");
    env.faults(json!([{ "kind": "secondary", "status": 403, "method": "POST", "count": 2 }]));
    // The server's own window is a real minute; the scaled client must wait at
    // least the scaled minute, then twice that.
    let entries = append_n(&env.log(), 1, "x");
    let t0 = std::time::Instant::now();
    let o = env
        .sync_cmd(&["--once"])
        .env("LW_SYNC_MIN_WRITE_INTERVAL_MS", "20")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let waited = t0.elapsed().as_millis();
    let (reqs, _) = env.requests();
    let posts: Vec<f64> = reqs
        .iter()
        .filter(|r| r["method"] == "POST")
        .map(|r| r["t_ms"].as_f64().unwrap())
        .collect();
    assert_eq!(posts.len(), 3);
    println!(
        "secondary backoff (scaled 1/50): gaps {:.0} ms then {:.0} ms",
        posts[1] - posts[0],
        posts[2] - posts[1]
    );
    assert!(
        posts[1] - posts[0] >= 1200.0 && posts[2] - posts[1] >= 2400.0,
        "{posts:?}"
    );
    assert!(waited >= 3600);
    assert_eq!(env.section_counts(1).get(&entries[0].name), Some(&1));
}

#[test]
fn the_hourly_budget_holds_across_runs() {
    // Runs before this one made 499 writes in the last hour (the budget is
    // in the state file): this run may not write, and says when it can.
    let env = Env::new("hour");
    append_n(&env.log(), 1, "first");
    let o = env
        .sync_cmd(&["--once"])
        .env_remove("LW_SYNC_MIN_WRITE_INTERVAL_MS")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let path = env.root.join("state/sync.json");
    let mut st: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let now = base::time::now_ms();
    st["budget"]["writes"] = (0..499u64)
        .map(|i| now - 3_000_000 + i * 5000)
        .collect::<Vec<_>>()
        .into();
    std::fs::write(&path, serde_json::to_vec(&st).unwrap()).unwrap();
    append_n(&env.log(), 1, "second");
    let before = env.requests().0.len();
    let o = env
        .sync_cmd(&["--once", "--max-wait", "2"])
        .env_remove("LW_SYNC_MIN_WRITE_INTERVAL_MS")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(75), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("content-creation budget is spent until"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(env.requests().0.len(), before, "no request was sent");
    println!("hour budget: 499 writes on record -> the next run sends nothing and exits 75");
}
