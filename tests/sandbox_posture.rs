//! The wall: a sandbox's posture read from inside and from the host, and
//! escape probes from inside that must all fail.  Prints its figures.

mod sandbox_support;

use std::io::Read;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sandbox_support::*;

#[test]
fn posture_from_inside_and_from_the_host_has_no_deviation() {
    let f = Fixture::new("posture");
    f.ok(&["create", "p", "--branch", "p"]);
    let mut checks: Vec<(&str, String, String)> = Vec::new();

    // From inside.
    let (code, out, e) = f.sh(
        "p",
        "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status | tr -d '\\t ' ; \
         echo root=$(awk '$2==\"/\" {split($4,o,\",\"); print o[1]}' /proc/mounts); \
         echo tmp=$(awk '$2==\"/tmp\" {print $4}' /proc/mounts); \
         echo net=$(ls /sys/class/net | tr '\\n' ' '); echo uid=$(id -u); \
         echo pidsmax=$(cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max)",
    );
    assert_eq!(code, 0, "{e}");
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
    checks.push(("inside NoNewPrivs", "1".into(), get("NoNewPrivs")));
    checks.push(("inside Seccomp (2 = filter)", "2".into(), get("Seccomp")));
    checks.push(("inside root mount", "ro".into(), get("root")));
    let tmp = get("tmp");
    checks.push((
        "inside /tmp noexec,nosuid",
        "true".into(),
        (tmp.contains("noexec") && tmp.contains("nosuid")).to_string(),
    ));
    checks.push(("inside interfaces", "lo".into(), get("net")));
    checks.push(("inside uid", "100000".into(), get("uid")));
    checks.push(("inside pids.max", "512".into(), get("pidsmax")));

    // From the host: the engine's record and the kernel's view of PID 1.
    let c = f.container("p");
    let fmt = "{{.HostConfig.ReadonlyRootfs}}|{{json .HostConfig.CapDrop}}|{{json .HostConfig.SecurityOpt}}|{{.HostConfig.PidsLimit}}|{{.HostConfig.Memory}}|{{.HostConfig.NetworkMode}}|{{.Config.User}}|{{.HostConfig.Privileged}}|{{.State.Pid}}";
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
    checks.push(("host PidsLimit", "512".into(), v[3].into()));
    checks.push(("host Memory", (2u64 << 30).to_string(), v[4].into()));
    checks.push(("host NetworkMode", "none".into(), v[5].into()));
    checks.push(("host User", "100000:100000".into(), v[6].into()));
    checks.push(("host Privileged", "false".into(), v[7].into()));
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
    checks.push((
        "host view CapEff",
        "0000000000000000".into(),
        field("CapEff"),
    ));
    checks.push(("host view NoNewPrivs", "1".into(), field("NoNewPrivs")));
    checks.push(("host view Seccomp", "2".into(), field("Seccomp")));
    checks.push(("host view Uid", "100000".into(), field("Uid")));
    // Exactly these mounts from the host, each with its mode.
    let mounts = text(&docker(&[
        "inspect",
        "-f",
        "{{range .Mounts}}{{.Destination}} {{.RW}}\n{{end}}",
        &c,
    ]));
    let mut mounts: Vec<&str> = mounts.lines().filter(|l| !l.is_empty()).collect();
    mounts.sort();
    checks.push((
        "host mounts",
        "/lw/mailbox true,/lw/mirror false,/lw/registry false,/usr/local/bin/lw-inbox false,/usr/local/bin/lw-mcp false,/usr/local/bin/lw-post false,/work true".into(),
        mounts.join(","),
    ));

    // Fork bomb: contained by the pids limit, and the sandbox answers again
    // once the bomb's processes have ended. dash gives up at the first failed
    // fork, so the bomb runs in a subshell; the counters are read with
    // builtins, which need no fork while the pids budget is still spent.
    let (_, bomb, _) = f.sh(
        "p",
        "d=/sys/fs/cgroup; [ -e $d/pids.max ] || d=/sys/fs/cgroup/pids; \
         (i=0; while [ $i -lt 3000 ]; do sleep 3 & i=$((i+1)); done) 2>/dev/null; \
         m=0; while read -r k v; do [ \"$k\" = max ] && m=$v; done < $d/pids.events; \
         read -r c < $d/pids.current; echo \"max $m\"; echo \"$c\"",
    );
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
    // The bomb's sleeps last 3 s; until they end, a new exec may find no pid
    // left. The sandbox must answer again well before 30 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut tries = 0;
    let alive = loop {
        tries += 1;
        let ok = f.sb(&["exec", "p", "--", "true"]).status.success();
        if ok || std::time::Instant::now() > deadline {
            break ok;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    println!("posture: after the bomb the sandbox answered on try {tries}");
    checks.push((
        "sandbox answers after the bomb",
        "true".into(),
        alive.to_string(),
    ));

    let deviations: Vec<_> = checks.iter().filter(|(_, want, got)| want != got).collect();
    for (what, want, got) in &checks {
        println!("posture: {what:<34} want {want:<20} got {got}");
    }
    println!(
        "posture: {} checks, {} deviations (fork bomb: {denied} forks denied)",
        checks.len(),
        deviations.len()
    );
    assert!(deviations.is_empty(), "{deviations:?}");
    f.ok(&["rm", "p"]);
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
            .filter(|r| !(*rt == "runsc" && GVISOR_GAPS.contains(&r.0.as_str())))
            .map(|r| format!("{rt}: {}", r.0))
            .collect();
        for r in t.iter().filter(|r| !r.2) {
            if *rt == "runsc" && GVISOR_GAPS.contains(&r.0.as_str()) {
                println!(
                    "escape probes {rt}: KNOWN GVISOR GAP, succeeded inside gVisor's kernel: {} (runsc 2022-12; see GVISOR_GAPS and docs/engines.md)",
                    r.0
                );
            }
        }
        let gaps = t.iter().filter(|r| !r.2).count() - e.len();
        println!(
            "escape probes {rt}: tried {}, succeeded {} (+ {gaps} known gVisor gaps), connections that reached the host server {hits}",
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

/// Probes the gVisor of this machine (Debian's runsc of 2022-12) lets
/// through while runc holds them: counted and printed apart, never hidden
/// (docs/engines.md says why).  Anything else that succeeds fails the test.
/// Both stay inside gVisor's own kernel: a `docker exec`'d process carries
/// no seccomp filter under this runsc (Seccomp 0; PID 1 has the profile,
/// with --oci-seccomp), so `unshare -Ur` makes a gVisor user namespace; and
/// gVisor does not refuse an executable mapping of a file on a noexec
/// mount, so ld.so runs a copy in /tmp.
const GVISOR_GAPS: &[&str] = &[
    "new user namespace (unshare -Ur)",
    "exec from /tmp through the dynamic loader",
];

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
