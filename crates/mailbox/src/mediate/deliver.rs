//! Routing and delivery: a batch of outbox entries is decided, logged,
//! delivered and claimed, each step durable for the whole batch before the
//! next (lib/group.rs), so a crash anywhere gives each effect once.

use crate::error::{Error, Exit, Result, errno_io};
use crate::group::{self, Box3, Group, open_dir_at};
use crate::layout;
use crate::log::{Action, Decision, Entry, LOG_VERSION};
use crate::maildir::escape_name;
use crate::message::{Kind, Message};
use rustix::fs::{self as rfs, AtFlags};
use rustix::io::Errno;
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::*;

impl Mediator {
    pub(super) fn open_boxes(&self) -> Result<Boxes> {
        let open = |rel: &str| Box3::open(&self.rootfd, &self.root.dir, Path::new(rel));
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
        let party = super::mailbox_name(party);
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
        let sfd = group::ensure_dir_at(&self.rootfd, "sandboxes")
            .map_err(|e| Error::io("cannot open", &self.root.sandboxes_dir(), errno_io(e)))?;
        let _ = group::ensure_dir_at(&sfd, party).map_err(|e| {
            Error::io(
                "cannot open",
                &self.root.sandboxes_dir().join(party),
                errno_io(e),
            )
        })?;
        let b = Box3::open(
            &self.rootfd,
            &self.root.dir,
            &Path::new("sandboxes").join(party).join("inbox"),
        )?;
        boxes.list.push(b);
        boxes.inbox.insert(party.to_string(), boxes.list.len() - 1);
        Ok(boxes.list.len() - 1)
    }

