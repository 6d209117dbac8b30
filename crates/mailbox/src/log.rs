//! The log: every message the mediator saw and every decision it took
//! (mailbox-spec.md, "THE LOG").
//!
//! The log is a directory, `ROOT/log/`, with Maildir's `tmp/` and `new/`.
//! Each event is one file in `new/` whose name is derived from what it records
//! (`MSGID.EVENT` or `MSGID.EVENT.PARTY`), written by the delivery procedure
//! with `deliver_once`.  Appending the same event twice therefore leaves one
//! file: that is what makes the mediator's "log, then act" steps idempotent
//! across crashes, and it lets lw-sync watch the directory for renames.
//! The mediator writes a batch's entries into one batch file instead
//! (log/batch.rs); entries keep their names either way, and every reader
//! here reads both.  Readers order entries by `(logged, name)`.

pub mod batch;

use std::ffi::OsStr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::maildir::{Delivered, Maildir, Sub};
use crate::message::Message;
use base::error::{Exit, Result};

pub const LOG_VERSION: u32 = 1;

/// What the mediator did with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Delivered into the inboxes in `to`.
    Forward,
    /// Put into the held queue; an operator releases or drops it.
    Hold,
    /// Put into the human queue.
    Escalate,
    /// Could not be delivered; a bounce went back to the sender.
    Bounce,
    /// The file could not be read as a message; moved to quarantine.
    Quarantine,
    /// A held message was released by an operator (then forwarded).
    Release,
    /// A held message was dropped by an operator.
    Drop,
    /// A recipient read (acked) the message: the receipt.
    Read,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Forward => "forward",
            Action::Hold => "hold",
            Action::Escalate => "escalate",
            Action::Bounce => "bounce",
            Action::Quarantine => "quarantine",
            Action::Release => "release",
            Action::Drop => "drop",
            Action::Read => "read",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    pub action: Action,
    /// The parties the action concerns (recipients, the reader of a receipt).
    #[serde(default)]
    pub to: Vec<String>,
    /// Why, in words an operator can act on (which policy rule, which limit).
    pub reason: String,
    /// A refusal that lw-sync does not mirror one by one: a post over the
    /// sender's held-queue cap (one status message to a person stands for
    /// the whole run of them; mailbox-spec.md, "THE HELD QUEUE").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quiet: bool,
}

/// One log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub version: u32,
    /// The entry's file name (also its identity for lw-sync).
    pub name: String,
    /// When the entry was logged (RFC 3339 UTC).
    pub logged: String,
    /// The message id the entry is about.
    pub message_id: String,
    /// The sender, taken from the outbox the file sat in (never from the file).
    pub sender: String,
    /// The message as routed, with `from` set to `sender`; absent for
    /// quarantined files and for receipts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    pub decision: Decision,
}

/// What the door says by itself (the held-queue cap, a sender's log
/// budget, the model proxy's caps): a `status` from `mediator` to `to`,
/// logged as an escalation with `reason`.  `id` derives from what caused
/// it, so a restart writes the same entry.
pub struct Notice {
    pub id: String,
    pub to: Vec<String>,
    pub subject: String,
    pub body: String,
    /// When it happened (the message's `created`).
    pub at: std::time::Duration,
    pub reason: String,
}

impl Notice {
    pub fn entry(self) -> Entry {
        let m = Message {
            version: crate::message::VERSION,
            id: self.id.clone(),
            from: crate::layout::MEDIATOR.into(),
            to: self.to.clone(),
            kind: crate::message::Kind::Status,
            subject: self.subject,
            body: self.body,
            refs: vec![],
            in_reply_to: None,
            created: base::time::rfc3339(self.at),
        };
        Entry {
            version: LOG_VERSION,
            name: Entry::name_for(&self.id, Action::Escalate, None),
            logged: base::time::rfc3339(base::time::now()),
            message_id: self.id,
            sender: crate::layout::MEDIATOR.into(),
            message: Some(m),
            decision: Decision {
                quiet: false,
                action: Action::Escalate,
                to: self.to,
                reason: self.reason,
            },
        }
    }
}

impl Entry {
    /// The file name for an event about a message: `MSGID.ACTION[.PARTY]`.
    pub fn name_for(message_id: &str, action: Action, party: Option<&str>) -> String {
        match party {
            Some(p) => format!("{message_id}.{}.{p}", action.as_str()),
            None => format!("{message_id}.{}", action.as_str()),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self)
            .expect("a log Entry serialises because all its fields are plain data");
        v.push(b'\n');
        v
    }

