//! Many outboxes at once: a thousand senders with one message each are
//! routed in batches that span outboxes, an unreadable outbox among them is
//! reported and skipped while the rest are delivered, and an outbox removed
//! while its batch is in flight loses nothing and stops nothing; a batch
//! takes runs of up to TURN entries of an outbox, and no more.

use support::mediate_util;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mailbox::layout::Root;
use mailbox::log::Action;
use mailbox::maildir::Sub;
use mailbox::mediate::Mediator;
use mailbox::message::Kind;
use mediate_util::*;

/// Writes `m` into `new/` of `sender`'s outbox, making the Maildir if
/// needed (not fsynced: this test never crashes the machine).
fn drop_in(root: &Root, sender: &str, m: &mailbox::message::Message) {
    let ob = root.sandbox(sender).outbox();
    for s in [Sub::Tmp, Sub::New, Sub::Cur] {
        std::fs::create_dir_all(ob.sub(s)).unwrap();
    }
    let tmp = ob.sub(Sub::Tmp).join(&m.id);
    std::fs::write(&tmp, m.to_bytes()).unwrap();
    std::fs::rename(&tmp, ob.sub(Sub::New).join(&m.id)).unwrap();
}

fn forwards(root: &Root) -> Vec<String> {
    let mut v: Vec<String> = entries(root)
        .into_iter()
        .filter(|e| e.decision.action == Action::Forward)
        .map(|e| e.message_id)
        .collect();
    v.sort();
    v
}

#[test]
fn a_thousand_outboxes_with_one_unreadable_deliver_the_rest_and_report_it() {
    let root = root_with("thousand", &["dst"]);
    let mut ids = Vec::new();
    for i in 0..1000 {
        let s = format!("s{i:04}");
        let m = message(&s, &["dst"], Kind::Request, &format!("from {s}"));
        drop_in(&root, &s, &m);
        ids.push(m.id);
    }
    // s0500's new/ becomes a symbolic link to a directory elsewhere: the
    // mediator never follows it, so to it the outbox cannot be read.
    let bad = root.sandbox("s0500").outbox();
    let elsewhere = root.dir.parent().unwrap().join("elsewhere");
    std::fs::rename(bad.sub(Sub::New), &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, bad.sub(Sub::New)).unwrap();

    let p = root.dir.parent().unwrap().join("policy");
    std::fs::write(&p, OPEN_POLICY).unwrap();
    let t = Instant::now();
    let out = mediate(&root, &["--once", "--policy", p.to_str().unwrap()]);
    let took = t.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    println!("1,000 outboxes, one message each: routed in {took:?}");
    assert_eq!(out.status.code(), Some(75), "stderr: {err}");
    assert!(
        err.contains("outbox of s0500 skipped") && err.contains("not followed"),
        "the unreadable outbox is not named: {err}"
    );
    let mut want: Vec<String> = ids.clone();
    let held_back = want.remove(500);
    want.sort();
    assert_eq!(delivered(&root.sandbox("dst").inbox()), want);
    assert_eq!(forwards(&root), want, "each logged once");
    assert!(
        elsewhere.join(&held_back).is_file(),
        "the unreadable outbox's message was touched"
    );

    // Once the outbox is whole again its message goes too.
    std::fs::remove_file(bad.sub(Sub::New)).unwrap();
    std::fs::rename(&elsewhere, bad.sub(Sub::New)).unwrap();
    once(&root, OPEN_POLICY);
    let mut all = ids.clone();
    all.sort();
    assert_eq!(delivered(&root.sandbox("dst").inbox()), all);
    assert_eq!(forwards(&root), all);
}

