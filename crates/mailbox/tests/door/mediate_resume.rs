//! Restarts after a crash between the steps, with the crash states built by
//! hand: a logged decision is carried out, never taken again, and nothing
//! is written twice.

use support::mediate_util;

use std::ffi::OsStr;

use mailbox::log::Action;
use mailbox::maildir::Sub;
use mailbox::message::Kind;
use mediate_util::*;

/// Routes `m` from `a` once, then puts the source back into `new/` as if
/// the claim had not happened.
fn routed_then_unclaimed(
    root: &mailbox::layout::Root,
    m: &mailbox::message::Message,
    policy: &str,
) {
    post(root, "a", m);
    once(root, policy);
    let ob = root.sandbox("a").outbox();
    std::fs::rename(ob.sub(Sub::Cur).join(&m.id), ob.sub(Sub::New).join(&m.id)).unwrap();
}

#[test]
fn crash_before_delivery_delivers_once_without_a_second_decision() {
    let root = root_with("resume1", &["a", "b", "c"]);
    let m = message("a", &["b", "c"], Kind::Request, "r");
    routed_then_unclaimed(&root, &m, OPEN_POLICY);
    // The copy to b never made it; c had already read its copy.
    std::fs::remove_file(root.sandbox("b").inbox().sub(Sub::New).join(&m.id)).unwrap();
    assert!(root.sandbox("c").inbox().claim(OsStr::new(&m.id)).unwrap());
    once(&root, OPEN_POLICY);
    assert_eq!(delivered(&root.sandbox("b").inbox()), vec![m.id.clone()]);
    assert_eq!(
        delivered(&root.sandbox("c").inbox()),
        vec![m.id.clone()],
        "no second copy beside the read one"
    );
    let e: Vec<_> = entries(&root)
        .into_iter()
        .filter(|e| e.decision.action != Action::Read)
        .collect();
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(names(&root.sandbox("a").outbox().sub(Sub::New)).is_empty());
}

#[test]
fn a_logged_hold_stands_even_when_the_policy_changed() {
    let root = root_with("resume2", &["a", "b"]);
    let m = message("a", &["b"], Kind::Handoff, "h");
    routed_then_unclaimed(&root, &m, "loopwright-policy 1\nhold kind handoff\n");
    std::fs::remove_file(root.held().sub(Sub::New).join(&m.id)).unwrap();
    // The restart runs with a policy that would forward it.
    once(&root, OPEN_POLICY);
    let e = entries(&root);
    assert_eq!(
        e.iter().map(|e| e.decision.action).collect::<Vec<_>>(),
        [Action::Hold]
    );
    assert_eq!(names(&root.held().sub(Sub::New)), vec![m.id.clone()]);
    assert!(delivered(&root.sandbox("b").inbox()).is_empty());
}

#[test]
fn a_logged_partial_bounce_is_not_decided_again() {
    let root = root_with("resume3", &["a", "b"]);
    let m = message("a", &["b", "ghost"], Kind::Request, "p");
    routed_then_unclaimed(&root, &m, OPEN_POLICY);
    // The main entry was never written (crash between the two log groups),
    // and ghost has been registered since.
    // The forward entry's file (a batch file of its own: the bounce was
    // logged in the batch file before it) is what the crash took.
    let want = format!("\"name\":\"{}.forward\"", m.id);
    let fwd = std::fs::read_dir(root.log_dir().join("new"))
        .unwrap()
        .map(|d| d.unwrap().path())
        .find(|p| std::fs::read_to_string(p).unwrap().contains(&want))
        .expect("the forward entry was logged");
    let bounce = format!("\"name\":\"{}.bounce\"", m.id);
    assert!(!std::fs::read_to_string(&fwd).unwrap().contains(&bounce));
    std::fs::remove_file(&fwd).unwrap();
    mailbox::registry::Registry::new(&root)
        .register(&mailbox::registry::Sandbox::new("ghost", None, vec![]))
        .unwrap();
    once(&root, OPEN_POLICY);
    let mut acts: Vec<_> = entries(&root)
        .into_iter()
        .map(|e| (e.decision.action, e.decision.to))
        .collect();
    acts.sort_by_key(|a| a.0.as_str());
    assert_eq!(
        acts,
        [
            (Action::Bounce, vec!["ghost".to_string()]),
            (Action::Forward, vec!["b".to_string()])
        ]
    );
    assert!(
        delivered(&root.sandbox("ghost").inbox()).is_empty(),
        "the logged bounce stands"
    );
    assert_eq!(delivered(&root.sandbox("a").inbox()).len(), 1, "one bounce");
}

