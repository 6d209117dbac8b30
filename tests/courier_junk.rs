//! Volume mode on the local engine (the root's record of it says
//! `separate`, as for an engine on another machine): a sandbox that plants
//! sparse 2 GiB files and dense 1.1 MiB files in its volume's `outbox/new/`,
//! round after round, while two others talk (tracker issue #40, item 3).
//! Five sparse 2 GiB files used to make the courier stream 10 GiB per pass,
//! and another pair's message took 50 s instead of 0.75 s.
//!
//! Each round also plants a tenth as many 1 MiB files, all holes (no
//! message: junk in the volume, never expanded in the root) and dense but
//! not JSON (carried; the mediator quarantines them within x's budget).
//!
//! Asserted, each round: what the courier process read (its `rchar`,
//! sockets included) is at most what a pass may carry; the junk leaves
//! `outbox/new/` for the volume's `outbox/junk/` and no byte of it reaches
//! the root; the pair's message crosses within its usual time (measured
//! before the junk, same run).  Over all rounds the root grows by at most
//! the sender's quarantine budget; the planter's own message still crosses.
//! "Usual" is twice the slowest of three crossings before the junk, plus
//! 5 s for a machine other builds load (the old courier took minutes).
//! `LW_JUNK_ROUNDS` and `LW_JUNK_FILES` (per round, of each kind) scale it;
//! the default is 10 rounds of 100 and 100, the 1,000 and 1,000.

mod courier_support;
mod sandbox_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use courier_support::{Courier, LwSandbox, id_time};
use sandbox_support::{Fixture, bin, docker, text};

/// A child killed when the test ends, passed or not.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the courier process has read, sockets included (/proc/PID/io).
fn rchar(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).expect("/proc/PID/io");
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("rchar")
}

