//! lw-mcp as a process over stdio: it answers `initialize` with its name
//! and the capabilities the door offers; the suites with real MCP clients
//! and hostile input are modules of this binary, the storm a binary of its
//! own (crates/mcp/tests/mcp_storm.rs).  (Also what makes `cargo test` build
//! lw-mcp, which the sandbox suites mount and run.)

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

#[test]
fn initialize_names_the_server_and_its_tools_and_resources() {
    let dir = support::tempdir("lw-mcp-init");
    let mailbox = dir.join("sandboxes/a");
    for d in ["inbox", "outbox"] {
        for s in ["tmp", "new", "cur"] {
            std::fs::create_dir_all(mailbox.join(d).join(s)).unwrap();
        }
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_lw-mcp"))
        .env("LW_MAILBOX", &mailbox)
        .env("LW_SANDBOX", "a")
        .env("LW_BRANCH", "lw/a")
        .env("LW_REGISTRY", dir.join("registry"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lw-mcp runs");
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}"#;
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{init}").unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    drop(stdin);
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
    assert_eq!(v["id"], 1, "{v}");
    assert_eq!(v["result"]["serverInfo"]["name"], "lw-mcp", "{v}");
    assert!(v["result"]["capabilities"]["tools"].is_object(), "{v}");
    assert!(v["result"]["capabilities"]["resources"].is_object(), "{v}");
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "lw-mcp ended {status} when its input closed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

mod mcp;
mod mcp_bad_input;
