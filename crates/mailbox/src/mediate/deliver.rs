//! Routing and delivery: a batch of outbox entries is decided, logged,
//! delivered and claimed, each step durable for the whole batch before the
//! next (crates/mailbox/src/batch.rs), so a crash anywhere gives each effect once.

use crate::batch::{self, Batch, OpenMaildir, open_dir_at};
use crate::layout;
use crate::log::{Action, Entry};
use crate::maildir::escape_name;
use crate::message::{self, Kind, Message};
use base::error::{Error, Exit, Result, errno_io};
use rustix::io::Errno;
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::collect::{Collected, Work};
use super::logfile::LogFile;
use super::pure::decide::{bounce_id, nobody_id};
use super::{Boxes, HELD, HUMAN, LOG, Mediator, QUARANTINE, mailbox_name, read_names};

impl Mediator {
    pub(super) fn open_boxes(&mut self) -> Result<Boxes> {
        self.refresh_index()?;
        let open = |rel: &str| OpenMaildir::open(&self.rootfd, &self.root.dir, Path::new(rel));
        Ok(Boxes {
            list: vec![
                open("log")?,
                open("human")?,
                open("held")?,
                open("quarantine")?,
            ],
            inbox: HashMap::new(),
        })
    }

    /// The Maildir a party receives in: the human queue or a sandbox inbox.
    pub(super) fn party_box(&self, boxes: &mut Boxes, party: &str) -> Result<usize> {
        let party = mailbox_name(party);
        if party == layout::HUMAN {
            return Ok(HUMAN);
        }
        if let Some(i) = boxes.inbox.get(party) {
            return Ok(*i);
        }
        if !layout::valid_name(party) {
            return Err(Error::new(
                Exit::Software,
                format!("'{}' is not a party name", party.escape_debug()),
            ));
        }
        let sfd = batch::ensure_dir_at(&self.rootfd, "sandboxes")
            .map_err(|e| Error::io("cannot open", &self.root.sandboxes_dir(), errno_io(e)))?;
        let _ = batch::ensure_dir_at(&sfd, party).map_err(|e| {
            Error::io(
                "cannot open",
                &self.root.sandboxes_dir().join(party),
                errno_io(e),
            )
        })?;
        let b = OpenMaildir::open(
            &self.rootfd,
            &self.root.dir,
            &Path::new("sandboxes").join(party).join("inbox"),
        )?;
        boxes.list.push(b);
        boxes.inbox.insert(party.to_string(), boxes.list.len() - 1);
        Ok(boxes.list.len() - 1)
    }

    /// The copies a logged entry calls for that are not delivered yet,
    /// their names reserved in `g` (see [`Batch::wants`]).
    pub(super) fn plan_copies(
        &mut self,
        boxes: &mut Boxes,
        g: &mut Batch,
        e: &Entry,
        full: &Message,
    ) -> Result<Vec<batch::Write>> {
        let Some(m) = &e.message else {
            return Ok(vec![]);
        };
        let mut want: Vec<(usize, String, Vec<u8>)> = Vec::new();
        match e.decision.action {
            Action::Forward | Action::Release | Action::Escalate => {
                let bytes = m.to_bytes();
                for party in &e.decision.to {
                    want.push((self.party_box(boxes, party)?, m.id.clone(), bytes.clone()));
                }
                if let Some(r) = nobody_receipt(e) {
                    let key = self.party_box(boxes, &e.sender)?;
                    want.push((key, r.id.clone(), r.to_bytes()));
                }
            }
            Action::Hold => want.push((HELD, m.id.clone(), full.to_bytes())),
            Action::Bounce => {
                let b = bounce_message(e);
                let key = self.party_box(boxes, &e.sender)?;
                want.push((key, b.id.clone(), b.to_bytes()));
            }
            _ => {}
        }
        Ok(want
            .into_iter()
            .filter(|(key, name, _)| g.wants(&boxes.list, *key, name))
            .map(|(key, name, bytes)| batch::Write { key, name, bytes })
            .collect())
    }

