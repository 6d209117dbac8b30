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
//! The watch is the one `wait` uses (crates/base/src/fs's inotify watcher on the tokio
//! reactor, no polling), set before `new/` is first listed, so a delivery
//! between the subscription and the first look is not lost.  The directory
//! is the truth; events only say when to look.

use std::collections::HashSet;
use std::ffi::OsString;

use tokio::io::unix::AsyncFd;

use base::error::{Error, Exit, Result};
use mailbox::maildir::{Found, Maildir, Sub};

/// The one resource lw-mcp serves.
pub const URI: &str = "inbox://";

/// A watch on `inbox/new/`, set, with the names already there.
pub struct Bell {
    inbox: Maildir,
    fd: AsyncFd<base::fs::Watcher>,
    known: HashSet<OsString>,
}

impl Bell {
    /// Sets the watch, then lists what is already delivered (not news).
    pub fn start(inbox: Maildir) -> Result<Bell> {
        let dir = inbox.sub(Sub::New);
        let watcher = base::fs::Watcher::new().map_err(|e| Error::io("cannot watch", &dir, e))?;
        watcher
            .add(&dir)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot watch", &dir, e))?;
        // SAFETY: the watcher owns its descriptor and returns the same one
        // from as_raw_fd until it is dropped, which happens with the AsyncFd.
        #[allow(unsafe_code)]
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
            super::wait::woken(&self.fd, &dir, "the inbox was removed while subscribed").await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use mailbox::message::{Kind, Message};

    fn msg(id: &str) -> Message {
        Message {
            version: 1,
            id: id.into(),
            from: "web".into(),
            to: vec!["api".into()],
            kind: Kind::Status,
            subject: "news".into(),
            body: String::new(),
            refs: vec![],
            in_reply_to: None,
            created: "2026-12-03T14:00:00Z".into(),
        }
    }

    #[test]
    fn rings_once_per_delivered_message_and_not_for_old_bad_or_acked_ones() {
        let dir = std::env::temp_dir().join(format!("lw-mcp-bell-{}", base::id::new_id()));
        let inbox = Maildir::new(&dir);
        inbox.create().expect("a fresh maildir");
        let old = base::id::new_id();
        inbox.deliver_message(&msg(&old)).expect("delivered");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let mut bell = Bell::start(Maildir::new(&dir)).expect("the watch is set");
            let (a, b) = (base::id::new_id(), base::id::new_id());
            inbox.deliver_message(&msg(&a)).expect("delivered");
            inbox.deliver_message(&msg(&b)).expect("delivered");
            // Not a message: left for the quarantine, rings nothing.
            inbox.deliver("garbage", b"not json").expect("delivered");
            // Acked: moves out of new/, rings nothing.
            inbox.claim(std::ffi::OsStr::new(&old)).expect("claimed");
            let mut rung = 0;
            while rung < 2 {
                rung += bell.next().await.expect("the watch works");
            }
            assert_eq!(rung, 2, "a and b, once each");
            assert_eq!(bell.fresh().expect("listed"), 0, "nothing rings twice");
            let c = base::id::new_id();
            inbox.deliver_message(&msg(&c)).expect("delivered");
            assert_eq!(bell.next().await.expect("the watch works"), 1);
        });
        let _ = std::fs::remove_dir_all(&dir);
    }
}
