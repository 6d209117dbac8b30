//! Parallel creates and kill -9 mid-create: 8 sandboxes at once are 8
//! ready ones with distinct ports and distinct clones; creates killed at
//! random moments leave only what gc reclaims, and gc leaves nothing.
//! Prints its figures.

use support::sandbox as sandbox_support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use sandbox_support::*;

#[test]
fn eight_at_once_are_eight_ready_with_distinct_ports_and_clones() {
    let f = Fixture::with_config("par", "sandbox.ports = 47400-47499\n");
    let names: Vec<String> = (0..8).map(|i| format!("p{i}")).collect();
    let t = Instant::now();
    let children: Vec<_> = names
        .iter()
        .map(|n| {
            f.cmd(&[
                "create",
                n,
                "--branch",
                &format!("task/{n}"),
                "--port",
                "8080",
                "--network",
                "bridge",
                "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
        })
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("wait"))
        .collect();
    let took = t.elapsed();
    let ready = outs.iter().filter(|o| o.status.success()).count();
    for o in &outs {
        assert!(o.status.success(), "{}", err(o));
    }
    let recs: Vec<serde_json::Value> = outs
        .iter()
        .map(|o| serde_json::from_str(text(o).trim()).expect("json"))
        .collect();
    let mut ports: Vec<String> = recs
        .iter()
        .map(|r| r["ports"][0]["host"].as_str().expect("a port").to_string())
        .collect();
    ports.sort();
    ports.dedup();
    // Each commits in its own clone; none sees another's commit.
    let mut heads = Vec::new();
    for n in &names {
        let (code, out, e) = f.sh(
            n,
            &format!("echo {n} > who && git add who && git commit -qm {n} && git rev-parse HEAD"),
        );
        assert_eq!(code, 0, "{e}");
        heads.push(out.trim().to_string());
    }
    let mut seen_elsewhere = 0;
    for (i, n) in names.iter().enumerate() {
        let others: Vec<&str> = heads
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, h)| h.as_str())
            .collect();
        let (_, out, _) = f.sh(
            n,
            &format!(
                "for c in {}; do git cat-file -e $c 2>/dev/null && echo seen; done; true",
                others.join(" ")
            ),
        );
        seen_elsewhere += out.lines().count();
    }
    let mut distinct_heads = heads.clone();
    distinct_heads.sort();
    distinct_heads.dedup();
    let mut vols: Vec<String> = names
        .iter()
        .map(|n| {
            text(&docker(&[
                "inspect",
                "-f",
                "{{range .Mounts}}{{if eq .Destination \"/work\"}}{{.Source}}{{end}}{{end}}",
                &f.container(n),
            ]))
            .trim()
            .to_string()
        })
        .collect();
    vols.sort();
    vols.dedup();
    println!(
        "parallel: 8 creates at once in {:.2}s -> {ready} ready, {} distinct ports, {} distinct clones (workspaces), {} distinct heads, {seen_elsewhere} commits seen by another sandbox",
        took.as_secs_f64(),
        ports.len(),
        vols.len(),
        distinct_heads.len()
    );
    assert_eq!(
        (
            ready,
            ports.len(),
            vols.len(),
            distinct_heads.len(),
            seen_elsewhere
        ),
        (8, 8, 8, 8, 0)
    );
    let mut rm = vec!["rm", "--force"];
    rm.extend(names.iter().map(String::as_str));
    f.ok(&rm);
    assert!(
        f.leftovers().is_empty() && f.host_leftovers().is_empty(),
        "{:?} {:?}",
        f.leftovers(),
        f.host_leftovers()
    );
}

/// A cheap source of jitter, without a dependency.
fn jitter(i: u64, max_ms: u64) -> Duration {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .subsec_nanos() as u64;
    Duration::from_millis((n / 7 + i * 7919) % max_ms)
}

#[test]
fn gc_after_kill_9_mid_create_leaves_nothing_behind() {
    let f = Fixture::with_config(
        "kill",
        "sandbox.ports = 47500-47599\nsandbox.secrets = LW_KILL_SECRET\n",
    );
    // How long a whole create takes here, warm (the first one also pays for
    // cold caches), so the kills land inside it: six creates at once take
    // longer than one alone, so a moment within one create is mid-create.
    let mut whole = u64::MAX;
    for _ in 0..2 {
        let t = Instant::now();
        f.ok(&["create", "probe", "--branch", "probe"]);
        whole = whole.min(t.elapsed().as_millis() as u64);
        f.ok(&["rm", "probe"]);
    }
    let mut kills = 0;
    let mut finished = 0;
    for round in 0..3u64 {
        let mut children: Vec<_> = (0..6u64)
            .map(|i| {
                let n = format!("k{round}{i}");
                f.cmd(&[
                    "create",
                    &n,
                    "--branch",
                    &n,
                    "--port",
                    "80",
                    "--network",
                    "bridge",
                    "--secret",
                    "LW_KILL_SECRET",
                ])
                .env("LW_KILL_SECRET", "x")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn")
            })
            .collect();
        let start = Instant::now();
        for (i, c) in children.iter_mut().enumerate() {
            let at = jitter(round * 10 + i as u64, whole.max(50));
            if let Some(rest) = at.checked_sub(start.elapsed()) {
                std::thread::sleep(rest);
            }
            match c.try_wait().expect("try_wait") {
                Some(_) => finished += 1,
                None => {
                    c.kill().expect("SIGKILL");
                    kills += 1;
                }
            }
            let _ = c.wait();
        }
    }
    let before_engine = f.leftovers().len();
    let before_host = f.host_leftovers().len();
    let gc = f.ok(&["gc"]);
    let reclaimed = gc.lines().count();
    // What survived a finished create is a real sandbox: only those may stay.
    let ls = f.ok(&["ls", "--no-header"]);
    let live: Vec<&str> = ls.lines().filter_map(|l| l.split('\t').next()).collect();
    for l in ls.lines() {
        assert!(
            l.contains("\trunning\t"),
            "a survivor is a whole sandbox: {l}"
        );
    }
    if !live.is_empty() {
        let mut rm = vec!["rm", "--force"];
        rm.extend(live.iter().copied());
        f.ok(&rm);
    }
    let (after_engine, after_host) = (f.leftovers(), f.host_leftovers());
    println!(
        "kill -9 mid-create: {kills} kills, {finished} finished first; before gc: {before_engine} engine objects, \
         {before_host} host entries; gc reclaimed {reclaimed} things; after gc and rm of the {} finished: \
         {} engine objects, {} host entries left",
        live.len(),
        after_engine.len(),
        after_host.len()
    );
    assert!(kills > 0, "no create was killed mid-way");
    assert!(
        after_engine.is_empty(),
        "engine leftovers: {after_engine:?}"
    );
    assert!(after_host.is_empty(), "host leftovers: {after_host:?}");
    // A name whose create was killed can be used again.
    f.ok(&["create", "k00", "--branch", "k00"]);
    f.ok(&["rm", "k00"]);
}
