//! Posts from a gVisor sandbox and a runc one, with a watching mediator:
//! none is lost to a race of the door's own protocol.  Under runsc
//! `renameat2(RENAME_NOREPLACE)` is refused, so lw-post moves a message by
//! `link` + `unlink`, and the file shows in `new/` with two links for an
//! instant; the mediator finishes such a move (the same inode at
//! `tmp/NAME`) instead of quarantining it.  The run is done twice: with the
//! mediator watching throughout, and with it killed and started again
//! every second (ten times) while the posts flow.  A second link the
//! sandbox really planted is still quarantined.  Prints its figures.
//!
//! Needs runsc registered with dockerd (as tests/sandbox/sandbox_runtime.rs).

use support::sandbox as sandbox_support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mailbox::layout::Root;
use mailbox::log::{Action, Log};
use mailbox::maildir::Sub;
use sandbox_support::*;

const POSTS: usize = 1_000;
const RESTARTS: usize = 10;
const OPEN_POLICY: &str = "loopwright-policy 1\nrate off\nduplicates off\n";

/// A watching lw-mediate over the fixture's root, killed when dropped.
struct Watcher(Child);

impl Watcher {
    fn start(f: &Fixture, policy: &std::path::Path) -> Watcher {
        let c = Command::new(bin("lw-mediate"))
            .arg("--root")
            .arg(&f.root)
            .arg("--policy")
            .arg(policy)
            .args(["--rescan", "5", "--log-max", "1g"])
            .current_dir(&f.proj)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("lw-mediate starts");
        Watcher(c)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn once(f: &Fixture, policy: &std::path::Path) {
    let o = Command::new(bin("lw-mediate"))
        .arg("--root")
        .arg(&f.root)
        .arg("--policy")
        .arg(policy)
        .args(["--once", "--log-max", "1g"])
        .current_dir(&f.proj)
        .output()
        .expect("lw-mediate runs");
    assert!(o.status.success(), "lw-mediate --once: {}", err(&o));
}

/// Quarantine reasons in the log.
fn quarantined(root: &Root) -> Vec<String> {
    let (good, _) = Log::new(root.log_dir()).entries().expect("log");
    good.into_iter()
        .filter(|e| e.decision.action == Action::Quarantine)
        .map(|e| e.decision.reason)
        .collect()
}

fn received(root: &Root, name: &str) -> usize {
    let ib = root.sandbox(name).inbox();
    [Sub::New, Sub::Cur]
        .iter()
        .map(|s| std::fs::read_dir(ib.sub(*s)).map_or(0, |d| d.count()))
        .sum()
}

/// `POSTS` lw-posts from `from` to `to`, in the sandbox; the failures.
fn poster(f: &Fixture, from: &str, to: &str, tag: &str) -> std::thread::JoinHandle<usize> {
    let cmd = f
        .cmd(&[
            "exec",
            from,
            "--",
            "sh",
            "-c",
            &format!(
                "i=0; while [ $i -lt {POSTS} ]; do o=$(lw-post --to {to} --kind request --subject '{tag} '$i b 2>&1) || echo \"FAILED $i: $o\"; i=$((i+1)); done"
            ),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lw-sandbox exec");
    std::thread::spawn(move || {
        let o = cmd.wait_with_output().expect("exec ends");
        assert!(o.status.success(), "poster: {}", err(&o));
        let failed: Vec<String> = text(&o)
            .lines()
            .filter(|l| l.starts_with("FAILED"))
            .map(str::to_string)
            .collect();
        for l in &failed {
            println!("{l}");
        }
        failed.len()
    })
}

/// One round: both sandboxes post to each other while the mediator watches
/// (restarted `restarts` times); then the counts.
fn round(f: &Fixture, policy: &std::path::Path, tag: &str, restarts: usize) {
    let root = Root::new(f.root.clone());
    let (gv0, rc0, q0) = (
        received(&root, "gv"),
        received(&root, "rc"),
        quarantined(&root).len(),
    );
    let t = Instant::now();
    let mut w = Watcher::start(f, policy);
    let from_gv = poster(f, "gv", "rc", tag);
    let from_rc = poster(f, "rc", "gv", tag);
    let mut during = 0;
    for _ in 0..restarts {
        std::thread::sleep(Duration::from_secs(1));
        drop(w);
        if !from_gv.is_finished() {
            during += 1;
        }
        w = Watcher::start(f, policy);
    }
    let (fail_gv, fail_rc) = (from_gv.join().unwrap(), from_rc.join().unwrap());
    let posting = t.elapsed();
    // What the watcher has not taken yet, a last pass takes.
    let deadline = Instant::now() + Duration::from_secs(30);
    while received(&root, "rc") - rc0 < POSTS
        && received(&root, "gv") - gv0 < POSTS
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(w);
    once(f, policy);
    let q = quarantined(&root);
    let (to_rc, to_gv) = (received(&root, "rc") - rc0, received(&root, "gv") - gv0);
    println!(
        "{tag}: {POSTS} posts from runsc, {POSTS} from runc, mediator restarted {restarts} times ({during} while runsc posted): \
         delivered {} (from runsc {to_rc}, from runc {to_gv}), quarantined {}, lw-post failures {fail_gv}+{fail_rc}; posting took {:.1?}",
        to_rc + to_gv,
        q.len() - q0,
        posting
    );
    assert_eq!((fail_gv, fail_rc), (0, 0), "{tag}: lw-post failed");
    assert_eq!(q.len(), q0, "{tag}: quarantined: {:?}", q.last());
    assert_eq!((to_rc, to_gv), (POSTS, POSTS), "{tag}: not all delivered");
    assert_eq!(
        during, restarts,
        "{tag}: the restarts did not fall in the run"
    );
}

#[test]
fn posts_from_runsc_and_runc_are_all_delivered_to_a_watching_and_a_restarted_mediator() {
    let f = Fixture::new("dgv");
    let policy = f.dir.join("policy");
    std::fs::write(&policy, OPEN_POLICY).expect("policy");
    f.ok(&["create", "gv", "--branch", "lw/gv", "--runtime", "runsc"]);
    f.ok(&["create", "rc", "--branch", "lw/rc", "--runtime", "runc"]);
    round(&f, &policy, "watching", 0);
    round(&f, &policy, "restarted", RESTARTS);

    // Planted second links are still quarantined: one under another name
    // in tmp/, and a twin in tmp/ with a third link beside it.
    let root = Root::new(f.root.clone());
    let q0 = quarantined(&root).len();
    let (a, b) = (base::id::new_id(), base::id::new_id());
    let (code, _, e) = f.sh(
        "gv",
        &format!(
            "cd /lw/mailbox/outbox && printf junk > new/{a} && ln new/{a} tmp/keep-a && \
             printf junk > tmp/{b} && ln tmp/{b} new/{b} && ln new/{b} tmp/keep-b"
        ),
    );
    assert_eq!(code, 0, "plant: {e}");
    once(&f, &policy);
    let q = quarantined(&root);
    println!("planted: {:?}", &q[q0..]);
    assert_eq!(q.len() - q0, 2, "{:?}", &q[q0..]);
    assert!(
        q[q0..].iter().all(|r| r.contains("hard links")),
        "{:?}",
        &q[q0..]
    );
}
