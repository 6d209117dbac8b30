//! The courier's loop: a pass now, then whenever the mediator delivers
//! into a volume-mode sandbox's inbox on this host, and every interval.

use std::collections::HashSet;
use std::time::Duration;

use super::carry::{Carried, Courier};
use super::lock::{PidFile, lock_path, take_lock};
use crate::error::{Error, Exit, Result};
use crate::maildir::Sub;
use crate::sandbox::Sandboxes;

/// `lw-sandbox courier` in the foreground: a line `out N in N read N junk
/// N` for each pass that moved something (every pass with `once`).
pub fn foreground(
    sb: &Sandboxes,
    once: bool,
    interval_ms: u64,
    out: &mut dyn std::io::Write,
    warn: &mut dyn FnMut(&str),
) -> Result<()> {
    let mut report = |c: &Carried| {
        if once || *c != Carried::default() {
            let (o, i, r, j) = (c.out, c.into, c.read, c.junk);
            let _ = writeln!(out, "out {o} in {i} read {r} junk {j}").and_then(|()| out.flush());
        }
    };
    let interval = std::time::Duration::from_millis(interval_ms.max(1));
    run(sb, interval, once, &mut report, warn)
}

/// `lw-sandbox courier`: passes until killed (or one, `once`), waking when
/// the mediator delivers into a volume-mode sandbox's inbox on this host
/// and every `interval` otherwise.  Holds `ROOT/state/courier.lock`.
pub fn run(
    sb: &Sandboxes,
    interval: Duration,
    once: bool,
    report: &mut dyn FnMut(&Carried),
    warn: &mut dyn FnMut(&str),
) -> Result<()> {
    let lock_path = lock_path(&sb.root);
    let lock = take_lock(&sb.root)?.ok_or_else(|| {
        Error::new(
            Exit::TempFail,
            format!(
                "another courier carries the mail of '{}' (it holds '{}')",
                sb.root.dir.display(),
                lock_path.display()
            ),
        )
    })?;
    let pid = PidFile::write(&sb.root)?;
    serve(sb, interval, once, report, warn, &mut |_| false)?;
    pid.remove();
    drop(lock);
    Ok(())
}

/// The passes of a courier that holds the lock; before each, `idle` is
/// told how many volume-mode sandboxes the root has, and ends the loop by
/// answering true (the detached courier, daemon.rs).
pub fn serve(
    sb: &Sandboxes,
    interval: Duration,
    once: bool,
    report: &mut dyn FnMut(&Carried),
    warn: &mut dyn FnMut(&str),
    idle: &mut dyn FnMut(usize) -> bool,
) -> Result<()> {
    let mut courier = Courier::new(sb);
    let watcher = crate::fs::Watcher::new()
        .map_err(|e| Error::new(Exit::IoErr, format!("cannot watch the inboxes: {e}")))?;
    let mut watched = HashSet::new();
    loop {
        match courier.sandboxes() {
            Ok(recs) => {
                if idle(recs.len()) {
                    return Ok(());
                }
                for r in recs {
                    let dir = sb.root.sandbox(&r.name).inbox().sub(Sub::New);
                    if !watched.contains(&dir) && watcher.add(&dir).is_ok() {
                        watched.insert(dir);
                    }
                }
            }
            Err(e) => warn(&e.to_string()),
        }
        match courier.pass(warn) {
            Ok(c) => report(&c),
            Err(e) => {
                if once {
                    return Err(e);
                }
                warn(&e.to_string());
            }
        }
        if once {
            return Ok(());
        }
        let _ = watcher.wait(Some(interval));
    }
}
