//! Helpers shared by the lw-mediate tests: a fresh root, posting straight
//! into an outbox (as lw-post does), running the binary, reading the log.

use std::path::Path;
use std::process::{Command, Output};

use mailbox::layout::Root;
use mailbox::log::{Entry, Log};
use mailbox::maildir::{Maildir, Sub};
use mailbox::message::{Kind, Message};
use mailbox::registry::{Registry, Sandbox};

/// lw-mediate in the target directory.
pub fn lw_mediate() -> std::path::PathBuf {
    crate::bin("lw-mediate")
}

pub use crate::tempdir;

/// A root with the named sandboxes registered (no scope).
pub fn root_with(tag: &str, sandboxes: &[&str]) -> Root {
    let root = Root::new(tempdir(tag).join("root"));
    std::fs::create_dir_all(&root.dir).unwrap();
    let reg = Registry::new(&root);
    for s in sandboxes {
        reg.register(&Sandbox::new(s, None, vec![])).unwrap();
    }
    root
}

pub fn message(from: &str, to: &[&str], kind: Kind, subject: &str) -> Message {
    Message {
        version: 1,
        id: base::id::new_id(),
        from: from.into(),
        to: to.iter().map(|s| s.to_string()).collect(),
        kind,
        subject: subject.into(),
        body: format!("body of {subject}"),
        refs: vec![],
        in_reply_to: None,
        created: base::time::rfc3339(base::time::now()),
    }
}

/// Posts `m` into the outbox of `sender` (whatever `m.from` says).
pub fn post(root: &Root, sender: &str, m: &Message) {
    root.sandbox(sender).outbox().deliver_message(m).unwrap();
}

pub fn mediate(root: &Root, args: &[&str]) -> Output {
    Command::new(lw_mediate())
        .arg("--root")
        .arg(&root.dir)
        .args(args)
        .output()
        .expect("lw-mediate runs")
}

/// `lw-mediate --once` with a policy that neither rate-limits nor
/// de-duplicates, unless `policy` says otherwise.
pub fn once(root: &Root, policy: &str) -> Output {
    let p = root.dir.parent().unwrap().join("policy");
    std::fs::write(&p, policy).unwrap();
    let out = mediate(root, &["--once", "--policy", p.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "lw-mediate --once failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub const OPEN_POLICY: &str = "loopwright-policy 1\nrate off\nduplicates off\n";

pub fn entries(root: &Root) -> Vec<Entry> {
    let (good, bad) = Log::new(root.log_dir()).entries().unwrap();
    assert!(bad.is_empty(), "unreadable log entries: {bad:?}");
    good
}

pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => vec![],
    };
    v.sort();
    v
}

/// Names in `new/` and `cur/` of a Maildir.
pub fn delivered(m: &Maildir) -> Vec<String> {
    let mut v = names(&m.sub(Sub::New));
    v.extend(names(&m.sub(Sub::Cur)));
    v.sort();
    v
}

/// A watching mediator, killed when dropped (also when a test panics).
pub struct Watcher(pub std::process::Child);

impl Watcher {
    pub fn start(root: &Root, policy: &Path, rescan: &str) -> Watcher {
        let child = Command::new(lw_mediate())
            .arg("--root")
            .arg(&root.dir)
            .arg("--policy")
            .arg(policy)
            .args(["--rescan", rescan])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("lw-mediate starts");
        Watcher(child)
    }

    /// Stops it and returns what it wrote to standard error.
    pub fn stop(mut self) -> String {
        use std::io::Read as _;
        let _ = self.0.kill();
        let _ = self.0.wait();
        let mut err = String::new();
        if let Some(mut e) = self.0.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
