//! Sandboxes on engine B (volume mode), beside the same on the local engine:
//! create (which starts the root's courier), exec, post -> deliver through
//! the mediator and that courier, a waiting lw-inbox woken by the delivery,
//! push, rm (the courier leaves with the last); `--port` leased against B's
//! view and reached on B's address; one root with a sandbox on each engine
//! (`elsewhere` through the other); the figures (create time, post->deliver
//! latency, 1,000 messages); kill -9 of the courier while it carries, and of
//! the auto-started one (`courier --ensure` restarts it); B down (69) and
//! back wiped (`lost`, mail archived by gc).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::sandbox_support::{Fixture, bin, git};
use crate::seeded;

mod stories;
mod waiter;
use stories::{courier_gone, courier_pid, engine_lost, kill_auto_courier, ports_on_b, two_engines};
use waiter::Waiter;

/// Where a command runs: engine B (address and certificates) or local.
#[derive(Clone)]
pub(crate) struct Target {
    pub host: Option<(String, PathBuf)>,
    pub root: PathBuf,
}

impl Target {
    fn env<'c>(&self, c: &'c mut Command) -> &'c mut Command {
        c.env("LW_ROOT", &self.root);
        match &self.host {
            Some((h, certs)) => c
                .env("DOCKER_HOST", h)
                .env("DOCKER_TLS_VERIFY", "1")
                .env("DOCKER_CERT_PATH", certs),
            None => c
                .env_remove("DOCKER_HOST")
                .env_remove("DOCKER_TLS_VERIFY")
                .env_remove("DOCKER_CERT_PATH"),
        }
    }
    fn sb(&self, fx: &Fixture, args: &[&str]) -> Output {
        self.env(&mut fx.cmd(args))
            .output()
            .expect("lw-sandbox runs")
    }
    fn ok(&self, fx: &Fixture, args: &[&str]) -> String {
        let o = self.sb(fx, args);
        assert!(
            o.status.success(),
            "lw-sandbox {args:?} ({}) exited {:?}: {}",
            self.name(),
            o.status.code(),
            text(&o)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
    fn name(&self) -> &str {
        if self.host.is_some() { "B" } else { "local" }
    }
    // The stories post over a thousand messages from one sandbox within
    // the hour: more than the default log budget (door.log-max) allows.
    fn mediator(&self, policy: &Path) -> Child {
        Command::new(bin("lw-mediate"))
            .arg("--root")
            .arg(&self.root)
            .arg("--policy")
            .arg(policy)
            .args(["--log-max", "64m"])
            .stdout(Stdio::null())
            .spawn()
            .expect("lw-mediate runs")
    }
    fn mediate_once(&self, policy: &Path) {
        let o = Command::new(bin("lw-mediate"))
            .arg("--root")
            .arg(&self.root)
            .arg("--policy")
            .arg(policy)
            .args(["--log-max", "64m", "--once"])
            .output()
            .expect("lw-mediate runs");
        assert!(o.status.success(), "lw-mediate --once: {}", text(&o));
    }
}

use crate::courier_support::Courier;
pub(crate) use crate::courier_support::id_time;
use support::common::output as text;

/// `lw-sandbox courier --interval MS` for `t`.
fn start_courier(fx: &Fixture, t: &Target, interval_ms: u32) -> Courier {
    Courier::spawn(t.env(&mut fx.cmd(&["courier", "--interval", &interval_ms.to_string()])))
}

fn post(fx: &Fixture, t: &Target, from: &str, to: &str, subject: &str) -> String {
    let out = t.ok(
        fx,
        &[
            "exec",
            from,
            "--",
            "lw-post",
            "--to",
            to,
            "--kind",
            "request",
            "--subject",
            subject,
            "body",
        ],
    );
    out.trim().to_string()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Post from a -> listed by a `lw-inbox --wait` waiting in b, `n` times
/// (each acked inside b after): the median.  On B the mail moves through
/// the courier that `create` started; locally through the mediator alone.
fn latency(fx: &Fixture, t: &Target, n: usize) -> Duration {
    median(
        (0..n)
            .map(|i| {
                let w = Waiter::start(fx, t, "b");
                let id = post(fx, t, "a", "b", &format!("latency {i}"));
                let (_, at) = w.listed(&id);
                t.ok(fx, &["exec", "b", "--", "lw-inbox", "ack", &id]);
                at.duration_since(id_time(&id)).unwrap_or_default()
            })
            .collect(),
    )
}

/// 1,000 messages posted by one loop in `a` to `b`: from the loop's start
/// to the last one delivered.
fn throughput(fx: &Fixture, t: &Target, courier: Option<&Courier>, to_box: &Path) -> Duration {
    let before = std::fs::read_dir(to_box).map_or(0, |r| r.count());
    let w = base::fs::Watcher::new().unwrap();
    w.add(to_box).unwrap();
    let start = SystemTime::now();
    let poster = t
        .env(&mut fx.cmd(&[
            "exec",
            "a",
            "--",
            "sh",
            "-c",
            "for i in $(seq 1000); do lw-post --to b --kind status --subject \"flood $i\" x >/dev/null || exit 1; done",
        ]))
        .spawn()
        .unwrap();
    let end = match courier {
        Some(c) => c.until_in(1000, Duration::from_secs(600)),
        None => loop {
            if std::fs::read_dir(to_box).map_or(0, |r| r.count()) >= before + 1000 {
                break SystemTime::now();
            }
            w.wait(Some(Duration::from_secs(60))).unwrap();
        },
    };
    let o = poster.wait_with_output().unwrap();
    assert!(o.status.success(), "the flood's poster: {}", text(&o));
    end.duration_since(start).unwrap()
}

/// Names in a directory of sandbox `name` on the target.
fn ls_in(fx: &Fixture, t: &Target, name: &str, dir: &str) -> Vec<String> {
    t.ok(fx, &["exec", name, "--", "ls", "-1", dir])
        .lines()
        .map(str::to_string)
        .collect()
}

pub(crate) struct Figures {
    /// The first sandbox of a root on the engine (B copies the tools once).
    pub create: (Duration, Duration),
    /// The second.
    pub create2: (Duration, Duration),
    pub latency: (Duration, Duration),
    pub thousand: (Duration, Duration),
    pub crash: String,
}

/// The whole story on B beside the same locally.
/// What the test can do to engine B from outside.
pub(crate) struct EngineB<'a> {
    /// The docker CLI against B.
    pub docker: &'a dyn Fn(&[&str]) -> Output,
    /// B's dockerd stopped and started with its state.
    pub restart: &'a dyn Fn(),
    /// B's dockerd stopped.
    pub stop: &'a dyn Fn(),
    /// B's dockerd started on a fresh data root: its state wiped.
    pub start_wiped: &'a dyn Fn(),
    /// How many API requests B's dockerd has served (its debug log).
    pub requests: &'a dyn Fn() -> usize,
}

pub(crate) fn volume_mode(
    fx: &Fixture,
    host: &str,
    certs: &Path,
    image: &str,
    b: &EngineB,
) -> Figures {
    let policy = fx.dir.join("policy");
    std::fs::write(&policy, "loopwright-policy 1\nrate off\nduplicates off\n").unwrap();
    let tb = Target {
        host: Some((host.to_string(), certs.to_path_buf())),
        root: fx.root.clone(),
    };
    let tl = Target {
        host: None,
        root: fx.dir.join("root-local"),
    };
    std::fs::create_dir_all(&tl.root).unwrap();

    let ports = ports_on_b(fx, &tb, image, b);

    // create: B (volume mode) and local, same run.
    let create = |t: &Target, name: &str| {
        let s = Instant::now();
        t.ok(fx, &["create", name, "--branch", name, "--image", image]);
        s.elapsed()
    };
    let create_b = create(&tb, "a");
    let create_b2 = create(&tb, "b");
    let create_l = create(&tl, "a");
    let create_l2 = create(&tl, "b");
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fx.root.join("state/sandbox/a.json")).unwrap())
            .unwrap();
    assert_eq!(rec["volume_mode"], true, "a on B is in volume mode: {rec}");
    let vols = String::from_utf8_lossy(
        &(b.docker)(&[
            "volume",
            "ls",
            "-q",
            "--filter",
            "label=org.loopwright.sandbox=a",
        ])
        .stdout,
    )
    .into_owned();
    assert!(
        vols.contains("-a-work") && vols.contains("-a-mail"),
        "a's workspace and mail dir are volumes on B: {vols}"
    );

    // The same root through the local engine: a and b are B's, neither
    // lost nor collected there.
    let here = Target {
        host: None,
        root: fx.root.clone(),
    };
    let ls = here.ok(fx, &["ls"]);
    for n in ["a", "b"] {
        assert!(
            ls.lines()
                .any(|l| l.starts_with(&format!("{n}\t{n}\telsewhere\t"))),
            "{n} is elsewhere for the local engine: {ls}"
        );
    }
    let gc = here.ok(fx, &["gc"]);
    assert!(
        !gc.contains("record"),
        "a local gc leaves B's sandboxes: {gc}"
    );
    let o = here.sb(fx, &["exec", "a", "--", "true"]);
    assert_eq!(
        o.status.code(),
        Some(69),
        "exec through another engine: {}",
        text(&o)
    );
    assert!(text(&o).contains(host), "it names B: {}", text(&o));

    let story = two_engines(fx, &tb, &here, &policy, image);
    let idle = idle_requests(fx, b);

    // exec: the clone on its branch, from the bundle, as the sandbox's user.
    let o = tb.ok(
        fx,
        &[
            "exec",
            "a",
            "--",
            "sh",
            "-c",
            "id -u; git rev-parse --abbrev-ref HEAD; git rev-parse HEAD; command -v lw-post",
        ],
    );
    let l: Vec<&str> = o.lines().collect();
    assert_eq!(l[0], "100000", "exec on B: {o}");
    assert_eq!(l[1], "a", "the clone is on branch a: {o}");
    assert_eq!(
        l[2],
        git(&fx.proj, &["rev-parse", "HEAD"]),
        "it starts at the upstream's HEAD: {o}"
    );
    assert_eq!(l[3], "/lw/bin/lw-post", "the tools are on PATH: {o}");

    // create started the root's courier, detached, once: its pid is in
    // ROOT/state/courier.pid and `courier --ensure` finds it running.
    let pid = courier_pid(fx);
    assert_eq!(
        tb.ok(fx, &["courier", "--ensure"]).trim(),
        format!("running {pid}"),
        "one courier for the root, started by create"
    );

    // post -> the mediator on this host -> b's inbox on B, by that courier
    // (none started by hand); a waiting lw-inbox in b wakes on the delivery.
    let mut med_b = tb.mediator(&policy);
    let w = Waiter::start(fx, &tb, "b");
    let id = post(fx, &tb, "a", "b", "hello from a on B");
    let (listed, _) = w.listed(&id);
    assert!(
        listed.contains("hello from a on B") && listed.contains("\ta\t"),
        "b's waiting lw-inbox lists a's message, from a: {listed:?}"
    );
    // Acked inside b: the host's copy is claimed, the mediator logs the read.
    tb.ok(fx, &["exec", "b", "--", "lw-inbox", "ack", &id]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let read_entry = format!("{id}.read.b");
    let log = mailbox::log::Log::new(fx.root.join("log"));
    let w = base::fs::Watcher::new().unwrap();
    w.add(&fx.root.join("log/new")).unwrap();
    while !log.has(&read_entry) {
        assert!(
            Instant::now() < deadline,
            "no read receipt for {id} in 30 s"
        );
        w.wait(Some(Duration::from_secs(1))).unwrap();
    }

    // Figures, B then local: post->deliver through the auto-started courier.
    let lat_b = latency(fx, &tb, 7);
    let mut med_l = tl.mediator(&policy);
    let lat_l = latency(fx, &tl, 7);
    // The flood counts the courier's lines: the root's courier is stopped
    // and one run by hand in its place.
    assert_eq!(
        tb.ok(fx, &["courier", "--stop"]).trim(),
        format!("stopped {pid}")
    );
    let courier = start_courier(fx, &tb, 100);
    let thousand_b = throughput(
        fx,
        &tb,
        Some(&courier),
        &fx.root.join("sandboxes/b/inbox/new"),
    );
    let thousand_l = throughput(fx, &tl, None, &tl.root.join("sandboxes/b/inbox/new"));
    let _ = med_l.kill();
    let _ = med_l.wait();
    courier.kill();
    let _ = med_b.kill();
    let _ = med_b.wait();

    let crash = crash_courier(fx, &tb, &policy);

    // Engine B restarted with mail in the volumes: the sandboxes are listed
    // as stopped, start again, and the mail moves on, none lost.
    let waiting: Vec<String> = (0..3)
        .map(|i| post(fx, &tb, "a", "b", &format!("across a restart {i}")))
        .collect();
    (b.restart)();
    let ls = tb.ok(fx, &["ls"]);
    for n in ["a", "b"] {
        let l = ls
            .lines()
            .find(|l| l.starts_with(&format!("{n}\t")))
            .unwrap();
        assert_eq!(
            l.split('\t').nth(2),
            Some("exited"),
            "{n} after B's restart: {ls}"
        );
    }
    tb.ok(fx, &["start", "a", "b"]);
    tb.ok(fx, &["courier", "--once"]);
    tb.mediate_once(&policy);
    tb.ok(fx, &["courier", "--once"]);
    let inbox = ls_in(fx, &tb, "b", "/lw/mailbox/inbox/new");
    for id in &waiting {
        assert!(inbox.contains(id), "{id} reached b across B's restart");
    }

    // push: the branch leaves through exec (git's ext:: transport), as locally.
    tb.ok(
        fx,
        &[
            "exec",
            "a",
            "--",
            "sh",
            "-c",
            "echo remote > remote.txt && git add remote.txt && git commit -qm 'from B'",
        ],
    );
    let pushed = tb.ok(fx, &["push", "a"]);
    let tip = tb.ok(fx, &["exec", "a", "--", "git", "rev-parse", "HEAD"]);
    assert!(
        pushed.starts_with(&format!("a {} new", tip.trim())),
        "push from B: {pushed}"
    );
    assert_eq!(
        git(&fx.upstream, &["rev-parse", "refs/heads/a"]),
        tip.trim(),
        "the upstream has a's commit"
    );
    let ls = tb.ok(fx, &["ls"]);
    let a_line = ls.lines().find(|l| l.starts_with("a\t")).unwrap();
    assert_eq!(
        a_line.split('\t').nth(6),
        Some("0"),
        "nothing unpushed after the push: {ls}"
    );

    let auto_kill = kill_auto_courier(fx, &tb, &policy);

    // rm: everything of theirs on B goes (the shared tools volume stays, for gc),
    // and the root's courier leaves by itself with the last of them.
    tb.ok(fx, &["rm", "a"]);
    tb.ok(fx, &["rm", "--force", "b"]);
    courier_gone(fx);
    let label = format!("label=org.loopwright.root={}", fx.root_id());
    let left = String::from_utf8_lossy(&(b.docker)(&["ps", "-aq", "--filter", &label]).stdout)
        .into_owned();
    assert!(left.trim().is_empty(), "containers left on B: {left}");
    let vols =
        String::from_utf8_lossy(&(b.docker)(&["volume", "ls", "-q", "--filter", &label]).stdout)
            .into_owned();
    assert!(
        vols.lines().all(|v| v.contains("-tools-")) && vols.lines().count() >= 1,
        "volumes left on B: {vols}"
    );
    // gc: the root's tools volume goes once no sandbox of it is left on B
    // (the local engine's a and b use nothing of B's): nothing labelled
    // with the root remains there.
    let gc = tb.ok(fx, &["gc"]);
    assert!(gc.contains("-tools-"), "gc said: {gc}");
    let after = |what: &[&str]| {
        let mut args = what.to_vec();
        args.extend(["-q", "--filter", &label]);
        String::from_utf8_lossy(&(b.docker)(&args).stdout).into_owned()
    };
    for what in [&["ps", "-a"][..], &["volume", "ls"], &["network", "ls"]] {
        let left = after(what);
        assert!(left.trim().is_empty(), "{what:?} after gc on B: {left}");
    }
    tl.ok(fx, &["rm", "--force", "a", "b"]);

    let lost = engine_lost(fx, &tb, &policy, image, b);

    Figures {
        create: (create_b, create_l),
        create2: (create_b2, create_l2),
        latency: (lat_b, lat_l),
        thousand: (thousand_b, thousand_l),
        crash: format!("{crash}; {auto_kill}; {lost}; {ports}; {story}; {idle}"),
    }
}

