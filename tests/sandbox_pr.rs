//! `lw-sandbox push --pr` (#43): the task branch's pull request, opened once
//! under kills and retries, against lw-github-sink over the real upstream;
//! its number learned by lw-sync; bad input refused with the fix.

use support::sandbox as sandbox_support;
use support::sync as sync_support;

use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sandbox_support::Fixture;
use serde_json::{Value, json};
use support::seeded;
use sync_support::{Env, TOKEN};

/// The project's GitHub: sync.json naming octo/proj and the run's issue 1,
/// and the sink's octo/proj holding the upstream's branches.
fn github(f: &Fixture, env: &Env) {
    env.add_token("lw-bot", TOKEN);
    env.ctl(
        "POST",
        "repos",
        json!({ "repo": "octo/proj", "issues": 1, "git": f.upstream }),
    );
    std::fs::write(
        f.proj.join(".loopwright/sync.json"),
        json!({ "repo": "octo/proj", "issue": 1 }).to_string(),
    )
    .unwrap();
}

fn push_cmd(f: &Fixture, env: &Env, token: &str, args: &[&str]) -> Command {
    let mut c = f.cmd(args);
    c.env("GH_TOKEN", token)
        .env_remove("GITHUB_TOKEN")
        .env("LW_GITHUB_API_URL", &env.url)
        .env("LW_SYNC_MIN_WRITE_INTERVAL_MS", "20");
    c
}

fn push(f: &Fixture, env: &Env, token: &str, args: &[&str]) -> Output {
    push_cmd(f, env, token, args).output().unwrap()
}

fn pulls(env: &Env) -> Vec<Value> {
    env.ctl("GET", "pulls?repo=octo/proj", Value::Null)
        .as_array()
        .unwrap()
        .clone()
}

/// REST requests the sink recorded since the last clear.
fn rest_requests(env: &Env) -> Vec<String> {
    env.requests()
        .0
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["method"].as_str().unwrap(),
                r["path"].as_str().unwrap()
            )
        })
        .collect()
}

fn work(f: &Fixture, name: &str, branch: &str) {
    f.ok(&["create", name, "--branch", branch, "--scope", "src/**"]);
    let (code, _, e) = f.sh(
        name,
        &format!("echo {name} > src/{name}.txt && git add src && git commit -qm 'add {name}'"),
    );
    assert_eq!(code, 0, "{e}");
}

