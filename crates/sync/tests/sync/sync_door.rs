//! lw-sync's door against lw-github-sink's server on 127.0.0.1: own comments
//! told apart when `GET /user` is refused, edited headers detected, a state
//! of the previous version upgraded, rate-limit windows that survive kill -9,
//! and endpoints that refuse or never answer.  Prints its figures.

use support::sync as sync_support;

use std::process::Stdio;
use std::time::{Duration, Instant};

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

/// GitHub's answer to `GET /user` for App installation and Actions tokens.
fn refuse_user(env: &Env) {
    env.faults(
        json!([{ "kind": "status", "status": 403, "method": "GET", "path_contains": "/user",
        "count": 0, "message": "Resource not accessible by integration" }]),
    );
}

/// Entry name -> sections found in comments by `login`.
fn sections_by(env: &Env, login: &str) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for (_, body, who) in env.comments(1) {
        if who != login {
            continue;
        }
        if let Some(Ok(secs)) = sync::parse_comment(&body) {
            for s in secs {
                if let sync::Head::Entry(h) = s.head {
                    *m.entry(h.entry).or_insert(0) += 1;
                }
            }
        }
    }
    m
}

#[test]
fn with_get_user_refused_a_forged_header_hides_nothing() {
    let env = Env::new("forged");
    refuse_user(&env);
    let first = append_n(&env.log(), 2, "before");
    // No login anywhere: refuse to reconcile, and say how to fix it.
    let o = env.sync(&["--once"]);
    assert_eq!(o.status.code(), Some(78), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("set \"login\" in .loopwright/sync.json"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(env.comments(1).len(), 0);

    std::fs::create_dir_all(env.dir.join(".loopwright")).unwrap();
    std::fs::write(
        env.dir.join(".loopwright/sync.json"),
        r#"{"login": "lw-bot"}"#,
    )
    .unwrap();
    assert_ok(&env.sync(&["--once"]));
    // Another login pastes a header for an entry that is not on GitHub yet.
    let m = message(
        "api",
        "human",
        Kind::Question,
        "hidden?",
        "the real question",
    );
    let e = entry(&m, Action::Escalate);
    let forged = sync::render_entry(&e, &[], 65_536).unwrap().remove(0);
    env.ctl(
        "POST",
        "comments",
        json!({ "repo": "octo/proj", "issue": 1, "body": forged, "login": "mallory", "association": "CONTRIBUTOR" }),
    );
    env.log().append(&e).unwrap();
    // A lost state makes the run reconcile: the forged comment must not count.
    std::fs::remove_file(env.root.join("state/sync.json")).unwrap();
    let o = env.sync(&["--once"]);
    assert_ok(&o);
    let mine = sections_by(&env, "lw-bot");
    let hidden = usize::from(!mine.contains_key(&e.name));
    println!(
        "forged header with /user refused: entry posted by lw-bot {} time(s), hidden {hidden}; earlier entries {:?}",
        mine.get(&e.name).copied().unwrap_or(0),
        first
            .iter()
            .map(|x| mine.get(&x.name).copied().unwrap_or(0))
            .collect::<Vec<_>>()
    );
    assert_eq!(mine.get(&e.name), Some(&1));
    assert!(first.iter().all(|x| mine.get(&x.name) == Some(&1)));

    // With recorded comment ids only (no login): pull and verify still know
    // lw-sync's comments; an unknown outcome is not reconciled.
    std::fs::remove_file(env.dir.join(".loopwright/sync.json")).unwrap();
    let o = env.sync(&["verify"]);
    assert_ok(&o);
}

#[test]
fn verify_detects_an_edited_header_and_restore_refuses_it() {
    let env = Env::new("edited");
    let entries = append_n(&env.log(), 2, "edit me");
    assert_ok(&env.sync(&["--once"]));
    assert_ok(&env.sync(&["verify"]));
    let (id, body, _) = env.comments(1).remove(0);
    let edited = body.replacen("policy: status is forward", "policy: edited by hand", 1);
    assert_ne!(edited, body);
    let mut r = env
        .agent
        .patch(format!("{}/repos/octo/proj/issues/comments/{id}", env.url))
        .header("Authorization", &format!("Bearer {TOKEN}"))
        .send_json(json!({ "body": edited }))
        .unwrap();
    assert_eq!(
        r.status().as_u16(),
        200,
        "{}",
        r.body_mut().read_to_string().unwrap()
    );
    let o = env.sync(&["verify"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stdout));
    assert!(
        text(&o.stdout).contains(&format!(
            "incomplete octo/proj#1 {}: header or body does not match",
            entries[0].name
        )),
        "{}",
        text(&o.stdout)
    );
    let fresh = env.dir.join("fresh");
    std::fs::create_dir_all(fresh.join("log")).unwrap();
    let o = env.sync_root(&fresh, &["verify", "--restore"]);
    assert_eq!(o.status.code(), Some(65));
    let restored = text(&o.stdout)
        .lines()
        .filter(|l| l.starts_with("restored "))
        .count();
    println!(
        "edited header: verify reports it; restore took {restored} of 2 entries (the edited one refused)"
    );
    assert_eq!(restored, 1);
    assert!(!fresh.join("log/new").join(&entries[0].name).exists());
}

#[test]
fn a_state_of_the_previous_version_is_upgraded_and_nothing_is_reposted() {
    let env = Env::new("upgrade");
    let old = append_n(&env.log(), 3, "old");
    assert_ok(&env.sync(&["--once"]));
    let path = env.root.join("state/sync.json");
    let mut st: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    // What version 1 wrote after a refused GET /user: no login, checked.
    st["version"] = 1.into();
    st["login"] = Value::Null;
    st["login_checked"] = true.into();
    std::fs::write(&path, serde_json::to_vec(&st).unwrap()).unwrap();
    let new = append_n(&env.log(), 1, "new");
    let before = env.comments(1).len();
    assert_ok(&env.sync(&["--once"]));
    let st: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let counts = env.section_counts(1);
    println!(
        "state upgrade: version {} login {}; comments {before} -> {}",
        st["version"],
        st["login"],
        env.comments(1).len()
    );
    assert_eq!(st["version"], 2);
    assert_eq!(st["login"], "lw-bot");
    assert_eq!(env.comments(1).len(), before + 1);
    assert!(old.iter().chain(&new).all(|e| counts[&e.name] == 1));
}

/// A small seeded generator (xorshift64*), so a failing run can be replayed.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

#[test]
fn kill_9_during_a_rate_limit_wait_leaves_the_window_to_the_next_run() {
    let env = Env::new("killwait");
    let seed = std::env::var("LW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| base::id::random128() as u64 | 1);
    println!("kill during wait: seed {seed} (LW_TEST_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let mut names = Vec::new();
    let (mut killed_waiting, mut finished) = (0, 0);
    let mut limited_seen = 0;
    let mut last_window = 0;
    std::fs::create_dir_all(env.root.join("state")).unwrap();
    let watcher = base::fs::Watcher::new().unwrap();
    watcher.add(&env.root.join("state")).unwrap();
    for _ in 0..50 {
        env.faults(json!([{ "kind": "secondary", "status": 403, "retry_after": 1, "method": "POST", "count": 1 }]));
        names.extend(append_n(&env.log(), 1, "wait").into_iter().map(|e| e.name));
        let mut child = env
            .sync_cmd(&["--once"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The event: the server has answered a POST with the rate limit.
        let t0 = Instant::now();
        loop {
            let (reqs, _) = env.requests();
            let n = reqs.iter().filter(|r| r["fault"] == "secondary").count();
            if n > limited_seen {
                limited_seen = n;
                break;
            }
            if child.try_wait().unwrap().is_some() {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "no rate-limited POST"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // The event that starts the wait: the window is on disk.  (A kill
        // between the server's answer and that write cannot be helped: the
        // client does not know the window yet; see lw-sync(1), BUGS.)
        let state = env.root.join("state/sync.json");
        let t1 = Instant::now();
        while child.try_wait().unwrap().is_none() && t1.elapsed() < Duration::from_secs(30) {
            let until = std::fs::read(&state)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .and_then(|v| v["budget"]["blocked_until"].as_u64())
                .unwrap_or(0);
            if until > last_window {
                last_window = until;
                break;
            }
            // Woken by the state's atomic replace in state/.
            watcher.wait(Some(Duration::from_millis(200))).unwrap();
        }
        // Somewhere inside the one-second wait.
        std::thread::sleep(Duration::from_millis(rng.below(900)));
        match child.try_wait().unwrap() {
            Some(_) => finished += 1,
            None => {
                child.kill().unwrap(); // SIGKILL
                killed_waiting += 1;
            }
        }
        child.wait().unwrap();
    }
    assert_ok(&env.sync(&["--once"]));
    let (reqs, windows) = env.requests();
    let inside = reqs.iter().filter(|r| r["in_window"] == true).count();
    let writes_inside = reqs
        .iter()
        .filter(|r| r["in_window"] == true && r["write"] == true)
        .count();
    let counts = env.section_counts(1);
    let dup = names.iter().filter(|n| counts.get(*n) != Some(&1)).count();
    println!(
        "kill during wait: {killed_waiting} runs killed while waiting out a window, {finished} finished first; windows {}; requests inside them {inside}, writes {writes_inside}; entries not exactly once {dup}",
        windows.len()
    );
    assert!(
        killed_waiting >= 40,
        "{killed_waiting} kills landed in a wait"
    );
    assert_eq!(writes_inside, 0, "{reqs:#?}");
    assert_eq!(inside, 0);
    assert_eq!(dup, 0);
}

#[test]
fn an_endpoint_that_never_answers_ends_the_run_within_60s_with_75() {
    let env = Env::new("silent");
    append_n(&env.log(), 1, "x");
    // Accepts connections, reads nothing, answers nothing.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in l.incoming().flatten() {
            held.push(c);
        }
    });
    let run = |api: &str, args: &[&str]| {
        env.sync_cmd_api(api, &env.root, "octo/proj", 1, args)
            .output()
            .unwrap()
    };
    let t = Instant::now();
    let o = run(&url, &["--once"]);
    let took = t.elapsed().as_secs_f64();
    println!(
        "silent endpoint, default timeouts: run ended in {took:.1} s, exit {:?}",
        o.status.code()
    );
    assert_eq!(o.status.code(), Some(75), "{}", text(&o.stderr));
    assert!(took < 60.0);
    assert!(
        text(&o.stderr).contains("read timeout"),
        "{}",
        text(&o.stderr)
    );

    // A time limit for cron ends it sooner.
    let t = Instant::now();
    let o = run(
        &url,
        &["--once", "--read-timeout", "2", "--time-limit", "3"],
    );
    let took = t.elapsed().as_secs_f64();
    println!(
        "silent endpoint, --read-timeout 2 --time-limit 3: {took:.1} s, exit {:?}",
        o.status.code()
    );
    assert_eq!(o.status.code(), Some(75), "{}", text(&o.stderr));
    assert!(took < 10.0);

    // Nothing listens: unavailable, 69, at once.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t = Instant::now();
    let o = run(&format!("http://127.0.0.1:{port}"), &["--once"]);
    println!(
        "refused connection: exit {:?} in {:.1} s",
        o.status.code(),
        t.elapsed().as_secs_f64()
    );
    assert_eq!(o.status.code(), Some(69), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("cannot connect to"),
        "{}",
        text(&o.stderr)
    );
}
