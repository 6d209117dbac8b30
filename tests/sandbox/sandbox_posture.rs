//! The wall: a sandbox's posture read from inside and from the host, and
//! escape probes from inside that must all fail.  Prints its figures.

use support::sandbox as sandbox_support;

use std::io::Read;
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sandbox_support::*;

/// `lw-sandbox exec NAME -- sh -c SCRIPT`, given `secs` seconds: a step
/// that hangs (a gVisor sandbox whose sentry died leaves `docker exec`
/// waiting) fails the test naming the step instead of hanging it.
fn sh_within(f: &Fixture, name: &str, script: &str, secs: u64, step: &str) -> (i32, String) {
    let mut child = f
        .cmd(&["exec", name, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("lw-sandbox runs");
    let mut out = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let Some(st) = status else {
        return (
            -1,
            format!("TIMEOUT: {step} did not finish within {secs} s"),
        );
    };
    (st.code().unwrap_or(-1), reader.join().unwrap_or_default())
}

#[test]
fn posture_from_inside_and_from_the_host_has_no_deviation() {
    let runtimes = wall_runtimes();
    let mut all = Vec::new();
    for rt in &runtimes {
        all.push(posture(rt));
    }
    println!("posture table: {:<44} | {}", "check", runtimes.join(" | "));
    let mut names: Vec<&str> = Vec::new();
    for c in &all {
        for (w, _, _) in c {
            if !names.contains(w) {
                names.push(w);
            }
        }
    }
    for what in names {
        let cols: Vec<String> = all
            .iter()
            .map(|c| {
                c.iter().find(|(w, _, _)| *w == what).map_or(
                    "(not checked)".into(),
                    |(_, want, got)| {
                        if want == got {
                            format!("ok ({got})")
                        } else {
                            format!("DEVIATES (want {want}, got {got})")
                        }
                    },
                )
            })
            .collect();
        println!("posture table: {what:<44} | {}", cols.join(" | "));
    }
    let deviations: Vec<String> = runtimes
        .iter()
        .zip(&all)
        .flat_map(|(rt, c)| {
            c.iter()
                .filter(|(_, want, got)| want != got)
                .map(move |(w, want, got)| format!("{rt}: {w}: want {want}, got {got}"))
        })
        .collect();
    for (rt, c) in runtimes.iter().zip(&all) {
        println!(
            "posture {rt}: {} checks, {} deviations",
            c.len(),
            c.iter().filter(|(_, w, g)| w != g).count()
        );
    }
    assert!(deviations.is_empty(), "{deviations:#?}");
}

/// The posture checks of one sandbox under `rt`: (check, wanted, got).
fn posture(rt: &str) -> Vec<(&'static str, String, String)> {
    let gvisor = rt == "runsc";
    let f = Fixture::with_config(&format!("posture-{rt}"), &runtime_config(rt));
    f.ok(&["create", "p", "--branch", "p"]);
    let mut checks: Vec<(&'static str, String, String)> = Vec::new();

    // From inside.
    let (code, out) = sh_within(
        &f,
        "p",
        "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status | tr -d '\\t ' ; \
         echo root=$(awk '$2==\"/\" {split($4,o,\",\"); print o[1]}' /proc/mounts); \
         echo tmp=$(awk '$2==\"/tmp\" {print $4}' /proc/mounts); \
         echo tmptype=$(awk '$2==\"/tmp\" {print $3}' /proc/mounts); \
         echo net=$(awk -F: 'NR>2 {gsub(/ /,\"\",$1); print $1}' /proc/net/dev | tr '\\n' ' '); echo uid=$(id -u); \
         echo child=$(sh -c \"grep '^Seccomp:' /proc/self/status | tr -d '\\t '\"); \
         echo pidsmax=$(cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || echo none)",
        60,
        "the inside view",
    );
    assert_eq!(code, 0, "[{rt}] {out}");
    let get = |k: &str| {
        out.lines()
            .find_map(|l| {
                l.strip_prefix(&format!("{k}:"))
                    .or_else(|| l.strip_prefix(&format!("{k}=")))
            })
            .unwrap_or("?")
            .trim()
            .to_string()
    };
    checks.push(("inside CapEff", "0000000000000000".into(), get("CapEff")));
    checks.push(("inside CapPrm", "0000000000000000".into(), get("CapPrm")));
    checks.push(("inside CapBnd", "0000000000000000".into(), get("CapBnd")));
    if gvisor {
        // gVisor's status has no such line: runsc takes no-new-privileges
        // as always set (and lw-confine sets it).
        checks.push((
            "inside NoNewPrivs line (gVisor has none)",
            "?".into(),
            get("NoNewPrivs"),
        ));
    } else {
        checks.push(("inside NoNewPrivs", "1".into(), get("NoNewPrivs")));
    }
    checks.push(("inside Seccomp (2 = filter)", "2".into(), get("Seccomp")));
    checks.push(("inside a child's Seccomp", "Seccomp:2".into(), get("child")));
    checks.push(("inside root mount", "ro".into(), get("root")));
    if gvisor {
        // /tmp is the host's noexec scratch tmpfs, bound in (gVisor shows
        // a bind without the host's options): checked from the host below.
        checks.push((
            "inside /tmp a bind of the host's (9p)",
            "9p".into(),
            get("tmptype"),
        ));
    } else {
        let tmp = get("tmp");
        checks.push((
            "inside /tmp noexec,nosuid",
            "true".into(),
            (tmp.contains("noexec") && tmp.contains("nosuid")).to_string(),
        ));
    }
    checks.push(("inside interfaces", "lo".into(), get("net")));
    checks.push(("inside uid", "100000".into(), get("uid")));
    // gVisor shows no cgroup files inside; the host's limit is checked below.
    checks.push((
        "inside pids.max",
        if gvisor { "none" } else { "512" }.into(),
        get("pidsmax"),
    ));

    // From the host: the engine's record and the kernel's view of PID 1.
    let c = f.container("p");
    let fmt = "{{.HostConfig.ReadonlyRootfs}}|{{json .HostConfig.CapDrop}}|{{json .HostConfig.SecurityOpt}}|{{.HostConfig.PidsLimit}}|{{.HostConfig.Memory}}|{{.HostConfig.NetworkMode}}|{{.Config.User}}|{{.HostConfig.Privileged}}|{{.State.Pid}}|{{.Id}}";
    let ins = text(&docker(&["inspect", "-f", fmt, &c]));
    let v: Vec<&str> = ins.trim().split('|').collect();
    checks.push(("host ReadonlyRootfs", "true".into(), v[0].into()));
    checks.push(("host CapDrop", "[\"ALL\"]".into(), v[1].into()));
    let opts: Vec<String> = serde_json::from_str(v[2]).unwrap_or_default();
    let opts: Vec<String> = opts
        .iter()
        .map(|o| {
            if o.starts_with("seccomp=") {
                "seccomp=PROFILE".into()
            } else {
                o.clone()
            }
        })
        .collect();
    let mut want = vec!["no-new-privileges:true", "seccomp=PROFILE"];
    if loopwright::sandbox::host_has_apparmor() {
        want.push("apparmor=docker-default");
    }
    checks.push(("host SecurityOpt", want.join(","), opts.join(",")));
    let pids = loopwright::sandbox::scratch::host_pids(rt, 512);
    checks.push(("host PidsLimit", pids.to_string(), v[3].into()));
    checks.push(("host Memory", (2u64 << 30).to_string(), v[4].into()));
    checks.push(("host NetworkMode", "none".into(), v[5].into()));
    checks.push(("host User", "100000:100000".into(), v[6].into()));
    checks.push(("host Privileged", "false".into(), v[7].into()));
    let cgroup = host_pids_cgroup(v[9]);
    checks.push((
        "host cgroup pids.max",
        pids.to_string(),
        cgroup
            .as_ref()
            .and_then(|d| std::fs::read_to_string(d.join("pids.max")).ok())
            .unwrap_or_else(|| "?".into())
            .trim()
            .to_string(),
    ));
    let status = std::fs::read_to_string(format!("/proc/{}/status", v[8]))
        .expect("PID 1 of the container is visible from the host");
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}:")))
            .unwrap_or("?")
            .split_whitespace()
            .next()
            .unwrap_or("?")
            .to_string()
    };
    if gvisor {
        // PID 1 seen from the host is gVisor's sentry (runsc-sandbox), not
        // the sandbox's shell: it runs under gVisor's own seccomp filter
        // with no-new-privileges, and no program of the sandbox runs on
        // the host's kernel.
        checks.push((
            "host view (sentry) NoNewPrivs",
            "1".into(),
            field("NoNewPrivs"),
        ));
        checks.push(("host view (sentry) Seccomp", "2".into(), field("Seccomp")));
        let argv0 = std::fs::read(format!("/proc/{}/cmdline", v[8])).unwrap_or_default();
        let argv0 = String::from_utf8_lossy(argv0.split(|b| *b == 0).next().unwrap_or_default())
            .into_owned();
        checks.push((
            "host view PID 1 is the sentry",
            "runsc-sandbox".into(),
            argv0,
        ));
        let scratch = f.root.join("state/disk/p.scratch");
        checks.push(("host scratch tmpfs noexec,nosuid,nodev", "true".into(), {
            let o = mount_options(&scratch);
            (o.contains("noexec") && o.contains("nosuid") && o.contains("nodev")).to_string()
        }));
    } else {
        checks.push((
            "host view CapEff",
            "0000000000000000".into(),
            field("CapEff"),
        ));
        checks.push(("host view NoNewPrivs", "1".into(), field("NoNewPrivs")));
        checks.push(("host view Seccomp", "2".into(), field("Seccomp")));
        checks.push(("host view Uid", "100000".into(), field("Uid")));
    }
    // Exactly these mounts from the host, each with its mode.
    let mounts = text(&docker(&[
        "inspect",
        "-f",
        "{{range .Mounts}}{{.Destination}} {{.RW}}\n{{end}}",
        &c,
    ]));
    let mut mounts: Vec<&str> = mounts.lines().filter(|l| !l.is_empty()).collect();
    mounts.sort();
    let mut want = vec![
        "/lw/mailbox true",
        "/lw/mirror false",
        "/lw/registry false",
        "/usr/local/bin/lw-confine false",
        "/usr/local/bin/lw-inbox false",
        "/usr/local/bin/lw-mcp false",
        "/usr/local/bin/lw-post false",
        "/work true",
    ];
    if gvisor {
        want.extend(["/dev/shm true", "/tmp true"]);
    }
    want.sort();
    checks.push(("host mounts", want.join(","), mounts.join(",")));

    // Fork bomb.  Under runc: contained by the pids limit, and the sandbox
    // answers again once the bomb's processes have ended (dash gives up at
    // the first failed fork, so the bomb runs in a subshell; the counters
    // are read with builtins, which need no fork while the budget is
    // spent).  Under gVisor the host's limit counts the sentry's tasks and
    // gVisor keeps no count of its own: the bomb ends when the sentry is
    // denied a task and exits, taking the sandbox (never the host) with it,
    // and `docker exec` is left waiting; `lw-sandbox start` brings it back.
    // gVisor starts a process in about 20 ms here, so its bomb's processes
    // live long enough (60 s) to pile up past the host's limit.
    let t = Instant::now();
    let (_, bomb) = sh_within(
        &f,
        "p",
        &format!(
            "d=/sys/fs/cgroup; [ -e $d/pids.max ] || d=/sys/fs/cgroup/pids; \
             (i=0; while [ $i -lt 3000 ]; do sleep {} & i=$((i+1)); done) 2>/dev/null; \
             m=0; while read -r k v; do [ \"$k\" = max ] && m=$v; done < $d/pids.events; \
             read -r c < $d/pids.current; echo \"max $m\"; echo \"$c\"",
            if gvisor { 60 } else { 3 }
        ),
        if gvisor { 60 } else { 120 },
        "the fork bomb",
    );
    println!(
        "posture [{rt}]: the fork bomb ended after {:.1} s: {}",
        t.elapsed().as_secs_f64(),
        bomb.lines().next().unwrap_or("")
    );
    let host_events = cgroup
        .as_ref()
        .and_then(|d| std::fs::read_to_string(d.join("pids.events")).ok());
    if gvisor {
        // Whether the bomb ended by itself, was cut by the step's limit, or
        // took the sentry down, the host's count never passes its limit.
        let state = text(&docker(&["inspect", "-f", "{{.State.Status}}", &c]));
        let state = state.trim();
        let within = match (&cgroup, state) {
            (_, "exited") => true,
            (Some(d), _) => {
                let n = |f: &str| -> u64 {
                    std::fs::read_to_string(d.join(f))
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                        .unwrap_or(u64::MAX)
                };
                n("pids.current") <= n("pids.max")
            }
            (None, _) => false,
        };
        println!(
            "posture [{rt}]: after the bomb the container is {state}; host pids.events: {}",
            host_events.as_deref().unwrap_or("?").trim()
        );
        checks.push((
            "fork bomb: host tasks within the host limit",
            "true".into(),
            within.to_string(),
        ));
        checks.push((
            "fork bomb: the host's limit was reached",
            "true".into(),
            (state == "exited" || host_events.as_deref().is_some_and(|e| e.trim() != "max 0"))
                .to_string(),
        ));
        // Whatever the bomb left (a sentry that ended, or 60 s sleeps
        // holding the budget): a stop and a start bring the sandbox back.
        if state == "exited" {
            let o = f.sb(&["exec", "p", "--", "true"]);
            println!(
                "posture [{rt}]: the sentry ended; exec says: {}",
                err(&o).trim()
            );
        } else {
            f.ok(&["stop", "p"]);
        }
        f.ok(&["start", "p"]);
    } else {
        let denied: u64 = bomb
            .lines()
            .find_map(|l| l.strip_prefix("max "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        checks.push((
            "fork bomb denied forks > 0",
            "true".into(),
            (denied > 0).to_string(),
        ));
        let peak: u64 = bomb
            .lines()
            .last()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(u64::MAX);
        checks.push((
            "fork bomb pids <= 512",
            "true".into(),
            (peak <= 512).to_string(),
        ));
        let _ = &host_events;
    }
    // The bomb's sleeps last 3 s; until they end, a new exec may find no pid
    // left. The sandbox must answer again well before 30 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut tries = 0;
    let alive = loop {
        tries += 1;
        let ok = f.sb(&["exec", "p", "--", "true"]).status.success();
        if ok || Instant::now() > deadline {
            break ok;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    println!("posture [{rt}]: after the bomb the sandbox answered on try {tries}");
    checks.push((
        "sandbox answers after the bomb",
        "true".into(),
        alive.to_string(),
    ));
    for (what, want, got) in &checks {
        println!("posture [{rt}]: {what:<40} want {want:<20} got {got}");
    }
    f.ok(&["rm", "--force", "p"]);
    checks
}

/// The host's pids cgroup (v1 or v2) of container `id`.
fn host_pids_cgroup(id: &str) -> Option<std::path::PathBuf> {
    [
        format!("/sys/fs/cgroup/pids/docker/{id}"),
        format!("/sys/fs/cgroup/system.slice/docker-{id}.scope"),
        format!("/sys/fs/cgroup/docker/{id}"),
    ]
    .into_iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.join("pids.max").exists())
}

/// The options of the host's mount at `point`.
fn mount_options(point: &std::path::Path) -> String {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
    mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&point.display().to_string()))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap_or("not a mount")
        .to_string()
}

#[test]
fn escape_probes_all_fail() {
    let runtimes = wall_runtimes();
    let tables: Vec<(Vec<Probe>, usize)> = runtimes.iter().map(|r| escape_probes(r)).collect();
    println!("escape table: {:<60} | {}", "probe", runtimes.join(" | "));
    for (i, (what, _, _)) in tables[0].0.iter().enumerate() {
        let cols: Vec<String> = tables
            .iter()
            .map(|(t, _)| t.get(i).map_or("-".into(), |r| r.1.clone()))
            .collect();
        println!("escape table: {what:<60} | {}", cols.join(" | "));
    }
    let mut escaped = Vec::new();
    for (rt, (t, hits)) in runtimes.iter().zip(&tables) {
        let e: Vec<String> = t
            .iter()
            .filter(|r| !r.2)
            .map(|r| format!("{rt}: {}", r.0))
            .collect();
        println!(
            "escape probes {rt}: tried {}, succeeded {}, connections that reached the host server {hits}",
            t.len(),
            e.len()
        );
        assert_eq!(*hits, 0, "{rt}: a probe reached the host's server");
        escaped.extend(e);
    }
    assert!(escaped.is_empty(), "escaped: {escaped:?}");
}

/// A probe's name, what happened, and whether the wall held.
type Probe = (String, String, bool);

/// Every probe from a sandbox under `runtime`: (probe, result, held) and the
/// connections that reached the host's server.
fn escape_probes(runtime: &str) -> (Vec<Probe>, usize) {
    let f = Fixture::with_config(&format!("escape-{runtime}"), &runtime_config(runtime));
    let mut table: Vec<(String, String, bool)> = Vec::new();
    f.ok(&["create", "a", "--branch", "a"]);
    f.ok(&["create", "b", "--branch", "b"]);
    // A server on the host that counts every connection that reaches it.
    let listener = TcpListener::bind("0.0.0.0:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let reached = Arc::new(AtomicUsize::new(0));
    let r2 = reached.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            r2.fetch_add(1, Ordering::SeqCst);
            let mut s = s;
            let mut b = [0u8; 64];
            let _ = s.read(&mut b);
        }
    });
    let host_root = f.root.display().to_string();
    let proj = f.proj.display().to_string();
    let probes: Vec<(&str, String)> = vec![
        ("write /", "touch /probe".into()),
        ("write /etc", "echo x >> /etc/passwd".into()),
        (
            "write /usr/local/bin (replace lw-post)",
            "cp /bin/true /usr/local/bin/lw-post".into(),
        ),
        ("write the mirror (file)", "touch /lw/mirror/probe".into()),
        (
            "write the mirror (git push)",
            "git push -q origin HEAD:refs/heads/evil".into(),
        ),
        (
            "write the mirror's objects via alternates",
            "touch /lw/mirror/objects/probe".into(),
        ),
        (
            "mount a tmpfs",
            "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m".into(),
        ),
        (
            "new user namespace (unshare -Ur)",
            "unshare -Ur true".into(),
        ),
        ("setuid/become root", "su -c true root </dev/null".into()),
        (
            "reach the Docker socket (unix)",
            "curl -sS --max-time 3 --unix-socket /var/run/docker.sock http://x/version".into(),
        ),
        (
            "reach the Docker API (tcp 2375 on the bridge gateway)",
            "curl -sS --max-time 3 http://172.17.0.1:2375/version".into(),
        ),
        (
            "read another sandbox's inbox",
            format!("ls {host_root}/sandboxes/b/inbox/new || ls /lw/mailbox/../b/inbox"),
        ),
        (
            "write another sandbox's outbox",
            format!(
                "touch {host_root}/sandboxes/b/outbox/new/x || touch /lw/mailbox/../b/outbox/new/x"
            ),
        ),
        (
            "find another sandbox's mailbox anywhere",
            "find / -path '*/sandboxes/b*' -print -quit 2>/dev/null | grep -q .".into(),
        ),
        ("read the host's checkout", format!("cat {proj}/README")),
        (
            "read the host's mailbox root",
            format!("ls {host_root}/registry"),
        ),
        (
            "read the host's files via /proc/1/root",
            format!("cat /proc/1/root{proj}/README"),
        ),
        (
            "exec from /tmp",
            "cp /bin/true /tmp/t && chmod +x /tmp/t && /tmp/t".into(),
        ),
        (
            "exec from /tmp through the dynamic loader",
            "cp /bin/true /tmp/t2 && /lib64/ld-linux-x86-64.so.2 /tmp/t2".into(),
        ),
        (
            "exec from /dev/shm through the dynamic loader",
            "cp /bin/true /dev/shm/t3 && /lib64/ld-linux-x86-64.so.2 /dev/shm/t3".into(),
        ),
        (
            "exec from the mailbox through the dynamic loader",
            "cp /bin/true /lw/mailbox/outbox/tmp/t4 && /lib64/ld-linux-x86-64.so.2 /lw/mailbox/outbox/tmp/t4; r=$?; rm -f /lw/mailbox/outbox/tmp/t4; exit $r".into(),
        ),
        (
            "new user namespace from a child process (sh -c unshare)",
            "sh -c 'sh -c \"unshare -Ur true\"'".into(),
        ),
        (
            "reach the host's server on 127.0.0.1",
            format!("curl -sS --max-time 3 http://127.0.0.1:{port}/"),
        ),
        (
            "reach the host's server on the bridge gateway",
            format!("curl -sS --max-time 3 http://172.17.0.1:{port}/"),
        ),
        ("resolve a name", "getent hosts deb.debian.org".into()),
    ];
    let mut tried = 0;
    let mut failed = 0;
    let mut escaped = Vec::new();
    for (what, script) in &probes {
        tried += 1;
        let (code, out, e) = f.sh("a", &format!("cd /work/repo; {script}"));
        if code != 0 {
            failed += 1;
            println!("probe [{runtime}]: {what:<60} failed as it must (exit {code})");
            table.push((what.to_string(), format!("failed (exit {code})"), true));
        } else {
            println!("probe [{runtime}]: {what:<60} SUCCEEDED: {out}{e}");
            table.push((what.to_string(), "SUCCEEDED".into(), false));
            escaped.push(*what);
        }
    }
    // Push a branch other than its own: the sandbox makes one and commits.
    tried += 1;
    let (code, _, e) = f.sh("a", "git checkout -q -b other && echo x > o && git add o && git commit -qm other && git checkout -q a");
    assert_eq!(code, 0, "{e}");
    f.ok(&["push", "a"]);
    let heads = git(
        &f.upstream,
        &["for-each-ref", "--format=%(refname)", "refs/heads/"],
    );
    let what = "push a branch other than its own";
    let held = !(heads.contains("other") || heads.contains("evil"));
    table.push((
        what.into(),
        if held {
            "refused".into()
        } else {
            "SUCCEEDED".into()
        },
        held,
    ));
    if heads.contains("other") || heads.contains("evil") {
        escaped.push("push a branch other than its own");
        println!("probe: push a branch other than its own SUCCEEDED: {heads}");
    } else {
        failed += 1;
        println!(
            "probe: {:<60} failed as it must (upstream heads: {})",
            "push a branch other than its own",
            heads.replace('\n', " ")
        );
    }
    // Nothing written where a probe aimed.
    assert!(!f.root.join("sandboxes/b/outbox/new/x").exists());
    assert!(
        std::fs::read_dir(f.root.join("sandboxes/b/outbox/new"))
            .expect("b's outbox")
            .next()
            .is_none()
    );
    let hits = reached.load(Ordering::SeqCst);
    println!(
        "escape probes [{runtime}]: tried {tried}, failed {failed}, escaped {escaped:?}, connections that reached the host server {hits}"
    );
    f.ok(&["rm", "--force", "a", "b"]);
    (table, hits)
}
