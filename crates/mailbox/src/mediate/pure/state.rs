//! What the mediator decides from, apart from the policy: the sandboxes
//! the registry knew at the start of the pass, the durable memory, the
//! held queue's counts, what the batch being routed holds in reserve, the
//! secret values and the log budget.  Deciding (decide.rs) only reads it;
//! the changes a decision returns are applied here, by the caller, once
//! it has taken the decision.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::memory::Memory;
use crate::log::{Action, Decision, Entry, LOG_VERSION};
use crate::message::{self, Message};
use crate::redact::Secrets;
use crate::registry::Sandbox;

/// The default of `door.log-max`: log bytes per sender per hour.
pub const DEFAULT_LOG_MAX: u64 = 8 << 20;
/// The default of `door.quarantine-max`: bytes the quarantine keeps of
/// one sender's bad entries.
pub const DEFAULT_QUARANTINE_MAX: u64 = 16 << 20;

/// What the sender's entries in the quarantine take, as last counted and
/// charged since.
#[derive(Default)]
pub(in crate::mediate) struct Kept {
    pub(in crate::mediate) bytes: HashMap<String, u64>,
    pub(in crate::mediate) counted: Option<Instant>,
    /// Senders cut short in this run and not yet told.
    pub(in crate::mediate) over: BTreeSet<String>,
}

/// The mediator's state (see the module docs).
pub struct State {
    /// Registered sandboxes by name, as read at the start of the pass.
    pub(in crate::mediate) known: HashMap<String, Sandbox>,
    pub(in crate::mediate) memory: Memory,
    /// Sender -> messages of theirs in `held/new/`, counted at each pass.
    pub(in crate::mediate) held_count: HashMap<String, u32>,
    /// Sender -> the most the posts admitted into the batch being routed
    /// can cost, until they are logged and charged.
    pub(in crate::mediate) reserved: HashMap<String, u64>,
    /// Secret values that never leave through the door (crate::redact).
    pub secrets: Secrets,
    /// Log bytes a sender may cause per hour (`door.log-max`).
    pub log_max: u64,
    /// Bytes the quarantine keeps of one sender's bad entries
    /// (`door.quarantine-max`, keep.rs).
    pub quarantine_max: u64,
    /// What each sender's entries in the quarantine take (keep.rs).
    pub(in crate::mediate) kept: Kept,
}

impl Default for State {
    fn default() -> State {
        State {
            known: HashMap::new(),
            memory: Memory::default(),
            held_count: HashMap::new(),
            reserved: HashMap::new(),
            secrets: Secrets::new(),
            log_max: DEFAULT_LOG_MAX,
            quarantine_max: DEFAULT_QUARANTINE_MAX,
            kept: Kept::default(),
        }
    }
}

/// The mailbox a party's messages sit in: `HOST/NAME` is the proxy NAME
/// (names are unique across hosts), any other party itself.
pub(crate) fn mailbox_name(party: &str) -> &str {
    crate::message::split_qualified(party).map_or(party, |(_, n)| n)
}

/// What a decision changes in the state, applied by [`State::apply`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::mediate) enum Change {
    /// Remember a message's content digest, for duplicates within `window` (ms).
    Remember { digest: String, window: u64 },
    /// Count a post of a sender against its rate, within `window` (ms).
    Rate { sender: String, window: u64 },
    /// One more message of a sender in the held queue.
    Held(String),
    /// A sender was told it reached the held-queue cap (once per episode).
    Capped(String),
    /// A sender's log budget is used up for the rest of its hour.
    Full(String),
}

impl State {
    /// Applies what a decision taken at `now` changes.
    pub(in crate::mediate) fn apply(&mut self, changes: &[Change], now: Duration) {
        let now_ms = now.as_millis() as u64;
        for c in changes {
            match c {
                Change::Remember { digest, window } => {
                    self.memory.remember(digest, now_ms, *window)
                }
                Change::Rate { sender, window } => self.memory.count_post(sender, now_ms, *window),
                Change::Held(s) => *self.held_count.entry(s.clone()).or_default() += 1,
                Change::Capped(s) => {
                    self.memory.capped.insert(s.clone());
                    self.memory.dirty = true;
                }
                Change::Full(s) => self.mark_full(s, now_ms),
            }
        }
    }

    /// The party the owner of a mailbox is to messages and the log: a
    /// proxy of another host's sandbox (its record has `host`) is
    /// `HOST/NAME`, any other owner its bare name (mailbox-spec.md,
    /// FEDERATION).
    pub(in crate::mediate) fn qualified(&self, owner: &str) -> String {
        match self.known.get(owner).and_then(|s| s.host.as_deref()) {
            Some(h) => format!("{h}/{owner}"),
            None => owner.to_string(),
        }
    }

    /// The recipient a party names here: `HOST/NAME` is the proxy NAME
    /// when its record says HOST; anything else is itself (and an unknown
    /// qualified name stays as it is, to bounce).
    pub(in crate::mediate) fn resolve(&self, party: &str) -> String {
        match crate::message::split_qualified(party) {
            Some((h, n)) if self.known.get(n).and_then(|s| s.host.as_deref()) == Some(h) => {
                n.to_string()
            }
            _ => party.to_string(),
        }
    }

    /// The log entry recording decision `d` on `m` from `sender`, at `now`.
    pub(in crate::mediate) fn entry(
        &self,
        m: &Message,
        sender: &str,
        mut d: Decision,
        now: Duration,
    ) -> Entry {
        let keep_body = !(d.quiet || matches!(d.action, Action::Hold | Action::Drop));
        self.secrets.mask_in(&mut d.reason);
        Entry {
            version: LOG_VERSION,
            name: Entry::name_for(&m.id, d.action, None),
            logged: base::time::rfc3339(now),
            message_id: m.id.clone(),
            sender: sender.to_string(),
            message: Some(self.logged_message(m, keep_body)),
            decision: d,
        }
    }

    /// A message as the log keeps it: secret values masked, and the body
    /// left out of hold, drop and refusal entries (the held queue keeps the
    /// body of a held message; a refused one goes back to its sender).
    pub(in crate::mediate) fn logged_message(&self, m: &Message, keep_body: bool) -> Message {
        let mut m = m.clone();
        if !keep_body {
            m.body.clear();
        }
        if !self.secrets.is_empty() {
            self.secrets.mask_in(&mut m.subject);
            fit(&mut m.subject, message::MAX_SUBJECT);
            self.secrets.mask_in(&mut m.body);
            fit(&mut m.body, message::MAX_BODY);
            for r in &mut m.refs {
                self.secrets.mask_in(r);
                fit(r, message::MAX_REF);
            }
        }
        m
    }

    /// Whether a logged entry records `m` (as [`State::logged_message`] keeps it).
    pub(in crate::mediate) fn records(&self, e: &Entry, m: &Message) -> bool {
        match &e.message {
            Some(l) => {
                l == m || *l == self.logged_message(m, true) || *l == self.logged_message(m, false)
            }
            None => false,
        }
    }

    /// The name of a secret the message carries, if any.
    pub(in crate::mediate) fn secret_in(&self, m: &Message) -> Option<String> {
        if self.secrets.is_empty() {
            return None;
        }
        [&m.subject, &m.body]
            .into_iter()
            .chain(m.refs.iter())
            .find_map(|t| self.secrets.find(t))
            .map(str::to_string)
    }
}

/// Cuts `s` to at most `max` bytes, on a character boundary.
fn fit(s: &mut String, max: usize) {
    while s.len() > max {
        s.pop();
    }
}
