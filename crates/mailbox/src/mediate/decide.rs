//! Deciding: what the policy says of one message from one sender (route,
//! hold, refuse, bounce), and the entries that record it.  Reads the
//! mediator's memory and policy; writes nothing to disk.

use super::mailbox_name;
use crate::digest::hex;
use crate::layout;
use crate::log::{Action, Decision, Entry, LOG_VERSION};
use crate::message::{self, Kind, Message};
use crate::policy::{self, Route};
use sha2::{Digest, Sha256};
use std::ffi::OsStr;
use std::time::Duration;

use super::*;

/// A derived id: the time part of `base` (or `t`), 128 bits of a digest.
pub(super) fn derived_id(t: Duration, parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    let d = h.finalize();
    let mut r = [0u8; 16];
    r.copy_from_slice(&d[..16]);
    crate::id::id_at(t, u128::from_be_bytes(r))
}

/// The id of the status message sent when post `id` found its sender at
/// the held-queue cap.
pub fn cap_notice_id(id: &str) -> String {
    derived_id(
        crate::id::time_of(id).unwrap_or_default(),
        &[b"held-cap", id.as_bytes()],
    )
}

/// Cuts `s` to at most `max` bytes, on a character boundary.
pub(super) fn fit(s: &mut String, max: usize) {
    while s.len() > max {
        s.pop();
    }
}

/// The id of the bounce sent back for message `id`.
pub fn bounce_id(id: &str) -> String {
    derived_id(
        crate::id::time_of(id).unwrap_or_default(),
        &[b"bounce", id.as_bytes()],
    )
}

/// The digest that makes two messages "exact duplicates": everything a
/// reader sees except the id and the creation time.
pub(super) fn content_digest(m: &Message) -> String {
    let v = serde_json::json!([
        m.from,
        m.to,
        m.kind,
        m.subject,
        m.body,
        m.refs,
        m.in_reply_to
    ]);
    hex(&Sha256::digest(v.to_string().as_bytes())[..16])
}

/// What a route rule made of a message: a finished answer (main decision,
/// bounced recipients, why they bounce), or the targets to check against
/// the registry (targets, why, why the unknown ones bounce).
pub(super) enum Routed {
    Done(Option<Decision>, Vec<String>, String),
    Targets(Vec<String>, String, String),
}

/// Routes `human` (and `hold` when released): to a person.
fn to_person(m: &Message, release: bool, at: &str) -> Decision {
    Decision {
        quiet: false,
        action: if release {
            Action::Release
        } else {
            Action::Escalate
        },
        to: vec![layout::HUMAN.to_string()],
        reason: format!("kind {} goes to a person ({at})", m.kind),
    }
}

/// Route `named`: the recipients the message names.
fn route_named(m: &Message, named: &[String], at: &str) -> Routed {
    if named.is_empty() && m.kind != Kind::Status {
        return Routed::Done(
            None,
            vec![layout::MEDIATOR.to_string()],
            format!(
                "{} names no recipient but the mediator; name a sandbox with --to ({at})",
                m.kind
            ),
        );
    }
    let why = if named.is_empty() {
        format!(
            "{} addressed to the mediator only: logged, delivered to nobody ({at})",
            m.kind
        )
    } else {
        format!("{} to its named recipients ({at})", m.kind)
    };
    Routed::Targets(named.to_vec(), why, "not a registered sandbox".into())
}