/// kill -9 of the courier while it carries, out then in: every message
/// reaches b once.  Returns the line of counts.
/// The requests B serves while the root's two sandboxes there sit idle,
/// their rings live (mailbox-spec.md, REMOTE ENGINES): at most 0.1 a
/// second per sandbox, counted by B itself.
fn idle_requests(fx: &Fixture, b: &EngineB) -> String {
    let log = || std::fs::read_to_string(fx.root.join("state/courier.log")).unwrap_or_default();
    let live = || {
        log()
            .lines()
            .rev()
            .find(|l| l.contains(" rings "))
            .is_some_and(|l| l.ends_with("rings 2 of 2 live"))
    };
    let t = Instant::now();
    // The courier's log is another process's file: looked at each 100 ms.
    while !live() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the courier's rings are not live in 60 s:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let r0 = (b.requests)();
    let t = Instant::now();
    // The window is the measurement: nothing to wait for but time.
    std::thread::sleep(Duration::from_secs(10));
    let r1 = (b.requests)();
    let per = (r1 - r0) as f64 / t.elapsed().as_secs_f64() / 2.0;
    let line = format!(
        "idle with live rings: {} requests to B in {:.1} s, {per:.3}/s per sandbox (goal <= 0.1)",
        r1 - r0,
        t.elapsed().as_secs_f64()
    );
    eprintln!("{line}");
    assert!(per <= 0.1, "{line}\n{}", log());
    line
}

