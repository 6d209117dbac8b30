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
//!
//! The same read as Kubernetes makes it, without a cluster: the contract's
//! default `copy_out` (a `tar` exec, crates/engine/src/tar_out.rs) over
//! Docker's exec, through a wrapper engine, read by the courier's reader.
//! Asserted: what crosses the exec's connection is within the reader's
//! bound and no `tar` is left in the container; the contract as it was
//! (the stop not passed on) is measured beside it, in the same run.

use support::courier as courier_support;
use support::sandbox as sandbox_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use base::error::{Exit, Result};
use courier_support::{Courier, LwSandbox, id_time};
use engine::{
    ContainerSpec, Engine, ExecIo, ExecRequest, HostPaths, Images, NetworkEngine, OutStream,
    SandboxEngine,
};
use loopwright::sandbox::courier::{End, HEADERS, PASS_MAX, read_outbox};
use mailbox::maildir::Maildir;
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
    let w = base::fs::Watcher::new().unwrap();
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

/// The Docker engine copying out as the Kubernetes one does: everything is
/// Docker's but `copy_out`, which is the contract's default (`tar -c`
/// through `exec_io`, over Docker's exec here).  It counts what crosses
/// the exec's connection.  `old` hides the caller's stop from Docker's
/// `exec_io`: the contract as it was, which read the exec to its end.
struct TarOut {
    docker: engine::DockerEngine,
    old: bool,
    crossed: AtomicU64,
}

impl Images for TarOut {
    fn image(&self, r: &str) -> Result<Option<engine::Image>> {
        self.docker.image(r)
    }
    fn images_with_label(&self, l: &str) -> Result<Vec<engine::Image>> {
        self.docker.images_with_label(l)
    }
}

impl Engine for TarOut {
    fn version(&self) -> Result<engine::EngineVersion> {
        self.docker.version()
    }
    fn create(&self, s: &ContainerSpec) -> Result<String> {
        self.docker.create(s)
    }
    fn start(&self, c: &str) -> Result<()> {
        self.docker.start(c)
    }
    fn stop(&self, c: &str, t: Duration) -> Result<()> {
        self.docker.stop(c, t)
    }
    fn remove(&self, c: &str, f: bool) -> Result<()> {
        self.docker.remove(c, f)
    }
    fn inspect(&self, c: &str) -> Result<Option<engine::Container>> {
        self.docker.inspect(c)
    }
    fn exec(&self, c: &str, r: &ExecRequest, o: &mut dyn FnMut(OutStream, &[u8])) -> Result<i64> {
        self.docker.exec(c, r, o)
    }
    fn info(&self) -> Result<engine::EngineInfo> {
        self.docker.info()
    }
}

impl NetworkEngine for TarOut {
    fn create_network(&self, s: &engine::NetworkSpec) -> Result<engine::Network> {
        self.docker.create_network(s)
    }
    fn network(&self, n: &str) -> Result<Option<engine::Network>> {
        self.docker.network(n)
    }
    fn networks_with_label(&self, l: &str) -> Result<Vec<engine::Network>> {
        self.docker.networks_with_label(l)
    }
    fn remove_network(&self, n: &str) -> Result<()> {
        self.docker.remove_network(n)
    }
    fn connect(&self, n: &str, c: &str, a: &[&str]) -> Result<()> {
        self.docker.connect(n, c, a)
    }
    fn disconnect(&self, n: &str, c: &str) -> Result<()> {
        self.docker.disconnect(n, c)
    }
    fn logs(&self, c: &str, stdout: bool) -> Result<Vec<u8>> {
        self.docker.logs(c, stdout)
    }
    fn wait_for_line(
        &self,
        c: &str,
        t: Duration,
        done: &mut dyn FnMut(&str) -> bool,
    ) -> Result<bool> {
        self.docker.wait_for_line(c, t, done)
    }
}

impl HostPaths for TarOut {
    fn address(&self) -> String {
        self.docker.address()
    }
    fn engine_id(&self) -> Result<String> {
        self.docker.engine_id()
    }
    fn read_through_bind(&self, d: &Path, n: &str) -> Result<Option<Vec<u8>>> {
        self.docker.read_through_bind(d, n)
    }
}