impl Mediator {
    /// Where a message goes by its kind's route, ignoring hold rules.
    /// Returns the main decision (None when every recipient bounced) and the
    /// recipients that bounce, with the reason.
    pub(super) fn route(
        &self,
        m: &Message,
        sender: &str,
        release: bool,
    ) -> (Option<Decision>, Vec<String>, String) {
        let rule = self.policy.route(m.kind);
        let at = self.policy.at(rule.line);
        let named: Vec<String> =
            m.to.iter()
                .filter(|t| *t != layout::MEDIATOR)
                .map(|t| self.resolve(t))
                .collect();
        let routed = match rule.value {
            Route::Hold if !release => Routed::Done(
                Some(Decision {
                    quiet: false,
                    action: Action::Hold,
                    to: vec![],
                    reason: format!("kind {} is routed to hold ({at})", m.kind),
                }),
                vec![],
                String::new(),
            ),
            Route::Human | Route::Hold => {
                Routed::Done(Some(to_person(m, release, &at)), vec![], String::new())
            }
            Route::Named => route_named(m, &named, &at),
            Route::Scope => self.route_scope(m, sender, &named, &at),
            Route::Asker => self.route_asker(m, &named, &at),
        };
        let (mut targets, why, bounce_why) = match routed {
            Routed::Done(main, bounce, why) => return (main, bounce, why),
            Routed::Targets(t, why, bounce_why) => (t, why, bounce_why),
        };
        targets.sort();
        targets.dedup();
        let (known, unknown): (Vec<String>, Vec<String>) = targets
            .into_iter()
            .partition(|t| t == layout::HUMAN || self.known.contains_key(t));
        let main = if known.is_empty() && !(rule.value == Route::Named && named.is_empty()) {
            None
        } else {
            Some(Decision {
                quiet: false,
                action: if release {
                    Action::Release
                } else {
                    Action::Forward
                },
                to: known,
                reason: why,
            })
        };
        (main, unknown, bounce_why)
    }

    /// Route `scope`: every other sandbox whose scope overlaps the refs (or
    /// that declared none), and the named recipients.
    fn route_scope(&self, m: &Message, sender: &str, named: &[String], at: &str) -> Routed {
        let own = mailbox_name(sender);
        let mut t: Vec<String> = self
            .known
            .values()
            .filter(|s| s.name != own)
            .filter(|s| {
                s.scope.is_empty()
                    || m.refs.is_empty()
                    || s.scope
                        .iter()
                        .any(|sc| m.refs.iter().any(|r| policy::overlaps(sc, r)))
            })
            .map(|s| s.name.clone())
            .collect();
        t.extend(named.iter().cloned());
        let why = if m.refs.is_empty() {
            format!("{} without refs goes to every other sandbox ({at})", m.kind)
        } else {
            format!(
                "{} goes to sandboxes whose scope overlaps its refs or that declared none ({at})",
                m.kind
            )
        };
        Routed::Targets(t, why, "not a registered sandbox".into())
    }

    /// Route `asker`: whoever sent the message this one replies to, and the
    /// named recipients.
    fn route_asker(&self, m: &Message, named: &[String], at: &str) -> Routed {
        let Some(q) = &m.in_reply_to else {
            let to = named
                .iter()
                .cloned()
                .chain([layout::MEDIATOR.into()])
                .take(1);
            let why = format!(
                "{} has no in_reply_to, so it has nobody to go to ({at})",
                m.kind
            );
            return Routed::Done(None, to.collect(), why);
        };
        match self.sender_of(q) {
            Some(asker) => {
                let mut t = vec![self.resolve(&asker)];
                t.extend(named.iter().cloned());
                let why = format!("{} goes to {asker}, who sent {q} ({at})", m.kind);
                Routed::Targets(t, why, "not a registered sandbox".into())
            }
            None => Routed::Done(
                None,
                vec![layout::MEDIATOR.to_string()],
                format!("in_reply_to {q} names no message in the log ({at})"),
            ),
        }
    }

