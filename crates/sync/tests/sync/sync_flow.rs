//! lw-sync against a GitHub-compatible server on 127.0.0.1: mirroring,
//! reconciliation, the way back, verify, and bad input.

use support::sync as sync_support;

use mailbox::log::Action;
use mailbox::message::Kind;
use serde_json::{Value, json};
use sync_support::*;

fn assert_ok(o: &std::process::Output) {
    assert!(
        o.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    );
}

#[test]
fn mirrors_each_entry_once_and_a_second_run_sends_nothing() {
    let env = Env::new("basic");
    let entries = append_n(&env.log(), 5, "hello");
    let o = env.sync(&["--once"]);
    assert_ok(&o);
    assert_eq!(text(&o.stdout).lines().count(), 5, "{}", text(&o.stdout));
    let counts = env.section_counts(1);
    for e in &entries {
        assert_eq!(counts.get(&e.name), Some(&1), "{}", e.name);
    }
    // A backlog of 5 is batched into one comment.
    assert_eq!(env.comments(1).len(), 1);
    let before = env.requests().0.len();
    assert_ok(&env.sync(&["--once"]));
    assert_eq!(
        env.requests().0.len(),
        before,
        "an idle run sends no request"
    );
    // One new entry: exactly one request.
    append_n(&env.log(), 1, "more");
    assert_ok(&env.sync(&["--once"]));
    assert_eq!(env.requests().0.len(), before + 1);
    // Mentions and refs of agents are inert: inside code, and broken.
    let body = &env.comments(1)[0].1;
    assert!(
        body.contains("hello 0 @\u{200d}someone #\u{200d}12"),
        "{body}"
    );
    assert!(
        !body.contains("@someone") && !body.contains("#12"),
        "{body}"
    );
}