impl SandboxEngine for TarOut {
    fn containers_with_label(&self, l: &str) -> Result<Vec<engine::Container>> {
        self.docker.containers_with_label(l)
    }
    fn create_volume(&self, n: &str, l: &BTreeMap<String, String>) -> Result<()> {
        self.docker.create_volume(n, l)
    }
    fn remove_volume(&self, n: &str) -> Result<()> {
        self.docker.remove_volume(n)
    }
    fn volumes_with_label(&self, l: &str) -> Result<Vec<engine::Volume>> {
        self.docker.volumes_with_label(l)
    }
    fn exec_io(&self, c: &str, r: &ExecRequest, io: ExecIo<'_>) -> Result<i64> {
        let ExecIo {
            stdin,
            tty,
            size,
            on_output,
            stop,
        } = io;
        let mut counted = |s: OutStream, b: &[u8]| {
            self.crossed.fetch_add(b.len() as u64, Ordering::Relaxed);
            on_output(s, b)
        };
        let io = ExecIo {
            stdin,
            tty,
            size,
            on_output: &mut counted,
            stop: if self.old { None } else { stop },
        };
        self.docker.exec_io(c, r, io)
    }
    fn copy_in(&self, c: &str, dir: &str, tar: Box<dyn std::io::Read + Send>) -> Result<()> {
        self.docker.copy_in(c, dir, tar)
    }
}

/// A container removed when the test ends, passed or not.
struct Removed(String);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.0]);
    }
}

/// One pass's read of `/o/new` in `container`, as the courier reads an
/// outbox (carry.rs): what crossed the exec's connection, how long it
/// took, how the reader ended, and what copy_out said.
fn tar_pass(container: &str, old: bool, into: &Path) -> (u64, Duration, End, Result<u64>) {
    let e = TarOut {
        docker: engine::connect_docker(None).expect("the local engine"),
        old,
        crossed: AtomicU64::new(0),
    };
    let _ = std::fs::remove_dir_all(into);
    let target = Maildir::new(into);
    target.create().expect("a maildir");
    let (reader, mut writer) = std::io::pipe().expect("a pipe");
    let t = Instant::now();
    let parser = std::thread::spawn(move || read_outbox(reader, &target, PASS_MAX));
    let copied = e.copy_out(container, "/o/new", &mut writer);
    drop(writer);
    let read = parser.join().expect("the reader").expect("a read");
    (
        e.crossed.load(Ordering::Relaxed),
        t.elapsed(),
        read.end,
        copied,
    )
}

#[test]
fn a_tar_copy_out_crosses_no_more_than_its_reader_reads() {
    let docker_engine = engine::connect_docker(None).expect("the local engine");
    let name = format!("lw-tarout-{}", std::process::id());
    let _removed = Removed(name.clone());
    let spec = ContainerSpec {
        name: Some(name.clone()),
        image: sandbox_support::debian().to_string(),
        cmd: ["sleep", "infinity"].map(String::from).to_vec(),
        ..Default::default()
    };
    let id = docker_engine.create(&spec).expect("a container");
    docker_engine.start(&id).expect("it starts");
    let sh = |script: &str| {
        let mut out = Vec::new();
        let req = ExecRequest {
            cmd: ["sh", "-c", script].map(String::from).to_vec(),
            ..Default::default()
        };
        let code = docker_engine
            .exec(&id, &req, &mut |s, b| {
                if s == OutStream::Stdout {
                    out.extend_from_slice(b)
                }
            })
            .expect("an exec");
        assert_eq!(code, 0, "{script}");
        String::from_utf8_lossy(&out).into_owned()
    };
    let plant = |from: usize, to: usize| {
        sh(&format!(
            "mkdir -p /o/new && for i in $(seq {from} {to}); do truncate -s 2G /o/new/$(printf '1800000000.%09d.%032x' $i $i); done"
        ))
    };
    let tars = || {
        sh(
            "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' 2>/dev/null <$p/cmdline); case $c in 'tar '*) echo \"$c\";; esac; done",
        )
    };
    let into = std::env::temp_dir().join(format!("lw-tarout-{}", std::process::id()));
    // The contract as it was, on one sparse 2 GiB file: read to its end.
    plant(1, 1);
    let (old_bytes, old_took, old_end, _) = tar_pass(&id, true, &into);
    // As it is, on five (the 10 GiB).
    plant(2, 5);
    let (bytes, took, end, copied) = tar_pass(&id, false, &into);
    let left = tars();
    let _ = std::fs::remove_dir_all(&into);
    println!(
        "tar copy_out: stop not honoured (the old contract), 1 sparse 2 GiB file: {old_bytes} bytes crossed in {old_took:?}; \
         honoured, 5 such files: {bytes} bytes in {took:?}"
    );
    assert_eq!(
        (old_end, end),
        (End::Over, End::Over),
        "both reads end at a 2 GiB header"
    );
    assert!(
        old_bytes > 2 << 30,
        "the old contract read the file whole: {old_bytes} bytes"
    );
    let bound = PASS_MAX + HEADERS;
    assert!(
        bytes <= bound,
        "{bytes} bytes crossed, the reader's bound is {bound}"
    );
    assert!(left.is_empty(), "tar still runs in the container: {left}");
    let e = copied.expect_err("a copy its reader cut short fails");
    assert_eq!(e.exit, Exit::IoErr, "{e}");
}
