//! lw-github-sink as a process: it prints the URL it listens on, and speaks
//! as GitHub does to a request without a token.  (Also what makes `cargo
//! test` build it for the sync suites, which are the top package's.)

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

#[test]
fn it_listens_on_loopback_and_refuses_a_request_without_a_token() {
    let dir = support::tempdir("sink-smoke");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lw-github-sink"))
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("lw-github-sink runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim().to_string();
    let addr = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("the first line is its URL: {line:?}"));
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /repos/octo/proj/issues/1/comments HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let status_line = answer.lines().next().unwrap_or_default();
    assert!(
        status_line.starts_with("HTTP/1.1 401") || status_line.starts_with("HTTP/1.1 404"),
        "{answer}"
    );
}
