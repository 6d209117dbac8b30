//! `wait`: block until messages arrive in the inbox, on the one directory
//! watcher (crates/base/src/fs, inotify) driven by the tokio reactor (no
//! polling), and stop at once when the client cancels the call or goes away.
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
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

use base::error::{Error, Exit, Result, errno_io};
use mailbox::maildir::{Found, Maildir, Sub};
use mailbox::message::{Kind, Message};

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
    let watcher = base::fs::Watcher::new().map_err(|e| Error::io("cannot watch", &dir, e))?;
    watcher
        .add(&dir)
        .map_err(|e| Error::io_as(Exit::NoInput, "cannot watch", &dir, e))?;
    // SAFETY: the watcher owns its descriptor and returns the same one from
    // as_raw_fd until it is dropped, which happens with the AsyncFd.
    #[allow(unsafe_code)]
    let fd = unsafe { AsyncFd::register_with_interest(watcher, tokio::io::Interest::READABLE) }
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
            woke = woken(&fd, &dir, "the inbox was removed while waiting") => woke?,
            _ = tokio::time::sleep_until(deadline) => return Ok(Waited::TimedOut),
            _ = &mut stop => return Ok(Waited::Stopped),
        }
    }
}

/// Waits until the watch on `dir` (an inbox's `new/`) has events, and takes
/// them; the inbox gone is 66 with `gone` as the reason.
pub(crate) async fn woken(
    fd: &AsyncFd<base::fs::Watcher>,
    dir: &std::path::Path,
    gone: &str,
) -> Result<()> {
    let mut guard = fd
        .readable()
        .await
        .map_err(|e| Error::io("cannot wait on", dir, e))?;
    let woke = guard
        .get_inner()
        .take_events()
        .map_err(|e| Error::io("cannot wait on", dir, e))?;
    guard.clear_ready();
    if matches!(woke, base::fs::Woke::Gone(_)) {
        return Err(Error::io_as(
            Exit::NoInput,
            gone,
            dir,
            errno_io(rustix::io::Errno::NOENT),
        ));
    }
    Ok(())
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
