//! A `lw-inbox --wait` waiting in a sandbox: the reader's side of a
//! delivery, used to time post -> deliver end to end.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::SystemTime;

use super::Target;
use crate::sandbox_support::Fixture;

/// A `lw-inbox --wait` in sandbox `name`, started and waiting.
pub(super) struct Waiter {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Waiter {
    pub(super) fn start(fx: &Fixture, t: &Target, name: &str) -> Waiter {
        let mut child = t
            .env(&mut fx.cmd(&[
                "exec",
                name,
                "--",
                "sh",
                "-c",
                "echo waiting; exec lw-inbox --wait --timeout 120",
            ]))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        assert_eq!(first.trim(), "waiting");
        Waiter { child, out }
    }
    /// The line it lists and when it came; it must be `id`'s (the inbox
    /// was empty when it started).
    pub(super) fn listed(mut self, id: &str) -> (String, SystemTime) {
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        let at = SystemTime::now();
        assert!(line.starts_with(id), "the waiter lists {id}: {line:?}");
        let st = self.child.wait().unwrap();
        assert!(st.success(), "lw-inbox --wait: {st:?}");
        (line, at)
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Acks everything in sandbox `name`'s inbox, so that a waiter waits.
pub(super) fn ack_all(fx: &Fixture, t: &Target, name: &str) {
    t.ok(
        fx,
        &[
            "exec",
            name,
            "--",
            "sh",
            "-c",
            "ls /lw/mailbox/inbox/new | lw-inbox ack - >/dev/null",
        ],
    );
}
