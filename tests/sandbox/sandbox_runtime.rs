//! Isolation levels: the same sandbox under runc (the host's kernel) and
//! under gVisor's runsc (a user-space kernel), side by side in one run.
//! The door (lw-post, lw-inbox --wait, the mediator between the two),
//! exec, push and `ls`'s isolation column must work under both; the figures
//! (create, first exec, lw-post, a build-ish workload) are printed as two
//! columns.  The bad input of `--runtime` is checked against the real engine.
//!
//! Needs runsc registered with dockerd (`.ci/run` installs and registers it);
//! without it the runsc half fails saying so.

use support::sandbox as sandbox_support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_support::*;

/// True when dockerd has the runsc runtime.
fn runsc_registered() -> bool {
    text(&docker(&["info", "--format", "{{json .Runtimes}}"])).contains("\"runsc\"")
}

fn require_runsc() {
    assert!(
        runsc_registered(),
        "runsc (gVisor) is not registered with dockerd: {}",
        engine::runtime::RUNSC_INSTALL
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One figure per runtime.
struct Figures {
    create: Duration,
    first_exec: Duration,
    exec: Duration,
    post_ms: f64,
    tree_ms: f64,
    status_ms: f64,
    compile_ms: f64,
}

/// Milliseconds of a shell snippet, timed inside the sandbox (GNU date).
fn inside_ms(f: &Fixture, name: &str, script: &str) -> f64 {
    let (code, out, e) = f.sh(
        name,
        &format!(
            "set -e; a=$(date +%s%N); {script} >/dev/null 2>&1; b=$(date +%s%N); echo $(( (b - a) / 1000 ))"
        ),
    );
    assert_eq!(code, 0, "{script}: {e}");
    out.trim().parse::<f64>().expect("microseconds") / 1000.0
}

fn measure(f: &Fixture, name: &str, runtime: &str) -> Figures {
    let t = Instant::now();
    f.ok(&[
        "create",
        name,
        "--branch",
        &format!("lw/{name}"),
        "--runtime",
        runtime,
    ]);
    let create = t.elapsed();
    let t = Instant::now();
    let (code, _, e) = f.sh(name, "true");
    assert_eq!(code, 0, "{e}");
    let first_exec = t.elapsed();
    let t = Instant::now();
    for _ in 0..5 {
        assert_eq!(f.sh(name, "true").0, 0);
    }
    let exec = t.elapsed() / 5;
    Figures {
        create,
        first_exec,
        exec,
        post_ms: 0.0,
        tree_ms: 0.0,
        status_ms: 0.0,
        compile_ms: 0.0,
    }
}

/// The workload figures of sandbox `name`.
fn workload(f: &Fixture, name: &str, fig: &mut Figures) {
    let n = 20;
    let post_ms = inside_ms(
        f,
        name,
        &format!(
            "i=0; while [ $i -lt {n} ]; do lw-post --kind status --subject s$i body; i=$((i+1)); done"
        ),
    ) / n as f64;
    // A build-ish workload: a 5,000-file tree committed, git status on it
    // warm (best of 3), and a compile (perl -c of a 20,000-line program,
    // best of 3: the test image has no C compiler).
    let tree_ms = inside_ms(
        f,
        name,
        "mkdir -p big && cd big && i=0; while [ $i -lt 50 ]; do mkdir d$i; \
         seq 1 100 | sed \"s|.*|echo & > d$i/f&.txt|\" | sh; i=$((i+1)); done; \
         cd .. && git add -A big && git commit -qm tree",
    );
    let _ = inside_ms(f, name, "git status --porcelain");
    let status_ms = (0..3)
        .map(|_| inside_ms(f, name, "git status --porcelain"))
        .fold(f64::MAX, f64::min);
    let (code, _, e) = f.sh(
        name,
        "seq 1 20000 | sed 's/.*/sub f& { my $x = & * 2; return $x + 1 }/' > /tmp/prog.pl",
    );
    assert_eq!(code, 0, "{e}");
    fig.compile_ms = (0..3)
        .map(|_| inside_ms(f, name, "perl -c /tmp/prog.pl"))
        .fold(f64::MAX, f64::min);
    fig.post_ms = post_ms;
    fig.tree_ms = tree_ms;
    fig.status_ms = status_ms;
}

#[test]
fn runc_and_runsc_side_by_side_door_exec_push_and_figures() {
    require_runsc();
    let f = Fixture::new("rt");
    let mut a = measure(&f, "rc", "runc");
    let mut b = measure(&f, "gv", "runsc");

    // The engine runs each under what was asked, and ls says so.
    let rt = |n: &str| {
        text(&docker(&[
            "inspect",
            "-f",
            "{{.HostConfig.Runtime}}",
            &f.container(n),
        ]))
        .trim()
        .to_string()
    };
    assert_eq!(rt("rc"), "runc");
    assert_eq!(rt("gv"), "runsc");
    // gVisor's own kernel answers (its dmesg is out of reach: the seccomp
    // profile, applied by lw-confine, denies syslog as under runc).
    let (_, kernel, _) = f.sh("gv", "uname -r");
    let host = String::from_utf8_lossy(
        &Command::new("uname")
            .arg("-r")
            .output()
            .expect("uname runs")
            .stdout,
    )
    .trim()
    .to_string();
    assert!(
        kernel.trim() == "4.4.0" && kernel.trim() != host,
        "not gVisor's kernel: {kernel} (the host's: {host})"
    );
    let ls = f.ok(&["ls"]);
    let col = |n: &str| {
        ls.lines()
            .find(|l| l.starts_with(&format!("{n}\t")))
            .and_then(|l| l.split('\t').nth(7)) // isolation, before services
            .unwrap_or("?")
            .to_string()
    };
    assert_eq!(col("rc"), "container(runc)", "{ls}");
    assert_eq!(col("gv"), "gvisor(runsc)", "{ls}");
    let json = f.ok(&["ls", "--json"]);
    assert!(
        json.contains("\"isolation\":\"gvisor\"") && json.contains("\"runtime\":\"runsc\""),
        "{json}"
    );
    let rec = std::fs::read_to_string(f.root.join("state/sandbox/gv.json")).expect("record");
    assert!(rec.contains("\"runtime\": \"runsc\"") || rec.contains("\"runtime\":\"runsc\""));

    // exec: statuses and stdin pass through gVisor.
    let o = f.sb(&["exec", "gv", "--", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7));
    let mut c = f.cmd(&["exec", "gv", "--", "sh", "-c", "wc -c"]);
    c.stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = c.spawn().expect("lw-sandbox runs");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), b"12345").expect("write");
    let o = child.wait_with_output().expect("wait");
    assert_eq!(text(&o).trim(), "5");

    // The door, both ways: lw-inbox --wait under gVisor wakes for a message
    // the mediator (on the host) delivers, and a message posted under gVisor
    // (its filesystem refuses RENAME_NOREPLACE: the link+unlink path) reaches
    // the runc sandbox.
    let mut waiter = f
        .cmd(&[
            "exec",
            "gv",
            "--",
            "sh",
            "-c",
            "echo armed; lw-inbox --wait --timeout 60",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lw-sandbox runs");
    let mut out = std::io::BufReader::new(waiter.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).expect("read");
    assert_eq!(line.trim(), "armed");
    // Let lw-inbox set its watch after the echo: the message must arrive
    // while it waits, not before.
    std::thread::sleep(Duration::from_millis(500));
    let (code, id, e) = f.sh(
        "rc",
        "lw-post --to gv --kind request --subject 'from runc' hello",
    );
    assert_eq!(code, 0, "{e}");
    let sent = Instant::now();
    mediate(&f);
    let mut got = String::new();
    std::io::BufRead::read_line(&mut out, &mut got).expect("read");
    let wake = sent.elapsed();
    let o = waiter.wait_with_output().expect("wait");
    if !o.status.success() {
        let host: Vec<String> = std::fs::read_dir(f.root.join("sandboxes/gv/inbox/new"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        eprintln!(
            "host sees {host:?}; inside: {:?}; held: {:?}",
            f.sh("gv", "lw-inbox; ls -la /lw/mailbox/inbox/new"),
            std::fs::read_dir(f.root.join("held/new")).map(|d| d.count())
        );
    }
    assert!(
        o.status.success(),
        "lw-inbox --wait under gVisor failed ({:?}): {}",
        o.status.code(),
        err(&o)
    );
    assert!(
        got.starts_with(id.trim()) && got.contains("from runc"),
        "lw-inbox --wait under runsc printed {got:?}"
    );
    let (code, id2, e) = f.sh(
        "gv",
        "lw-post --to rc --kind handoff --subject 'from gvisor' hi",
    );
    assert_eq!(code, 0, "lw-post under gVisor: {e}");
    mediate(&f);
    let (code, list, e) = f.sh("rc", "lw-inbox");
    assert_eq!(code, 0, "{e}");
    assert!(
        list.lines()
            .any(|l| l.starts_with(id2.trim()) && l.contains("from gvisor")),
        "{list}"
    );

    // push from gVisor sends its branch upstream.
    let (code, _, e) = f.sh(
        "gv",
        "echo x > pushed.txt && git add pushed.txt && git commit -qm pushed",
    );
    assert_eq!(code, 0, "{e}");
    f.ok(&["push", "gv"]);
    assert_eq!(
        git(&f.upstream, &["log", "--format=%s", "-1", "lw/gv"]),
        "pushed"
    );

    workload(&f, "rc", &mut a);
    workload(&f, "gv", &mut b);

    println!("figures (one run, same host, same image; runc | runsc | runsc/runc):");
    let row = |what: &str, x: f64, y: f64| {
        println!("  {what:<34} {x:>10.1} | {y:>10.1} | {:>5.2}x", y / x);
    };
    row("create (ms)", ms(a.create), ms(b.create));
    row("first exec (ms)", ms(a.first_exec), ms(b.first_exec));
    row("exec, mean of 5 (ms)", ms(a.exec), ms(b.exec));
    row("lw-post, mean of 20 (ms)", a.post_ms, b.post_ms);
    row("5,000-file tree + commit (ms)", a.tree_ms, b.tree_ms);
    row(
        "git status on it, warm, best of 3",
        a.status_ms,
        b.status_ms,
    );
    row("perl -c 20,000 subs, best of 3", a.compile_ms, b.compile_ms);
    println!(
        "  lw-inbox --wait under runsc woke {:.0} ms after the post (mediator pass included)",
        ms(wake)
    );
    f.ok(&["rm", "--force", "rc", "gv"]);
}

/// One mediator pass over the fixture's root.
fn mediate(f: &Fixture) {
    let o = Command::new(bin("lw-mediate"))
        .arg("--once")
        .env("LW_ROOT", &f.root)
        .current_dir(&f.proj)
        .output()
        .expect("lw-mediate runs");
    assert!(o.status.success(), "lw-mediate: {}", err(&o));
}

#[test]
fn runtime_bad_input_is_refused_before_anything_is_made() {
    let f = Fixture::new("rtbad");
    // A runtime the engine does not offer: 64, naming the ones it does.
    let o = f.sb(&["create", "x", "--branch", "x", "--runtime", "nosuch"]);
    assert_eq!(o.status.code(), Some(64), "{}", err(&o));
    assert!(
        err(&o).contains("known runtimes: ") && err(&o).contains("runc"),
        "{}",
        err(&o)
    );
    // The same name from the configuration.
    std::fs::write(
        f.proj.join(".loopwright/config"),
        "sandbox.runtime = nosuch\n",
    )
    .expect("write");
    let o = f.sb(&["create", "x", "--branch", "x"]);
    assert_eq!(o.status.code(), Some(64), "{}", err(&o));
    std::fs::write(f.proj.join(".loopwright/config"), "sandbox.runtime = a b\n").expect("write");
    let o = f.sb(&["create", "x", "--branch", "x"]);
    assert_eq!(o.status.code(), Some(78), "{}", err(&o));
    std::fs::write(f.proj.join(".loopwright/config"), "").expect("write");
    if runsc_registered() {
        // runsc registered with --network=none: only --network none.
        for net in ["egress", "bridge"] {
            let o = f.sb(&[
                "create",
                "x",
                "--branch",
                "x",
                "--runtime",
                "runsc",
                "--network",
                net,
            ]);
            assert_eq!(o.status.code(), Some(64), "{net}: {}", err(&o));
            assert!(err(&o).contains("--network none"), "{}", err(&o));
        }
    }
    // An engine socket that is down: 69, naming it.
    let sock = f.dir.join("podman.sock");
    let o = f
        .cmd(&["ls"])
        .env("DOCKER_HOST", format!("unix://{}", sock.display()))
        .output()
        .expect("lw-sandbox runs");
    assert_eq!(o.status.code(), Some(69), "{}", err(&o));
    assert!(err(&o).contains(&sock.display().to_string()), "{}", err(&o));
    assert!(err(&o).contains("podman system service"), "{}", err(&o));
    assert!(f.leftovers().is_empty(), "{:?}", f.leftovers());
    assert_eq!(f.host_leftovers(), Vec::<String>::new());
}

/// How an exec ended, and when (the host's clock).
struct Ended {
    code: Option<i32>,
    stderr: String,
    at: std::time::SystemTime,
    took: Duration,
}

/// Waits for `child` (an `lw-sandbox exec`) at most `bound`: a hung exec
/// fails the test instead of hanging it.
fn ended_within(child: std::process::Child, bound: Duration) -> Ended {
    let pid = child.id();
    let t = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let o = child.wait_with_output();
        let _ = tx.send((o, std::time::SystemTime::now()));
    });
    match rx.recv_timeout(bound) {
        Ok((o, at)) => {
            let o = o.expect("lw-sandbox exec is waited for");
            Ended {
                code: o.status.code(),
                stderr: err(&o),
                at,
                took: t.elapsed(),
            }
        }
        Err(_) => {
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!("lw-sandbox exec still runs after {bound:?}: it hangs");
        }
    }
}

/// The container's end as the engine filed it: (ExitCode, OOMKilled,
/// FinishedAt).
fn finished(f: &Fixture, name: &str) -> (i64, bool, std::time::SystemTime) {
    let o = docker(&[
        "inspect",
        "-f",
        "{{.State.Running}} {{.State.ExitCode}} {{.State.OOMKilled}} {{.State.FinishedAt}}",
        &f.container(name),
    ]);
    let t = text(&o);
    let v: Vec<&str> = t.split_whitespace().collect();
    assert_eq!(v.first(), Some(&"false"), "{name} still runs: {t}");
    let at = base::time::parse_rfc3339(v[3]).expect("FinishedAt is RFC 3339");
    (
        v[1].parse().expect("ExitCode"),
        v[2] == "true",
        std::time::UNIX_EPOCH + at,
    )
}

/// Asserts that `e` is the 69 of an exec whose sandbox `name` died under
/// it, within 5 s of its death; prints the figure and returns the state.
fn died_under_exec(f: &Fixture, rt: &str, case: &str, name: &str, e: &Ended) -> String {
    let (code, oom, at) = finished(f, name);
    let state = engine::exit_state(Some(code), oom);
    let after = e.at.duration_since(at).unwrap_or_default();
    println!(
        "  {rt:<5} {case:<12} container {state}; exec exited {:?} {:.0} ms after the death \
         (the exec ran {:.1} s)",
        e.code,
        ms(after),
        e.took.as_secs_f64()
    );
    assert_eq!(e.code, Some(69), "{rt} {case}: {}", e.stderr);
    println!("        {}", e.stderr.trim());
    let said = format!("lw-sandbox: sandbox '{name}' {state} while ");
    assert!(e.stderr.contains(&said), "{rt} {case}: {}", e.stderr);
    assert!(
        e.stderr.contains(&format!("lw-sandbox start {name}")),
        "{}",
        e.stderr
    );
    assert!(
        after < Duration::from_secs(5),
        "{rt} {case}: exec ended {after:?} after its sandbox died"
    );
    state
}

/// `ls`'s state column for sandbox `name`.
fn ls_state(f: &Fixture, name: &str) -> String {
    let ls = f.ok(&["ls"]);
    ls.lines()
        .find(|l| l.starts_with(&format!("{name}\t")))
        .and_then(|l| l.split('\t').nth(2))
        .unwrap_or_else(|| panic!("{name} not in ls: {ls}"))
        .to_string()
}

/// Issue 29, item 6: under runsc a fork bomb at the pids limit (gVisor's
/// kernel exits 2) and a memory hog over the limit (the whole sandbox
/// OOM-killed) left `lw-sandbox exec` hanging for minutes: Docker never
/// ends the exec's stream.  Now the exec ends with 69 naming the sandbox
/// and how it ended within 5 s of the death, and `ls` says `exited (OOM)`.
/// Under runc the same two only end the offending processes, and the
/// exec's own status passes through; a container killed under an exec
/// there is 69 as well.  Tight limits (32 processes, 256 MiB) keep the host
/// safe.
#[test]
fn exec_ends_with_69_when_its_sandbox_dies_under_it() {
    let runtimes = wall_runtimes();
    let f = Fixture::new("death");
    let limits = ["--pids", "32", "--memory", "256m"];
    // The shell forks nothing after the bomb: with the pids limit full, a
    // fork for `sleep` would fail and dash would exit 2 instead of 3.  The
    // sleep starts first and the builtin `wait` waits for it.
    let bomb = "sleep 3 & (f() { f | f & }; f) >/dev/null 2>&1; wait; exit 3";
    let hog = "dd if=/dev/zero of=/dev/null bs=600M count=1 2>/dev/null; exit 4";
    println!("an exec whose sandbox dies under it (issue 29.6):");
    for rt in runtimes {
        let (b, h) = (format!("bomb-{rt}"), format!("hog-{rt}"));
        for n in [&b, &h] {
            let mut args = vec!["create", n.as_str(), "--branch", n, "--runtime", rt];
            args.extend(limits);
            f.ok(&args);
        }
        let exec = |n: &str, script: &str| {
            f.cmd(&["exec", n, "--", "sh", "-c", script])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("lw-sandbox runs")
        };
        let bound = Duration::from_secs(60);
        let e = ended_within(exec(&b, bomb), bound);
        let running = |n: &str| {
            text(&docker(&[
                "inspect",
                "-f",
                "{{.State.Running}}",
                &f.container(n),
            ]))
            .trim()
                == "true"
        };
        if running(&b) {
            // runc: the pids limit stops the bomb, not the sandbox.
            assert_eq!(e.code, Some(3), "{rt} fork bomb: {}", e.stderr);
            println!("  {rt:<5} fork bomb    sandbox lives; exec passed its status 3 through");
        } else {
            let state = died_under_exec(&f, rt, "fork bomb", &b, &e);
            assert_eq!(ls_state(&f, &b), state);
        }
        let e = ended_within(exec(&h, hog), bound);
        if running(&h) {
            assert_eq!(e.code, Some(4), "{rt} memory hog: {}", e.stderr);
            println!("  {rt:<5} memory hog   sandbox lives; exec passed its status 4 through");
        } else {
            let state = died_under_exec(&f, rt, "memory hog", &h, &e);
            assert_eq!(state, "exited (OOM)", "{rt}");
            assert_eq!(ls_state(&f, &h), "exited (OOM)");
            let json = f.ok(&["ls", "--json"]);
            let rec = json
                .lines()
                .find(|l| l.contains(&format!("\"name\":\"{h}\"")))
                .expect("ls --json lists it");
            assert!(
                rec.contains("\"oom_killed\":true") && rec.contains("\"state\":\"exited\""),
                "{rec}"
            );
            // The fix the message gives brings it back.
            f.ok(&["start", &h]);
        }
        // Killed from outside while an exec waits in it (the bomb's
        // sandbox: the hog's, under runc, saw an OOM, which Docker keeps
        // as OOMKilled until it starts again).
        if !running(&b) {
            f.ok(&["start", &b]);
        }
        let mut child = exec(&b, "echo armed; sleep 60");
        let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).expect("read");
        assert_eq!(line.trim(), "armed");
        let k = docker(&["kill", &f.container(&b)]);
        assert!(k.status.success(), "{}", err(&k));
        let e = ended_within(child, bound);
        let state = died_under_exec(&f, rt, "docker kill", &b, &e);
        assert_eq!(state, "exited (137)");
        assert_eq!(ls_state(&f, &b), "exited (137)");
    }
}
