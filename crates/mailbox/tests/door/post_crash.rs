//! Durability and concurrency figures for lw-post (mailbox-spec.md, GUARANTEES).
//!
//! `post_survives_sigkill_at_random_moments`: lw-post is killed with SIGKILL
//! at random moments while a checker reads every file that appears in `new/`.
//! Every post that exited 0 must be in `new/` intact, and no file in `new/` may
//! ever be partial.  `sixteen_posters_times_500` posts 8,000 messages from 16
//! concurrent posters into one outbox.

use support::seeded;

use support::common;

use std::collections::{HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use mailbox::message::Message;

/// Reads every file that shows up in `dir` until `stop`, counting the ones
/// that do not parse.  Returns (files checked, partial files seen).
fn checker(dir: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(usize, Vec<String>)> {
    std::thread::spawn(move || {
        let mut seen = HashSet::new();
        let mut partial = Vec::new();
        loop {
            let last = stop.load(Ordering::SeqCst);
            for name in ls(&dir) {
                if seen.contains(&name) {
                    continue;
                }
                let bytes = std::fs::read(dir.join(&name)).unwrap();
                if let Err(e) = Message::parse(&bytes) {
                    partial.push(format!("{name}: {e} ({} bytes)", bytes.len()));
                }
                seen.insert(name);
            }
            if last {
                return (seen.len(), partial);
            }
        }
    })
}

fn rand_below(n: u64) -> u64 {
    seeded::below(n)
}

#[test]
fn post_survives_sigkill_at_random_moments() {
    let t = TempDir::new("crash");
    let mb = t.join("api");
    std::fs::create_dir_all(&mb).unwrap();
    let post = |subject: &str| {
        lw_post()
            .arg("-m")
            .arg(&mb)
            .args(["-k", "status", "-s", subject, "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    // Calibrate: how long one post takes here, so kills land across its whole life.
    let t0 = Instant::now();
    for i in 0..20 {
        let mut c = post(&format!("warm{i}"));
        drop(c.stdin.take());
        assert!(c.wait().unwrap().success());
    }
    let life_us = (t0.elapsed().as_micros() / 20).max(200) as u64;

    let stop = Arc::new(AtomicBool::new(false));
    let check = checker(mb.join("outbox/new"), stop.clone());
    let (mut rounds, mut killed, mut exited_ok) = (0, 0, Vec::new());
    // At least 300 posts and at least 200 of them killed (capped, in case kills never land).
    while (rounds < 300 || killed < 200) && rounds < 2000 {
        let i = rounds;
        rounds += 1;
        let body = "z".repeat(rand_below(200_000) as usize);
        let mut c = post(&format!("post{i}"));
        let mut stdin = c.stdin.take().unwrap();
        // Feed the body from a thread so the kill can land mid-read too.
        let feeder = std::thread::spawn(move || {
            use std::io::Write;
            let _ = stdin.write_all(body.as_bytes());
        });
        std::thread::sleep(Duration::from_micros(rand_below(life_us * 2)));
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(c.id() as i32).unwrap(),
            rustix::process::Signal::KILL,
        );
        let o = c.wait_with_output().unwrap();
        feeder.join().unwrap();
        match (o.status.code(), o.status.signal()) {
            (Some(0), _) => {
                exited_ok.push((i, String::from_utf8(o.stdout).unwrap().trim().to_string()))
            }
            (_, Some(9)) => killed += 1,
            other => panic!("post {i} ended unexpectedly: {other:?}"),
        }
    }
    stop.store(true, Ordering::SeqCst);
    let (checked, partial) = check.join().unwrap();

    let new = mb.join("outbox/new");
    let present: HashSet<String> = ls(&new).into_iter().collect();
    let mut lost = 0;
    for (i, id) in &exited_ok {
        match std::fs::read(new.join(id)) {
            Ok(bytes) => assert_eq!(Message::parse(&bytes).unwrap().subject, format!("post{i}")),
            Err(_) => lost += 1,
        }
    }
    let tmp_left = ls(&mb.join("outbox/tmp")).len();
    println!(
        "lw-post kill storm (seed {}): {rounds} posts, {killed} killed by SIGKILL, {} exited 0, {lost} of those lost, \
         {} files in new/ checked while running, {} partial files seen in new/, {tmp_left} stray files in tmp/",
        seeded::seed(),
        exited_ok.len(),
        checked,
        partial.len()
    );
    assert!(
        killed >= 200,
        "only {killed} posts were killed; the storm needs at least 200"
    );
    assert_eq!(lost, 0);
    assert!(partial.is_empty(), "partial files in new/: {partial:?}");
    for name in &present {
        Message::parse(&std::fs::read(new.join(name)).unwrap())
            .expect("every file in new/ is whole");
    }
}

fn post_many(
    mb: &Path,
    poster: usize,
    n: usize,
    failures: &AtomicUsize,
    why: &Mutex<Vec<String>>,
) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let o = lw_post()
            .arg("-m")
            .arg(mb)
            .args(["-k", "status", "-s", &format!("p{poster}-{i}"), "body"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        if o.status.success() {
            ids.push(String::from_utf8(o.stdout).unwrap().trim().to_string());
        } else {
            failures.fetch_add(1, Ordering::SeqCst);
            why.lock().unwrap().push(format!(
                "p{poster}-{i}: {}: {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
    }
    ids
}

#[test]
fn sixteen_posters_times_500() {
    let t = TempDir::new("conc");
    let mb = t.join("api");
    std::fs::create_dir_all(&mb).unwrap();
    let failures = Arc::new(AtomicUsize::new(0));
    let all = Arc::new(Mutex::new(Vec::new()));
    let why = Arc::new(Mutex::new(Vec::new()));
    let t0 = Instant::now();
    let threads: Vec<_> = (0..16)
        .map(|p| {
            let (mb, failures, all, why) = (mb.clone(), failures.clone(), all.clone(), why.clone());
            std::thread::spawn(move || {
                let ids = post_many(&mb, p, 500, &failures, &why);
                all.lock().unwrap().extend(ids);
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let printed = all.lock().unwrap().clone();
    let names = ls(&mb.join("outbox/new"));
    let mut subjects: HashMap<String, usize> = HashMap::new();
    let mut unparsable = 0;
    for n in &names {
        match Message::parse(&std::fs::read(mb.join("outbox/new").join(n)).unwrap()) {
            Ok(m) => *subjects.entry(m.subject).or_default() += 1,
            Err(_) => unparsable += 1,
        }
    }
    let unique: HashSet<_> = printed.iter().collect();
    println!(
        "16 posters x 500 posts in {:.1}s: {} exited 0, {} failed, {} files in new/, {} unique ids, {} distinct subjects, {} unparsable",
        t0.elapsed().as_secs_f64(),
        printed.len(),
        failures.load(Ordering::SeqCst),
        names.len(),
        unique.len(),
        subjects.len(),
        unparsable
    );
    let why = why.lock().unwrap();
    assert!(why.is_empty(), "posts that failed: {why:#?}");
    assert_eq!(failures.load(Ordering::SeqCst), 0);
    assert_eq!(names.len(), 8000);
    assert_eq!(unique.len(), 8000);
    assert_eq!(subjects.len(), 8000);
    assert!(subjects.values().all(|&c| c == 1));
    assert_eq!(unparsable, 0);
    let names: HashSet<_> = names.iter().collect();
    assert!(
        printed.iter().all(|id| names.contains(id)),
        "every printed id names a file"
    );
}
