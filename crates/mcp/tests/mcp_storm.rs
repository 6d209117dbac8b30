//! lw-mcp under load and under SIGKILL, driven by the Python SDK: 8 clients
//! post 200 messages each at once (1,600 delivered, none lost, none twice),
//! and lw-mcp is killed with SIGKILL at seeded random moments during 500
//! posts (every post whose result reached the client is in the outbox, and
//! no post is there twice).  Both print their figures; the kill test prints
//! its seed (LW_SEED=N replays it).

use support::mcp as mcp_support;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mailbox::maildir::{Found, Maildir, Sub};
use mcp_support::*;

/// Every message in the outbox (new/ and cur/), by subject: their ids.
fn outbox_subjects(root: &Root, name: &str) -> (HashMap<String, Vec<String>>, usize) {
    let md = Maildir::new(root.mailbox(name).join("outbox"));
    let mut by = HashMap::<String, Vec<String>>::new();
    let mut bad = 0;
    for sub in [Sub::New, Sub::Cur] {
        for e in md.scan(sub).expect("the outbox is readable") {
            match e.found {
                Found::Message(m) => by.entry(m.subject).or_default().push(m.id),
                _ => bad += 1,
            }
        }
    }
    (by, bad)
}

fn server_env(root: &Root) -> Vec<(String, String)> {
    let mut env = root.env("api");
    env.push(("LW_MCP_RATE".into(), "off".into()));
    env
}

#[test]
fn eight_clients_post_200_each_at_once_and_all_1600_arrive_once() {
    let root = Root::new("storm");
    root.register("api", "lw/api", &[]);
    let env = server_env(&root);
    let t0 = Instant::now();
    let children: Vec<_> = (0..8)
        .map(|c| {
            let mut cmd = Command::new(python());
            cmd.arg(client_script())
                .args(["posts", "--count", "200", "--tag", &format!("c{c}")])
                .arg("--")
                .arg(bin("lw-mcp"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in &env {
                cmd.env(k, v);
            }
            cmd.spawn().expect("the python client starts")
        })
        .collect();
    let mut returned = Vec::new();
    let mut lat = Vec::new();
    for ch in children {
        let o = ch.wait_with_output().expect("client output");
        let r = report(&o);
        assert!(
            r.get("client_error").is_none() && r.get("stopped").is_none(),
            "{r}"
        );
        assert!(r.get("refused").is_none(), "rate is off: {r}");
        for id in r["ids"].as_array().expect("ids") {
            returned.push(id.as_str().expect("id").to_string());
        }
        lat.extend(
            r["latency_ms"]
                .as_array()
                .expect("latencies")
                .iter()
                .filter_map(|v| v.as_f64()),
        );
    }
    let took = t0.elapsed();
    let (by, bad) = outbox_subjects(&root, "api");
    let files: usize = by.values().map(Vec::len).sum();
    let twice: Vec<_> = by.iter().filter(|(_, ids)| ids.len() > 1).collect();
    let on_disk: HashSet<&String> = by.values().flatten().collect();
    let lost: Vec<_> = returned.iter().filter(|id| !on_disk.contains(id)).collect();
    lat.sort_by(f64::total_cmp);
    println!(
        "8 clients x 200 posts: {} results, {files} files, {} lost, {} twice, {bad} unreadable; \
         {:.1}s ({:.0} posts/s), call latency p50 {:.2} ms p99 {:.2} ms",
        returned.len(),
        lost.len(),
        twice.len(),
        took.as_secs_f64(),
        files as f64 / took.as_secs_f64(),
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100]
    );
    assert_eq!(returned.len(), 1600);
    assert_eq!(files, 1600);
    assert!(lost.is_empty() && twice.is_empty() && bad == 0);
    assert!(ls(&root.mailbox("api").join("outbox/tmp")).is_empty());
}

/// xorshift64*: enough randomness for kill moments, replayable from a seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The pid of `parent`'s child process named `comm`, once it exists.
fn child_named(parent: u32, comm: &str, limit: Duration) -> Option<i32> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        for e in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // pid (comm) state ppid ...
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let name = &stat[open + 1..close];
            let mut rest = stat[close + 2..].split_whitespace();
            let (state, ppid) = (rest.next(), rest.next());
            if name == comm && state != Some("Z") && ppid == Some(&parent.to_string()) {
                return Some(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

#[test]
fn sigkill_at_random_moments_during_500_posts_loses_no_acknowledged_post() {
    let seed: u64 = std::env::var("LW_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos() as u64
        });
    println!("seed {seed} (LW_SEED={seed} replays the kill moments)");
    let mut rng = Rng(seed | 1);
    let root = Root::new("kill");
    root.register("api", "lw/api", &[]);
    let env = server_env(&root);
    const TOTAL: usize = 500;
    // One client posts all 500, starting a new lw-mcp whenever the one in
    // use dies; this thread kills each at a random moment.
    let mut cmd = Command::new(python());
    cmd.arg(client_script())
        .args(["killposts", "--tag", "kill", "--count", &TOTAL.to_string()])
        .arg("--")
        .arg(bin("lw-mcp"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in &env {
        cmd.env(k, v);
    }
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("the python client starts");
    let client_pid = child.id();
    let stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let ["got", i, id] = l.split_whitespace().collect::<Vec<_>>().as_slice() {
                got.push((i.parse::<usize>().expect("index"), id.to_string()));
            }
        }
        got
    });
    let mut kills = 0;
    while child.try_wait().expect("wait").is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(900),
            "the client made no progress"
        );
        let Some(pid) = child_named(client_pid, "lw-mcp", Duration::from_millis(200)) else {
            continue;
        };
        std::thread::sleep(Duration::from_millis(5 + rng.next() % 400));
        if rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).expect("pid > 0"),
            rustix::process::Signal::KILL,
        )
        .is_ok()
        {
            kills += 1;
        }
        // Until the client has reaped it, the killed server is a zombie
        // that child_named skips.
    }
    let out = child.wait_with_output().expect("client output");
    let r = report(&out);
    let received = reader.join().expect("reader");
    let sessions = r["sessions"].as_u64().unwrap_or(0);
    let (by, bad) = outbox_subjects(&root, "api");
    let on_disk: HashMap<&String, &str> = by
        .iter()
        .flat_map(|(subj, ids)| ids.iter().map(move |id| (id, subj.as_str())))
        .collect();
    let lost: Vec<_> = received
        .iter()
        .filter(|(i, id)| on_disk.get(id) != Some(&format!("kill {i}").as_str()))
        .collect();
    let twice: Vec<_> = by.iter().filter(|(_, ids)| ids.len() > 1).collect();
    let files: usize = by.values().map(Vec::len).sum();
    let stray = ls(&root.mailbox("api").join("outbox/tmp")).len();
    println!(
        "kill -9 during {TOTAL} posts: {kills} kills over {sessions} sessions in {:.1}s; \
         {} results received, all {} on disk: {}; {files} messages in the outbox \
         ({} posted whose result was lost), {} twice, {bad} unreadable, {stray} stray tmp file(s)",
        t0.elapsed().as_secs_f64(),
        received.len(),
        received.len() - lost.len(),
        lost.is_empty(),
        files.saturating_sub(received.len()),
        twice.len()
    );
    assert!(kills > 0, "the test killed nothing");
    assert!(lost.is_empty(), "acknowledged posts missing: {lost:?}");
    assert!(twice.is_empty(), "posts delivered twice: {twice:?}");
    assert_eq!(bad, 0, "a half-written message is visible");
    assert!(files <= TOTAL);
}
