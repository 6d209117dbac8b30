//! What one sender may make the door write on the root's disk
//! (mailbox-spec.md, "BUDGET AND REFUSALS").
//!
//! Every post used to leave at least one log entry (a 4 KiB block), and
//! each refusal over the held-queue cap a bounce entry and a bounce file:
//! a flood grew the root's disk, which no sandbox quota covers.  Two rules
//! bound it:
//!
//! * **Refusals are counted, not logged one by one.**  A post refused over
//!   the held-queue cap is counted in the memory (`refused`, per sender,
//!   made durable before the post is claimed, with the ids of the batch's
//!   refusals so that a restart between the two counts none twice); once a
//!   minute (and at the end of `--once`) each sender's count becomes one
//!   `AID.bounce` entry carrying a summary message, and one bounce goes back
//!   to the sender.
//! * **Log bytes per sender per hour are capped** (`door.log-max`, default
//!   8 MiB).  Each entry a sender causes is charged as the blocks it takes
//!   (its size rounded up to 4 KiB) plus, for a forward or release, a block
//!   per recipient for the receipts to come.  A post is admitted only when
//!   the most it can cost fits in what is left; otherwise the sender is
//!   full until the hour ends: its posts wait in its outbox (bounded by its
//!   mail quota), and a person and the sender are told once per hour.  A
//!   post whose most possible cost exceeds the whole budget goes only at the
//!   start of an hour, so that nothing waits forever.
//!
//! The budget lives in the memory (`ROOT/state/mediator.json`): a few
//! numbers per sender, so it survives restarts at the cost of a forgotten
//! second or two after a crash.

use std::collections::HashMap;
use std::io::Write;

use super::pure::decide::derived_id;
use super::pure::memory::{BUDGET_WINDOW_MS, Budget, Refused};
use super::pure::rules::unbudgeted;
use super::{Boxes, Mediator};
use crate::batch::Batch;
use crate::layout;
use crate::log::{Action, Decision, Entry, LOG_VERSION};
use crate::message::{self, Kind, Message};
use base::error::Result;

/// How long refusals are counted before their entry is logged.
pub(super) const REFUSAL_WINDOW_MS: u64 = 60_000;

/// The id of the entry counting `sender`'s refusals from `first` on.
pub fn refusals_id(sender: &str, first: &str) -> String {
    derived_id(
        base::id::time_of(first).unwrap_or_default(),
        &[b"refused", sender.as_bytes(), first.as_bytes()],
    )
}

/// The id of the notice that `sender`'s budget from `start` is used up.
fn full_notice_id(sender: &str, start: u64) -> String {
    derived_id(
        std::time::Duration::from_millis(start),
        &[b"log-budget", sender.as_bytes(), &start.to_le_bytes()],
    )
}