    pub fn parse(bytes: &[u8]) -> std::result::Result<Entry, String> {
        let e: Entry =
            serde_json::from_slice(bytes).map_err(|e| format!("not a log entry: {e}"))?;
        if e.version != LOG_VERSION {
            return Err(format!("unsupported log version {}", e.version));
        }
        Ok(e)
    }
}

/// The log directory.
#[derive(Clone, Debug)]
pub struct Log {
    pub dir: Maildir,
    /// The index of batch files' entries, built on the first lookup that
    /// needs it and brought up to date on each miss.
    index: std::sync::Arc<std::sync::Mutex<Option<(std::os::fd::OwnedFd, batch::Index)>>>,
}

/// One entry of [`Log::listing`]: its name and when its file was written.
#[derive(Clone, Debug)]
pub struct Listed {
    pub name: String,
    pub mtime_ns: i128,
}

/// An entry that could not be read, with the reason.
#[derive(Debug)]
pub struct BadEntry {
    pub name: String,
    pub reason: String,
}

impl Log {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Log {
            dir: Maildir::new(dir),
            index: Default::default(),
        }
    }

    /// Runs `f` on the batch index, brought up to date first.
    fn with_index<T>(
        &self,
        f: impl FnOnce(&std::os::fd::OwnedFd, &batch::Index) -> T,
    ) -> Option<T> {
        let mut g = self.index.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            let fd = base::fs::open_dir_no_links(&self.dir.sub(Sub::New)).ok()?;
            *g = Some((fd, batch::Index::default()));
        }
        let (fd, ix) = g.as_mut()?;
        ix.refresh(&*fd).ok()?;
        Some(f(fd, ix))
    }

    /// Appends `e` unless an entry of the same name exists; true when written.
    pub fn append(&self, e: &Entry) -> Result<bool> {
        Ok(matches!(
            self.dir.deliver_once(&e.name, &e.to_bytes())?,
            Delivered::New(_)
        ))
    }

    /// True when an entry of that name exists (in a file of its own or
    /// in a batch file).
    pub fn has(&self, name: &str) -> bool {
        self.dir.sub(Sub::New).join(name).symlink_metadata().is_ok()
            || self.with_index(|_, ix| ix.has(name)).unwrap_or(false)
    }

    /// Reads one entry by name (from its own file or a batch file).
    pub fn read(&self, name: &OsStr) -> std::result::Result<Entry, String> {
        let path = self.dir.sub(Sub::New).join(name);
        let meta = match path.symlink_metadata() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !batch::is_batch(name) => {
                let found = name
                    .to_str()
                    .and_then(|n| self.with_index(|fd, ix| ix.read(fd, n)).flatten());
                return found.unwrap_or_else(|| Err(format!("cannot stat: {e}")));
            }
            m => m,
        }
        .map_err(|e| format!("cannot stat: {e}"))?;
        if !meta.file_type().is_file() {
            return Err("not a regular file".into());
        }
        if meta.len() > 2 * crate::message::MAX_FILE {
            return Err(format!(
                "entry is {} bytes; larger than any entry loopwright writes",
                meta.len()
            ));
        }
        let bytes = std::fs::read(&path).map_err(|e| format!("cannot read: {e}"))?;
        Entry::parse(&bytes)
    }

    /// Reads entry `name` of the `new/` directory open as `dir`: None when
    /// there is no such entry, or it cannot be read as one (the mediator's
    /// lookups go through one descriptor of `log/new/`: a path would walk
    /// every component of the root again for each of a message's lookups).
    pub fn read_in(dir: &impl std::os::fd::AsFd, name: &str) -> Option<Entry> {
        use rustix::fs::{self as rfs, Mode, OFlags};
        // NONBLOCK: a FIFO planted under the name is not waited on.
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rfs::openat(dir, name, flags, Mode::empty()).ok()?;
        let st = rfs::fstat(&fd).ok()?;
        let len = u64::try_from(st.st_size).ok()?;
        if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::RegularFile
            || len > 2 * crate::message::MAX_FILE
        {
            return None;
        }
        let mut bytes = Vec::with_capacity(len as usize);
        std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut bytes).ok()?;
        Entry::parse(&bytes).ok()
    }

    /// Every entry in log order, plus those that could not be read.  Entries
    /// are streamed in name order by `for_each` when memory matters; this
    /// collects them for the commands that print or sync the whole log.
    pub fn entries(&self) -> Result<(Vec<Entry>, Vec<BadEntry>)> {
        let names = match self.dir.names(Sub::New) {
            Ok(n) => n,
            Err(e) if e.exit == Exit::NoInput && !self.dir.sub(Sub::New).exists() => {
                return Ok((vec![], vec![]));
            }
            Err(e) => return Err(e),
        };
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for n in names {
            if batch::is_batch(&n) {
                self.read_batch(&n, &mut good, &mut bad);
                continue;
            }
            match self.read(&n) {
                Ok(e) => good.push(e),
                Err(reason) => bad.push(BadEntry {
                    name: crate::maildir::escape_name(&n),
                    reason,
                }),
            }
        }
        good.sort_by(|a, b| a.logged.cmp(&b.logged).then_with(|| a.name.cmp(&b.name)));
        // One name, one entry: an entry file and a batch line of the same
        // name (a log being upgraded) are the same event.
        let mut seen = std::collections::HashSet::new();
        good.retain(|e| seen.insert(e.name.clone()));
        Ok((good, bad))
    }

    /// The entries of batch file `n` into `good`, its unreadable lines
    /// (or the whole file) into `bad`.
    fn read_batch(&self, n: &OsStr, good: &mut Vec<Entry>, bad: &mut Vec<BadEntry>) {
        let name = crate::maildir::escape_name(n);
        let dir = match base::fs::open_dir_no_links(&self.dir.sub(Sub::New)) {
            Ok(d) => d,
            Err(e) => {
                let reason = format!("cannot open: {e}");
                return bad.push(BadEntry { name, reason });
            }
        };
        match batch::read_file_in(&dir, n, batch::MAX_BATCH_FILE) {
            Err(reason) => bad.push(BadEntry { name, reason }),
            Ok(bytes) => {
                for l in batch::parse(&bytes) {
                    match l.entry {
                        Ok(e) => good.push(e),
                        Err(reason) => bad.push(BadEntry {
                            name: format!("{name} line {}", l.number),
                            reason,
                        }),
                    }
                }
            }
        }
    }

    /// The name of every entry and when its file (its own or its batch
    /// file) was written, in no order; lines that cannot be read are left
    /// out (`entries` reports them).
    pub fn listing(&self) -> Result<Vec<Listed>> {
        use std::os::unix::fs::MetadataExt as _;
        let names = match self.dir.names(Sub::New) {
            Ok(n) => n,
            Err(e) if e.exit == Exit::NoInput && !self.dir.sub(Sub::New).exists() => {
                return Ok(vec![]);
            }
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for n in names {
            if n.as_encoded_bytes().starts_with(b".") {
                continue;
            }
            let Ok(m) = self.dir.sub(Sub::New).join(&n).symlink_metadata() else {
                continue;
            };
            let mtime_ns =
                (i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec())).max(0);
            if batch::is_batch(&n) {
                let (mut good, mut bad) = (Vec::new(), Vec::new());
                self.read_batch(&n, &mut good, &mut bad);
                out.extend(good.into_iter().map(|e| Listed {
                    name: e.name,
                    mtime_ns,
                }));
            } else if let Ok(name) = n.into_string() {
                out.push(Listed { name, mtime_ns });
            }
        }
        Ok(out)
    }

    pub fn create(&self) -> Result<()> {
        self.dir.create()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_in_finds_an_entry_and_nothing_that_is_not_one() {
        let d = std::env::temp_dir().join(format!("lw-log-{}", base::id::new_id()));
        let log = Log::new(&d);
        log.create().unwrap();
        let e = Notice {
            id: base::id::new_id(),
            to: vec![crate::layout::HUMAN.into()],
            subject: "s".into(),
            body: "b\n".into(),
            at: base::time::now(),
            reason: "r".into(),
        }
        .entry();
        assert!(log.append(&e).unwrap());
        let new = rustix::fs::open(
            d.join("new"),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        assert_eq!(Log::read_in(&new, &e.name), Some(e.clone()));
        assert_eq!(Log::read_in(&new, "1.forward"), None, "no such entry");
        // Neither followed nor waited on: a link to the entry, a FIFO.
        std::os::unix::fs::symlink(d.join("new").join(&e.name), d.join("new/2.forward")).unwrap();
        assert_eq!(Log::read_in(&new, "2.forward"), None, "a link");
        rustix::fs::mknodat(
            &new,
            "3.forward",
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert_eq!(Log::read_in(&new, "3.forward"), None, "a FIFO");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
