//! The mediator's durable memory (`ROOT/state/mediator.json`): rate and
//! duplicate windows, receipts, the held-queue cap's episodes, the log
//! budget and the refusals being counted.  Losing it costs only a
//! forgotten window.
//!
//! The queries deciding asks ([`Memory::dup_time`], [`Memory::rate_count`])
//! read it as it stands; the changes a decision returns are applied by
//! [`Memory::remember`] and [`Memory::count_post`], which forget what is
//! out of its window first, so that a query and the change that follows it
//! see the same memory.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::budget::{Budget, Refused};
use super::inspect::{Inspected, inspect};
use super::{Boxes, HELD, MAX_REMEMBERED, Mediator, read_names};
use crate::error::{Error, Result};

/// Rate and duplicate memory, and what the door said and counted.
/// Bounded: a sender keeps at most the policy's rate count of times, and
/// at most MAX_REMEMBERED digests are kept.
#[derive(Default, Serialize, Deserialize)]
pub(super) struct Memory {
    pub(super) version: u32,
    /// Sender -> times (ms since the epoch) of its recent admitted messages.
    pub(super) rate: HashMap<String, VecDeque<u64>>,
    /// Digest (hex) and time (ms) of recent messages, oldest first.
    pub(super) dups: VecDeque<(String, u64)>,
    /// Inbox owner -> mtime (ns) of its `cur/` when receipts were last taken.
    pub(super) receipts: HashMap<String, i128>,
    /// Senders over their held-queue cap who were told about it (one
    /// status message per episode; forgotten once they are below the cap).
    #[serde(default)]
    pub(super) capped: BTreeSet<String>,
    /// Quarantine ids of planted directories that could not be taken:
    /// left where they are, said once, never tried again (at most
    /// MAX_REMEMBERED, oldest forgotten first).
    #[serde(default)]
    pub(super) left: VecDeque<String>,
    /// Sender -> its log budget this hour (budget.rs).
    #[serde(default)]
    pub(super) budget: HashMap<String, Budget>,
    /// Sender -> its refusals counted and not yet logged.
    #[serde(default)]
    pub(super) refused: BTreeMap<String, Refused>,
    /// The posts of the last batch with refusals that were counted: a
    /// restart claims them without counting them again.
    #[serde(default)]
    pub(super) refusing: Vec<String>,
    /// Senders told that their quarantine budget is used, in this episode
    /// (keep.rs).
    #[serde(default)]
    pub(super) quarantine_told: BTreeSet<String>,
    #[serde(skip)]
    pub(super) dup_index: HashMap<String, u64>,
    /// Changed since it was last saved.
    #[serde(skip)]
    pub(super) dirty: bool,
}

impl Memory {
    /// How many of the oldest digests remembering at `now` (ms) forgets:
    /// those out of the `window`, and those beyond MAX_REMEMBERED.
    fn forgettable(&self, now: u64, window: u64) -> usize {
        let mut len = self.dups.len();
        let mut k = 0;
        for (_, t) in &self.dups {
            if now.saturating_sub(*t) > window || len > MAX_REMEMBERED {
                len -= 1;
                k += 1;
            } else {
                break;
            }
        }
        k
    }

    /// When a message of `digest` was remembered within the `window` of
    /// `now` (all in ms), as the memory stands once remembering at `now`
    /// forgot what it forgets.
    pub(super) fn dup_time(&self, digest: &str, now: u64, window: u64) -> Option<u64> {
        let t = *self.dup_index.get(digest)?;
        if now.saturating_sub(t) > window {
            return None;
        }
        let gone = self
            .dups
            .iter()
            .take(self.forgettable(now, window))
            .any(|(h, u)| h == digest && *u == t);
        (!gone).then_some(t)
    }

    /// Remembers `digest` at `now`, forgetting the oldest first.
    pub(super) fn remember(&mut self, digest: &str, now: u64, window: u64) {
        for _ in 0..self.forgettable(now, window) {
            if let Some((h, t)) = self.dups.pop_front()
                && self.dup_index.get(&h) == Some(&t)
            {
                self.dup_index.remove(&h);
            }
        }
        self.dups.push_back((digest.to_string(), now));
        self.dup_index.insert(digest.to_string(), now);
        self.dirty = true;
    }

