//! Issue 41: the door under power cuts, not SIGKILL storms.
//!
//! The door runs, with the real lw-post, lw-mediate and lw-inbox, on the
//! power-cut file system (crates/powercut), which keeps only what an fsync
//! made durable.  `cut_at_every_durability_point_of_one_story` runs a fixed
//! story once to count its durability points, then once more for each point
//! k, cut right after k; `cut_at_random_moments` cuts writers, a watching
//! mediator and readers at seeded random moments.  After each cut the power
//! comes back, `lw-mediate --once` must start on what survived without a
//! manual fix, and the promises must hold (see `check`): every post that
//! exited 0 is delivered exactly once or still waits in its outbox, no
//! message is delivered twice, every ack survives and gets its receipt in
//! the log, the log holds each decision once, and nothing the door wrote
//! itself is quarantined.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mailbox::layout::Root;
use mailbox::log::{Action, Entry, Log};
use mailbox::maildir::Maildir;
use mailbox::message::Message;
use powercut::PowerCut;
use support::{bin, common, seeded};

const SANDBOXES: [&str; 3] = ["aa", "bb", "cc"];
const POLICY: &str = "loopwright-policy 1\nrate off\nduplicates off\n";

/// What the processes of a run were told, before or up to the cut.
#[derive(Default, Debug)]
struct Promises {
    /// Posts whose lw-post exited 0: id → (sender, recipients).
    posted: BTreeMap<String, (String, Vec<String>)>,
    /// Acks whose lw-inbox exited 0: (reader, id).
    acked: Vec<(String, String)>,
}

struct Stage {
    fs: PowerCut,
    host: PathBuf,
    policy: PathBuf,
}

impl Stage {
    fn new(tag: &str) -> Stage {
        assert!(
            common::is_root() && Path::new("/dev/fuse").exists(),
            "this test mounts a FUSE file system: run the suite as root with /dev/fuse (CI does)"
        );
        let host = support::tempdir(tag);
        let mnt = host.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let fs = PowerCut::mount(&mnt).expect("the power-cut file system mounts (FUSE)");
        let policy = host.join("policy");
        std::fs::write(&policy, POLICY).unwrap();
        Stage { fs, host, policy }
    }

    /// A fresh root on the file system, its sandboxes registered by the
    /// real lw-mediate, all of it durable; the count starts at 0.
    fn root(&self, name: &str) -> Root {
        let root = Root::new(self.fs.mountpoint.join(name));
        std::fs::create_dir_all(&root.dir).unwrap();
        for s in SANDBOXES {
            let o = self.mediate(&root, &["register", s]);
            assert!(o.status.success(), "register {s}: {}", common::stderr(&o));
        }
        self.fs.sync_all();
        self.fs.reset_count();
        root
    }

    fn mediate(&self, root: &Root, args: &[&str]) -> Output {
        Command::new(bin("lw-mediate"))
            .arg("--root")
            .arg(&root.dir)
            .args(args)
            .current_dir(&self.host)
            .stdin(Stdio::null())
            .output()
            .expect("lw-mediate runs")
    }

    fn once(&self, root: &Root) -> Output {
        let p = self.policy.to_str().unwrap();
        self.mediate(root, &["--once", "--policy", p])
    }
}

fn mailbox_of(root: &Root, s: &str) -> PathBuf {
    root.sandboxes_dir().join(s)
}

/// lw-post from `from` to `to`; the id when it exited 0.
fn post(root: &Root, from: &str, to: &[&str], subject: &str) -> Option<String> {
    let o = Command::new(bin("lw-post"))
        .arg("-m")
        .arg(mailbox_of(root, from))
        .args(["-k", "request", "-t", &to.join(","), "-s", subject, "body"])
        .stdin(Stdio::null())
        .output()
        .expect("lw-post runs");
    o.status
        .success()
        .then(|| common::stdout(&o).trim().to_string())
}