pub(super) fn size_text(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

impl Mediator {
    /// Whether `sender`'s posts wait for the rest of its hour; a budget
    /// whose hour is over starts afresh.
    pub(super) fn budget_full(&mut self, sender: &str) -> bool {
        !unbudgeted(sender) && self.state.budget_mut(sender, base::time::now_ms()).full
    }

    /// Counts a batch's refusals (`(sender, post, refusal entry)`) and makes
    /// the count durable, before their posts are claimed.
    pub(super) fn count_refusals(&mut self, refused: &[(String, String, Entry)]) -> Result<()> {
        if refused.is_empty() && self.state.memory.refusing.is_empty() {
            return Ok(());
        }
        let now = base::time::now_ms();
        self.state.memory.refusing.clear();
        for (sender, id, e) in refused {
            let r = self.state.memory.refused.entry(sender.clone()).or_default();
            if r.count == 0 {
                *r = Refused {
                    start: now,
                    first: id.clone(),
                    reason: e.decision.reason.clone(),
                    ..Refused::default()
                };
            }
            r.count += 1;
            r.last = id.clone();
            for t in &e.decision.to {
                if r.to.len() < message::MAX_RECIPIENTS {
                    r.to.insert(t.clone());
                }
            }
            self.state.memory.refusing.push(id.clone());
        }
        self.state.memory.dirty = true;
        self.save_memory()
    }

    /// Logs the count of each sender's refusals whose minute is over (all
    /// of them with `all`), and bounces it back to the sender once.
    pub(super) fn log_refusals(
        &mut self,
        boxes: &mut Boxes,
        all: bool,
        out: &mut dyn Write,
    ) -> Result<()> {
        let now = base::time::now_ms();
        let due: Vec<String> = self
            .state
            .memory
            .refused
            .iter()
            .filter(|(_, r)| all || now.saturating_sub(r.start) >= REFUSAL_WINDOW_MS)
            .map(|(s, _)| s.clone())
            .collect();
        for sender in due {
            let r = self.state.memory.refused[&sender].clone();
            let e = self.refusals_entry(&sender, &r);
            self.log_and_deliver(boxes, &e, out)?;
            // `refusing` stays: a post of the run a failed claim left is
            // claimed later without being counted again.
            self.state.memory.refused.remove(&sender);
            self.state.memory.dirty = true;
            self.save_memory()?;
        }
        Ok(())
    }

    /// The one entry that counts a run of refusals: a bounce whose message
    /// sums them up (`N posts refused`); the posts stay in the sender's
    /// `outbox/cur/`, and no copy of them is kept anywhere else.
    fn refusals_entry(&self, sender: &str, r: &Refused) -> Entry {
        let id = refusals_id(sender, &r.first);
        let to: Vec<String> = if r.to.is_empty() {
            vec![layout::MEDIATOR.to_string()]
        } else {
            r.to.iter().cloned().collect()
        };
        let since = base::time::rfc3339(std::time::Duration::from_millis(r.start));
        let m = Message {
            version: message::VERSION,
            id: id.clone(),
            from: sender.to_string(),
            to: to.clone(),
            kind: Kind::Status,
            subject: format!("{} posts refused", r.count),
            body: format!(
                "{} posts of {sender}, the first {} and the last {}, counted from {since}, were refused.\n\
                 The first was refused because: {}\n\
                 Each is still in the outbox/cur of {sender}; none was delivered or kept anywhere else.\n",
                r.count, r.first, r.last, r.reason
            ),
            refs: vec![],
            in_reply_to: None,
            created: since,
        };
        Entry {
            version: LOG_VERSION,
            name: Entry::name_for(&id, Action::Bounce, None),
            logged: base::time::rfc3339(base::time::now()),
            message_id: id,
            sender: sender.to_string(),
            message: Some(m),
            decision: Decision {
                quiet: false,
                action: Action::Bounce,
                to,
                reason: format!(
                    "{} posts of {sender} refused, counted in this one entry (one a minute per sender); the first: {}",
                    r.count, r.reason
                ),
            },
        }
    }

    /// Tells a person and each sender whose budget is used up, once per
    /// hour: one status message to both, from the mediator; and the
    /// operator, on standard error, once per hour and run.
    pub(super) fn tell_full(
        &mut self,
        boxes: &mut Boxes,
        waiting: &HashMap<String, u64>,
        out: &mut dyn Write,
    ) -> Result<()> {
        let cap = size_text(self.state.log_max);
        let mut full: Vec<(String, u64)> = self
            .state
            .memory
            .budget
            .iter()
            .filter(|(_, b)| b.full)
            .map(|(s, b)| (s.clone(), b.start + BUDGET_WINDOW_MS))
            .collect();
        full.sort();
        for (sender, until) in full {
            let until = base::time::rfc3339(std::time::Duration::from_millis(until));
            self.warn_once(format!(
                "the posts of {sender} wait in its outbox until {until}: it used its log budget of {cap} for the hour (door.log-max)"
            ));
        }
        let mut due: Vec<(String, Budget)> = self
            .state
            .memory
            .budget
            .iter()
            .filter(|(_, b)| b.full && !b.told)
            .map(|(s, b)| (s.clone(), b.clone()))
            .collect();
        due.sort_by(|a, b| a.0.cmp(&b.0));
        for (sender, b) in due {
            let n = waiting.get(&sender).copied().unwrap_or(0);
            let e = self.full_notice(&sender, &b, n);
            self.log_and_deliver(boxes, &e, out)?;
            if let Some(b) = self.state.memory.budget.get_mut(&sender) {
                b.told = true;
            }
            self.state.memory.dirty = true;
            self.save_memory()?;
        }
        Ok(())
    }

    fn full_notice(&self, sender: &str, b: &Budget, waiting: u64) -> Entry {
        let id = full_notice_id(sender, b.start);
        let cap = size_text(self.state.log_max);
        let until =
            base::time::rfc3339(std::time::Duration::from_millis(b.start + BUDGET_WINDOW_MS));
        let to = vec![layout::HUMAN.to_string(), sender.to_string()];
        crate::log::Notice {
            id,
            to,
            subject: format!("{sender} used its log budget of {cap} for the hour; its posts wait"),
            body: format!(
                "The log entries {sender}'s posts caused this hour take {} of the {cap} a sender may use\n\
                 in an hour (door.log-max in .loopwright/config).  Its further posts ({waiting} now) wait\n\
                 in its outbox until {until}, when the mediator takes them again; none is lost.\n\
                 \n\
                 This is said once an hour, to a person and to {sender}.\n",
                size_text(b.bytes)
            ),
            at: std::time::Duration::from_millis(b.start),
            reason: format!(
                    "sender {sender} used its log budget of {cap} for the hour (door.log-max); its posts wait in its outbox; said once an hour"
                ),
        }
        .entry()
    }

    /// Logs one entry and delivers its copies, each durable, each at most
    /// once (a restart writes the same names).
    pub(super) fn log_and_deliver(
        &mut self,
        boxes: &mut Boxes,
        e: &Entry,
        out: &mut dyn Write,
    ) -> Result<()> {
        self.log_entries(boxes, &[e], out)?;
        let mut g = Batch::with_sync(self.sync);
        let m = e
            .message
            .clone()
            .expect("the door's own entries carry a message");
        self.stage_deliveries(boxes, &mut g, e, &m)?;
        if !g.is_empty() {
            g.commit(&boxes.list)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_said_in_the_largest_whole_unit() {
        assert_eq!(size_text(8 << 20), "8 MiB");
        assert_eq!(size_text(16 << 10), "16 KiB");
        assert_eq!(size_text(1536), "1536 bytes");
    }
}
