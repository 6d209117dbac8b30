//! Issue 48, "every message is logged": a walk through each route of the
//! policy (scope, named, human, asker, hold, the hold rules, the held-queue
//! cap) and each way a route can find nobody, counting the messages the
//! mediator claimed (moved to an outbox's `cur/`) against the decisions the
//! log holds for them.  The storm (mediate_storm.rs) counts the same under
//! SIGKILL.

use support::mediate_util;

use std::collections::{HashMap, HashSet};

use mailbox::log::Action;
use mailbox::maildir::{Found, Maildir, Sub};
use mailbox::message::{Kind, Message};
use mailbox::registry::{Registry, Sandbox};
use mediate_util::*;

/// Claimed messages against logged decisions, for a root.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Audit {
    /// Messages in the `cur/` of every outbox.
    pub claimed: usize,
    /// Those with an entry of their own (forward, escalate, hold, bounce).
    pub decided: usize,
    /// Posts counted in the log's counts of refusals (`AID.bounce`).
    pub refused: usize,
    /// Claimed ids with no entry, when they outnumber the refusals.
    pub unlogged: Vec<String>,
}

/// Reads every outbox's `cur/` and the log: each claimed message must have
/// a decision of its own, or be one of the refusals the log counts.
pub(crate) fn audit(root: &mailbox::layout::Root) -> Audit {
    let mut outboxes = vec![root.human_outbox(), root.mediator_outbox()];
    if let Ok(rd) = std::fs::read_dir(root.sandboxes_dir()) {
        for e in rd.flatten() {
            outboxes.push(Maildir::new(e.path().join("outbox")));
        }
    }
    let mut claimed = Vec::new();
    for ob in outboxes {
        for e in ob.scan(Sub::Cur).unwrap_or_default() {
            if let Found::Message(m) = e.found {
                claimed.push(m.id);
            }
        }
    }
    let mut decided_ids: HashSet<String> = HashSet::new();
    let mut refused = 0;
    let claimed_set: HashSet<&String> = claimed.iter().collect();
    for e in entries(root) {
        let counts = e
            .message
            .as_ref()
            .filter(|_| e.decision.action == Action::Bounce)
            .filter(|_| !claimed_set.contains(&e.message_id))
            .and_then(|m| m.subject.strip_suffix(" posts refused"))
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(n) = counts {
            refused += n;
            continue;
        }
        if matches!(
            e.decision.action,
            Action::Forward | Action::Escalate | Action::Hold | Action::Bounce
        ) {
            decided_ids.insert(e.message_id);
        }
    }
    let unlogged: Vec<String> = claimed
        .iter()
        .filter(|id| !decided_ids.contains(*id))
        .cloned()
        .collect();
    let decided = claimed.len() - unlogged.len();
    Audit {
        claimed: claimed.len(),
        decided,
        refused,
        unlogged: if unlogged.len() > refused {
            unlogged
        } else {
            vec![]
        },
    }
}

fn register(root: &mailbox::layout::Root, name: &str, scope: &[&str]) {
    let scope = scope.iter().map(|s| s.to_string()).collect();
    Registry::new(root)
        .register(&Sandbox::new(name, None, scope))
        .unwrap();
}

fn msg(from: &str, to: &[&str], kind: Kind, subject: &str, refs: &[&str]) -> Message {
    let mut m = message(from, to, kind, subject);
    m.refs = refs.iter().map(|r| r.to_string()).collect();
    m
}

const POLICY: &str = "loopwright-policy 1\nrate off\nduplicates 10m\nheld-max 2\n\
                      hold sender dd\nroute conflict-cleared hold\n";

