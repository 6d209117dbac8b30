//! lw-mirror against git itself: ref lists compared with `git clone
//! --mirror`, `git fsck`, clones that borrow objects through `--reference`,
//! concurrent syncs counted at the upstream, killed syncs, bad URLs and
//! credentials served over HTTP on 127.0.0.1.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::common::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_lw-mirror");

/// git with no user or system configuration, a fixed identity and `main`.
fn git_cmd(dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "T")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "T")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .env_remove("GIT_CONFIG_COUNT")
        .args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "protocol.file.allow=always",
        ]);
    c
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = git_cmd(dir).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn lw(dir: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("LW_MIRROR")
        .env_remove("GIT_CONFIG_COUNT")
        .stdin(Stdio::null());
    c
}

fn run(c: &mut Command) -> Output {
    c.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// An upstream with two branches, a tag, a note and a pull-request ref.
fn upstream(t: &TempDir) -> PathBuf {
    let up = t.join("up");
    fs::create_dir(&up).unwrap();
    git(&up, &["init", "-q"]);
    for i in 0..3 {
        fs::write(up.join("f"), format!("{i}\n")).unwrap();
        git(&up, &["add", "f"]);
        git(&up, &["commit", "-q", "-m", &format!("c{i}")]);
    }
    git(&up, &["tag", "-a", "-m", "v1", "v1"]);
    git(&up, &["branch", "feature", "HEAD~1"]);
    git(&up, &["branch", "doomed", "HEAD~2"]);
    git(&up, &["notes", "add", "-m", "note", "HEAD"]);
    git(&up, &["update-ref", "refs/pull/1/head", "HEAD~1"]);
    up
}

fn commit(repo: &Path, branch: &str, msg: &str) -> String {
    git(repo, &["checkout", "-q", branch]);
    fs::write(repo.join(msg), msg).unwrap();
    git(repo, &["add", msg]);
    git(repo, &["commit", "-q", "-m", msg]);
    git(repo, &["rev-parse", "HEAD"]).trim().to_string()
}

fn refs(git_dir: &Path) -> BTreeSet<String> {
    git(
        git_dir,
        &["for-each-ref", "--format=%(objectname) %(refname)"],
    )
    .lines()
    .map(String::from)
    .collect()
}

fn head(git_dir: &Path) -> String {
    git(git_dir, &["symbolic-ref", "HEAD"])
}

fn fsck(repo: &Path) {
    let out = git_cmd(repo)
        .args(["fsck", "--full", "--strict", "--no-dangling"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fsck {}: {}{}",
        repo.display(),
        text(&out.stdout),
        text(&out.stderr)
    );
}

fn reference_clone(t: &TempDir, mirror: &Path, up: &Path, name: &str) -> PathBuf {
    let dst = t.join(name);
    git(
        t.path(),
        &[
            "clone",
            "-q",
            "--reference",
            mirror.to_str().unwrap(),
            up.to_str().unwrap(),
            dst.to_str().unwrap(),
        ],
    );
    dst
}

/// Every file under `dir` with its contents, to show that nothing changed.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut all = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                all.push((p.clone(), fs::read(&p).unwrap()));
            }
        }
    }
    all.sort();
    all
}

