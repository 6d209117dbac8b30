//! What the volume-mode suites (remote_engine, kube_sandbox, kube_fleet,
//! kube_nodes) share of the mail's crossing: a running `lw-sandbox
//! courier` whose report lines arrive with their time, a `lw-inbox --wait`
//! waiting in a sandbox, the time a message id carries, and `lw-sandbox`
//! as a suite runs it (its root, project and engine chosen by the suite).

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

/// A running `lw-sandbox courier`, its lines arriving with their time.
pub struct Courier {
    child: Child,
    lines: mpsc::Receiver<(SystemTime, String)>,
}

impl Courier {
    /// Runs `cmd` (an `lw-sandbox courier` command line) and reads its lines.
    pub fn spawn(cmd: &mut Command) -> Courier {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("lw-sandbox courier runs");
        let out = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { return };
                if tx.send((SystemTime::now(), l)).is_err() {
                    return;
                }
            }
        });
        Courier { child, lines: rx }
    }
    /// Waits for lines until `n` messages were carried in; the time of the last.
    pub fn until_in(&self, n: usize, timeout: Duration) -> SystemTime {
        self.until_count("in", 0, n, timeout).1
    }
    /// Waits for pass lines until their `word` counts (`out`, `in`,
    /// `read`, `junk`), added to `from`, reach `n`: the sum.
    pub fn until(&self, word: &str, from: usize, n: usize, timeout: Duration) -> usize {
        self.until_count(word, from, n, timeout).0
    }
    fn until_count(
        &self,
        word: &str,
        from: usize,
        n: usize,
        timeout: Duration,
    ) -> (usize, SystemTime) {
        let deadline = Instant::now() + timeout;
        let mut got = from;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (at, l) = self.lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!("the courier's {word} counted {got} of {n} in {timeout:?}")
            });
            let w: Vec<&str> = l.split_whitespace().collect();
            if let Some(i) = w.iter().position(|x| *x == word) {
                got += w[i + 1].parse::<usize>().unwrap_or(0);
            }
            if got >= n {
                return (got, at);
            }
        }
    }
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Courier {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The time encoded in a message id (`SECONDS.NANOS.RANDOM`).
pub fn id_time(id: &str) -> SystemTime {
    let mut p = id.split('.');
    let s: u64 = p.next().unwrap().parse().unwrap();
    let n: u32 = p.next().unwrap().parse().unwrap();
    SystemTime::UNIX_EPOCH + Duration::new(s, n)
}

/// What a sandbox runs for a [`Waiter`]: `lw-sandbox exec NAME -- sh -c WAIT`.
pub const WAIT: &str = "echo waiting; exec lw-inbox --wait --timeout 120";

/// A `lw-inbox --wait` in a sandbox, started and waiting.
pub struct Waiter {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Waiter {
    /// Runs `cmd` (an `lw-sandbox exec NAME -- sh -c` [`WAIT`]) until it
    /// says it waits.
    pub fn start(cmd: &mut Command) -> Waiter {
        let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        assert_eq!(first.trim(), "waiting", "lw-inbox --wait started");
        Waiter { child, out }
    }
    /// The line it lists and when it came; it must be `id`'s (the inbox
    /// was empty when it started).
    pub fn listed(mut self, id: &str) -> (String, SystemTime) {
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

/// `lw-sandbox` as a suite runs it: `base` makes the command for the
/// arguments, with the suite's root, project and engine.
pub struct LwSandbox<'a> {
    pub base: &'a (dyn Fn(&[&str]) -> Command + Sync),
}

impl LwSandbox<'_> {
    pub fn cmd(&self, args: &[&str]) -> Command {
        (self.base)(args)
    }
    /// `lw-sandbox ARGS`, which must succeed: its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.cmd(args).output().expect("lw-sandbox runs");
        assert!(
            o.status.success(),
            "lw-sandbox {args:?} exited {:?}: {}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
    /// `lw-post --kind status` in `from` to `to`: the id.
    pub fn post(&self, from: &str, to: &str, subject: &str) -> String {
        self.ok(&[
            "exec",
            from,
            "--",
            "lw-post",
            "--to",
            to,
            "--kind",
            "status",
            "--subject",
            subject,
            "body",
        ])
        .trim()
        .to_string()
    }
    /// A waiting `lw-inbox --wait` in `name`.
    pub fn waiter(&self, name: &str) -> Waiter {
        Waiter::start(&mut self.cmd(&["exec", name, "--", "sh", "-c", WAIT]))
    }
}
