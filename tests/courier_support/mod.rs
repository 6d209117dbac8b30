//! A running `lw-sandbox courier` for the volume-mode suites
//! (remote_engine, kube_sandbox): its report lines arrive with their time.
#![allow(dead_code)]

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
        let deadline = Instant::now() + timeout;
        let mut got = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (at, l) = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the courier carried {got} of {n} in {timeout:?}"));
            let w: Vec<&str> = l.split_whitespace().collect();
            if let Some(i) = w.iter().position(|x| *x == "in") {
                got += w[i + 1].parse::<usize>().unwrap_or(0);
            }
            if got >= n {
                return at;
            }
        }
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