fn sync_ok(dir: &Path, args: &[&str]) -> String {
    let out = run(lw(dir).arg("sync").args(args));
    assert!(
        out.status.success(),
        "lw-mirror sync {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[test]
fn first_sync_has_the_refs_and_head_of_git_clone_mirror_and_fsck_is_clean() {
    let t = TempDir::outside_repo("refs");
    let up = upstream(&t);
    git(&up, &["symbolic-ref", "HEAD", "refs/heads/feature"]);
    let proj = t.join("proj");
    git(
        t.path(),
        &["clone", "-q", up.to_str().unwrap(), proj.to_str().unwrap()],
    );

    let out = run(lw(&proj).arg("sync"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "", "quiet when stderr is not a terminal");
    let printed = text(&out.stdout);
    let mirror = proj.join(".loopwright/cache/mirror.git");
    assert_eq!(printed, format!("{}\n", mirror.display()));

    let reference = t.join("reference.git");
    git(
        t.path(),
        &[
            "clone",
            "-q",
            "--mirror",
            up.to_str().unwrap(),
            reference.to_str().unwrap(),
        ],
    );
    assert_eq!(refs(&mirror), refs(&reference));
    assert_eq!(head(&mirror), head(&reference));
    assert_eq!(head(&mirror), "refs/heads/feature\n");
    fsck(&mirror);
    // The project's checkout does not see the cache.
    assert_eq!(git(&proj, &["status", "--porcelain", "--ignored=no"]), "");

    let clone = reference_clone(&t, &mirror, &up, "clone");
    fsck(&clone);
    let alternates = fs::read_to_string(clone.join(".git/objects/info/alternates")).unwrap();
    assert_eq!(alternates.trim(), mirror.join("objects").to_str().unwrap());
}

#[test]
fn deleted_and_force_pushed_branches_keep_their_objects_and_old_clones_stay_whole() {
    let t = TempDir::outside_repo("prune");
    let up = upstream(&t);
    let m = t.join("m.git");
    let ms = m.to_str().unwrap();
    let doomed_tip = commit(&up, "doomed", "only-on-doomed");
    let old_feature = commit(&up, "feature", "rewritten-away");
    git(&up, &["checkout", "-q", "main"]);
    sync_ok(t.path(), &[up.to_str().unwrap(), "--mirror", ms]);

    // Clones that borrow from the mirror, made before the upstream rewrites history.
    let old_ref = reference_clone(&t, &m, &up, "old-reference");
    git(&old_ref, &["checkout", "-q", "doomed"]);
    git(&old_ref, &["checkout", "-q", "feature"]);
    let old_shared = t.join("old-shared");
    git(
        t.path(),
        &["clone", "-q", "--shared", ms, old_shared.to_str().unwrap()],
    );
    git(&old_shared, &["checkout", "-q", "doomed"]);

    // Upstream deletes a branch, force-pushes another, and drops the objects.
    git(&up, &["branch", "-D", "doomed"]);
    git(&up, &["branch", "-f", "feature", "main~1"]);
    let new_feature = commit(&up, "feature", "new-feature-work");
    git(&up, &["checkout", "-q", "main"]);
    git(&up, &["reflog", "expire", "--expire=now", "--all"]);
    git(&up, &["gc", "-q", "--prune=now"]);
    assert!(
        !git_cmd(&up)
            .args(["cat-file", "-e", &doomed_tip])
            .status()
            .unwrap()
            .success()
    );

    assert_eq!(sync_ok(t.path(), &["--mirror", ms]), format!("{ms}\n"));

    // Every upstream ref is as in a fresh `git clone --mirror`; the only extra is the deleted branch.
    let fresh = t.join("fresh.git");
    git(
        t.path(),
        &[
            "clone",
            "-q",
            "--mirror",
            up.to_str().unwrap(),
            fresh.to_str().unwrap(),
        ],
    );
    let (mine, theirs) = (refs(&m), refs(&fresh));
    assert!(
        theirs.is_subset(&mine),
        "missing: {:?}",
        theirs.difference(&mine).collect::<Vec<_>>()
    );
    let extra: Vec<_> = mine.difference(&theirs).cloned().collect();
    assert_eq!(extra, vec![format!("{doomed_tip} refs/heads/doomed")]);
    assert!(mine.contains(&format!("{new_feature} refs/heads/feature")));

    for obj in [&doomed_tip, &old_feature] {
        git(&m, &["cat-file", "-e", obj]);
    }
    fsck(&m);
    fsck(&old_ref);
    fsck(&old_shared);

    // Even a gc run by hand keeps the force-pushed tip: the mirror's reflog holds it.
    git(&m, &["gc", "-q", "--prune=now"]);
    git(&m, &["cat-file", "-e", &old_feature]);
    fsck(&old_ref);
    git(&old_ref, &["log", "-q", "--format=%H", &old_feature]);

    let new_clone = reference_clone(&t, &m, &up, "new-reference");
    fsck(&new_clone);
    assert_eq!(
        git(&new_clone, &["rev-parse", "origin/feature"]).trim(),
        new_feature
    );
}

#[test]
fn a_kept_deleted_branch_that_blocks_a_new_upstream_ref_is_moved_aside() {
    let t = TempDir::outside_repo("df");
    let up = upstream(&t);
    let m = t.join("m.git");
    let ms = m.to_str().unwrap();
    git(&up, &["branch", "dir/old", "main~1"]);
    sync_ok(t.path(), &[up.to_str().unwrap(), "--mirror", ms]);
    let doomed = git(&m, &["rev-parse", "refs/heads/doomed"]);
    let dir_old = git(&m, &["rev-parse", "refs/heads/dir/old"]);
    // Upstream replaces branch `doomed` by `doomed/next`, and `dir/old` by `dir`.
    git(&up, &["branch", "-D", "doomed", "dir/old"]);
    git(&up, &["branch", "doomed/next", "main"]);
    git(&up, &["branch", "dir", "main"]);
    sync_ok(t.path(), &["--mirror", ms]);

    let fresh = t.join("fresh.git");
    git(
        t.path(),
        &[
            "clone",
            "-q",
            "--mirror",
            up.to_str().unwrap(),
            fresh.to_str().unwrap(),
        ],
    );
    let (mine, theirs) = (refs(&m), refs(&fresh));
    let extra: BTreeSet<_> = mine.difference(&theirs).cloned().collect();
    assert!(theirs.is_subset(&mine));
    assert_eq!(
        extra,
        BTreeSet::from([
            format!("{} refs/lw-mirror/deleted/heads/dir/old", dir_old.trim()),
            format!("{} refs/lw-mirror/deleted/heads/doomed", doomed.trim()),
        ])
    );
    fsck(&m);
}

#[test]
fn unreachable_or_wrong_url_exits_69_and_leaves_the_mirror_untouched() {
    let t = TempDir::outside_repo("bad-url");
    let up = upstream(&t);
    let m = t.join("m.git");
    let ms = m.to_str().unwrap();
    sync_ok(t.path(), &[up.to_str().unwrap(), "--mirror", ms]);
    let before = snapshot(&m);
    let not_a_repo = t.join("plain-dir");
    fs::create_dir(&not_a_repo).unwrap();
    // Port 1 on loopback: nothing listens there.
    let urls = [
        t.join("nowhere").to_str().unwrap().to_string(),
        not_a_repo.to_str().unwrap().to_string(),
        "http://127.0.0.1:1/x.git".to_string(),
    ];
    for url in &urls {
        let out = run(lw(t.path()).args(["sync", url, "--mirror", ms]));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{url}: {err}");
        assert!(err.starts_with("lw-mirror: cannot fetch from '"), "{err}");
        assert!(err.contains(url.as_str()), "{err}");
        assert_eq!(out.stdout, b"");
    }
    // The upstream URL of the failed syncs was never written down either:
    // the mirror's config, state, refs and objects are byte for byte the same.
    assert_eq!(snapshot(&m), before);
    fsck(&m);

    // A first sync from a wrong URL leaves nothing behind.
    let m2 = t.join("m2.git");
    let out = run(lw(t.path()).args([
        "sync",
        not_a_repo.to_str().unwrap(),
        "--mirror",
        m2.to_str().unwrap(),
    ]));
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    assert!(!m2.exists());
    let left: Vec<_> = fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn outside_a_repository_and_foreign_or_damaged_paths_are_refused_with_the_fix() {
    let t = TempDir::outside_repo("refuse");
    let up = upstream(&t);
    let plain = t.join("plain");
    fs::create_dir(&plain).unwrap();

    let out = run(lw(&plain).arg("sync"));
    assert_eq!(out.status.code(), Some(64));
    assert!(
        text(&out.stderr)
            .contains("is not inside a git repository; run in the project, or name the mirror")
    );

    // A project without origin and without a URL.
    let lonely = t.join("lonely");
    fs::create_dir(&lonely).unwrap();
    git(&lonely, &["init", "-q"]);
    let out = run(lw(&lonely).arg("sync"));
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("has no remote 'origin'"));

    // A directory that is not a mirror is never touched.
    fs::write(plain.join("precious"), "data").unwrap();
    let out = run(lw(t.path()).args([
        "sync",
        up.to_str().unwrap(),
        "--mirror",
        plain.to_str().unwrap(),
    ]));
    assert_eq!(out.status.code(), Some(73), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("is not a mirror made by lw-mirror"));
    assert_eq!(fs::read_dir(&plain).unwrap().count(), 1);
    let out = run(lw(t.path()).args(["status", "--mirror", plain.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(66), "{}", text(&out.stderr));

    // A mirror whose state file is garbage is explained, not rebuilt over.
    let m = t.join("m.git");
    sync_ok(
        t.path(),
        &[up.to_str().unwrap(), "--mirror", m.to_str().unwrap()],
    );
    fs::write(m.join("lw-mirror.state"), "nonsense\n").unwrap();
    for sub in ["sync", "status"] {
        let out = run(lw(t.path()).args([sub, "--mirror", m.to_str().unwrap()]));
        assert_eq!(out.status.code(), Some(65), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("is damaged"),
            "{}",
            text(&out.stderr)
        );
        assert!(text(&out.stderr).contains("run lw-mirror sync to rebuild it"));
    }

    let out = run(lw(t.path()).args(["status", "--mirror", t.join("none.git").to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(66));
    assert!(text(&out.stderr).contains("no mirror at"));

    let out = run(lw(t.path()).args(["sync", "--if-older-than", "soon", "--mirror", "x"]));
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).starts_with("lw-mirror: "));
}

/// An upload-pack wrapper that counts its runs in `count`, and on run number
/// `block_at` reports on the fifo `started` and blocks.
fn counting_upload_pack(t: &TempDir, block_at: u32) -> (PathBuf, PathBuf, PathBuf) {
    let count = t.join("upload-pack-count");
    let started = t.join("started.fifo");
    let gate = t.join("gate.fifo");
    for f in [&started, &gate] {
        assert!(Command::new("mkfifo").arg(f).status().unwrap().success());
    }
    let script = t.join("upload-pack");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\nn=$(cat '{c}' 2>/dev/null || echo 0)\nn=$((n+1))\necho $n > '{c}'\n\
             if [ $n -eq {block_at} ]; then echo started > '{s}'; read x < '{g}'; fi\nexec git-upload-pack \"$@\"\n",
            c = count.display(),
            s = started.display(),
            g = gate.display()
        ),
    )
    .unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .unwrap();
    (script, count, started)
}

fn uploads(count: &Path) -> u32 {
    fs::read_to_string(count)
        .map(|s| s.trim().parse().unwrap())
        .unwrap_or(0)
}

fn with_upload_pack(c: &mut Command, script: &Path) {
    c.env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "remote.origin.uploadpack")
        .env("GIT_CONFIG_VALUE_0", script);
}

/// Holds the mirror's lock, as a running sync would.
fn hold_lock(m: &Path) -> File {
    let lock = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(m.with_extension("git.lock"))
        .unwrap();
    lock.lock().unwrap();
    lock
}

/// Spawns `lw-mirror sync --progress` and reads its stderr up to the line
/// that says it waits for the lock.
// The child is returned to the caller, who waits for it.
#[allow(clippy::zombie_processes)]
fn spawn_waiting(
    dir: &Path,
    args: &[&str],
    script: &Path,
) -> (Child, BufReader<std::process::ChildStderr>) {
    let mut c = lw(dir);
    c.arg("sync")
        .arg("--progress")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    with_upload_pack(&mut c, script);
    let mut child = c.spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "sync ended before waiting"
        );
        if line.contains("waiting for another sync") {
            return (child, err);
        }
    }
}

