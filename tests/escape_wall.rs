//! Red team: what an agent that turns hostile tries from inside its
//! sandbox, against the wall of issue 15 — setuid files through the mailbox,
//! a network through the install script, the host's disk, the engine's
//! log, every core, a huge push, io_uring, terminal escapes for the
//! operator, a hard link into the quarantine — each probe run for real
//! against the Docker engine.  Prints a table (probe, expected, got) and
//! the figures; every probe must fail.
//! (tests/sandbox/sandbox_posture.rs holds the older probes: mounts, namespaces,
//! the Docker socket, other sandboxes' mailboxes, the host's files.)

use support::sandbox as sandbox_support;

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sandbox_support::*;

/// One row of the table.
struct Row {
    probe: &'static str,
    expected: String,
    got: String,
    held: bool,
}

fn row(rows: &mut Vec<Row>, probe: &'static str, expected: &str, got: String, held: bool) {
    rows.push(Row {
        probe,
        expected: expected.into(),
        got,
        held,
    });
}

fn free_bytes(p: &Path) -> u64 {
    let s = rustix::fs::statvfs(p).expect("statvfs");
    s.f_bavail * s.f_frsize
}

fn mount_options(point: &Path) -> String {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
    mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&point.display().to_string()))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap_or("not a mount")
        .to_string()
}

/// Runs the mediator over the root once.
fn mediate(f: &Fixture) -> String {
    let o = std::process::Command::new(bin("lw-mediate"))
        .arg("--root")
        .arg(&f.root)
        .arg("--once")
        .output()
        .expect("lw-mediate runs");
    assert!(o.status.success(), "lw-mediate: {}", err(&o));
    text(&o)
}

/// Every quarantine log entry's reason, and the kept copies' contents.
fn quarantine(f: &Fixture) -> (String, Vec<(Vec<u8>, u32, u32)>) {
    // Through the log's reader: a batch's entries share one file
    // (mailbox-spec.md, THE LOG), so the directory's names are not entries.
    let (entries, _) = mailbox::log::Log::new(f.root.join("log"))
        .entries()
        .expect("the log reads");
    let reasons: String = entries
        .iter()
        .filter(|e| e.name.ends_with(".quarantine"))
        .map(|e| format!("{}\n", e.decision.reason))
        .collect();
    let kept = std::fs::read_dir(f.root.join("quarantine/new"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let m = std::fs::symlink_metadata(e.path()).expect("stat");
            (
                std::fs::read(e.path()).unwrap_or_default(),
                m.mode() & 0o7777,
                m.nlink() as u32,
            )
        })
        .collect();
    (reasons, kept)
}

#[test]
fn escape_probes_against_the_wall_all_fail() {
    let started = std::time::Instant::now();
    let runtimes = wall_runtimes();
    let tables: Vec<Vec<Row>> = runtimes.iter().map(|r| wall_rows(r)).collect();
    println!(
        "wall: {:<50} | {:<45} | {}",
        "probe",
        "expected",
        runtimes.join(" | ")
    );
    for (i, r) in tables[0].iter().enumerate() {
        let cols: Vec<String> = tables
            .iter()
            .map(|t| {
                t.get(i).map_or("-".to_string(), |x| {
                    format!("{}{}", x.got, if x.held { "" } else { "  <-- ESCAPED" })
                })
            })
            .collect();
        println!(
            "wall: {:<50} | {:<45} | {}",
            r.probe,
            r.expected,
            cols.join(" | ")
        );
    }
    let mut escaped = Vec::new();
    for (rt, t) in runtimes.iter().zip(&tables) {
        let e: Vec<&str> = t.iter().filter(|r| !r.held).map(|r| r.probe).collect();
        println!(
            "wall: {rt}: {} probes, {} succeeded against the wall",
            t.len(),
            e.len()
        );
        escaped.extend(e.into_iter().map(|p| format!("{rt}: {p}")));
    }
    println!("wall: in {:.1}s", started.elapsed().as_secs_f64());
    assert_eq!(tables[0].len(), tables[tables.len() - 1].len());
    assert!(escaped.is_empty(), "probes that got through: {escaped:?}");
}

