//! The mediator's decision, row by row: each row is a state, an outbox
//! entry (with what the log says of it), a policy and the time, and the
//! decision expected of them, written as a line (see [`summary`]).
//!
//! Every row starts from the same state: sandboxes `api` (scope
//! `src/api/**`), `web` (`src/web/**`) and `db` (none), nothing held,
//! nothing remembered, the default log budget; its facts add to it.  A
//! policy is the default one when the row gives none.

use std::collections::VecDeque;
use std::time::Duration;

use super::decide::{Found, Logged, Outcome, Post, bounce_id, content_digest, decide, release};
use super::state::{Change, State};
use crate::layout::{HUMAN, MEDIATOR};
use crate::log::{Action, Decision, Entry};
use crate::message::{self, Kind, Message};
use crate::policy::Policy;
use crate::registry::Sandbox;

/// The clock every row decides at.
const NOW: Duration = Duration::from_secs(1_800_000_000);

/// What a row says of the state and of the entry, beside its sender,
/// kind and recipients.
#[derive(Clone, Copy)]
enum F {
    /// Another registered sandbox and its scope.
    Sandbox(&'static str, &'static [&'static str]),
    /// A proxy of another host's sandbox: host, name.
    Proxy(&'static str, &'static str),
    /// The message's refs.
    Refs(&'static [&'static str]),
    /// The message's body.
    Body(&'static str),
    /// It replies to a message of this sender ("": one the log does not know).
    ReplyTo(&'static str),
    /// The file's `from` said this.
    Claimed(&'static str),
    /// A secret the door knows: name, value.
    Secret(&'static str, &'static str),
    /// Messages of a sender in the held queue.
    Held(&'static str, u32),
    /// A sender was told about the held-queue cap in this episode.
    Capped(&'static str),
    /// A sender's admitted posts, so many seconds ago.
    Posted(&'static str, &'static [u64]),
    /// The same content was posted so many seconds ago.
    Seen(u64),
    /// What a sender's posts admitted into this batch can cost.
    Reserved(&'static str, u64),
    /// A sender's log budget is used up for this hour.
    Full(&'static str),
    /// `door.log-max`.
    LogMax(u64),
    /// An earlier run refused and counted the post, and did not claim it.
    Refusing,
    /// The log holds the message's main entry: action, recipients.
    Decided(Action, &'static [&'static str]),
    /// The log holds its bounce: recipients, quiet (a refusal).
    Bounced(&'static [&'static str], bool),
    /// The log holds the cap notice it triggered.
    Noticed,
    /// What the log holds was logged as this sender's.
    LoggedBy(&'static str),
    /// What the log holds records another message under the same id.
    LoggedOther,
    /// Its file is in the outbox's `cur/` too.
    InCur,
    /// Not a message but a bad file (why).
    Bad(&'static str),
    /// The bad file was left where it is for good.
    Left,
    /// Not posted: an operator releases it from the held queue (true: its
    /// bounce was logged already).
    Released(bool),
}
use F::*;

struct Row {
    name: &'static str,
    policy: &'static str,
    sender: &'static str,
    kind: Kind,
    to: &'static [&'static str],
    facts: &'static [F],
    expect: &'static str,
    /// Found in a reason of the decision ("": not checked).
    why: &'static str,
}

macro_rules! row {
    ($name:literal, $policy:literal, $sender:literal $kind:ident [$($to:literal),*],
     [$($f:expr),*], $expect:literal, $why:literal) => {
        Row {
            name: $name,
            policy: $policy,
            sender: $sender,
            kind: Kind::$kind,
            to: &[$($to),*],
            facts: &[$($f),*],
            expect: $expect,
            why: $why,
        }
    };
}

#[rustfmt::skip]
const ROWS: &[Row] = &[
    // Routes.
    row!("a request goes to its named recipient", "", "api" Request ["web"], [],
         "forward[web] +remember +rate(api)", "request to its named recipients (default policy)"),
    row!("an unknown recipient bounces, the others get it", "", "api" Request ["web", "ghost"], [],
         "bounce[ghost] forward[web] +remember +rate(api)", "cannot deliver to ghost: not a registered sandbox; a bounce went back to api"),
    row!("a message to nobody known only bounces", "", "api" Handoff ["ghost"], [],
         "bounce[ghost] +remember +rate(api)", "cannot deliver to ghost"),
    row!("a request to the mediator alone names nobody", "", "api" Request ["mediator"], [],
         "bounce[mediator] +remember +rate(api)", "names no recipient but the mediator"),
    row!("a status to the mediator alone is logged for nobody", "", "api" Status ["mediator"], [],
         "forward[] +remember +rate(api)", "addressed to the mediator only"),
    row!("a contract change goes where the scope overlaps its refs", "", "api" ContractChange [],
         [Refs(&["src/web/index.ts"]), Sandbox("docs", &["docs/**"])],
         "forward[db,web] +remember +rate(api)", "overlaps its refs or that declared none"),
    row!("a contract change without refs goes to every other sandbox", "", "api" ContractChange [],
         [Sandbox("docs", &["docs/**"])],
         "forward[db,docs,web] +remember +rate(api)", "without refs goes to every other sandbox"),
    row!("a contract change no scope overlaps is forwarded to nobody, logged", "", "api" ContractChange ["mediator"],
         [Refs(&["README.md"]), Sandbox("db", &["db/**"])],
         "forward[] +remember +rate(api)", "none does (README.md): logged, delivered to nobody"),
    row!("a contract change goes to its named recipients too", "", "api" ContractChange ["docs"],
         [Refs(&["src/web/index.ts"]), Sandbox("docs", &["docs/**"])],
         "forward[db,docs,web] +remember +rate(api)", ""),
    row!("an answer goes to whoever asked", "", "api" Answer [], [ReplyTo("web")],
         "forward[web] +remember +rate(api)", "answer goes to web, who sent"),
    row!("an answer to a person goes to the human queue", "", "api" Answer [], [ReplyTo("human")],
         "forward[human] +remember +rate(api)", "goes to human"),
    row!("an answer without in_reply_to bounces", "", "api" Answer ["web"], [],
         "bounce[web] +remember +rate(api)", "has no in_reply_to, so it has nobody to go to"),
    row!("an answer to a message the log does not know bounces", "", "api" Answer [], [ReplyTo("")],
         "bounce[mediator] +remember +rate(api)", "names no message in the log"),
    row!("a question goes to a person", "", "api" Question ["web"], [],
         "escalate[human] +remember +rate(api)", "kind question goes to a person (default policy)"),
    row!("a route to hold holds", "route status hold", "api" Status ["web"], [],
         "hold[] +remember +rate(api) +held(api)", "kind status is routed to hold (policy line 2)"),
    // Hold rules, in order.
    row!("a held sender is held", "hold sender api", "api" Request ["web"], [],
         "hold[] +held(api)", "sender api is held (policy line 2)"),
    row!("a held kind is held", "hold kind request", "api" Request ["web"], [],
         "hold[] +held(api)", "kind request is held (policy line 2)"),
    row!("an exact duplicate within the window is held", "", "api" Request ["web"], [Seen(30)],
         "hold[] +held(api)", "exact duplicate of a message api posted 30s ago (within 600s, default policy)"),
    row!("a repeat after the window is no duplicate", "", "api" Request ["web"], [Seen(700)],
         "forward[web] +remember +rate(api)", ""),
    row!("without the duplicates rule nothing is remembered", "duplicates off", "api" Request ["web"], [Seen(30)],
         "forward[web] +rate(api)", ""),
    row!("a sender over its rate is held", "rate 2/60s", "api" Request ["web"], [Posted("api", &[10, 20])],
         "hold[] +remember +held(api)", "sender api went over 2 messages in 60s (policy line 2)"),
    row!("posts older than the rate's window do not count", "rate 2/60s", "api" Request ["web"],
         [Posted("api", &[70, 20]), Posted("web", &[5, 6])],
         "forward[web] +remember +rate(api)", ""),
    row!("a message carrying a secret is held", "", "api" Request ["web"],
         [Secret("TOKEN", "tok-8f2a91c3"), Body("the key is tok-8f2a91c3")],
         "hold[] +held(api)", "contains secret TOKEN"),
    // The held queue's cap.
    row!("at the cap a post is refused and a person told", "hold kind request", "api" Request ["web"],
         [Held("api", 20)],
         "escalate[human]@mediator refused:bounce![web] +capped(api)", "sender api has 20 messages in the held queue, the most allowed (default policy)"),
    row!("a refusal in the same episode is not told again", "hold kind request", "api" Request ["web"],
         [Held("api", 20), Capped("api")], "refused:bounce![web]", "would have been held (kind request is held"),
    row!("below the cap a post is held", "hold kind request", "api" Request ["web"], [Held("api", 19)],
         "hold[] +held(api)", ""),
    row!("a person's posts are held beyond the cap", "hold kind request", "human" Request ["web"],
         [Held("human", 20)], "hold[] +held(human)", ""),
    row!("without a cap nothing is refused", "held-max off\nhold kind request", "api" Request ["web"],
         [Held("api", 500)], "hold[] +held(api)", ""),
    // Senders.
    row!("a from that is not the sender is noted and ignored", "", "api" Request ["web"], [Claimed("web")],
         "forward[web] +remember +rate(api)", "'from' in the file said 'web', ignored: the sender is the owner of the outbox"),
    row!("a qualified name reaches its proxy", "", "api" Request ["hostb/far"], [Proxy("hostb", "far")],
         "forward[far] +remember +rate(api)", ""),
    row!("another host's name for a proxy bounces", "", "api" Request ["hostc/far"], [Proxy("hostb", "far")],
         "bounce[hostc/far] +remember +rate(api)", "cannot deliver to hostc/far"),
    row!("a proxy's contract change does not come back to it", "", "hostb/far" ContractChange [],
         [Proxy("hostb", "far")], "forward[api,db,web] +remember +rate(hostb/far)", ""),
    // The log budget.
    row!("a post that fits what is left of the budget goes", "", "api" Request ["web"],
         [LogMax(16385), Reserved("api", 1)], "forward[web] +remember +rate(api)", ""),
    row!("a post that does not fit waits, and its sender is full", "", "api" Request ["web"],
         [LogMax(16384), Reserved("api", 1)], "wait +full(api)", ""),
    row!("a full sender's posts wait", "", "api" Request ["web"], [Full("api")], "wait", ""),
    row!("a person's posts are never budgeted", "", "human" Request ["web"],
         [LogMax(1), Reserved("human", 1 << 30)], "forward[web] +remember +rate(human)", ""),
    row!("another host's posts were budgeted there", "", "hostb/far" Request ["web"],
         [Proxy("hostb", "far"), Full("hostb/far")], "forward[web] +remember +rate(hostb/far)", ""),
    row!("a post refused and counted by an earlier run is only claimed", "", "api" Request ["web"],
         [Refusing], "claim", ""),
    // What the log knows.
    row!("a logged decision is carried out again", "", "api" Request ["web"], [Decided(Action::Forward, &["web"])],
         "resume forward[web]", ""),
    row!("a logged decision is carried out again with its bounce", "", "api" Request ["web", "ghost"],
         [Decided(Action::Forward, &["web"]), Bounced(&["ghost"], false)], "resume forward[web] bounce[ghost]", ""),
    row!("a logged hold is carried out again", "", "api" Request ["web"], [Decided(Action::Hold, &[])],
         "resume hold[]", ""),
    row!("a logged bounce stands and the rest is forwarded", "", "api" Request ["web", "ghost"],
         [Bounced(&["ghost"], false)], "forward[web] bounce[ghost] (resumed)", "request to its named recipients"),
    row!("a logged refusal stands with its notice", "", "api" Request ["web"], [Bounced(&["web"], true), Noticed],
         "bounce![web] escalate[human]@mediator (resumed)", ""),
    row!("an id another sender used is quarantined", "", "api" Request ["web"],
         [Decided(Action::Forward, &["web"]), LoggedBy("db")], "quarantine", "is already used by a message from db"),
    row!("an id used for other content is quarantined", "", "api" Request ["web"],
         [Decided(Action::Forward, &["web"]), LoggedOther], "quarantine", "already used by an earlier, different message"),
    row!("a message posted again after it was routed is quarantined", "", "api" Request ["web"],
         [Decided(Action::Forward, &["web"]), InCur], "quarantine", "posted again after"),
    row!("a proxy's decision logged under its bare name is its own", "", "hostb/far" Request ["web"],
         [Proxy("hostb", "far"), Decided(Action::Forward, &["web"]), LoggedBy("far")], "resume forward[web]", ""),
    // Files that are not messages.
    row!("a file that is not a message is quarantined", "", "api" Request [], [Bad("a FIFO (not opened)")],
         "quarantine", "a FIFO (not opened)"),
    row!("a directory left for good is skipped", "", "api" Request [], [Bad("a directory"), Left], "skip", ""),
    row!("a bad file of a full sender waits", "", "api" Request [], [Bad("a socket"), Full("api")], "wait", ""),
    row!("a bad file that does not fit makes its sender full", "", "api" Request [],
         [Bad("a socket"), LogMax(4096), Reserved("api", 1)], "wait +full(api)", ""),
    // An operator's release.
    row!("a release goes to the recipients named now", "", "api" Request ["web", "ghost"], [Released(false)],
         "bounce[ghost] release[web]", "released by an operator; request to its named recipients"),
    row!("a release does not bounce twice", "", "api" Request ["web", "ghost"], [Released(true)],
         "release[web]", ""),
    row!("a kind routed to hold is released to a person", "route status hold", "api" Status ["web"],
         [Released(false)], "release[human]", "goes to a person (policy line 2)"),
    row!("a release with nobody left to go to", "", "api" Request ["ghost"], [Released(false)],
         "bounce[ghost] release[]", "released by an operator; no recipient is left"),
];

/// The base state with the row's facts.
fn state_of(row: &Row, m: &Message) -> State {
    let mut s = State::default();
    let now_ms = NOW.as_millis() as u64;
    let mut add = |name: &str, scope: &[&str], host: Option<&str>| {
        let mut sb = Sandbox::new(name, None, scope.iter().map(|x| x.to_string()).collect());
        sb.host = host.map(str::to_string);
        s.known.insert(name.to_string(), sb);
    };
    add("api", &["src/api/**"], None);
    add("web", &["src/web/**"], None);
    add("db", &[], None);
    for f in row.facts {
        match *f {
            Sandbox(name, scope) => add(name, scope, None),
            Proxy(host, name) => add(name, &[], Some(host)),
            _ => {}
        }
    }
    for f in row.facts {
        match *f {
            Secret(name, value) => assert!(s.secrets.add(name, value.as_bytes()).is_none()),
            Held(who, n) => drop(s.held_count.insert(who.into(), n)),
            Capped(who) => drop(s.memory.capped.insert(who.into())),
            Posted(who, ago) => {
                let mut times: Vec<u64> = ago.iter().map(|a| now_ms - a * 1000).collect();
                times.sort();
                s.memory.rate.insert(who.into(), VecDeque::from(times));
            }
            Seen(ago) => s
                .memory
                .remember(&content_digest(m), now_ms - ago * 1000, u64::MAX),
            Reserved(who, n) => drop(s.reserved.insert(who.into(), n)),
            Full(who) => s.mark_full(who, now_ms),
            LogMax(n) => s.log_max = n,
            Refusing => s.memory.refusing.push(m.id.clone()),
            Left => s.memory.leave("QID"),
            _ => {}
        }
    }
    s
}

/// The row's message, as its sender's outbox holds it.
fn message_of(row: &Row) -> Message {
    let mut m = Message {
        version: message::VERSION,
        id: base::id::id_at(NOW - Duration::from_secs(5), 0x5eed),
        from: row.sender.into(),
        to: row.to.iter().map(|t| t.to_string()).collect(),
        kind: row.kind,
        subject: "the subject".into(),
        body: "the body\n".into(),
        refs: vec![],
        in_reply_to: None,
        created: base::time::rfc3339(NOW - Duration::from_secs(5)),
    };
    for f in row.facts {
        match *f {
            Refs(r) => m.refs = r.iter().map(|x| x.to_string()).collect(),
            Body(b) => m.body = b.into(),
            ReplyTo(_) => {
                m.in_reply_to = Some(base::id::id_at(NOW - Duration::from_secs(60), 0xa5))
            }
            _ => {}
        }
    }
    m
}

/// What the log says of the row's message.
fn logged_of(row: &Row, s: &State, m: &Message) -> Logged {
    let t = NOW - Duration::from_secs(1);
    let mut by = row.sender;
    let mut logged = m.clone();
    for f in row.facts {
        match *f {
            LoggedBy(who) => by = who,
            LoggedOther => logged.body = "another body\n".into(),
            _ => {}
        }
    }
    let entry = |action: Action, to: &[&str], quiet: bool| {
        let d = Decision {
            quiet,
            action,
            to: to.iter().map(|x| x.to_string()).collect(),
            reason: "decided earlier".into(),
        };
        s.entry(&logged, by, d, t)
    };
    let mut l = Logged::default();
    for f in row.facts {
        match *f {
            Decided(a, to) => l.main = Some(entry(a, to, false)),
            Bounced(to, quiet) => l.bounce = Some(entry(Action::Bounce, to, quiet)),
            Noticed => {
                let mut n = entry(Action::Escalate, &[HUMAN], false);
                n.sender = MEDIATOR.into();
                l.notice = Some(n);
            }
            _ => {}
        }
    }
    l
}

/// The row's outbox entry.
fn found_of(row: &Row, s: &State, m: Message) -> Found {
    let mut claimed = row.sender.to_string();
    let mut asker = None;
    let mut in_cur = false;
    for f in row.facts {
        match *f {
            Bad(why) => {
                return Found::Bad {
                    sender: row.sender.into(),
                    qid: "QID".into(),
                    why: why.into(),
                };
            }
            Claimed(c) => claimed = c.into(),
            ReplyTo(a) if !a.is_empty() => asker = Some(a.to_string()),
            InCur => in_cur = true,
            _ => {}
        }
    }
    Found::Message(Box::new(Post {
        logged: logged_of(row, s, &m),
        message: m,
        sender: row.sender.into(),
        claimed,
        in_cur,
        asker,
    }))
}

/// An entry as a row writes it: `ACTION[TO,...]`, `!` when quiet,
/// `@mediator` when the mediator is its sender.
fn entry_line(e: &Entry) -> String {
    let quiet = if e.decision.quiet { "!" } else { "" };
    let by = if e.sender == MEDIATOR {
        "@mediator"
    } else {
        ""
    };
    let (action, to) = (e.decision.action.as_str(), e.decision.to.join(","));
    format!("{action}{quiet}[{to}]{by}")
}

/// A decision as a row writes it: the outcome, its entries, then what it
/// changes (`+remember`, `+rate(S)`, `+held(S)`, `+capped(S)`, `+full(S)`).
fn summary(outcome: &Outcome, changes: &[Change]) -> String {
    let lines = |es: &[Entry]| es.iter().map(entry_line).collect::<Vec<_>>();
    let mut parts: Vec<String> = match outcome {
        Outcome::Skip => vec!["skip".into()],
        Outcome::Wait => vec!["wait".into()],
        Outcome::Quarantine(_) => vec!["quarantine".into()],
        Outcome::Claim => vec!["claim".into()],
        Outcome::Resume(es) => [vec!["resume".into()], lines(es)].concat(),
        Outcome::Route {
            entries,
            refused,
            resumed,
        } => {
            let mut p = lines(entries);
            p.extend(refused.iter().map(|e| format!("refused:{}", entry_line(e))));
            p.extend(resumed.then(|| "(resumed)".to_string()));
            p
        }
    };
    parts.extend(changes.iter().map(|c| match c {
        Change::Remember { .. } => "+remember".to_string(),
        Change::Rate { sender, .. } => format!("+rate({sender})"),
        Change::Held(s) => format!("+held({s})"),
        Change::Capped(s) => format!("+capped({s})"),
        Change::Full(s) => format!("+full({s})"),
    }));
    parts.join(" ")
}

/// Every reason a decision gives.
fn reasons(outcome: &Outcome) -> Vec<String> {
    let of = |es: &[Entry]| {
        es.iter()
            .map(|e| e.decision.reason.clone())
            .collect::<Vec<_>>()
    };
    match outcome {
        Outcome::Quarantine(why) => vec![why.clone()],
        Outcome::Resume(es) => of(es),
        Outcome::Route {
            entries, refused, ..
        } => [
            of(entries),
            refused.iter().map(|e| e.decision.reason.clone()).collect(),
        ]
        .concat(),
        _ => vec![],
    }
}

/// Decides one row: its summary and its reasons.
fn run(row: &Row) -> (String, Vec<String>) {
    let policy = match row.policy {
        "" => Policy::default(),
        text => Policy::parse(&format!("loopwright-policy 1\n{text}\n"), None)
            .unwrap_or_else(|e| panic!("{}: policy: {e:?}", row.name)),
    };
    let m = message_of(row);
    let s = state_of(row, &m);
    if let Some(had_bounce) = row.facts.iter().find_map(|f| match f {
        Released(b) => Some(*b),
        _ => None,
    }) {
        let es = release(&s, &policy, &m, None, had_bounce, NOW);
        let why = es.iter().map(|e| e.decision.reason.clone()).collect();
        let outcome = Outcome::Route {
            entries: es,
            refused: None,
            resumed: false,
        };
        let line = summary(&outcome, &[]);
        return (line.replace(" (resumed)", ""), why);
    }
    let found = found_of(row, &s, m);
    let v = decide(&s, &found, &policy, NOW);
    (summary(&v.outcome, &v.changes), reasons(&v.outcome))
}

#[test]
fn every_policy_path_decides_as_its_row_says() {
    let mut failed = Vec::new();
    for row in ROWS {
        let (got, why) = run(row);
        if got != row.expect {
            failed.push(format!(
                "{}:\n    expected {}\n    got      {got}\n    reasons  {why:?}",
                row.name, row.expect
            ));
        } else if !row.why.is_empty() && !why.iter().any(|w| w.contains(row.why)) {
            failed.push(format!(
                "{}: no reason says {:?}: {why:?}",
                row.name, row.why
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} rows:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert!(ROWS.len() >= 25);
}

#[test]
fn a_decision_is_the_same_however_often_it_is_taken() {
    // Pure: the state is not touched, so the same row decides the same.
    for row in ROWS {
        assert_eq!(run(row), run(row), "{}", row.name);
    }
}

#[test]
fn applying_a_decision_makes_the_next_one_see_it() {
    let policy = Policy::parse("loopwright-policy 1\nrate 1/60s\n", None).unwrap();
    let row = &ROWS[0];
    let m = message_of(row);
    let mut s = state_of(row, &m);
    let found = found_of(row, &s, m.clone());
    let first = decide(&s, &found, &policy, NOW);
    assert_eq!(summary(&first.outcome, &first.changes), row.expect);
    s.apply(&first.changes, NOW);
    // The same content a second later: a duplicate now.
    let later = NOW + Duration::from_secs(1);
    let again = decide(&s, &found, &policy, later);
    assert_eq!(summary(&again.outcome, &again.changes), "hold[] +held(api)");
    s.apply(&again.changes, later);
    assert_eq!(s.held_count["api"], 1);
    // Other content from the same sender: over its rate of one a minute.
    let mut other = m;
    other.body = "something else\n".into();
    let found = found_of(row, &s, other);
    let third = decide(&s, &found, &policy, later);
    assert_eq!(
        summary(&third.outcome, &third.changes),
        "hold[] +remember +held(api)"
    );
}

#[test]
fn derived_ids_are_valid_and_stable() {
    let id = base::id::new_id();
    assert_eq!(bounce_id(&id), bounce_id(&id));
    assert!(base::id::is_valid(&bounce_id(&id)));
    assert_ne!(bounce_id(&id), id);
}