/// Two senders with five messages each, routed in one batch; at `step` of
/// that batch the hook removes the outbox of `gone`.  Returns the root and
/// the ids of each sender.
fn remove_in_flight(step: &'static str) -> (Root, Vec<String>, Vec<String>) {
    let root = root_with(step, &["a", "gone", "dst"]);
    let (mut a, mut g) = (Vec::new(), Vec::new());
    for i in 0..5 {
        let m = message("a", &["dst"], Kind::Request, &format!("a {i}"));
        post(&root, "a", &m);
        a.push(m.id);
        let m = message("gone", &["dst"], Kind::Request, &format!("gone {i}"));
        post(&root, "gone", &m);
        g.push(m.id);
    }
    a.sort();
    g.sort();
    let p = root.dir.parent().unwrap().join("policy");
    std::fs::write(&p, OPEN_POLICY).unwrap();
    let mut m = Mediator::open(root.clone(), Some(p), true, Box::new(|_| {})).unwrap();
    let target: PathBuf = root.sandbox("gone").outbox().path;
    let fired = Arc::new(Mutex::new(Vec::new()));
    let seen = fired.clone();
    m.batch_hook = Some(Box::new(move |at: &str, dirs: &[PathBuf]| {
        let mut seen = seen.lock().unwrap();
        seen.push((at.to_string(), dirs.len()));
        if at == step && dirs.iter().any(|d| d == &target) && target.exists() {
            std::fs::remove_dir_all(&target).unwrap();
        }
    }));
    let mut sink = Vec::new();
    let s = m
        .drain(&mut sink)
        .expect("a removed outbox does not fail the pass");
    let fired = fired.lock().unwrap().clone();
    println!("{step}: hook calls {fired:?}, stats {s:?}");
    assert!(
        fired.iter().any(|(at, n)| at == step && *n == 2),
        "no batch spanned both outboxes: {fired:?}"
    );
    assert!(!Path::new(&root.sandbox("gone").outbox().path).exists());
    (root, a, g)
}

#[test]
fn an_outbox_removed_after_delivery_but_before_the_claim_loses_nothing() {
    let (root, a, g) = remove_in_flight("delivered");
    // Logged and delivered before the outbox went: every message arrived once.
    let mut all: Vec<String> = a.iter().chain(&g).cloned().collect();
    all.sort();
    assert_eq!(delivered(&root.sandbox("dst").inbox()), all);
    assert_eq!(forwards(&root), all);
    // The next pass finds nothing to do again.
    let out = once(&root, OPEN_POLICY);
    assert!(out.status.success());
    assert_eq!(forwards(&root), all);
}

#[test]
fn an_outbox_removed_before_its_messages_were_read_stops_nobody_else() {
    let (root, a, _g) = remove_in_flight("collected");
    // The removed outbox took its unread messages with it (they were never
    // the mediator's); the other sender's were all delivered, once.
    assert_eq!(delivered(&root.sandbox("dst").inbox()), a);
    assert_eq!(forwards(&root), a);
    // The sender can post again into a new outbox.
    let m = message("gone", &["dst"], Kind::Request, "after");
    post(&root, "gone", &m);
    once(&root, OPEN_POLICY);
    assert!(delivered(&root.sandbox("dst").inbox()).contains(&m.id));
}

#[test]
fn receipts_taken_in_waves_are_each_logged_once() {
    let root = root_with("acks", &["a", "b"]);
    let mut ids = Vec::new();
    for i in 0..300 {
        let m = message("a", &["b"], Kind::Request, &format!("m {i}"));
        drop_in(&root, "a", &m);
        ids.push(m.id);
    }
    let p = root.dir.parent().unwrap().join("policy");
    std::fs::write(&p, OPEN_POLICY).unwrap();
    let mut m = Mediator::open(root.clone(), Some(p), true, Box::new(|_| {})).unwrap();
    let mut sink = Vec::new();
    m.drain(&mut sink).unwrap();
    let inbox = root.sandbox("b").inbox();
    // A file in cur/ that was never routed to b: never a receipt.
    let stray = base::id::new_id();
    std::fs::write(inbox.sub(Sub::Cur).join(&stray), b"x").unwrap();
    let reads = |root: &Root| {
        let mut v: Vec<String> = entries(root)
            .into_iter()
            .filter(|e| e.decision.action == Action::Read)
            .map(|e| e.message_id)
            .collect();
        v.sort();
        v
    };
    for wave in ids.chunks(100) {
        for id in wave {
            std::fs::rename(inbox.sub(Sub::New).join(id), inbox.sub(Sub::Cur).join(id)).unwrap();
        }
        let s = m.drain(&mut sink).unwrap();
        assert_eq!(s.receipts, wave.len() as u64, "{s:?}");
    }
    let mut want = ids.clone();
    want.sort();
    assert_eq!(reads(&root), want);
    // A new mediator (nothing remembered) finds nothing more to log.
    let s = m.drain(&mut sink).unwrap();
    assert_eq!(s.receipts, 0);
    once(&root, OPEN_POLICY);
    assert_eq!(reads(&root), want);
}