/// Every probe against a fixture whose sandboxes run under `runtime`.
fn wall_rows(runtime: &str) -> Vec<Row> {
    let f = Fixture::with_config(
        &format!("wall-{runtime}"),
        &format!(
            "sandbox.log-max-size = 1m\nsandbox.log-max-file = 2\nsandbox.push-max = 1m\n{}",
            runtime_config(runtime)
        ),
    );
    let mut rows: Vec<Row> = Vec::new();

    // A branch whose install script reaches for the network and the
    // operator's terminal, with a changed lockfile so that create installs.
    let listener = TcpListener::bind("0.0.0.0:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let reached = Arc::new(AtomicUsize::new(0));
    let r2 = reached.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            r2.fetch_add(1, Ordering::SeqCst);
            let mut b = [0u8; 64];
            let _ = s.read(&mut b);
        }
    });
    let gw = text(&docker(&[
        "network",
        "inspect",
        "bridge",
        "-f",
        "{{(index .IPAM.Config 0).Gateway}}",
    ]))
    .trim()
    .to_string();
    let gw = if gw.is_empty() {
        "127.0.0.1".into()
    } else {
        gw
    };
    git(&f.proj, &["checkout", "-q", "-b", "evil"]);
    std::fs::write(
        f.proj.join(".loopwright/runtime/deps.sh"),
        format!(
            "#!/bin/sh\nm=/work/home/branch-script-ran\necho \"ifaces=$(ls /sys/class/net | tr '\\n' ' ')\" > $m\n\
             if curl -s -m 3 -o /dev/null http://{gw}:{port}/; then echo reached >> $m; else echo unreachable >> $m; fi\n\
             printf 'install says \\033]0;pwned\\007\\033[2J done\\n'\n"
        ),
    )
    .expect("write");
    std::fs::write(f.proj.join("deps.lock"), "lock evil\n").expect("write");
    git(&f.proj, &["commit", "-qam", "evil install"]);
    git(&f.proj, &["push", "-q", "origin", "evil"]);
    git(&f.proj, &["checkout", "-q", "main"]);

    // 1. deps.sh network: the branch's script does not run by default...
    let o = f.sb(&["create", "evil", "--branch", "evil"]);
    assert!(o.status.success(), "create evil: {}", err(&o));
    let ran = f
        .sh("evil", "cat /work/home/branch-script-ran 2>/dev/null")
        .1;
    row(
        &mut rows,
        "deps.sh of the branch runs at create",
        "not run (image's copy)",
        if ran.is_empty() {
            "not run (image's copy)".into()
        } else {
            format!("ran: {}", ran.trim())
        },
        ran.is_empty() && err(&o).contains("--allow-install-change"),
    );
    // ... and when allowed, it runs with the sandbox's network: none.
    let o = f.sb(&[
        "create",
        "evil2",
        "--branch",
        "evil",
        "--allow-install-change",
    ]);
    assert!(o.status.success(), "create evil2: {}", err(&o));
    let ran = f.sh("evil2", "cat /work/home/branch-script-ran").1;
    let net = format!(
        "{}; host listener reached {} time(s)",
        ran.split_whitespace().collect::<Vec<_>>().join(" "),
        reached.load(Ordering::SeqCst)
    );
    row(
        &mut rows,
        "deps.sh network (--network none, allowed script)",
        "ifaces=lo unreachable; host listener reached 0 time(s)",
        net.clone(),
        net == "ifaces=lo unreachable; host listener reached 0 time(s)"
            // gVisor lists no interfaces under /sys/class/net; its network
            // is off (runsc --network=none), which the listener confirms.
            || (runtime == "runsc"
                && net == "ifaces= unreachable; host listener reached 0 time(s)"),
    );
    let e = err(&o);
    row(
        &mut rows,
        "terminal escapes in install output",
        "no ESC reaches stderr; shown as ^[",
        format!(
            "raw ESC: {}, shown: {}",
            e.contains('\x1b'),
            e.contains("^[]0;pwned^G")
        ),
        !e.contains('\x1b') && e.contains("^[]0;pwned^G"),
    );
    f.ok(&["rm", "--force", "evil"]);
    f.ok(&["rm", "--force", "evil2"]);

    // The sandbox the other probes run in, with small quotas, half a CPU.
    f.ok(&[
        "create",
        "a",
        "--branch",
        "a",
        "--disk",
        "64m",
        "--mail-disk",
        "16m",
        "--cpus",
        "0.5",
    ]);
    f.ok(&["create", "b", "--branch", "b"]);
    let boxdir = f.root.join("sandboxes/a");
    // Names that pass the id grammar, so the mediator looks further.
    let (suid, junk_id) = (base::id::new_id(), base::id::new_id());

    // 2. Setuid through the mailbox.
    let (code, _, e) = f.sh(
        "a",
        &format!("cp /bin/sh /lw/mailbox/outbox/new/{suid} && chmod 4755 /lw/mailbox/outbox/new/{suid} && cp /bin/sh /lw/mailbox/outbox/tmp/suid2 && chmod 4755 /lw/mailbox/outbox/tmp/suid2"),
    );
    assert_eq!(code, 0, "plant: {e}");
    let planted = boxdir.join("outbox/tmp/suid2");
    let owner = std::fs::metadata(&planted).expect("planted").uid();
    let account = std::process::Command::new("getent")
        .args(["passwd", &owner.to_string()])
        .output()
        .expect("getent");
    let host_exec = std::process::Command::new(&planted)
        .args(["-c", "id -u"])
        .output();
    let opts = mount_options(&boxdir);
    let got = format!(
        "mount {opts}; owner uid {owner} ({}); host exec: {}",
        if account.status.success() {
            "a host account"
        } else {
            "no account"
        },
        match &host_exec {
            Ok(o) => format!("ran, exit {:?}", o.status.code()),
            Err(e) => format!("refused ({})", e.kind()),
        }
    );
    let (icode, _, _) = f.sh("a", "/lw/mailbox/outbox/tmp/suid2 -c true");
    row(
        &mut rows,
        "setuid file via the mailbox (host runs it)",
        "nosuid,nodev,noexec; no account; refused",
        got,
        ["nosuid", "nodev", "noexec"]
            .iter()
            .all(|o| opts.split(',').any(|x| x == *o))
            && !account.status.success()
            && host_exec.is_err(),
    );
    row(
        &mut rows,
        "setuid file via the mailbox (sandbox runs it)",
        "refused",
        if icode == 0 {
            "ran".into()
        } else {
            format!("refused (exit {icode})")
        },
        icode != 0,
    );

    // 3. Hard link into the quarantine, and the mediator's refusal of setuid files.
    let (code, _, e) = f.sh(
        "a",
        &format!("printf junk > /lw/mailbox/outbox/new/{junk_id} && ln /lw/mailbox/outbox/new/{junk_id} /lw/mailbox/outbox/tmp/keep"),
    );
    assert_eq!(code, 0, "link: {e}");
    mediate(&f);
    let (code, _, e) = f.sh("a", "printf pwned > /lw/mailbox/outbox/tmp/keep");
    assert_eq!(code, 0, "write through the link: {e}");
    let (reasons, kept) = quarantine(&f);
    let through = kept.iter().any(|(b, _, _)| b.starts_with(b"pwned"));
    let unsafe_kept = kept.iter().any(|(_, m, n)| m & 0o7111 != 0 || *n > 1);
    row(
        &mut rows,
        "hard link writes the quarantined file",
        "copy unchanged, mode 600, 1 link",
        format!(
            "written through: {through}; kept {} file(s), any setuid/exec/linked: {unsafe_kept}",
            kept.len()
        ),
        !through && !unsafe_kept && kept.len() >= 2,
    );
    row(
        &mut rows,
        "setuid file kept or delivered as a message",
        "quarantined: setuid bits; hard links",
        format!(
            "reason setuid: {}, reason links: {}, left in outbox: {}",
            reasons.contains("setuid"),
            reasons.contains("hard links"),
            boxdir.join("outbox/new").join(&suid).exists()
        ),
        reasons.contains("setuid")
            && reasons.contains("hard links")
            && !boxdir.join("outbox/new").join(&suid).exists(),
    );

    // 4. Disk fill: the workspace and the mail dir.
    let before = free_bytes(&f.root);
    let (_, out, e) = f.sh(
        "a",
        "dd if=/dev/zero of=/work/fill bs=1M count=200 2>&1 | grep -o 'No space left on device'; dd if=/dev/zero of=/lw/mailbox/outbox/tmp/fill bs=1M count=100 2>&1 | grep -o 'No space left on device'; du -sm /work/fill /lw/mailbox/outbox/tmp/fill",
    );
    let after = free_bytes(&f.root);
    let images: u64 = ["a.work.img", "a.mail.img"]
        .iter()
        .map(|n| {
            std::fs::metadata(f.root.join("state/disk").join(n))
                .map(|m| m.blocks() * 512)
                .unwrap_or(0)
        })
        .sum();
    let enospc = out.matches("No space left on device").count();
    let quota = (64u64 + 16) << 20;
    println!(
        "wall: disk fill: host free {} -> {} MiB (drop {} MiB, other writers on the host included); the images hold {} MiB of a {} MiB quota; ENOSPC x{enospc}; {:?} {e}",
        before >> 20,
        after >> 20,
        before.saturating_sub(after) >> 20,
        images >> 20,
        quota >> 20,
        out.lines()
            .filter(|l| !l.contains("No space"))
            .collect::<Vec<_>>()
    );
    let (bcode, _, be) = f.sh(
        "b",
        "dd if=/dev/zero of=/work/ten bs=1M count=10 2>&1 && rm /work/ten",
    );
    row(
        &mut rows,
        "disk fill (workspace 64m + mail dir 16m)",
        "ENOSPC x2; host loses <= 80 MiB; b writes",
        format!(
            "ENOSPC x{enospc}; images hold {} MiB; b writes: {}",
            images >> 20,
            bcode == 0
        ),
        enospc == 2 && images <= quota && bcode == 0,
    );
    assert_eq!(bcode, 0, "{be}");
    f.sh("a", "rm -f /work/fill /lw/mailbox/outbox/tmp/fill");

    // 5. Log flood: 20 MB into PID 1's stdout, the engine's log.
    let (code, _, e) = f.sh(
        "a",
        "yes 'flood flood flood flood flood flood flood flood' | head -c 20000000 > /proc/1/fd/1",
    );
    let log = text(&docker(&[
        "inspect",
        "-f",
        "{{.LogPath}}",
        &f.container("a"),
    ]))
    .trim()
    .to_string();
    let dir = Path::new(&log).parent().expect("log dir");
    let logged: u64 = std::fs::read_dir(dir)
        .expect("log dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("-json.log"))
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum();
    println!("wall: log flood: wrote 20000000 bytes (exit {code} {e}), the engine keeps {logged}");
    row(
        &mut rows,
        "log flood (20 MB to stdout)",
        "engine keeps <= 2 x 1m (+1 line)",
        format!("engine keeps {logged} bytes (exit {code})"),
        code == 0 && logged <= (2 << 20) + (64 << 10),
    );

    // 6. CPU hog: two busy loops for 3 s under --cpus 0.5, and the same
    // in b (the default, half the host's CPUs) as the same-run peer.
    // The CPU used is read on the host, from the container's cgroup (cgroup
    // v1 or v2), when the host has it: inside gVisor the cgroup files read 0.
    let host_usage = |name: &str| -> Option<f64> {
        let id = text(&docker(&["inspect", "-f", "{{.Id}}", &f.container(name)]))
            .trim()
            .to_string();
        let v1 = format!("/sys/fs/cgroup/cpuacct/docker/{id}/cpuacct.usage");
        let v2 = format!("/sys/fs/cgroup/system.slice/docker-{id}.scope/cpu.stat");
        if let Ok(t) = std::fs::read_to_string(&v1) {
            return t.trim().parse().ok();
        }
        let t = std::fs::read_to_string(&v2).ok()?;
        t.lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|n| n.trim().parse::<f64>().ok())
            .map(|us| us * 1000.0)
    };
    let hog = |name: &str| -> f64 {
        if let Some(a) = host_usage(name) {
            let t = std::time::Instant::now();
            let _ = f.sh(
                name,
                "for i in 1 2; do timeout 3 sh -c 'while :; do :; done' & done; wait",
            );
            let spent = t.elapsed().as_nanos() as f64;
            let b = host_usage(name).unwrap_or(a);
            return (b - a) / spent;
        }
        let (_, out, _) = f.sh(
            name,
            "u() { if [ -e /sys/fs/cgroup/cpu.stat ]; then awk '/usage_usec/ {print $2 * 1000}' /sys/fs/cgroup/cpu.stat; \
             else cat /sys/fs/cgroup/cpuacct/cpuacct.usage 2>/dev/null || cat /sys/fs/cgroup/cpu,cpuacct/cpuacct.usage; fi; }; \
             a=$(u); s=$(date +%s%N); for i in 1 2; do timeout 3 sh -c 'while :; do :; done' & done; wait; b=$(u); t=$(date +%s%N); \
             echo $((b - a)) $((t - s))",
        );
        let v: Vec<f64> = out
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if v.len() == 2 && v[1] > 0.0 {
            v[0] / v[1]
        } else {
            f64::NAN
        }
    };
    let cores = hog("a");
    let peer = hog("b");
    println!(
        "wall: cpu hog: {cores:.3} cores used under --cpus 0.5; {peer:.3} in b (--cpus {}) in the same run (ratio {:.2}; other work on the host shares the cores)",
        loopwright::sandbox::limits::default_cpus(),
        cores / peer
    );
    row(
        &mut rows,
        "CPU hog (2 loops, --cpus 0.5)",
        "<= 0.55 cores",
        format!("{cores:.3} cores (b, unlimited to half the host: {peer:.3})"),
        cores <= 0.55,
    );

    // 7. io_uring.
    let (_, out, _) = f.sh(
        "a",
        "for n in 425 426 427; do perl -e '$r = syscall($ARGV[0], 1, 0, 0, 0, 0); print \"$r $!\\n\"' $n; done",
    );
    // Under runc the seccomp profile answers EPERM; under gVisor the calls
    // reach gVisor's kernel (an exec'd process has no filter there, see
    // docs/engines.md), which must not set up a ring either.
    let all_eperm = out.lines().count() == 3
        && out.lines().all(|l| {
            l.trim() == "-1 Operation not permitted"
                || (runtime == "runsc" && l.trim_start().starts_with("-1 "))
        });
    row(
        &mut rows,
        "io_uring_setup/enter/register",
        "EPERM x3",
        out.lines().collect::<Vec<_>>().join("; "),
        all_eperm,
    );

    // 8. Push over the cap (1m): refused with the size and the cap, nothing pushed.
    let (code, _, e) = f.sh(
        "a",
        "cd /work/repo && head -c 2000000 /dev/urandom > big && git add big && git commit -qm big",
    );
    assert_eq!(code, 0, "{e}");
    let o = f.sb(&["push", "a"]);
    let upstream = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(&f.upstream)
        .args(["rev-parse", "--verify", "--quiet", "refs/heads/a"])
        .output()
        .expect("git");
    row(
        &mut rows,
        "push over the cap (2 MB, cap 1m)",
        "exit 65, size and cap named, nothing upstream",
        format!(
            "exit {:?}, names cap: {}, upstream has it: {}",
            o.status.code(),
            err(&o).contains("the cap is 1048576"),
            upstream.status.success()
        ),
        o.status.code() == Some(65)
            && err(&o).contains("the cap is 1048576")
            && !upstream.status.success(),
    );

    // 9. Terminal escapes in rm's refusal (a commit subject).
    let (code, _, e) = f.sh(
        "a",
        "cd /work/repo && git commit -q --allow-empty -m \"$(printf 'x \\033[2J\\033]0;pwned\\007 y')\"",
    );
    assert_eq!(code, 0, "{e}");
    let o = f.sb(&["rm", "a"]);
    let e = err(&o);
    row(
        &mut rows,
        "terminal escapes in rm's refusal",
        "refused (75); no ESC; shown as ^[",
        format!(
            "exit {:?}, raw ESC: {}, shown: {}",
            o.status.code(),
            e.contains('\x1b'),
            e.contains("^[[2J")
        ),
        o.status.code() == Some(75) && !e.contains('\x1b') && e.contains("^[[2J"),
    );

    // 10. Junk keeps no mail dir alive: rm archives the valid message and
    // the junk, and removes the mail dir and its filesystem.
    let (code, _, e) = f.sh(
        "a",
        "lw-post --kind status --subject unread 'never routed' >/dev/null && ln -s /etc/passwd /lw/mailbox/inbox/new/link && printf x > /lw/mailbox/inbox/new/junk",
    );
    assert_eq!(code, 0, "{e}");
    let o = f.sb(&["rm", "--force", "a"]);
    assert!(o.status.success(), "{}", err(&o));
    let archive = std::fs::read_dir(f.root.join("archive"))
        .expect("archive")
        .flatten()
        .find(|d| d.file_name().to_string_lossy().starts_with("a."))
        .expect("a's archive")
        .path();
    let unread = std::fs::read_dir(archive.join("unread/outbox"))
        .map(|d| d.count())
        .unwrap_or(0);
    let junk = std::fs::read_to_string(archive.join("quarantine/REASONS")).unwrap_or_default();
    let gone = !boxdir.exists() && mount_options(&boxdir) == "not a mount";
    row(
        &mut rows,
        "junk keeps a removed sandbox's mail dir live",
        "mail dir gone; 1 unread archived; 2 junk quarantined",
        format!(
            "mail dir gone: {gone}; unread archived: {unread}; junk lines: {}",
            junk.lines().count()
        ),
        gone && unread == 1 && junk.lines().count() == 2,
    );

    // 11. gc removes a mail dir whose sandbox is gone (an older lw-sandbox kept it).
    let ghost = f.root.join("sandboxes/ghost/inbox/new");
    std::fs::create_dir_all(&ghost).expect("mkdir");
    std::fs::write(ghost.join("junk"), "x").expect("write");
    let o = f.sb(&["gc"]);
    row(
        &mut rows,
        "mail dir of a vanished sandbox outlives gc",
        "removed",
        if f.root.join("sandboxes/ghost").exists() {
            "kept".into()
        } else {
            "removed".into()
        },
        o.status.success() && !f.root.join("sandboxes/ghost").exists(),
    );

    // lw doctor with a live sandbox (b).
    let o = std::process::Command::new(bin("lw-doctor"))
        .current_dir(&f.proj)
        .env("LW_ROOT", &f.root)
        .output()
        .expect("lw doctor");
    println!(
        "wall: lw doctor with a live sandbox exited {:?}",
        o.status.code()
    );
    row(
        &mut rows,
        "lw doctor with a live sandbox",
        "exit 0",
        format!(
            "exit {:?}{}",
            o.status.code(),
            text(&o)
                .lines()
                .filter(|l| l.contains("FAIL"))
                .map(|l| format!("; {l}"))
                .collect::<String>()
        ),
        o.status.success(),
    );
    // A reboot unmounts the disk images: start mounts them again before
    // the container starts, so b never writes the host's own disk.
    f.ok(&["stop", "b"]);
    let bwork = f.root.join("state/disk/b.work");
    let bmail = f.root.join("sandboxes/b");
    for p in [&bwork, &bmail] {
        let o = std::process::Command::new("umount")
            .arg(p)
            .output()
            .expect("umount");
        assert!(o.status.success(), "umount {}: {}", p.display(), err(&o));
    }
    f.ok(&["start", "b"]);
    let (code, _, e) = f.sh(
        "b",
        "test -d /work/repo/.git && test -d /lw/mailbox/inbox/new",
    );
    row(
        &mut rows,
        "start after a reboot runs on the host's disk",
        "disks mounted again, workspace intact",
        format!(
            "work {}; mail {}; workspace intact: {}",
            mount_options(&bwork),
            mount_options(&bmail),
            code == 0
        ),
        code == 0
            && mount_options(&bwork).contains("nosuid")
            && mount_options(&bmail).contains("noexec"),
    );
    assert_eq!(code, 0, "{e}");
    f.ok(&["rm", "b"]);

    rows
}

