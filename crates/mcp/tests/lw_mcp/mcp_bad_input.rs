//! lw-mcp against input no SDK would send: garbage, truncated frames, an
//! oversized line, a 10 MB argument, unknown tools and methods, a client that
//! leaves in the middle of a wait, a mailbox that vanishes.  Each gets the
//! JSON-RPC answer the protocol asks for, the server stays up where the
//! protocol allows, and nothing half-written is left in the outbox.

use support::mcp as mcp_support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mcp_support::*;
use serde_json::{Value, json};

struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Session {
    fn start(root: &Root, name: &str) -> Session {
        Session::start_with(root, name, &[])
    }

    fn start_with(root: &Root, name: &str, env: &[(&str, &str)]) -> Session {
        let mut c = Command::new(bin("lw-mcp"));
        for (k, v) in root.env(name) {
            c.env(k, v);
        }
        c.envs(env.iter().copied());
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("lw-mcp starts");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                match l {
                    Ok(l) => {
                        if tx.send(l).is_err() {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        });
        let stdin = child.stdin.take();
        let mut s = Session {
            child,
            stdin,
            lines,
        };
        s.send_raw(
            br#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
"#,
        );
        let init = s.recv();
        assert_eq!(init["id"], "init", "{init}");
        assert!(init["result"]["serverInfo"]["name"] == "lw-mcp", "{init}");
        s
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let w = self.stdin.as_mut().expect("stdin is open");
        w.write_all(bytes).expect("lw-mcp reads its stdin");
        w.flush().expect("flush");
    }

    fn send(&mut self, v: Value) {
        let mut b = serde_json::to_vec(&v).expect("json");
        b.push(b'\n');
        self.send_raw(&b);
    }

    fn recv(&self) -> Value {
        let l = self
            .lines
            .recv_timeout(Duration::from_secs(20))
            .expect("lw-mcp answered within 20 s");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("lw-mcp wrote non-JSON {l:?}: {e}"))
    }

    fn call(&mut self, id: i64, tool: &str, args: Value) -> Value {
        self.send(json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":args}}));
        let r = self.recv();
        assert_eq!(r["id"], id, "{r}");
        r
    }

    fn ping(&mut self, id: i64) {
        self.send(json!({"jsonrpc":"2.0","id":id,"method":"ping"}));
        let r = self.recv();
        assert_eq!(
            (r["id"].as_i64(), r.get("result").is_some()),
            (Some(id), true),
            "{r}"
        );
    }

    /// Closes stdin and waits for the exit status, at most `limit`.
    fn close(mut self, limit: Duration) -> (Option<i32>, Duration) {
        let t0 = Instant::now();
        drop(self.stdin.take());
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return (st.code(), t0.elapsed());
            }
            if t0.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return (None, t0.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn code(v: &Value) -> Option<i64> {
    v["error"]["code"].as_i64()
}

fn text(v: &Value) -> String {
    v["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[test]
fn garbage_truncated_frames_and_bad_shapes_get_their_codes_and_the_server_stays_up() {
    let root = Root::new("garbage");
    root.register("api", "lw/api", &[]);
    let mut s = Session::start(&root, "api");
    let cases: &[(&[u8], i64, Value)] = &[
        (b"\x00\xff\xfe binary garbage\n", -32700, Value::Null),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1,\"meth\n", -32700, Value::Null),
        (b"[{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}]\n", -32600, Value::Null),
        (b"\"just a string\"\n", -32600, Value::Null),
        (b"{\"jsonrpc\":\"1.0\",\"id\":3,\"method\":\"ping\"}\n", -32600, json!(3)),
        (b"{\"jsonrpc\":\"2.0\",\"id\":4}\n", -32600, json!(4)),
        (b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"no/such/method\"}\n", -32601, json!(5)),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"tools/call\",\"params\":{\"name\":[]}}\n",
            -32602,
            json!(6),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"name\":\"rm-rf\"}}\n",
            -32602,
            json!(7),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"tools/call\",\"params\":{\"name\":\"post\",\"arguments\":{\"kind\":\"status\"}}}\n",
            -32602,
            json!(8),
        ),
    ];
    for (i, (line, want, id)) in cases.iter().enumerate() {
        s.send_raw(line);
        let r = s.recv();
        assert_eq!(
            code(&r),
            Some(*want),
            "case {i} {:?}: {r}",
            String::from_utf8_lossy(line)
        );
        assert_eq!(&r["id"], id, "case {i}: {r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{r}"
        );
        s.ping(100 + i as i64);
    }
    // A notification is never answered, even a broken one; a blank line is nothing.
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/unknown\"}\n\n\r\n");
    s.ping(200);
    assert!(ls(&root.mailbox("api").join("outbox/new")).is_empty());
    // A truncated last frame: answered, then the session ends cleanly.
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"pi");
    drop(s.stdin.take());
    let r = s.recv();
    assert_eq!(code(&r), Some(-32700), "{r}");
    let (status, took) = s.close(Duration::from_secs(5));
    assert_eq!(status, Some(0), "exit after end of input");
    println!(
        "bad input: {} malformed lines answered with -32700/-32600/-32601/-32602, server up after each; exit 0 in {took:?} after a truncated last frame",
        cases.len()
    );
}

#[test]
fn a_10_mb_argument_is_refused_by_the_tool_and_a_larger_line_by_the_transport() {
    let root = Root::new("big");
    root.register("api", "lw/api", &[]);
    let mut s = Session::start(&root, "api");
    let body = "y".repeat(10 * 1024 * 1024);
    let t0 = Instant::now();
    let r = s.call(
        1,
        "post",
        json!({"kind": "status", "subject": "big", "body": body}),
    );
    let took = t0.elapsed();
    assert_eq!(r["result"]["isError"], true, "{}", text(&r));
    assert!(
        text(&r).contains("body is 10485760 bytes; the limit is 262144")
            && text(&r).contains("Fix:"),
        "{}",
        text(&r)
    );
    // Over the line limit (16 MiB): skipped without being held, answered by id.
    let mut line = br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"post","arguments":{"kind":"status","subject":"huge","body":""#.to_vec();
    line.extend(std::iter::repeat_n(b'z', 17 * 1024 * 1024));
    line.extend(b"\"}}}\n");
    s.send_raw(&line);
    let r = s.recv();
    assert_eq!((code(&r), &r["id"]), (Some(-32600), &json!(2)), "{r}");
    s.ping(3);
    let ok = s.call(4, "post", json!({"kind": "status", "subject": "small"}));
    assert_eq!(ok["result"]["isError"], false, "{ok}");
    let outbox = root.mailbox("api").join("outbox");
    assert_eq!(ls(&outbox.join("new")).len(), 1, "only the small post");
    assert!(ls(&outbox.join("tmp")).is_empty(), "nothing half-written");
    let rss = rss_kb(s.child.id());
    let (status, _) = s.close(Duration::from_secs(5));
    assert_eq!(status, Some(0));
    println!(
        "10 MB argument refused by post in {took:?}; 17 MB line answered -32600 by id; RSS after both {rss} kB"
    );
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_client_that_leaves_mid_wait_ends_the_server_at_once() {
    let root = Root::new("leave");
    root.register("api", "lw/api", &[]);
    let mut s = Session::start(&root, "api");
    s.send(json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wait","arguments":{"timeout":600}}}));
    s.ping(2); // the wait is running beside the session
    let (status, took) = s.close(Duration::from_secs(10));
    assert_eq!(status, Some(0), "exit 0 when the client goes");
    assert!(took < Duration::from_secs(2), "left after {took:?}");
    println!("client gone mid-wait: lw-mcp exited 0 after {took:?}");
}

#[test]
fn a_cancelled_wait_sends_nothing_and_the_session_goes_on() {
    let root = Root::new("cancel");
    root.register("api", "lw/api", &[]);
    let mut s = Session::start(&root, "api");
    s.send(json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wait","arguments":{"timeout":600}}}));
    s.ping(2);
    s.send(json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"reason":"user"}}));
    s.ping(3);
    // A post after the cancel is answered, and is the next line: no late
    // response to the cancelled wait comes first.
    let r = s.call(4, "post", json!({"kind":"status","subject":"after cancel"}));
    assert_eq!(r["result"]["isError"], false, "{r}");
    // A delivery now must not produce a response to the cancelled wait.
    let m = mailbox::message::Message::compose(
        "web",
        vec!["api".into()],
        mailbox::message::Kind::Status,
        "late".into(),
        String::new(),
        vec![],
        None,
    )
    .expect("valid");
    mailbox::layout::SandboxBox::new(root.mailbox("api"))
        .inbox()
        .deliver_message(&m)
        .expect("deliver");
    s.ping(5);
    let (status, _) = s.close(Duration::from_secs(5));
    assert_eq!(status, Some(0));
}

#[test]
fn a_vanished_mailbox_is_a_refusal_that_names_it_and_writes_nothing() {
    let root = Root::new("vanish");
    root.register("api", "lw/api", &[]);
    let mut s = Session::start(&root, "api");
    // A wait in progress when the inbox goes.
    s.send(json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"wait","arguments":{"timeout":600}}}));
    s.ping(2);
    let mb = root.mailbox("api");
    let gone = root.dir.join("api-moved-away");
    std::fs::rename(&mb, &gone).expect("rename the mailbox");
    std::fs::remove_dir_all(gone.join("inbox")).expect("remove the inbox");
    let r = s.recv();
    assert_eq!(
        (r["id"].as_i64(), &r["result"]["isError"]),
        (Some(1), &json!(true)),
        "{r}"
    );
    assert!(text(&r).contains("removed while waiting"), "{}", text(&r));
    for (id, tool, args) in [
        (
            3,
            "post",
            json!({"kind":"status","subject":"into the void"}),
        ),
        (4, "inbox", json!({})),
        (5, "wait", json!({"timeout": 1})),
        (
            6,
            "ack",
            json!({"id":"1796058405.123456789.9f86d081884c7d659a2feaa0c55ad015"}),
        ),
    ] {
        let r = s.call(id, tool, args);
        assert_eq!(r["result"]["isError"], true, "{tool}: {r}");
        assert!(
            text(&r).contains(&mb.display().to_string()) && text(&r).contains("Fix:"),
            "{tool}: {}",
            text(&r)
        );
    }
    assert!(!mb.exists(), "lw-mcp made no mailbox of its own");
    assert!(ls(&gone.join("outbox/new")).is_empty() && ls(&gone.join("outbox/tmp")).is_empty());
    // The mailbox comes back: the same session works again.
    std::fs::rename(&gone, &mb).expect("put it back");
    let r = s.call(7, "post", json!({"kind":"status","subject":"back"}));
    assert_eq!(r["result"]["isError"], false, "{r}");
    let (status, _) = s.close(Duration::from_secs(5));
    assert_eq!(status, Some(0));
}

