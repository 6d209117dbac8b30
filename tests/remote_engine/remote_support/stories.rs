//! The stories of engine B beyond the basic flow (tests/remote_engine/remote_support):
//! the root's courier as create starts it, `--port` on B, B down and wiped,
//! and one root with a sandbox on each engine.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use super::waiter::{Waiter, ack_all};
use super::{EngineB, Target, id_time, post, text};
use crate::sandbox_support::Fixture;

/// The pid of the root's courier, from ROOT/state/courier.pid.
pub(super) fn courier_pid(fx: &Fixture) -> u32 {
    let p = fx.root.join("state/courier.pid");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .parse()
        .unwrap()
}

/// Waits (up to 60 s) until no courier holds the root's lock: the courier
/// left by itself.  Its pid file goes first.
pub(super) fn courier_gone(fx: &Fixture) {
    let lock = fx.root.join("state/courier.lock");
    let (tx, rx) = mpsc::channel();
    let l = lock.clone();
    std::thread::spawn(move || {
        let _ = tx.send(base::fs::lock(&l).map(drop));
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| {
            panic!(
                "the root's courier still holds {} after 60 s",
                lock.display()
            )
        })
        .unwrap();
    assert!(
        !fx.root.join("state/courier.pid").exists(),
        "the courier's pid file went with it"
    );
}

/// kill -9 of the courier that create started, with b waiting and a
/// posting meanwhile: `courier --ensure` starts another (a new pid) and the
/// message reaches b.  Returns the line of what happened.
pub(super) fn kill_auto_courier(fx: &Fixture, tb: &Target, policy: &Path) -> String {
    let started = tb.ok(fx, &["courier", "--ensure"]);
    let pid: u32 = started
        .trim()
        .strip_prefix("started ")
        .unwrap_or_else(|| panic!("--ensure starts one when none runs: {started:?}"))
        .parse()
        .unwrap();
    assert_eq!(courier_pid(fx), pid);
    ack_all(fx, tb, "b");
    let mut med = tb.mediator(policy);
    let w = Waiter::start(fx, tb, "b");
    let k = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(k.success(), "kill -9 {pid}");
    let id = post(fx, tb, "a", "b", "while no courier runs");
    let again = tb.ok(fx, &["courier", "--ensure"]);
    let pid2: u32 = again
        .trim()
        .strip_prefix("started ")
        .unwrap_or_else(|| panic!("--ensure restarts a killed courier: {again:?}"))
        .parse()
        .unwrap();
    assert_ne!(pid, pid2, "a new courier");
    let (_, at) = w.listed(&id);
    let _ = med.kill();
    let _ = med.wait();
    tb.ok(fx, &["exec", "b", "--", "lw-inbox", "ack", &id]);
    let took = at.duration_since(id_time(&id)).unwrap_or_default();
    format!(
        "kill -9 of the auto-started courier {pid}: --ensure started {pid2}, the message posted meanwhile listed in b {:.0} ms after its post",
        took.as_secs_f64() * 1e3
    )
}

/// Engine B down, then back with its state wiped: while it is down `ls`,
/// `gc` and `rm` exit 69 naming it and nothing is reclaimed; once it
/// answers without the containers, `ls` says `lost`, the root still holds
/// their mail, and `gc` archives it.
pub(super) fn engine_lost(
    fx: &Fixture,
    tb: &Target,
    policy: &Path,
    image: &str,
    b: &EngineB,
) -> String {
    let (host, _) = tb.host.clone().unwrap();
    for n in ["v", "w"] {
        tb.ok(fx, &["create", n, "--branch", n, "--image", image]);
    }
    // A message for w, in the root's inbox of w (the courier carries a copy
    // into w's volume; the root's stays until w acks it).
    let id = post(fx, tb, "v", "w", "before the wipe");
    let w_new = fx.root.join("sandboxes/w/inbox/new");
    let watch = base::fs::Watcher::new().unwrap();
    watch.add(&w_new).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !w_new.join(&id).exists() {
        assert!(Instant::now() < deadline, "{id} not delivered in 60 s");
        tb.mediate_once(policy);
        let _ = watch.wait(Some(Duration::from_millis(200)));
    }
    (b.stop)();
    for args in [&["ls"][..], &["gc"], &["rm", "--force", "w"]] {
        let o = tb.sb(fx, args);
        assert_eq!(
            o.status.code(),
            Some(69),
            "{args:?} with B down: {}",
            text(&o)
        );
        assert!(
            text(&o).contains(&host) && text(&o).contains("DOCKER_HOST"),
            "{args:?} names the engine and the fix: {}",
            text(&o)
        );
        assert!(!text(&o).contains("lost"), "{args:?}: {}", text(&o));
    }
    for n in ["v", "w"] {
        assert!(
            fx.root.join(format!("state/sandbox/{n}.json")).exists(),
            "{n}'s record stays while B is down"
        );
    }
    // The courier, passing every 200 ms meanwhile, logged B's absence once
    // per sandbox, not once per pass.
    let log = std::fs::read_to_string(fx.root.join("state/courier.log")).unwrap_or_default();
    let down = log
        .lines()
        .filter(|l| l.contains("warning: sandbox 'w'") && l.contains("cannot reach"))
        .count();
    assert!(
        (1..=2).contains(&down),
        "B down is logged once for w, not every pass: {down} lines"
    );
    (b.start_wiped)();
    let ls = tb.ok(fx, &["ls"]);
    for n in ["v", "w"] {
        assert!(
            ls.lines()
                .any(|l| l.starts_with(&format!("{n}\t{n}\tlost\t"))),
            "{n} is lost on the wiped B: {ls}"
        );
    }
    assert!(w_new.join(&id).exists(), "{id} is still in the root");
    let gc = tb.ok(fx, &["gc"]);
    assert!(
        gc.contains("archived mailbox") && gc.contains("record w"),
        "{gc}"
    );
    let archived = std::fs::read_dir(fx.root.join("archive"))
        .unwrap()
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().starts_with("w."))
        .any(|d| walk_has(&d.path(), &id));
    assert!(archived, "{id} is in w's archive: {gc}");
    courier_gone(fx);
    format!("B down: ls/gc/rm 69 naming {host}; B wiped: v, w lost, {id} archived by gc")
}