    /// The hold rules, in order: sender, kind, duplicate, rate.  Updates the
    /// rate and duplicate memory.
    pub(super) fn hold_reason(&mut self, m: &Message, sender: &str) -> Option<String> {
        if let Some(r) = self.policy.hold_senders.iter().find(|r| r.value == sender) {
            return Some(format!(
                "sender {sender} is held ({})",
                self.policy.at(r.line)
            ));
        }
        if let Some(r) = self.policy.hold_kinds.iter().find(|r| r.value == m.kind) {
            return Some(format!(
                "kind {} is held ({})",
                m.kind,
                self.policy.at(r.line)
            ));
        }
        let now = crate::time::now_ms();
        if let Some(d) = self.policy.duplicates.clone() {
            let window = d.value.as_millis() as u64;
            let mem = &mut self.memory;
            while let Some((h, t)) = mem.dups.front().cloned() {
                if now.saturating_sub(t) > window || mem.dups.len() > MAX_REMEMBERED {
                    mem.dups.pop_front();
                    if mem.dup_index.get(&h) == Some(&t) {
                        mem.dup_index.remove(&h);
                    }
                } else {
                    break;
                }
            }
            let digest = content_digest(m);
            if let Some(t) = mem.dup_index.get(&digest)
                && now.saturating_sub(*t) <= window
            {
                let ago = now.saturating_sub(*t) / 1000;
                return Some(format!(
                    "exact duplicate of a message {sender} posted {ago}s ago (within {}s, {})",
                    d.value.as_secs(),
                    self.policy.at(d.line)
                ));
            }
            mem.dups.push_back((digest.clone(), now));
            mem.dup_index.insert(digest, now);
            self.memory_dirty = true;
        }
        if let Some(r) = self.policy.rate.clone() {
            let window = r.value.window.as_millis() as u64;
            let q = self.memory.rate.entry(sender.to_string()).or_default();
            while q.front().is_some_and(|t| now.saturating_sub(*t) >= window) {
                q.pop_front();
            }
            if q.len() >= r.value.count as usize {
                return Some(format!(
                    "sender {sender} went over {} messages in {}s ({})",
                    r.value.count,
                    r.value.window.as_secs(),
                    self.policy.at(r.line)
                ));
            }
            q.push_back(now);
            self.memory_dirty = true;
        }
        None
    }

    pub(super) fn entry(&self, m: &Message, sender: &str, mut d: Decision) -> Entry {
        let keep_body = !(d.quiet || matches!(d.action, Action::Hold | Action::Drop));
        self.secrets.mask_in(&mut d.reason);
        Entry {
            version: LOG_VERSION,
            name: Entry::name_for(&m.id, d.action, None),
            logged: crate::time::rfc3339(crate::time::now()),
            message_id: m.id.clone(),
            sender: sender.to_string(),
            message: Some(self.logged_message(m, keep_body)),
            decision: d,
        }
    }