#[test]
fn reposting_a_routed_message_is_quarantined_not_routed_twice() {
    let root = root_with("resume4", &["a", "b"]);
    let m = message("a", &["b"], Kind::Request, "once");
    post(&root, "a", &m);
    once(&root, OPEN_POLICY);
    post(&root, "a", &m);
    once(&root, OPEN_POLICY);
    let q: Vec<_> = entries(&root)
        .into_iter()
        .filter(|e| e.decision.action == Action::Quarantine)
        .collect();
    assert_eq!(q.len(), 1);
    assert!(
        q[0].decision.reason.contains("posted again"),
        "{}",
        q[0].decision.reason
    );
    assert_eq!(delivered(&root.sandbox("b").inbox()), vec![m.id.clone()]);
}

#[test]
fn an_interrupted_release_is_finished_by_the_next_pass() {
    let root = root_with("resume5", &["a", "b"]);
    let policy = "loopwright-policy 1\nhold kind handoff\n";
    let m = message("a", &["b"], Kind::Handoff, "h");
    post(&root, "a", &m);
    once(&root, policy);
    let rel = mediate(&root, &["release", &m.id]);
    assert!(
        rel.status.success(),
        "{}",
        String::from_utf8_lossy(&rel.stderr)
    );
    // As if the release died after logging: not delivered, still held.
    std::fs::remove_file(root.sandbox("b").inbox().sub(Sub::New).join(&m.id)).unwrap();
    std::fs::rename(
        root.held().sub(Sub::Cur).join(&m.id),
        root.held().sub(Sub::New).join(&m.id),
    )
    .unwrap();
    once(&root, policy);
    assert_eq!(delivered(&root.sandbox("b").inbox()), vec![m.id.clone()]);
    assert!(names(&root.held().sub(Sub::New)).is_empty());
    let acts: Vec<_> = entries(&root)
        .into_iter()
        .map(|e| e.decision.action)
        .collect();
    assert_eq!(acts, [Action::Hold, Action::Release]);
}

/// Issue 29, item 4: refusals are counted, not logged one by one.  A crash
/// after the count was made durable and before the posts were claimed must
/// not count them twice: the restart claims them, and the count logged at
/// the end says each once.
#[test]
fn refusals_counted_before_a_crash_are_counted_once() {
    let root = root_with("resume-refused", &["a", "b"]);
    let policy = root.dir.parent().unwrap().join("policy");
    let text = "loopwright-policy 1\nrate off\nduplicates off\nhold sender a\nheld-max 2\n";
    std::fs::write(&policy, text).unwrap();
    const N: usize = 10;
    for i in 0..N {
        post(
            &root,
            "a",
            &message("a", &["b"], Kind::Request, &format!("r{i}")),
        );
    }
    let mut m = mailbox::mediate::Mediator::open(
        root.clone(),
        Some(policy.clone()),
        true,
        Box::new(|_| {}),
    )
    .unwrap();
    m.batch_hook = Some(Box::new(|step, _| {
        if step == "delivered" {
            panic!("killed after delivery, before the claim");
        }
    }));
    let crashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        m.drain(&mut std::io::sink())
    }));
    assert!(crashed.is_err(), "the hook ends the run");
    drop(m);
    let new = root.sandbox("a").outbox().sub(Sub::New);
    assert_eq!(names(&new).len(), N, "nothing claimed before the crash");

    once(&root, text);
    assert!(names(&new).is_empty());
    let es = entries(&root);
    let held = es
        .iter()
        .filter(|e| e.decision.action == Action::Hold)
        .count();
    let counts: Vec<&str> = es
        .iter()
        .filter(|e| e.sender == "a" && e.decision.action == Action::Bounce)
        .map(|e| e.message.as_ref().unwrap().subject.as_str())
        .collect();
    println!("after the crash: held {held}, counted {counts:?}");
    assert_eq!(held, 2);
    assert_eq!(counts, vec![format!("{} posts refused", N - 2)]);
    assert_eq!(
        names(&root.sandbox("a").inbox().sub(Sub::New)).len(),
        1,
        "one bounce tells the sender"
    );
}

/// The batch files of the log (`log/new/batch.*`), by path.
fn batch_files(root: &mailbox::layout::Root) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(root.log_dir().join("new"))
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("batch.")
        })
        .collect();
    v.sort();
    v
}

/// How many lines of the log's files are entry `name` (entries() shows
/// each name once, so a second decision would hide there).
fn lines_of(root: &mailbox::layout::Root, name: &str) -> usize {
    let want = format!("\"name\":\"{name}\"");
    std::fs::read_dir(root.log_dir().join("new"))
        .unwrap()
        .map(|d| std::fs::read_to_string(d.unwrap().path()).unwrap())
        .map(|s| s.lines().filter(|l| l.contains(&want)).count())
        .sum()
}