/// `lw-inbox list --json` of `reader`: what it presents as new.
fn list(root: &Root, reader: &str) -> String {
    let o = Command::new(bin("lw-inbox"))
        .arg("-m")
        .arg(mailbox_of(root, reader))
        .args(["list", "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("lw-inbox runs");
    assert!(o.status.success(), "lw-inbox list: {}", common::stderr(&o));
    common::stdout(&o)
}

fn ack(root: &Root, reader: &str, id: &str) -> bool {
    Command::new(bin("lw-inbox"))
        .arg("-m")
        .arg(mailbox_of(root, reader))
        .args(["ack", id])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("lw-inbox runs")
        .success()
}

/// The story: three posts, a pass, acks, a post, a pass, an ack, a pass.
/// Stops at the first step after the cut.  Returns what was promised.
fn story(st: &Stage, root: &Root) -> Promises {
    let mut p = Promises::default();
    let posts = |p: &mut Promises, list: &[(&str, &[&str], &str)]| {
        for (from, to, subject) in list {
            if let Some(id) = post(root, from, to, subject) {
                let to = to.iter().map(|s| s.to_string()).collect();
                p.posted.insert(id, (from.to_string(), to));
            }
        }
    };
    let acks = |p: &mut Promises, reader: &str| {
        let mine: Vec<String> = (p.posted.iter())
            .filter(|(_, (_, to))| to.iter().any(|t| t == reader))
            .map(|(id, _)| id.clone())
            .collect();
        for id in mine {
            if ack(root, reader, &id) {
                p.acked.push((reader.to_string(), id));
            }
        }
    };
    posts(
        &mut p,
        &[
            ("aa", &["bb"], "one"),
            ("bb", &["aa"], "two"),
            ("cc", &["aa", "bb"], "three"),
        ],
    );
    if st.fs.is_cut() {
        return p;
    }
    let _ = st.once(root);
    acks(&mut p, "bb");
    posts(&mut p, &[("aa", &["cc"], "four")]);
    let _ = st.once(root);
    acks(&mut p, "cc");
    let _ = st.once(root);
    p
}

/// Names in `dir`, sorted; none when it cannot be read (the power is off).
fn ls(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Every message file under a Maildir's `new/` and `cur/`: (sub, name, id).
fn messages(m: &Maildir) -> Vec<(&'static str, String, String)> {
    let mut v = Vec::new();
    for sub in ["new", "cur"] {
        for name in ls(&m.path.join(sub)) {
            let bytes = std::fs::read(m.path.join(sub).join(&name)).unwrap_or_default();
            let id = match Message::parse(&bytes) {
                Ok(msg) => msg.id,
                Err(e) => format!("UNREADABLE({e})"),
            };
            v.push((sub, name, id));
        }
    }
    v
}

/// Restarts the mediator on what survived and checks every promise.
/// Returns the violations (empty: all held) and the count of checks made.
fn check(st: &Stage, root: &Root, p: &Promises) -> (Vec<String>, usize) {
    let mut bad = Vec::new();
    let mut checks = 0;
    let mut expect = |ok: bool, what: String| {
        checks += 1;
        if !ok {
            bad.push(what);
        }
    };
    // Twice: the second pass sees what the first left (receipts, retries).
    for pass in 1..=2 {
        let o = st.once(root);
        let why = common::stderr(&o);
        expect(
            o.status.success(),
            format!("lw-mediate --once pass {pass} fails: {why}"),
        );
    }
    // The readers start again too: what each lists as new.
    let listed: HashMap<&str, String> = SANDBOXES.iter().map(|s| (*s, list(root, s))).collect();
    let inboxes: HashMap<&str, Vec<_>> = SANDBOXES
        .iter()
        .map(|s| (*s, messages(&root.sandbox(s).inbox())))
        .collect();
    for (s, msgs) in &inboxes {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (sub, name, id) in msgs {
            *seen.entry(id.as_str()).or_default() += 1;
            let readable = !id.starts_with("UNREADABLE");
            expect(readable, format!("{s}'s inbox {sub}/{name} is {id}"));
        }
        for (id, n) in seen {
            expect(n == 1, format!("{id} delivered {n} times to {s}"));
        }
    }
    let outboxes: HashMap<&str, Vec<_>> = SANDBOXES
        .iter()
        .map(|s| (*s, messages(&root.sandbox(s).outbox())))
        .collect();
    let in_outbox = |from: &str, want: &str, id: &str| {
        (outboxes[from].iter()).any(|(sub, _, i)| *sub == want && i == id)
    };
    for (id, (from, to)) in &p.posted {
        let waits = in_outbox(from, "new", id);
        for r in to {
            let n = inboxes[r.as_str()].iter().filter(|m| &m.2 == id).count();
            expect(
                n == 1 || (n == 0 && waits),
                format!("{from}'s post {id}, exit 0, is in {r}'s inbox {n} times (waits: {waits})"),
            );
        }
    }
    let (entries, unreadable) = Log::new(root.log_dir()).entries().unwrap_or_default();
    expect(
        unreadable.is_empty(),
        format!("unreadable log entries: {unreadable:?}"),
    );
    let mut decisions: HashMap<(String, &str), usize> = HashMap::new();
    for e in &entries {
        let a = e.decision.action;
        expect(a != Action::Quarantine, format!("quarantined: {}", e.name));
        if matches!(
            a,
            Action::Forward | Action::Bounce | Action::Hold | Action::Escalate
        ) {
            *decisions
                .entry((e.message_id.clone(), a.as_str()))
                .or_default() += 1;
        }
    }
    for ((id, a), n) in &decisions {
        expect(*n == 1, format!("{id}: {n} {a} entries"));
    }
    for (id, (from, _)) in &p.posted {
        let claimed = in_outbox(from, "cur", id);
        let logged = decisions.contains_key(&(id.clone(), "forward"));
        expect(
            !claimed || logged,
            format!("{id} claimed without its decision in the log"),
        );
    }
    for (reader, id) in &p.acked {
        let cur = inboxes[reader.as_str()]
            .iter()
            .any(|(sub, _, i)| *sub == "cur" && i == id);
        expect(cur, format!("{reader}'s ack of {id} (exit 0) is lost"));
        let again = listed[reader.as_str()].contains(id.as_str());
        expect(
            !again,
            format!("{reader}'s ack of {id} (exit 0) is undone: listed as new"),
        );
        let receipt = Entry::name_for(id, Action::Read, Some(reader));
        let has = entries.iter().any(|e| e.name == receipt);
        expect(has, format!("no receipt {receipt} in the log"));
    }
    let q = messages(&root.quarantine());
    expect(q.is_empty(), format!("quarantine holds {q:?}"));
    (bad, checks)
}

#[test]
fn cut_at_every_durability_point_of_one_story() {
    every_point("powercut-every", false);
}

/// The same where the file system refuses RENAME_NOREPLACE (gVisor's
/// does): every move is a link and an unlink, two names in between.
#[test]
fn cut_at_every_durability_point_with_link_and_unlink() {
    every_point("powercut-link", true);
}

fn every_point(tag: &str, refuse_noreplace: bool) {
    let st = Stage::new(tag);
    st.fs.refuse_noreplace(refuse_noreplace);
    let root = st.root("whole");
    let p = story(&st, &root);
    let points = st.fs.syncs();
    assert_eq!(p.posted.len(), 4, "the uncut story posts 4 messages: {p:?}");
    assert_eq!(p.acked.len(), 3, "the uncut story acks 3 messages: {p:?}");
    let (bad, _) = check(&st, &root, &p);
    assert!(bad.is_empty(), "the uncut story: {bad:#?}");
    assert!(
        points > 10,
        "the story makes its writes durable: {points} points"
    );
    let links = st.fs.links();
    assert_eq!(
        refuse_noreplace,
        links > 0,
        "{links} links: the path under test"
    );

    let (mut cuts, mut checks, mut violations) = (0, 0, Vec::new());
    for k in 1..=points {
        let root = st.root(&format!("cut-{k}"));
        st.fs.arm(k);
        let p = story(&st, &root);
        if !st.fs.is_cut() {
            // The mediator's concurrent fsyncs may number fewer this run.
            eprintln!("cut at {k}: the story ended after {} points", st.fs.syncs());
            st.fs.restore();
            continue;
        }
        cuts += 1;
        st.fs.restore();
        let (bad, n) = check(&st, &root, &p);
        checks += n;
        violations.extend(bad.into_iter().map(|b| format!("cut at {k}: {b}")));
    }
    eprintln!(
        "{tag}: durability points {points}, cuts {cuts}, invariants checked {checks}, violations {}",
        violations.len()
    );
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(
        cuts * 10 >= points * 9,
        "{cuts} of {points} points were cut"
    );
}

/// Writers post in a loop until the cut; returns the promises.
fn writer(root: Root, from: &'static str, stop: Arc<AtomicBool>, p: Arc<Mutex<Promises>>) {
    let to = SANDBOXES[(SANDBOXES.iter().position(|s| *s == from).unwrap() + 1) % 3];
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        if let Some(id) = post(&root, from, &[to], &format!("{from} {i}")) {
            let mut p = p.lock().unwrap();
            p.posted.insert(id, (from.into(), vec![to.into()]));
        }
    }
}

/// A reader acks whatever it finds delivered, until the cut.
fn reader(root: Root, me: &'static str, stop: Arc<AtomicBool>, p: Arc<Mutex<Promises>>) {
    while !stop.load(Ordering::SeqCst) {
        for (sub, _, id) in messages(&root.sandbox(me).inbox()) {
            if sub == "new" && ack(&root, me, &id) {
                p.lock().unwrap().acked.push((me.into(), id));
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A child killed (and reaped) when dropped, also when a test panics.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn random_round(st: &Stage, round: u64) -> (Vec<String>, usize, usize) {
    let root = st.root(&format!("random-{round}"));
    let o = st.once(&root);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let watcher = Command::new(bin("lw-mediate"))
        .arg("--root")
        .arg(&root.dir)
        .arg("--policy")
        .arg(&st.policy)
        .current_dir(&st.host)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Killed)
        .expect("lw-mediate starts");
    let stop = Arc::new(AtomicBool::new(false));
    let p = Arc::new(Mutex::new(Promises::default()));
    let mut threads = Vec::new();
    for s in SANDBOXES {
        let (r, st2, p2) = (root.clone(), stop.clone(), p.clone());
        threads.push(std::thread::spawn(move || writer(r, s, st2, p2)));
        let (r, st2, p2) = (root.clone(), stop.clone(), p.clone());
        threads.push(std::thread::spawn(move || reader(r, s, st2, p2)));
    }
    std::thread::sleep(Duration::from_millis(20 + seeded::below(400)));
    st.fs.cut();
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    // Nothing runs on past a power cut: the mediator dies with the power.
    drop(watcher);
    st.fs.restore();
    let p = p.lock().unwrap();
    let (bad, n) = check(st, &root, &p);
    let bad: Vec<String> = bad
        .into_iter()
        .map(|b| format!("round {round}: {b}"))
        .collect();
    for b in &bad {
        eprintln!("{b}");
    }
    // What a round leaves would slow every later sync_all and restore.
    std::fs::remove_dir_all(&root.dir).unwrap();
    (bad, n, p.posted.len())
}

#[test]
fn cut_at_random_moments() {
    let rounds: u64 = std::env::var("LW_POWERCUT_ROUNDS")
        .map(|v| v.parse().expect("LW_POWERCUT_ROUNDS is a whole number"))
        .unwrap_or(20);
    seeded::seed();
    let st = Stage::new("powercut-random");
    let t0 = Instant::now();
    let (mut checks, mut posted, mut violations) = (0, 0, Vec::new());
    for round in 0..rounds {
        let (bad, n, ok) = random_round(&st, round);
        checks += n;
        posted += ok;
        violations.extend(bad);
    }
    eprintln!(
        "random cuts {rounds} in {:.1}s, posts that exited 0 {posted}, invariants checked {checks}, violations {}",
        t0.elapsed().as_secs_f64(),
        violations.len()
    );
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(posted > 0, "some posts exited 0 before their cut");
}

/// Issue 41, group commit: a batch takes a run of posts from one outbox
/// (up to `TURN`), each outbox's `cur/` is fsynced once per pass, not
/// once per batch, and a batch's log entries are one batch file.  Three
/// senders post 24 each to the next one; a pass in batches of 8 makes one
/// fsync per copy, one per batch for its log file, and beside those at
/// most two directories per batch (the log's `new/`, the one inbox's
/// `new/`), one `cur/` per outbox and the mediator's memory.  Before the
/// batch file: a log file per post, 72 fsyncs more (167 in all, bound 106).
#[test]
fn a_pass_fsyncs_each_outbox_cur_once_and_a_batch_few_inboxes() {
    const EACH: usize = 24;
    let st = Stage::new("powercut-syncs");
    let root = st.root("syncs");
    let mut posted = Promises::default();
    for i in 0..EACH {
        for (k, from) in SANDBOXES.iter().enumerate() {
            let to = SANDBOXES[(k + 1) % 3];
            let id = post(&root, from, &[to], &format!("{from} {i}")).expect("lw-post");
            posted
                .posted
                .insert(id, (from.to_string(), vec![to.to_string()]));
        }
    }
    st.fs.sync_all();
    st.fs.reset_count();
    let p = st.policy.to_str().unwrap();
    let o = st.mediate(&root, &["--once", "--policy", p, "--batch", "8"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let syncs = st.fs.syncs() as usize;
    let batches = EACH * SANDBOXES.len() / 8;
    // A copy per post, a log file per batch.
    let files = EACH * SANDBOXES.len() + batches;
    let dirs = syncs.saturating_sub(files);
    eprintln!(
        "a pass over {} posts in {batches} batches of 8: {syncs} fsyncs, {files} of files, {dirs} of directories",
        EACH * SANDBOXES.len()
    );
    let (bad, _) = check(&st, &root, &posted);
    assert!(bad.is_empty(), "{bad:#?}");
    // Memory: its file, its directory, once or twice (drain saves it).
    let bound = 2 * batches + SANDBOXES.len() + 4;
    assert!(
        syncs <= files + bound,
        "{syncs} fsyncs for {batches} batches of 8 (at most {} files and {bound} directories)",
        files
    );
}