    /// A message as the log keeps it: secret values masked, and the body
    /// left out of hold, drop and refusal entries (the held queue keeps the
    /// body of a held message; a refused one goes back to its sender).
    pub(super) fn logged_message(&self, m: &Message, keep_body: bool) -> Message {
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

    /// Whether a logged entry records `m` (as [`Mediator::logged_message`] keeps it).
    pub(super) fn records(&self, e: &Entry, m: &Message) -> bool {
        match &e.message {
            Some(l) => {
                l == m || *l == self.logged_message(m, true) || *l == self.logged_message(m, false)
            }
            None => false,
        }
    }

    /// The name of a secret the message carries, if any.
    pub(super) fn secret_in(&self, m: &Message) -> Option<String> {
        if self.secrets.is_empty() {
            return None;
        }
        [&m.subject, &m.body]
            .into_iter()
            .chain(m.refs.iter())
            .find_map(|t| self.secrets.find(t))
            .map(str::to_string)
    }

    /// Holds a message, or refuses it when its sender is at the cap of the
    /// held queue: a quiet bounce, and the first time in an episode, one
    /// status message to a person.
    pub(super) fn hold_or_refuse(
        &mut self,
        m: &Message,
        sender: &str,
        reason: String,
    ) -> Vec<Entry> {
        let n = self.held_count.get(sender).copied().unwrap_or(0);
        match self.policy.held_max.clone() {
            Some(cap) if sender != layout::HUMAN && n >= cap.value => {
                let at = self.policy.at(cap.line);
                let d = Decision {
                    quiet: true,
                    action: Action::Bounce,
                    to: m.to.clone(),
                    reason: format!(
                        "sender {sender} has {n} messages in the held queue, the most allowed ({at}); this one would have been held ({reason}), so it bounced instead; an operator releases or drops held messages with lw-mediate release or drop"
                    ),
                };
                let mut out = vec![self.entry(m, sender, d)];
                if self.memory.capped.insert(sender.to_string()) {
                    self.memory_dirty = true;
                    out.push(self.cap_notice(m, sender, n, &at));
                }
                out
            }
            _ => {
                *self.held_count.entry(sender.to_string()).or_default() += 1;
                let d = Decision {
                    quiet: false,
                    action: Action::Hold,
                    to: vec![],
                    reason,
                };
                vec![self.entry(m, sender, d)]
            }
        }
    }

    /// The status message that tells a person a sender reached the cap,
    /// logged as an escalation from the mediator; its id derives from the
    /// post that found the cap, so a restart writes the same one.
    pub(super) fn cap_notice(&self, trigger: &Message, sender: &str, n: u32, at: &str) -> Entry {
        let id = cap_notice_id(&trigger.id);
        crate::log::Notice {
            id,
            to: vec![layout::HUMAN.into()],
            subject: format!(
                "{sender} reached the cap of {n} held messages; its further posts bounce"
            ),
            body: format!(
                "Sandbox {sender} has {n} messages in the held queue, the most the policy allows ({at}).\n\
                 Until an operator releases or drops some of them, every further post of {sender} that\n\
                 would be held bounces back to it instead, and is logged without its body.\n\
                 \n\
                 See them:   lw-mediate held\n\
                 Act:        lw-mediate release ID ...   or   lw-mediate drop ID ... --reason TEXT\n\
                 \n\
                 This is said once; it is said again only after {sender} went below the cap.\n"
            ),
            at: crate::time::now(),
            reason: format!(
                    "sender {sender} reached the held-queue cap ({at}); said once per episode"
                ),
        }
        .entry()
    }

    /// A new decision for a message nobody decided on yet.  `bounced`, when
    /// given, is the bounce of an earlier run that must stand.
    pub(super) fn decide(
        &mut self,
        m: &Message,
        sender: &str,
        claimed: &str,
        bounced: Option<Entry>,
    ) -> Vec<Entry> {
        let spoof = if claimed != sender {
            format!(
                "; 'from' in the file said '{}', ignored: the sender is the owner of the outbox",
                claimed.escape_debug()
            )
        } else {
            String::new()
        };
        if let Some(b) = &bounced
            && b.decision.quiet
        {
            // A refusal an earlier run logged: it stands, with its notice.
            let notice = Entry::name_for(&cap_notice_id(&m.id), Action::Escalate, None);
            let mut out = vec![b.clone()];
            if self.log.has(&notice) {
                out.extend(self.log.read(OsStr::new(&notice)).ok());
            }
            return out;
        }
        if bounced.is_none() {
            let why = match self.secret_in(m) {
                Some(name) => Some(format!("contains secret {name}")),
                None => self.hold_reason(m, sender),
            };
            if let Some(reason) = why {
                return self.hold_or_refuse(m, sender, reason + &spoof);
            }
        }
        let (main, unknown, why) = self.route(m, sender, false);
        if bounced.is_none()
            && let Some(d) = &main
            && d.action == Action::Hold
        {
            return self.hold_or_refuse(m, sender, d.reason.clone() + &spoof);
        }
        let mut out = Vec::new();
        match bounced {
            Some(b) => {
                // An earlier run bounced these; deliver only to the rest.
                if let Some(mut d) = main {
                    d.to.retain(|t| !b.decision.to.contains(t));
                    if !d.to.is_empty() {
                        out.push(self.entry(m, sender, d));
                    }
                }
                out.push(b);
            }
            None => {
                if !unknown.is_empty() {
                    let d = Decision {
                        quiet: false,
                        action: Action::Bounce,
                        to: unknown.clone(),
                        reason: format!(
                            "cannot deliver to {}: {why}; a bounce went back to {sender}{spoof}",
                            unknown.join(", ")
                        ),
                    };
                    out.push(self.entry(m, sender, d));
                }
                if let Some(mut d) = main {
                    d.reason += &spoof;
                    out.push(self.entry(m, sender, d));
                }
            }
        }
        out
    }

    /// The bounce message for a bounce entry.
    pub(super) fn bounce_message(e: &Entry) -> Message {
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
}
