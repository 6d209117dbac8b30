//! Issue 40 item 10: the cockpit as a person uses it, in Chromium.

use super::*;

/// The answers in `sandbox`'s inbox that reply to `qid`, once the running
/// mediator delivered at least one.
fn replies_to(root: &Root, sandbox: &str, qid: &str) -> usize {
    let inbox = root.sandbox(sandbox).inbox();
    let mut n = 0;
    inbox
        .wait_until(Some(Duration::from_secs(10)), || {
            n = inbox
                .names(Sub::New)?
                .iter()
                .filter(|f| {
                    matches!(inbox.read(Sub::New, f),
                        Found::Message(m) if m.in_reply_to.as_deref() == Some(qid))
                })
                .count();
            Ok(n > 0)
        })
        .unwrap();
    n
}

#[test]
fn one_answer_per_question_a_double_click_and_three_at_once() {
    let root = root("once", &[("api", None)]);
    let _m = mediator(&root);
    let q1 = post_as(&root, "api", "question", "first?", "one");
    let q2 = post_as(&root, "api", "question", "second?", "two");
    let c = cockpit(&root, "ada");
    let r = browser(
        "once",
        &c,
        &root,
        &[("QID", q1.clone()), ("QID2", q2.clone())],
    );
    assert_eq!(r["statuses"], serde_json::json!([200, 409, 409]), "{r}");
    // Every answer the cockpit took was routed: the outbox is empty, and
    // each question has exactly one reply.
    let (a1, a2) = (replies_to(&root, "api", &q1), replies_to(&root, "api", &q2));
    let outbox = root.human_outbox();
    outbox
        .wait_until(Some(Duration::from_secs(10)), || {
            Ok(outbox.names(Sub::New)?.is_empty())
        })
        .unwrap();
    let answers = Log::new(root.log_dir())
        .entries()
        .unwrap()
        .0
        .iter()
        .filter(|e| e.message.as_ref().is_some_and(|m| m.kind == Kind::Answer))
        .count();
    assert_eq!((a1, a2, answers), (1, 1, 2));
}

