//! Issue 32, the radar through the door: lw-radar puts `conflict` into the
//! mediator's outbox, lw-mediate routes it as its own (sender `mediator`,
//! logged), both sandboxes find it in their inbox, a further pass says
//! nothing, a resolution gives `conflict-cleared`; the policy can hold or
//! escalate the kind; a sandbox cannot post it.  Branches come from host
//! repositories (`--from`); tests/sandbox/sandbox_flow.rs reaches real sandboxes.

use support::common;

use std::path::Path;
use std::process::Command;

use common::{TempDir, run, stderr, stdout};
use mailbox::message::{Kind, Message};

fn git(dir: &Path, args: &[&str]) {
    let o = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn commit(repo: &Path, file: &str, text: &str) {
    std::fs::write(repo.join(file), text).unwrap();
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", file]);
}

fn radar(root: &Path, from: &Path) -> String {
    let o = run(Command::new(env!("CARGO_BIN_EXE_lw-radar"))
        .arg("--root")
        .arg(root)
        .arg("--from")
        .arg(from));
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o)
}

fn mediate(root: &Path, policy: Option<&Path>) {
    let mut c = Command::new(support::bin("lw-mediate"));
    c.arg("--root").arg(root).arg("--once");
    if let Some(p) = policy {
        c.arg("--policy").arg(p);
    }
    let o = run(&mut c);
    assert!(o.status.success(), "{}", stderr(&o));
}

fn inbox(root: &Path, name: &str) -> Vec<Message> {
    let d = root.join("sandboxes").join(name).join("inbox/new");
    let mut v: Vec<Message> = std::fs::read_dir(d)
        .map(|rd| {
            rd.map(|e| Message::parse(&std::fs::read(e.unwrap().path()).unwrap()).unwrap())
                .collect()
        })
        .unwrap_or_default();
    v.sort_by(|a, b| a.id.cmp(&b.id));
    v
}

/// A root with sandboxes a and b registered, each with a clone in
/// `from/NAME` on its own branch, both editing line 1 of f.txt.
fn setup(t: &TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let root = t.join("root");
    let from = t.join("from");
    std::fs::create_dir_all(&root).unwrap();
    let up = t.join("up");
    std::fs::create_dir_all(&up).unwrap();
    git(&up, &["init", "-q", "-b", "main"]);
    commit(&up, "f.txt", "one\ntwo\nthree\n");
    for (n, text) in [("a", "A\ntwo\nthree\n"), ("b", "B\ntwo\nthree\n")] {
        let d = from.join(n);
        git(
            t.path(),
            &[
                "clone",
                "-q",
                &up.display().to_string(),
                &d.display().to_string(),
            ],
        );
        git(&d, &["checkout", "-q", "-b", &format!("task-{n}")]);
        commit(&d, "f.txt", text);
        let o = run(Command::new(support::bin("lw-mediate"))
            .arg("--root")
            .arg(&root)
            .args(["register", n, "--branch", &format!("task-{n}")]));
        assert!(o.status.success(), "{}", stderr(&o));
    }
    (root, from)
}

#[test]
fn conflict_reaches_both_inboxes_once_then_clears() {
    let t = TempDir::new("radar-mediate");
    let (root, from) = setup(&t);
    let out = radar(&root, &from);
    assert!(out.starts_with("conflict "), "{out}");
    mediate(&root, None);
    for n in ["a", "b"] {
        let got = inbox(&root, n);
        assert_eq!(got.len(), 1, "{n}: {got:?}");
        assert_eq!(
            (got[0].kind, got[0].from.as_str()),
            (Kind::Conflict, "mediator")
        );
        assert!(
            got[0].subject.contains("task-a") && got[0].body.contains("f.txt (contents, 1 hunk"),
            "{}",
            got[0].body
        );
    }
    let log = run(Command::new(support::bin("lw-mediate"))
        .arg("--root")
        .arg(&root)
        .arg("log"));
    assert!(stdout(&log).contains("conflict"), "{}", stdout(&log));

    // Nothing new: nothing said.
    assert_eq!(radar(&root, &from), "");
    mediate(&root, None);
    assert_eq!(inbox(&root, "a").len(), 1);

    // b takes a's line: cleared, to both.
    commit(&from.join("b"), "f.txt", "A\ntwo\nthree\n");
    let out = radar(&root, &from);
    assert!(out.starts_with("conflict-cleared "), "{out}");
    mediate(&root, None);
    for n in ["a", "b"] {
        let kinds: Vec<Kind> = inbox(&root, n).iter().map(|m| m.kind).collect();
        assert_eq!(kinds, [Kind::Conflict, Kind::ConflictCleared], "{n}");
    }
    assert_eq!(radar(&root, &from), "");
    println!(
        "radar via the mediator: 1 conflict and 1 conflict-cleared in each of 2 inboxes, 0 repeats"
    );

    // b undoes its resolution: the conflict is back at the very commits
    // first announced, and reaches both inboxes again (issue 40: it was
    // held as an exact duplicate of the first announcement).
    git(&from.join("b"), &["reset", "-q", "--hard", "HEAD~1"]);
    let out = radar(&root, &from);
    assert!(out.starts_with("conflict "), "{out}");
    mediate(&root, None);
    for n in ["a", "b"] {
        let kinds: Vec<Kind> = inbox(&root, n).iter().map(|m| m.kind).collect();
        assert_eq!(
            kinds,
            [Kind::Conflict, Kind::ConflictCleared, Kind::Conflict],
            "{n}"
        );
    }
    assert_eq!(common::ls(&root.join("held/new")).len(), 0);
    println!("radar comeback via the mediator: in both inboxes, 0 held");
}