#[test]
fn concurrent_syncs_make_one_fetch_and_all_succeed() {
    const N: usize = 6;
    let t = TempDir::outside_repo("concurrent");
    let up = upstream(&t);
    let (script, count, _) = counting_upload_pack(&t, 0);
    let m = t.join("m.git");
    let ms = m.to_str().unwrap();
    let url = up.to_str().unwrap();

    for (round, expect_runs) in [("create", 2), ("fetch", 1)] {
        if round == "fetch" {
            commit(&up, "main", "new-upstream-commit");
        }
        let before = uploads(&count);
        let lock = hold_lock(&m);
        let waiting: Vec<_> = (0..N)
            .map(|_| spawn_waiting(t.path(), &[url, "--mirror", ms, "--json"], &script))
            .collect();
        drop(lock);
        let mut outcomes = Vec::new();
        for (child, mut err) in waiting {
            let mut rest = String::new();
            err.read_to_string(&mut rest).unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{rest}");
            let rec: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(rec["path"], ms);
            outcomes.push(rec["outcome"].as_str().unwrap().to_string());
        }
        let runs = uploads(&count) - before;
        let leaders = outcomes.iter().filter(|o| *o != "waited").count();
        println!(
            "{round}: {N} syncs at once -> {leaders} fetched, {} waited, upload-pack runs {runs}",
            N - leaders
        );
        assert_eq!(leaders, 1, "{outcomes:?}");
        assert_eq!(
            runs, expect_runs,
            "ls-remote + fetch on create, one fetch after"
        );
        fsck(&m);
        assert_eq!(refs(&m), {
            let fresh = t.join(format!("fresh-{round}.git"));
            git(
                t.path(),
                &["clone", "-q", "--mirror", url, fresh.to_str().unwrap()],
            );
            refs(&fresh)
        });
    }
}

