//! Deciding: what the policy makes of one outbox entry from one sender
//! (forward, escalate, hold, refuse, bounce, wait for the log budget,
//! quarantine, carry out an earlier decision), as a pure function of the
//! mediator's [`State`], the entry with what the log says of its id, the
//! policy and the time.  Nothing here reads the disk, the log or the
//! clock, and nothing changes the state: what a decision changes comes
//! back in it, for the caller to apply ([`State::apply`]) once it took it.
//! deliver.rs reads what [`Found`] needs, calls [`decide`] and carries the
//! [`Verdict`] out.

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::rules::QUARANTINE_COST;
use super::state::{Change, State, mailbox_name};
use crate::layout;
use crate::log::{Action, Decision, Entry};
use crate::message::{Kind, Message};
use crate::policy::{self, Policy, Route};
use base::digest::hex;

/// An outbox entry as the caller found it.
pub(in crate::mediate) enum Found {
    /// A message.
    Message(Box<Post>),
    /// A file that is not a message (inspect.rs): its sender (qualified),
    /// its quarantine id, and why it is not a message.
    Bad {
        sender: String,
        qid: String,
        why: String,
    },
}

/// A message taken from an outbox, with what the log says of it.
pub(in crate::mediate) struct Post {
    /// The message, its `from` already its sender.
    pub(in crate::mediate) message: Message,
    /// The owner of the outbox (qualified: `HOST/NAME` for a proxy).
    pub(in crate::mediate) sender: String,
    /// What `from` said in the file.
    pub(in crate::mediate) claimed: String,
    /// The decision the log holds for its id.
    pub(in crate::mediate) logged: Logged,
    /// Its file is in the outbox's `cur/` too: it was routed, and posted again.
    pub(in crate::mediate) in_cur: bool,
    /// Who sent the message its `in_reply_to` names, by the log (looked up
    /// for a kind routed to the asker).
    pub(in crate::mediate) asker: Option<String>,
}

/// The entries the log holds for a message's id.
#[derive(Clone, Default)]
pub(in crate::mediate) struct Logged {
    /// Its forward, escalation or hold.
    pub(in crate::mediate) main: Option<Entry>,
    /// Its bounce.
    pub(in crate::mediate) bounce: Option<Entry>,
    /// The held-queue cap notice it triggered.
    pub(in crate::mediate) notice: Option<Entry>,
}

/// What to do with an outbox entry.
#[derive(Debug)]
pub(in crate::mediate) enum Outcome {
    /// Nothing: a planted directory that was left for good.
    Skip,
    /// Nothing yet: the sender's log budget is used up; it stays in the outbox.
    Wait,
    /// Log a quarantine entry with this reason, and move the file there.
    Quarantine(String),
    /// Claim it, logging nothing: refused and counted by an earlier run.
    Claim,
    /// Carry out the decision an earlier run logged (these entries).
    Resume(Vec<Entry>),
    /// Log these entries and carry them out; `refused` is a refusal,
    /// counted instead of logged (budget.rs); `resumed`: an earlier run
    /// logged the bounce among them.
    Route {
        entries: Vec<Entry>,
        refused: Option<Box<Entry>>,
        resumed: bool,
    },
}

/// A decision: what to do, and what it changes in the state.
#[derive(Debug)]
pub(in crate::mediate) struct Verdict {
    pub(in crate::mediate) outcome: Outcome,
    pub(in crate::mediate) changes: Vec<Change>,
}

/// Decides on an outbox entry (see the module docs).
pub(in crate::mediate) fn decide(
    state: &State,
    found: &Found,
    policy: &Policy,
    now: Duration,
) -> Verdict {
    let mut changes = Vec::new();
    let outcome = match found {
        Found::Bad { sender, qid, why } => {
            if state.memory.is_left(qid) {
                Outcome::Skip
            } else if !admit(state, sender, QUARANTINE_COST, now, &mut changes) {
                Outcome::Wait
            } else {
                Outcome::Quarantine(why.clone())
            }
        }
        Found::Message(p) => decide_post(state, p, policy, now, &mut changes),
    };
    Verdict { outcome, changes }
}