fn walk_has(dir: &Path, name: &str) -> bool {
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.flatten().any(|e| {
            e.file_name().to_string_lossy() == name
                || (e.file_type().is_ok_and(|t| t.is_dir()) && walk_has(&e.path(), name))
        })
    })
}

/// The port `name` publishes for 8080/tcp, from `ls`: (address, port).
fn published(fx: &Fixture, t: &Target, name: &str) -> (String, u16) {
    let ls = t.ok(fx, &["ls"]);
    let line = ls
        .lines()
        .find(|l| l.starts_with(&format!("{name}\t")))
        .unwrap_or_else(|| panic!("{name} in ls: {ls}"));
    let col = line.split('\t').nth(3).unwrap();
    let (addr, _) = col
        .split_once("->8080/tcp")
        .unwrap_or_else(|| panic!("{name} publishes 8080: {line}"));
    let (ip, port) = addr.rsplit_once(':').unwrap();
    (ip.to_string(), port.parse().unwrap())
}

/// `--port` on B: leased against what B's containers publish (a second
/// root, whose own leases are empty, does not take the first's port), bound
/// on B's host and reached there from this one; a port something else
/// holds on B is refused by B at start: 75 naming the port and the engine,
/// nothing left.
pub(super) fn ports_on_b(fx: &Fixture, tb: &Target, image: &str, b: &EngineB) -> String {
    let (host, _) = tb.host.clone().unwrap();
    let mk = |t: &Target, n: &str| {
        t.sb(
            fx,
            &[
                "create",
                n,
                "--branch",
                n,
                "--image",
                image,
                "--network",
                "bridge",
                "--port",
                "8080",
            ],
        )
    };
    let o = mk(tb, "p");
    assert!(o.status.success(), "--port on B: {}", text(&o));
    let (ip, port) = published(fx, tb, "p");
    assert!(
        host.contains(&format!("//{ip}:")),
        "p's port is on B's host {host}: {ip}"
    );
    // A listener in p, reached from this host at B's address.
    let mut listener = tb
        .env(&mut fx.cmd(&[
            "exec",
            "p",
            "--",
            "perl",
            "-MIO::Socket::INET",
            "-e",
            "$|=1; my $s = IO::Socket::INET->new(LocalPort => 8080, Listen => 1, ReuseAddr => 1) or die $!; \
             print qq(listening\n); my $c = $s->accept; print $c qq(hello from p\n); close $c;",
        ]))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lout = BufReader::new(listener.stdout.take().unwrap());
    let mut l = String::new();
    lout.read_line(&mut l).unwrap();
    assert_eq!(l.trim(), "listening");
    let mut conn = std::net::TcpStream::connect((ip.as_str(), port)).expect("p's port on B");
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut got = String::new();
    std::io::Read::read_to_string(&mut conn, &mut got).unwrap();
    assert_eq!(got, "hello from p\n", "through {ip}:{port}");
    assert!(listener.wait().unwrap().success());

    // A second root on B: its leases are empty, B's view is not.  The next
    // port is held on B by a container that is not loopwright's.
    let t2 = Target {
        host: tb.host.clone(),
        root: fx.dir.join("root-b2"),
    };
    std::fs::create_dir_all(&t2.root).unwrap();
    let next = port + 1;
    let occupier = format!("lw-test-occupier-{}", crate::sandbox_support::nonce());
    let run = (b.docker)(&[
        "run",
        "-d",
        "--name",
        &occupier,
        "-p",
        &format!("{next}:9"),
        "--entrypoint",
        "sleep",
        image,
        "600",
    ]);
    assert!(run.status.success(), "occupier on B: {}", text(&run));
    let o = mk(&t2, "q");
    assert_eq!(o.status.code(), Some(75), "a port held on B: {}", text(&o));
    assert!(
        text(&o).contains(&next.to_string()) && text(&o).contains(&host),
        "the refusal names port {next} and {host}: {}",
        text(&o)
    );
    assert_eq!(t2.ok(fx, &["ls", "--no-header"]), "", "nothing left of q");
    let leases = std::fs::read_to_string(t2.root.join("state/ports")).unwrap_or_default();
    assert!(
        leases.lines().all(|l| l.starts_with('#')),
        "q's lease is released: {leases}"
    );
    let _ = (b.docker)(&["rm", "-f", &occupier]);
    let o = mk(&t2, "q");
    assert!(o.status.success(), "q once the port is free: {}", text(&o));
    let (_, q_port) = published(fx, &t2, "q");
    assert_ne!(q_port, port, "q does not take p's port on B");
    t2.ok(fx, &["rm", "--force", "q"]);
    tb.ok(fx, &["rm", "--force", "p"]);
    format!(
        "--port on B: p at {ip}:{port} reached from here; q (another root) refused 75 on {next} held on B, then got {q_port}"
    )
}

