//! `inbox://`: the sandbox's inbox as an MCP resource, and the bell for any
//! MCP client (issue 32).
//!
//! `resources/read` of `inbox://` gives the unread messages (those in
//! `inbox/new/`), whole, as one JSON document; reading counts as showing
//! them, as the `inbox` tool does (see wait.rs).  A client that sends
//! `resources/subscribe` for `inbox://` gets one
//! `notifications/resources/updated` for each message delivered to
//! `inbox/new/` while it stays subscribed: what is there when it subscribes
//! is not news, an entry that does not parse (left for the mediator's
//! quarantine) rings nothing, and acknowledging (moving to `cur/`) rings
//! nothing.  The notification names only the URI, as MCP defines it; the
//! client reads the resource to see what came.
//!
//! The watch is the one `wait` uses (lib/fs's inotify watcher on the tokio
//! reactor, no polling), set before `new/` is first listed, so a delivery
//! between the subscription and the first look is not lost.  The directory
//! is the truth; events only say when to look.

use std::collections::HashSet;
use std::ffi::OsString;

use tokio::io::unix::AsyncFd;

use crate::error::{Error, Exit, Result, errno_io};
use crate::maildir::{Found, Maildir, Sub};

/// The one resource lw-mcp serves.
pub const URI: &str = "inbox://";

/// A watch on `inbox/new/`, set, with the names already there.
pub struct Bell {
    inbox: Maildir,
    fd: AsyncFd<crate::fs::Watcher>,
    known: HashSet<OsString>,
}

impl Bell {
    /// Sets the watch, then lists what is already delivered (not news).
    pub fn start(inbox: Maildir) -> Result<Bell> {
        let dir = inbox.sub(Sub::New);
        let watcher = crate::fs::Watcher::new().map_err(|e| Error::io("cannot watch", &dir, e))?;
        watcher
            .add(&dir)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot watch", &dir, e))?;
        // SAFETY: the watcher owns its descriptor and returns the same one
        // from as_raw_fd until it is dropped, which happens with the AsyncFd.
        let fd = unsafe { AsyncFd::register_with_interest(watcher, tokio::io::Interest::READABLE) }
            .map_err(|e| Error::io("cannot watch", &dir, e.into()))?;
        let known = inbox.names(Sub::New)?.into_iter().collect();
        Ok(Bell { inbox, fd, known })
    }

    /// Waits until at least one new message is in `new/` and returns how
    /// many arrived since the last call (each counted once, ever).
    pub async fn next(&mut self) -> Result<usize> {
        let dir = self.inbox.sub(Sub::New);
        loop {
            let n = self.fresh()?;
            if n > 0 {
                return Ok(n);
            }
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|e| Error::io("cannot wait on", &dir, e))?;
            let woke = guard
                .get_inner()
                .take_events()
                .map_err(|e| Error::io("cannot wait on", &dir, e))?;
            guard.clear_ready();
            if matches!(woke, crate::fs::Woke::Gone(_)) {
                return Err(Error::io_as(
                    Exit::NoInput,
                    "the inbox was removed while subscribed",
                    &dir,
                    errno_io(rustix::io::Errno::NOENT),
                ));
            }
        }
    }

    /// Counts the names in `new/` not seen before that hold a message, and
    /// remembers every name now there (so the set stays as small as `new/`).
    fn fresh(&mut self) -> Result<usize> {
        let names = self.inbox.names(Sub::New)?;
        let mut n = 0;
        for name in &names {
            if self.known.contains(name) {
                continue;
            }
            if let Found::Message(_) = self.inbox.read(Sub::New, name) {
                n += 1;
            }
        }
        self.known = names.into_iter().collect();
        Ok(n)
    }
}