#[test]
fn a_kill_storm_of_push_pr_makes_exactly_one_pull_request_per_branch() {
    let f = Fixture::new("pr-storm");
    let env = Env::new("pr-storm");
    github(&f, &env);
    let names: Vec<String> = (0..4).map(|i| format!("t{i}")).collect();
    for n in &names {
        work(&f, n, &format!("lw/{n}"));
    }
    // How long one push takes, to aim the kills inside it.
    let t0 = Instant::now();
    f.ok(&["push", "t0"]);
    let span = t0.elapsed().as_millis() as u64 + 400;

    // A new pull request: at most 3 requests (list, create).
    env.ctl("DELETE", "requests", Value::Null);
    let o = push(&f, &env, TOKEN, &["push", "t0", "--pr"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line = String::from_utf8_lossy(&o.stdout)
        .lines()
        .nth(1)
        .unwrap_or_default()
        .to_string();
    assert!(
        line.starts_with("pull-request ") && line.ends_with(" draft created"),
        "{line}"
    );
    let reqs = rest_requests(&env);
    eprintln!("requests for a new pull request: {} ({reqs:?})", reqs.len());
    assert!(reqs.len() <= 3, "{reqs:?}");
    // Known: one request, nothing made.
    env.ctl("DELETE", "requests", Value::Null);
    let o = push(&f, &env, TOKEN, &["push", "t0", "--pr"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(" found"),
        "{o:?}"
    );
    assert_eq!(rest_requests(&env).len(), 1);

    // The storm: creates that may be done and never answered, kills anywhere.
    env.faults(
        json!([{ "kind": "drop_after_commit", "method": "POST", "path_contains": "/pulls",
                        "count": 0, "probability": 0.3 }]),
    );
    let kills = 40;
    let (mut landed, mut finished) = (0, 0);
    for _ in 0..kills {
        let n = &names[seeded::below(names.len() as u64) as usize];
        let mut child = push_cmd(&f, &env, TOKEN, &["push", n, "--pr"])
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let at = Duration::from_millis(seeded::below(span));
        std::thread::sleep(at);
        if child.try_wait().unwrap().is_some() {
            finished += 1;
            continue;
        }
        landed += 1;
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .status();
        let _ = child.wait();
    }
    env.faults(json!([]));
    env.ctl("DELETE", "faults", Value::Null);
    // Then every branch once more, unkilled.
    for n in &names {
        let o = push(&f, &env, TOKEN, &["push", n, "--pr"]);
        assert!(
            o.status.success(),
            "{n}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let all = pulls(&env);
    let mut per_branch = std::collections::BTreeMap::new();
    for p in &all {
        *per_branch
            .entry(p["head"]["ref"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    eprintln!(
        "seed {} kills {kills} (landed {landed}, finished first {finished}) span {span} ms; pull requests {} per branch {per_branch:?}",
        seeded::seed(),
        all.len()
    );
    assert_eq!(all.len(), names.len(), "{all:?}");
    assert!(per_branch.values().all(|&c| c == 1), "{per_branch:?}");

    // New commits: the open pull request's text follows them.
    let (code, _, e) = f.sh(
        "t2",
        "echo more > src/more.txt && git add src && git commit -qm 'more for t2'",
    );
    assert_eq!(code, 0, "{e}");
    let o = push(&f, &env, TOKEN, &["push", "t2", "--pr"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.trim_end().ends_with(" draft updated"), "{out}");
    let t2 = pulls(&env)
        .into_iter()
        .find(|p| p["head"]["ref"] == "lw/t2")
        .unwrap();
    assert!(t2["body"].as_str().unwrap().contains("more for t2"), "{t2}");
    assert_eq!(pulls(&env).len(), names.len());

    // Each sandbox's record knows its number, and so does lw-sync: t1's
    // entries go to its pull request's conversation.
    let number = |n: &str| {
        all.iter()
            .find(|p| p["head"]["ref"] == format!("lw/{n}"))
            .unwrap()["number"]
            .as_u64()
            .unwrap()
    };
    let rec = std::fs::read_to_string(f.root.join("state/sandbox/t1.json")).unwrap();
    assert!(
        rec.contains(&format!("\"pull_request\": {}", number("t1"))),
        "{rec}"
    );
    let m = sync_support::message(
        "t1",
        "human",
        mailbox::message::Kind::Status,
        "done",
        "work done",
    );
    let log = mailbox::log::Log::new(f.root.join("log"));
    assert!(
        log.append(&sync_support::entry(&m, mailbox::log::Action::Forward))
            .unwrap()
    );
    let o = env.sync_root(&f.root, &["--once"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let on_pr = env.ctl(
        "GET",
        &format!("comments?repo=octo/proj&issue={}", number("t1")),
        Value::Null,
    );
    assert_eq!(on_pr.as_array().unwrap().len(), 1, "{on_pr}");
    assert!(on_pr[0]["body"].as_str().unwrap().contains(&m.id));
}

#[test]
fn push_pr_refuses_a_missing_base_a_closed_pull_request_and_a_token_without_rights() {
    let f = Fixture::with_config("pr-bad", "sandbox.pr-base = nope\n");
    let env = Env::new("pr-bad");
    github(&f, &env);
    work(&f, "b", "lw/b");
    // A base that does not exist upstream: 78 before any request, the push done.
    let o = push(&f, &env, TOKEN, &["push", "b", "--pr"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{e}");
    assert!(
        e.contains("'nope' does not exist upstream") && e.contains("sandbox.pr-base"),
        "{e}"
    );
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("lw/b "));
    assert!(rest_requests(&env).is_empty());
    // The head it pushed is recorded for the radar's status (lw-sync).
    let commit = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    let (pushed, _) = sync::pr::pushed::load_all(&f.root.join("state")).unwrap();
    assert_eq!(
        pushed
            .iter()
            .map(|p| (p.name.as_str(), p.branch.as_str(), p.commit.as_str()))
            .collect::<Vec<_>>(),
        [("b", "lw/b", commit.as_str())]
    );

    std::fs::write(
        f.proj.join(".loopwright/config"),
        "sandbox.push-pr = true\n",
    )
    .unwrap();
    // Without pull-request rights: 77 naming the permission.
    env.ctl(
        "POST",
        "tokens",
        json!({ "token": "no-pulls", "login": "lw-bot", "pulls": false }),
    );
    let o = push(&f, &env, "no-pulls", &["push", "b"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(77), "{e}");
    assert!(e.contains("Pull requests: write"), "{e}");
    assert!(pulls(&env).is_empty());

    // sandbox.push-pr makes --pr the default; a person closes it; push refuses a second.
    let o = push(&f, &env, TOKEN, &["push", "b"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let n = pulls(&env)[0]["number"].as_u64().unwrap();
    let (s, _, _) = sync_support::call(
        &env.agent,
        "PATCH",
        &format!("{}/repos/octo/proj/pulls/{n}", env.url),
        TOKEN,
        Some(json!({ "state": "closed" })),
    );
    assert_eq!(s, 200);
    let o = push(&f, &env, TOKEN, &["push", "b", "--ready"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(65), "{e}");
    assert!(
        e.contains(&format!("octo/proj#{n}")) && e.contains("reopen it"),
        "{e}"
    );
    assert_eq!(pulls(&env).len(), 1);
    // --no-pr pushes only.
    let o = push(&f, &env, TOKEN, &["push", "b", "--no-pr"]);
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 1);
}

/// Kills `pid`'s process group (the command and the git and docker
/// processes it started).
fn kill_group(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status();
}

/// The radar's verdict on `a` and `b`, logged as the mediator's.
fn radar(log: &mailbox::log::Log, kind: mailbox::message::Kind, a: &str, b: &str, file: &str) {
    let mut m = sync_support::message("mediator", a, kind, &format!("{kind} {a} {b}"), "radar");
    m.to.push(b.into());
    if kind == mailbox::message::Kind::Conflict {
        m.refs = vec![file.into()];
    }
    let e = sync_support::entry(&m, mailbox::log::Action::Forward);
    assert!(log.append(&e).unwrap());
}

/// What changes between two runs of the storm: a task reports (a comment on
/// its pull request), the radar sees a conflict or its end (a status on
/// both heads), or an agent commits (a new head, a new pull-request text).
fn storm_change(f: &Fixture, names: &[String], commits: &mut usize) {
    use mailbox::message::Kind;
    let log = mailbox::log::Log::new(f.root.join("log"));
    let a = seeded::below(names.len() as u64) as usize;
    let b = (a + 1 + seeded::below(names.len() as u64 - 1) as usize) % names.len();
    match seeded::below(8) {
        0..=2 => {
            let m = sync_support::message(&names[a], "human", Kind::Status, "progress", "step");
            let e = sync_support::entry(&m, mailbox::log::Action::Forward);
            assert!(log.append(&e).unwrap());
        }
        3 | 4 => radar(&log, Kind::Conflict, &names[a], &names[b], "src/x.rs"),
        5 | 6 => radar(&log, Kind::ConflictCleared, &names[a], &names[b], ""),
        _ => {
            *commits += 1;
            let (code, _, e) = f.sh(
                &names[a],
                &format!(
                    "echo {commits} >> src/{}.txt && git commit -qam 'step {commits}'",
                    names[a]
                ),
            );
            assert_eq!(code, 0, "{e}");
        }
    }
}

/// `lw-sync --once` until two runs in a row succeed and the second sends
/// nothing: the mirror has caught up.
fn settle(f: &Fixture, env: &Env) {
    let writes = |env: &Env| {
        env.requests()
            .0
            .iter()
            .filter(|r| r["write"] == true)
            .count()
    };
    for _ in 0..20 {
        let before = writes(env);
        let o = env.sync_root(&f.root, &["--once"]);
        if o.status.success() && writes(env) == before {
            return;
        }
    }
    panic!("lw-sync never settled");
}

/// The issue's storm (#43, "Must show"): `lw-sandbox push --pr` and
/// `lw-sync` killed at random points, side by side, across `n` task
/// branches while the sink drops answers after doing the work; then one
/// pull request per branch, every comment and status once, `lw-sync
/// verify` agreeing, and the request counts of a quiet run.
fn push_and_sync_storm(tag: &str, n: usize, kills: u32) {
    let f = Fixture::new(tag);
    let env = Env::new(tag);
    github(&f, &env);
    let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
    for name in &names {
        work(&f, name, &format!("lw/{name}"));
    }
    // The last branch stays out of the storm: its pull request is made at
    // the end, to count a new one's requests.
    let (stormed, fresh) = names.split_at(n - 1);
    let t0 = Instant::now();
    f.ok(&["push", &stormed[0]]);
    let push_span = t0.elapsed().as_micros() as u64 + 300_000;
    let t0 = Instant::now();
    let _ = env.sync_root(&f.root, &["--once"]);
    let sync_span = (t0.elapsed().as_micros() as u64).max(100_000) * 2;
    env.faults(json!([
        { "kind": "drop_after_commit", "method": "POST", "path_contains": "/pulls", "count": 0, "probability": 0.3 },
        { "kind": "drop_after_commit", "method": "PATCH", "path_contains": "/pulls/", "count": 0, "probability": 0.3 },
        { "kind": "drop_after_commit", "method": "POST", "path_contains": "/statuses/", "count": 0, "probability": 0.2 },
        { "kind": "status", "status": 502, "commit": true, "method": "POST", "path_contains": "/statuses/", "count": 0, "probability": 0.1 },
        { "kind": "drop_after_commit", "method": "POST", "path_contains": "/comments", "count": 0, "probability": 0.15 },
    ]));
    let (mut push_kills, mut sync_kills, mut runs, mut finished, mut commits) =
        (0u32, 0u32, 0u32, 0u32, 0);
    let storm_t0 = Instant::now();
    while push_kills + sync_kills < kills {
        storm_change(&f, &names, &mut commits);
        let name = &stormed[seeded::below(stormed.len() as u64) as usize];
        let mut push = push_cmd(&f, &env, TOKEN, &["push", name, "--pr"]);
        let mut sync = env.sync_cmd_at(&f.root, "octo/proj", 1, &["--once"]);
        let mut children = [&mut push, &mut sync].map(|c| {
            c.process_group(0)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        });
        let start = Instant::now();
        let at = [seeded::below(push_span), seeded::below(sync_span)];
        let mut order = [0, 1];
        order.sort_by_key(|&i| at[i]);
        for i in order {
            // The moment of the kill is what is random here; nothing waits on it.
            let due = Duration::from_micros(at[i]);
            std::thread::sleep(due.saturating_sub(start.elapsed()));
            runs += 1;
            if children[i].try_wait().unwrap().is_some() {
                finished += 1;
                continue;
            }
            kill_group(children[i].id());
            let _ = children[i].wait();
            if i == 0 {
                push_kills += 1
            } else {
                sync_kills += 1
            }
        }
        assert!(
            runs < 4000,
            "too few kills landed: {} in {runs} runs",
            push_kills + sync_kills
        );
    }
    let storm_time = storm_t0.elapsed();
    let (reqs, _) = env.requests();
    let fired = reqs.iter().filter(|r| !r["fault"].is_null()).count();
    env.ctl("DELETE", "faults", Value::Null);

    // Undisturbed: each stormed branch pushed once more, then the fresh one
    // with its create's answer lost (list, create, list: 3 requests).
    for name in stormed {
        let o = push(&f, &env, TOKEN, &["push", name, "--pr"]);
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    env.faults(json!([{ "kind": "drop_after_commit", "method": "POST", "path_contains": "/pulls", "count": 1 }]));
    env.ctl("DELETE", "requests", Value::Null);
    let o = push(&f, &env, TOKEN, &["push", &fresh[0], "--pr"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let new_pull = rest_requests(&env);
    env.ctl("DELETE", "faults", Value::Null);
    assert!(new_pull.len() <= 3, "{new_pull:?}");
    settle(&f, &env);

    // One pull request per branch.
    let all = pulls(&env);
    let mut per_branch = std::collections::BTreeMap::new();
    for p in &all {
        *per_branch
            .entry(p["head"]["ref"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    // Every log entry once, on one thread.
    let mut seen = std::collections::BTreeMap::new();
    for issue in std::iter::once(1).chain(all.iter().map(|p| p["number"].as_u64().unwrap())) {
        for (entry, c) in env.section_counts(issue) {
            *seen.entry(entry).or_insert(0) += c;
        }
    }
    let sections = seen.len();
    let dup_comments = seen.values().filter(|c| **c > 1).count();
    // A status twice in a row on one head is a duplicate.
    let statuses = env.ctl("GET", "statuses?repo=octo/proj", Value::Null);
    let statuses = statuses.as_array().unwrap();
    let mut last = std::collections::BTreeMap::new();
    let mut dup_statuses = 0;
    for s in statuses {
        let now = (s["state"].clone(), s["description"].clone());
        if last.insert(s["sha"].as_str().unwrap().to_string(), now.clone()) == Some(now) {
            dup_statuses += 1;
        }
    }
    let verify = env.sync_root(&f.root, &["verify"]);

    // A quiet run: a known pull request costs one request, a status change one.
    env.ctl("DELETE", "requests", Value::Null);
    for name in &names {
        let o = push(&f, &env, TOKEN, &["push", name, "--pr"]);
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let known = rest_requests(&env);
    let log = mailbox::log::Log::new(f.root.join("log"));
    radar(
        &log,
        mailbox::message::Kind::Conflict,
        &names[0],
        &fresh[0],
        "src/last.rs",
    );
    env.ctl("DELETE", "requests", Value::Null);
    let o = env.sync_root(&f.root, &["--once"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let status_posts = rest_requests(&env)
        .iter()
        .filter(|r| r.contains("/statuses/"))
        .count();
    eprintln!(
        "push+sync storm: seed {} branches {n} kills {} (push {push_kills}, sync {sync_kills}) runs {runs} (finished before the kill {finished}) commits {commits} faults fired {fired} in {storm_time:?}; pull requests {} per branch {per_branch:?}; sections {sections} duplicated {dup_comments}; statuses {} duplicated {dup_statuses}; requests: new pull request {}, known {} for {}, status change {status_posts} for 2",
        seeded::seed(),
        push_kills + sync_kills,
        all.len(),
        statuses.len(),
        new_pull.len(),
        known.len(),
        names.len(),
    );
    assert_eq!(all.len(), n, "{all:#?}");
    assert!(per_branch.values().all(|&c| c == 1), "{per_branch:?}");
    assert_eq!(
        dup_comments, 0,
        "entries on more than one thread or twice on one"
    );
    assert_eq!(dup_statuses, 0, "{statuses:#?}");
    assert!(
        verify.status.success(),
        "verify: {}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(fired > 0, "the faults never fired");
    assert_eq!(known.len(), names.len(), "{known:?}");
    assert_eq!(status_posts, 2);
}

#[test]
fn a_kill_storm_of_push_pr_and_lw_sync_together_makes_each_pull_request_comment_and_status_once() {
    // The issue's figures: 20 task branches, 200 kills (about 2.5 minutes here).
    push_and_sync_storm("pr-sync-storm", 20, 200);
}

#[test]
fn push_pr_refuses_a_head_already_merged_naming_it_even_when_its_name_says_base() {
    let f = Fixture::new("pr-merged");
    let env = Env::new("pr-merged");
    github(&f, &env);
    // Hostile: a branch whose name holds "base", at main's commit (merged).
    f.ok(&[
        "create",
        "m",
        "--branch",
        "lw/database",
        "--scope",
        "src/**",
    ]);
    let o = push(&f, &env, TOKEN, &["push", "m", "--pr"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(65), "{e}");
    assert!(
        e.contains("branch 'lw/database' has no commits beyond 'main'")
            && !e.contains("does not exist"),
        "{e}"
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("lw/database "),
        "pushed all the same"
    );
    assert!(pulls(&env).is_empty());
    let rec = sync::pr::load(&f.root.join("state"), "m").unwrap().unwrap();
    assert_eq!((rec.number, rec.pending.is_some()), (None, true), "{rec:?}");
    // Work on it: the next push opens it.
    let (code, _, e) = f.sh(
        "m",
        "echo m > src/m.txt && git add src && git commit -qm 'add m'",
    );
    assert_eq!(code, 0, "{e}");
    let o = push(&f, &env, TOKEN, &["push", "m", "--pr"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(pulls(&env).len(), 1);
}
