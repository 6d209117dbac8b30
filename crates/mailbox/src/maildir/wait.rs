//! Waiting for mail: an inotify watch on `new/` (through `fs::Watcher`),
//! rechecked on every wake, with a short tick on 9P filesystems where the
//! host's deliveries raise no event.

use std::path::Path;
use std::time::Duration;

use rustix::io::Errno;

use super::{Maildir, Sub};
use base::error::{Error, Exit, Result, errno_io};

impl Maildir {
    /// Blocks until `ready()` says so or `timeout` passes; true when ready.
    /// `ready` is asked once at the start and again after every change in
    /// `new/`.  Uses inotify, not polling: the watch is set before the first
    /// check, so an arrival between the two is not missed.  On a 9P
    /// filesystem (a gVisor sandbox's mounts, [`shared_from_outside`]) it
    /// also rescans every [`OUTSIDE_TICK`], since the host's deliveries
    /// raise no event there.
    pub fn wait_until(
        &self,
        timeout: Option<Duration>,
        mut ready: impl FnMut() -> Result<bool>,
    ) -> Result<bool> {
        use base::fs::{Watcher, Woke};
        let dir = self.sub(Sub::New);
        let watcher = Watcher::new().map_err(|e| Error::io("cannot watch", &dir, e))?;
        watcher
            .add(&dir)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot watch", &dir, e))?;
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let tick = shared_from_outside(&dir).then_some(OUTSIDE_TICK);
        loop {
            if ready()? {
                return Ok(true);
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return Ok(false),
                },
                None => None,
            };
            // On a filesystem whose changes from outside inotify never
            // reports, wake on a short tick too (see `shared_from_outside`).
            let left = match (left, tick) {
                (Some(l), Some(t)) => Some(l.min(t)),
                (l, t) => l.or(t),
            };
            // Whatever woke us, the directory itself is the truth.
            match watcher
                .wait(left)
                .map_err(|e| Error::io("cannot wait on", &dir, e))?
            {
                Woke::Gone(_) => {
                    return Err(Error::io_as(
                        Exit::NoInput,
                        "mailbox directory was removed while waiting",
                        &dir,
                        errno_io(Errno::NOENT),
                    ));
                }
                Woke::Timeout | Woke::Changed | Woke::Overflow => {}
            }
        }
    }

    /// Blocks until `new/` has any entry or `timeout` passes.
    pub fn wait_new(&self, timeout: Option<Duration>) -> Result<bool> {
        self.wait_until(timeout, || self.has_new())
    }

    /// True when `new/` has at least one entry, of any kind.
    pub fn has_new(&self) -> Result<bool> {
        let dir = self.sub(Sub::New);
        let mut rd = std::fs::read_dir(&dir)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot read mailbox directory", &dir, e))?;
        Ok(rd.next().is_some())
    }
}

/// How often a waiter rescans a directory whose outside changes inotify
/// does not report.
pub const OUTSIDE_TICK: Duration = Duration::from_millis(100);

/// True when `dir` is on a 9P filesystem: a gVisor sandbox's bind mounts
/// (runsc's gofer) and other 9P shares, where inotify reports the changes
/// made inside the sandbox but never those made by the host (the mediator's
/// deliveries).  A waiter there also rescans every [`OUTSIDE_TICK`].
pub fn shared_from_outside(dir: &Path) -> bool {
    const V9FS_MAGIC: u64 = 0x0102_1997;
    rustix::fs::statfs(dir).is_ok_and(|s| s.f_type as u64 == V9FS_MAGIC)
}