/// Issue 41: a batch file garbled after a valid prefix and cut short (no
/// door writes it so: a batch file is visible only once fsynced whole; a
/// disk or a person can) costs its bad lines only.  The good entry stands
/// (its message is not decided again), the garbled one's message, which
/// the crash left unclaimed and half delivered, is decided and delivered
/// once, and nothing is quarantined.
#[test]
fn a_garbled_batch_file_costs_its_bad_lines_only() {
    let root = root_with("resume-garbled", &["a", "b"]);
    let (m1, m2) = (
        message("a", &["b"], Kind::Request, "one"),
        message("a", &["b"], Kind::Request, "two"),
    );
    post(&root, "a", &m1);
    post(&root, "a", &m2);
    once(&root, OPEN_POLICY);
    let files = batch_files(&root);
    assert_eq!(files.len(), 1, "one batch, one log file: {files:?}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let (l1, l2) = {
        let v: Vec<&str> = text.lines().collect();
        assert_eq!(v.len(), 2, "{text}");
        let first_is_m1 = v[0].contains(&m1.id);
        if first_is_m1 {
            (v[0], v[1])
        } else {
            (v[1], v[0])
        }
    };
    // m1's line, then m2's garbled, then a line cut short.
    let garbled = l2.replace("\"forward\"", "\"forw\u{0}rd\"");
    let cut = &l1[..l1.len() / 2];
    std::fs::write(&files[0], format!("{l1}\n{garbled}\n{cut}")).unwrap();
    let (good, bad) = mailbox::log::Log::new(root.log_dir()).entries().unwrap();
    assert_eq!(
        good.iter().map(|e| e.name.clone()).collect::<Vec<_>>(),
        [format!("{}.forward", m1.id)]
    );
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad[0].name.ends_with("line 2") && bad[1].name.ends_with("line 3"));
    assert!(bad[1].reason.contains("cut short"), "{bad:?}");
    // The crash left both unclaimed, m2's copy not delivered.
    let ob = root.sandbox("a").outbox();
    for m in [&m1, &m2] {
        std::fs::rename(ob.sub(Sub::Cur).join(&m.id), ob.sub(Sub::New).join(&m.id)).unwrap();
    }
    std::fs::remove_file(root.sandbox("b").inbox().sub(Sub::New).join(&m2.id)).unwrap();
    once(&root, OPEN_POLICY);
    assert_eq!(
        lines_of(&root, &format!("{}.forward", m1.id)),
        2,
        "m1: its line and the cut one"
    );
    assert_eq!(
        lines_of(&root, &format!("{}.forward", m2.id)),
        2,
        "m2: its garbled line, and logged again once"
    );
    let (good, bad) = mailbox::log::Log::new(root.log_dir()).entries().unwrap();
    let fwd: Vec<_> = good.iter().map(|e| e.name.clone()).collect();
    let mut want_fwd = vec![format!("{}.forward", m1.id), format!("{}.forward", m2.id)];
    want_fwd.sort();
    let mut fwd_sorted = fwd.clone();
    fwd_sorted.sort();
    assert_eq!(fwd_sorted, want_fwd);
    assert_eq!(
        bad.len(),
        2,
        "the same two bad lines, nothing more: {bad:?}"
    );
    let mut want = vec![m1.id.clone(), m2.id.clone()];
    want.sort();
    assert_eq!(delivered(&root.sandbox("b").inbox()), want);
    assert_eq!(names(&ob.sub(Sub::Cur)), want, "both claimed");
    assert!(names(&root.quarantine().sub(Sub::New)).is_empty());
}

/// Issue 41, the upgrade path: a log the one-entry-per-file mediator
/// wrote is read by the batching one: a logged decision stands.
#[test]
fn a_log_of_entry_files_is_read_as_before() {
    let root = root_with("resume-upgrade", &["a", "b"]);
    let m = message("a", &["b", "ghost"], Kind::Request, "old");
    routed_then_unclaimed(&root, &m, OPEN_POLICY);
    for f in batch_files(&root) {
        for line in std::fs::read_to_string(&f).unwrap().lines() {
            let e = mailbox::log::Entry::parse(line.as_bytes()).unwrap();
            std::fs::write(
                root.log_dir().join("new").join(&e.name),
                format!("{line}\n"),
            )
            .unwrap();
        }
        std::fs::remove_file(f).unwrap();
    }
    std::fs::remove_file(root.sandbox("b").inbox().sub(Sub::New).join(&m.id)).unwrap();
    mailbox::registry::Registry::new(&root)
        .register(&mailbox::registry::Sandbox::new("ghost", None, vec![]))
        .unwrap();
    once(&root, OPEN_POLICY);
    assert!(batch_files(&root).is_empty(), "nothing logged again");
    let acts: Vec<_> = entries(&root)
        .into_iter()
        .map(|e| e.decision.action)
        .collect();
    assert_eq!(acts.len(), 2, "{acts:?}");
    assert_eq!(delivered(&root.sandbox("b").inbox()), vec![m.id.clone()]);
    assert!(
        delivered(&root.sandbox("ghost").inbox()).is_empty(),
        "the logged bounce stands"
    );
}