    /// Stages the copies a logged entry calls for.
    pub(super) fn stage_deliveries(
        &mut self,
        boxes: &mut Boxes,
        g: &mut Batch,
        e: &Entry,
        full: &Message,
    ) -> Result<()> {
        let writes = self.plan_copies(boxes, g, e, full)?;
        let fsync = self.sync == batch::Sync::File;
        for (w, fd) in writes
            .iter()
            .zip(batch::write_tmp(&boxes.list, &writes, fsync))
        {
            g.adopt(w.key, &w.name, fd?, fsync);
        }
        Ok(())
    }

    /// Logs the entries (bounces first, each batch durable before the next)
    /// and returns them; entries logged by an earlier run are skipped.
    pub(super) fn log_entries(
        &mut self,
        boxes: &Boxes,
        entries: &[&Entry],
        out: &mut dyn Write,
    ) -> Result<()> {
        for first in [true, false] {
            let class = entries.iter().copied().filter(|e| {
                (e.decision.action == Action::Bounce || e.sender == layout::MEDIATOR) == first
            });
            let written = self.unlogged(class);
            self.commit_log_file(boxes, &written)?;
            for e in written {
                self.count(e);
                self.print(out, e)?;
            }
        }
        Ok(())
    }

    /// An outbox and the names waiting in its `new/`, oldest first; None
    /// when nothing waits.
    pub(super) fn open_outbox(
        &mut self,
        rel: &Path,
    ) -> Result<Option<(OpenMaildir, Vec<OsString>)>> {
        let path = self.root.dir.join(rel);
        let newfd = match open_dir_at(Some(&self.rootfd), &rel.join("new")) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e @ (Errno::NOTDIR | Errno::LOOP)) => {
                let p = path.join("new");
                let msg = format!(
                    "cannot open '{}' (a symbolic link or not a directory; not followed)",
                    p.display()
                );
                return Err(
                    Error::new(base::error::io_exit(&errno_io(e)), msg).with_source(errno_io(e))
                );
            }
            Err(e) => return Err(Error::io("cannot open", &path.join("new"), errno_io(e))),
        };
        let mut names = read_names(&newfd)
            .map_err(|e| Error::io("cannot read", &path.join("new"), errno_io(e)))?;
        if names.is_empty() {
            return Ok(None);
        }
        names.sort();
        let ob = OpenMaildir::open(&self.rootfd, &self.root.dir, rel)?;
        Ok(Some((ob, names)))
    }

    fn call_hook(
        &mut self,
        step: &str,
        obs: &[(String, OpenMaildir)],
        items: &[(usize, OsString)],
    ) {
        if let Some(h) = self.batch_hook.as_mut() {
            let mut dirs: Vec<PathBuf> =
                items.iter().map(|(k, _)| obs[*k].1.path.clone()).collect();
            dirs.sort();
            dirs.dedup();
            h(step, &dirs);
        }
    }

    /// Routes one batch of outbox entries, taken from any number of
    /// outboxes (`items` index `obs`): decide each, then log all durably,
    /// deliver all durably, claim all.  The log entries and the copies are
    /// written and fsynced together, from many threads; the copies become
    /// visible only once the log entries are durable, and the claims only
    /// once the copies are.  Returns the entries put off to the next batch:
    /// a message whose id another entry of this batch already uses waits
    /// until that one's decision is logged, so that it meets it as before.
    pub(super) fn route_batch(
        &mut self,
        boxes: &mut Boxes,
        obs: &[(String, OpenMaildir)],
        items: &[(usize, OsString)],
        claimed: &mut HashSet<usize>,
        out: &mut dyn Write,
    ) -> Result<Vec<(usize, OsString)>> {
        self.call_hook("collected", obs, items);
        let c = self.collect(obs, items);
        let mut copies = Batch::with_sync(self.sync);
        let failed = self.log_and_stage(boxes, obs, &c, &mut copies, out)?;
        copies.commit(&boxes.list)?;
        self.count_refusals(&c.refused)?;
        self.call_hook("delivered", obs, items);
        self.claim_all(boxes, obs, &c.work, &failed, claimed)?;
        Ok(c.later)
    }

    /// Writes the batch's log entries and copies (one parallel write and
    /// fsync of every file), makes the log entries visible and durable
    /// (bounces first), and leaves the copies staged in `copies`.  Returns
    /// the work items whose copies cannot be written: they wait.
    fn log_and_stage(
        &mut self,
        boxes: &mut Boxes,
        obs: &[(String, OpenMaildir)],
        c: &Collected,
        copies: &mut Batch,
        out: &mut dyn Write,
    ) -> Result<HashSet<usize>> {
        let mut logs = [Batch::with_sync(self.sync), Batch::with_sync(self.sync)];
        let mut writes: Vec<batch::Write> = Vec::new();
        let mut tags: Vec<Tag> = Vec::new();
        // The batch's entries in two batch files, bounces (and the door's
        // own notices) first: each durable before the next is visible.
        let mut files: [Option<LogFile>; 2] = [None, None];
        let mut fresh = HashSet::new();
        for (class, file) in files.iter_mut().enumerate() {
            let js: Vec<usize> = (0..c.to_log.len())
                .filter(|j| {
                    let e = &c.to_log[*j];
                    let first = e.decision.action == Action::Bounce || e.sender == layout::MEDIATOR;
                    usize::from(!first) == class
                        && !self.index.has(&e.name)
                        && fresh.insert(e.name.as_str())
                })
                .collect();
            if js.is_empty() {
                continue;
            }
            let list: Vec<&Entry> = js.iter().map(|j| &c.to_log[*j]).collect();
            let f = LogFile::of(&list, js);
            writes.push(batch::Write {
                key: LOG,
                name: f.name.clone(),
                bytes: f.bytes.clone(),
            });
            tags.push(Tag::Log(class));
            *file = Some(f);
        }
        let mut failed = HashSet::new();
        self.plan_batch_copies(boxes, obs, c, copies, &mut writes, &mut tags, &mut failed);
        let fsync = self.sync == batch::Sync::File;
        let fds = batch::write_tmp(&boxes.list, &writes, fsync);
        let mut log_err = None;
        for ((w, tag), fd) in writes.iter().zip(&tags).zip(fds) {
            match (tag, fd) {
                (Tag::Log(class), Ok(fd)) => logs[*class].adopt(w.key, &w.name, fd, fsync),
                (Tag::Copy(_), Ok(fd)) => copies.adopt(w.key, &w.name, fd, fsync),
                (Tag::Log(..), Err(e)) => drop(log_err.get_or_insert(e)),
                (Tag::Copy(i), Err(e)) => self.copy_waits(obs, &c.work, *i, &e, &mut failed),
            }
        }
        let committed = match log_err {
            Some(e) => Err(e),
            None => self.commit_log(boxes, &mut logs, &files, &c.to_log, out),
        };
        if let Err(e) = committed {
            logs.iter_mut().for_each(|g| g.discard(&boxes.list));
            copies.discard(&boxes.list);
            return Err(e);
        }
        // A cap notice was logged: remember at once that it was said, so a
        // restart does not say it twice.
        if c.to_log.iter().any(|e| e.sender == layout::MEDIATOR) {
            self.save_memory()?;
        }
        Ok(failed)
    }

    /// Plans the copies of every routed message of a batch into `writes`.
    /// A recipient whose inbox cannot be opened (removed, or replaced by a
    /// link) holds up only the messages addressed to it: they stay
    /// unclaimed, and a later pass carries them out again.
    #[allow(clippy::too_many_arguments)]
    fn plan_batch_copies(
        &mut self,
        boxes: &mut Boxes,
        obs: &[(String, OpenMaildir)],
        c: &Collected,
        copies: &mut Batch,
        writes: &mut Vec<batch::Write>,
        tags: &mut Vec<Tag>,
        failed: &mut HashSet<usize>,
    ) {
        for (i, (_, w)) in c.work.iter().enumerate() {
            let Work::Route {
                entries, message, ..
            } = w
            else {
                continue;
            };
            for e in entries {
                match self.plan_copies(boxes, copies, e, message) {
                    Ok(v) => {
                        tags.extend(v.iter().map(|_| Tag::Copy(i)));
                        writes.extend(v);
                    }
                    Err(err) => self.copy_waits(obs, &c.work, i, &err, failed),
                }
            }
        }
    }

    fn copy_waits(
        &mut self,
        obs: &[(String, OpenMaildir)],
        work: &[(usize, Work)],
        i: usize,
        err: &Error,
        failed: &mut HashSet<usize>,
    ) {
        let (k, w) = &work[i];
        let name = match w {
            Work::Route { name, .. } | Work::Quarantine { name, .. } => name,
        };
        let sender = obs[*k].0.as_str();
        self.warn_once(format!(
            "message {} of {sender} waits: {err}",
            escape_name(name)
        ));
        if failed.insert(i) {
            self.stats.waiting += 1;
        }
    }

    /// Commits the two log batches, bounces first, each durable before the
    /// next; counts and prints what was written.
    fn commit_log(
        &mut self,
        boxes: &Boxes,
        logs: &mut [Batch; 2],
        files: &[Option<LogFile>; 2],
        to_log: &[Entry],
        out: &mut dyn Write,
    ) -> Result<()> {
        for class in 0..2 {
            let Some(f) = &files[class] else { continue };
            logs[class].commit(&boxes.list)?;
            self.index.add_file(OsStr::new(&f.name), &f.places);
            for j in &f.entries {
                self.count(&to_log[*j]);
                self.print(out, &to_log[*j])?;
            }
        }
        Ok(())
    }

    /// Claims every message of the batch whose copies were delivered (or
    /// moves it to quarantine), then makes the quarantine and the human
    /// queue's `cur/` durable at one sync point.  The outboxes that took a
    /// claim are added to `claimed`: their `cur/` is fsynced once per pass
    /// (`sync_claims`), not once per batch.
    fn claim_all(
        &mut self,
        boxes: &Boxes,
        obs: &[(String, OpenMaildir)],
        work: &[(usize, Work)],
        failed: &HashSet<usize>,
        claimed: &mut HashSet<usize>,
    ) -> Result<()> {
        let (mut quarantined, mut questions) = (false, false);
        for (i, (k, w)) in work.iter().enumerate() {
            if failed.contains(&i) {
                continue;
            }
            let (sender, ob) = (obs[*k].0.as_str(), &obs[*k].1);
            match w {
                Work::Route {
                    name,
                    claim_question,
                    entries,
                    ..
                } => {
                    if self.claim(ob, name) {
                        claimed.insert(*k);
                    }
                    let forwarded = entries.iter().any(|e| e.decision.action == Action::Forward);
                    if let (Some(q), true) = (claim_question, forwarded) {
                        let h = &boxes.list[HUMAN];
                        let q = OsStr::new(q);
                        questions |=
                            matches!(batch::move_noreplace(&h.new, q, &h.cur, q), Ok(true));
                    }
                }
                Work::Quarantine {
                    name,
                    qid,
                    dir,
                    keep,
                } => {
                    let q = &boxes.list[QUARANTINE];
                    match crate::quarantine::take(&ob.new, name, &q.new, OsStr::new(qid), *keep) {
                        Ok(_) => quarantined = true,
                        Err(e) if *dir => {
                            // Said once, remembered, never tried again: a
                            // directory that cannot go now will not later.
                            self.state.memory.leave(qid);
                            self.warn_once(format!(
                                "cannot take directory '{}' of {sender} into quarantine: {e}; left in '{}' and not tried again",
                                escape_name(name),
                                ob.path.join("new").display()
                            ));
                        }
                        Err(e) => self.warn_once(format!(
                            "cannot move '{}' of {sender} into quarantine: {e}; left in place",
                            escape_name(name),
                        )),
                    }
                }
            }
        }
        let mut dirs: Vec<(&OwnedFd, PathBuf)> = Vec::new();
        if quarantined {
            let q = &boxes.list[QUARANTINE];
            dirs.push((&q.new, q.path.join("new")));
        }
        if questions {
            let h = &boxes.list[HUMAN];
            dirs.push((&h.cur, h.path.join("cur")));
        }
        let refs: Vec<(&OwnedFd, &Path)> = dirs.iter().map(|(f, p)| (*f, p.as_path())).collect();
        batch::fsync_all(&refs)
    }

    /// Moves a routed message from its outbox's `new/` to `cur/`; true when
    /// it moved.  Counted only when claimed, so that `drain` cannot spin on
    /// a source it fails to move.
    fn claim(&mut self, ob: &OpenMaildir, name: &OsStr) -> bool {
        match batch::move_noreplace(&ob.new, name, &ob.cur, name) {
            Ok(true) => {
                self.stats.routed += 1;
                true
            }
            Ok(false) => false,
            Err(e) => {
                self.warn_once(format!(
                    "cannot claim '{}' into '{}': {}",
                    escape_name(name),
                    ob.path.join("cur").display(),
                    errno_io(e)
                ));
                false
            }
        }
    }
}