#[test]
fn the_timeline_is_in_logged_order_a_release_of_an_old_message_is_on_top() {
    let root = root("order", &[("api", None), ("web", None)]);
    let policy = root.dir.parent().unwrap().join("policy");
    std::fs::write(&policy, "loopwright-policy 1\nhold kind request\n").unwrap();
    let o = Command::new(support::bin("lw-post"))
        .arg("-m")
        .arg(root.dir.join("sandboxes/api"))
        .args([
            "-k",
            "request",
            "-t",
            "web",
            "-s",
            "held since long ago",
            "x",
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    let held = String::from_utf8(o.stdout).unwrap().trim().to_string();
    // More than a page of newer entries.
    for i in 0..60 {
        post_as(&root, "web", "status", &format!("newer {i}"), "x");
    }
    let o = Command::new(support::bin("lw-mediate"))
        .arg("--root")
        .arg(&root.dir)
        .arg("--policy")
        .arg(&policy)
        .arg("--once")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let c = cockpit_with(&root, "ada", &["--policy", policy.to_str().unwrap()], &[]);
    let r = browser("order", &c, &root, &[("RELEASE", held)]);
    assert_eq!(r["top"], "held since long ago", "{r}");
}

#[test]
fn held_messages_and_questions_show_their_recipients_and_body() {
    let root = root("bodies", &[("api", None), ("web", None)]);
    let policy = root.dir.parent().unwrap().join("policy");
    std::fs::write(&policy, "loopwright-policy 1\nhold kind request\n").unwrap();
    let held_body = "please DROP TABLE users;\n<img src=x onerror=alert(1)>\u{202e}";
    let o = Command::new(support::bin("lw-post"))
        .arg("-m")
        .arg(root.dir.join("sandboxes/api"))
        .args([
            "-k",
            "request",
            "-t",
            "web",
            "-s",
            "a schema change",
            held_body,
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    let held = String::from_utf8(o.stdout).unwrap().trim().to_string();
    let qid = post_as(
        &root,
        "web",
        "question",
        "may I?",
        "the body of the question",
    );
    // A message holding a secret's value is held for it: its body is shown
    // with the value masked, as the log would.
    let (key, value) = ("LW_COCKPIT_TEST_KEY", "sk-cockpit-0123456789abcdef");
    let o = Command::new(support::bin("lw-mediate"))
        .arg("--root")
        .arg(&root.dir)
        .args(["register", "vault", "--secret", key])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let leak = post_as(
        &root,
        "vault",
        "status",
        "the key",
        &format!("the key is {value}"),
    );
    let o = Command::new(support::bin("lw-mediate"))
        .arg("--root")
        .arg(&root.dir)
        .arg("--policy")
        .arg(&policy)
        .arg("--once")
        .env(key, value)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let c = cockpit_with(
        &root,
        "ada",
        &["--policy", policy.to_str().unwrap()],
        &[(key, value)],
    );
    let r = browser(
        "bodies",
        &c,
        &root,
        &[("HELD", held), ("QID", qid), ("LEAK", leak)],
    );
    let masked = r["leak"]["body"].as_str().unwrap();
    assert!(
        masked.starts_with("the key is ") && !masked.contains(value),
        "{r}"
    );
    assert_eq!(r["held"]["to"], "to: web", "{r}");
    assert_eq!(
        r["held"]["body"], "please DROP TABLE users;\n<img src=x onerror=alert(1)>\\u{202e}",
        "{r}"
    );
    assert_eq!(r["question"]["to"], "to: mediator", "{r}");
    assert_eq!(r["question"]["body"], "the body of the question", "{r}");
}

#[test]
fn the_sandbox_table_redraws_only_what_changed_and_keeps_the_focus() {
    let root = root("churn", &[("api", None), ("web", None)]);
    let c = cockpit(&root, "ada");
    let r = browser(
        "churn",
        &c,
        &root,
        &[(
            "LW_MEDIATE",
            support::bin("lw-mediate").display().to_string(),
        )],
    );
    assert_eq!(
        r["kept"],
        serde_json::json!(["api:1", "web:1", "web2:0"]),
        "{r}"
    );
    assert_eq!(r["focus"], "api", "{r}");
    // Re-registering a sandbox as it was changes nothing the page shows:
    // the page is told to look again, and gets 304 with no body.
    assert!(r["same"].as_u64().unwrap_or(0) >= 3, "{r}");
}

#[test]
fn log_rows_are_reached_and_opened_from_the_keyboard() {
    let root = root("keys", &[("api", None)]);
    post_as(&root, "api", "status", "one", "first body");
    post_as(&root, "api", "status", "two", "second body");
    let o = Command::new(support::bin("lw-mediate"))
        .arg("--root")
        .arg(&root.dir)
        .arg("--once")
        .output()
        .unwrap();
    assert!(o.status.success());
    let c = cockpit(&root, "ada");
    let r = browser("keys", &c, &root, &[]);
    eprintln!("the first log row after {} Tab presses", r["tabs"]);
    assert!(r["first"].as_str().unwrap().contains("second body"), "{r}");
    assert_ne!(r["row"], r["second"], "{r}");
}

#[test]
fn a_restarted_server_the_page_says_what_happened_and_the_new_url_works() {
    let root = root("restart", &[("api", None)]);
    // A port below the kernel's ephemeral range (32768 and up here): one
    // taken from that range can be the local end of another test's loopback
    // connection by the time the cockpit binds it again (exit 75).
    let port = (20_000..32_000)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port below 32000");
    let c = cockpit_with(&root, "ada", &["--port", &port.to_string()], &[]);
    let r = browser(
        "restart",
        &c,
        &root,
        &[
            ("COCKPIT_PID", c.child.0.id().to_string()),
            ("COCKPIT_BIN", COCKPIT.to_string()),
        ],
    );
    let down = r["down"].as_str().unwrap();
    assert!(down.contains("does not answer"), "{r}");
    let said = r["said"].as_str().unwrap();
    assert!(
        said.contains("was restarted") && said.contains("open the URL"),
        "{r}"
    );
}