/// What a canary file is: its bytes, modification time and mode.
fn canary_state(p: &Path) -> Option<(Vec<u8>, i64, u32)> {
    let m = std::fs::symlink_metadata(p).ok()?;
    Some((std::fs::read(p).ok()?, m.mtime(), m.mode()))
}

/// Files under `dir` whose content is `bytes` (followed links aside).
fn copies_under(dir: &Path, bytes: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let t = e.file_type().expect("file type");
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() && std::fs::read(e.path()).is_ok_and(|b| b == bytes) {
                found.push(e.path().display().to_string());
            }
        }
    }
    found
}

/// Issue 29, break 1: a sandbox that replaces its mail dir's directories
/// with symbolic links to the host's `/` (or `/tmp`) steers none of the
/// commands that run as root over it: the mediator (its routing and its
/// `tmp/` sweep), `lw doctor`, the courier, `gc` and `rm` (its archive).
/// A canary where the links point — an old file the sweep would delete, a
/// valid message the mediator would route and `rm` would archive — is
/// checked byte for byte.  First, the layout that stops it at the source:
/// nothing at the top of a new sandbox's mail dir can be renamed, removed
/// or added from inside.  Then an older root's layout (top, `inbox/` and
/// `outbox/` the sandbox user's), where the sandbox plants the links.
#[test]
fn planted_links_to_the_host_steer_no_command_that_runs_as_root() {
    let f = Fixture::new("links");
    for n in ["a", "b", "c"] {
        f.ok(&["create", n, "--branch", n]);
    }
    let mut rows: Vec<Row> = Vec::new();
    let uid: u32 = f.sh("a", "id -u").1.trim().parse().expect("uid");

    // 1. Today's layout: the sandbox cannot touch what lies above its Maildirs.
    let tries = [
        "mv /lw/mailbox/outbox /lw/mailbox/o.x",
        "mv /lw/mailbox/inbox/tmp /lw/mailbox/inbox/t.x",
        "rm -rf /lw/mailbox/outbox/new",
        "ln -s / /lw/mailbox/planted",
        "ln -s / /lw/mailbox/outbox/planted",
    ];
    let script: String = tries
        .iter()
        .map(|t| format!("{t} 2>/dev/null && echo 'done: {t}'; "))
        .collect();
    let done = f.sh("a", &script).1;
    row(
        &mut rows,
        "rename/replace mail dir directories (new layout)",
        "0 of 5 done",
        format!("{} of {} done", done.lines().count(), tries.len()),
        done.trim().is_empty(),
    );

    // 2. An older root's layout, and the links planted from inside.
    for n in ["b", "c"] {
        let top = f.root.join("sandboxes").join(n);
        for d in [top.clone(), top.join("inbox"), top.join("outbox")] {
            std::os::unix::fs::chown(&d, Some(uid), Some(uid)).expect("chown");
            std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700))
                .expect("chmod");
        }
    }
    let (code, _, e) = f.sh(
        "b",
        "cd /lw/mailbox && mv outbox o.x && ln -s / outbox && mv inbox i.x && ln -s / inbox",
    );
    assert_eq!(code, 0, "plant in b: {e}");
    let (code, _, e) = f.sh(
        "c",
        "cd /lw/mailbox && for m in inbox outbox; do for d in tmp new cur; do mv $m/$d $m/$d.x && ln -s /tmp $m/$d || exit 1; done; done",
    );
    assert_eq!(code, 0, "plant in c: {e}");

    // The canary: in /tmp (b's tmp/ and all of c's directories point
    // there), older than the sweep's 36 hours.
    let m = mailbox::message::Message {
        version: 1,
        id: base::id::new_id(),
        from: "c".into(),
        to: vec!["a".into()],
        kind: mailbox::message::Kind::Status,
        subject: "canary".into(),
        body: "the host's own file".into(),
        refs: vec![],
        in_reply_to: None,
        created: base::time::rfc3339(base::time::now()),
    };
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(40 * 3600);
    let canaries = [
        (Path::new("/tmp").join(&m.id), m.to_bytes()),
        (
            Path::new("/tmp").join(format!("lw-canary-{}", nonce())),
            b"an old host file\n".to_vec(),
        ),
    ];
    for (p, bytes) in &canaries {
        std::fs::write(p, bytes).expect("write canary");
        std::fs::File::options()
            .write(true)
            .open(p)
            .and_then(|fh| fh.set_modified(old))
            .expect("age canary");
    }
    let before: Vec<_> = canaries.iter().map(|(p, _)| canary_state(p)).collect();

    // 3. Every command that runs as root over the mail dirs.
    let root = f.root.to_str().expect("utf-8 root");
    let mut ran = Vec::new();
    for (what, mut c) in [
        ("lw-mediate --once", {
            let mut c = std::process::Command::new(bin("lw-mediate"));
            c.args(["--root", root, "--once"]);
            c
        }),
        ("lw doctor", {
            let mut c = std::process::Command::new(bin("lw-doctor"));
            c.current_dir(&f.proj).env("LW_ROOT", root);
            c
        }),
        ("lw-sandbox courier --once", f.cmd(&["courier", "--once"])),
        ("lw-sandbox gc", f.cmd(&["gc"])),
        (
            "lw-sandbox rm --force b c",
            f.cmd(&["rm", "--force", "b", "c"]),
        ),
    ] {
        let o = c.output().expect("runs");
        ran.push(format!(
            "{what}: exit {:?} {}",
            o.status.code(),
            (text(&o) + &err(&o))
                .lines()
                .filter(|l| l.contains("sandboxes/") || l.contains("rm --force"))
                .take(4)
                .collect::<Vec<_>>()
                .join(" / ")
        ));
    }
    let after: Vec<_> = canaries.iter().map(|(p, _)| canary_state(p)).collect();
    let archived = copies_under(&f.root, &m.to_bytes());
    let logged = copies_under(&f.root.join("log"), &[]).len();
    let in_log = std::process::Command::new("grep")
        .args(["-rl", &m.id])
        .arg(&f.root)
        .output()
        .expect("grep");
    for r in &ran {
        println!("wall: ran {r}");
    }
    println!("wall: {logged} empty files in the log; canary copies in the root: {archived:?}");
    let doctor = ran
        .iter()
        .find(|r| r.starts_with("lw doctor"))
        .expect("doctor ran");
    row(
        &mut rows,
        "lw doctor on planted links",
        "FAIL naming the link, and the fix",
        if doctor.contains("inbox") && doctor.contains("lw-sandbox rm --force") {
            "FAIL naming the link, and the fix".into()
        } else {
            doctor.clone()
        },
        doctor.contains("inbox") && doctor.contains("lw-sandbox rm --force"),
    );
    row(
        &mut rows,
        "links to / and /tmp in old-layout mail dirs",
        "canaries untouched, 0 copies in the root",
        format!(
            "{} of {} canaries untouched, {} copies, id named in {} file(s)",
            before
                .iter()
                .zip(&after)
                .filter(|(b, a)| b.is_some() && b == a)
                .count(),
            canaries.len(),
            archived.len(),
            text(&in_log).lines().count()
        ),
        before
            .iter()
            .zip(&after)
            .all(|(b, a)| b.is_some() && b == a)
            && archived.is_empty()
            && text(&in_log).trim().is_empty(),
    );
    for (p, _) in &canaries {
        let _ = std::fs::remove_file(p);
    }
    f.ok(&["rm", "--force", "a"]);
    for r in &rows {
        println!(
            "wall: {:<50} | {:<45} | {}{}",
            r.probe,
            r.expected,
            r.got,
            if r.held { "" } else { "  <-- ESCAPED" }
        );
    }
    let held = rows.iter().filter(|r| r.held).count();
    println!("wall: links: {} probes, {held} held", rows.len());
    assert_eq!(held, rows.len(), "probes that got through");
}
