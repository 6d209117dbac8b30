//! One directory watcher, on inotify: no polling, no thread, no async
//! runtime (lw-inbox links it and stays small).
//!
//! A watch reports that something may have changed, never what: callers
//! treat the directories as the truth and rescan them after every wake-up.
//! A full event queue (`IN_Q_OVERFLOW`) is reported as [`Woke::Overflow`],
//! which means the same: rescan.  Watches are set before the caller's first
//! scan, so an arrival between the two is seen by one or the other.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;

use crate::error::errno_io;

/// Why [`Watcher::wait`] returned.
#[derive(Debug, PartialEq, Eq)]
pub enum Woke {
    /// The timeout passed with nothing new.
    Timeout,
    /// Something arrived in (or was written to) a watched directory.
    Changed,
    /// The kernel dropped events: rescan everything.
    Overflow,
    /// A watched directory itself was removed or moved away.
    Gone(PathBuf),
}

/// A set of watched directories.  Its descriptor (`AsRawFd`) becomes
/// readable when an event is queued.
pub struct Watcher {
    ino: OwnedFd,
    dirs: Mutex<HashMap<i32, PathBuf>>,
}

impl Watcher {
    pub fn new() -> io::Result<Watcher> {
        let ino = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).map_err(errno_io)?;
        Ok(Watcher {
            ino,
            dirs: Mutex::new(HashMap::new()),
        })
    }

    /// Watches `dir` for arrivals: files created, moved in, or closed after
    /// writing, and for its own removal.  A symbolic link is not followed
    /// and a non-directory is refused (`ENOTDIR`), so a planted link cannot
    /// redirect the watch.  Adding a directory twice is harmless.
    pub fn add(&self, dir: &Path) -> io::Result<()> {
        self.add_flags(dir, WatchFlags::CLOSE_WRITE)
    }

    /// Like [`add`](Self::add), for names that arrive only (created or moved
    /// in), not files written in place: a directory of records replaced by
    /// rename, where files opened for writing and closed (lock files) must
    /// not wake anyone.
    pub fn add_arrivals(&self, dir: &Path) -> io::Result<()> {
        self.add_flags(dir, WatchFlags::empty())
    }

    fn add_flags(&self, dir: &Path, more: WatchFlags) -> io::Result<()> {
        let flags = WatchFlags::MOVED_TO
            | WatchFlags::CREATE
            | more
            | WatchFlags::DELETE_SELF
            | WatchFlags::MOVE_SELF
            | WatchFlags::ONLYDIR
            | WatchFlags::DONT_FOLLOW;
        let wd = inotify::add_watch(&self.ino, dir, flags).map_err(errno_io)?;
        self.dirs
            .lock()
            .expect("the watch list is never poisoned: nothing panics holding it")
            .insert(wd, dir.to_path_buf());
        Ok(())
    }

    /// Blocks until something happens in a watched directory or `timeout`
    /// passes (`None`: no limit).  Interrupted waits return `Changed`, so a
    /// caller rescans rather than missing anything.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Woke> {
        if !self.ready(timeout)? {
            return Ok(Woke::Timeout);
        }
        self.drain()
    }

    /// Like [`wait`](Self::wait), then keeps draining until nothing more has
    /// come for `quiet`: a burst of arrivals wakes the caller once.
    pub fn wait_settled(&self, timeout: Option<Duration>, quiet: Duration) -> io::Result<Woke> {
        let first = self.wait(timeout)?;
        if first != Woke::Changed {
            return Ok(first);
        }
        let limit = Instant::now() + quiet * 10;
        while Instant::now() < limit && self.ready(Some(quiet))? {
            let next = self.drain()?;
            if next != Woke::Changed {
                return Ok(next);
            }
        }
        Ok(Woke::Changed)
    }

    fn ready(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let ts = timeout.map(|t| rustix::event::Timespec {
            tv_sec: t.as_secs() as i64,
            tv_nsec: t.subsec_nanos() as i64,
        });
        let mut fds = [rustix::event::PollFd::new(
            &self.ino,
            rustix::event::PollFlags::IN,
        )];
        match rustix::event::poll(&mut fds, ts.as_ref()) {
            Ok(0) => Ok(false),
            Ok(_) | Err(Errno::INTR) => Ok(true),
            Err(e) => Err(errno_io(e)),
        }
    }

    /// Reads the events already queued, without blocking: `Changed` (or
    /// `Overflow`, `Gone`) when there were any.  For callers that wait on the
    /// watcher's descriptor in their own event loop (lw-mcp's `wait`).
    pub fn take_events(&self) -> io::Result<Woke> {
        self.drain()
    }

    fn drain(&self) -> io::Result<Woke> {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 8192];
        let mut reader = inotify::Reader::new(&self.ino, &mut buf);
        let mut woke = Woke::Changed;
        loop {
            match reader.next() {
                Ok(ev) => {
                    let flags = ev.events();
                    if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                        if woke == Woke::Changed {
                            woke = Woke::Overflow;
                        }
                    } else if flags.intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF) {
                        let gone = self
                            .dirs
                            .lock()
                            .expect("the watch list is never poisoned: nothing panics holding it")
                            .remove(&ev.wd());
                        if let Some(p) = gone {
                            woke = Woke::Gone(p);
                        }
                    }
                }
                Err(Errno::AGAIN) | Err(Errno::INTR) => return Ok(woke),
                Err(e) => return Err(errno_io(e)),
            }
        }
    }
}

impl AsRawFd for Watcher {
    fn as_raw_fd(&self) -> RawFd {
        self.ino.as_raw_fd()
    }
}

impl AsFd for Watcher {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ino.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_wake_and_quiet_times_out() {
        let d = std::env::temp_dir().join(format!("lw-watch-{}", crate::id::new_id()));
        std::fs::create_dir_all(&d).expect("temp dir");
        let w = Watcher::new().expect("inotify");
        w.add(&d).expect("watch");
        assert_eq!(
            w.wait(Some(Duration::from_millis(20))).expect("wait"),
            Woke::Timeout
        );
        std::fs::write(d.join("a"), b"x").expect("write");
        assert_eq!(
            w.wait(Some(Duration::from_secs(5))).expect("wait"),
            Woke::Changed
        );
        std::fs::remove_file(d.join("a")).expect("rm");
        std::fs::remove_dir(&d).expect("rmdir");
        assert_eq!(
            w.wait(Some(Duration::from_secs(5))).expect("wait"),
            Woke::Gone(d)
        );
    }

    #[test]
    fn a_symlink_is_not_watched_through() {
        let d = std::env::temp_dir().join(format!("lw-watch-{}", crate::id::new_id()));
        std::fs::create_dir_all(&d).expect("temp dir");
        std::os::unix::fs::symlink("/tmp", d.join("l")).expect("link");
        let w = Watcher::new().expect("inotify");
        assert!(w.add(&d.join("l")).is_err());
        std::fs::remove_dir_all(d).ok();
    }
}
