//! Egress allow-list, enforced: a matrix of attempts from a sandbox against
//! servers in Docker networks this test makes, counted at the servers
//! themselves.
//!
//! The world: one bridge network (the stand-in for the internet, made here
//! with the egress label so `prepare` uses it as the way out) holding
//! `api.example.com` (the provider: HTTPS on 443, HTTP on 80, and a counter on
//! 8080, a port that is not allowed) and a forbidden server (counters on 80,
//! 443 and 8080, also answering to the look-alike `api.example.com.evil`).
//! Sandbox A may reach `api.example.com:443` and `api.example.com:80`;
//! sandbox B has an empty list and a counter of its own; the test process
//! counts connections to every address of the host on one port.  Every
//! counter but the allowed ones must stay at 0.
//!
//! Addresses used: only the test's own Docker networks, the docker0 gateway
//! and the host's own addresses; nothing leaves the machine.

use support::build as build_support;
use support::egress as egress_support;

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base::error::Exit;
use engine::DockerEngine;
use engine::NetworkEngine;
use engine::{ContainerSpec, Engine, ExecRequest, Images, OutStream};
use sha2::{Digest, Sha256};
use wall::egress::{self, AllowList, Options};

use egress_support::{counted, counter_script};
use support::seeded;

const TEST_LABEL: &str = "org.loopwright.test";
/// Plain HTTP requests the matrix sends to api.example.com:80 on purpose.
const ALLOWED_HTTP: u64 = 2;

fn docker_out(args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the docker CLI runs")
}