fn crash_courier(fx: &Fixture, tb: &Target, policy: &Path) -> String {
    let seed = seeded::seed();
    const N: usize = 200;
    let ids: Vec<String> = tb
        .ok(
            fx,
            &[
                "exec",
                "a",
                "--",
                "sh",
                "-c",
                &format!("for i in $(seq {N}); do lw-post --to b --kind request --subject \"crash $i\" x || exit 1; done"),
            ],
        )
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(ids.len(), N);
    let mut kills = Vec::new();
    let rounds = |kills: &mut Vec<u64>| {
        for _ in 0..6 {
            let c = start_courier(fx, tb, 50);
            let ms = seeded::below(700);
            std::thread::sleep(Duration::from_millis(ms));
            kills.push(ms);
            // SIGKILL: no chance to finish what it was carrying.
            c.kill();
        }
    };
    rounds(&mut kills);
    tb.ok(fx, &["courier", "--once"]);
    tb.mediate_once(policy);
    rounds(&mut kills);
    tb.ok(fx, &["courier", "--once"]);

    let want: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let inbox = ls_in(fx, tb, "b", "/lw/mailbox/inbox/new");
    let got: Vec<&str> = inbox
        .iter()
        .map(String::as_str)
        .filter(|n| want.contains(n))
        .collect();
    let got_set: BTreeSet<&str> = got.iter().copied().collect();
    let lost = want.difference(&got_set).count();
    let mut per_id: BTreeMap<&str, usize> = BTreeMap::new();
    for g in &got {
        *per_id.entry(g).or_default() += 1;
    }
    // A copy carried twice after the mediator claimed the first would be
    // quarantined as a repeat: none may be.
    let quarantined = std::fs::read_dir(fx.root.join("quarantine/new")).map_or(0, |r| r.count());
    let log = mailbox::log::Log::new(fx.root.join("log"));
    let forwards = ids
        .iter()
        .filter(|id| log.has(&format!("{id}.forward")))
        .count();
    let duplicated = per_id.values().filter(|n| **n > 1).count() + quarantined;
    let line = format!(
        "kill -9 of the courier: seed {seed}, {} kills at {kills:?} ms, posted {N}, delivered {}, forwarded {forwards}, lost {lost}, duplicated {duplicated}",
        kills.len(),
        got_set.len()
    );
    eprintln!("{line}");
    assert_eq!((lost, duplicated, forwards), (0, 0, N), "{line}");
    line
}
