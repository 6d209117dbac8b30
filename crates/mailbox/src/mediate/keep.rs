//! The quarantine budget (`door.quarantine-max`, mailbox-spec.md,
//! QUARANTINE BUDGET): what the root keeps of one sender's bad entries in
//! `ROOT/quarantine/new/` is at most that many bytes.
//!
//! Each entry is planned before it is logged (crate::quarantine::plan): a
//! bad file is kept whole up to a message's size limit, a bigger one by its
//! head, holes left holes; each is charged the blocks it can take at most
//! (its length, as if it were dense, one block at least).
//! When what a sender's entries take would pass its budget, its quarantine
//! is counted again from the disk (a person may have removed entries; at
//! most once a minute): an entry's sender is the one its quarantine log
//! entry names, its charge as [`quarantine::charged`] says.  Still over, the entry is cut
//! to the room left, or not kept at all (its reason is logged all the
//! same, within the log budget).  A person and the sender are told once
//! per episode, which ends when the count finds the sender's quarantine
//! below half its budget.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};

use super::pure::decide::derived_id;
use super::{Boxes, Mediator};
use crate::layout;
use crate::log::Action;
use crate::quarantine::{self, Plan};
use base::error::Result;

/// How often, at most, the quarantine is counted again for a sender over
/// its budget.
const RECOUNT: Duration = Duration::from_secs(60);

impl Mediator {
    /// Plans the keeping of a bad entry of `sender` (as `st` says) and
    /// charges it to the sender's budget.
    pub(super) fn plan_keep(&mut self, sender: &str, st: &rfs::Stat) -> Plan {
        if self.state.kept.counted.is_none() {
            self.count_kept();
        }
        let max = self.state.quarantine_max;
        let room = |m: &Mediator| max.saturating_sub(m.used(sender));
        let mut plan = quarantine::plan(st, room(self));
        if plan.cut
            && self
                .state
                .kept
                .counted
                .is_some_and(|t| t.elapsed() >= RECOUNT)
        {
            self.count_kept();
            plan = quarantine::plan(st, room(self));
        }
        *self.state.kept.bytes.entry(sender.to_string()).or_default() += plan.cost;
        if plan.cut {
            self.state.kept.over.insert(sender.to_string());
        }
        plan
    }

    fn used(&self, sender: &str) -> u64 {
        self.state.kept.bytes.get(sender).copied().unwrap_or(0)
    }

    /// Counts what each sender's entries in `quarantine/new/` take, and
    /// ends the episode of a sender now below half its budget.
    fn count_kept(&mut self) {
        let mut bytes: HashMap<String, u64> = HashMap::new();
        let new = self.root.quarantine().sub(crate::maildir::Sub::New);
        let dir = rfs::open(
            &new,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ); // trusted: the root's own quarantine
        if let Ok(dir) = dir {
            let mut names = Vec::new();
            if let Ok(entries) = rfs::Dir::read_from(&dir) {
                for ent in entries.flatten() {
                    let n = ent.file_name().to_bytes();
                    if n != b"." && n != b".." {
                        names.push(OsStr::from_bytes(n).to_os_string());
                    }
                }
            }
            for n in names {
                let Ok(st) = rfs::statat(&dir, &n, AtFlags::SYMLINK_NOFOLLOW) else {
                    continue;
                };
                let Some(e) = n
                    .to_str()
                    .and_then(|qid| self.logged(qid, Action::Quarantine))
                else {
                    continue;
                };
                *bytes.entry(e.sender).or_default() += quarantine::charged(&st);
            }
        }
        let half = self.state.quarantine_max / 2;
        let told = &mut self.state.memory.quarantine_told;
        let before = told.len();
        told.retain(|s| bytes.get(s).copied().unwrap_or(0) >= half);
        self.state.memory.dirty |= told.len() != before;
        self.state.kept.bytes = bytes;
        self.state.kept.counted = Some(Instant::now());
    }

    /// Tells a person and each sender newly cut short by its quarantine
    /// budget, once per episode: one status message to both, from the
    /// mediator.
    pub(super) fn tell_quarantine_full(
        &mut self,
        boxes: &mut Boxes,
        out: &mut dyn Write,
    ) -> Result<()> {
        let over = std::mem::take(&mut self.state.kept.over);
        for sender in over {
            if self.state.memory.quarantine_told.contains(&sender) {
                continue;
            }
            let now = base::time::now();
            let cap = super::budget::size_text(self.state.quarantine_max);
            let id = derived_id(
                now,
                &[
                    b"quarantine-budget",
                    sender.as_bytes(),
                    &(now.as_millis() as u64).to_le_bytes(),
                ],
            );
            let e = crate::log::Notice {
                id,
                to: vec![layout::HUMAN.to_string(), sender.clone()],
                subject: format!(
                    "{sender} used its quarantine budget of {cap}; its bad files are not kept whole"
                ),
                body: format!(
                    "The bad files {sender} left in its outbox take {} of the {cap} the quarantine keeps\n\
                     for one sender (door.quarantine-max in .loopwright/config).  Its further bad files\n\
                     are cut to what is left, or not kept at all; each is still removed from its outbox\n\
                     and its reason logged.  Removing its entries from ROOT/quarantine/new gives the room\n\
                     back (counted again at most once a minute).\n\
                     \n\
                     This is said once, to a person and to {sender}, until its quarantine is below half\n\
                     its budget again.\n",
                    super::budget::size_text(self.used(&sender))
                ),
                at: now,
                reason: format!(
                    "sender {sender} used its quarantine budget of {cap} (door.quarantine-max); its bad files are cut or not kept; said once"
                ),
            }
            .entry();
            self.log_and_deliver(boxes, &e, out)?;
            self.state.memory.quarantine_told.insert(sender);
            self.state.memory.dirty = true;
            self.save_memory()?;
        }
        Ok(())
    }
}
