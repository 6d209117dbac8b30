//! The queues a person works: releasing and dropping held messages,
//! receipts for acknowledged messages, and what a removed sandbox left.

use crate::batch::{self, Batch, open_dir_at};
use crate::layout;
use crate::log::{Action, Decision, Entry, LOG_VERSION};
use base::error::{Error, Exit, Result, errno_io};
use rustix::fs::{self as rfs, AtFlags};
use rustix::io::Errno;
use std::ffi::OsStr;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;

use crate::message::Message;

use super::inspect::{Inspected, inspect};
use super::pure::decide::release;
use super::{Boxes, HELD, Mediator, lock_routes, mailbox_name, read_names};

impl Mediator {
    /// Drops the held messages of removed sandboxes (no registry record and
    /// no `sandboxes/NAME` any more, as `lw-sandbox rm` leaves it): logged as
    /// `drop`, archived in `held/cur/` (mailbox-spec.md, "THE HELD QUEUE").
    pub(super) fn archive_removed(&mut self, boxes: &mut Boxes, out: &mut dyn Write) -> Result<()> {
        let held = &boxes.list[HELD];
        let Ok(names) = read_names(&held.new) else {
            return Ok(());
        };
        let mut gone = Vec::new();
        for n in names {
            if let Inspected::Message(m) = inspect(&held.new, &n, true, None)
                && m.from != layout::HUMAN
                && m.from != layout::MEDIATOR
                && !self.state.known.contains_key(mailbox_name(&m.from))
                && rfs::statat(
                    &self.rootfd,
                    Path::new("sandboxes").join(mailbox_name(&m.from)),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .is_err_and(|e| e == Errno::NOENT)
            {
                gone.push((m.id, m.from));
            }
        }
        for (id, sender) in gone {
            let why = format!(
                "sender {sender} was removed (no registry record, no mailbox); kept in held/cur"
            );
            self.release_or_drop(boxes, &id, Some(&why), out)?;
        }
        Ok(())
    }

    /// Held messages whose release or drop was logged but not finished
    /// (an operator command died halfway): finish them.
    pub(super) fn finish_operator_actions(
        &mut self,
        boxes: &mut Boxes,
        out: &mut dyn Write,
    ) -> Result<()> {
        let names = read_names(&boxes.list[HELD].new)
            .map_err(|e| Error::io("cannot read", &boxes.list[HELD].path, errno_io(e)))?;
        for n in names {
            let Some(id) = n.to_str() else { continue };
            let rel = Entry::name_for(id, Action::Release, None);
            let drop = Entry::name_for(id, Action::Drop, None);
            if self.index.has(&rel) || self.index.has(&drop) {
                self.release_or_drop(boxes, id, None, out)?;
            }
        }
        Ok(())
    }

    /// Releases (`drop_reason` None) or drops a held message.
    pub(super) fn release_or_drop(
        &mut self,
        boxes: &mut Boxes,
        id: &str,
        drop_reason: Option<&str>,
        out: &mut dyn Write,
    ) -> Result<Entry> {
        let m = self.held_message(boxes, id)?;
        let mut entries = self.operator_entries(&m, id, drop_reason);
        let refs: Vec<&Entry> = entries.iter().collect();
        self.log_entries(boxes, &refs, out)?;
        let mut g = Batch::with_sync(self.sync);
        for e in &entries {
            self.stage_deliveries(boxes, &mut g, e, &m)?;
        }
        g.commit(&boxes.list)?;
        let held = &boxes.list[HELD];
        batch::move_noreplace(&held.new, OsStr::new(id), &held.cur, OsStr::new(id))
            .map_err(|e| Error::io("cannot move", &held.path.join("new").join(id), errno_io(e)))?;
        held.fsync_cur()?;
        Ok(entries
            .pop()
            .expect("a release or drop logs at least one entry"))
    }

    /// The held message `id`, or why an operator cannot act on it.
    fn held_message(&self, boxes: &Boxes, id: &str) -> Result<Message> {
        if !base::id::is_valid(id) {
            return Err(Error::usage(format!(
                "'{}' is not a message id",
                id.escape_debug()
            )));
        }
        match inspect(&boxes.list[HELD].new, OsStr::new(id), true, None) {
            Inspected::Message(m) => Ok(m),
            Inspected::Gone => {
                for (a, done) in [(Action::Release, "released"), (Action::Drop, "dropped")] {
                    let n = Entry::name_for(id, a, None);
                    if self.index.has(&n) {
                        return Err(Error::new(
                            Exit::DataErr,
                            format!("message {id} was {done} already (log entry {n})"),
                        ));
                    }
                }
                Err(Error::new(
                    Exit::NoInput,
                    format!("no held message {id}; see 'lw-mediate held'"),
                ))
            }
            Inspected::Bad(why, _) => Err(Error::data(format!("held message {id} {why}"))),
        }
    }

    /// The entries of a release or drop: those an earlier, unfinished one
    /// logged, else new ones (the main entry last).
    fn operator_entries(&self, m: &Message, id: &str, drop_reason: Option<&str>) -> Vec<Entry> {
        if let Some(e) = self.logged(id, Action::Drop) {
            return vec![e];
        }
        if let Some(e) = self.logged(id, Action::Release) {
            return std::iter::once(e)
                .chain(self.logged(id, Action::Bounce))
                .collect();
        }
        let had_bounce = self.logged(id, Action::Bounce).is_some();
        let now = base::time::now();
        match drop_reason {
            Some(reason) => {
                let d = Decision {
                    quiet: false,
                    action: Action::Drop,
                    to: vec![],
                    reason: reason.to_string(),
                };
                let mut e = self.state.entry(m, &m.from, d, now);
                e.name = Entry::name_for(id, Action::Drop, None);
                vec![e]
            }
            None => {
                let asker = self.asker_of(m);
                let (state, policy) = (&self.state, &self.policy);
                release(state, policy, m, asker.as_deref(), had_bounce, now)
            }
        }
    }

    /// Releases a held message to the recipients its route names now.
    pub fn release(&mut self, id: &str, out: &mut dyn Write) -> Result<Entry> {
        let _routes = lock_routes(&self.root)?;
        self.refresh_registry()?;
        let mut boxes = self.open_boxes()?;
        self.release_or_drop(&mut boxes, id, None, out)
    }

    /// Drops a held message: logged, moved to `held/cur/`, never deleted.
    pub fn drop_held(&mut self, id: &str, reason: &str, out: &mut dyn Write) -> Result<Entry> {
        let _routes = lock_routes(&self.root)?;
        let mut boxes = self.open_boxes()?;
        let why = format!("dropped by an operator: {reason}");
        self.release_or_drop(&mut boxes, id, Some(&why), out)
    }

    /// Records receipts: a message in a recipient's `inbox/cur/` was acked.
    /// An inbox whose `cur/` did not change since the last look is skipped,
    /// and names are streamed.  The names already looked at are remembered
    /// (16 bytes each, for this run): a changed `cur/` costs one read of the
    /// directory and a look at the new names only, so acking N messages one
    /// by one costs O(N) file operations, not O(N^2).
    pub(super) fn take_receipts(&mut self, boxes: &mut Boxes, out: &mut dyn Write) -> Result<()> {
        let mut names: Vec<String> = self.state.known.keys().cloned().collect();
        names.sort();
        let now_ns = base::time::now().as_nanos() as i128;
        for r in names {
            let rel = Path::new("sandboxes").join(&r).join("inbox").join("cur");
            let Ok(fd) = open_dir_at(Some(&self.rootfd), &rel) else {
                continue;
            };
            let Ok(st) = rfs::fstat(&fd) else { continue };
            let mtime = st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128;
            // A change within the file system's timestamp granularity of the
            // last look could hide behind an equal mtime: look again then.
            if self.state.memory.receipts.get(&r) == Some(&mtime) && now_ns - mtime > 2_000_000_000
            {
                continue;
            }
            self.receipts_in(boxes, &r, &fd, &rel, out)?;
            self.state.memory.receipts.insert(r, mtime);
            self.state.memory.dirty = true;
        }
        Ok(())
    }

    /// Logs the receipts for the names in `r`'s `inbox/cur/` (open as
    /// `fd`) not looked at before, in batches.
    fn receipts_in(
        &mut self,
        boxes: &mut Boxes,
        r: &str,
        fd: &OwnedFd,
        rel: &Path,
        out: &mut dyn Write,
    ) -> Result<()> {
        let mut pending: Vec<Entry> = Vec::new();
        let mut fresh: Vec<u128> = Vec::new();
        let dir = rfs::Dir::read_from(fd)
            .map_err(|e| Error::io("cannot read", &self.root.dir.join(rel), errno_io(e)))?;
        for ent in dir {
            let Ok(ent) = ent else { break };
            let Ok(id) = ent.file_name().to_str() else {
                continue;
            };
            if !base::id::is_valid(id) {
                continue;
            }
            // Names looked at before cost a hash lookup, not a stat: a
            // pass costs one read of the directory plus the new names.
            let key = id_key(id);
            if self.receipts_seen.get(r).is_some_and(|s| s.contains(&key)) {
                continue;
            }
            let Some(e) = self.receipt_for(r, id, key) else {
                continue;
            };
            // One name per directory entry: `e.name` is not in `pending`.
            if !self.index.has(&e.name) {
                pending.push(e);
            }
            // Remembered once committed, below.
            fresh.push(key);
            if pending.len() >= self.batch {
                self.commit_receipts(boxes, &mut pending, out)?;
            }
        }
        self.commit_receipts(boxes, &mut pending, out)?;
        self.receipts_seen
            .entry(r.to_string())
            .or_default()
            .extend(fresh);
        Ok(())
    }

    fn commit_receipts(
        &mut self,
        boxes: &Boxes,
        pending: &mut Vec<Entry>,
        out: &mut dyn Write,
    ) -> Result<()> {
        let refs: Vec<&Entry> = pending.iter().collect();
        self.commit_log_file(boxes, &refs)?;
        for e in pending.drain(..) {
            self.count(&e);
            self.print(out, &e)?;
        }
        Ok(())
    }

    /// The receipt entry `r` acking message `id` calls for: None when it is
    /// logged already, or the message was not routed to `r` (a bounce, a
    /// stray file: never a receipt), which is then remembered under `key`.
    /// An entry that could not be read is looked at again next time.
    fn receipt_for(&mut self, r: &str, id: &str, key: u128) -> Option<Entry> {
        let rname = Entry::name_for(id, Action::Read, Some(r));
        let mut unreadable = false;
        let routed = if self.index.has(&rname) {
            None
        } else {
            [Action::Forward, Action::Release]
                .into_iter()
                .find_map(|a| {
                    let n = Entry::name_for(id, a, None);
                    match self.index.read(&self.log_new, &n)? {
                        Ok(e) => Some(e).filter(|e| e.decision.to.iter().any(|t| t == r)),
                        Err(_) => {
                            unreadable = true;
                            None
                        }
                    }
                })
        };
        let Some(src) = routed else {
            if !unreadable {
                self.receipts_seen
                    .entry(r.to_string())
                    .or_default()
                    .insert(key);
            }
            return None;
        };
        Some(Entry {
            version: LOG_VERSION,
            name: rname,
            logged: base::time::rfc3339(base::time::now()),
            message_id: id.to_string(),
            sender: src.sender.clone(),
            message: None,
            decision: Decision {
                quiet: false,
                action: Action::Read,
                to: vec![r.to_string()],
                reason: format!(
                    "{} acked it (moved it to inbox/cur)",
                    self.state.qualified(r)
                ),
            },
        })
    }
}

/// A name's key in [`Mediator::receipts_seen`]: its 128 random bits mixed
/// with its time, unique for ids the mediator writes.
fn id_key(id: &str) -> u128 {
    let rand = id
        .rsplit('.')
        .next()
        .and_then(|h| u128::from_str_radix(h, 16).ok())
        .unwrap_or(0);
    let t = base::id::time_of(id).unwrap_or_default().as_nanos();
    rand ^ t.rotate_left(64)
}