#[test]
fn if_older_than_returns_at_once_when_fresh_even_while_a_sync_runs() {
    let t = TempDir::outside_repo("fresh");
    let up = upstream(&t);
    let (script, count, _) = counting_upload_pack(&t, 0);
    let m = t.join("m.git");
    let ms = m.to_str().unwrap();
    let url = up.to_str().unwrap();
    let mut c = lw(t.path());
    with_upload_pack(c.args(["sync", url, "--mirror", ms]), &script);
    assert!(run(&mut c).status.success());
    let runs = uploads(&count);

    let _lock = hold_lock(&m);
    let mut c = lw(t.path());
    with_upload_pack(
        c.args([
            "sync",
            url,
            "--mirror",
            ms,
            "--if-older-than",
            "1h",
            "--json",
        ]),
        &script,
    );
    let out = run(&mut c);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!("{{\"outcome\":\"fresh\",\"path\":\"{ms}\",\"type\":\"sync\"}}\n")
    );
    assert_eq!(uploads(&count), runs);
    drop(_lock);

    // Zero means "always fetch".
    let mut c = lw(t.path());
    with_upload_pack(
        c.args([
            "sync",
            url,
            "--mirror",
            ms,
            "--if-older-than",
            "0s",
            "--json",
        ]),
        &script,
    );
    let out = run(&mut c);
    assert!(
        text(&out.stdout).contains("\"outcome\":\"fetched\""),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(uploads(&count), runs + 1);
}

