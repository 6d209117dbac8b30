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

    /// Stages the copies a logged entry calls for.
    pub(super) fn stage_deliveries(
        &mut self,
        boxes: &mut Boxes,
        g: &mut Group,
        e: &Entry,
        full: &Message,
    ) -> Result<()> {
        let Some(m) = &e.message else { return Ok(()) };
        match e.decision.action {
            Action::Forward | Action::Release | Action::Escalate => {
                let bytes = m.to_bytes();
                for party in &e.decision.to {
                    let key = self.party_box(boxes, party)?;
                    g.stage(&boxes.list, key, &m.id, &bytes)?;
                }
            }
            Action::Hold => {
                g.stage(&boxes.list, HELD, &m.id, &full.to_bytes())?;
            }
            Action::Bounce => {
                let b = Self::bounce_message(e);
                let key = self.party_box(boxes, &e.sender)?;
                g.stage(&boxes.list, key, &b.id, &b.to_bytes())?;
            }
            _ => {}
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
    /// outboxes (`items` index `obs`): decide each, log all durably, deliver
    /// all durably, claim all, with one sync point per step for the whole
    /// batch.  Returns the entries put off to the next batch: a message
    /// whose id another entry of this batch already uses waits until that
    /// one's decision is logged, so that it meets it as before.
    pub(super) fn route_batch(
        &mut self,
        boxes: &mut Boxes,
        obs: &[(String, Box3)],
        items: &[(usize, OsString)],
        out: &mut dyn Write,
    ) -> Result<Vec<(usize, OsString)>> {
        self.call_hook("collected", obs, items);
        let resumed_before = self.stats.resumed;
        let mut work: Vec<(usize, Work)> = Vec::new();
        let mut to_log: Vec<Entry> = Vec::new();
        let mut ids: HashSet<String> = HashSet::new();
        let mut later = Vec::new();
        for (k, name) in items {
            let (sender, ob) = (obs[*k].0.as_str(), &obs[*k].1);
            let quarantine = |why: String, st: &rfs::Stat, sender: &str| {
                let qid = quarantine_id(sender, name, st);
                let e = Entry {
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
                        reason: format!(
                            "'{}' in the outbox of {sender}: {why}; kept as quarantine/new/{qid}",
                            escape_name(name)
                        ),
                    },
                };
                (
                    Work::Quarantine {
                        name: name.clone(),
                        qid,
                    },
                    e,
                )
            };
            match inspect(&ob.new, name) {
                Inspected::Gone => {}
                Inspected::Bad(why, st) => {
                    let (w, e) = quarantine(why, &st, sender);
                    work.push((*k, w));
                    to_log.push(e);
                }
                Inspected::Message(m) if ids.contains(&m.id) => {
                    later.push((*k, name.clone()));
                }
                Inspected::Message(mut m) => {
                    ids.insert(m.id.clone());
                    let claimed = std::mem::replace(&mut m.from, sender.to_string());
                    let (main, bounce) = self.decision_of(&m.id);
                    let prior = main.clone().or(bounce.clone());
                    let clash = prior.as_ref().and_then(|p| {
                        if p.sender != sender {
                            Some(format!(
                                "id {} is already used by a message from {}",
                                m.id, p.sender
                            ))
                        } else if !self.records(p, &m) {
                            Some(format!(
                                "id {} is already used by an earlier, different message",
                                m.id
                            ))
                        } else if ob.has_cur(name) {
                            Some(format!("posted again after {} was routed", m.id))
                        } else {
                            None
                        }
                    });
                    if let Some(why) = clash {
                        let st = rfs::statat(&ob.new, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW);
                        if let Ok(st) = st {
                            let (w, e) = quarantine(why, &st, sender);
                            work.push((*k, w));
                            to_log.push(e);
                        }
                        continue;
                    }
                    let entries = match (main, bounce) {
                        (Some(a), b) => {
                            self.stats.resumed += 1;
                            std::iter::once(a).chain(b).collect()
                        }
                        (None, b) => {
                            if b.is_some() {
                                self.stats.resumed += 1;
                            }
                            self.decide(&m, sender, &claimed, b)
                        }
                    };
                    let claim_question = match (sender, m.kind, &m.in_reply_to) {
                        (layout::HUMAN, Kind::Answer, Some(q)) => Some(q.clone()),
                        _ => None,
                    };
                    to_log.extend(entries.iter().cloned());
                    work.push((
                        *k,
                        Work::Route {
                            name: name.clone(),
                            message: Box::new(m),
                            entries,
                            claim_question,
                        },
                    ));
                }
            }
        }
        if self.stats.resumed > resumed_before {
            // One write(2) for the whole line, so that a kill cannot leave
            // half of it (eprintln! writes its pieces one by one).
            let line = format!(
                "lw-mediate: carrying out {} decisions that an earlier run had logged\n",
                self.stats.resumed - resumed_before
            );
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
        // 1. Log.
        let refs: Vec<&Entry> = to_log.iter().collect();
        self.log_entries(boxes, &refs, out)?;
        // A cap notice was logged: remember at once that it was said, so a
        // restart does not say it twice.
        if to_log.iter().any(|e| e.sender == layout::MEDIATOR) {
            self.save_memory()?;
        }
        // 2. Deliver.  A recipient whose inbox cannot be written (removed,
        // or replaced by a link) holds up only the messages addressed to
        // it: they stay unclaimed, to be carried out again by a later pass.
        let mut g = Group::with_sync(self.sync);
        let mut failed = HashSet::new();
        for (i, (k, w)) in work.iter().enumerate() {
            let Work::Route {
                name,
                entries,
                message,
                ..
            } = w
            else {
                continue;
            };
            let sender = obs[*k].0.as_str();
            for e in entries {
                if let Err(err) = self.stage_deliveries(boxes, &mut g, e, message) {
                    self.warn_once(format!(
                        "message {} of {sender} waits: {err}",
                        escape_name(name)
                    ));
                    if failed.insert(i) {
                        self.stats.waiting += 1;
                    }
                }
            }
        }
        g.commit(&boxes.list)?;
        self.call_hook("delivered", obs, items);
        // 3. Claim (or move to quarantine).
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
                    // Counted only when claimed, so that `drain` cannot spin on
                    // a source it fails to move.
                    match group::move_noreplace(&ob.new, name, &ob.cur, name) {
                        Ok(true) => {
                            claimed.push(*k);
                            self.stats.routed += 1;
                        }
                        Ok(false) => {}
                        Err(e) => self.warn_once(format!(
                            "cannot claim '{}' into '{}': {}",
                            escape_name(name),
                            ob.path.join("cur").display(),
                            errno_io(e)
                        )),
                    }
                    let forwarded = entries.iter().any(|e| e.decision.action == Action::Forward);
                    if let (Some(q), true) = (claim_question, forwarded) {
                        let h = &boxes.list[HUMAN];
                        if let Ok(true) =
                            group::move_noreplace(&h.new, OsStr::new(q), &h.cur, OsStr::new(q))
                        {
                            questions = true;
                        }
                    }
                }
                Work::Quarantine { name, qid } => {
                    let q = &boxes.list[QUARANTINE];
                    match crate::quarantine::take(&ob.new, name, &q.new, OsStr::new(qid)) {
                        Ok(_) => quarantined = true,
                        Err(e) => self.warn_once(format!(
                            "cannot move '{}' of {sender} into quarantine: {}; left in place",
                            escape_name(name),
                            errno_io(e)
                        )),
                    }
                }
            }
        }
        // One sync point for every directory the claims touched.
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
        group::fsync_all(&refs)?;
        Ok(later)
    }
}