    /// The posts of `sender` admitted within the `window` of `now` (ms).
    pub(super) fn rate_count(&self, sender: &str, now: u64, window: u64) -> usize {
        self.rate.get(sender).map_or(0, |q| {
            q.iter()
                .skip_while(|t| now.saturating_sub(**t) >= window)
                .count()
        })
    }

    /// Counts a post of `sender` admitted at `now`, forgetting those out of
    /// the `window`.
    pub(super) fn count_post(&mut self, sender: &str, now: u64, window: u64) {
        let q = self.rate.entry(sender.to_string()).or_default();
        while q.front().is_some_and(|t| now.saturating_sub(*t) >= window) {
            q.pop_front();
        }
        q.push_back(now);
        self.dirty = true;
    }

    /// Whether the entry of quarantine id `qid` was left for good.
    pub(super) fn is_left(&self, qid: &str) -> bool {
        self.left.iter().any(|q| q == qid)
    }

    /// Remembers that the entry of quarantine id `qid` is left for good,
    /// durably at the next save.
    pub(super) fn leave(&mut self, qid: &str) {
        if !self.is_left(qid) {
            self.left.push_back(qid.to_string());
            while self.left.len() > MAX_REMEMBERED {
                self.left.pop_front();
            }
            self.dirty = true;
        }
    }

    /// Whether post `id` was refused and counted by a run that did not
    /// claim it.
    pub(super) fn was_refused(&self, id: &str) -> bool {
        self.refusing.iter().any(|r| r == id)
    }
}

impl Mediator {
    fn memory_path(&self) -> PathBuf {
        self.root.state_dir().join("mediator.json")
    }

    pub(super) fn load_memory(&mut self) {
        let p = self.memory_path();
        let Ok(bytes) = std::fs::read(&p) else { return };
        match serde_json::from_slice::<Memory>(&bytes) {
            Ok(mut m) => {
                m.dup_index = m.dups.iter().cloned().collect();
                self.state.memory = m;
            }
            Err(e) => self.warn_once(format!("ignoring unreadable state '{}': {e}", p.display())),
        }
    }

    /// Writes the rate, duplicate and receipt memory (atomically: temporary
    /// file, fsync, rename).  Losing it costs only a forgotten window.
    pub fn save_memory(&mut self) -> Result<()> {
        if !self.state.memory.dirty {
            return Ok(());
        }
        self.state.memory.version = 1;
        let p = self.memory_path();
        let bytes = serde_json::to_vec(&self.state.memory)
            .expect("the state serialises because it is plain data");
        crate::fs::write_replace(&p, &bytes, 0o600, crate::fs::Durability::Synced)
            .map_err(|e| Error::io("cannot write state", &p, e))?;
        self.state.memory.dirty = false;
        self.last_save = Instant::now();
        Ok(())
    }

    /// Counts the held queue by sender, and forgets the senders told about
    /// the cap who are below it again.
    pub(super) fn count_held(&mut self, boxes: &Boxes) {
        let held = &boxes.list[HELD];
        let mut count: HashMap<String, u32> = HashMap::new();
        // Without a cap nothing needs the counts (and the queue may be long).
        let names = match self.policy.held_max {
            Some(_) => read_names(&held.new),
            None => Ok(vec![]),
        };
        if let Ok(names) = names {
            for n in names {
                if let Inspected::Message(m) = inspect(&held.new, &n, true, None) {
                    *count.entry(m.from).or_default() += 1;
                }
            }
        }
        let cap = self.policy.held_max.as_ref().map(|c| c.value);
        let memory = &mut self.state.memory;
        let before = memory.capped.len();
        memory
            .capped
            .retain(|s| cap.is_some_and(|c| count.get(s).copied().unwrap_or(0) >= c));
        if memory.capped.len() != before {
            memory.dirty = true;
        }
        self.state.held_count = count;
    }
}
