//! `lw-sandbox push --pr` (#43): the task branch's pull request, opened once
//! under kills and retries, against lw-github-sink over the real upstream;
//! its number learned by lw-sync; bad input refused with the fix.

mod sandbox_support;
mod sync_support;

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
    let (pushed, _) = loopwright::pr::pushed::load_all(&f.root.join("state")).unwrap();
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
