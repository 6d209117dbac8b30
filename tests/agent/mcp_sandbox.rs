//! lw-mcp inside a real sandbox (made by lw-sandbox on the real Docker
//! engine), driven over `docker exec -i` stdio by the official Python SDK on
//! the host: the binary lw-sandbox mounts at /usr/local/bin/lw-mcp, the
//! environment it sets, the registry it mounts read-only, and a message
//! routed to the sandbox by lw-mediate while the agent's `wait` blocks.

use support::mcp as mcp_support;
use support::sandbox as sandbox_support;

use std::process::Command;

use sandbox_support::{Fixture, bin};

#[test]
fn python_sdk_drives_lw_mcp_inside_a_sandbox_over_docker_exec() {
    let t0 = std::time::Instant::now();
    let f = Fixture::new("mcp");
    f.ok(&["create", "m", "--branch", "task/m", "--scope", "src/api/**"]);
    let made = t0.elapsed();
    // A peer known to the mediator (registered only: it needs no container).
    let reg = Command::new(bin("lw-mediate"))
        .arg("--root")
        .arg(&f.root)
        .args([
            "register",
            "peer",
            "--branch",
            "task/peer",
            "--scope",
            "web/**",
        ])
        .output()
        .expect("lw-mediate runs");
    assert!(
        reg.status.success(),
        "{}",
        String::from_utf8_lossy(&reg.stderr)
    );
    let hook = format!(
        "{} --mailbox {} -k request -t m -s 'review please' 'body from web' >/dev/null && {} --root {} --once",
        mcp_support::sq(&bin("lw-post").to_string_lossy()),
        mcp_support::sq(&f.root.join("sandboxes/peer").to_string_lossy()),
        mcp_support::sq(&bin("lw-mediate").to_string_lossy()),
        mcp_support::sq(&f.root.to_string_lossy()),
    );
    let container = f.container("m");
    let o = mcp_support::client(
        "flow",
        &["--peer", "peer", "--hook", &hook],
        &["docker", "exec", "-i", &container, "/usr/local/bin/lw-mcp"],
        &[],
    );
    let r = mcp_support::report(&o);
    assert!(
        r.get("client_error").is_none(),
        "{r:#}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        r["tools"],
        serde_json::json!(["ack", "inbox", "post", "show", "wait", "whoami"])
    );
    let me = &r["whoami"]["ok"];
    assert_eq!(
        (&me["name"], &me["branch"], &me["mailbox"]),
        (
            &serde_json::json!("m"),
            &serde_json::json!("task/m"),
            &serde_json::json!("/lw/mailbox")
        ),
        "{r:#}"
    );
    assert_eq!(me["scope"], serde_json::json!(["src/api/**"]), "{r:#}");
    assert_eq!(
        me["peers"],
        serde_json::json!([{"name": "peer", "branch": "task/peer", "scope": ["web/**"]}])
    );

    // What the agent posted from inside is in m's outbox on the host (the
    // hook's mediator pass moved it to cur/), and the request reached peer.
    let boxdir = f.root.join("sandboxes/m");
    let id = r["post"]["ok"]["id"].as_str().expect("an id");
    let mut out = mcp_support::ls(&boxdir.join("outbox/cur"));
    out.extend(mcp_support::ls(&boxdir.join("outbox/new")));
    let rid = r["post_request"]["ok"]["id"].as_str().expect("an id");
    out.sort();
    let mut want = vec![id.to_string(), rid.to_string()];
    want.sort();
    assert_eq!(out, want, "exactly the two accepted posts");
    assert!(mcp_support::ls(&boxdir.join("outbox/tmp")).is_empty());
    assert_eq!(
        mcp_support::ls(&f.root.join("sandboxes/peer/inbox/new")),
        [rid]
    );
    assert!(
        r["post_big"]["refused"]
            .as_str()
            .is_some_and(|t| t.contains("limit is 262144"))
    );

    // The wait inside woke on the mediator's delivery; the ack moved it.
    let got = &r["wait"]["ok"]["messages"];
    assert_eq!(got.as_array().map(Vec::len), Some(1), "{r:#}");
    let wid = got[0]["id"].as_str().expect("an id");
    assert_eq!(got[0]["from"], "peer");
    assert_eq!(r["ack"]["ok"]["already"], false);
    assert_eq!(mcp_support::ls(&boxdir.join("inbox/cur")), [wid]);
    // The files the agent wrote belong to the sandbox's user.
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(boxdir.join("outbox/cur").join(id)).expect("posted file");
    assert_eq!(meta.uid(), loopwright::sandbox::DEFAULT_UID);
    // The registry is there to read, not to write.
    let w = Command::new("docker")
        .args(["exec", &container, "sh", "-c"])
        .arg("echo '{}' > /lw/registry/m.json || exit 3; exit 0")
        .output()
        .expect("docker runs");
    assert_eq!(w.status.code(), Some(3), "the registry is writable inside");
    println!(
        "lw-mcp in sandbox m over docker exec -i: whoami from /lw/registry, 2 posts delivered, wait woken by lw-mediate, ack; sandbox made in {made:?}, whole test {:?}",
        t0.elapsed()
    );
}
