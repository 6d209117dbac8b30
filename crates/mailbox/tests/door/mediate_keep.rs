//! The quarantine budget: a sandbox that plants big files in its outbox,
//! sparse or dense, pass after pass, grows the root by at most its
//! `door.quarantine-max`; no hole is filled in; a person and the sandbox
//! are told once; another pair's message still crosses in the same pass.
//! Prints its figures.

use support::mediate_util;

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use mailbox::log::Action;
use mailbox::maildir::Sub;
use mailbox::message::Kind;
use mediate_util::*;

const PASSES: usize = 10;
const SPARSE: usize = 100;
const DENSE: usize = 100;
const BUDGET: u64 = 4 << 20;

/// Bytes allocated beneath `dir`, links not followed; `skip` (a name at the
/// top) left out.
fn du(dir: &Path, skip: &str) -> u64 {
    let mut n = 0;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in rd.flatten() {
        if e.file_name() == skip {
            continue;
        }
        let m = e.path().symlink_metadata().unwrap();
        n += m.blocks() * 512;
        if m.is_dir() {
            n += du(&e.path(), "");
        }
    }
    n
}

fn pass(root: &mailbox::layout::Root, policy: &Path) -> Duration {
    let t = Instant::now();
    let out = mediate(
        root,
        &[
            "--once",
            "--policy",
            policy.to_str().unwrap(),
            "--log-max",
            "1g",
            "--quarantine-max",
            "4m",
        ],
    );
    assert!(
        out.status.success(),
        "lw-mediate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    t.elapsed()
}

#[test]
fn sparse_and_dense_junk_over_ten_passes_grows_the_root_by_at_most_the_budget() {
    let root = root_with("keep", &["evil", "good", "dst"]);
    let policy = root.dir.parent().unwrap().join("policy");
    std::fs::write(&policy, OPEN_POLICY).unwrap();
    // The usual time: a pass with one message and no junk.
    let m = message("good", &["dst"], Kind::Request, "usual");
    post(&root, "good", &m);
    let usual = pass(&root, &policy);
    let (q0, r0) = (
        du(&root.quarantine().path, ""),
        du(&root.dir, "sandboxes") - du(&root.log_dir(), ""),
    );
    let log0 = du(&root.log_dir(), "");
    let new = root.sandbox("evil").outbox().sub(Sub::New);
    let mut slowest = Duration::ZERO;
    for p in 0..PASSES {
        // Dense first: their heads (taken first, by name) fill the budget.
        for _ in 0..DENSE {
            std::fs::write(new.join(base::id::new_id()), vec![0x5a; 1_100 << 10]).unwrap();
        }
        for _ in 0..SPARSE {
            let f = std::fs::File::create(new.join(base::id::new_id())).unwrap();
            f.set_len(2 << 30).unwrap();
        }
        let m = message("good", &["dst"], Kind::Request, &format!("pass {p}"));
        post(&root, "good", &m);
        let took = pass(&root, &policy);
        slowest = slowest.max(took);
        assert!(
            delivered(&root.sandbox("dst").inbox()).contains(&m.id),
            "pass {p}: another pair's message did not cross"
        );
        assert!(
            names(&new).is_empty(),
            "pass {p}: junk left: {}",
            names(&new).len()
        );
    }
    let q = du(&root.quarantine().path, "") - q0;
    let log = du(&root.log_dir(), "") - log0;
    let rest = du(&root.dir, "sandboxes") - du(&root.log_dir(), "") - r0;
    let quarantined = entries(&root)
        .iter()
        .filter(|e| e.decision.action == Action::Quarantine)
        .count();
    let told: Vec<String> = entries(&root)
        .into_iter()
        .filter(|e| e.decision.reason.contains("quarantine budget of"))
        .map(|e| e.decision.reason)
        .collect();
    println!(
        "keep: {} sparse 2 GiB and {} dense 1.1 MiB files over {PASSES} passes, budget {} KiB: \
         quarantine grew {} KiB, the root apart from the log {} KiB, the log {} KiB; {quarantined} quarantined; \
         told {} time(s); a pass with one message took {usual:.1?}, the slowest pass with junk {slowest:.1?}",
        PASSES * SPARSE,
        PASSES * DENSE,
        BUDGET >> 10,
        q >> 10,
        rest >> 10,
        log >> 10,
        told.len()
    );
    assert_eq!(quarantined, PASSES * (SPARSE + DENSE));
    assert!(q <= BUDGET, "the quarantine grew {q} bytes, over {BUDGET}");
    assert!(q >= BUDGET / 2, "the budget was not used: {q} bytes kept");
    // Beside the budget: the door's own few blocks (the notice, its
    // memory, a directory's growth).
    assert!(
        rest <= BUDGET + (64 << 10),
        "the root grew {rest} bytes beside its log"
    );
    assert_eq!(told.len(), 1, "told {told:?}");
    let human = delivered(&root.human());
    assert!(!human.is_empty(), "a person was not told");
    assert!(
        slowest < Duration::from_secs(60),
        "a pass with junk took {slowest:?}"
    );
}