/// Bytes the files under `dir` take on disk.
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => allocated(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

fn scale(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Plants `n` sparse 2 GiB files and `n` dense 1.1 MiB files in the
/// outbox of the sandbox, and `q` of 1 MiB each, sparse (all holes) and
/// dense (not JSON), named by the id grammar and renamed in from `tmp/` as
/// lw-post does, so each is whole when the courier sees it.
fn plant(round: usize, n: usize, q: usize) -> String {
    format!(
        "set -e; cd /lw/mailbox/outbox
for i in $(seq {n}); do
  k=$(( {round} * 100000 + i ))
  s=$(printf '1800000000.%09d.%032x' $k $k); truncate -s 2G tmp/$s; mv tmp/$s new/$s
  d=$(printf '1800000001.%09d.%032x' $k $k); head -c 1153434 /dev/urandom > tmp/$d; mv tmp/$d new/$d
done
for i in $(seq {q}); do
  k=$(( {round} * 100000 + i ))
  s=$(printf '1800000002.%09d.%032x' $k $k); truncate -s 1M tmp/$s; mv tmp/$s new/$s
  d=$(printf '1800000003.%09d.%032x' $k $k); head -c 1048576 /dev/zero | tr '\\0' x > tmp/$d; mv tmp/$d new/$d
done"
    )
}

/// Files under `dirs` of the root that hold `text`.
fn holding(root: &Path, dirs: &[&str], text: &str) -> usize {
    dirs.iter()
        .filter_map(|d| std::fs::read_dir(root.join(d)).ok())
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter(|s| s.contains(text))
        .count()
}

/// Waits until the root's copy of `name`'s outbox holds nothing for the
/// mediator.
fn taken(root: &Path, name: &str) {
    let new = root.join(format!("sandboxes/{name}/outbox/new"));
    let w = mailbox::fs::Watcher::new().unwrap();
    w.add(&new).unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while std::fs::read_dir(&new).unwrap().count() > 0 {
        assert!(
            Instant::now() < deadline,
            "the mediator took {name}'s posts"
        );
        w.wait(Some(Duration::from_secs(5))).unwrap();
    }
}

#[test]
fn junk_in_a_volume_outbox_is_never_streamed_and_delays_no_other_pair() {
    let rounds = scale("LW_JUNK_ROUNDS", 10);
    let n = scale("LW_JUNK_FILES", 100);
    let q = n.div_ceil(10);
    let fx = Fixture::new("cjunk");
    // The local engine, taken for one that does not see this host's files.
    let id = text(&docker(&["info", "--format", "{{.ID}}"]))
        .trim()
        .to_string();
    let rec = engine::hostpaths::record_path(&mailbox::layout::Root::new(&fx.root), &id);
    std::fs::create_dir_all(rec.parent().unwrap()).unwrap();
    std::fs::write(&rec, "separate\nlocal\n").unwrap();
    let policy = fx.dir.join("policy");
    std::fs::write(&policy, "loopwright-policy 1\nrate off\nduplicates off\n").unwrap();
    for name in ["a", "b", "x"] {
        fx.ok(&["create", name, "--branch", name]);
    }
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fx.root.join("state/sandbox/x.json")).unwrap())
            .unwrap();
    assert_eq!(rec["volume_mode"], true, "x is in volume mode: {rec}");
    // Our own courier, in the foreground, to measure it.
    fx.ok(&["courier", "--stop"]);
    let courier = Courier::spawn(&mut fx.cmd(&["courier", "--interval", "200"]));
    let pid = courier.pid();
    let _mediator = Killed(
        Command::new(bin("lw-mediate"))
            .arg("--root")
            .arg(&fx.root)
            .arg("--policy")
            .arg(&policy)
            .stdout(Stdio::null())
            .spawn()
            .expect("lw-mediate runs"),
    );
    let base = |args: &[&str]| fx.cmd(args);
    let lw = LwSandbox { base: &base };
    let cross = |from: &str, to: &str, subject: &str| {
        let w = lw.waiter(to);
        let id = lw.post(from, to, subject);
        let (_, at) = w.listed(&id);
        lw.ok(&["exec", to, "--", "lw-inbox", "ack", &id]);
        at.duration_since(id_time(&id)).unwrap_or_default()
    };
    let usual: Vec<Duration> = (0..3)
        .map(|i| cross("a", "b", &format!("before {i}")))
        .collect();
    let usual_max = *usual.iter().max().unwrap();
    let root_before = allocated(&fx.root);

    let started = Instant::now();
    let mut with_junk = Vec::new();
    let mut junk = 0;
    let mut most_read = 0;
    for r in 0..rounds {
        let read0 = rchar(pid);
        let t = Instant::now();
        let (code, out, err) = fx.sh("x", &plant(r, n, q));
        assert_eq!(code, 0, "planting in x: {out}{err}");
        let planted = t.elapsed();
        with_junk.push(cross("a", "b", &format!("round {r}")));
        junk = courier.until("junk", junk, junk + 2 * n + q, Duration::from_secs(300));
        let read = rchar(pid) - read0;
        println!(
            "round {r}: planted in {planted:?}, a->b {:?}, the junk gone after {:?}, the courier read {read} bytes",
            with_junk[r],
            t.elapsed()
        );
        most_read = most_read.max(read);
        assert!(
            read <= loopwright::sandbox::courier::PASS_MAX,
            "round {r}: the courier read {read} bytes for {n} sparse 2 GiB and {n} dense 1.1 MiB files"
        );
        let (code, left, err) = fx.sh(
            "x",
            "ls -A /lw/mailbox/outbox/new; ls -A /lw/mailbox/outbox/junk | wc -l; rm -rf /lw/mailbox/outbox/junk",
        );
        assert_eq!(code, 0, "{err}");
        let mut l = left.lines();
        let moved: usize = l.next_back().unwrap().trim().parse().unwrap();
        assert_eq!(l.count(), 0, "x's outbox/new is empty: {left}");
        assert_eq!(
            moved,
            2 * n + q,
            "round {r}: all junk in x's outbox/junk: {left}"
        );
    }
    let took = started.elapsed();
    taken(&fx.root, "x");
    let grew = allocated(&fx.root).saturating_sub(root_before);
    // The planter's own message still crosses.
    let from_x = cross("x", "a", "x still talks");
    println!(
        "courier_junk: {rounds} rounds of {n} sparse 2 GiB + {n} dense 1.1 MiB + {q} sparse 1 MiB + {q} dense 1 MiB files in {took:?}; \
         a->b before {usual:?}, with the junk {with_junk:?}; x->a after {from_x:?}; \
         most the courier read in a round {most_read} bytes; the root grew {grew} bytes"
    );
    // Its usual time, with room for a machine that other builds load: the
    // old courier took minutes (it streamed every sparse file whole).
    let limit = usual_max * 2 + Duration::from_secs(5);
    for (r, d) in with_junk.iter().enumerate() {
        assert!(
            *d <= limit,
            "round {r}: a->b took {d:?} with the junk, {usual_max:?} at most before"
        );
    }
    // x's budgets: what the quarantine keeps of it, and its log.
    let budget = mailbox::mediate::DEFAULT_QUARANTINE_MAX + mailbox::mediate::DEFAULT_LOG_MAX;
    assert!(
        grew <= budget,
        "the root grew {grew} bytes, x's budgets are {budget}"
    );
    // Told once, when x's bad files passed its quarantine budget.
    let said = "x used its quarantine budget";
    let once =
        usize::from((rounds * q) as u64 * (1 << 20) > mailbox::mediate::DEFAULT_QUARANTINE_MAX);
    assert_eq!(
        holding(&fx.root, &["human/new", "human/cur"], said),
        once,
        "a person is told"
    );
    let x_inbox = ["sandboxes/x/inbox/new", "sandboxes/x/inbox/cur"];
    assert_eq!(holding(&fx.root, &x_inbox, said), once, "x is told");
    courier.kill();
}
