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

use serde::{Deserialize, Serialize};

/// Distinct messages remembered for duplicate detection.
pub const MAX_REMEMBERED: usize = 10_000;
/// How long a sender's log budget lasts.
pub(crate) const BUDGET_WINDOW_MS: u64 = 3_600_000;

/// One sender's log budget for the hour from `start`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(in crate::mediate) struct Budget {
    /// Start of the window (ms since the epoch).
    pub(in crate::mediate) start: u64,
    /// Bytes charged in it.
    pub(in crate::mediate) bytes: u64,
    /// A post did not fit: every post waits until the window ends.
    pub(in crate::mediate) full: bool,
    /// A person and the sender were told that it is full.
    pub(in crate::mediate) told: bool,
}

/// One sender's refusals not yet logged.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(in crate::mediate) struct Refused {
    /// When the first was counted (ms since the epoch).
    pub(in crate::mediate) start: u64,
    pub(in crate::mediate) count: u64,
    pub(in crate::mediate) first: String,
    pub(in crate::mediate) last: String,
    /// The recipients they named (at most message::MAX_RECIPIENTS).
    pub(in crate::mediate) to: BTreeSet<String>,
    /// Why the first was refused.
    pub(in crate::mediate) reason: String,
}

impl Budget {
    /// Whether its hour is over at `now` (ms).
    pub(super) fn over(&self, now: u64) -> bool {
        now.saturating_sub(self.start) >= BUDGET_WINDOW_MS
    }
}

/// Rate and duplicate memory, and what the door said and counted.
/// Bounded: a sender keeps at most the policy's rate count of times, and
/// at most MAX_REMEMBERED digests are kept.
#[derive(Default, Serialize, Deserialize)]
pub(in crate::mediate) struct Memory {
    pub(in crate::mediate) version: u32,
    /// Sender -> times (ms since the epoch) of its recent admitted messages.
    pub(in crate::mediate) rate: HashMap<String, VecDeque<u64>>,
    /// Digest (hex) and time (ms) of recent messages, oldest first.
    pub(in crate::mediate) dups: VecDeque<(String, u64)>,
    /// Inbox owner -> mtime (ns) of its `cur/` when receipts were last taken.
    pub(in crate::mediate) receipts: HashMap<String, i128>,
    /// Senders over their held-queue cap who were told about it (one
    /// status message per episode; forgotten once they are below the cap).
    #[serde(default)]
    pub(in crate::mediate) capped: BTreeSet<String>,
    /// Quarantine ids of planted directories that could not be taken:
    /// left where they are, said once, never tried again (at most
    /// MAX_REMEMBERED, oldest forgotten first).
    #[serde(default)]
    pub(in crate::mediate) left: VecDeque<String>,
    /// Sender -> its log budget this hour (budget.rs).
    #[serde(default)]
    pub(in crate::mediate) budget: HashMap<String, Budget>,
    /// Sender -> its refusals counted and not yet logged.
    #[serde(default)]
    pub(in crate::mediate) refused: BTreeMap<String, Refused>,
    /// The posts of the last batch with refusals that were counted: a
    /// restart claims them without counting them again.
    #[serde(default)]
    pub(in crate::mediate) refusing: Vec<String>,
    /// Senders told that their quarantine budget is used, in this episode
    /// (keep.rs).
    #[serde(default)]
    pub(in crate::mediate) quarantine_told: BTreeSet<String>,
    #[serde(skip)]
    pub(in crate::mediate) dup_index: HashMap<String, u64>,
    /// Changed since it was last saved.
    #[serde(skip)]
    pub(in crate::mediate) dirty: bool,
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
    pub(in crate::mediate) fn dup_time(&self, digest: &str, now: u64, window: u64) -> Option<u64> {
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
    pub(in crate::mediate) fn remember(&mut self, digest: &str, now: u64, window: u64) {
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
    pub(in crate::mediate) fn rate_count(&self, sender: &str, now: u64, window: u64) -> usize {
        self.rate.get(sender).map_or(0, |q| {
            q.iter()
                .skip_while(|t| now.saturating_sub(**t) >= window)
                .count()
        })
    }

    /// Counts a post of `sender` admitted at `now`, forgetting those out of
    /// the `window`.
    pub(in crate::mediate) fn count_post(&mut self, sender: &str, now: u64, window: u64) {
        let q = self.rate.entry(sender.to_string()).or_default();
        while q.front().is_some_and(|t| now.saturating_sub(*t) >= window) {
            q.pop_front();
        }
        q.push_back(now);
        self.dirty = true;
    }

    /// Whether the entry of quarantine id `qid` was left for good.
    pub(in crate::mediate) fn is_left(&self, qid: &str) -> bool {
        self.left.iter().any(|q| q == qid)
    }

    /// Remembers that the entry of quarantine id `qid` is left for good,
    /// durably at the next save.
    pub(in crate::mediate) fn leave(&mut self, qid: &str) {
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
    pub(in crate::mediate) fn was_refused(&self, id: &str) -> bool {
        self.refusing.iter().any(|r| r == id)
    }
}
