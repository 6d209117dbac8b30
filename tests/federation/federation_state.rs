//! The federation part of the sync state stays bounded (issue 22,
//! leftovers): what was taken from other hosts is a high-water mark of
//! comment ids plus the ids still waiting for parts, so the state file is
//! the same size after thousands of comments as after hundreds, and every
//! message is still taken exactly once, also when pulls are SIGKILLed
//! while they write it (seeded).

use support::federation as federation_support;
use support::seeded;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use federation_support::*;
use mailbox::log::{Action, Log};

const ROUNDS: usize = 6;
const PER_ROUND: usize = 500;

#[test]
fn the_taken_record_stays_bounded_and_exactly_once_through_kills() {
    let (env, a, b) = two_hosts("fed-bounded");
    introduce(&env, &a, &b);
    let state = b.root.state_dir().join("sync.json");
    // An entry in parts whose first part waits on the issue the whole run.
    let mut big = contract_change("large");
    big.body = "0123456789abcdef\n".repeat(9000);
    let parts = sync::render_entry(
        &forward_entry(&big, &["web"]),
        &[],
        sync::github::MAX_COMMENT_CHARS,
    )
    .unwrap();
    assert!(parts.len() >= 2);
    post_as(&env, LOGIN_A, &parts[0]);
    let mut sent = vec![big.id.clone()];
    let (mut sizes, mut kills) = (Vec::new(), 0);
    for round in 0..ROUNDS {
        for i in 0..PER_ROUND {
            let m = contract_change(&format!("round {round} change {i}"));
            let body = sync::render_entry(&forward_entry(&m, &["web"]), &[], 60_000).unwrap();
            post_as(&env, LOGIN_A, &body[0]);
            sent.push(m.id);
        }
        // A pull killed at a random moment (while it delivers or writes
        // the state), then one that runs to the end.
        let mut child = b
            .sync_cmd(&env, &["pull"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The moment of the kill is what is random here; nothing waits on it.
        std::thread::sleep(Duration::from_micros(seeded::below(1_500_000)));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            kills += 1;
        }
        child.wait().unwrap();
        b.sync(&env, &["pull"]);
        let st: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
        assert_eq!(
            st["fed"]["waiting"].as_array().map(Vec::len),
            Some(1),
            "the first part's comment waits: {}",
            st["fed"]
        );
        assert!(st["fed"].get("taken").is_none(), "{}", st["fed"]);
        sizes.push(std::fs::metadata(&state).unwrap().len());
    }
    for p in &parts[1..] {
        post_as(&env, LOGIN_A, p);
    }
    b.sync(&env, &["pull"]);
    let st: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(st["fed"]["waiting"], serde_json::json!([]));
    let last = std::fs::metadata(&state).unwrap().len();
    b.mediate();

    let outbox = b.names("sandboxes/api/outbox");
    let inbox = b.names("sandboxes/web/inbox");
    let lost = sent.iter().filter(|id| !inbox.contains(id)).count();
    let extra = inbox.len() + lost - sent.len();
    let mut forwards: BTreeMap<String, usize> = BTreeMap::new();
    for e in Log::new(b.root.log_dir()).entries().unwrap().0 {
        if e.decision.action == Action::Forward {
            *forwards.entry(e.message_id).or_default() += 1;
        }
    }
    println!(
        "federation state: seed {}, comments {}, pulls killed {kills}, state size after each {PER_ROUND} comments {sizes:?} bytes, at the end {last} bytes; delivered {}, lost {lost}, extra {extra}, quarantined {}",
        seeded::seed(),
        ROUNDS * PER_ROUND + parts.len(),
        inbox.len(),
        b.names("quarantine").len()
    );
    assert_eq!(lost, 0);
    assert_eq!(extra, 0);
    assert_eq!(outbox.len(), sent.len());
    assert!(b.names("quarantine").is_empty());
    assert!(forwards.values().all(|&n| n == 1));
    assert_eq!(forwards.len(), sent.len());
    // Bounded: the last round's state is no larger than the first's but
    // for the digits of a larger mark and cursor.
    assert!(
        sizes.iter().chain([&last]).all(|&s| s <= sizes[0] + 32),
        "the state grew: {sizes:?} then {last}"
    );
}

#[test]
fn an_idle_pull_asks_with_the_etag_and_a_304_costs_nothing() {
    let (env, a, b) = two_hosts("fed-etag");
    introduce(&env, &a, &b);
    b.sync(&env, &["pull"]);
    env.ctl("DELETE", "requests", serde_json::Value::Null);
    for _ in 0..3 {
        b.sync(&env, &["pull"]);
    }
    let (reqs, _) = env.requests();
    let statuses: Vec<u64> = reqs.iter().map(|r| r["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, [304, 304, 304], "{reqs:?}");
    // Something new: listed again in full, and taken.
    let m = contract_change("after the quiet");
    a.root.sandbox("api").outbox().deliver_message(&m).unwrap();
    a.mediate();
    a.sync(&env, &["--once"]);
    b.sync(&env, &["pull"]);
    b.mediate();
    assert_eq!(b.names("sandboxes/web/inbox"), [m.id.as_str()]);
    let (reqs, _) = env.requests();
    assert_eq!(reqs.last().unwrap()["status"], 200, "{reqs:?}");
}
