//! The courier's ring (`lw-inbox --courier`): one long-lived process in a
//! volume-mode sandbox that tells the root's courier, over the standard
//! output of one exec that stays open, when the mail volume has something
//! for it.  The courier then carries that sandbox's mail and nothing else,
//! so an idle sandbox costs the engine's API no request at all
//! (mailbox-spec.md, REMOTE ENGINES; docs/scale.md says why).
//!
//! The lines, each a word and a newline:
//!
//! * `ready` once, when the watches are set: whatever arrived before it is
//!   the courier's to look for (it carries the sandbox once on `ready`).
//! * `ring` when `outbox/new/` gained an entry (a post) or `inbox/cur/`
//!   did (an acknowledgement: the read receipt); a burst rings once.
//! * `tick` after [`TICK`] without a ring, so each side sees a dead stream
//!   within a minute: the courier restarts a stream that says nothing for
//!   longer, and a ring whose courier is gone fails its next write and
//!   exits.
//!
//! It exits 0 when its standard input ends or says anything (the courier's
//! way of stopping it), or when its standard output is gone; 74 when a
//! watched directory cannot be watched or disappears.  The ring carries no
//! mail and reads none: a lost or forged line costs at most a pass.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;

use base::error::{Error, Exit, Result};
use base::fs::{Watcher, Woke};

/// How long the ring stays silent before it says `tick`.
pub const TICK: Duration = Duration::from_secs(20);

/// How long a burst of arrivals is let settle before it rings once.
const SETTLE: Duration = Duration::from_millis(3);

/// The line said once the watches are set.
pub const READY: &str = "ready";
/// The line said when the mail volume has something for the courier.
pub const RING: &str = "ring";
/// The line said after [`TICK`] of silence.
pub const TICK_LINE: &str = "tick";

/// Watches `mailbox`'s `outbox/new/` and `inbox/cur/` and says so on `out`
/// until `stdin` ends or says anything, or `out` is gone.
pub fn serve(mailbox: &Path, stdin: BorrowedFd<'_>, out: &mut dyn Write) -> Result<()> {
    let watcher = Watcher::new()
        .map_err(|e| Error::new(Exit::IoErr, format!("cannot watch the mailbox: {e}")))?;
    for sub in ["outbox/new", "inbox/cur"] {
        let dir = mailbox.join(sub);
        watcher.add(&dir).map_err(|e| {
            Error::new(
                Exit::IoErr,
                format!("cannot watch '{}': {e}", dir.display()),
            )
        })?;
    }
    if !say(out, READY) {
        return Ok(());
    }
    loop {
        let (inbound, told) = wait(&watcher, stdin)?;
        if told {
            // Anything on stdin, or its end: the courier is done with us.
            return Ok(());
        }
        let line = if inbound {
            match watcher
                .wait_settled(Some(Duration::ZERO), SETTLE)
                .map_err(|e| Error::new(Exit::IoErr, format!("cannot watch the mailbox: {e}")))?
            {
                Woke::Gone(dir) => {
                    return Err(Error::new(
                        Exit::IoErr,
                        format!("'{}' was removed or moved", dir.display()),
                    ));
                }
                _ => RING,
            }
        } else {
            TICK_LINE
        };
        if !say(out, line) {
            return Ok(());
        }
    }
}

/// Waits up to [`TICK`] for the watcher or `stdin`: (the watcher is
/// readable, stdin is).
fn wait(watcher: &Watcher, stdin: BorrowedFd<'_>) -> Result<(bool, bool)> {
    let ino = watcher.as_fd();
    let mut fds = [
        PollFd::new(&ino, PollFlags::IN),
        PollFd::new(&stdin, PollFlags::IN),
    ];
    let ts = Timespec {
        tv_sec: TICK.as_secs() as i64,
        tv_nsec: 0,
    };
    match poll(&mut fds, Some(&ts)) {
        Ok(_) => {}
        Err(Errno::INTR) => return Ok((true, false)),
        Err(e) => {
            return Err(Error::new(
                Exit::IoErr,
                format!("cannot wait on the mailbox: {e}"),
            ));
        }
    }
    let ready = |f: &PollFd| !f.revents().is_empty();
    Ok((ready(&fds[0]), ready(&fds[1])))
}

/// Writes `line` and a newline, flushed: false when the reader is gone.
fn say(out: &mut dyn Write, line: &str) -> bool {
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}

/// The ring's lines as they arrive on the courier's side (an exec's output
/// comes in chunks): each complete line is passed on, a partial one kept.
#[derive(Default)]
pub struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    pub fn feed(&mut self, bytes: &[u8], on: &mut dyn FnMut(&str)) {
        self.partial.extend_from_slice(bytes);
        while let Some(i) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            on(String::from_utf8_lossy(&line[..i]).trim());
        }
        // A stream that never says a newline is not a ring: bounded.
        if self.partial.len() > 4096 {
            self.partial.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_across_chunks_and_bounded() {
        let mut l = Lines::default();
        let mut got = Vec::new();
        l.feed(b"rea", &mut |s| got.push(s.to_string()));
        l.feed(b"dy\nring\nti", &mut |s| got.push(s.to_string()));
        l.feed(b"ck\n", &mut |s| got.push(s.to_string()));
        assert_eq!(got, ["ready", "ring", "tick"]);
        l.feed(&[b'x'; 5000], &mut |s| got.push(s.to_string()));
        l.feed(b"ring\n", &mut |s| got.push(s.to_string()));
        assert_eq!(got.last().map(String::as_str), Some("ring"));
    }
}
