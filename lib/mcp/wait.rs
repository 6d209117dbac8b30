//! `wait`: block until messages arrive in the inbox, on an inotify watch
//! driven by the tokio reactor (no polling), and stop at once when the
//! client cancels the call or goes away.
//!
//! What counts is an unread message (in `new/`) that this session has not
//! reported yet, by `inbox`, `show` or an earlier `wait`.  So a message
//! delivered between an agent's `inbox` and its `wait` is returned at once
//! instead of falling between the two calls, and the same message is never
//! returned twice.  The watch is set before `new/` is first looked at, so a
//! delivery between the two is seen.  The directory is the truth; events
//! only say when to look.

use std::collections::HashSet;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::fs::inotify;
use tokio::io::unix::AsyncFd;

use crate::error::{Error, Exit, Result, errno_io};
use crate::maildir::{Found, Maildir, Sub};
use crate::message::{Kind, Message};

/// How a wait ended.
#[derive(Debug)]
pub enum Waited {
    /// Messages (of the asked kinds) that arrived during the wait, oldest first.
    Arrived(Vec<Message>),
    TimedOut,
    /// The client cancelled the call or closed the connection.
    Stopped,
}

/// Waits up to `timeout` for unread messages of `kinds` (any kind when
/// empty) whose names are not in `reported`, and adds the names it returns;
/// `stop` ends the wait early.
pub async fn wait(
    inbox: &Maildir,
    kinds: &[Kind],
    timeout: Duration,
    reported: &Mutex<HashSet<OsString>>,
    stop: impl Future<Output = ()>,
) -> Result<Waited> {
    let dir = inbox.sub(Sub::New);
    let ino = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
        .map_err(|e| Error::io("cannot watch", &dir, errno_io(e)))?;
    inotify::add_watch(
        &ino,
        &dir,
        inotify::WatchFlags::MOVED_TO
            | inotify::WatchFlags::CREATE
            | inotify::WatchFlags::DELETE_SELF
            | inotify::WatchFlags::MOVE_SELF,
    )
    .map_err(|e| Error::io_as(Exit::NoInput, "cannot watch", &dir, errno_io(e)))?;
    // SAFETY: an OwnedFd keeps its descriptor open and returns the same one
    // from as_raw_fd until it is dropped, which happens with the AsyncFd.
    let fd = unsafe { AsyncFd::register_with_interest(ino, tokio::io::Interest::READABLE) }
        .map_err(|e| Error::io("cannot watch", &dir, e.into()))?;
    // Entries this call passed over: unreadable, or of other kinds.
    let mut skip = HashSet::new();
    let deadline = tokio::time::Instant::from_std(Instant::now() + timeout);
    let mut stop = std::pin::pin!(stop);
    loop {
        let arrived = fresh(inbox, reported, &mut skip, kinds)?;
        if !arrived.is_empty() {
            return Ok(Waited::Arrived(arrived));
        }
        tokio::select! {
            ready = fd.readable() => {
                let mut guard = ready.map_err(|e| Error::io("cannot wait on", &dir, e))?;
                let gone = drain(guard.get_inner());
                guard.clear_ready();
                if gone {
                    return Err(Error::io_as(
                        Exit::NoInput,
                        "the inbox was removed while waiting",
                        &dir,
                        errno_io(rustix::io::Errno::NOENT),
                    ));
                }
            }
            _ = tokio::time::sleep_until(deadline) => return Ok(Waited::TimedOut),
            _ = &mut stop => return Ok(Waited::Stopped),
        }
    }
}

/// Reads every pending event; true when the watched directory went away.
fn drain(ino: &OwnedFd) -> bool {
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut reader = inotify::Reader::new(ino, &mut buf);
    let mut gone = false;
    while let Ok(ev) = reader.next() {
        gone |= ev.events().intersects(
            inotify::ReadFlags::DELETE_SELF
                | inotify::ReadFlags::MOVE_SELF
                | inotify::ReadFlags::IGNORED,
        );
    }
    gone
}

/// The readable messages of `kinds` in `new/` whose names are neither
/// reported nor skipped; they become reported, the others skipped.
fn fresh(
    inbox: &Maildir,
    reported: &Mutex<HashSet<OsString>>,
    skip: &mut HashSet<OsString>,
    kinds: &[Kind],
) -> Result<Vec<Message>> {
    let names = inbox.names(Sub::New)?;
    let mut reported = reported
        .lock()
        .expect("the reported set is never poisoned because nothing panics holding it");
    let mut out = Vec::new();
    for name in names {
        if reported.contains(&name) || skip.contains(&name) {
            continue;
        }
        match inbox.read(Sub::New, &name) {
            // Acknowledged (moved to cur/) since it was listed.
            Found::Gone => {}
            Found::Message(m) if kinds.is_empty() || kinds.contains(&m.kind) => {
                out.push(m);
                reported.insert(name);
            }
            Found::Message(_) | Found::Bad(_) | Found::NotFile(_) => {
                skip.insert(name);
            }
        }
    }
    Ok(out)
}
