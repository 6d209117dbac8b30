//! The radar's verdict as a `loopwright/radar` commit status on each pushed
//! task branch's head (#43), written by lw-sync against lw-github-sink:
//! once per change, on the new head after a push, through 5xx, secondary
//! rate limits, an unknown commit and SIGKILLs; a hostile branch name or
//! file list never breaks the description.

use support::sync as sync_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use mailbox::log::Action;
use mailbox::message::Kind;
use serde_json::{Value, json};
use support::seeded;
use sync_support::*;

fn git(dir: &Path, args: &[&str]) -> String {
    let o = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "git {args:?}: {o:?}");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A sink whose octo/proj is a real bare repository (so an unknown commit
/// is refused 422), and a work tree to make commits in.
struct Repo {
    env: Env,
    up: PathBuf,
    work: PathBuf,
}

impl Repo {
    fn new(tag: &str) -> Repo {
        let env = Env::new(tag);
        let up = env.dir.join("up.git");
        let work = env.dir.join("work");
        git(&env.dir, &["init", "-q", "--bare", "-b", "main", "up.git"]);
        git(&env.dir, &["init", "-q", "-b", "main", "work"]);
        let r = Repo { env, up, work };
        r.commit("main", "README");
        r.env.ctl(
            "POST",
            "repos",
            json!({ "repo": "octo/proj", "issues": 3, "git": r.up }),
        );
        r
    }

    /// One more commit on `branch` (made from main when new), pushed; its sha.
    fn commit(&self, branch: &str, file: &str) -> String {
        if branch != "main" {
            let exists = std::process::Command::new("git")
                .arg("-C")
                .arg(&self.work)
                .args(["rev-parse", "--verify", "--quiet", branch])
                .output()
                .unwrap()
                .status
                .success();
            let args: &[&str] = if exists {
                &["checkout", "-q", branch]
            } else {
                &["checkout", "-q", "-b", branch, "main"]
            };
            git(&self.work, args);
        }
        let p = self.work.join(file);
        let mut body = std::fs::read(&p).unwrap_or_default();
        body.extend_from_slice(format!("{file} {}\n", body.len()).as_bytes());
        std::fs::write(&p, body).unwrap();
        git(&self.work, &["add", file]);
        git(
            &self.work,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-qm",
                file,
            ],
        );
        git(
            &self.work,
            &["push", "-q", self.up.to_str().unwrap(), branch],
        );
        git(&self.work, &["rev-parse", "HEAD"])
    }

    /// Sandbox `name` on `branch`, registered, its branch pushed at `sha`.
    fn sandbox(&self, name: &str, branch: &str, sha: &str) {
        let root = mailbox::layout::Root::new(&self.env.root);
        let sb = mailbox::registry::Sandbox::new(name, Some(branch.into()), vec![]);
        mailbox::registry::Registry::new(&root)
            .register(&sb)
            .unwrap();
        self.pushed(name, branch, sha);
    }

    fn pushed(&self, name: &str, branch: &str, sha: &str) {
        sync::pr::pushed::record(&self.env.root.join("state"), name, branch, sha).unwrap();
    }

    /// The radar's message about `a` and `b`, logged as the mediator's.
    fn radar(&self, kind: Kind, a: &str, b: &str, files: &[&str]) {
        let mut m = message("mediator", a, kind, &format!("{kind} {a} {b}"), "radar");
        m.to.push(b.into());
        m.refs = files.iter().map(|f| f.to_string()).collect();
        assert!(self.env.log().append(&entry(&m, Action::Forward)).unwrap());
    }

    /// Every status of octo/proj in the order made: (sha, state, description).
    fn statuses(&self) -> Vec<(String, String, String)> {
        let v = self.env.ctl("GET", "statuses?repo=octo/proj", Value::Null);
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| {
                assert_eq!(s["context"], "loopwright/radar");
                (
                    s["sha"].as_str().unwrap().to_string(),
                    s["state"].as_str().unwrap().to_string(),
                    s["description"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    /// The status requests so far: (POSTs, GETs).
    fn status_requests(&self) -> (usize, usize) {
        let (reqs, _) = self.env.requests();
        let n = |m: &str| {
            reqs.iter()
                .filter(|r| r["method"] == m && r["path"].as_str().unwrap().contains("statuses"))
                .count()
        };
        (n("POST"), n("GET"))
    }

    fn sync(&self) -> std::process::Output {
        let o = self.env.sync(&["--once"]);
        assert!(o.status.success(), "lw-sync: {}", text(&o.stderr));
        o
    }
}

#[test]
fn statuses_follow_the_radar_once_per_change_and_move_with_a_push() {
    let r = Repo::new("status-flow");
    let api = r.commit("task/api", "api.rs");
    let web = r.commit("task/web", "web.rs");
    let db = r.commit("task/db", "db.rs");
    r.sandbox("api", "task/api", &api);
    r.sandbox("web", "task/web", &web);
    r.sandbox("db", "task/db", &db);

    r.radar(
        Kind::Conflict,
        "api",
        "web",
        &["src/lib.rs", "src/schema.sql"],
    );
    let o = r.sync();
    assert!(
        text(&o.stdout).contains(&format!("status task/api {api} failure")),
        "{}",
        text(&o.stdout)
    );
    let mut want = vec![
        (
            api.clone(),
            "failure".to_string(),
            "conflicts with task/web: src/lib.rs, src/schema.sql".to_string(),
        ),
        (
            web.clone(),
            "failure".to_string(),
            "conflicts with task/api: src/lib.rs, src/schema.sql".to_string(),
        ),
    ];
    assert_eq!(
        r.statuses(),
        want,
        "a branch the radar never named (db) gets none"
    );
    assert_eq!(r.status_requests(), (2, 0), "one request per status");

    // Nothing changed: no request.
    r.sync();
    assert_eq!(r.status_requests(), (2, 0));

    r.radar(Kind::ConflictCleared, "web", "api", &["src/lib.rs"]);
    r.sync();
    for sha in [&api, &web] {
        want.push((
            sha.clone(),
            "success".into(),
            "no conflict with other task branches (loopwright radar)".into(),
        ));
    }
    assert_eq!(r.statuses(), want);
    assert_eq!(r.status_requests(), (4, 0));

    // A new push: the status goes on the new head, once.
    let web2 = r.commit("task/web", "web2.rs");
    r.pushed("web", "task/web", &web2);
    r.sync();
    r.sync();
    want.push((
        web2.clone(),
        "success".into(),
        "no conflict with other task branches (loopwright radar)".into(),
    ));
    assert_eq!(r.statuses(), want);
    assert_eq!(r.status_requests(), (5, 0));

    // verify: agrees, then finds a head whose newest radar status someone
    // else replaced (one listing per branch).
    let o = r.env.sync(&["verify"]);
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
    let (s, _, v) = call(
        &r.env.agent,
        "POST",
        &format!("{}/repos/octo/proj/statuses/{api}", r.env.url),
        TOKEN,
        Some(json!({ "state": "pending", "context": "loopwright/radar", "description": "hand" })),
    );
    assert_eq!(s, 201, "{v}");
    let o = r.env.sync(&["verify"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.contains(&format!("status-differs task/api {api}: wanted success"))
            && out.contains("GitHub shows pending \"hand\""),
        "{out}"
    );
    assert!(!out.contains("task/web"), "{out}");
}

#[test]
fn a_lost_answer_is_settled_by_listing_and_a_rate_limit_is_waited_out() {
    let r = Repo::new("status-faults");
    let api = r.commit("task/api", "api.rs");
    let web = r.commit("task/web", "web.rs");
    r.sandbox("api", "task/api", &api);
    r.sandbox("web", "task/web", &web);
    // The first status is made, then answered 502; the second meets a
    // secondary rate limit with retry-after (nothing made).
    r.env.faults(json!([
        { "kind": "status", "status": 502, "commit": true, "method": "POST", "path_contains": "/statuses/" },
        { "kind": "secondary", "status": 403, "retry_after": 1, "method": "POST", "path_contains": "/statuses/" },
    ]));
    r.radar(Kind::Conflict, "api", "web", &["a.rs"]);
    r.sync();
    let made = r.statuses();
    assert_eq!(made.len(), 2, "{made:?}");
    assert_eq!(
        made.iter().filter(|s| s.0 == api).count(),
        1,
        "the 502 was made once, not twice"
    );
    // 502 (made), its settling listing; 403 (rate limit), the same POST again after the window.
    assert_eq!(r.status_requests(), (3, 1));
    let (reqs, windows) = r.env.requests();
    assert!(!windows.is_empty());
    assert!(
        reqs.iter().all(|q| q["in_window"] != true),
        "a request inside the retry-after window"
    );
}

#[test]
fn a_commit_github_lacks_is_reported_once_and_not_retried() {
    let r = Repo::new("status-422");
    let api = r.commit("task/api", "api.rs");
    r.sandbox("api", "task/api", &api);
    r.sandbox("web", "task/web", &"0".repeat(40));
    r.radar(Kind::Conflict, "api", "web", &["a.rs"]);
    let o = r.env.sync(&["--once"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains("status of branch task/web") && err.contains("push the branch again"),
        "{err}"
    );
    assert_eq!(r.statuses().len(), 1, "api's is written all the same");
    // The next run neither retries nor complains; a new push is written.
    let o = r.env.sync(&["--once"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(r.status_requests().0, 2);
    let web = r.commit("task/web", "web.rs");
    r.pushed("web", "task/web", &web);
    r.sync();
    assert_eq!(r.statuses().len(), 2);
}

#[test]
fn a_token_without_status_rights_fails_77_after_the_comments() {
    let r = Repo::new("status-403");
    let api = r.commit("task/api", "api.rs");
    let web = r.commit("task/web", "web.rs");
    r.sandbox("api", "task/api", &api);
    r.sandbox("web", "task/web", &web);
    r.env.ctl(
        "POST",
        "tokens",
        json!({ "token": TOKEN, "login": "lw-bot", "write": true, "pulls": false }),
    );
    r.radar(Kind::Conflict, "api", "web", &["a.rs"]);
    let o = r.env.sync(&["--once"]);
    let e = text(&o.stderr);
    assert_eq!(o.status.code(), Some(77), "{e}");
    assert!(e.contains("Commit statuses: write"), "{e}");
    assert_eq!(
        r.env.comments(1).len(),
        1,
        "the comment is posted all the same"
    );
    assert_eq!(r.statuses(), []);
    assert_eq!(
        r.status_requests(),
        (1, 0),
        "one refused request, not one per branch"
    );
    // Rights given: the next run writes both, once.
    r.env.ctl(
        "POST",
        "tokens",
        json!({ "token": TOKEN, "login": "lw-bot", "write": true, "pulls": true }),
    );
    r.sync();
    assert_eq!(r.statuses().len(), 2);
    assert_eq!(r.status_requests(), (3, 0));
}

#[test]
fn a_hostile_file_list_is_cut_to_one_safe_line_and_a_forged_one_counts_for_nothing() {
    let r = Repo::new("status-hostile");
    let api = r.commit("task/api", "api.rs");
    let web = r.commit("task/web", "web.rs");
    r.sandbox("api", "task/api", &api);
    r.sandbox("web", "task/web", &web);
    // A log entry no mediator writes: 10,000 files, one with a newline.  It
    // is refused as a comment (65) and makes no status.
    let mut files: Vec<String> = (0..10_000).map(|i| format!("src/f{i:05}.rs")).collect();
    files.push("two\nlines.rs".into());
    let refs: Vec<&str> = files.iter().map(String::as_str).collect();
    r.radar(Kind::Conflict, "api", "web", &refs);
    let o = r.env.sync(&["--once"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("refs has 10001 entries"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(r.statuses(), [], "a refused message counts for nothing");
    // What the radar can send: 64 long paths, a non-UTF-8 one as it shows
    // it, a bidi override.
    let mut files: Vec<String> = (0..62)
        .map(|i| format!("src/{}/f{i}.rs", "deep".repeat(60)))
        .collect();
    files.push("bad\\xff\\xfe.rs".into());
    files.push("\u{202e}sj.txt".into());
    let refs: Vec<&str> = files.iter().map(String::as_str).collect();
    r.radar(Kind::Conflict, "api", "web", &refs);
    let _ = r.env.sync(&["--once"]);
    let made = r.statuses();
    assert_eq!(made.len(), 2, "{made:?}");
    for (_, st, d) in &made {
        assert_eq!(st, "failure");
        assert!(d.chars().count() <= 140, "{} chars: {d}", d.chars().count());
        assert!(
            !d.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{d:?}"
        );
        assert!(d.contains("more"), "{d}");
    }
    println!(
        "hostile descriptions: {:?}",
        made.iter().map(|m| &m.2).collect::<Vec<_>>()
    );
    // A branch name with a newline never reaches a description: the
    // registry refuses its record (the pure test in crates/sync/src/status.rs
    // cuts such names all the same).
}

/// What the storm changes between runs.
fn storm_step(r: &Repo, names: &[(String, String)], live: &mut BTreeMap<(usize, usize), bool>) {
    let pick = seeded::below(3);
    let a = seeded::below(names.len() as u64) as usize;
    let b = (a + 1 + seeded::below(names.len() as u64 - 1) as usize) % names.len();
    let (a, b) = (a.min(b), a.max(b));
    match pick {
        0 => {
            let f = format!("src/f{}.rs", seeded::below(4));
            r.radar(Kind::Conflict, &names[a].0, &names[b].0, &[&f]);
            live.insert((a, b), true);
        }
        1 => {
            r.radar(Kind::ConflictCleared, &names[a].0, &names[b].0, &[]);
            live.insert((a, b), false);
        }
        _ => {
            let sha = r.commit(&names[a].1, "more.rs");
            r.pushed(&names[a].0, &names[a].1, &sha);
        }
    }
}

#[test]
fn sigkill_storm_never_duplicates_a_status_change() {
    let r = Repo::new("status-kill");
    let names: Vec<(String, String)> = (0..20)
        .map(|i| (format!("s{i}"), format!("task/s{i}")))
        .collect();
    for (n, b) in &names {
        let sha = r.commit(b, &format!("{n}.rs"));
        r.sandbox(n, b, &sha);
    }
    r.env.faults(json!([
        { "kind": "drop_after_commit", "method": "POST", "path_contains": "/statuses/", "count": 0, "probability": 0.2 },
        { "kind": "status", "status": 502, "commit": true, "method": "POST", "path_contains": "/statuses/", "count": 0, "probability": 0.1 },
    ]));
    let mut live = BTreeMap::new();
    let (mut kills, mut runs, mut finished) = (0, 0, 0);
    while kills < 200 {
        storm_step(&r, &names, &mut live);
        let mut child = r
            .env
            .sync_cmd(&["--once"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        runs += 1;
        // The moment of the kill is what is random here; nothing waits on it.
        std::thread::sleep(Duration::from_micros(seeded::below(300_000)));
        match child.try_wait().unwrap() {
            Some(_) => finished += 1,
            None => {
                child.kill().unwrap(); // SIGKILL
                kills += 1;
            }
        }
        child.wait().unwrap();
        assert!(runs < 2000, "too few kills landed: {kills} in {runs} runs");
    }
    // Undisturbed to the end (the faults go on): then nothing more is sent.
    let mut settled = false;
    for _ in 0..20 {
        let o = r.env.sync(&["--once"]);
        if o.status.success() && r.env.sync(&["--once"]).status.success() {
            let before = r.status_requests();
            r.sync();
            if r.status_requests() == before {
                settled = true;
                break;
            }
        }
    }
    assert!(settled, "the statuses never settled");
    let made = r.statuses();
    // A duplicate: the same status twice in a row on one commit.
    let mut last: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    let mut dups = 0;
    for (sha, st, d) in &made {
        if last.insert(sha, (st, d)) == Some((st, d)) {
            dups += 1;
        }
    }
    // The final state: every branch's head carries what stands.
    let (posts, gets) = r.status_requests();
    let (reqs, _) = r.env.requests();
    let faults = reqs
        .iter()
        .filter(|q| q["path"].as_str().unwrap().contains("/statuses/") && !q["fault"].is_null())
        .count();
    println!(
        "status kill storm: seed {}, kills {kills}, runs {runs} ({finished} finished before the kill), status POSTs {posts}, settling listings {gets}, faults fired {faults}, statuses {}, duplicates {dups}",
        seeded::seed(),
        made.len()
    );
    assert!(faults > 0, "the faults never fired");
    assert_eq!(dups, 0, "{made:#?}");
    // Every head shows the verdict as it stands (and the comments agree).
    let o = r.env.sync(&["verify"]);
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
}