/// One root, one mediator, a sandbox on each engine: l on the local engine
/// (bind mounts), b on B (volume mode, the courier create started).  l asks
/// b, b answers l; `ls` through each engine shows its own sandboxes and the
/// other's as `elsewhere`.
pub(super) fn two_engines(
    fx: &Fixture,
    tb: &Target,
    here: &Target,
    policy: &Path,
    image: &str,
) -> String {
    here.ok(fx, &["create", "l", "--branch", "l", "--image", image]);
    let mut med = tb.mediator(policy);
    let w = Waiter::start(fx, tb, "b");
    let ask = post(fx, here, "l", "b", "from the local engine to B");
    let (line, at_b) = w.listed(&ask);
    assert!(line.contains("\tl\t"), "from l: {line:?}");
    tb.ok(fx, &["exec", "b", "--", "lw-inbox", "ack", &ask]);
    let w = Waiter::start(fx, here, "l");
    let answer = post(fx, tb, "b", "l", "from B to the local engine");
    let (line, at_l) = w.listed(&answer);
    assert!(line.contains("\tb\t"), "from b: {line:?}");
    here.ok(fx, &["exec", "l", "--", "lw-inbox", "ack", &answer]);
    let state = |t: &Target, n: &str| {
        let ls = t.ok(fx, &["ls"]);
        ls.lines()
            .find(|l| l.starts_with(&format!("{n}\t")))
            .and_then(|l| l.split('\t').nth(2))
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(state(here, "l"), "running");
    assert_eq!(state(here, "b"), "elsewhere");
    assert_eq!(state(tb, "b"), "running");
    assert_eq!(state(tb, "l"), "elsewhere");
    let _ = med.kill();
    let _ = med.wait();
    here.ok(fx, &["rm", "--force", "l"]);
    let ms = |at: SystemTime, id: &str| {
        at.duration_since(id_time(id))
            .unwrap_or_default()
            .as_millis()
    };
    format!(
        "one root, a sandbox on each engine: local->B {} ms, B->local {} ms",
        ms(at_b, &ask),
        ms(at_l, &answer)
    )
}
