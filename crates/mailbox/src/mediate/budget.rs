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

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::decide::derived_id;
use super::state::State;
use super::{Boxes, Mediator};
use crate::batch::Batch;
use crate::error::Result;
use crate::layout;
use crate::log::{Action, Decision, Entry, LOG_VERSION};
use crate::message::{self, Kind, Message};

/// The default of `door.log-max`: log bytes per sender per hour.
pub const DEFAULT_LOG_MAX: u64 = 8 << 20;
/// How long a sender's log budget lasts.
pub const BUDGET_WINDOW_MS: u64 = 3_600_000;
/// How long refusals are counted before their entry is logged.
pub const REFUSAL_WINDOW_MS: u64 = 60_000;
/// The allocation unit entries are charged by.
const BLOCK: u64 = 4096;
/// Kept free for the entry of refusals still being counted.
const RESERVE: u64 = 2 * BLOCK;
/// The most an entry adds to its message and recipients (names, ids, the
/// reason; a spoofed `from` quoted in it is at most a party name).
const ENTRY_OVERHEAD: u64 = 2048;

/// One sender's log budget for the hour from `start`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Budget {
    /// Start of the window (ms since the epoch).
    start: u64,
    /// Bytes charged in it.
    bytes: u64,
    /// A post did not fit: every post waits until the window ends.
    full: bool,
    /// A person and the sender were told that it is full.
    told: bool,
}

/// One sender's refusals not yet logged.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Refused {
    /// When the first was counted (ms since the epoch).
    start: u64,
    count: u64,
    first: String,
    last: String,
    /// The recipients they named (at most message::MAX_RECIPIENTS).
    to: BTreeSet<String>,
    /// Why the first was refused.
    reason: String,
}

/// The blocks `n` bytes take.
fn blocks(n: u64) -> u64 {
    n.div_ceil(BLOCK) * BLOCK
}

/// The id of the entry counting `sender`'s refusals from `first` on.
pub fn refusals_id(sender: &str, first: &str) -> String {
    derived_id(
        crate::id::time_of(first).unwrap_or_default(),
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

/// Senders whose log is not budgeted: a person, the mediator's own
/// notices (one per sender and hour or episode), and another host's
/// sandbox (`HOST/NAME`), whose posts its own host's mediator budgeted
/// before lw-sync brought them here.
fn unbudgeted(sender: &str) -> bool {
    sender == layout::HUMAN
        || sender == layout::MEDIATOR
        || crate::message::split_qualified(sender).is_some()
}

/// The most a quarantine entry can take.
pub(super) const QUARANTINE_COST: u64 = 2 * BLOCK;

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

impl Budget {
    /// Whether its hour is over at `now` (ms).
    fn over(&self, now: u64) -> bool {
        now.saturating_sub(self.start) >= BUDGET_WINDOW_MS
    }
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
    fn budget_mut(&mut self, sender: &str, now: u64) -> &mut Budget {
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
    pub(super) fn is_full(&self, sender: &str, now: Duration) -> bool {
        !unbudgeted(sender) && self.budget_at(sender, now).0
    }

    /// Whether a post that can cost `most` bytes of log fits in `sender`'s
    /// budget at `now`.  What earlier posts of the batch may cost is
    /// charged only when the batch is logged: until then it is held in
    /// reserve, and counted here.
    pub(super) fn fits(&self, sender: &str, most: u64, now: Duration) -> bool {
        if unbudgeted(sender) {
            return true;
        }
        let (full, bytes) = self.budget_at(sender, now);
        let used = bytes + self.reserved.get(sender).copied().unwrap_or(0);
        !full && (used == 0 || used + most + RESERVE <= self.log_max)
    }

    /// Makes `sender` full for the rest of its hour (from `now`, ms, when
    /// its last hour is over).
    pub(super) fn mark_full(&mut self, sender: &str, now: u64) {
        self.budget_mut(sender, now).full = true;
        self.memory.dirty = true;
    }

    /// The most the entries of a new decision on `m` can take: its main
    /// entry with the message, a bounce entry too when a recipient may not
    /// exist, and a receipt for each recipient it can reach.
    pub(super) fn most_cost(&self, policy: &crate::policy::Policy, m: &Message) -> u64 {
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
    pub(super) fn reserve(&mut self, entries: &[Entry]) {
        for e in entries {
            let c = cost(e);
            if c > 0 {
                *self.reserved.entry(e.sender.clone()).or_default() += c;
            }
        }
    }

    /// Charges a logged entry to the sender that caused it, at `now` (ms).
    pub(super) fn charge(&mut self, e: &Entry, now: u64) {
        let cost = cost(e);
        if cost == 0 {
            return;
        }
        self.budget_mut(&e.sender, now).bytes += cost;
        self.memory.dirty = true;
    }
}

impl Mediator {
    /// Whether `sender`'s posts wait for the rest of its hour; a budget
    /// whose hour is over starts afresh.
    pub(super) fn budget_full(&mut self, sender: &str) -> bool {
        !unbudgeted(sender) && self.state.budget_mut(sender, crate::time::now_ms()).full
    }

    /// Counts a batch's refusals (`(sender, post, refusal entry)`) and makes
    /// the count durable, before their posts are claimed.
    pub(super) fn count_refusals(&mut self, refused: &[(String, String, Entry)]) -> Result<()> {
        if refused.is_empty() && self.state.memory.refusing.is_empty() {
            return Ok(());
        }
        let now = crate::time::now_ms();
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
        let now = crate::time::now_ms();
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
        let since = crate::time::rfc3339(std::time::Duration::from_millis(r.start));
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
            logged: crate::time::rfc3339(crate::time::now()),
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
            let until = crate::time::rfc3339(std::time::Duration::from_millis(until));
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
            crate::time::rfc3339(std::time::Duration::from_millis(b.start + BUDGET_WINDOW_MS));
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
        assert_eq!(size_text(8 << 20), "8 MiB");
        assert_eq!(size_text(1536), "1536 bytes");
    }
}