/// Issue 46: a daemon reads the registry at every pass: a sandbox
/// registered while `lw-radar --every` runs gets its conflict within two
/// intervals, and a one-shot pass meanwhile is not refused.
#[test]
fn a_daemon_sees_a_sandbox_registered_after_it_started() {
    use std::io::BufRead as _;
    use std::time::{Duration, Instant};
    let t = TempDir::new("radar-daemon");
    let (root, from) = setup(&t);
    let every = Duration::from_secs(2);
    let mut child = Command::new(env!("CARGO_BIN_EXE_lw-radar"))
        .arg("--root")
        .arg(&root)
        .arg("--from")
        .arg(&from)
        .args(["--every", "2s", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let wait_for = |want: &dyn Fn(&serde_json::Value) -> bool, within: Duration| {
        let end = Instant::now() + within;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let l = rx.recv_timeout(left).expect("the daemon said it in time");
            let v: serde_json::Value = serde_json::from_str(&l).unwrap();
            if want(&v) {
                return v;
            }
        }
    };
    // The first pass: a and b.
    wait_for(
        &|v| v["type"] == "sent" && v["a"] == "a" && v["b"] == "b",
        Duration::from_secs(30),
    );
    wait_for(&|v| v["type"] == "pass", Duration::from_secs(30));
    // c, registered now, edits a's line too.
    let d = from.join("c");
    git(
        t.path(),
        &[
            "clone",
            "-q",
            &t.join("up").display().to_string(),
            &d.display().to_string(),
        ],
    );
    git(&d, &["checkout", "-q", "-b", "task-c"]);
    commit(&d, "f.txt", "C\ntwo\nthree\n");
    let o = run(Command::new(support::bin("lw-mediate"))
        .arg("--root")
        .arg(&root)
        .args(["register", "c", "--branch", "task-c"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let registered = Instant::now();
    wait_for(
        &|v| v["type"] == "sent" && v["a"] == "a" && v["b"] == "c",
        every * 2,
    );
    let took = registered.elapsed();
    // A one-shot pass while the daemon runs is not refused (it waits for a
    // pass in progress), and has nothing new to say.
    let o = run(Command::new(env!("CARGO_BIN_EXE_lw-radar"))
        .arg("--root")
        .arg(&root)
        .arg("--from")
        .arg(&from));
    assert!(o.status.success(), "one-shot: {}", stderr(&o));
    assert_eq!(stdout(&o), "");
    println!(
        "radar daemon: sandbox registered while --every 2s ran: its conflict in {:.2}s; one-shot meanwhile: exit 0",
        took.as_secs_f32()
    );
    assert!(took <= every * 2, "{took:?}");

    // b declares a scope a's change lies in: the set of a and b changes,
    // and the daemon says so (the registry is read again, scopes too).
    let o = run(Command::new(support::bin("lw-mediate"))
        .arg("--root")
        .arg(&root)
        .args(["register", "b", "--branch", "task-b", "--scope", "f.txt"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let rescoped = Instant::now();
    let v = wait_for(
        &|v| v["type"] == "sent" && v["a"] == "a" && v["b"] == "b",
        every * 2,
    );
    assert_eq!(v["kind"], "conflict", "{v}");
    println!(
        "radar daemon: b rescoped: the new set in {:.2}s",
        rescoped.elapsed().as_secs_f32()
    );
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn the_policy_holds_or_escalates_conflicts() {
    for (rule, held, human, inboxed) in [
        ("route conflict hold\n", 1, 0, 0),
        ("route conflict human\n", 0, 1, 0),
        ("hold kind conflict\n", 1, 0, 0),
    ] {
        let t = TempDir::new("radar-policy");
        let (root, from) = setup(&t);
        let policy = t.join("policy");
        std::fs::write(&policy, format!("loopwright-policy 1\n{rule}")).unwrap();
        radar(&root, &from);
        mediate(&root, Some(&policy));
        let count = |d: &str| common::ls(&root.join(d).join("new")).len();

        assert_eq!(
            (count("held"), count("human"), inbox(&root, "a").len()),
            (held, human, inboxed),
            "{rule}"
        );
    }
}

#[test]
fn a_sandbox_cannot_post_the_radars_kinds() {
    let t = TempDir::new("radar-post");
    let (root, _) = setup(&t);
    for kind in ["conflict", "conflict-cleared"] {
        let o = run(common::lw_post()
            .env("LW_MAILBOX", root.join("sandboxes/a"))
            .args(["--kind", kind, "--subject", "fake", "--to", "b", "x"]));
        assert_eq!(o.status.code(), Some(65), "{kind}: {}", stderr(&o));
        assert!(stderr(&o).contains("is the mediator's"), "{}", stderr(&o));
    }
    // Planted in an outbox past lw-post: quarantined, not routed.
    let m = Message::compose(
        "a",
        vec!["b".into()],
        Kind::Conflict,
        "fake".into(),
        "x".into(),
        vec![],
        None,
    )
    .unwrap();
    let ob = root.join("sandboxes/a/outbox");
    for d in ["tmp", "new", "cur"] {
        std::fs::create_dir_all(ob.join(d)).unwrap();
    }
    std::fs::write(ob.join("new").join(&m.id), m.to_bytes()).unwrap();
    mediate(&root, None);
    assert!(inbox(&root, "b").is_empty());
    assert_eq!(common::ls(&root.join("quarantine/new")).len(), 1);
}