#[test]
fn every_claimed_message_has_a_logged_decision_on_every_route() {
    let root = root_with("logged", &[]);
    register(&root, "aa", &["*.js"]);
    register(&root, "bb", &["docs/**"]);
    register(&root, "dd", &["ops/**"]);
    let mut posted: Vec<(&str, Message)> = Vec::new();
    let mut p = |who: &'static str, m: Message| {
        post(&root, who, &m);
        posted.push((who, m.clone()));
        m
    };
    // Route scope: to nobody (the issue's case), to one, to every other.
    let nobody = p(
        "aa",
        msg(
            "aa",
            &["mediator"],
            Kind::ContractChange,
            "x",
            &["index.js"],
        ),
    );
    p(
        "aa",
        msg(
            "aa",
            &["mediator"],
            Kind::ContractChange,
            "d",
            &["docs/a.md"],
        ),
    );
    p(
        "aa",
        msg("aa", &["mediator"], Kind::ContractChange, "all", &[]),
    );
    p(
        "aa",
        msg("aa", &["ghost"], Kind::ContractChange, "g", &["index.js"]),
    );
    // Route named: one, the mediator alone, an unknown one beside a known.
    let req = p("bb", msg("bb", &["aa"], Kind::Request, "r", &[]));
    p("bb", msg("bb", &["mediator"], Kind::Request, "m", &[]));
    p("bb", msg("bb", &["ghost", "aa"], Kind::Request, "ga", &[]));
    p("bb", msg("bb", &["mediator"], Kind::Status, "note", &[]));
    // Route human, route asker (answered, no in_reply_to, an unknown one).
    p("aa", msg("aa", &["mediator"], Kind::Question, "q", &[]));
    let mut a = msg("aa", &["mediator"], Kind::Answer, "a", &[]);
    a.in_reply_to = Some(req.id.clone());
    p("aa", a);
    p("aa", msg("aa", &["mediator"], Kind::Answer, "a0", &[]));
    let mut a = msg("aa", &["mediator"], Kind::Answer, "a?", &[]);
    a.in_reply_to = Some(base::id::new_id());
    p("aa", a);
    // The hold rules: a duplicate, a held sender up to the cap, and past it.
    let h = msg("bb", &["aa"], Kind::Handoff, "h", &[]);
    let mut h2 = h.clone();
    h2.id = base::id::new_id();
    p("bb", h);
    p("bb", h2);
    for i in 0..4 {
        p(
            "dd",
            msg("dd", &["aa"], Kind::Request, &format!("d{i}"), &[]),
        );
    }
    // The mediator's own: a conflict (named), a conflict-cleared (held).
    for (kind, s) in [(Kind::Conflict, "c"), (Kind::ConflictCleared, "cc")] {
        let m = msg("mediator", &["aa", "bb"], kind, s, &[]);
        root.mediator_outbox().deliver_message(&m).unwrap();
    }
    once(&root, POLICY);
    // A second pass: the same id again (quarantined, not claimed), and
    // scope to nobody once more, from another sender.
    post(&root, "bb", &req);
    post(
        &root,
        "bb",
        &msg(
            "bb",
            &["mediator"],
            Kind::ContractChange,
            "y",
            &["src/x.rs"],
        ),
    );
    once(&root, POLICY);

    let a = audit(&root);
    println!("every route: {a:?}");
    // The sandboxes' posts, the mediator's two and the second pass's new
    // one (the repost is quarantined, not claimed).
    assert_eq!(a.claimed, posted.len() + 2 + 1, "{a:?}");
    assert_eq!(a.refused, 2, "dd's third and fourth post: {a:?}");
    assert_eq!(
        (a.decided + a.refused, a.unlogged.len()),
        (a.claimed, 0),
        "{a:?}"
    );

    // The issue's case: a forward to nobody with the rule, and a receipt.
    let log = entries(&root);
    let e = log
        .iter()
        .find(|e| e.message_id == nobody.id)
        .expect("the contract change is logged");
    assert_eq!(e.decision.action, Action::Forward);
    assert!(e.decision.to.is_empty(), "{e:?}");
    assert!(
        e.decision.reason.contains("none does (index.js)")
            && e.decision.reason.contains("default policy")
            && e.decision.reason.contains("delivered to nobody"),
        "{}",
        e.decision.reason
    );
    let receipt_id = mailbox::mediate::nobody_id(&nobody.id);
    let inbox: HashMap<String, Message> = root
        .sandbox("aa")
        .inbox()
        .scan(Sub::New)
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.found {
            Found::Message(m) => Some((m.id.clone(), m)),
            _ => None,
        })
        .collect();
    let r = inbox.get(&receipt_id).expect("aa got a receipt");
    assert_eq!(
        (r.from.as_str(), r.kind, r.in_reply_to.as_deref()),
        ("mediator", Kind::Status, Some(nobody.id.as_str()))
    );
    assert!(r.subject.starts_with("delivered to nobody: x"), "{r:?}");
    assert!(r.body.contains(&e.decision.reason), "{}", r.body);
    // A status to the mediator alone is a note: no receipt for it.
    let receipts = root
        .sandbox("bb")
        .inbox()
        .scan(Sub::New)
        .unwrap()
        .into_iter()
        .filter(|e| matches!(&e.found, Found::Message(m) if m.subject.starts_with("delivered to nobody")))
        .count();
    assert_eq!(receipts, 1, "bb's contract change y only");

    // lw-mediate log shows it.
    let out = mediate(&root, &["log"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.contains(&nobody.id) && l.contains("forward")),
        "{text}"
    );
}

/// The issue's walk, as a new user runs it: lw-post, lw-mediate --once,
/// lw-mediate log.
#[test]
fn a_contract_change_no_scope_matches_is_logged_and_answered() {
    let root = root_with("logged-cli", &[]);
    let r = root.dir.to_str().unwrap();
    for (name, scope) in [("aa", "*.js"), ("bb", "docs/**")] {
        let out = mediate(
            &root,
            &[
                "register",
                name,
                "--branch",
                &format!("task/{name}"),
                "--scope",
                scope,
            ],
        );
        assert!(out.status.success(), "{out:?}");
    }
    let out = std::process::Command::new(support::bin("lw-post"))
        .env("LW_MAILBOX", format!("{r}/sandboxes/aa"))
        .args(["-k", "contract-change", "-s", "x", "-r", "index.js", "body"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    once(&root, "loopwright-policy 1\n");
    let out = mediate(&root, &["log"]);
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(log.contains(&id), "lw-mediate log names {id}: {log:?}");
    let a = audit(&root);
    assert_eq!((a.claimed, a.decided), (1, 1), "{a:?}");
    let receipt = root
        .sandbox("aa")
        .inbox()
        .sub(Sub::New)
        .join(mailbox::mediate::nobody_id(&id));
    assert!(receipt.exists(), "aa can read its receipt");
}

#[test]
fn a_scope_that_is_not_a_glob_is_refused() {
    let root = root_with("logged-scope", &[]);
    let out = mediate(&root, &["register", "cc", "--scope", "[["]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("invalid scope '[['") && err.contains("unclosed"),
        "{err}"
    );
    assert!(
        !root.registry_dir().join("cc.json").exists(),
        "nothing registered"
    );
}
