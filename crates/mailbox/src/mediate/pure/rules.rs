//! The log budget's rules (door.log-max; the story is in budget.rs, which
//! logs and tells what these decide): what an entry costs its sender, what
//! the most a post can cost is, and whether it fits in what is left of its
//! sender's hour.  Pure: the time comes in, the memory is the state's.

use std::time::Duration;

use super::memory::Budget;
use super::state::State;
use crate::layout;
use crate::log::{Action, Entry};
use crate::message::Message;

/// The allocation unit entries are charged by.
const BLOCK: u64 = 4096;
/// Kept free for the entry of refusals still being counted.
const RESERVE: u64 = 2 * BLOCK;
/// The most an entry adds to its message and recipients (names, ids, the
/// reason; a spoofed `from` quoted in it is at most a party name).
const ENTRY_OVERHEAD: u64 = 2048;

/// The most a quarantine entry can take.
pub(in crate::mediate) const QUARANTINE_COST: u64 = 2 * BLOCK;

/// The blocks `n` bytes take.
fn blocks(n: u64) -> u64 {
    n.div_ceil(BLOCK) * BLOCK
}

/// Senders whose log is not budgeted: a person, the mediator's own
/// notices (one per sender and hour or episode), and another host's
/// sandbox (`HOST/NAME`), whose posts its own host's mediator budgeted
/// before lw-sync brought them here.
pub(in crate::mediate) fn unbudgeted(sender: &str) -> bool {
    sender == layout::HUMAN
        || sender == layout::MEDIATOR
        || crate::message::split_qualified(sender).is_some()
}

/// What a logged entry costs its sender: the blocks it takes, and for
/// a forward or release one for each receipt to come.
fn cost(e: &Entry) -> u64 {
    if unbudgeted(&e.sender) || e.decision.action == Action::Read {
        // Receipts were charged with their forward.
        return 0;
    }
    let mut cost = blocks(e.to_bytes().len() as u64);
    if matches!(e.decision.action, Action::Forward | Action::Release) {
        cost += BLOCK * e.decision.to.len() as u64;
    }
    cost
}

impl State {
    /// `sender`'s budget as it stands at `now`: used up, and the bytes
    /// charged (none when its hour is over).
    fn budget_at(&self, sender: &str, now: Duration) -> (bool, u64) {
        match self.memory.budget.get(sender) {
            Some(b) if !b.over(now.as_millis() as u64) => (b.full, b.bytes),
            _ => (false, 0),
        }
    }

    /// `sender`'s budget, a fresh one when its hour is over at `now` (ms).
    pub(in crate::mediate) fn budget_mut(&mut self, sender: &str, now: u64) -> &mut Budget {
        let b = self.memory.budget.entry(sender.to_string()).or_default();
        if b.over(now) {
            *b = Budget {
                start: now,
                ..Budget::default()
            };
            self.memory.dirty = true;
        }
        b
    }

    /// Whether `sender`'s posts wait for the rest of its hour.
    pub(in crate::mediate) fn is_full(&self, sender: &str, now: Duration) -> bool {
        !unbudgeted(sender) && self.budget_at(sender, now).0
    }

    /// Whether a post that can cost `most` bytes of log fits in `sender`'s
    /// budget at `now`.  What earlier posts of the batch may cost is
    /// charged only when the batch is logged: until then it is held in
    /// reserve, and counted here.
    pub(in crate::mediate) fn fits(&self, sender: &str, most: u64, now: Duration) -> bool {
        if unbudgeted(sender) {
            return true;
        }
        let (full, bytes) = self.budget_at(sender, now);
        let used = bytes + self.reserved.get(sender).copied().unwrap_or(0);
        !full && (used == 0 || used + most + RESERVE <= self.log_max)
    }

    /// Makes `sender` full for the rest of its hour (from `now`, ms, when
    /// its last hour is over).
    pub(in crate::mediate) fn mark_full(&mut self, sender: &str, now: u64) {
        self.budget_mut(sender, now).full = true;
        self.memory.dirty = true;
    }

    /// The most the entries of a new decision on `m` can take: its main
    /// entry with the message, a bounce entry too when a recipient may not
    /// exist, and a receipt for each recipient it can reach.
    pub(in crate::mediate) fn most_cost(&self, policy: &crate::policy::Policy, m: &Message) -> u64 {
        use crate::policy::Route;
        let msg = serde_json::to_vec(&self.logged_message(m, true)).map_or(0, |v| v.len() as u64);
        let route = policy.route(m.kind).value;
        let mut reach = m.to.len() as u64;
        match route {
            Route::Scope => reach += self.known.len() as u64,
            Route::Asker => reach += 1,
            _ => {}
        }
        let unknown = m.to.iter().any(|t| {
            let t = self.resolve(t);
            t != layout::HUMAN && t != layout::MEDIATOR && !self.known.contains_key(&t)
        });
        let entries = if unknown || route == Route::Asker {
            2
        } else {
            1
        };
        entries * blocks(ENTRY_OVERHEAD + msg + 80 * reach) + BLOCK * reach
    }