#[test]
fn a_killed_first_sync_leaves_a_temporary_directory_that_the_next_sync_replaces() {
    let t = TempDir::outside_repo("killed");
    let up = upstream(&t);
    // Run 1 is ls-remote, run 2 the fetch: kill in the middle of the fetch.
    let (script, _count, started) = counting_upload_pack(&t, 2);
    let m = t.join("m.git");
    let mut c = lw(t.path());
    c.args([
        "sync",
        up.to_str().unwrap(),
        "--mirror",
        m.to_str().unwrap(),
    ])
    .process_group(0);
    with_upload_pack(&mut c, &script);
    let child = c.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(File::open(&started).unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "started\n");
    // SIGKILL to the whole group: lw-mirror, git fetch and the upload-pack.
    rustix::process::kill_process_group(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.code().is_none(), "killed by a signal");
    let leftovers = |_: ()| -> Vec<String> {
        fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("m.git.tmp-"))
            .collect()
    };
    let before = leftovers(());
    assert_eq!(
        before.len(),
        1,
        "the half-made mirror is in a temporary directory"
    );
    assert!(!m.exists(), "nothing half-made at the mirror's path");
    let out = run(lw(t.path()).args(["status", "--mirror", m.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(66));

    sync_ok(
        t.path(),
        &[up.to_str().unwrap(), "--mirror", m.to_str().unwrap()],
    );
    let after = leftovers(());
    println!(
        "kills 1, leftovers before {}, after {}",
        before.len(),
        after.len()
    );
    assert!(after.is_empty(), "{after:?}");
    fsck(&m);
    let fresh = t.join("fresh.git");
    git(
        t.path(),
        &[
            "clone",
            "-q",
            "--mirror",
            up.to_str().unwrap(),
            fresh.to_str().unwrap(),
        ],
    );
    assert_eq!(refs(&m), refs(&fresh));
}

#[test]
fn a_stale_ref_lock_from_a_killed_fetch_does_not_stop_the_next_sync() {
    let t = TempDir::outside_repo("stale-lock");
    let up = upstream(&t);
    let m = t.join("m.git");
    let ms = m.to_str().unwrap();
    sync_ok(t.path(), &[up.to_str().unwrap(), "--mirror", ms]);
    fs::write(m.join("refs/heads/main.lock"), "").unwrap();
    let tip = commit(&up, "main", "after-the-crash");
    sync_ok(t.path(), &["--mirror", ms]);
    assert_eq!(git(&m, &["rev-parse", "refs/heads/main"]).trim(), tip);
    assert!(!m.join("refs/heads/main.lock").exists());
}

#[test]
fn status_reports_url_refs_size_and_last_fetch() {
    let t = TempDir::outside_repo("status");
    let up = upstream(&t);
    let proj = t.join("proj");
    git(
        t.path(),
        &["clone", "-q", up.to_str().unwrap(), proj.to_str().unwrap()],
    );
    fs::create_dir(proj.join(".loopwright")).unwrap();
    fs::write(
        proj.join(".loopwright/config"),
        "# where the mirror lives\nmirror.path = ../elsewhere.git\n",
    )
    .unwrap();
    sync_ok(&proj, &["-q"]);
    let m = t.join("elsewhere.git");
    let out = run(lw(&proj).arg("path"));
    assert_eq!(
        text(&out.stdout),
        format!("{}\n", proj.join("../elsewhere.git").display())
    );

    // $LW_MIRROR comes before the configuration, --mirror before both.
    let out = run(lw(&proj).arg("path").env("LW_MIRROR", "/env/m.git"));
    assert_eq!(text(&out.stdout), "/env/m.git\n");
    let out = run(lw(&proj)
        .args(["path", "--mirror", "/flag/m.git"])
        .env("LW_MIRROR", "/env/m.git"));
    assert_eq!(text(&out.stdout), "/flag/m.git\n");

    let out = run(lw(&proj).args(["status", "--json"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(lines.len(), 1);
    let s: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(s["type"], "status");
    assert_eq!(s["url"], up.to_str().unwrap());
    assert_eq!(s["head"], "refs/heads/main");
    assert_eq!(s["refs"].as_u64().unwrap() as usize, refs(&m).len());
    assert!(s["size_bytes"].as_u64().unwrap() > 0);
    assert!(s["last_fetch"].as_str().unwrap().ends_with('Z'));

    let out = run(lw(&proj).arg("status"));
    let human = text(&out.stdout);
    assert!(
        human.contains(&format!("url        {}\n", up.display())),
        "{human}"
    );
    assert!(
        human.contains(&format!("refs       {}\n", refs(&m).len())),
        "{human}"
    );
}

/// A smart-HTTP git server on 127.0.0.1: `git http-backend` behind Basic
/// authentication, recording the Authorization headers it saw.
struct HttpGit {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

fn serve_git(root: PathBuf, user: &'static str, password: &'static str) -> HttpGit {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let expected = format!("Basic {}", base64(format!("{user}:{password}").as_bytes()));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { break };
            let _ = handle(conn, &root, &expected, &seen2);
        }
    });
    HttpGit { port, seen }
}

fn handle(
    mut conn: TcpStream,
    root: &Path,
    expected: &str,
    seen: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut r = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end().to_string();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let get = |k: &str| headers.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let auth = get("authorization").unwrap_or_default();
    seen.lock().unwrap().push(auth.clone());
    let len: usize = get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    if auth != expected {
        conn.write_all(b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
        return Ok(());
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let mut cgi = Command::new("git");
    cgi.arg("http-backend")
        .env("GIT_PROJECT_ROOT", root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", &method)
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("CONTENT_TYPE", get("content-type").unwrap_or_default())
        .env("CONTENT_LENGTH", len.to_string())
        .env("REMOTE_USER", "user")
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if let Some(p) = get("git-protocol") {
        cgi.env("GIT_PROTOCOL", p);
    }
    if let Some(e) = get("content-encoding") {
        cgi.env("HTTP_CONTENT_ENCODING", e);
    }
    let mut child = cgi.spawn()?;
    child.stdin.take().unwrap().write_all(&body)?;
    let out = child.wait_with_output()?;
    let split = out
        .stdout
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    let split = split.or_else(|| {
        out.stdout
            .windows(2)
            .position(|w| w == b"\n\n")
            .map(|i| (i, 2))
    });
    let (i, n) = split.unwrap_or((0, 0));
    let head = String::from_utf8_lossy(&out.stdout[..i]).to_string();
    let body = &out.stdout[i + n..];
    let mut status = "200 OK".to_string();
    let mut resp = String::new();
    for h in head.lines() {
        match h.split_once(':') {
            Some((k, v)) if k.eq_ignore_ascii_case("status") => status = v.trim().to_string(),
            Some(_) => resp.push_str(&format!("{}\r\n", h.trim_end())),
            None => {}
        }
    }
    conn.write_all(
        format!(
            "HTTP/1.1 {status}\r\n{resp}Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )?;
    conn.write_all(body)
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                A[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

#[test]
fn credentials_in_the_url_reach_the_server_and_nowhere_else() {
    const TOKEN: &str = "tok-9f8e7d6c5b4a";
    let t = TempDir::outside_repo("creds");
    let up = upstream(&t);
    let root = t.join("srv");
    fs::create_dir(&root).unwrap();
    git(
        t.path(),
        &[
            "clone",
            "-q",
            "--bare",
            up.to_str().unwrap(),
            root.join("repo.git").to_str().unwrap(),
        ],
    );
    let srv = serve_git(root, "alice", TOKEN);
    let m = t.join("m.git");
    let ms = m.to_str().unwrap();
    let url = format!("http://alice:{TOKEN}@127.0.0.1:{}/repo.git", srv.port);

    let out = run(lw(t.path()).args(["sync", &url, "--mirror", ms, "--progress"]));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{all}");
    assert!(!all.contains(TOKEN), "{all}");
    let fresh = t.join("fresh.git");
    git(
        t.path(),
        &[
            "clone",
            "-q",
            "--mirror",
            t.join("srv/repo.git").to_str().unwrap(),
            fresh.to_str().unwrap(),
        ],
    );
    assert_eq!(refs(&m), refs(&fresh));
    fsck(&m);
    // The server saw the credentials; nothing in the mirror holds them.
    assert!(
        srv.seen
            .lock()
            .unwrap()
            .iter()
            .any(|a| *a == format!("Basic {}", base64(format!("alice:{TOKEN}").as_bytes())))
    );
    for (p, bytes) in snapshot(&m) {
        assert!(
            !text(&bytes).contains(TOKEN) && !text(&bytes).contains("alice"),
            "{} holds the credentials",
            p.display()
        );
    }
    let bare = format!("http://127.0.0.1:{}/repo.git", srv.port);
    assert_eq!(git(&m, &["config", "remote.origin.url"]).trim(), bare);

    let out = run(lw(t.path()).args(["status", "--mirror", ms]));
    assert!(!text(&out.stdout).contains(TOKEN) && text(&out.stdout).contains(&bare));

    // Later syncs with the same URL fetch with the header again.
    let tip = commit(&up, "main", "later");
    git(
        &up,
        &[
            "push",
            "-q",
            t.join("srv/repo.git").to_str().unwrap(),
            "main",
        ],
    );
    sync_ok(t.path(), &[&url, "--mirror", ms]);
    assert_eq!(git(&m, &["rev-parse", "refs/heads/main"]).trim(), tip);

    // A wrong token: 69, the message names the bare URL and not the secret.
    let before = snapshot(&m);
    let wrong = format!("http://alice:wrong-{TOKEN}@127.0.0.1:{}/repo.git", srv.port);
    let out = run(lw(t.path()).args(["sync", &wrong, "--mirror", ms]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains(&bare) && !err.contains(TOKEN) && !err.contains("alice"),
        "{err}"
    );
    assert_eq!(snapshot(&m), before);
}

#[test]
fn every_long_flag_in_the_help_is_in_the_man_page() {
    let man = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/man/lw-mirror.1")).unwrap();
    for sub in [
        &["--help"][..],
        &["sync", "--help"],
        &["path", "--help"],
        &["status", "--help"],
    ] {
        let out = run(Command::new(BIN).args(sub));
        assert_eq!(out.status.code(), Some(0));
        let help = text(&out.stdout);
        for word in help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
            if let Some(flag) = word
                .strip_prefix("--")
                .filter(|f| !f.is_empty() && *f != "help" && *f != "version")
            {
                let roff = format!("\\-\\-{}", flag.replace('-', "\\-"));
                assert!(
                    man.contains(&roff),
                    "man/lw-mirror.1 lacks {roff} (from {sub:?})"
                );
            }
        }
    }
    let out = run(Command::new(BIN).arg("--help"));
    assert!(text(&out.stdout).starts_with("The local bare mirror every sandbox clones from\n"));
    let out = run(Command::new(BIN).arg("bogus"));
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).starts_with("lw-mirror: unrecognized subcommand 'bogus'"));
    for section in [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "FILES",
        "ENVIRONMENT",
        "EXIT STATUS",
        "EXAMPLES",
        "SEE ALSO",
    ] {
        assert!(man.contains(&format!(".SH {section}\n")), "no {section}");
    }
    for key in [
        "gc.auto",
        "gc.pruneExpire",
        "fetch.prune",
        "core.logAllRefUpdates",
    ] {
        assert!(
            man.contains(key),
            "the never-prune configuration names {key}"
        );
    }
}

/// Loose ref files under `refs/` of a bare repository.
fn loose_refs(git_dir: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    let mut stack = vec![git_dir.join("refs")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                all.push(p);
            }
        }
    }
    all
}

#[test]
fn refs_are_packed_and_creation_reflogs_gone_but_no_object_is_pruned() {
    let t = TempDir::outside_repo("pack");
    let up = upstream(&t);
    let m = t.join("m.git");
    let ms = m.to_str().unwrap();
    sync_ok(t.path(), &[up.to_str().unwrap(), "--mirror", ms]);
    assert_eq!(
        loose_refs(&m),
        Vec::<PathBuf>::new(),
        "first sync left loose refs"
    );
    assert!(m.join("packed-refs").is_file());
    assert!(!m.join("logs").exists(), "creation reflogs kept");
    let clone = reference_clone(&t, &m, &up, "borrower");

    // A force-push after creation: its reflog entry keeps the old tip.
    let old = git(&m, &["rev-parse", "refs/heads/feature"])
        .trim()
        .to_string();
    git(&up, &["branch", "-f", "feature", "main~2"]);
    commit(&up, "feature", "rewritten");
    // Enough new refs to be packed again by the next sync.
    for i in 0..40 {
        git(&up, &["branch", &format!("many/b{i}"), "main"]);
    }
    git(&up, &["checkout", "-q", "main"]);
    sync_ok(t.path(), &["--mirror", ms]);
    assert_eq!(
        loose_refs(&m),
        Vec::<PathBuf>::new(),
        "loose refs not packed"
    );
    let mut want = refs(&up);
    want.retain(|r| !r.contains("refs/remotes/"));
    let have = refs(&m);
    assert!(
        want.is_subset(&have),
        "missing {:?}",
        want.difference(&have).collect::<Vec<_>>()
    );
    // Each reflog line is "OLD NEW ...": the old tip is its first field.
    let log = fs::read_to_string(m.join("logs/refs/heads/feature")).unwrap();
    assert!(
        log.lines().any(|l| l.starts_with(&old)),
        "the force-pushed tip is not in the reflog: {log}"
    );
    // Even a gc by hand keeps what clones borrow.
    git(&m, &["gc", "--quiet"]);
    git(&m, &["cat-file", "-e", &old]);
    fsck(&m);
    fsck(&clone);
}

#[test]
fn a_mirror_whose_refs_another_git_packed_meanwhile_still_syncs() {
    let t = TempDir::outside_repo("packed-meanwhile");
    let up = upstream(&t);
    let m = t.join("m.git");
    let ms = m.to_str().unwrap();
    sync_ok(t.path(), &[up.to_str().unwrap(), "--mirror", ms]);
    let first = commit(&up, "main", "first-new");
    sync_ok(t.path(), &["--mirror", ms]);
    // Another git packs the mirror's refs between two syncs.
    git(&m, &["pack-refs", "--all"]);
    let second = commit(&up, "main", "second-new");
    sync_ok(t.path(), &["--mirror", ms]);
    assert_eq!(git(&m, &["rev-parse", "refs/heads/main"]).trim(), second);
    git(&m, &["merge-base", "--is-ancestor", &first, &second]);

    // Another git is packing while this sync wants to: its packed-refs.lock
    // stands.  The sync succeeds, says so, and the next one packs.
    for i in 0..40 {
        git(&up, &["branch", &format!("more/b{i}"), "main"]);
    }
    fs::write(m.join("packed-refs.lock"), "").unwrap();
    let out = run(lw(t.path()).args(["sync", "--mirror", ms]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("left loose for the next sync to pack"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        git(&m, &["rev-parse", "refs/heads/more/b39"]).trim(),
        second
    );
    fs::remove_file(m.join("packed-refs.lock")).unwrap();
    let third = commit(&up, "main", "third-new");
    sync_ok(t.path(), &["--mirror", ms]);
    assert_eq!(git(&m, &["rev-parse", "refs/heads/main"]).trim(), third);
    assert_eq!(
        loose_refs(&m),
        Vec::<PathBuf>::new(),
        "not packed once the lock went"
    );
    fsck(&m);
}
