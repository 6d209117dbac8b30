//! `lw-sandbox create --network egress`, end to end: a real sandbox reaches
//! the allow-list's host through its proxy and nothing else, its denials
//! show in `logs --egress`, and `rm` (or `gc` after a killed create) leaves
//! no proxy or network behind.
//!
//! The world: one Docker network made here with the egress label (named in
//! the project's `egress.network`), holding `api.example.com` (a counter on
//! port 80) and a forbidden server (counters on 80 and 443, also answering to
//! the look-alike `api.example.com.evil`).  Nothing leaves the machine.

use support::build as build_support;
use support::egress as egress_support;
use support::sandbox as sandbox_support;

use std::os::unix::process::ExitStatusExt as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use egress_support::{counted, counter_server};
use sandbox_support::*;

fn exists(what: &str, name: &str) -> bool {
    docker(&[what, "inspect", name]).status.success()
}

#[test]
fn egress_sandbox_reaches_its_allow_list_only_and_leaves_nothing_behind() {
    let started = Instant::now();
    let n = nonce();
    let world = World::outside(&format!("sbeg-{n}"), &format!("lw-sbeg-{n}"));
    let busybox = build_support::test_image("busybox");
    let api = format!("lw-sbeg-{n}-api");
    let bad = format!("lw-sbeg-{n}-forbidden");
    counter_server(
        &api,
        &busybox,
        &world.label,
        &world.net,
        &["api.example.com"],
        &[80],
        "ok",
    );
    counter_server(
        &bad,
        &busybox,
        &world.label,
        &world.net,
        &["forbidden.example.org", "api.example.com.evil"],
        &[80, 443],
        "bad",
    );

    let config = format!(
        "egress.proxy-from = {}\negress.network = {}\negress.allow = api.example.com:443\n",
        debian(),
        world.net
    );
    let f = Fixture::with_config("egress", &config);
    let json = f.ok(&[
        "create",
        "t",
        "--branch",
        "t",
        "--network",
        "egress",
        "--allow",
        "api.example.com:80",
        "--json",
    ]);
    let rec: serde_json::Value =
        serde_json::from_str(json.trim()).expect("create --json prints JSON");
    assert_eq!(rec["network"], "egress", "{json}");
    let container = f.container("t");
    let proxy = format!("{container}-proxy");
    let network = format!("{container}-egress");
    assert!(
        exists("container", &proxy) && exists("network", &network),
        "create made the proxy and the network"
    );
    let ls = f.ok(&["ls", "--no-header"]);
    assert!(ls.starts_with("t\tt\trunning\t-\tegress\t"), "{ls}");
    // The proxy relays requests, never packets (issue 15).
    let fwd = text(&docker(&[
        "exec",
        &proxy,
        "cat",
        "/proc/sys/net/ipv4/ip_forward",
    ]));
    assert_eq!(fwd.trim(), "0", "ip_forward in the proxy's namespace");
    println!("egress: the proxy's net.ipv4.ip_forward is {}", fwd.trim());

    // Allowed: through the proxy from the variables the sandbox was given.
    let curl = "curl -sS --max-time 10";
    let (code, out, e) = f.sh("t", &format!("{curl} http://api.example.com/"));
    assert_eq!(
        (code, out.trim()),
        (0, "reached ok"),
        "allowed request: {e}"
    );
    let (code, out, _) = f.sh("t", "echo \"$HTTPS_PROXY $HTTP_PROXY\"");
    assert_eq!(
        (code, out.trim()),
        (0, "http://lw-egress-proxy:3128 http://lw-egress-proxy:3128")
    );

    let (code, out, _) = f.sh(
        "t",
        "cat /proc/net/if_inet6 2>/dev/null | grep -vc ' lo$'; true",
    );
    assert_eq!(
        (code, out.trim()),
        (0, "0"),
        "no IPv6 address but loopback's, if any"
    );

    // Forbidden: other hosts, a look-alike, CONNECT elsewhere, no proxy at all.
    let forbidden = [
        (
            "other host, HTTP",
            format!("{curl} -f http://forbidden.example.org/"),
        ),
        (
            "other host, CONNECT",
            format!("{curl} https://forbidden.example.org/"),
        ),
        (
            "look-alike name",
            format!("{curl} -f http://api.example.com.evil/"),
        ),
        (
            "other port on the allowed host",
            format!("{curl} -f http://api.example.com:8080/"),
        ),
        (
            "direct, without the proxy",
            format!("{curl} --noproxy '*' --max-time 5 http://forbidden.example.org/"),
        ),
    ];
    for (what, cmd) in &forbidden {
        let (code, out, _) = f.sh("t", cmd);
        assert_ne!(code, 0, "{what} must be refused: {out}");
        assert!(!out.contains("reached"), "{what} reached a server: {out}");
    }
    let (conns, bytes) = counted(&bad, "/srv", "bad");
    let (ok_conns, _) = counted(&api, "/srv", "ok");
    println!(
        "egress sandbox: allowed 1/1 reached ({ok_conns} connection(s) at the provider); forbidden attempts {}, \
         connections reaching the forbidden server {conns}, bytes {bytes} (goal 0)",
        forbidden.len()
    );
    assert_eq!(
        (conns, bytes),
        (0, 0),
        "nothing reaches the forbidden server"
    );
    assert_eq!(ok_conns, 1);

    // The operator sees the denials.
    let logs = f.ok(&["logs", "--egress", "t"]);
    for hp in [
        "forbidden.example.org:80",
        "forbidden.example.org:443",
        "api.example.com.evil:80",
        "api.example.com:8080",
    ] {
        assert!(
            logs.lines().any(|l| l.ends_with(&format!(" {hp}"))),
            "denial of {hp} logged:\n{logs}"
        );
    }
    assert!(
        !logs.lines().any(|l| l.ends_with(" api.example.com:80")),
        "the allowed request is no denial:\n{logs}"
    );
    let jl = f.ok(&["logs", "--egress", "t", "--json"]);
    let records: Vec<serde_json::Value> = jl
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON Lines"))
        .collect();
    assert!(
        records
            .iter()
            .all(|r| r["type"] == "denial" && r["host"].is_string() && r["port"].is_u64()),
        "{jl}"
    );
    assert_eq!(records.len(), logs.lines().count());
    println!("logs --egress: {} denial(s)", records.len());

    // stop stops the proxy too; start brings both back and the way out works.
    f.ok(&["stop", "t"]);
    let running =
        |c: &str| text(&docker(&["inspect", "-f", "{{.State.Running}}", c])).trim() == "true";
    assert!(
        !running(&proxy) && !running(&container),
        "stop stops the sandbox and its proxy"
    );
    f.ok(&["start", "t"]);
    assert!(running(&proxy));
    let (code, out, e) = f.sh("t", &format!("{curl} http://api.example.com/"));
    assert_eq!((code, out.trim()), (0, "reached ok"), "after start: {e}");

    // The proxy gone means no network at all, never a way around it.
    assert!(docker(&["kill", &proxy]).status.success());
    let (code, out, _) = f.sh("t", &format!("{curl} --max-time 5 http://api.example.com/"));
    assert_ne!(
        code, 0,
        "with its proxy dead the sandbox reaches nothing: {out}"
    );

    // rm leaves nothing.
    let rm = f.sb(&["rm", "t"]);
    assert!(rm.status.success(), "{}", err(&rm));
    assert!(
        !exists("container", &proxy) && !exists("network", &network),
        "rm removed the proxy and the network"
    );
    assert_eq!(f.leftovers(), Vec::<String>::new());

    // A create killed while its proxy comes up; gc reclaims the proxy and network.
    let mut child = f
        .cmd(&["create", "k", "--branch", "k", "--network", "egress"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("runs");
    let kproxy = format!("{}-proxy", f.container("k"));
    let knet = format!("{}-egress", f.container("k"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !exists("container", &kproxy) {
        assert!(
            Instant::now() < deadline && child.try_wait().expect("wait").is_none(),
            "create never made its proxy"
        );
    }
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("wait");
    assert_eq!(
        status.signal(),
        Some(9),
        "the create was killed mid-way, not finished"
    );
    let left_before = f.leftovers().len();
    let (proxy_before, net_before) = (exists("container", &kproxy), exists("network", &knet));
    let gc = f.ok(&["gc"]);
    assert!(gc.contains(&format!("egress {kproxy}")), "{gc}");
    let left_after = f.leftovers();
    println!(
        "SIGKILL mid-create: kills 1; engine objects left {left_before} (proxy {proxy_before}, network {net_before}); \
         after gc {}",
        left_after.len()
    );
    assert!(
        proxy_before && net_before,
        "the kill left the proxy and the network for gc"
    );
    assert!(
        !exists("container", &kproxy) && !exists("network", &knet),
        "gc reclaimed the killed create's egress"
    );
    assert_eq!(left_after, Vec::<String>::new());
    println!("took {:.1}s", started.elapsed().as_secs_f64());
}

#[test]
fn egress_bad_input_is_refused_before_anything_is_made() {
    let f = Fixture::with_config("egress-bad", "egress.allow = api.example.com:443\n");
    let cases: [(&[&str], i32, &str); 4] = [
        (
            &[
                "create",
                "a",
                "--branch",
                "a",
                "--network",
                "egress",
                "--allow",
                "*",
            ],
            78,
            "invalid egress entry '*'",
        ),
        (
            &[
                "create",
                "a",
                "--branch",
                "a",
                "--allow",
                "api.example.com:443",
            ],
            64,
            "--network egress",
        ),
        (
            &[
                "create",
                "a",
                "--branch",
                "a",
                "--network",
                "egress",
                "--port",
                "8080",
            ],
            64,
            "--network egress has not",
        ),
        (&["logs", "--egress", "nosuch"], 66, "nosuch"),
    ];
    for (args, want, says) in cases {
        let o = f.sb(args);
        assert_eq!(o.status.code(), Some(want), "{args:?}: {}", err(&o));
        assert!(err(&o).contains(says), "{args:?}: {}", err(&o));
        assert!(err(&o).starts_with("lw-sandbox: "), "{}", err(&o));
    }
    std::fs::write(
        f.proj.join(".loopwright/config"),
        "egress.alow = api.example.com:443\n",
    )
    .expect("write");
    let o = f.sb(&["create", "a", "--branch", "a", "--network", "egress"]);
    assert_eq!(o.status.code(), Some(78), "{}", err(&o));
    assert!(err(&o).contains("unknown key 'egress.alow'"), "{}", err(&o));
    assert_eq!(f.leftovers(), Vec::<String>::new());
    assert_eq!(f.host_leftovers(), Vec::<String>::new());
}