    /// Holds what the entries of a post admitted into the batch will cost
    /// in reserve, until the batch is logged and they are charged.
    pub(in crate::mediate) fn reserve(&mut self, entries: &[Entry]) {
        for e in entries {
            let c = cost(e);
            if c > 0 {
                *self.reserved.entry(e.sender.clone()).or_default() += c;
            }
        }
    }

    /// Charges a logged entry to the sender that caused it, at `now` (ms).
    pub(in crate::mediate) fn charge(&mut self, e: &Entry, now: u64) {
        let cost = cost(e);
        if cost == 0 {
            return;
        }
        self.budget_mut(&e.sender, now).bytes += cost;
        self.memory.dirty = true;
    }
}

#[cfg(test)]
mod tests {
    use super::super::memory::BUDGET_WINDOW_MS;
    use super::*;
    use crate::log::{Decision, LOG_VERSION};

    fn entry(sender: &str, action: Action, to: &[&str], bytes: usize) -> Entry {
        Entry {
            version: LOG_VERSION,
            name: format!("x.{}", action.as_str()),
            logged: String::new(),
            message_id: "x".into(),
            sender: sender.into(),
            message: None,
            decision: Decision {
                quiet: false,
                action,
                to: to.iter().map(|t| t.to_string()).collect(),
                reason: "r".repeat(bytes),
            },
        }
    }

    #[test]
    fn a_sender_is_full_for_the_rest_of_its_hour_once_a_post_does_not_fit() {
        let mut s = State {
            log_max: 64 << 10,
            ..State::default()
        };
        let t = Duration::from_secs(1_800_000_000);
        let ms = t.as_millis() as u64;
        // A fresh hour admits even a post that could cost more than all of it.
        assert!(s.fits("api", 1 << 20, t));
        // 4 KiB for the entry and 4 KiB for each receipt to come.
        s.charge(&entry("api", Action::Forward, &["web", "db"], 100), ms);
        assert_eq!(s.memory.budget["api"].bytes, 3 * BLOCK);
        s.charge(&entry("api", Action::Read, &["web"], 100), ms);
        s.charge(&entry("api", Action::Hold, &[], 5000), ms);
        assert_eq!(
            s.memory.budget["api"].bytes,
            5 * BLOCK,
            "receipts not again"
        );
        // 20 KiB used, 8 KiB kept for a count of refusals: 36 KiB fit.
        assert!(s.fits("api", 36 << 10, t));
        assert!(!s.fits("api", (36 << 10) + 1, t));
        // What the batch being routed holds in reserve counts too.
        s.reserve(&[entry("api", Action::Hold, &[], 100)]);
        assert!(!s.fits("api", 36 << 10, t) && s.fits("api", 32 << 10, t));
        s.reserved.clear();
        s.mark_full("api", ms);
        assert!(
            s.is_full("api", t) && !s.fits("api", 1, t),
            "full until the hour ends"
        );
        // Others, a person, another host's sandbox and the mediator's own
        // notices are not held back.
        assert!(s.fits("web", 8 << 10, t) && s.fits(layout::HUMAN, 1 << 30, t));
        assert!(s.fits("hosta/api", 1 << 30, t) && !s.is_full("hosta/api", t));
        s.charge(
            &entry(layout::MEDIATOR, Action::Escalate, &["human"], 100),
            ms,
        );
        assert!(!s.memory.budget.contains_key(layout::MEDIATOR));
        // The next hour starts afresh.
        let later = t + Duration::from_millis(BUDGET_WINDOW_MS);
        assert!(!s.is_full("api", later) && s.fits("api", 36 << 10, later));
        s.charge(
            &entry("api", Action::Hold, &[], 100),
            later.as_millis() as u64,
        );
        assert_eq!(s.memory.budget["api"].bytes, BLOCK);
        assert!(!s.memory.budget["api"].full);
    }

    #[test]
    fn entries_are_charged_by_the_block() {
        assert_eq!(blocks(1), 4096);
        assert_eq!(blocks(4096), 4096);
        assert_eq!(blocks(4097), 8192);
    }
}