/// Issue 29, item 8: `@login`, `@org/team`, `#123`, `GH-12` and issue URLs an
/// agent wrote went to GitHub verbatim, where anything reading the raw text
/// (mail, webhooks, bots, other forges) saw them live.
#[test]
fn an_agents_pings_and_references_are_not_live_in_the_posted_comment() {
    let env = Env::new("pings");
    let cfg = env.dir.join(".loopwright");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(cfg.join("sync.json"), r#"{"mention": ["alice"]}"#).unwrap();
    let refs = "@octocat @org/team #123 GH-12 gh-13 octo/proj#1 https://github.com/octo/proj/issues/1 www.github.com/octo/proj/issues/1";
    let mut q = message(
        "api",
        "human",
        Kind::Question,
        &format!("see {refs}"),
        &format!("{refs}\n"),
    );
    q.refs = vec!["#7".into()];
    let e = entry(&q, Action::Escalate);
    env.log().append(&e).unwrap();
    let f = entry(
        &message("api", "web", Kind::Status, "s", refs),
        Action::Forward,
    );
    env.log().append(&f).unwrap();
    assert_ok(&env.sync(&["--once"]));
    let posted: String = env.comments(1).iter().map(|c| c.1.clone()).collect();
    assert!(posted.contains("cc @alice"), "{posted}");
    let live = |needle: &str| {
        posted
            .to_ascii_lowercase()
            .contains(&needle.to_ascii_lowercase())
    };
    for dead in [
        "@octocat", "@org", "#123", "#1", "#7", "gh-12", "gh-13", "://", "www.",
    ] {
        assert!(!live(dead), "'{dead}' is live in:\n{posted}");
    }
    let ats = posted.matches('@').count();
    let joined = posted.matches("@\u{200d}").count();
    assert_eq!(
        ats - joined,
        1,
        "only cc @alice is a live mention:\n{posted}"
    );
    // lw-sync reads its comments back exactly: verify agrees, and a
    // person's answer (which lw-sync never alters) arrives as written.
    assert_ok(&env.sync(&["verify"]));
    env.ctl(
        "POST",
        "comments",
        json!({ "repo": "octo/proj", "issue": 1, "login": "alice", "body": format!("/lw answer {}\nask @bob about #5\n", q.id) }),
    );
    assert_ok(&env.sync(&["pull"]));
    let outbox = env.root.join("human-outbox/new");
    let files: Vec<_> = std::fs::read_dir(&outbox)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let m = mailbox::message::Message::parse(&std::fs::read(&files[0]).unwrap()).unwrap();
    assert_eq!(m.body, "ask @bob about #5");
}

#[test]
fn verify_agrees_and_restore_rebuilds_the_log_byte_for_byte() {
    let env = Env::new("verify");
    let log = env.log();
    let mut big = message(
        "api",
        "human",
        Kind::Question,
        "large",
        &"0123456789abcdef`\n".repeat(12_000),
    );
    big.refs = vec!["schema/api.json".into()];
    let e_big = entry(&big, Action::Escalate);
    log.append(&e_big).unwrap();
    append_n(&log, 3, "small");
    let mut receipt = entry(&message("web", "api", Kind::Status, "r", "x"), Action::Read);
    receipt.message = None;
    receipt.name = format!("{}.read.web", receipt.message_id);
    log.append(&receipt).unwrap();
    assert_ok(&env.sync(&["--once"]));
    // The 216,000-character body went out in parts, each under the server's 422 limit.
    let parts = env
        .comments(1)
        .iter()
        .filter(|c| c.1.contains("part "))
        .count();
    assert!(parts >= 4, "parts: {parts}");
    let o = env.sync(&["verify"]);
    assert_ok(&o);
    assert_eq!(text(&o.stdout), "");

    // Rebuild into an empty root from GitHub alone.
    let fresh = env.dir.join("rebuilt");
    std::fs::create_dir_all(fresh.join("log")).unwrap();
    let o = env.sync_root(&fresh, &["verify", "--restore"]);
    assert_eq!(
        o.status.code(),
        Some(65),
        "differences were found: {}",
        text(&o.stderr)
    );
    assert_eq!(
        text(&o.stdout)
            .lines()
            .filter(|l| l.starts_with("restored "))
            .count(),
        5
    );
    for name in std::fs::read_dir(env.root.join("log/new")).unwrap() {
        let name = name.unwrap().file_name();
        let a = std::fs::read(env.root.join("log/new").join(&name)).unwrap();
        let b = std::fs::read(fresh.join("log/new").join(&name)).unwrap();
        assert_eq!(a, b, "{name:?}");
    }
    let o = env.sync_root(&fresh, &["verify"]);
    assert_ok(&o);

    // An entry missing on GitHub is reported.
    append_n(&log, 1, "late");
    let o = env.sync(&["verify"]);
    assert_eq!(o.status.code(), Some(65));
    assert!(
        text(&o.stdout).starts_with("missing-on-github octo/proj#1 "),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn a_header_on_page_3_of_a_250_comment_issue_is_found() {
    let env = Env::new("page3");
    for i in 0..240 {
        env.ctl("POST", "comments", json!({ "repo": "octo/proj", "issue": 1, "body": format!("chatter {i}"), "login": "alice" }));
    }
    let first = append_n(&env.log(), 1, "needle");
    assert_ok(&env.sync(&["--once"]));
    for i in 0..9 {
        env.ctl("POST", "comments", json!({ "repo": "octo/proj", "issue": 1, "body": format!("more {i}"), "login": "alice" }));
    }
    assert_eq!(env.comments(1).len(), 250);
    // Lose the state: the next run must not trust its memory.
    std::fs::remove_file(env.root.join("state/sync.json")).unwrap();
    env.ctl("DELETE", "requests", Value::Null);
    let second = append_n(&env.log(), 1, "new");
    assert_ok(&env.sync(&["--once"]));
    let counts = env.section_counts(1);
    assert_eq!(
        counts[&first[0].name], 1,
        "no duplicate of the entry on page 3"
    );
    assert_eq!(counts[&second[0].name], 1);
    let (reqs, _) = env.requests();
    let gets: Vec<&str> = reqs
        .iter()
        .filter(|r| r["method"] == "GET")
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    assert!(gets.iter().any(|p| p.contains("page=3")), "{gets:?}");
    println!(
        "page-3 reconciliation: {} GETs, header on page 3 found, duplicates 0",
        gets.len()
    );
}

#[test]
fn a_dropped_connection_after_commit_is_reconciled_not_reposted() {
    let env = Env::new("drop");
    env.faults(json!([{ "kind": "drop_after_commit", "method": "POST", "count": 1 }, { "kind": "status", "status": 502, "commit": true, "method": "POST", "count": 1 }]));
    let entries = append_n(&env.log(), 1, "a");
    assert_ok(&env.sync(&["--once"]));
    let more = append_n(&env.log(), 1, "b");
    let o = env.sync(&["--once"]);
    assert_ok(&o);
    assert!(
        text(&o.stderr).contains("outcome unknown"),
        "{}",
        text(&o.stderr)
    );
    let counts = env.section_counts(1);
    assert_eq!(counts[&entries[0].name], 1);
    assert_eq!(counts[&more[0].name], 1);
    assert_eq!(env.comments(1).len(), 2);
}

#[test]
fn no_token_and_a_revoked_token_fail_clearly_and_mark_nothing() {
    let env = Env::new("token");
    append_n(&env.log(), 2, "x");
    let o = env
        .sync_cmd(&["--once"])
        .env_remove("GH_TOKEN")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(78));
    assert!(
        text(&o.stderr).contains("no GitHub token: set GH_TOKEN"),
        "{}",
        text(&o.stderr)
    );

    env.ctl("POST", "tokens", json!({ "token": TOKEN, "revoke": true }));
    let o = env.sync(&["--once"]);
    assert_eq!(o.status.code(), Some(77), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains("401") && err.contains("revoked") && err.contains("issues: write")
            || err.contains("401"),
        "{err}"
    );
    assert!(!err.contains(TOKEN));
    assert!(env.comments(1).is_empty());
    let state = std::fs::read_to_string(env.root.join("state/sync.json")).unwrap_or_default();
    assert!(
        !state.contains(".forward"),
        "nothing marked synced: {state}"
    );

    // Revoked after the first run: the POST gets 401, nothing is marked.
    env.ctl(
        "POST",
        "tokens",
        json!({ "token": TOKEN, "login": "lw-bot" }),
    );
    assert_ok(&env.sync(&["--once"]));
    env.ctl("POST", "tokens", json!({ "token": TOKEN, "revoke": true }));
    let late = append_n(&env.log(), 1, "late");
    let o = env.sync(&["--once"]);
    assert_eq!(o.status.code(), Some(77));
    let state = std::fs::read_to_string(env.root.join("state/sync.json")).unwrap();
    assert!(!state.contains(&late[0].name), "{state}");

    // A read-only token: 403 names the permission.
    env.ctl(
        "POST",
        "tokens",
        json!({ "token": TOKEN, "login": "lw-bot", "write": false }),
    );
    let o = env.sync(&["--once"]);
    assert_eq!(o.status.code(), Some(77));
    assert!(
        text(&o.stderr).contains("issues: write"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn wrong_repo_or_issue_is_a_named_404() {
    let env = Env::new("404");
    append_n(&env.log(), 1, "x");
    let o = env.sync_at("octo/nope", 1, &["--once"]);
    assert_eq!(o.status.code(), Some(78), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.contains("octo/nope#1") && err.contains("404"), "{err}");
    let o = env.sync_at("octo/proj", 99, &["--once"]);
    assert_eq!(o.status.code(), Some(78));
    assert!(
        text(&o.stderr).contains("octo/proj#99"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn a_malformed_log_entry_is_reported_and_the_others_sync() {
    let env = Env::new("malformed");
    let good = append_n(&env.log(), 2, "ok");
    std::fs::write(
        env.root
            .join("log/new/1796058405.000000000.0000000000000000000000000000000f.forward"),
        b"{\"version\":1,",
    )
    .unwrap();
    let o = env.sync(&["--once"]);
    assert_eq!(o.status.code(), Some(65));
    assert!(
        text(&o.stderr).contains(
            "skipping log entry '1796058405.000000000.0000000000000000000000000000000f.forward'"
        ),
        "{}",
        text(&o.stderr)
    );
    let counts = env.section_counts(1);
    assert!(good.iter().all(|e| counts.get(&e.name) == Some(&1)));
}

#[test]
fn a_non_json_answer_is_an_unavailable_service() {
    let env = Env::new("notjson");
    append_n(&env.log(), 1, "x");
    env.faults(json!([{ "kind": "not_json", "method": "GET", "count": 1 }]));
    let o = env.sync(&["--once"]);
    assert_eq!(o.status.code(), Some(69));
    assert!(
        text(&o.stderr).contains("is not JSON"),
        "{}",
        text(&o.stderr)
    );
    assert!(env.comments(1).is_empty());
    assert_ok(&env.sync(&["--once"]));
    assert_eq!(env.comments(1).len(), 1);
}

#[test]
fn an_answer_on_the_issue_reaches_the_human_outbox_once() {
    let env = Env::new("pull");
    let q = message("api", "human", Kind::Question, "v1 or v2?", "which schema?");
    env.log().append(&entry(&q, Action::Escalate)).unwrap();
    let cfg = env.dir.join(".loopwright");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(cfg.join("sync.json"), r#"{"mention": ["alice"]}"#).unwrap();
    assert_ok(&env.sync(&["--once"]));
    let posted = &env.comments(1)[0].1;
    assert!(posted.contains("cc @alice"), "{posted}");
    env.ctl(
        "POST",
        "comments",
        json!({ "repo": "octo/proj", "issue": 1, "login": "alice", "body": format!("Looks fine.\n\n/lw answer {}\nUse v2, @bob agrees.\n", q.id) }),
    );
    env.ctl(
        "POST",
        "comments",
        json!({ "repo": "octo/proj", "issue": 1, "login": "alice", "body": "/lw answer 1796058405.000000000.00000000000000000000000000000bad\nhm" }),
    );
    env.ctl("POST", "comments", json!({ "repo": "octo/proj", "issue": 1, "login": "mallory", "association": "NONE", "body": format!("/lw answer {}\nUse v9", q.id) }));
    let o = env.sync(&["pull"]);
    assert_ok(&o);
    let outbox = env.root.join("human-outbox/new");
    let files: Vec<_> = std::fs::read_dir(&outbox)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let m = mailbox::message::Message::parse(&std::fs::read(&files[0]).unwrap()).unwrap();
    assert_eq!(
        (m.from.as_str(), m.kind, m.in_reply_to.as_deref()),
        ("human", Kind::Answer, Some(q.id.as_str()))
    );
    assert_eq!(m.to, vec!["api".to_string()]);
    assert_eq!(m.body, "Use v2, @bob agrees.");
    let err = text(&o.stderr);
    assert!(
        err.contains("no message with id 1796058405.000000000.00000000000000000000000000000bad"),
        "{err}"
    );
    assert!(err.contains("@mallory may not answer"), "{err}");
    // Both problems are told on the issue, once.
    let notices = |env: &Env| {
        env.comments(1)
            .iter()
            .filter(|c| c.1.contains("did not deliver the answer"))
            .count()
    };
    assert_eq!(notices(&env), 2, "{:#?}", env.comments(1));
    // Pulling again delivers nothing new and repeats no notice, even with the state lost.
    assert_ok(&env.sync(&["pull"]));
    std::fs::remove_file(env.root.join("state/sync.json")).unwrap();
    assert_ok(&env.sync(&["pull"]));
    assert_eq!(std::fs::read_dir(&outbox).unwrap().count(), 1);
    assert_eq!(notices(&env), 2);
}

#[test]
fn the_token_never_leaves_the_environment() {
    let canary = "ghp_CANARY5f1e2d3c4b5a69788796a5b4c3d2e1f0";
    let env = Env::new("canary");
    env.add_token("lw-bot", canary);
    let q = message("api", "human", Kind::Question, "q", "body");
    env.log().append(&entry(&q, Action::Escalate)).unwrap();
    append_n(&env.log(), 3, "x");
    env.faults(json!([{ "kind": "drop_after_commit", "method": "POST", "count": 1 }, { "kind": "status", "status": 500, "method": "GET", "count": 1 }]));
    let mut outputs = vec![];
    for args in [
        &["--once"][..],
        &["pull"],
        &["verify"],
        &["--once", "--json"],
    ] {
        let o = env.sync_cmd(args).env("GH_TOKEN", canary).output().unwrap();
        outputs.push(text(&o.stdout) + &text(&o.stderr));
    }
    env.ctl("POST", "comments", json!({ "repo": "octo/proj", "issue": 1, "login": "alice", "body": format!("/lw answer {}\nyes", q.id) }));
    let o = env
        .sync_cmd(&["pull"])
        .env("GH_TOKEN", canary)
        .output()
        .unwrap();
    outputs.push(text(&o.stdout) + &text(&o.stderr));
    // argv of a running lw-sync, read from /proc.
    let mut child = env
        .sync_cmd(&["--watch"])
        .env("GH_TOKEN", canary)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let mut scanned = 0;
    for o in &outputs {
        assert!(!o.contains(canary), "{o}");
        scanned += 1;
    }
    assert!(!String::from_utf8_lossy(&cmdline).contains(canary));
    let (reqs, _) = env.requests();
    assert!(!serde_json::to_string(&reqs).unwrap().contains(canary));
    for f in files_under(&env.dir) {
        let b = std::fs::read(&f).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&b).contains(canary),
            "{}",
            f.display()
        );
        scanned += 1;
    }
    println!("canary: absent from {scanned} outputs and files, argv and the request record");
}

#[test]
fn a_sandbox_maps_to_its_own_task_issue() {
    let env = Env::new("mapping");
    let cfg = env.dir.join(".loopwright");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(
        cfg.join("sync.json"),
        r#"{"sandboxes": {"web": {"issue": 2}}}"#,
    )
    .unwrap();
    let to_web = entry(
        &message("api", "web", Kind::Request, "for web", "x"),
        Action::Forward,
    );
    let to_db = entry(
        &message("api", "db", Kind::Request, "for db", "y"),
        Action::Forward,
    );
    env.log().append(&to_web).unwrap();
    env.log().append(&to_db).unwrap();
    assert_ok(&env.sync(&["--once"]));
    assert_eq!(
        env.section_counts(2).keys().collect::<Vec<_>>(),
        vec![&to_web.name]
    );
    assert_eq!(
        env.section_counts(1).keys().collect::<Vec<_>>(),
        vec![&to_db.name]
    );
    assert_ok(&env.sync(&["verify"]));
}

#[test]
fn server_errors_on_reads_are_retried() {
    let env = Env::new("5xx");
    let es = append_n(&env.log(), 2, "x");
    env.faults(json!([{ "kind": "status", "status": 503, "method": "GET", "count": 2 }]));
    let o = env.sync(&["--once"]);
    assert_ok(&o);
    assert!(
        es.iter()
            .all(|e| env.section_counts(1).get(&e.name) == Some(&1))
    );
    let (reqs, _) = env.requests();
    assert_eq!(reqs.iter().filter(|r| r["status"] == 503).count(), 2);
}

#[test]
fn verify_reports_a_duplicate_comment() {
    let env = Env::new("dup");
    let es = append_n(&env.log(), 1, "once");
    assert_ok(&env.sync(&["--once"]));
    let body = env.comments(1)[0].1.clone();
    // The same comment again, as lw-sync's user: what a double post would leave.
    env.ctl(
        "POST",
        "comments",
        json!({ "repo": "octo/proj", "issue": 1, "body": body, "login": "lw-bot" }),
    );
    let o = env.sync(&["verify"]);
    assert_eq!(o.status.code(), Some(65));
    let out = text(&o.stdout);
    assert!(
        out.starts_with(&format!(
            "duplicate octo/proj#1 {} in comments ",
            es[0].name
        )),
        "{out}"
    );
}

#[test]
fn a_422_is_reported_and_the_entry_stays_unsynced() {
    let env = Env::new("inj422");
    let es = append_n(&env.log(), 1, "x");
    env.faults(json!([{ "kind": "status", "status": 422, "method": "POST", "count": 1 }]));
    let o = env.sync(&["--once"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("422") && text(&o.stderr).contains("body is too long"),
        "{}",
        text(&o.stderr)
    );
    assert!(env.comments(1).is_empty());
    let state = std::fs::read_to_string(env.root.join("state/sync.json")).unwrap();
    assert!(
        !state.contains(&es[0].name),
        "not marked synced, no intent left: {state}"
    );
    assert_ok(&env.sync(&["--once"]));
    assert_eq!(env.section_counts(1).get(&es[0].name), Some(&1));
}

#[test]
fn a_refused_batch_is_split_and_only_the_refused_entry_waits() {
    let env = Env::new("inj422b");
    let es = append_n(&env.log(), 3, "x");
    // The batch of 3 is refused, then the second entry posted alone.
    env.faults(json!([{ "kind": "status", "status": 422, "method": "POST", "count": 1 }, { "kind": "status", "status": 422, "method": "POST", "count": 1, "skip": 1 }]));
    let o = env.sync(&["--once"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    let counts = env.section_counts(1);
    assert_eq!(counts.len(), 2, "{counts:?}");
    assert!(!counts.contains_key(&es[1].name));
    assert!(
        text(&o.stderr).contains(&format!("skipping log entry '{}'", es[1].name)),
        "{}",
        text(&o.stderr)
    );
    assert_ok(&env.sync(&["--once"]));
    assert_eq!(env.section_counts(1).len(), 3);
}
