//! lw-mcp driven by real MCP clients, not ours: the official Python SDK
//! (`mcp` on PyPI) runs initialize, tools/list, post, wait, ack against it,
//! and the MCP Inspector CLI lists the tools and posts.  What was delivered
//! is checked in the mailbox itself, and routed by lw-mediate --once.

use support::mcp as mcp_support;

use std::process::Command;

use mailbox::maildir::{Found, Maildir, Sub};
use mcp_support::*;
use serde_json::Value;

fn read(dir: &std::path::Path, id: &str) -> mailbox::message::Message {
    let md = Maildir::new(dir.parent().expect("a Maildir sub has a parent"));
    let sub = match dir.file_name().and_then(|n| n.to_str()) {
        Some("new") => Sub::New,
        _ => Sub::Cur,
    };
    match md.read(sub, std::ffi::OsStr::new(id)) {
        Found::Message(m) => m,
        other => panic!("{id} in {}: {other:?}", dir.display()),
    }
}

#[test]
fn python_sdk_posts_waits_and_acks_through_the_mediator() {
    let root = Root::new("flow");
    root.register("api", "lw/api", &["src/api/**"]);
    root.register("web", "lw/web", &["web/**"]);
    let env = root.env("api");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    // While the client waits, web posts a request to api and the mediator routes it.
    let hook = format!(
        "{} --mailbox {} -k request -t api -s 'review please' 'body from web' >/dev/null && {} --root {} --once",
        sq(&bin("lw-post").to_string_lossy()),
        sq(&root.mailbox("web").to_string_lossy()),
        sq(&bin("lw-mediate").to_string_lossy()),
        sq(&root.dir.to_string_lossy()),
    );
    let t0 = std::time::Instant::now();
    let o = client(
        "flow",
        &["--peer", "web", "--hook", &hook],
        &[&bin("lw-mcp").to_string_lossy()],
        &env,
    );
    let r = report(&o);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(r.get("client_error").is_none(), "{r:#}\n{stderr}");
    assert_eq!(r["server"], "lw-mcp");
    assert_eq!(
        r["tools"],
        serde_json::json!(["ack", "inbox", "post", "show", "wait", "whoami"])
    );

    // whoami: from the environment and the registry.
    let me = &r["whoami"]["ok"];
    assert_eq!(me["name"], "api", "{r:#}");
    assert_eq!(me["branch"], "lw/api");
    assert_eq!(me["scope"], serde_json::json!(["src/api/**"]));
    assert_eq!(
        me["peers"],
        serde_json::json!([{"name": "web", "branch": "lw/web", "scope": ["web/**"]}])
    );

    // The posts are in api's outbox (the hook's mediator run claimed them
    // into cur/), exactly as sent; the request was routed to web's inbox.
    let id = r["post"]["ok"]["id"].as_str().expect("post returned an id");
    let m = read(&root.mailbox("api").join("outbox/cur"), id);
    assert_eq!(
        (m.kind.as_str(), m.subject.as_str(), m.body.as_str()),
        ("status", "hello over mcp", "posted by the python sdk\n")
    );
    assert_eq!(m.refs, ["src/api/schema.json"]);
    assert_eq!(m.from, "api");
    let rid = r["post_request"]["ok"]["id"].as_str().expect("an id");
    let routed = read(&root.mailbox("web").join("inbox/new"), rid);
    assert_eq!(
        (routed.from.as_str(), routed.to.clone()),
        ("api", vec!["web".to_string()])
    );

    // Refusals are tool results with isError naming the problem and the fix;
    // malformed arguments and unknown tools are -32602.
    let bad_kind = r["post_bad_kind"]["refused"].as_str().unwrap_or("");
    assert!(
        bad_kind.contains("unknown kind 'gossip'") && bad_kind.contains("Fix:"),
        "{bad_kind}"
    );
    let big = r["post_big"]["refused"].as_str().unwrap_or("");
    assert!(
        big.contains("body is 10485760 bytes; the limit is 262144") && big.contains("Fix:"),
        "{big}"
    );
    assert_eq!(r["post_bad_type"]["error"], -32602, "{r:#}");
    assert_eq!(r["unknown_tool"]["error"], -32602, "{r:#}");
    // Nothing of the refused posts reached the outbox, not even tmp/.
    let outbox = root.mailbox("api").join("outbox");
    let mut posted = ls(&outbox.join("new"));
    posted.extend(ls(&outbox.join("cur")));
    posted.sort();
    let mut want = vec![id.to_string(), rid.to_string()];
    want.sort();
    assert_eq!(posted, want, "only the two good posts");
    assert!(ls(&outbox.join("tmp")).is_empty());

    // The abandoned wait did not hold the session: the next wait ran.
    assert!(
        r["cancelled_after_s"].as_f64().unwrap_or(9.0) < 1.0,
        "{r:#}"
    );
    assert_eq!(r["hook_status"], 0, "hook: {}", r["hook_stderr"]);
    let got = &r["wait"]["ok"]["messages"];
    assert_eq!(got.as_array().map(Vec::len), Some(1), "{r:#}");
    let wid = got[0]["id"].as_str().expect("an id");
    assert_eq!(
        (&got[0]["from"], &got[0]["kind"], &got[0]["body"]),
        (
            &Value::from("web"),
            &Value::from("request"),
            &Value::from("body from web")
        )
    );
    assert_eq!(r["show"]["ok"]["id"], wid);
    assert_eq!(r["ack"]["ok"]["already"], false);
    assert_eq!(r["ack_again"]["ok"]["already"], true);
    assert_eq!(ls(&root.mailbox("api").join("inbox/cur")), [wid]);
    assert!(ls(&root.mailbox("api").join("inbox/new")).is_empty());
    assert_eq!(r["inbox_all"]["ok"]["messages"][0]["state"], "read");
    assert_eq!(r["inbox_new"]["ok"]["messages"], serde_json::json!([]));
    // The mediator records the ack as a read receipt on its next pass.
    root.mediate_once();
    let receipt = format!("{wid}.read.api");
    assert!(
        mailbox::log::Log::new(root.dir.join("log")).has(&receipt),
        "no {receipt} in the log"
    );
    println!(
        "python sdk flow (protocol {}): 6 tools, 2 posts delivered, 3 refusals, wait woke, acked; {:.1}s",
        r["protocol"],
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn inspector_cli_lists_the_tools_and_posts() {
    let root = Root::new("inspector");
    root.register("api", "lw/api", &[]);
    let cmd = |args: &[&str]| {
        let mut c = Command::new(inspector());
        c.arg("--cli");
        for (k, v) in root.env("api") {
            c.arg("-e").arg(format!("{k}={v}"));
        }
        c.arg(bin("lw-mcp")).args(args);
        let o = c.output().expect("the inspector runs");
        assert!(
            o.status.success(),
            "inspector {args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_slice::<Value>(&o.stdout).expect("the inspector prints JSON")
    };
    let list = cmd(&["--method", "tools/list"]);
    let tools = list["tools"].as_array().expect("tools");
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["post", "inbox", "show", "ack", "wait", "whoami"]);
    for t in tools {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        assert!(
            t["description"].as_str().is_some_and(|d| d.len() > 60),
            "{t}"
        );
    }
    let post = cmd(&[
        "--method",
        "tools/call",
        "--tool-name",
        "post",
        "--tool-arg",
        "kind=question",
        "--tool-arg",
        "subject=may I drop API v1?",
        "--tool-arg",
        "body=asked from the inspector",
    ]);
    let id = post["structuredContent"]["id"].as_str().expect("an id");
    let m = read(&root.mailbox("api").join("outbox/new"), id);
    assert_eq!(
        (m.kind.as_str(), m.subject.as_str(), m.to.clone()),
        (
            "question",
            "may I drop API v1?",
            vec!["mediator".to_string()]
        )
    );
    let refused = cmd(&[
        "--method",
        "tools/call",
        "--tool-name",
        "post",
        "--tool-arg",
        "kind=bounce",
        "--tool-arg",
        "subject=x",
    ]);
    assert_eq!(refused["isError"], true, "{refused}");
    assert_eq!(ls(&root.mailbox("api").join("outbox/new")), [id]);
    println!(
        "inspector cli: tools/list shows 6 tools with schemas; post delivered {id}; bounce refused"
    );
}

/// Issue 32, the bell for MCP clients: a client subscribed to `inbox://`
/// gets one notifications/resources/updated per message the real
/// lw-mediate delivers, none for what was there before it subscribed, none
/// for an ack, none after it unsubscribed; reading the resource shows the
/// message whole.
#[test]
fn a_client_subscribed_to_the_inbox_is_told_once_per_delivered_message() {
    let root = Root::new("bell");
    root.register("api", "lw/api", &["src/api/**"]);
    root.register("web", "lw/web", &["web/**"]);
    let post = |subject: &str| {
        let o = Command::new(bin("lw-post"))
            .arg("--mailbox")
            .arg(root.mailbox("web"))
            .args(["-k", "status", "-t", "api", "-s", subject, "before"])
            .output()
            .expect("lw-post runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    // Delivered before the client subscribes: not news.
    post("waiting already");
    root.mediate_once();
    assert_eq!(ls(&root.mailbox("api").join("inbox/new")).len(), 1);

    let hook = format!(
        "{} --mailbox {} -k request -t api -s \"bell $1\" \"body $1\" >/dev/null && {} --root {} --once",
        sq(&bin("lw-post").to_string_lossy()),
        sq(&root.mailbox("web").to_string_lossy()),
        sq(&bin("lw-mediate").to_string_lossy()),
        sq(&root.dir.to_string_lossy()),
    );
    let env = root.env("api");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let o = client(
        "bell",
        &["--hook", &hook],
        &[&bin("lw-mcp").to_string_lossy()],
        &env,
    );
    let r = report(&o);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(r.get("client_error").is_none(), "{r:#}\n{stderr}");
    assert_eq!(r["subscribe_capability"], true, "{r:#}");
    assert_eq!(r["resources"], serde_json::json!(["inbox://"]));
    assert_eq!(r["mime"], serde_json::json!(["application/json"]));
    for k in ["subscribe_unknown", "read_unknown"] {
        assert_eq!(r[k]["error"], -32002, "{k}: {r:#}");
        assert!(
            r[k]["message"]
                .as_str()
                .is_some_and(|m| m.contains("no resource 'outbox://'")),
            "{k}: {r:#}"
        );
    }
    let rounds = r["rounds"].as_array().expect("rounds");
    assert_eq!(rounds.len(), 4, "{r:#}");
    for (i, round) in rounds.iter().enumerate() {
        assert_eq!(
            round["hook_status"], 0,
            "round {i}: {}",
            round["hook_stderr"]
        );
    }
    // One notification per delivery, counted after a ping went round: the
    // message waiting before, the ack before the third delivery and the
    // fourth, after the unsubscribe, rang nothing.
    let counts: Vec<&serde_json::Value> = rounds.iter().map(|r| &r["updated"]).collect();
    assert_eq!(counts, [1, 2, 3, 3], "{r:#}");
    for round in &rounds[..3] {
        assert_eq!(round["arrived"], true, "{r:#}");
    }
    assert_eq!(r["uris"], serde_json::json!(["inbox://"]));
    assert_eq!(r["ack"]["ok"]["already"], false, "{r:#}");
    // The wait returns what the session was not shown: bells 1 to 3.
    let waited: Vec<&str> = rounds[3]["wait"]["ok"]["messages"]
        .as_array()
        .expect("the wait returned messages")
        .iter()
        .filter_map(|m| m["subject"].as_str())
        .collect();
    assert_eq!(waited, ["bell 1", "bell 2", "bell 3"], "{r:#}");

    // The read after the first delivery: both unread messages, whole.
    assert_eq!(r["read1_mime"], "application/json");
    let read = r["read1"]["messages"].as_array().expect("messages");
    let subjects: Vec<&str> = read.iter().filter_map(|m| m["subject"].as_str()).collect();
    assert_eq!(subjects, ["waiting already", "bell 0"], "{r:#}");
    assert_eq!(
        (&read[1]["from"], &read[1]["kind"], &read[1]["body"]),
        (
            &serde_json::Value::from("web"),
            &serde_json::Value::from("request"),
            &serde_json::Value::from("body 0")
        )
    );
    let latency: Vec<f64> = rounds[..3]
        .iter()
        .filter_map(|r| r["latency_s"].as_f64())
        .collect();
    println!(
        "figure [mcp bell] (protocol {}): 3 deliveries by lw-mediate, 3 resources/updated; notification time minus the exit of the hook that delivered (lw-post, lw-mediate --once; negative: before it had exited): {latency:?} s",
        r["protocol"]
    );
}
