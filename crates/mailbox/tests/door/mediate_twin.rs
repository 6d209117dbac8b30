//! A post moved by `link` + `unlink` (lw-post's way where the file system
//! refuses `RENAME_NOREPLACE`, as gVisor's does) shows in `new/` with two
//! links for an instant.  A watching mediator that looks then finishes the
//! move itself: no message is lost to a race of the door's own protocol,
//! whether the mediator runs throughout or is killed and started again.
//! A second link the sandbox really planted is still quarantined.

use support::mediate_util;
use support::seeded;

use std::path::Path;
use std::time::{Duration, Instant};

use mailbox::log::Action;
use mailbox::maildir::Sub;
use mailbox::message::Kind;
use mediate_util::*;

const POSTS: usize = 1_000;
const RESTARTS: usize = 10;

/// lw-post's fallback, with the instant between its two steps made long
/// enough for a watcher to look (a gVisor gofer round trip, in effect).
fn post_by_link(root: &mailbox::layout::Root, sender: &str, m: &mailbox::message::Message) {
    let ob = root.sandbox(sender).outbox();
    let (tmp, new) = (ob.sub(Sub::Tmp).join(&m.id), ob.sub(Sub::New).join(&m.id));
    std::fs::write(&tmp, m.to_bytes()).unwrap();
    std::fs::hard_link(&tmp, &new).unwrap();
    std::thread::sleep(Duration::from_micros(300 + seeded::below(700)));
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        // The mediator finished the move.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("cannot unlink {}: {e}", tmp.display()),
    }
}

fn quarantined(root: &mailbox::layout::Root) -> Vec<String> {
    entries(root)
        .into_iter()
        .filter(|e| e.decision.action == Action::Quarantine)
        .map(|e| e.decision.reason)
        .collect()
}

fn run(tag: &str, restarts: usize) {
    let root = root_with(tag, &["gv", "dst"]);
    let policy = root.dir.parent().unwrap().join("policy");
    std::fs::write(&policy, OPEN_POLICY).unwrap();
    let mut w = Some(Watcher::start(&root, &policy, "60"));
    let started = Instant::now();
    let mut ids = Vec::new();
    for n in 0..POSTS {
        let m = message("gv", &["dst"], Kind::Request, &format!("gv #{n}"));
        post_by_link(&root, "gv", &m);
        ids.push(m.id);
        if restarts > 0 && n % (POSTS / restarts) == POSTS / restarts / 2 {
            let err = w.take().unwrap().stop();
            assert!(!err.contains("panicked"), "{err}");
            w = Some(Watcher::start(&root, &policy, "60"));
        }
    }
    // Let the watcher take what is left, then a last pass for anything the
    // kills interrupted.
    let deadline = Instant::now() + Duration::from_secs(60);
    let inbox = root.sandbox("dst").inbox();
    while delivered(&inbox).len() + quarantined(&root).len() < POSTS && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    w.take().unwrap().stop();
    once(&root, OPEN_POLICY);
    let q = quarantined(&root);
    let got = delivered(&inbox);
    println!(
        "{tag}: seed {} posts {POSTS} restarts {restarts}: {} delivered, {} quarantined in {:.1?}",
        seeded::seed(),
        got.len(),
        q.len(),
        started.elapsed()
    );
    assert!(
        q.is_empty(),
        "{tag}: quarantined {}: {:?}",
        q.len(),
        q.first()
    );
    ids.sort();
    assert_eq!(got, ids, "{tag}: not every post was delivered once");
    let ob = root.sandbox("gv").outbox();
    assert!(names(&ob.sub(Sub::New)).is_empty() && names(&ob.sub(Sub::Tmp)).is_empty());
}

#[test]
fn posts_moved_by_link_and_unlink_reach_a_watching_mediator_whole() {
    run("twin-watch", 0);
}

#[test]
fn posts_moved_by_link_and_unlink_survive_restarts_of_the_mediator() {
    run("twin-restart", RESTARTS);
}

/// Plants `new/NAME` of sender `evil` with a second link made by `plant`
/// (given the outbox's tmp/ and new/ paths of NAME and a scratch dir),
/// runs `--once`, and checks the post is quarantined, not routed.
fn planted(tag: &str, plant: impl FnOnce(&Path, &Path, &Path)) {
    let root = root_with(tag, &["evil", "dst"]);
    let m = message("evil", &["dst"], Kind::Request, "linked");
    let ob = root.sandbox("evil").outbox();
    let scratch = root.dir.parent().unwrap().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let new = ob.sub(Sub::New).join(&m.id);
    std::fs::write(&new, m.to_bytes()).unwrap();
    plant(&ob.sub(Sub::Tmp).join(&m.id), &new, &scratch);
    once(&root, OPEN_POLICY);
    let q = quarantined(&root);
    println!("{tag}: {q:?}");
    assert_eq!(q.len(), 1, "{tag}: not quarantined");
    assert!(q[0].contains("hard links"), "{tag}: {}", q[0]);
    assert!(
        delivered(&root.sandbox("dst").inbox()).is_empty(),
        "{tag}: routed"
    );
}

#[test]
fn a_second_link_under_another_name_in_tmp_is_quarantined() {
    planted("twin-othername", |tmp, new, _| {
        std::fs::hard_link(new, tmp.with_file_name("other")).unwrap();
    });
}

#[test]
fn a_tmp_file_of_the_same_name_that_is_another_inode_is_no_twin() {
    planted("twin-otherinode", |tmp, new, scratch| {
        std::fs::write(tmp, b"another file").unwrap();
        std::fs::hard_link(new, scratch.join("kept")).unwrap();
    });
}

#[test]
fn a_twin_with_a_third_link_is_quarantined() {
    planted("twin-third", |tmp, new, scratch| {
        std::fs::hard_link(new, tmp).unwrap();
        std::fs::hard_link(new, scratch.join("kept")).unwrap();
    });
}

#[test]
fn a_twin_left_by_a_crashed_post_is_delivered_and_its_tmp_name_removed() {
    let root = root_with("twin-crashed", &["gv", "dst"]);
    let m = message("gv", &["dst"], Kind::Request, "half moved");
    let ob = root.sandbox("gv").outbox();
    let tmp = ob.sub(Sub::Tmp).join(&m.id);
    std::fs::write(&tmp, m.to_bytes()).unwrap();
    std::fs::hard_link(&tmp, ob.sub(Sub::New).join(&m.id)).unwrap();
    once(&root, OPEN_POLICY);
    assert!(quarantined(&root).is_empty(), "{:?}", quarantined(&root));
    assert_eq!(delivered(&root.sandbox("dst").inbox()), vec![m.id.clone()]);
    assert!(!tmp.exists(), "tmp name left");
}