    /// The copies a logged entry calls for that are not delivered yet,
    /// their names reserved in `g` (see [`Group::wants`]).
    pub(super) fn plan_copies(
        &mut self,
        boxes: &mut Boxes,
        g: &mut Group,
        e: &Entry,
        full: &Message,
    ) -> Result<Vec<group::Write>> {
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
            }
            Action::Hold => want.push((HELD, m.id.clone(), full.to_bytes())),
            Action::Bounce => {
                let b = Self::bounce_message(e);
                let key = self.party_box(boxes, &e.sender)?;
                want.push((key, b.id.clone(), b.to_bytes()));
            }
            _ => {}
        }
        Ok(want
            .into_iter()
            .filter(|(key, name, _)| g.wants(&boxes.list, *key, name))
            .map(|(key, name, bytes)| group::Write { key, name, bytes })
            .collect())
    }

    /// Stages the copies a logged entry calls for.
    pub(super) fn stage_deliveries(
        &mut self,
        boxes: &mut Boxes,
        g: &mut Group,
        e: &Entry,
        full: &Message,
    ) -> Result<()> {
        let writes = self.plan_copies(boxes, g, e, full)?;
        let fsync = self.sync == group::Sync::File;
        for (w, fd) in writes
            .iter()
            .zip(group::write_tmp(&boxes.list, &writes, fsync))
        {
            g.adopt(w.key, &w.name, fd?, fsync);
        }
        Ok(())
    }

    /// Logs the entries (bounces first, each group durable before the next)
    /// and returns them; entries logged by an earlier run are skipped.
    pub(super) fn log_entries(
        &mut self,
        boxes: &Boxes,
        entries: &[&Entry],
        out: &mut dyn Write,
    ) -> Result<()> {
        for first in [true, false] {
            let mut g = Group::with_sync(self.sync);
            let mut written = Vec::new();
            for e in entries.iter().filter(|e| {
                (e.decision.action == Action::Bounce || e.sender == layout::MEDIATOR) == first
            }) {
                if g.stage(&boxes.list, LOG, &e.name, &e.to_bytes())? {
                    written.push(*e);
                }
            }
            if !g.is_empty() {
                g.commit(&boxes.list)?;
            }
            for e in written {
                self.count(e);
                self.print(out, e)?;
            }
        }
        Ok(())
    }

    /// An outbox and the names waiting in its `new/`, oldest first; None
    /// when nothing waits.
    pub(super) fn open_outbox(&mut self, rel: &Path) -> Result<Option<(Box3, Vec<OsString>)>> {
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
                    Error::new(crate::error::io_exit(&errno_io(e)), msg).with_source(errno_io(e))
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
        let ob = Box3::open(&self.rootfd, &self.root.dir, rel)?;
        Ok(Some((ob, names)))
    }

    fn call_hook(&mut self, step: &str, obs: &[(String, Box3)], items: &[(usize, OsString)]) {
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
        obs: &[(String, Box3)],
        items: &[(usize, OsString)],
        out: &mut dyn Write,
    ) -> Result<Vec<(usize, OsString)>> {
        self.call_hook("collected", obs, items);
        let c = self.collect(obs, items);
        let mut copies = Group::with_sync(self.sync);
        let failed = self.log_and_stage(boxes, obs, &c, &mut copies, out)?;
        copies.commit(&boxes.list)?;
        self.count_refusals(&c.refused)?;
        self.call_hook("delivered", obs, items);
        self.claim_all(boxes, obs, &c.work, &failed)?;
        Ok(c.later)
    }

    /// Inspects and decides every entry of a batch.
    fn collect(&mut self, obs: &[(String, Box3)], items: &[(usize, OsString)]) -> Collected {
        let resumed_before = self.stats.resumed;
        // Charged by now, or never logged: nothing is held in reserve.
        self.reserved.clear();
        let mut c = Collected::default();
        let mut ids: HashSet<String> = HashSet::new();
        let mut bytes = 0usize;
        for (k, name) in items {
            let (sender, ob) = (obs[*k].0.as_str(), &obs[*k].1);
            match inspect(&ob.new, name, sender == layout::MEDIATOR) {
                Inspected::Gone => {}
                // A planted directory that could not be taken stays, quietly.
                Inspected::Bad(_, st) if self.is_left(&quarantine_id(sender, name, &st)) => {}
                Inspected::Bad(..)
                    if !self.fits(&self.qualified(sender), Mediator::QUARANTINE_COST) =>
                {
                    self.stats.waiting += 1
                }
                Inspected::Bad(why, st) => {
                    c.quarantine(*k, sender, name, why, &st);
                    self.reserve(&c.to_log[c.to_log.len() - 1..]);
                }
                // The same id again, or the batch holds enough text: later.
                Inspected::Message(m) if ids.contains(&m.id) || bytes > BATCH_BYTES => {
                    c.later.push((*k, name.clone()))
                }
                Inspected::Message(m) => {
                    bytes += m.body.len() + m.subject.len() + 512;
                    ids.insert(m.id.clone());
                    self.collect_message(&mut c, *k, sender, ob, name, m);
                }
            }
        }
        if self.stats.resumed > resumed_before {
            (self.report)(&format!(
                "carrying out {} decisions that an earlier run had logged",
                self.stats.resumed - resumed_before
            ));
        }
        c
    }

    /// Decides one message (or carries out the decision an earlier run
    /// logged), or quarantines it when its id clashes with the log.
    fn collect_message(
        &mut self,
        c: &mut Collected,
        k: usize,
        sender: &str,
        ob: &Box3,
        name: &OsString,
        mut m: Message,
    ) {
        // Another host's sandbox, by its proxy's outbox, is HOST/NAME.
        let sender = self.qualified(sender);
        let sender = sender.as_str();
        let claimed = std::mem::replace(&mut m.from, sender.to_string());
        let (main, bounce) = self.decision_of(&m.id);
        let prior = main.as_ref().or(bounce.as_ref());
        if let Some(why) = prior.and_then(|p| self.clash(p, &m, sender, ob, name)) {
            if let Ok(st) = rfs::statat(&ob.new, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW) {
                c.quarantine(k, sender, name, why, &st);
            }
            return;
        }
        let entries: Vec<Entry> = match (main, bounce) {
            (Some(a), b) => {
                self.stats.resumed += 1;
                std::iter::once(a).chain(b).collect()
            }
            // Refused and counted by a run that did not claim it: claimed
            // now, not counted again.
            (None, None) if self.was_refused(&m.id) => vec![],
            (None, None) if !self.fits(sender, self.most_cost(&m)) => {
                // The sender's log budget is used up: it waits.
                self.stats.waiting += 1;
                return;
            }
            (None, b) => {
                if b.is_some() {
                    self.stats.resumed += 1;
                }
                let mut es = self.decide(&m, sender, &claimed, b.clone());
                // A new refusal is counted, not logged (lib/mediate/budget.rs).
                if b.is_none()
                    && let Some(i) = es.iter().position(|e| e.decision.quiet)
                {
                    let e = es.remove(i);
                    c.refused.push((sender.to_string(), m.id.clone(), e));
                }
                self.reserve(&es);
                es
            }
        };
        let claim_question = match (sender, m.kind, &m.in_reply_to) {
            (layout::HUMAN, Kind::Answer, Some(q)) => Some(q.clone()),
            _ => None,
        };
        c.to_log.extend(entries.iter().cloned());
        let name = name.clone();
        let message = Box::new(m);
        c.work.push((
            k,
            Work::Route {
                name,
                message,
                entries,
                claim_question,
            },
        ));
    }

    /// Why a message cannot be routed although the log knows its id: another
    /// sender's, different content, or posted again after it was routed.
    fn clash(
        &self,
        p: &Entry,
        m: &Message,
        sender: &str,
        ob: &Box3,
        name: &OsStr,
    ) -> Option<String> {
        // A proxy's message logged before senders were qualified has its bare name.
        if p.sender != sender && p.sender != super::mailbox_name(sender) {
            Some(format!(
                "id {} is already used by a message from {}",
                m.id, p.sender
            ))
        } else if !self.records(p, m) {
            Some(format!(
                "id {} is already used by an earlier, different message",
                m.id
            ))
        } else if ob.has_cur(name) {
            Some(format!("posted again after {} was routed", m.id))
        } else {
            None
        }
    }

    /// Writes the batch's log entries and copies (one parallel write and
    /// fsync of every file), makes the log entries visible and durable
    /// (bounces first), and leaves the copies staged in `copies`.  Returns
    /// the work items whose copies cannot be written: they wait.
    fn log_and_stage(
        &mut self,
        boxes: &mut Boxes,
        obs: &[(String, Box3)],
        c: &Collected,
        copies: &mut Group,
        out: &mut dyn Write,
    ) -> Result<HashSet<usize>> {
        let mut logs = [Group::with_sync(self.sync), Group::with_sync(self.sync)];
        let mut writes: Vec<group::Write> = Vec::new();
        let mut tags: Vec<Tag> = Vec::new();
        for (j, e) in c.to_log.iter().enumerate() {
            let class =
                usize::from(!(e.decision.action == Action::Bounce || e.sender == layout::MEDIATOR));
            if logs[class].wants(&boxes.list, LOG, &e.name) {
                writes.push(group::Write {
                    key: LOG,
                    name: e.name.clone(),
                    bytes: e.to_bytes(),
                });
                tags.push(Tag::Log(class, j));
            }
        }
        let mut failed = HashSet::new();
        self.plan_batch_copies(boxes, obs, c, copies, &mut writes, &mut tags, &mut failed);
        let fsync = self.sync == group::Sync::File;
        let fds = group::write_tmp(&boxes.list, &writes, fsync);
        let mut written: [Vec<usize>; 2] = [vec![], vec![]];
        let mut log_err = None;
        for ((w, tag), fd) in writes.iter().zip(&tags).zip(fds) {
            match (tag, fd) {
                (Tag::Log(class, j), Ok(fd)) => {
                    logs[*class].adopt(w.key, &w.name, fd, fsync);
                    written[*class].push(*j);
                }
                (Tag::Copy(_), Ok(fd)) => copies.adopt(w.key, &w.name, fd, fsync),
                (Tag::Log(..), Err(e)) => drop(log_err.get_or_insert(e)),
                (Tag::Copy(i), Err(e)) => self.copy_waits(obs, &c.work, *i, &e, &mut failed),
            }
        }
        let committed = match log_err {
            Some(e) => Err(e),
            None => self.commit_log(boxes, &mut logs, &written, &c.to_log, out),
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
        obs: &[(String, Box3)],
        c: &Collected,
        copies: &mut Group,
        writes: &mut Vec<group::Write>,
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
        obs: &[(String, Box3)],
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

    /// Commits the two log groups, bounces first, each durable before the
    /// next; counts and prints what was written.
    fn commit_log(
        &mut self,
        boxes: &Boxes,
        logs: &mut [Group; 2],
        written: &[Vec<usize>; 2],
        to_log: &[Entry],
        out: &mut dyn Write,
    ) -> Result<()> {
        for class in 0..2 {
            if !logs[class].is_empty() {
                logs[class].commit(&boxes.list)?;
            }
            for j in &written[class] {
                self.count(&to_log[*j]);
                self.print(out, &to_log[*j])?;
            }
        }
        Ok(())
    }

    /// Claims every message of the batch whose copies were delivered (or
    /// moves it to quarantine), then makes every directory that changed
    /// durable at one sync point.
    fn claim_all(
        &mut self,
        boxes: &Boxes,
        obs: &[(String, Box3)],
        work: &[(usize, Work)],
        failed: &HashSet<usize>,
    ) -> Result<()> {
        let (mut quarantined, mut questions) = (false, false);
        let mut claimed: Vec<usize> = Vec::new();
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
                        claimed.push(*k);
                    }
                    let forwarded = entries.iter().any(|e| e.decision.action == Action::Forward);
                    if let (Some(q), true) = (claim_question, forwarded) {
                        let h = &boxes.list[HUMAN];
                        let q = OsStr::new(q);
                        questions |=
                            matches!(group::move_noreplace(&h.new, q, &h.cur, q), Ok(true));
                    }
                }
                Work::Quarantine { name, qid, dir } => {
                    let q = &boxes.list[QUARANTINE];
                    match crate::quarantine::take(&ob.new, name, &q.new, OsStr::new(qid)) {
                        Ok(_) => quarantined = true,
                        Err(e) if *dir => {
                            // Said once, remembered, never tried again: a
                            // directory that cannot go now will not later.
                            self.leave(qid);
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
        claimed.sort_unstable();
        claimed.dedup();
        let mut dirs: Vec<(&OwnedFd, PathBuf)> = claimed
            .iter()
            .map(|k| (&obs[*k].1.cur, obs[*k].1.path.join("cur")))
            .collect();
        if quarantined {
            let q = &boxes.list[QUARANTINE];
            dirs.push((&q.new, q.path.join("new")));
        }
        if questions {
            let h = &boxes.list[HUMAN];
            dirs.push((&h.cur, h.path.join("cur")));
        }
        let refs: Vec<(&OwnedFd, &Path)> = dirs.iter().map(|(f, p)| (*f, p.as_path())).collect();
        group::fsync_all(&refs)
    }

    /// Moves a routed message from its outbox's `new/` to `cur/`; true when
    /// it moved.  Counted only when claimed, so that `drain` cannot spin on
    /// a source it fails to move.
    fn claim(&mut self, ob: &Box3, name: &OsStr) -> bool {
        match group::move_noreplace(&ob.new, name, &ob.cur, name) {
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

/// What a file of a batch's parallel write is for: a log entry (its group,
/// bounces first, and its index in `to_log`) or a copy (its work item).
enum Tag {
    Log(usize, usize),
    Copy(usize),
}

/// What inspecting and deciding made of a batch.
#[derive(Default)]
struct Collected {
    work: Vec<(usize, Work)>,
    to_log: Vec<Entry>,
    later: Vec<(usize, OsString)>,
    /// New refusals: sender, post, the entry they are counted instead of.
    refused: Vec<(String, String, Entry)>,
}

impl Collected {
    /// A bad entry: logged as `QID.quarantine`, then moved to quarantine.
    fn quarantine(&mut self, k: usize, sender: &str, name: &OsString, why: String, st: &rfs::Stat) {
        let qid = quarantine_id(sender, name, st);
        let reason = format!(
            "'{}' in the outbox of {sender}: {why}; kept as quarantine/new/{qid}",
            escape_name(name)
        );
        self.to_log.push(Entry {
            version: LOG_VERSION,
            name: Entry::name_for(&qid, Action::Quarantine, None),
            logged: crate::time::rfc3339(crate::time::now()),
            message_id: qid.clone(),
            sender: sender.to_string(),
            message: None,
            decision: Decision {
                quiet: false,
                action: Action::Quarantine,
                to: vec![],
                reason,
            },
        });
        let dir = rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::Directory;
        self.work.push((
            k,
            Work::Quarantine {
                name: name.clone(),
                qid,
                dir,
            },
        ));
    }
}