fn deliver(root: &Root, to: &str, subject: &str) -> String {
    let m = mailbox::message::Message::compose(
        "web",
        vec![to.into()],
        mailbox::message::Kind::Request,
        subject.into(),
        String::new(),
        vec![],
        None,
    )
    .expect("valid");
    mailbox::layout::SandboxBox::new(root.mailbox(to))
        .inbox()
        .deliver_message(&m)
        .expect("deliver");
    m.id
}

fn ids(r: &Value) -> Vec<String> {
    r["result"]["structuredContent"]["messages"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|m| m["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn wait_returns_what_arrived_between_inbox_and_wait_and_nothing_twice() {
    let root = Root::new("between");
    root.register("api", "lw/api", &[]);
    let mut s = Session::start(&root, "api");
    let a = deliver(&root, "api", "first");
    // The first wait of a session returns what is unread already.
    assert_eq!(
        ids(&s.call(1, "wait", json!({"timeout": 5}))),
        vec![a.clone()]
    );
    // Listed by inbox (or returned by wait): not returned again.
    let b = deliver(&root, "api", "second");
    assert_eq!(ids(&s.call(2, "inbox", json!({}))), [a.clone(), b.clone()]);
    // Delivered after the listing and before the wait: returned at once.
    let c = deliver(&root, "api", "third");
    let t0 = Instant::now();
    assert_eq!(ids(&s.call(3, "wait", json!({"timeout": 5}))), [c]);
    assert!(t0.elapsed() < Duration::from_secs(2));
    // Nothing new: the wait times out, and kinds filter.
    let r = s.call(4, "wait", json!({"timeout": 0.2}));
    assert_eq!(r["result"]["structuredContent"]["timed_out"], true, "{r}");
    let status = mailbox::message::Message::compose(
        "web",
        vec!["api".into()],
        mailbox::message::Kind::Status,
        "news".into(),
        String::new(),
        vec![],
        None,
    )
    .expect("valid");
    mailbox::layout::SandboxBox::new(root.mailbox("api"))
        .inbox()
        .deliver_message(&status)
        .expect("deliver");
    let r = s.call(5, "wait", json!({"timeout": 0.3, "kinds": ["request"]}));
    assert_eq!(r["result"]["structuredContent"]["timed_out"], true, "{r}");
    assert_eq!(
        ids(&s.call(6, "wait", json!({"timeout": 5, "kinds": ["status"]}))),
        [status.id]
    );
    let (code, _) = s.close(Duration::from_secs(5));
    assert_eq!(code, Some(0));
}

#[test]
fn posts_beyond_the_rate_are_refused_with_the_wait_to_come() {
    let root = Root::new("rate");
    root.register("api", "lw/api", &[]);
    let mut s = Session::start_with(&root, "api", &[("LW_MCP_RATE", "2/1h")]);
    for id in [1, 2] {
        let r = s.call(
            id,
            "post",
            json!({"kind":"status","subject":format!("n{id}")}),
        );
        assert_eq!(r["result"]["isError"], false, "{r}");
    }
    let r = s.call(3, "post", json!({"kind":"status","subject":"n3"}));
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(
        text(&r).starts_with("rate limit: this session posted 2 messages in the last 3600s")
            && text(&r).contains("Fix: wait"),
        "{}",
        text(&r)
    );
    assert_eq!(ls(&root.mailbox("api").join("outbox/new")).len(), 2);
    let (code, _) = s.close(Duration::from_secs(5));
    assert_eq!(code, Some(0));
}