/// Whether `sender` can afford a post that costs at most `most`; when it
/// cannot, its budget is used up for the hour.
fn admit(state: &State, sender: &str, most: u64, now: Duration, changes: &mut Vec<Change>) -> bool {
    if state.fits(sender, most, now) {
        return true;
    }
    if !state.is_full(sender, now) {
        changes.push(Change::Full(sender.to_string()));
    }
    false
}

fn decide_post(
    state: &State,
    p: &Post,
    policy: &Policy,
    now: Duration,
    changes: &mut Vec<Change>,
) -> Outcome {
    let m = &p.message;
    let Logged { main, bounce, .. } = &p.logged;
    if let Some(why) = main
        .as_ref()
        .or(bounce.as_ref())
        .and_then(|e| clash(state, e, p))
    {
        return Outcome::Quarantine(why);
    }
    match (main, bounce) {
        (Some(a), b) => Outcome::Resume(std::iter::once(a.clone()).chain(b.clone()).collect()),
        (None, None) if state.memory.was_refused(&m.id) => Outcome::Claim,
        (None, None) if !admit(state, &p.sender, state.most_cost(policy, m), now, changes) => {
            Outcome::Wait
        }
        (None, Some(b)) => Outcome::Route {
            entries: decide_again(state, p, b, policy, now),
            refused: None,
            resumed: true,
        },
        (None, None) => {
            let mut entries = decide_new(state, p, policy, now, changes);
            let refused = entries
                .iter()
                .position(|e| e.decision.quiet)
                .map(|i| Box::new(entries.remove(i)));
            Outcome::Route {
                entries,
                refused,
                resumed: false,
            }
        }
    }
}

/// Why a message cannot be routed although the log knows its id: another
/// sender's, different content, or posted again after it was routed.
fn clash(state: &State, logged: &Entry, p: &Post) -> Option<String> {
    let id = &p.message.id;
    // A proxy's message logged before senders were qualified has its bare name.
    if logged.sender != p.sender && logged.sender != mailbox_name(&p.sender) {
        Some(format!(
            "id {id} is already used by a message from {}",
            logged.sender
        ))
    } else if !state.records(logged, &p.message) {
        Some(format!(
            "id {id} is already used by an earlier, different message"
        ))
    } else if p.in_cur {
        Some(format!("posted again after {id} was routed"))
    } else {
        None
    }
}

/// A derived id: the time part of `base` (or `t`), 128 bits of a digest.
pub(in crate::mediate) fn derived_id(t: Duration, parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    let d = h.finalize();
    let mut r = [0u8; 16];
    r.copy_from_slice(&d[..16]);
    base::id::id_at(t, u128::from_be_bytes(r))
}

/// The id of the status message sent when post `id` found its sender at
/// the held-queue cap.
pub fn cap_notice_id(id: &str) -> String {
    derived_id(
        base::id::time_of(id).unwrap_or_default(),
        &[b"held-cap", id.as_bytes()],
    )
}

/// The id of the bounce sent back for message `id`.
pub fn bounce_id(id: &str) -> String {
    derived_id(
        base::id::time_of(id).unwrap_or_default(),
        &[b"bounce", id.as_bytes()],
    )
}

