//! The kill -9 storm: the mediator is SIGKILLed at random moments while
//! several posters send 2,000 messages; after a final `--once`, every message
//! is logged once (a contract change that reaches nobody too, with its
//! receipt), sits once in each recipient's inbox, every claimed message has
//! its decision in the log, and no outbox holds anything in `new/`.  Prints
//! its figures.

use support::seeded;

use support::mediate_util;

use std::collections::{BTreeMap, HashMap};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mailbox::log::Action;
use mailbox::maildir::{Found, Sub};
use mailbox::message::Kind;
use mediate_util::*;

const POSTERS: &[&str] = &["api", "web", "db", "ops"];
const PER_POSTER: usize = 500;
const MIN_KILLS: usize = 200;
/// Malformed files the first poster plants along the way.
const PLANTED: usize = 20;

fn rand_below(n: u64) -> u64 {
    seeded::below(n)
}

#[test]
fn kill_storm_loses_and_duplicates_nothing() {
    let root = root_with("storm", POSTERS);
    // Each poster owns its own directory, so a contract change whose refs
    // lie elsewhere reaches nobody: logged as a forward to nobody, with a
    // receipt back to its sender (issue 48).
    for p in POSTERS {
        let scope = vec![format!("{p}/**")];
        mailbox::registry::Registry::new(&root)
            .register(&mailbox::registry::Sandbox::new(p, None, scope))
            .unwrap();
    }
    let policy = root.dir.parent().unwrap().join("policy");
    std::fs::write(&policy, OPEN_POLICY).unwrap();

    // Who should receive what: id -> recipients.
    // id -> (sender, recipients)
    type Expected = HashMap<String, (String, Vec<String>)>;
    let expected: Arc<std::sync::Mutex<Expected>> = Arc::default();
    let posted = Arc::new(AtomicUsize::new(0));
    let mut posters = Vec::new();
    for (i, me) in POSTERS.iter().enumerate() {
        let (root, expected, posted) = (root.clone(), expected.clone(), posted.clone());
        posters.push(std::thread::spawn(move || {
            for n in 0..PER_POSTER {
                // One or two recipients other than the poster.
                let a = POSTERS[(i + 1 + n % 3) % POSTERS.len()];
                let b = POSTERS[(i + 1 + (n + 1) % 3) % POSTERS.len()];
                let mut to: Vec<&str> = if n % 2 == 0 { vec![a] } else { vec![a, b] };
                let kind = if n % 7 == 3 {
                    Kind::ContractChange
                } else if n % 5 == 0 {
                    Kind::Handoff
                } else {
                    Kind::Request
                };
                let mut m = message(me, &to, kind, &format!("{me} #{n}"));
                if kind == Kind::ContractChange {
                    m.to = vec!["mediator".into()];
                    m.refs = vec![format!("nowhere/{me}/{n}")];
                    to.clear();
                }
                expected.lock().unwrap().insert(
                    m.id.clone(),
                    (me.to_string(), to.iter().map(|s| s.to_string()).collect()),
                );
                post(&root, me, &m);
                if i == 0 && n % (PER_POSTER / PLANTED) == 0 {
                    let bad = base::id::new_id();
                    let tmp = root.sandbox(me).outbox().sub(Sub::Tmp).join(&bad);
                    std::fs::write(&tmp, b"{\"version\": 1, \"broken\"").unwrap();
                    std::fs::rename(&tmp, root.sandbox(me).outbox().sub(Sub::New).join(&bad))
                        .unwrap();
                }
                posted.fetch_add(1, Ordering::Relaxed);
                // Spread the flow over the storm (pacing, not synchronisation).
                std::thread::sleep(Duration::from_micros(2_000 + rand_below(6_000)));
            }
        }));
    }

    let started = Instant::now();
    let mut kills = 0;
    let stderr_path = root.dir.parent().unwrap().join("stderr");
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&stderr_path)
        .unwrap();
    while kills < MIN_KILLS || posted.load(Ordering::Relaxed) < POSTERS.len() * PER_POSTER {
        let mut child = Command::new(lw_mediate())
            .arg("--root")
            .arg(&root.dir)
            .arg("--policy")
            .arg(&policy)
            .args(["--rescan", "1", "--batch", "32"])
            .stdout(Stdio::null())
            .stderr(stderr.try_clone().unwrap())
            .spawn()
            .expect("lw-mediate starts");
        // Mostly short lives (kills during start-up and mid-batch), now and
        // then a longer one so that routing makes progress during the storm.
        let life = if rand_below(8) == 0 {
            100 + rand_below(300)
        } else {
            2 + rand_below(40)
        };
        std::thread::sleep(Duration::from_millis(life));
        child.kill().expect("SIGKILL is delivered");
        child.wait().unwrap();
        kills += 1;
    }
    for p in posters {
        p.join().unwrap();
    }
    let storm = started.elapsed();
    let routed_in_storm: usize = POSTERS
        .iter()
        .map(|p| names(&root.sandbox(p).outbox().sub(Sub::Cur)).len())
        .sum();
    // Evidence that kills landed inside commits: files a killed run left in
    // tmp/ (a later run writes the same name again, or nobody reads them).
    let interrupted: usize = POSTERS
        .iter()
        .map(|p| names(&root.sandbox(p).inbox().sub(Sub::Tmp)).len())
        .sum::<usize>()
        + names(&root.log_dir().join("tmp")).len();
    let final_run = once(&root, OPEN_POLICY);
    // Evidence that kills landed between logging and claiming: decisions a
    // restarted mediator found logged and carried out (one message may be
    // resumed by several restarts in a row, so these are events).
    let mut notes = std::fs::read_to_string(&stderr_path).unwrap();
    notes.push_str(&String::from_utf8_lossy(&final_run.stderr));
    let mut resumed = 0;
    for line in notes.lines() {
        let n = line
            .strip_prefix("lw-mediate: carrying out ")
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse::<usize>().ok());
        match n {
            Some(n) => resumed += n,
            None => panic!("unexpected diagnostic: {line}"),
        }
    }

    let expected = expected.lock().unwrap();
    // The log: exactly one forward entry per message, nothing else.
    let mut logged: HashMap<String, Vec<Action>> = HashMap::new();
    let mut quarantine_entries = 0;
    for e in entries(&root) {
        if e.decision.action == Action::Quarantine {
            quarantine_entries += 1;
            continue;
        }
        logged
            .entry(e.message_id.clone())
            .or_default()
            .push(e.decision.action);
        if let Some((sender, _)) = expected.get(&e.message_id) {
            assert_eq!(&e.sender, sender);
        }
    }
    let lost_log = expected
        .keys()
        .filter(|id| !logged.contains_key(*id))
        .count();
    let dup_log: usize = logged
        .iter()
        .map(|(id, acts)| {
            if expected.contains_key(id) {
                acts.len() - 1
            } else {
                acts.len()
            }
        })
        .sum();
    let wrong_action = logged
        .values()
        .flatten()
        .filter(|a| **a != Action::Forward)
        .count();

    // Every inbox: each expected copy once, intact, nothing extra.
    let (mut lost_inbox, mut dup_inbox, mut torn, mut copies) = (0, 0, 0, 0);
    for who in POSTERS {
        let inbox = root.sandbox(who).inbox();
        let mut have: BTreeMap<String, usize> = BTreeMap::new();
        for sub in [Sub::New, Sub::Cur] {
            for e in inbox.scan(sub).unwrap() {
                match e.found {
                    Found::Message(m) => *have.entry(m.id).or_default() += 1,
                    _ => torn += 1,
                }
            }
        }
        for (id, (sender, to)) in expected.iter() {
            if to.is_empty() && sender == who {
                // The receipt of a forward to nobody.
                copies += 1;
                match have.remove(&mailbox::mediate::nobody_id(id)) {
                    Some(1) => {}
                    Some(n) => dup_inbox += n - 1,
                    None => lost_inbox += 1,
                }
            }
            if to.iter().any(|t| t == who) {
                copies += 1;
                match have.remove(id) {
                    Some(1) => {}
                    Some(n) => dup_inbox += n - 1,
                    None => lost_inbox += 1,
                }
            }
        }
        dup_inbox += have.values().sum::<usize>();
    }
    let left_in_new: usize = POSTERS
        .iter()
        .map(|p| names(&root.sandbox(p).outbox().sub(Sub::New)).len())
        .sum();
    let claimed: usize = POSTERS
        .iter()
        .map(|p| names(&root.sandbox(p).outbox().sub(Sub::Cur)).len())
        .sum();
    let quarantined = names(&root.quarantine().sub(Sub::New)).len();
    let to_nobody = expected.values().filter(|(_, to)| to.is_empty()).count();
    let audit = super::mediate_logged::audit(&root);

    println!(
        "kill storm: seed={} kills={kills} messages={} inbox_copies={copies} storm={:.1}s routed_during_storm={routed_in_storm} \
         tmp_files_left_by_kills={interrupted} resume_events_after_kills={resumed} \
         lost_log={lost_log} duplicated_log={dup_log} lost_inbox={lost_inbox} duplicated_inbox={dup_inbox} \
         torn={torn} left_in_outbox_new={left_in_new} claimed={claimed} \
         planted_bad={PLANTED} quarantined={quarantined} quarantine_entries={quarantine_entries} \
         to_nobody={to_nobody} audit_claimed={} audit_decided={} audit_refused={}",
        seeded::seed(),
        expected.len(),
        storm.as_secs_f64(),
        audit.claimed,
        audit.decided,
        audit.refused
    );
    assert!(kills >= MIN_KILLS);
    assert_eq!(expected.len(), POSTERS.len() * PER_POSTER);
    assert_eq!((lost_log, dup_log, wrong_action), (0, 0, 0));
    assert_eq!((lost_inbox, dup_inbox, torn), (0, 0, 0));
    assert_eq!((left_in_new, claimed), (0, expected.len()));
    assert_eq!((quarantined, quarantine_entries), (PLANTED, PLANTED));
    assert!(to_nobody > 0);
    assert_eq!(
        (audit.claimed, audit.decided, audit.refused),
        (expected.len(), expected.len(), 0),
        "{audit:?}"
    );
    // Passed: the evidence is not needed any more.
    let _ = std::fs::remove_dir_all(root.dir.parent().unwrap());
}
