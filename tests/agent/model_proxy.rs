//! The model proxy as a guarded door (issue 35): lw-model-proxy
//! (crates/model-proxy) run on 127.0.0.1 in front of the project's scripted
//! model (examples/scripted-model/model.py, plain HTTP), both as host processes, so
//! the red-team cases need neither Docker nor a real CLI.  Each test prints
//! the proxy's peak RSS (VmHWM from /proc) and how many requests reached the
//! upstream.

use support::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent::{notice, proxy};
use common::TempDir;
use mailbox::layout::Root;
use mailbox::log::{Action, Log};
use mailbox::maildir::Sub;
use mailbox::message::Kind;

const SRC: &str = env!("CARGO_MANIFEST_DIR");
/// The proxy under test.
const PROXY: &str = "lw-model-proxy";
/// The proxy's peak RSS may not pass this, whatever the agent sends (its
/// container is limited to 128 MiB).
const RSS_BOUND_KIB: u64 = 96 << 10;

struct Proc {
    child: Child,
    port: u16,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `script` (a python file of the project, or a command the
/// workspace builds) and waits for the line holding `ready`; the port is the
/// number after the last ':' or "port " on that line.
fn spawn(script: &str, env: &[(&str, String)], ready: &str) -> Proc {
    let mut cmd = if script.ends_with(".py") {
        let mut c = Command::new("python3");
        c.arg(Path::new(SRC).join(script));
        c
    } else if script == PROXY
        && let Some(other) = std::env::var_os("LW_TEST_MODEL_PROXY").filter(|v| !v.is_empty())
    {
        // Another proxy to measure against (a .py is run by python3).
        let other = PathBuf::from(other);
        if other.extension().is_some_and(|e| e == "py") {
            let mut c = Command::new("python3");
            c.arg(other);
            c
        } else {
            Command::new(other)
        }
    } else {
        Command::new(support::bin(script))
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .expect("the proxy and python3 (the scripted model) run");
    let out: Box<dyn Read + Send> = if script.contains("scripted-model") {
        Box::new(child.stdout.take().unwrap())
    } else {
        Box::new(child.stderr.take().unwrap())
    };
    let mut lines = BufReader::new(out).lines();
    let line = lines
        .by_ref()
        .map_while(|l| l.ok())
        .find(|l| l.contains(ready))
        .unwrap_or_else(|| panic!("{script} ended before saying '{ready}'"));
    // Keep draining its output so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines.map_while(|l| l.ok()) {});
    let port = line
        .split([':', ' ', ','])
        .filter_map(|w| w.parse::<u16>().ok())
        .find(|p| *p > 1024)
        .expect("a port on the ready line");
    Proc { child, port }
}

struct Door {
    dir: TempDir,
    model: Proc,
    proxy: Proc,
    env: Vec<(&'static str, String)>,
}

impl Door {
    /// The scripted model and a proxy in front of it with `caps`
    /// (`LW_MODEL_MAX_*` variables).
    fn new(tag: &str, caps: &[(&'static str, &str)]) -> Door {
        Door::api(tag, caps, "POST /v1/messages", "x-api-key")
    }

    /// The same, for the API of another kit: its endpoints and key header.
    fn api(tag: &str, caps: &[(&'static str, &str)], endpoint: &str, header: &str) -> Door {
        let dir = TempDir::new(tag);
        std::fs::create_dir_all(dir.join("key")).unwrap();
        std::fs::create_dir_all(dir.join("usage")).unwrap();
        std::fs::write(dir.join("key/key"), "sk-the-real-key\n").unwrap();
        let model = spawn(
            "examples/scripted-model/model.py",
            &[
                ("LW_SCRIPT", "[]".into()),
                ("LW_MODEL_TLS", "0".into()),
                ("LW_MODEL_PORT", "0".into()),
                (
                    "LW_MODEL_OUT",
                    dir.join("requests.jsonl").display().to_string(),
                ),
            ],
            "scripted model ready",
        );
        let mut env = vec![
            (
                "LW_MODEL_UPSTREAM",
                format!("http://127.0.0.1:{}", model.port),
            ),
            ("LW_MODEL_ENDPOINT", endpoint.into()),
            ("LW_MODEL_KEY_HEADER", header.into()),
            ("LW_MODEL_DIR", dir.join("key").display().to_string()),
            ("LW_MODEL_USAGE", dir.join("usage").display().to_string()),
            ("LW_MODEL_LISTEN", "127.0.0.1".into()),
            ("LW_MODEL_PORT", "0".into()),
        ];
        for (k, v) in caps {
            env.push((k, v.to_string()));
        }
        let proxy = spawn(PROXY, &env, "lw-model-proxy: listening");
        Door {
            dir,
            model,
            proxy,
            env,
        }
    }

    /// Kills the proxy (SIGKILL, as the OOM killer would) and starts another
    /// on the same directories, as the engine does.
    fn restart(&mut self) {
        self.proxy.child.kill().unwrap();
        self.proxy.child.wait().unwrap();
        self.proxy = spawn(PROXY, &self.env, "lw-model-proxy: listening");
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.proxy.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    }

    /// Requests that reached the scripted model.
    fn upstream(&self) -> usize {
        std::fs::read_to_string(self.dir.join("requests.jsonl"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    /// The proxy's (current, peak) resident memory in KiB.
    fn rss(&self) -> (u64, u64) {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.proxy.child.id()))
            .expect("the proxy is alive");
        let field = |name: &str| {
            s.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    fn alive(&mut self) -> bool {
        self.proxy.child.try_wait().unwrap().is_none()
    }

    fn usage(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.dir.join("usage/usage.json")).unwrap()).unwrap()
    }

    /// One whole request on a connection of its own.
    fn post(&self, prompt: &str) -> Reply {
        let body = serde_json::json!({"model": "m", "stream": true,
            "messages": [{"role": "user", "content": prompt}]})
        .to_string();
        let mut s = self.connect();
        write!(
            s,
            "POST /v1/messages?beta=true HTTP/1.1\r\nHost: lw-model:8080\r\nx-api-key: placeholder\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        read_reply(&mut s)
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one answer to the end of the connection; decodes chunks.
fn read_reply(s: &mut TcpStream) -> Reply {
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_reply(&raw)
}

fn parse_reply(raw: &[u8]) -> Reply {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no answer head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        while let Some(i) = rest.windows(2).position(|w| w == b"\r\n") {
            let n =
                usize::from_str_radix(std::str::from_utf8(&rest[..i]).unwrap().trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            body.extend_from_slice(&rest[i + 2..i + 2 + n]);
            rest = &rest[i + 4 + n..];
        }
    } else {
        body = rest.to_vec();
    }
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// Sends a head, then `total` bytes of body from a thread of its own while
/// this thread reads the answer; returns it and the bytes the proxy took.
fn flood(door: &Door, head: &str, total: u64, chunked: bool) -> (Reply, u64) {
    let mut s = door.connect();
    s.write_all(head.as_bytes()).unwrap();
    let mut w = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let block = vec![b'x'; 1 << 20];
        let mut sent = 0u64;
        while sent < total {
            let r = if chunked {
                write!(w, "{:x}\r\n", block.len())
                    .and_then(|_| w.write_all(&block))
                    .and_then(|_| w.write_all(b"\r\n"))
            } else {
                w.write_all(&block)
            };
            if r.is_err() {
                break;
            }
            sent += block.len() as u64;
        }
        sent
    });
    let reply = read_reply(&mut s);
    let _ = s.shutdown(std::net::Shutdown::Both);
    (reply, sender.join().unwrap())
}

#[test]
fn a_300_mib_body_is_refused_413_while_it_streams_and_the_proxy_stays_up() {
    let mut door = Door::new("proxy-300mib", &[]);
    let total = 300u64 << 20;
    let t = Instant::now();
    let (r, sent) = flood(
        &door,
        &format!("POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: {total}\r\n\r\n"),
        total,
        false,
    );
    assert_eq!(r.status, 413, "{r:?}");
    assert!(r.body.contains("request_too_large"), "{}", r.body);
    assert!(r.body.contains("max-request"), "{}", r.body);
    let (chunked, sent_chunked) = flood(
        &door,
        "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nTransfer-Encoding: chunked\r\n\r\n",
        total,
        true,
    );
    assert_eq!(
        chunked.status, 413,
        "a chunked body is counted as it streams: {chunked:?}"
    );
    assert!(door.alive(), "the proxy is still running");
    let (rss, peak) = door.rss();
    let ok = door.post("after the flood");
    assert_eq!(ok.status, 200, "the next request is forwarded: {ok:?}");
    println!(
        "figure: 300 MiB body (content-length): 413, {} MiB sent before the proxy closed; chunked: 413, {} MiB sent; {:.1} s; proxy RSS {rss} KiB, peak {peak} KiB (bound {RSS_BOUND_KIB} KiB); requests that reached the upstream: {}",
        sent >> 20,
        sent_chunked >> 20,
        t.elapsed().as_secs_f64(),
        door.upstream()
    );
    assert!(peak < RSS_BOUND_KIB, "peak RSS {peak} KiB");
    assert_eq!(
        door.upstream(),
        1,
        "only the request after the flood reached the model"
    );
}

#[test]
fn a_thousand_slow_parallel_requests_leave_the_proxy_up_and_small() {
    let mut door = Door::new("proxy-slow", &[]);
    let (_, before) = door.rss();
    let mut conns = Vec::new();
    for i in 0..1000 {
        let mut s = door.connect();
        // Half send a head that never ends (slowloris); half a whole head
        // announcing 1 MiB, then a trickle.  Every one holds its place as
        // long as the proxy lets it.
        let _ = if i % 2 == 0 {
            write!(
                s,
                "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nx-slow: {i}\r\n"
            )
        } else {
            write!(
                s,
                "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: {}\r\n\r\n{{\"slow\":{i},",
                1 << 20
            )
        };
        conns.push(s);
    }
    // Each connection is held or answered 503 at once; an answer not in
    // within 20 ms counts as held.
    let mut refused = 0;
    let mut held = 0;
    for s in &mut conns {
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(n) if n > 0 => {
                let r = parse_reply(&buf[..n]);
                assert_eq!(r.status, 503, "{r:?}");
                assert_eq!(r.header("retry-after"), Some("1"));
                refused += 1;
            }
            _ => held += 1,
        }
    }
    assert!(door.alive(), "the proxy is still running");
    let (rss, peak) = door.rss();
    println!(
        "figure: 1000 parallel slow requests (500 endless heads, 500 bodies of 1 MiB trickling): {held} held, {refused} answered 503 (over 256 connections or 32 MiB of bodies at once); proxy RSS {before} KiB before, {rss} KiB with them open, peak {peak} KiB (bound {RSS_BOUND_KIB} KiB); requests that reached the upstream: {}",
        door.upstream()
    );
    assert!(refused > 0 && held > 0, "{held} held, {refused} refused");
    assert!(
        held <= 256,
        "at most 256 connections are served at once: {held}"
    );
    assert!(peak < RSS_BOUND_KIB, "peak RSS {peak} KiB");
    assert_eq!(door.upstream(), 0);
    drop(conns);
    // The proxy notices the closed ones as it goes; meanwhile it answers
    // 503 with retry-after, which the agent's CLI honours, as here.
    let mut ok = door.post("after the slow ones");
    for _ in 0..10 {
        if ok.status != 503 {
            break;
        }
        let wait: u64 = ok.header("retry-after").unwrap().parse().unwrap();
        std::thread::sleep(Duration::from_secs(wait));
        ok = door.post("after the slow ones");
    }
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(door.upstream(), 1);
}

#[test]
fn folded_and_duplicate_hop_headers_are_refused_400() {
    let door = Door::new("proxy-headers", &[]);
    let cases = [
        (
            "folded",
            "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nx-note: a\r\n b\r\nContent-Length: 2\r\n\r\n{}",
            400,
        ),
        (
            "two content-length",
            "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
            400,
        ),
        (
            "two host",
            "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nHost: api.anthropic.com\r\nContent-Length: 2\r\n\r\n{}",
            400,
        ),
        (
            "length and chunked",
            "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            400,
        ),
        (
            "two transfer-encoding",
            "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
        (
            "bare LF in a header",
            "POST /v1/messages HTTP/1.1\r\nHost: lw-model\nX: y\r\nContent-Length: 2\r\n\r\n{}",
            400,
        ),
        (
            "other path",
            "POST /v1/complete HTTP/1.1\r\nHost: lw-model\r\nContent-Length: 2\r\n\r\n{}",
            403,
        ),
        (
            "absolute URL",
            "POST https://api.anthropic.com/v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: 2\r\n\r\n{}",
            403,
        ),
        (
            "connect",
            "CONNECT api.anthropic.com:443 HTTP/1.1\r\n\r\n",
            501,
        ),
    ];
    for (what, raw, want) in cases {
        let mut s = door.connect();
        s.write_all(raw.as_bytes()).unwrap();
        let r = read_reply(&mut s);
        assert_eq!(r.status, want, "{what}: {r:?}");
        assert!(
            r.body.contains("\"type\": \"error\""),
            "{what}: the provider's shape: {}",
            r.body
        );
    }
    assert_eq!(door.upstream(), 0);
    let ok = door.post("fine");
    assert_eq!(ok.status, 200);
    let seen = std::fs::read_to_string(door.dir.join("requests.jsonl")).unwrap();
    assert!(seen.contains("sk-the-real-key") && !seen.contains("placeholder"));
}

#[test]
fn a_head_with_bare_lf_line_ends_is_refused_400_at_once() {
    let door = Door::new("proxy-bare-lf", &[]);
    for (what, raw) in [
        (
            "every line",
            "POST /v1/messages HTTP/1.1\nHost: lw-model\nContent-Length: 2\n\n{}",
        ),
        (
            "the last",
            "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: 2\r\n\n{}",
        ),
    ] {
        let t = Instant::now();
        let mut s = door.connect();
        s.write_all(raw.as_bytes()).unwrap();
        let r = read_reply(&mut s);
        println!(
            "figure: a head with bare LF ({what}) answered {} in {:.3} s",
            r.status,
            t.elapsed().as_secs_f64()
        );
        assert_eq!(r.status, 400, "{what}: {r:?}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{what}: {:?}",
            t.elapsed()
        );
    }
    assert_eq!(door.upstream(), 0);
    assert_eq!(door.post("fine").status, 200);
}

/// Steady traffic over a rate cap: a request slips through each time the
/// minute frees one, and the person hears of the cap once (issue 40: 6
/// notices in 75 s).
#[test]
fn steady_traffic_over_a_rate_cap_is_one_episode() {
    let door = Door::new("proxy-steady", &[("LW_MODEL_MAX_RPM", "2")]);
    let t = Instant::now();
    let (mut ok, mut refused) = (0, 0);
    let mut slipped = false;
    // Until a request slips through after the first refusals, and a
    // refusal follows it (the minute frees the first two).
    while t.elapsed() < Duration::from_secs(90) {
        let r = door.post("steady");
        match r.status {
            200 => {
                ok += 1;
                slipped = refused > 0;
            }
            429 => {
                refused += 1;
                if slipped {
                    break;
                }
            }
            s => panic!("status {s}: {r:?}"),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let caps = door.usage()["caps"].as_array().unwrap().clone();
    println!(
        "figure: max-rpm 2 under steady traffic for {:.1} s: {ok} forwarded, {refused} answered 429, {} episode(s)",
        t.elapsed().as_secs_f64(),
        caps.len()
    );
    assert!(slipped, "a request slipped through the freed minute");
    assert_eq!(caps.len(), 1, "told once: {caps:?}");
}

#[test]
fn fifty_requests_in_three_seconds_over_a_cap_of_20_a_minute() {
    let door = Door::new("proxy-rpm", &[("LW_MODEL_MAX_RPM", "20")]);
    let t = Instant::now();
    let mut statuses = Vec::new();
    let mut retry = Vec::new();
    for i in 0..50 {
        let r = door.post(&format!("request {i}"));
        if r.status == 429 {
            assert!(
                r.body.contains("rate_limit_error") && r.body.contains("max-rpm"),
                "{}",
                r.body
            );
            retry.push(r.header("retry-after").unwrap().parse::<u64>().unwrap());
        }
        statuses.push(r.status);
    }
    let took = t.elapsed();
    let forwarded = statuses.iter().filter(|s| **s == 200).count();
    println!(
        "figure: 50 requests in {:.2} s over max-rpm 20: {forwarded} forwarded, {} answered 429 (retry-after {}-{} s); requests that reached the upstream: {}",
        took.as_secs_f64(),
        retry.len(),
        retry.iter().min().unwrap(),
        retry.iter().max().unwrap(),
        door.upstream()
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(forwarded, 20);
    assert_eq!(door.upstream(), 20);
    assert!(retry.iter().all(|r| (1..=60).contains(r)));
    let u = door.usage();
    assert_eq!(u["forwarded"], 20);
    assert_eq!(u["refused"], 30);
    let caps = u["caps"].as_array().unwrap();
    assert_eq!(caps.len(), 1, "one episode, told once: {caps:?}");
    assert_eq!(caps[0]["cap"], "max-rpm");

    // What lw-sandbox run does with it: one status to the person, logged as
    // an escalation and delivered into human/, however often it is told.
    std::fs::create_dir_all(door.dir.join("root")).unwrap();
    let root = Root::new(door.dir.join("root"));
    root.init().unwrap();
    let usage: proxy::Usage =
        serde_json::from_slice(&std::fs::read(door.dir.join("usage/usage.json")).unwrap()).unwrap();
    let told = notice::tell_caps(&root, "api", "claude", &usage).unwrap();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].contains("agent.claude.max-rpm (20 requests a minute)"),
        "{told:?}"
    );
    assert!(
        notice::tell_caps(&root, "api", "claude", &usage)
            .unwrap()
            .is_empty()
    );
    let human = common::ls(&root.human().sub(Sub::New));
    assert_eq!(human.len(), 1, "{human:?}");
    let (entries, _) = Log::new(root.log_dir()).entries().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].decision.action, Action::Escalate);
    let m = entries[0].message.as_ref().unwrap();
    assert_eq!(
        (m.kind, m.to.clone()),
        (Kind::Status, vec!["human".to_string()])
    );
    println!("figure: the person is told once: {}", m.subject);
}

#[test]
fn a_token_cap_crossed_mid_stream_refuses_the_next_requests() {
    let door = Door::new(
        "proxy-tokens",
        &[
            ("LW_MODEL_MAX_TOKENS_RUN", "1000"),
            ("LW_MODEL_KIT", "claude"),
        ],
    );
    std::fs::write(door.dir.join("key/run"), "run-1\n").unwrap();
    let gate: PathBuf = door.dir.join("go");
    // Answer A: its first event says 1000 input tokens; the rest waits on `gate`.
    let body = serde_json::json!({"model": "m", "stream": true, "messages": [{"role": "user",
        "content": format!("USAGE-IN=1000 PAUSE-UNTIL={}", gate.display())}]})
    .to_string();
    let mut a = door.connect();
    write!(
        a,
        "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("message_start") {
        let n = a.read(&mut buf).unwrap();
        assert!(n > 0, "A ended early");
        got.extend_from_slice(&buf[..n]);
    }
    // A is mid-stream; its usage crossed the cap.
    let b = door.post("B");
    assert_eq!(b.status, 429, "{b:?}");
    // The cap as .loopwright/config spells it, the kit named (issue 40).
    assert!(b.body.contains("agent.claude.max-tokens-run"), "{}", b.body);
    assert!(b.header("retry-after").is_some());
    std::fs::write(&gate, "").unwrap();
    let mut rest = Vec::new();
    a.read_to_end(&mut rest).unwrap();
    got.extend_from_slice(&rest);
    let a = parse_reply(&got);
    assert_eq!(a.status, 200);
    assert!(a.body.contains("message_stop"), "A is delivered whole");
    let u = door.usage();
    println!(
        "figure: token cap 1000 a run crossed mid-stream: tokens counted {} (run), answer delivered whole, next request 429; requests that reached the upstream: {}",
        u["tokens_run"],
        door.upstream()
    );
    assert_eq!(u["tokens_run"], 1005);
    assert_eq!(
        (u["forwarded"].as_u64(), u["refused"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(door.upstream(), 1);
    // A new run (lw-sandbox run writes the file) starts at 0, and a
    // non-streamed answer is counted too.
    std::fs::write(door.dir.join("key/run"), "run-2\n").unwrap();
    let c = door.post("NO-STREAM USAGE-IN=40");
    assert_eq!(c.status, 200, "{c:?}");
    assert_eq!(door.usage()["tokens_run"], 45);
    assert_eq!(door.usage()["tokens_total"], 1050);
    assert_eq!(door.upstream(), 2);
}

#[test]
fn an_hour_cap_answers_429_with_the_wait_and_the_latency_added_is_small() {
    let door = Door::new("proxy-hour", &[("LW_MODEL_MAX_TOKENS_HOUR", "100")]);
    // Latency: straight to the model vs through the proxy (median of 15).
    let direct = |prompt: &str| {
        let body =
            serde_json::json!({"messages": [{"role": "user", "content": prompt}]}).to_string();
        let mut s = TcpStream::connect(("127.0.0.1", door.model.port)).unwrap();
        write!(
            s,
            "POST /v1/messages HTTP/1.1\r\nHost: m\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        read_reply(&mut s)
    };
    let median = |f: &dyn Fn() -> Reply| {
        let mut t: Vec<f64> = (0..15)
            .map(|_| {
                let s = Instant::now();
                assert_eq!(f().status, 200);
                s.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        t.sort_by(f64::total_cmp);
        t[7]
    };
    let d = median(&|| direct("USAGE-IN=0"));
    let before = door.upstream();
    let p = median(&|| door.post("USAGE-IN=0"));
    println!(
        "figure: whole answer straight from the model vs through the proxy (median of 15): {d:.1} vs {p:.1} ms ({:+.1})",
        p - d
    );
    let r = door.post("USAGE-IN=200");
    assert_eq!(r.status, 200);
    let r = door.post("next");
    assert_eq!(r.status, 429, "{r:?}");
    let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=3660).contains(&wait), "{wait}");
    assert!(r.body.contains("max-tokens-hour"));
    assert_eq!(door.upstream(), before + 15 + 1);
    // A restarted proxy keeps its hour.
    let mut door = door;
    door.restart();
    let r = door.post("after the restart");
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(door.upstream(), before + 15 + 1);
}

/// The gemini kit's door: Gemini's three routes, as Gemini CLI 0.61.0 calls
/// them, forwarded with the real key as `x-goog-api-key` and tokens counted
/// from `usageMetadata`; everything else refused in Google's error shape: a
/// path outside the list, a model name that is a path, a `key=` smuggled in
/// the query (dropped, never forwarded), a body over the cap, a token cap.
#[test]
fn gemini_routes_forward_with_the_key_and_refuse_in_googles_shape() {
    let kit = agent::kit::find(None, "gemini").unwrap();
    let door = Door::api(
        "proxy-gemini",
        &[
            ("LW_MODEL_MAX_TOKENS_RUN", "40"),
            ("LW_MODEL_MAX_REQUEST", "100000"),
            ("LW_MODEL_KIT", "gemini"),
        ],
        &kit.endpoint(),
        kit.key_header.as_str(),
    );
    std::fs::write(door.dir.join("key/run"), "run-1\n").unwrap();
    let send = |head: &str, body: &str| {
        let mut s = door.connect();
        write!(
            s,
            "{head} HTTP/1.1\r\nHost: lw-model:8080\r\nx-goog-api-key: lw-placeholder\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        read_reply(&mut s)
    };
    let ask = serde_json::json!({"contents": [{"role": "user", "parts": [{"text": "hello"}]}]})
        .to_string();
    let r = send(
        "POST /v1beta/models/gemini-2.5-pro:streamGenerateContent?key=lw-smuggled&alt=sse&%6Bey=lw-smuggled&API_KEY=lw-smuggled",
        &ask,
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.starts_with("data: {"), "SSE: {}", r.body);
    assert_eq!(door.usage()["tokens_run"], 15, "usageMetadata: 10 + 5");
    let r = send("POST /v1beta/models/gemini-2.5-flash:generateContent", &ask);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("usageMetadata"), "{}", r.body);
    assert_eq!(
        door.usage()["tokens_run"],
        30,
        "a whole answer is counted too"
    );
    let r = send("POST /v1beta/models/gemini-2.5-pro:countTokens", &ask);
    assert_eq!(r.status, 200, "{r:?}");
    let reqs: Vec<serde_json::Value> = std::fs::read_to_string(door.dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(reqs.len(), 3);
    assert_eq!(
        reqs[0]["path"],
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    );
    for r in &reqs {
        assert_eq!(r["headers"]["x-goog-api-key"], "sk-the-real-key", "{r}");
        let all = r.to_string();
        assert!(
            !all.contains("lw-placeholder")
                && !all.contains("lw-smuggled")
                && !all.contains("key="),
            "the agent's credentials never leave: {r}"
        );
    }
    // Outside the list: other methods of the API, a model name that is a
    // path, the endpoints of other kits.  403, in Google's shape.
    for head in [
        "GET /v1beta/models",
        "POST /v1beta/models/m:embedContent",
        "POST /v1beta/models/a/b:generateContent",
        "POST /v1beta/models/..%2f..%2fv1beta%2ffiles:generateContent",
        "POST /v1beta/models/:generateContent",
        "POST /v1beta/tunedModels/m:generateContent",
        "POST /upload/v1beta/files",
        "POST /v1/messages",
        "GET /v1beta/models/m:streamGenerateContent?alt=sse",
    ] {
        let r = send(head, &ask);
        assert_eq!(r.status, 403, "{head}: {r:?}");
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["error"]["code"], 403, "{head}: {}", r.body);
        assert_eq!(v["error"]["status"], "PERMISSION_DENIED", "{}", r.body);
    }
    // Two keys in one head: the second is how one would be smuggled past.
    let r = send(
        "POST /v1beta/models/m:generateContent HTTP/1.1\r\nx-goog-api-key: lw-second\r\nX-Foo: bar",
        &ask,
    );
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.contains("duplicate x-goog-api-key"), "{}", r.body);
    assert_eq!(door.upstream(), 3, "nothing refused reached the upstream");
    // A body over agent.gemini.max-request.
    let big = "x".repeat(100_001);
    let r = send("POST /v1beta/models/m:generateContent", &big);
    assert_eq!(r.status, 413, "{r:?}");
    assert!(r.body.contains("agent.gemini.max-request"), "{}", r.body);
    // Over the run's tokens (30 of 40, then 15 more): the next one is 429
    // as Google says it, with retry-after.
    let r = send("POST /v1beta/models/m:streamGenerateContent?alt=sse", &ask);
    assert_eq!(r.status, 200, "{r:?}");
    let r = send("POST /v1beta/models/m:streamGenerateContent?alt=sse", &ask);
    assert_eq!(r.status, 429, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        (v["error"]["code"].as_u64(), v["error"]["status"].as_str()),
        (Some(429), Some("RESOURCE_EXHAUSTED")),
        "{}",
        r.body
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("agent.gemini.max-tokens-run"),
        "{}",
        r.body
    );
    assert!(r.header("retry-after").is_some());
    println!(
        "figure: gemini door: 4 forwarded, 9 paths refused 403, a second key header 400, 1 body 413, 1 request 429; tokens counted {}; requests that reached the upstream {}",
        door.usage()["tokens_run"],
        door.upstream()
    );
    assert_eq!(door.upstream(), 4);
}

/// Writes `raw` on a connection of its own and reads the answer to its end.
fn exchange(door: &Door, raw: &[u8]) -> Reply {
    let mut s = door.connect();
    s.write_all(raw).unwrap();
    read_reply(&mut s)
}

/// Hostile heads (issue 42): a slowloris head is cut off in bounded time, a
/// head over 32 KiB is 431, and a chunked body over the cap is 413, none
/// reaching the upstream and the proxy's memory staying small.
#[test]
fn a_slow_head_is_cut_off_and_a_big_head_or_chunked_body_is_refused() {
    let mut door = Door::new("proxy-hostile-head", &[("LW_MODEL_MAX_REQUEST", "1000")]);
    let t = Instant::now();
    let mut s = door.connect();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s.write_all(b"POST /v1/messages HTTP/1.1\r\n").unwrap();
    let mut closed = false;
    for i in 0..100 {
        // One header line every 200 ms, for as long as the proxy listens.
        if write!(s, "x-slow-{i}: a\r\n").is_err() {
            closed = true;
            break;
        }
        match s.read(&mut [0u8; 512]) {
            Ok(0) => {
                closed = true;
                break;
            }
            Err(e)
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                closed = true;
                break;
            }
            _ => {}
        }
    }
    let slow = t.elapsed();
    assert!(closed, "the slow head was never cut off");
    assert!(slow < Duration::from_secs(15), "{slow:?}");
    let big = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nx-big: {}\r\nContent-Length: 2\r\n\r\n{{}}",
        "a".repeat(40 << 10)
    );
    let r = exchange(&door, big.as_bytes());
    assert_eq!(r.status, 431, "{r:?}");
    let mut chunked =
        b"POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    for _ in 0..40 {
        chunked.extend_from_slice(b"32\r\n");
        chunked.extend_from_slice(&[b'x'; 50]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let r = exchange(&door, &chunked);
    assert_eq!(
        r.status, 413,
        "2000 bytes in 40 chunks over a cap of 1000: {r:?}"
    );
    assert!(r.body.contains("max-request"), "{}", r.body);
    assert!(door.alive());
    let (_, peak) = door.rss();
    println!(
        "figure: a slowloris head cut off after {:.1} s; a 40 KiB head 431; a chunked body over the cap 413; proxy peak RSS {peak} KiB; requests that reached the upstream: {}",
        slow.as_secs_f64(),
        door.upstream()
    );
    assert_eq!(door.upstream(), 0);
    assert_eq!(door.post("fine").status, 200);
}

/// Request smuggling (issue 42): a head two readers could frame two ways is
/// refused 400 before any byte of it is forwarded; a second request
/// pipelined after the first is never forwarded; an absolute URL naming
/// another host (or the upstream itself) is 403.
#[test]
fn smuggled_and_pipelined_requests_never_reach_the_upstream() {
    let door = Door::new("proxy-smuggle", &[]);
    let model = door.model.port;
    let second = "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: 2\r\n\r\n{}";
    let cases = [
        (
            "content-length then transfer-encoding",
            format!(
                "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{second}"
            ),
            400,
        ),
        (
            "transfer-encoding then content-length",
            format!(
                "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nTransfer-Encoding: chunked\r\nContent-Length: 80\r\n\r\n0\r\n\r\n{second}"
            ),
            400,
        ),
        (
            "two content-length that differ",
            format!(
                "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: 0\r\nContent-Length: 80\r\n\r\n{second}"
            ),
            400,
        ),
        (
            "a content-length list",
            "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: 2, 2\r\n\r\n{}"
                .to_string(),
            400,
        ),
        (
            "a coding before chunked",
            format!(
                "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nTransfer-Encoding: identity, chunked\r\n\r\n0\r\n\r\n{second}"
            ),
            400,
        ),
        (
            "a space before the colon",
            format!(
                "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length : 80\r\n\r\n{second}"
            ),
            400,
        ),
        (
            "absolute URL to another host",
            "POST http://evil.example/v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: 2\r\n\r\n{}".to_string(),
            403,
        ),
        (
            "absolute URL to the upstream itself",
            format!(
                "POST http://127.0.0.1:{model}/v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: 2\r\n\r\n{{}}"
            ),
            403,
        ),
        (
            "a path that starts with two slashes",
            "POST //evil.example/v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: 2\r\n\r\n{}".to_string(),
            403,
        ),
    ];
    for (what, raw, want) in &cases {
        let r = exchange(&door, raw.as_bytes());
        assert_eq!(r.status, *want, "{what}: {r:?}");
        assert_eq!(door.upstream(), 0, "{what}: nothing reached the upstream");
    }
    // A whole request, and a second in the same write: the first is
    // forwarded, the second (to a path outside the list, with a key of its
    // own) never.
    let body = r#"{"model": "m", "messages": [{"role": "user", "content": "first"}]}"#;
    let raw = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nContent-Length: {}\r\n\r\n{body}POST /v1/complete HTTP/1.1\r\nHost: lw-model\r\nAuthorization: Bearer lw-smuggled\r\nContent-Length: 2\r\n\r\n{{}}",
        body.len()
    );
    let mut s = door.connect();
    s.write_all(raw.as_bytes()).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got);
    let answers = text.matches("HTTP/1.1 ").count();
    let first = parse_reply(&got);
    assert_eq!(first.status, 200, "{first:?}");
    let seen = std::fs::read_to_string(door.dir.join("requests.jsonl")).unwrap();
    println!(
        "figure: {} smuggling heads refused before the upstream; a pipelined pair: {answers} answer(s), {} request(s) reached the upstream",
        cases.len(),
        door.upstream()
    );
    assert_eq!(door.upstream(), 1, "{seen}");
    assert!(
        !seen.contains("/v1/complete") && !seen.contains("lw-smuggled"),
        "{seen}"
    );
}

/// A key in every place an agent might put one: each credential header,
/// the query under each name Google reads (encoded too), a second key
/// header, and a Host naming another upstream.  Only the real key, once,
/// in the kit's header, ever reaches the model.
#[test]
fn a_key_the_agent_sends_never_reaches_the_upstream() {
    let door = Door::new("proxy-keys", &[]);
    let body = r#"{"model": "m", "messages": [{"role": "user", "content": "keys"}]}"#;
    let heads = [
        "Authorization: Bearer lw-smuggled",
        "Proxy-Authorization: Basic lw-smuggled",
        "x-api-key: lw-smuggled",
        "X-API-KEY: lw-smuggled",
        "api-key: lw-smuggled",
        "Cookie: session=lw-smuggled",
        "x-goog-api-key: lw-smuggled",
        "OpenAI-Organization: lw-smuggled",
        "OpenAI-Project: lw-smuggled",
        "Host: lw-smuggled.example",
    ];
    for h in heads {
        let raw = format!(
            "POST /v1/messages?key=lw-smuggled&api_key=lw-smuggled&%6B%65%79=lw-smuggled&KEY=lw-smuggled&beta=true HTTP/1.1\r\nHost: lw-model\r\n{h}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .replacen("Host: lw-model\r\nHost:", "Host:", 1);
        let r = exchange(&door, raw.as_bytes());
        assert_eq!(r.status, 200, "{h}: {r:?}");
    }
    for dup in [
        "x-api-key: lw-placeholder\r\nx-api-key: lw-smuggled",
        "x-api-key: lw-placeholder\r\nX-Api-Key: lw-smuggled",
        "Authorization: Bearer a\r\nauthorization: Bearer lw-smuggled",
    ] {
        let raw = format!(
            "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\n{dup}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let r = exchange(&door, raw.as_bytes());
        assert_eq!(r.status, 400, "{dup}: {r:?}");
    }
    let seen: Vec<serde_json::Value> = std::fs::read_to_string(door.dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(seen.len(), heads.len());
    for r in &seen {
        assert_eq!(r["headers"]["x-api-key"], "sk-the-real-key", "{r}");
        assert_eq!(r["path"], "/v1/messages?beta=true", "{r}");
        assert!(
            r["headers"]["host"]
                .as_str()
                .unwrap()
                .starts_with("127.0.0.1:"),
            "{r}"
        );
        assert!(!r.to_string().contains("lw-smuggled"), "{r}");
    }
    println!(
        "figure: a key in {} places forwarded without it, 3 second key headers refused 400",
        heads.len() + 4
    );
}

/// Figures: the proxy's memory idle and with 20 answers streaming at once
/// (each paused mid-stream until all 20 are), and that all 20 are delivered
/// whole.  `LW_TEST_MODEL_PROXY=PATH` measures another proxy the same way
/// (the python one it replaced, or a release build).
#[test]
fn twenty_streams_at_once_are_delivered_whole_in_little_memory() {
    let door = Door::new("proxy-twenty", &[]);
    std::thread::sleep(Duration::from_millis(200));
    let (idle, _) = door.rss();
    let gate: PathBuf = door.dir.join("go");
    let body = serde_json::json!({"model": "m", "stream": true, "messages": [{"role": "user",
        "content": format!("USAGE-IN=10 PAUSE-UNTIL={}", gate.display())}]})
    .to_string();
    // One after another (the scripted model's listen queue is short), each
    // begun (its first event in) before the next is sent; none ends until
    // all 20 are streaming.
    let mut streams: Vec<(TcpStream, Vec<u8>)> = Vec::new();
    for _ in 0..20 {
        let mut s = door.connect();
        write!(
            s,
            "POST /v1/messages HTTP/1.1\r\nHost: lw-model\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains("message_start") {
            let n = s.read(&mut buf).unwrap();
            assert!(
                n > 0,
                "an answer ended early: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        streams.push((s, got));
    }
    let (busy, _) = door.rss();
    std::fs::write(&gate, "").unwrap();
    for (s, got) in &mut streams {
        s.read_to_end(got).unwrap();
        let r = parse_reply(got);
        assert_eq!(r.status, 200);
        assert!(r.body.contains("message_stop"), "delivered whole");
    }
    let (after, peak) = door.rss();
    println!(
        "figure: proxy RSS idle {idle} KiB, with 20 answers streaming {busy} KiB, after {after} KiB, peak {peak} KiB; tokens counted {}",
        door.usage()["tokens_total"]
    );
    assert_eq!(door.upstream(), 20);
    assert!(peak < RSS_BOUND_KIB, "peak RSS {peak} KiB");
}