#[test]
fn a_copy_that_cannot_be_written_waits_and_goes_on_the_next_pass() {
    // Two senders to one inbox, one message per batch.  Before the second
    // batch the inbox's tmp/ vanishes (its descriptor is held open from the
    // first): the second copy cannot be created, so that message waits,
    // logged but unclaimed, and the next pass carries its decision out.
    let root = root_with("copyfails", &["a", "b", "dst"]);
    let (ma, mb) = (
        message("a", &["dst"], Kind::Request, "from a"),
        message("b", &["dst"], Kind::Request, "from b"),
    );
    post(&root, "a", &ma);
    post(&root, "b", &mb);
    let p = root.dir.parent().unwrap().join("policy");
    std::fs::write(&p, OPEN_POLICY).unwrap();
    let mut m = Mediator::open(root.clone(), Some(p), true, Box::new(|_| {})).unwrap();
    m.batch = 1;
    let tmp = root.sandbox("dst").inbox().sub(Sub::Tmp);
    let batches = Arc::new(Mutex::new(0));
    let seen = batches.clone();
    m.batch_hook = Some(Box::new(move |at: &str, _dirs: &[PathBuf]| {
        let mut n = seen.lock().unwrap();
        if at == "collected" {
            *n += 1;
            if *n == 2 {
                std::fs::remove_dir(&tmp).unwrap();
            }
        }
    }));
    let mut sink = Vec::new();
    let s = m.drain(&mut sink).unwrap();
    println!("stats {s:?}, batches {}", batches.lock().unwrap());
    assert_eq!(s.resumed, 1, "the second copy did not fail once: {s:?}");
    assert_eq!(s.waiting, 0, "{s:?}");
    let mut want = vec![ma.id.clone(), mb.id.clone()];
    want.sort();
    assert_eq!(delivered(&root.sandbox("dst").inbox()), want);
    assert_eq!(forwards(&root), want, "each logged once");
}

#[test]
fn a_batch_takes_a_run_of_an_outbox_and_a_flood_delays_a_question_by_at_most_a_turn() {
    // `flood` has 100 posts waiting, `q` one question; batches of 8.  A
    // turn takes up to TURN (16) entries of an outbox, so the first batch
    // is 8 of the flood's alone (before: one of each outbox in turn), and
    // the question is taken after at most TURN of the flood's posts.
    use mailbox::mediate::TURN;
    const BATCH: usize = 8;
    let root = root_with("turns", &["flood", "q", "dst"]);
    for i in 0..100 {
        drop_in(
            &root,
            "flood",
            &message("flood", &["dst"], Kind::Request, &format!("flood {i}")),
        );
    }
    let question = message("q", &["dst"], Kind::Request, "a question");
    drop_in(&root, "q", &question);
    let p = root.dir.parent().unwrap().join("policy");
    std::fs::write(&p, OPEN_POLICY).unwrap();
    let mut m = Mediator::open(root.clone(), Some(p), true, Box::new(|_| {})).unwrap();
    m.batch = BATCH;
    let batches: Arc<Mutex<Vec<Vec<PathBuf>>>> = Arc::default();
    let seen = batches.clone();
    m.batch_hook = Some(Box::new(move |at: &str, dirs: &[PathBuf]| {
        if at == "collected" {
            seen.lock().unwrap().push(dirs.to_vec());
        }
    }));
    let mut sink = Vec::new();
    m.drain(&mut sink).unwrap();
    let batches = batches.lock().unwrap().clone();
    let (flood, q) = (
        root.sandbox("flood").outbox().path,
        root.sandbox("q").outbox().path,
    );
    let at = batches.iter().position(|b| b.contains(&q));
    println!(
        "{} batches of {BATCH}; the question in batch {at:?}; outboxes per batch {:?}",
        batches.len(),
        batches.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert_eq!(
        batches[0],
        vec![flood],
        "the first batch is a run of the flood's posts"
    );
    let bound = TURN.div_ceil(BATCH) + 1;
    assert!(
        at.is_some_and(|a| a < bound),
        "the question waits behind more than {TURN} posts of the flood: batch {at:?}"
    );
    assert_eq!(delivered(&root.sandbox("q").inbox()).len(), 0);
    assert_eq!(forwards(&root).len(), 101, "each logged once");
}