/// The digest that makes two messages "exact duplicates": everything a
/// reader sees except the id and the creation time.
pub(in crate::mediate) fn content_digest(m: &Message) -> String {
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

/// Where a message goes by its kind's route, ignoring hold rules: the
/// main decision (None when every recipient bounced), the recipients that
/// bounce, and why.
pub(in crate::mediate) struct Routing {
    pub(in crate::mediate) main: Option<Decision>,
    pub(in crate::mediate) unknown: Vec<String>,
    pub(in crate::mediate) why: String,
}

/// What a route rule made of a message: a finished answer, or the targets
/// to check against the registry (targets, why, why the unknown ones bounce).
enum Routed {
    Done(Routing),
    Targets(Vec<String>, String, String),
}

fn done(main: Option<Decision>, unknown: Vec<String>, why: String) -> Routed {
    Routed::Done(Routing { main, unknown, why })
}

/// Routes a message by its kind (`release`: an operator released it from
/// the held queue).  Its `from` is its sender; `asker` is who sent the
/// message it replies to.
pub(in crate::mediate) fn route(
    state: &State,
    policy: &Policy,
    m: &Message,
    asker: Option<&str>,
    release: bool,
) -> Routing {
    let rule = policy.route(m.kind);
    let at = policy.at(rule.line);
    let named: Vec<String> =
        m.to.iter()
            .filter(|t| *t != layout::MEDIATOR)
            .map(|t| state.resolve(t))
            .collect();
    let routed = match rule.value {
        Route::Hold if !release => {
            let hold = Decision {
                quiet: false,
                action: Action::Hold,
                to: vec![],
                reason: format!("kind {} is routed to hold ({at})", m.kind),
            };
            done(Some(hold), vec![], String::new())
        }
        Route::Human | Route::Hold => done(Some(to_person(m, release, &at)), vec![], String::new()),
        Route::Named => route_named(m, &named, &at),
        Route::Scope => route_scope(state, m, &named, &at),
        Route::Asker => route_asker(state, m, asker, &named, &at),
    };
    let (mut targets, why, bounce_why) = match routed {
        Routed::Done(r) => return r,
        Routed::Targets(t, why, bounce_why) => (t, why, bounce_why),
    };
    targets.sort();
    targets.dedup();
    let (known, unknown): (Vec<String>, Vec<String>) = targets
        .into_iter()
        .partition(|t| t == layout::HUMAN || state.known.contains_key(t));
    // None only when every recipient bounced: a route that found nobody
    // (no scope overlaps the refs, a status to the mediator alone) is still
    // a decision, a forward to nobody, so that no claimed message goes
    // unlogged.
    let main = if known.is_empty() && !unknown.is_empty() {
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
    Routing {
        main,
        unknown,
        why: bounce_why,
    }
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
        return done(
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

/// Route `scope`: every other sandbox whose scope overlaps the refs (or
/// that declared none), and the named recipients.
fn route_scope(state: &State, m: &Message, named: &[String], at: &str) -> Routed {
    let own = mailbox_name(&m.from);
    let mut t: Vec<String> = state
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
    let mut why = if m.refs.is_empty() {
        format!("{} without refs goes to every other sandbox ({at})", m.kind)
    } else {
        format!(
            "{} goes to sandboxes whose scope overlaps its refs or that declared none ({at})",
            m.kind
        )
    };
    if t.is_empty() {
        why += &if m.refs.is_empty() {
            "; there is none: logged, delivered to nobody".to_string()
        } else {
            format!(
                "; none does ({}): logged, delivered to nobody",
                refs_list(&m.refs)
            )
        };
    }
    Routed::Targets(t, why, "not a registered sandbox".into())
}

/// The refs for a reason: the first few, and how many more.
fn refs_list(refs: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut s = refs
        .iter()
        .take(SHOWN)
        .map(|r| r.escape_debug().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if refs.len() > SHOWN {
        s += &format!(" and {} more", refs.len() - SHOWN);
    }
    s
}

/// The id of the receipt sent back for message `id` when it was forwarded
/// to nobody.
pub fn nobody_id(id: &str) -> String {
    derived_id(
        base::id::time_of(id).unwrap_or_default(),
        &[b"nobody", id.as_bytes()],
    )
}

/// Route `asker`: whoever sent the message this one replies to, and the
/// named recipients.
fn route_asker(
    state: &State,
    m: &Message,
    asker: Option<&str>,
    named: &[String],
    at: &str,
) -> Routed {
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
        return done(None, to.collect(), why);
    };
    match asker {
        Some(asker) => {
            let mut t = vec![state.resolve(asker)];
            t.extend(named.iter().cloned());
            let why = format!("{} goes to {asker}, who sent {q} ({at})", m.kind);
            Routed::Targets(t, why, "not a registered sandbox".into())
        }
        None => done(
            None,
            vec![layout::MEDIATOR.to_string()],
            format!("in_reply_to {q} names no message in the log ({at})"),
        ),
    }
}

/// The hold rules, in order: sender, kind, duplicate, rate.  What they
/// remember of the message (its digest, its time against the rate) goes
/// into `changes`.
fn hold_reason(
    state: &State,
    p: &Post,
    policy: &Policy,
    now: Duration,
    changes: &mut Vec<Change>,
) -> Option<String> {
    let (m, sender) = (&p.message, p.sender.as_str());
    if let Some(r) = policy.hold_senders.iter().find(|r| r.value == sender) {
        return Some(format!("sender {sender} is held ({})", policy.at(r.line)));
    }
    if let Some(r) = policy.hold_kinds.iter().find(|r| r.value == m.kind) {
        return Some(format!("kind {} is held ({})", m.kind, policy.at(r.line)));
    }
    let now = now.as_millis() as u64;
    if let Some(d) = &policy.duplicates {
        let window = d.value.as_millis() as u64;
        let digest = content_digest(m);
        if let Some(t) = state.memory.dup_time(&digest, now, window) {
            let ago = now.saturating_sub(t) / 1000;
            return Some(format!(
                "exact duplicate of a message {sender} posted {ago}s ago (within {}s, {})",
                d.value.as_secs(),
                policy.at(d.line)
            ));
        }
        changes.push(Change::Remember { digest, window });
    }
    if let Some(r) = &policy.rate {
        let window = r.value.window.as_millis() as u64;
        if state.memory.rate_count(sender, now, window) >= r.value.count as usize {
            return Some(format!(
                "sender {sender} went over {} messages in {}s ({})",
                r.value.count,
                r.value.window.as_secs(),
                policy.at(r.line)
            ));
        }
        let sender = sender.to_string();
        changes.push(Change::Rate { sender, window });
    }
    None
}

/// Holds a message, or refuses it when its sender is at the cap of the
/// held queue: a quiet bounce, and the first time in an episode, one
/// status message to a person.
fn hold_or_refuse(
    state: &State,
    p: &Post,
    reason: String,
    policy: &Policy,
    now: Duration,
    changes: &mut Vec<Change>,
) -> Vec<Entry> {
    let (m, sender) = (&p.message, p.sender.as_str());
    let n = state.held_count.get(sender).copied().unwrap_or(0);
    match &policy.held_max {
        Some(cap) if sender != layout::HUMAN && n >= cap.value => {
            let at = policy.at(cap.line);
            let d = Decision {
                quiet: true,
                action: Action::Bounce,
                to: m.to.clone(),
                reason: format!(
                    "sender {sender} has {n} messages in the held queue, the most allowed ({at}); this one would have been held ({reason}), so it bounced instead; an operator releases or drops held messages with lw-mediate release or drop"
                ),
            };
            let mut out = vec![state.entry(m, sender, d, now)];
            if !state.memory.capped.contains(sender) {
                changes.push(Change::Capped(sender.to_string()));
                out.push(cap_notice(m, sender, n, &at, now));
            }
            out
        }
        _ => {
            changes.push(Change::Held(sender.to_string()));
            let d = Decision {
                quiet: false,
                action: Action::Hold,
                to: vec![],
                reason,
            };
            vec![state.entry(m, sender, d, now)]
        }
    }
}

/// The status message that tells a person a sender reached the cap,
/// logged as an escalation from the mediator; its id derives from the
/// post that found the cap, so a restart writes the same one.
fn cap_notice(trigger: &Message, sender: &str, n: u32, at: &str, now: Duration) -> Entry {
    let id = cap_notice_id(&trigger.id);
    let mut e = crate::log::Notice {
        id,
        to: vec![layout::HUMAN.into()],
        subject: format!("{sender} reached the cap of {n} held messages; its further posts bounce"),
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
        at: now,
        reason: format!("sender {sender} reached the held-queue cap ({at}); said once per episode"),
    }
    .entry();
    e.logged = base::time::rfc3339(now);
    e
}

/// `; 'from' ... ignored` when the file's `from` was not the sender.
fn spoof_note(p: &Post) -> String {
    if p.claimed != p.sender {
        format!(
            "; 'from' in the file said '{}', ignored: the sender is the owner of the outbox",
            p.claimed.escape_debug()
        )
    } else {
        String::new()
    }
}

/// A new decision for a message nobody decided on yet.
fn decide_new(
    state: &State,
    p: &Post,
    policy: &Policy,
    now: Duration,
    changes: &mut Vec<Change>,
) -> Vec<Entry> {
    let (m, sender) = (&p.message, p.sender.as_str());
    let spoof = spoof_note(p);
    let why = match state.secret_in(m) {
        Some(name) => Some(format!("contains secret {name}")),
        None => hold_reason(state, p, policy, now, changes),
    };
    if let Some(reason) = why {
        return hold_or_refuse(state, p, reason + &spoof, policy, now, changes);
    }
    let r = route(state, policy, m, p.asker.as_deref(), false);
    if let Some(d) = &r.main
        && d.action == Action::Hold
    {
        return hold_or_refuse(state, p, d.reason.clone() + &spoof, policy, now, changes);
    }
    let mut out = Vec::new();
    if !r.unknown.is_empty() {
        let d = Decision {
            quiet: false,
            action: Action::Bounce,
            to: r.unknown.clone(),
            reason: format!(
                "cannot deliver to {}: {}; a bounce went back to {sender}{spoof}",
                r.unknown.join(", "),
                r.why
            ),
        };
        out.push(state.entry(m, sender, d, now));
    }
    if let Some(mut d) = r.main {
        d.reason += &spoof;
        out.push(state.entry(m, sender, d, now));
    }
    out
}

/// The decision for a message whose bounce an earlier run logged (and
/// whose main entry it did not): the bounce stands, and the message goes
/// to the rest of its recipients.  A refusal stands with its notice.
fn decide_again(state: &State, p: &Post, b: &Entry, policy: &Policy, now: Duration) -> Vec<Entry> {
    if b.decision.quiet {
        return std::iter::once(b.clone())
            .chain(p.logged.notice.clone())
            .collect();
    }
    let (m, sender) = (&p.message, p.sender.as_str());
    let mut out = Vec::new();
    if let Some(mut d) = route(state, policy, m, p.asker.as_deref(), false).main {
        d.to.retain(|t| !b.decision.to.contains(t));
        if !d.to.is_empty() {
            out.push(state.entry(m, sender, d, now));
        }
    }
    out.push(b.clone());
    out
}

/// New entries releasing held message `m` to the recipients its route
/// names now: a bounce for the unknown ones (unless `had_bounce`: one was
/// logged), then the release.
pub(in crate::mediate) fn release(
    state: &State,
    policy: &Policy,
    m: &Message,
    asker: Option<&str>,
    had_bounce: bool,
    now: Duration,
) -> Vec<Entry> {
    let sender = m.from.as_str();
    let mut entries = Vec::new();
    let r = route(state, policy, m, asker, true);
    if !r.unknown.is_empty() && !had_bounce {
        let d = Decision {
            quiet: false,
            action: Action::Bounce,
            to: r.unknown.clone(),
            reason: format!(
                "released, but cannot deliver to {}: {}; a bounce went back to {sender}",
                r.unknown.join(", "),
                r.why
            ),
        };
        entries.push(state.entry(m, sender, d, now));
    }
    let mut d = r.main.unwrap_or(Decision {
        quiet: false,
        action: Action::Release,
        to: vec![],
        reason: String::new(),
    });
    d.action = Action::Release;
    d.reason = format!(
        "released by an operator; {}",
        if d.reason.is_empty() {
            "no recipient is left".into()
        } else {
            d.reason
        }
    );
    entries.push(state.entry(m, sender, d, now));
    entries
}