/// What a file of a batch's parallel write is for: a batch file of the
/// log (its class, bounces first) or a copy (its work item).
enum Tag {
    Log(usize),
    Copy(usize),
}

/// The receipt a `forward` to nobody sends back to its sender, so that the
/// one who said "I changed this contract" learns that no sandbox heard it.
/// None for a status (a status to the mediator alone is how a note is
/// logged) and for the mediator's own messages (the radar's).
fn nobody_receipt(e: &Entry) -> Option<Message> {
    let m = e.message.as_ref()?;
    if e.decision.action != Action::Forward
        || !e.decision.to.is_empty()
        || m.kind == Kind::Status
        || e.sender == layout::MEDIATOR
    {
        return None;
    }
    let mut subject = format!("delivered to nobody: {}", m.subject);
    while subject.len() > message::MAX_SUBJECT {
        subject.pop();
    }
    Some(Message {
        version: message::VERSION,
        id: nobody_id(&m.id),
        from: layout::MEDIATOR.into(),
        to: vec![e.sender.clone()],
        kind: Kind::Status,
        subject,
        body: format!(
            "Your {} message {} (\"{}\") was logged and delivered to nobody.\nReason: {}\n",
            m.kind, m.id, m.subject, e.decision.reason
        ),
        refs: m.refs.clone(),
        in_reply_to: Some(m.id.clone()),
        created: e.logged.clone(),
    })
}

/// The bounce message for a bounce entry.
fn bounce_message(e: &Entry) -> Message {
    let m = e
        .message
        .as_ref()
        .expect("bounce entries carry their message");
    let mut subject = format!("undeliverable: {}", m.subject);
    while subject.len() > message::MAX_SUBJECT {
        subject.pop();
    }
    Message {
        version: message::VERSION,
        id: bounce_id(&m.id),
        from: layout::MEDIATOR.into(),
        to: vec![e.sender.clone()],
        kind: Kind::Bounce,
        subject,
        body: format!(
            "Your {} message {} (\"{}\") was not delivered to {}.\nReason: {}\n",
            m.kind,
            m.id,
            m.subject,
            e.decision.to.join(", "),
            e.decision.reason
        ),
        refs: vec![],
        in_reply_to: Some(m.id.clone()),
        created: e.logged.clone(),
    }
}