fn docker(args: &[&str]) -> String {
    let o = docker_out(args);
    assert!(
        o.status.success(),
        "docker {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn hex16(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Debian with curl, openssl and busybox: the sandboxes' and provider's
/// image, cached by the hash of its recipe and base.
fn tools_image() -> String {
    let base = build_support::test_image("debian");
    let df = format!(
        "FROM {base}\nRUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
         --no-install-recommends curl openssl busybox && rm -rf /var/lib/apt/lists/*\n"
    );
    let tag = format!("loopwright/test-egress-tools:{}", hex16(&df));
    if docker_out(&["image", "inspect", &tag]).status.success() {
        return tag;
    }
    let mut child = Command::new("docker")
        .args(["build", "-q", "-t", &tag, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker build runs");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), df.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "cannot build {tag}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    tag
}

/// Removes everything carrying this run's label, and the sandboxes' egress.
struct World {
    nonce: String,
    keys: Vec<String>,
}

impl World {
    fn label(&self) -> String {
        format!("{TEST_LABEL}={}", self.nonce)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Ok(engine) = engine::connect_docker(None) {
            for k in &self.keys {
                let _ = docker_out(&["rm", "-f", k]);
                let _ = egress::teardown(&engine, k);
            }
        }
        let label = self.label();
        let ids = docker_out(&["ps", "-aq", "--filter", &format!("label={label}")]);
        for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
            let _ = docker_out(&["rm", "-f", id]);
        }
        let nets = docker_out(&["network", "ls", "-q", "--filter", &format!("label={label}")]);
        for id in String::from_utf8_lossy(&nets.stdout).split_whitespace() {
            let _ = docker_out(&["network", "rm", id]);
        }
    }
}

/// Counts connections and bytes to every host address on one port.  A
/// connection from the test itself (loopback) is a fence: once it is
/// accepted, every earlier connection has been counted.
struct HostCounter {
    port: u16,
    conns: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    fence: std::sync::mpsc::Receiver<()>,
}

impl HostCounter {
    fn start() -> HostCounter {
        // [::] takes IPv4 too (bindv6only is 0 by default); fall back to v4.
        let l = TcpListener::bind("[::]:0")
            .or_else(|_| TcpListener::bind("0.0.0.0:0"))
            .expect("a port to listen on");
        let port = l.local_addr().unwrap().port();
        let conns = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let (tx, fence) = std::sync::mpsc::channel();
        let (c, b) = (conns.clone(), bytes.clone());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                let peer = s
                    .peer_addr()
                    .map(|a| a.ip().to_canonical().is_loopback())
                    .unwrap_or(false);
                if peer {
                    let _ = tx.send(());
                    continue;
                }
                c.fetch_add(1, Ordering::SeqCst);
                let b = b.clone();
                std::thread::spawn(move || {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        b.fetch_add(n as u64, Ordering::SeqCst);
                    }
                });
            }
        });
        HostCounter {
            port,
            conns,
            bytes,
            fence,
        }
    }

    fn settle(&self) -> (u64, u64) {
        let _ = TcpStream::connect(("127.0.0.1", self.port))
            .or_else(|_| TcpStream::connect(("::1", self.port)));
        self.fence
            .recv_timeout(Duration::from_secs(10))
            .expect("the fence connection is accepted");
        (
            self.conns.load(Ordering::SeqCst),
            self.bytes.load(Ordering::SeqCst),
        )
    }
}

fn exec(engine: &dyn Engine, container: &str, script: &str) -> (i64, String) {
    let mut out = Vec::new();
    let req = ExecRequest {
        cmd: vec!["sh".into(), "-c".into(), script.into()],
        ..Default::default()
    };
    let code = engine
        .exec(container, &req, &mut |s, b| {
            if s == OutStream::Stdout {
                out.extend_from_slice(b)
            }
        })
        .expect("exec runs");
    (code, String::from_utf8_lossy(&out).trim().to_string())
}

/// UDP datagrams sent from `container`'s network namespace so far.
fn udp_out(container: &str) -> u64 {
    let snmp = docker(&["exec", container, "cat", "/proc/net/snmp"]);
    let udp: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Udp:")).collect();
    let names: Vec<&str> = udp[0].split_whitespace().collect();
    let values: Vec<&str> = udp[1].split_whitespace().collect();
    let i = names
        .iter()
        .position(|n| *n == "OutDatagrams")
        .expect("/proc/net/snmp has Udp OutDatagrams");
    values[i].parse().expect("a number")
}

fn wait_ready(engine: &DockerEngine, container: &str) {
    let ok = engine
        .wait_for_line(container, Duration::from_secs(60), &mut |l| l == "ready")
        .expect("logs follow");
    assert!(
        ok,
        "{container} did not get ready: {}",
        docker(&["logs", container])
    );
}

fn ip_on(container: &str, network: &str) -> String {
    docker(&[
        "inspect",
        "-f",
        &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
        container,
    ])
}

fn sandbox_spec(
    name: &str,
    image: &str,
    plan: &egress::NetworkPlan,
    label: &str,
    cmd: &str,
) -> ContainerSpec {
    let (k, v) = label.split_once('=').unwrap();
    ContainerSpec {
        name: Some(name.into()),
        image: image.into(),
        cmd: vec!["sh".into(), "-c".into(), cmd.into()],
        env: plan.env.clone(),
        user: Some("65534:65534".into()),
        labels: [(k.to_string(), v.to_string())].into(),
        read_only_root: true,
        cap_drop: vec!["ALL".into()],
        security_opt: vec!["no-new-privileges".into()],
        pids_limit: Some(256),
        tmpfs: [("/tmp".to_string(), "rw,nosuid,size=16m".to_string())].into(),
        network: Some(plan.network.clone()),
        ..Default::default()
    }
}

#[derive(Debug)]
struct Probe {
    what: String,
    allowed: bool,
    code: i64,
    out: String,
    ms: u128,
}

#[test]
fn egress_matrix_reaches_the_allowed_host_and_nothing_else() {
    let engine = engine::connect_docker(None).expect("the Docker engine is reachable");
    let nonce = build_support::nonce();
    let mut world = World {
        nonce: format!("egress-{nonce}"),
        keys: vec![],
    };
    let label = world.label();
    let tools = tools_image();
    let busybox = build_support::test_image("busybox");

    // The world: one network standing in for the internet.
    let out_net = format!("lw-egt-{nonce}-world");
    docker(&[
        "network",
        "create",
        "--label",
        &label,
        "--label",
        "org.loopwright.egress=outside",
        &out_net,
    ]);
    let api = format!("lw-egt-{nonce}-api");
    let bad = counter_script("/srv", "bad");
    let ok = counter_script("/srv", "ok");
    let api_cmd = "mkdir -p /srv && printf '%s' \"$LW_OK\" >/srv/ok && printf '%s' \"$LW_BAD\" >/srv/bad && chmod +x /srv/ok /srv/bad \
        && openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=api.example.com -keyout /srv/k -out /srv/c 2>/dev/null \
        && (openssl s_server -quiet -www -accept 443 -cert /srv/c -key /srv/k >/dev/null 2>&1 &) \
        && (busybox nc -ll -p 80 -e /srv/ok &) && (busybox nc -ll -p 8080 -e /srv/bad &) \
        && until busybox netstat -ltn | grep -q ':443 ' && busybox netstat -ltn | grep -q ':8080 ' \
           && busybox netstat -ltn | grep -q ':80 '; do sleep 0.05; done && echo ready && exec sleep infinity";
    docker(&[
        "run",
        "-d",
        "--name",
        &api,
        "--label",
        &label,
        "--network",
        &out_net,
        "--network-alias",
        "api.example.com",
        "-e",
        &format!("LW_OK={ok}"),
        "-e",
        &format!("LW_BAD={bad}"),
        &tools,
        "sh",
        "-c",
        api_cmd,
    ]);
    let forbidden = format!("lw-egt-{nonce}-forbidden");
    let forbidden_cmd = "mkdir -p /srv && printf '%s' \"$LW_BAD\" >/srv/bad && chmod +x /srv/bad \
        && for p in 80 443 8080; do (nc -ll -p $p -e /srv/bad &); done \
        && until [ $(netstat -ltn | grep -c -E ':(80|443|8080) ') = 3 ]; do sleep 0.05; done && echo ready && exec sleep 999999";
    docker(&[
        "run",
        "-d",
        "--name",
        &forbidden,
        "--label",
        &label,
        "--network",
        &out_net,
        "--network-alias",
        "forbidden.example.org",
        "--network-alias",
        "api.example.com.evil",
        "-e",
        &format!("LW_BAD={bad}"),
        &busybox,
        "sh",
        "-c",
        forbidden_cmd,
    ]);

    // Two sandboxes: A may reach the provider, B has an empty list.
    let opts = Options {
        proxy_from: build_support::test_image("debian"),
        outside: out_net.clone(),
        ready_timeout: Duration::from_secs(60),
        labels: Default::default(),
        hosts: Default::default(),
    };
    let key_a = format!("lw-egt-{nonce}-a");
    let key_b = format!("lw-egt-{nonce}-b");
    world.keys = vec![key_a.clone(), key_b.clone()];
    let allow_a = AllowList::parse("api.example.com:443 api.example.com:80", "test").unwrap();
    let mut built = 0;
    let plan_a = egress::prepare(&engine, &key_a, &allow_a, &opts, &mut |_| built += 1)
        .expect("egress for A");
    let plan_b = egress::prepare(&engine, &key_b, &AllowList::none(), &opts, &mut |_| {
        built += 1
    })
    .expect("egress for B");
    println!(
        "proxy image: {} ({built} lines of build output)",
        egress::proxy_tag(&engine, &opts.proxy_from).unwrap().0
    );
    engine
        .create(&sandbox_spec(
            &key_a,
            &tools,
            &plan_a,
            &label,
            "exec sleep infinity",
        ))
        .unwrap();
    engine.start(&key_a).unwrap();
    let b_cmd = "printf '%s' \"$LW_BAD\" >/tmp/bad && chmod +x /tmp/bad && (busybox nc -ll -p 9000 -e /tmp/bad &) \
         && until busybox netstat -ltn | grep -q ':9000 '; do sleep 0.05; done && echo ready && exec sleep infinity";
    let mut spec_b = sandbox_spec(&key_b, &tools, &plan_b, &label, b_cmd);
    spec_b.env.push(format!("LW_BAD={bad}"));
    engine.create(&spec_b).unwrap();
    engine.start(&key_b).unwrap();
    for c in [&api, &forbidden, &key_b] {
        wait_ready(&engine, c);
    }

    // Addresses to aim at.
    let f_ip = ip_on(&forbidden, &out_net);
    let api_ip = ip_on(&api, &out_net);
    let b_ip = ip_on(&key_b, &plan_b.network);
    let net_a = engine
        .network(&plan_a.network)
        .unwrap()
        .expect("A's network");
    assert!(net_a.internal, "A's network is internal");
    assert_eq!(
        net_a
            .options
            .get("com.docker.network.bridge.inhibit_ipv4")
            .map(String::as_str),
        Some("true")
    );
    let a_gw = net_a
        .subnets
        .first()
        .map(|s| s.1.clone())
        .unwrap_or_default();
    let world_net = engine.network(&out_net).unwrap().unwrap();
    let world_gw = world_net.subnets[0].1.clone();
    let host = HostCounter::start();
    let hp = host.port;
    // The host's addresses a sandbox could aim at: docker0's gateway and the
    // gateway of the world network this test made.  (Other addresses of the
    // host sit outside the networks this test makes, so it leaves them be.)
    // docker0's IPAM config names no gateway; the engine gives the bridge the
    // subnet's first address.
    let bridge = engine
        .network("bridge")
        .unwrap()
        .expect("the engine's default bridge");
    let docker0 = bridge.subnets.iter().find_map(|(subnet, gw)| {
        if !gw.is_empty() {
            return Some(gw.clone());
        }
        let net = subnet.split('/').next()?.strip_suffix(".0")?;
        Some(format!("{net}.1"))
    });
    let host_addrs: Vec<String> = docker0.into_iter().chain([world_gw.clone()]).collect();
    // The world bridge's IPv6 link-local address, if it has one.
    let br = format!("br-{}", &world_net.id[..12]);
    // Without iproute2 there is no address to try; the probe is then skipped.
    let ip6 = Command::new("ip")
        .args(["-o", "-6", "addr", "show", "dev", &br])
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    let link6 = String::from_utf8_lossy(&ip6)
        .split_whitespace()
        .skip_while(|w| *w != "inet6")
        .nth(1)
        .map(|a| a.split('/').next().unwrap().to_string());

    let curl = "curl -sS -o /dev/null -w '%{http_code}' --max-time 8";
    let direct = "curl --noproxy '*' -sS -o /dev/null -w '%{http_code}' --max-time 4";
    let mut matrix: Vec<(String, bool, String)> = vec![
        (
            "allowed host:443, HTTPS through the proxy".into(),
            true,
            format!("{curl} -k https://api.example.com/"),
        ),
        (
            "allowed host:80, HTTP through the proxy".into(),
            true,
            format!("{curl} http://api.example.com/"),
        ),
        (
            "other host, HTTPS".into(),
            false,
            format!("{curl} -k https://forbidden.example.org/"),
        ),
        (
            "other host, HTTP".into(),
            false,
            format!("{curl} http://forbidden.example.org/"),
        ),
        (
            "other host, port 8080".into(),
            false,
            format!("{curl} http://forbidden.example.org:8080/"),
        ),
        (
            "allowed host, other port, HTTP".into(),
            false,
            format!("{curl} http://api.example.com:8080/"),
        ),
        (
            "allowed host, other port, CONNECT".into(),
            false,
            format!("{curl} -k https://api.example.com:8080/"),
        ),
        (
            "IP literal of the other host, HTTP".into(),
            false,
            format!("{curl} http://{f_ip}/"),
        ),
        (
            "IP literal of the other host, CONNECT".into(),
            false,
            format!("{curl} -k https://{f_ip}/"),
        ),
        (
            "IP literal of the allowed host, HTTP".into(),
            false,
            format!("{curl} http://{api_ip}/"),
        ),
        (
            "IP literal of the allowed host, port 8080".into(),
            false,
            format!("{curl} http://{api_ip}:8080/"),
        ),
        (
            "look-alike api.example.com.evil, HTTP".into(),
            false,
            format!("{curl} http://api.example.com.evil/"),
        ),
        (
            "look-alike api.example.com.evil, CONNECT".into(),
            false,
            format!("{curl} -k https://api.example.com.evil/"),
        ),
        (
            "look-alike evilapi.example.com".into(),
            false,
            format!("{curl} http://evilapi.example.com/"),
        ),
        (
            "user-info trick api.example.com@other".into(),
            false,
            format!("{curl} http://api.example.com@forbidden.example.org/"),
        ),
        (
            "the proxy's own manager".into(),
            false,
            format!("{curl} http://lw-egress-proxy:3128/squid-internal-mgr/info"),
        ),
        // --noproxy '' sets NO_PROXY aside, so the request goes to the proxy.
        (
            "localhost through the proxy".into(),
            false,
            format!("{curl} --noproxy '' http://localhost:3128/"),
        ),
        (
            "direct TCP to the other host".into(),
            false,
            format!("echo x | busybox nc -w 3 {f_ip} 80"),
        ),
        (
            "direct HTTP to the other host".into(),
            false,
            format!("{direct} http://{f_ip}/"),
        ),
        (
            "direct HTTP to the allowed host".into(),
            false,
            format!("{direct} http://{api_ip}/"),
        ),
        (
            "direct TCP to the allowed host, port 8080".into(),
            false,
            format!("echo x | busybox nc -w 3 {api_ip} 8080"),
        ),
        (
            "DNS: other host's name".into(),
            false,
            "getent hosts forbidden.example.org".into(),
        ),
        (
            "DNS: allowed host's name (only the proxy resolves)".into(),
            false,
            "getent hosts api.example.com".into(),
        ),
        (
            "DNS: look-alike name".into(),
            false,
            "getent hosts api.example.com.evil".into(),
        ),
        (
            "DNS: the other sandbox's name".into(),
            false,
            format!("getent hosts {key_b}"),
        ),
        (
            "IPv6: the sandbox has an IPv6 address".into(),
            false,
            "grep -v ' lo$' /proc/net/if_inet6 | grep -q .".into(),
        ),
        (
            "IPv6 literal through the proxy".into(),
            false,
            format!("{curl} -g 'http://[::1]:{hp}/'"),
        ),
        (
            "IPv6 direct to ::ffff:{world gateway}".into(),
            false,
            format!("{direct} -g 'http://[::ffff:{world_gw}]:{hp}/'"),
        ),
        (
            "other sandbox, direct".into(),
            false,
            format!("echo x | busybox nc -w 3 {b_ip} 9000"),
        ),
        (
            "other sandbox, through the proxy".into(),
            false,
            format!("{curl} http://{b_ip}:9000/"),
        ),
        (
            "other sandbox's proxy, direct".into(),
            false,
            format!("echo x | busybox nc -w 3 {key_b}-proxy 3128"),
        ),
        (
            "Docker socket in the sandbox".into(),
            false,
            "test -S /var/run/docker.sock".into(),
        ),
        (
            "Docker API on the world gateway :2375".into(),
            false,
            format!("echo x | busybox nc -w 3 {world_gw} 2375"),
        ),
    ];
    if let Some(l6) = &link6 {
        matrix.push((
            "IPv6 link-local of the host's bridge, direct".into(),
            false,
            format!("{direct} -g 'http://[{l6}%25eth0]:{hp}/'"),
        ));
        matrix.push((
            "IPv6 link-local of the host's bridge, proxy".into(),
            false,
            format!("{curl} -g 'http://[{l6}]:{hp}/'"),
        ));
    }
    if !a_gw.is_empty() {
        matrix.push((
            format!("own network's gateway {a_gw}, direct"),
            false,
            format!("echo x | busybox nc -w 3 {a_gw} {hp}"),
        ));
    }
    for a in &host_addrs {
        matrix.push((
            format!("host address {a}, direct"),
            false,
            format!("echo x | busybox nc -w 3 {a} {hp}"),
        ));
        matrix.push((
            format!("host address {a}, through the proxy"),
            false,
            format!("{curl} http://{a}:{hp}/"),
        ));
    }

    // The proxy looks up no name it is going to refuse: UDP datagrams sent
    // from its network namespace (its only DNS traffic) before and after
    // five requests for unlisted names, then one for the allowed name.
    // Squid looks up the client's own address (PTR, answered by the engine's
    // resolver from its container table) once per client; a first refused
    // request gets that out of the way so the count is of requested names.
    let proxy_a = egress::proxy_name(&key_a);
    let w0 = udp_out(&proxy_a);
    exec(
        &engine,
        &key_a,
        "curl -s -o /dev/null --max-time 8 http://zero.unlisted.example/",
    );
    let w1 = udp_out(&proxy_a);
    println!(
        "DNS datagrams sent by the proxy for its first client's address: {}",
        w1 - w0
    );
    let u0 = udp_out(&proxy_a);
    let names = "for n in one two three four five; do curl -s -o /dev/null --max-time 8 http://$n.unlisted.example/; done";
    exec(&engine, &key_a, names);
    let u1 = udp_out(&proxy_a);
    exec(
        &engine,
        &key_a,
        "curl -s -o /dev/null --max-time 8 http://api.example.com/",
    );
    let u2 = udp_out(&proxy_a);
    println!(
        "DNS datagrams sent by the proxy: {} for 5 refused names, {} for the allowed name",
        u1 - u0,
        u2 - u1
    );
    assert_eq!(u1, u0, "the proxy looked up names it refused");
    assert!(
        u2 > u1,
        "the allowed name was looked up (the counter counts)"
    );

    // Attempts run a few at a time (each is its own `docker exec`): most
    // of them wait for a timeout, and in a row they would take minutes.
    let mut probes = Vec::new();
    for chunk in matrix.chunks(8) {
        let done: Vec<Probe> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|(what, allowed, cmd)| {
                    let key = &key_a;
                    s.spawn(move || {
                        let t = std::time::Instant::now();
                        let o = docker_out(&["exec", key, "sh", "-c", cmd]);
                        Probe {
                            what: what.clone(),
                            allowed: *allowed,
                            code: o.status.code().map_or(-1, i64::from),
                            out: String::from_utf8_lossy(&o.stdout).trim().to_string(),
                            ms: t.elapsed().as_millis(),
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a probe thread"))
                .collect()
        });
        probes.extend(done);
    }
    // The sanity half of the DNS probes: the proxy's name does resolve, so a
    // failed lookup above is a refusal, not a broken resolver.
    let (dns_ok, _) = exec(&engine, &key_a, "getent hosts lw-egress-proxy");
    // B has an empty list: even the provider is refused.
    let (b_code, b_out) = exec(
        &engine,
        &key_b,
        &format!("{curl} -k https://api.example.com/"),
    );

    println!(
        "\n{:<52} {:<8} {:<5} {:>6} result",
        "attempt from sandbox A", "expected", "exit", "ms"
    );
    let mut wrong = Vec::new();
    for p in &probes {
        let succeeded = p.code == 0
            && (p.out.is_empty()
                || p.out.starts_with('2')
                || !p.out.chars().all(|c| c.is_ascii_digit()));
        let got = if succeeded { "reached" } else { "refused" };
        let expected = if p.allowed { "reach" } else { "refuse" };
        let first = p.out.lines().next().unwrap_or("");
        println!(
            "{:<52} {expected:<8} {:<5} {:>6} {got} {first}",
            p.what, p.code, p.ms
        );
        if succeeded != p.allowed {
            wrong.push(p.what.clone());
        }
    }
    println!(
        "{:<52} {:<8} {:<5} {:>6} {}",
        "sandbox B (empty list) to the allowed host", "refuse", b_code, "", b_out
    );
    println!(
        "{:<52} {:<8} {:<5}",
        "DNS: the proxy's own name (sanity)", "resolve", dns_ok
    );

    // What reached anything it should not have, counted where it arrived.
    let (f_conn, f_bytes) = counted(&forbidden, "/srv", "bad");
    let (p8080_conn, p8080_bytes) = counted(&api, "/srv", "bad");
    let (ok_conn, _) = counted(&api, "/srv", "ok");
    let (b_conn, b_bytes) = counted(&key_b, "/tmp", "bad");
    let (h_conn, h_bytes) = host.settle();
    let attempts = probes.iter().filter(|p| !p.allowed).count() + 1;
    let leaked_conn = f_conn + p8080_conn + b_conn + h_conn + ok_conn.saturating_sub(ALLOWED_HTTP);
    let leaked_bytes = f_bytes + p8080_bytes + b_bytes + h_bytes;
    println!("\nforbidden attempts: {attempts}");
    println!("reached the forbidden server: {f_conn} connections, {f_bytes} bytes");
    println!("reached api.example.com:8080: {p8080_conn} connections, {p8080_bytes} bytes");
    println!("reached sandbox B: {b_conn} connections, {b_bytes} bytes");
    println!(
        "reached the host ({} addresses): {h_conn} connections, {h_bytes} bytes",
        host_addrs.len()
    );
    println!("requests at api.example.com:80: {ok_conn} ({ALLOWED_HTTP} allowed)");
    println!(
        "total reaching forbidden servers: {leaked_conn} connections, {leaked_bytes} bytes (goal 0)"
    );

    let denials = egress::denials(&engine, &key_a).unwrap();
    let all = egress::requests(&engine, &key_a).unwrap();
    println!(
        "\nproxy of A logged {} requests, {} denied; for example:",
        all.len(),
        denials.len()
    );
    for d in denials.iter().take(4) {
        println!(
            "  denied {} {}:{} from {}",
            d.method, d.host, d.port, d.client
        );
    }
    let b_denials = egress::denials(&engine, &key_b).unwrap();

    assert!(
        wrong.is_empty(),
        "attempts with the wrong outcome: {wrong:?}"
    );
    assert_eq!(dns_ok, 0, "the proxy's name resolves in the sandbox");
    assert_ne!(b_out, "200", "B's empty list allowed the provider");
    assert_eq!(
        (leaked_conn, leaked_bytes),
        (0, 0),
        "something reached a forbidden server"
    );
    assert_eq!(
        ok_conn, ALLOWED_HTTP,
        "exactly the allowed HTTP requests reached api.example.com:80"
    );
    assert!(
        denials
            .iter()
            .any(|d| d.method == "CONNECT" && d.host == "forbidden.example.org" && d.port == 443),
        "{denials:?}"
    );
    assert!(
        denials
            .iter()
            .any(|d| d.host == "api.example.com" && d.port == 8080),
        "{denials:?}"
    );
    assert!(
        denials.iter().any(|d| d.host == "api.example.com.evil"),
        "{denials:?}"
    );
    assert!(
        all.iter()
            .any(|r| !r.denied() && r.host == "api.example.com" && r.port == 443),
        "{all:?}"
    );
    assert!(
        b_denials
            .iter()
            .any(|d| d.host == "api.example.com" && d.port == 443),
        "{b_denials:?}"
    );

    proxy_killed_mid_run(&engine, &key_a, &api, &forbidden);
}

/// Requests run in a loop in the sandbox; the proxy is killed; every request
/// that starts after it is dead must fail and none may reach a server.
fn proxy_killed_mid_run(engine: &DockerEngine, key: &str, api: &str, forbidden: &str) {
    let loop_sh = "n2=0; while :; do ph=1; [ -e /tmp/phase2 ] && ph=2; \
        c=$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 http://api.example.com/); \
        f=$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 http://forbidden.example.org/); \
        d=$(echo x | busybox nc -w 2 forbidden.example.org 80 >/dev/null 2>&1 && echo reached || echo refused); \
        echo \"$ph $c $f $d\"; [ $ph = 2 ] && n2=$((n2+1)); [ $n2 -ge 4 ] && break; done";
    let mut child = Command::new("docker")
        .args(["exec", key, "sh", "-c", loop_sh])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("docker exec runs");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut phase1 = Vec::new();
    for _ in 0..3 {
        phase1.push(lines.next().expect("the loop prints").unwrap());
    }
    let before_ok = counted(api, "/srv", "ok").0;
    let before_bad = counted(forbidden, "/srv", "bad");
    let proxy = egress::proxy_name(key);
    docker(&["kill", &proxy]);
    docker(&["wait", &proxy]);
    let ok_at_kill = counted(api, "/srv", "ok").0;
    docker(&["exec", key, "touch", "/tmp/phase2"]);
    let ok_at_phase2 = counted(api, "/srv", "ok").0;
    let mut phase2 = Vec::new();
    for l in lines {
        let l = l.unwrap();
        if l.starts_with("2 ") {
            phase2.push(l);
        }
    }
    child.wait().unwrap();
    let ok_after = counted(api, "/srv", "ok").0;
    let bad_after = counted(forbidden, "/srv", "bad");
    let p1_ok = phase1
        .iter()
        .filter(|l| l.split(' ').nth(1) == Some("200"))
        .count();
    let p2_ok = phase2
        .iter()
        .filter(|l| l.split(' ').nth(1) == Some("200"))
        .count();
    let p2_leak = phase2
        .iter()
        .filter(|l| l.split(' ').nth(2) == Some("200") || l.ends_with("reached"))
        .count();
    println!(
        "\nproxy killed mid-run: before the kill {p1_ok}/{} allowed requests succeeded",
        phase1.len()
    );
    println!(
        "after the kill: {} rounds, {p2_ok} allowed requests succeeded, {p2_leak} forbidden succeeded; \
         api.example.com:80 saw {} requests after the kill, the forbidden server {} connections",
        phase2.len(),
        ok_after - ok_at_phase2,
        bad_after.0 - before_bad.0
    );
    assert!(
        p1_ok >= 1,
        "the allowed host worked before the kill: {phase1:?} ({before_ok} at the server)"
    );
    assert_eq!(phase2.len(), 4, "the loop ran its rounds after the kill");
    assert_eq!((p2_ok, p2_leak), (0, 0), "{phase2:?}");
    assert_eq!(
        ok_after, ok_at_phase2,
        "no request reached the allowed host with the proxy dead"
    );
    assert!(ok_at_phase2 >= ok_at_kill);
    assert_eq!(
        bad_after, before_bad,
        "nothing reached the forbidden server"
    );

    // Started again, the same proxy serves the same list.
    egress::start_proxy(engine, key, Duration::from_secs(60)).expect("the proxy starts again");
    let (_, code) = exec(
        engine,
        key,
        "curl -s -o /dev/null -w '%{http_code}' --max-time 8 http://api.example.com/",
    );
    println!("after start_proxy: allowed request -> {code}");
    assert_eq!(code, "200");
}

#[test]
fn proxy_image_missing_is_built_and_a_missing_base_is_a_clear_error() {
    let engine = engine::connect_docker(None).expect("the Docker engine is reachable");
    let e = egress::ensure_proxy_image(&engine, "loopwright/no-such-base:none", &mut |_| {})
        .unwrap_err();
    assert_eq!(e.exit, Exit::NoInput);
    assert!(
        e.msg.contains("'loopwright/no-such-base:none'") && e.msg.contains("egress.proxy-from"),
        "{}",
        e.msg
    );
    println!("missing base: exit {} {}", e.exit.code(), e.msg);

    // A base of our own name: its own proxy tag, which starts missing.
    let nonce = build_support::nonce();
    let base = format!("loopwright/test-egress-base:{nonce}");
    docker(&["tag", &build_support::test_image("debian"), &base]);
    struct Untag(Vec<String>);
    impl Drop for Untag {
        fn drop(&mut self) {
            for t in &self.0 {
                let _ = docker_out(&["rmi", t]);
            }
        }
    }
    let (tag, recipe) = egress::proxy_tag(&engine, &base).unwrap();
    let _untag = Untag(vec![tag.clone(), base.clone()]);
    assert!(!engine.image_exists(&tag).unwrap(), "{tag} is new");
    assert!(
        recipe.contains(&base) && recipe.contains("entry.sh"),
        "{recipe}"
    );
    let mut lines = 0;
    let built = egress::ensure_proxy_image(&engine, &base, &mut |_| lines += 1)
        .expect("the proxy image builds");
    assert_eq!(built, tag);
    let img = engine.image(&tag).unwrap().expect("the image is there");
    assert_eq!(
        img.labels.get(egress::LABEL_EGRESS).map(String::as_str),
        Some("proxy")
    );
    println!("missing proxy image: built {tag} ({lines} lines of output)");
    let mut again = 0;
    egress::ensure_proxy_image(&engine, &base, &mut |_| again += 1).unwrap();
    assert_eq!(again, 0, "a second call builds nothing");
}

#[test]
fn prepare_makes_an_isolated_way_out_and_teardown_leaves_nothing() {
    let engine = engine::connect_docker(None).expect("the Docker engine is reachable");
    let nonce = build_support::nonce();
    let outside = format!("lw-egt-{nonce}-out");
    // Dropped last: the proxy must be gone before its network can go.
    let _rm_out = RmNet(outside.clone());
    let world = World {
        nonce: format!("egress-{nonce}"),
        keys: vec![format!("lw-egt-{nonce}-t")],
    };
    let key = world.keys[0].clone();
    let opts = Options {
        proxy_from: build_support::test_image("debian"),
        outside: outside.clone(),
        ready_timeout: Duration::from_secs(60),
        labels: [(TEST_LABEL.to_string(), world.nonce.clone())].into(),
        hosts: Default::default(),
    };
    // A network of that name made by someone else is not taken over.
    docker(&["network", "create", "--label", &world.label(), &outside]);
    let e = egress::prepare(&engine, &key, &AllowList::none(), &opts, &mut |_| {}).unwrap_err();
    assert_eq!(e.exit, Exit::Config, "{}", e.msg);
    assert!(e.msg.contains("not made for egress"), "{}", e.msg);
    docker(&["network", "rm", &outside]);

    let plan =
        egress::prepare(&engine, &key, &AllowList::none(), &opts, &mut |_| {}).expect("prepare");
    // The way out is made by prepare: it isolates its containers from each other.
    let out = engine
        .network(&outside)
        .unwrap()
        .expect("the outside network");
    assert_eq!(
        out.options
            .get("com.docker.network.bridge.enable_icc")
            .map(String::as_str),
        Some("false")
    );
    assert!(!out.internal);
    let net = engine
        .network(&plan.network)
        .unwrap()
        .expect("the internal network");
    assert!(net.internal);
    assert_eq!(
        net.options
            .get("com.docker.network.bridge.inhibit_ipv4")
            .map(String::as_str),
        Some("true")
    );
    let proxy = engine.inspect(&plan.proxy).unwrap().expect("the proxy");
    assert!(proxy.running);
    // The proxy runs hardened.
    let posture = docker(&[
        "inspect",
        "-f",
        "{{.HostConfig.ReadonlyRootfs}} {{.HostConfig.CapDrop}} {{.HostConfig.SecurityOpt}} {{.Config.User}}",
        &plan.proxy,
    ]);
    println!("proxy posture: {posture}");
    assert!(
        // Debian's `proxy` user, by number (Kubernetes checks a numeric one).
        posture.starts_with("true [ALL] [no-new-privileges] 13:13"),
        "{posture}"
    );
    assert!(egress::leftovers(&engine, None).unwrap().contains(&key));
    let mine = format!("{TEST_LABEL}={}", world.nonce);
    assert_eq!(
        egress::leftovers(&engine, Some(&mine)).unwrap(),
        vec![key.clone()],
        "the caller's label is on them"
    );

    // A second prepare of the same key replaces, never duplicates.
    egress::prepare(&engine, &key, &AllowList::none(), &opts, &mut |_| {}).expect("prepare again");
    let nets = engine
        .networks_with_label(&format!("{}={key}", egress::LABEL_KEY))
        .unwrap();
    assert_eq!(nets.len(), 1, "{nets:?}");

    egress::teardown(&engine, &key).unwrap();
    egress::teardown(&engine, &key).expect("teardown twice is fine");
    assert!(engine.inspect(&plan.proxy).unwrap().is_none());
    assert!(engine.network(&plan.network).unwrap().is_none());
    assert!(!egress::leftovers(&engine, None).unwrap().contains(&key));
    let e = egress::denials(&engine, &key).unwrap_err();
    assert_eq!(e.exit, Exit::NoInput);
}

/// Removes every network named exactly `.0` (there may be duplicates, which
/// `docker network rm NAME` calls ambiguous).
struct RmNet(String);
impl Drop for RmNet {
    fn drop(&mut self) {
        for id in networks_named(&self.0) {
            let _ = docker_out(&["network", "rm", &id]);
        }
    }
}

/// The ids of every network named exactly `name`, labelled or not.
fn networks_named(name: &str) -> Vec<String> {
    let o = docker_out(&[
        "network",
        "ls",
        "--filter",
        &format!("name={name}"),
        "--format",
        "{{.ID}} {{.Name}}",
    ]);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, n)| *n == name)
        .map(|(id, _)| id.to_string())
        .collect()
}

/// Runs `f(i)` on `n` threads released at once (after a seeded number of
/// yields each, so the interleaving differs from run to run).
fn at_once<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let gate = std::sync::Barrier::new(n);
    let spins: Vec<u64> = (0..n).map(|_| seeded::below(2000)).collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let (gate, f, spins) = (&gate, &f, spins[i]);
                s.spawn(move || {
                    gate.wait();
                    for _ in 0..spins {
                        std::thread::yield_now();
                    }
                    f(i)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("a racing thread"))
            .collect()
    })
}

/// Issue 47: prepares racing for one way out saw a sibling's new network
/// by name before the list by label did, and called it "not made for
/// egress" (exit 78); two siblings' duplicates made the name ambiguous.
/// Many rounds of many callers on a fresh name each: every one must get a
/// labelled network of that name, and the leftovers are only that.
#[test]
fn outside_network_race_never_calls_a_siblings_network_foreign() {
    let nonce = build_support::nonce();
    let seed = seeded::seed();
    let rounds = 8;
    let mut failed = Vec::new();
    for round in 0..rounds {
        // Each racer may make a duplicate, and every duplicate takes one of
        // the engine's ~30 default address pools, shared with other users.
        let threads = 12 + seeded::below(5) as usize;
        let name = format!("lw-egt-{nonce}-or{round}");
        let _rm = RmNet(name.clone());
        let got = at_once(threads, |_| {
            let engine = engine::connect_docker(None).expect("the Docker engine is reachable");
            egress::outside_network(&engine, &name)
        });
        let engine = engine::connect_docker(None).unwrap();
        let left = networks_named(&name);
        let errors: Vec<_> = got.iter().filter_map(|r| r.as_ref().err()).collect();
        println!(
            "seed {seed} round {round}: {threads} concurrent, {} failed, {} network(s) left named {name}",
            errors.len(),
            left.len()
        );
        failed.extend(errors.iter().map(|e| format!("round {round}: {e}")));
        for id in &left {
            let n = engine.network(id).unwrap().expect("listed just now");
            assert_eq!(
                n.labels.get(egress::LABEL_EGRESS).map(String::as_str),
                Some("outside"),
                "seed {seed}: {n:?}"
            );
        }
        assert!(
            !left.is_empty(),
            "seed {seed}: round {round} left no network"
        );
    }
    assert!(failed.is_empty(), "seed {seed}: {failed:#?}");
}

/// The engine does not keep network names unique: many sandboxes prepared
/// at once on a fresh engine must still end up sharing one way out, with
/// every proxy on it (issue 47: one of three failed with exit 78).
#[test]
fn concurrent_prepares_settle_on_one_outside_network() {
    let nonce = build_support::nonce();
    let seed = seeded::seed();
    let from = build_support::test_image("debian");
    for round in 0..2 {
        let n = 8 + seeded::below(5) as usize;
        let outside = format!("lw-egt-{nonce}-race{round}");
        let _rm_out = RmNet(outside.clone());
        let world = World {
            nonce: format!("egress-{nonce}-{round}"),
            keys: (0..n)
                .map(|i| format!("lw-egt-{nonce}-{round}r{i}"))
                .collect(),
        };
        let plans = at_once(n, |i| {
            let engine = engine::connect_docker(None).expect("the Docker engine is reachable");
            let opts = Options {
                proxy_from: from.clone(),
                outside: outside.clone(),
                ready_timeout: Duration::from_secs(120),
                labels: Default::default(),
                hosts: Default::default(),
            };
            egress::prepare(
                &engine,
                &world.keys[i],
                &AllowList::none(),
                &opts,
                &mut |_| {},
            )
            .map(|p| p.proxy)
        });
        let engine = engine::connect_docker(None).unwrap();
        let same_name: Vec<_> = engine
            .networks_with_label(&format!("{}=outside", egress::LABEL_EGRESS))
            .unwrap()
            .into_iter()
            .filter(|n| n.name == outside)
            .collect();
        println!(
            "seed {seed} round {round}: {n} concurrent prepares: {} ok, {} network(s) named {outside}",
            plans.iter().filter(|p| p.is_ok()).count(),
            same_name.len()
        );
        for p in &plans {
            assert!(p.is_ok(), "seed {seed}: {p:?}");
        }
        assert_eq!(same_name.len(), 1, "seed {seed}: {same_name:?}");
        for p in plans.into_iter().flatten() {
            assert!(
                same_name[0].containers.contains_key(&p),
                "seed {seed}: {p} is on the one outside network"
            );
        }
    }
}
