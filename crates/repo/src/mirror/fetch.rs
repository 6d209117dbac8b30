//! Running git fetch into a mirror: every ref, never pruning; a ref that
//! conflicts with one deleted upstream is moved aside (under
//! [`DELETED_PREFIX`]) rather than lost; lock files a killed git left are
//! removed first; an upstream that cannot be reached is 69, saying why.

use std::fs;
use std::io::{self, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::git::{self, Remote};
use base::cli::Report;
use base::error::{Error, Exit, Result};

pub(super) fn unreachable(remote: &Remote, stderr: &[u8]) -> Error {
    Error::new(
        Exit::Unavailable,
        format!(
            "cannot fetch from '{}': {}",
            remote.url,
            remote.scrub(&git::last_words(stderr))
        ),
    )
}

/// `git fetch origin` into `git_dir`, with progress on stderr when asked
/// (a ref moved aside is then told to `report`).
/// A stale ref lock left by a killed fetch is removed and the fetch retried
/// once; the caller holds the mirror's lock, so no live git owns it.
///
/// A ref that upstream deleted and the mirror keeps can stand in the way of a
/// new upstream ref (`refs/heads/a` kept, `refs/heads/a/b` new: git cannot
/// hold both).  The kept ref is then moved to `refs/lw-mirror/deleted/...`,
/// where it keeps its objects reachable, and the fetch retried.
pub(super) fn fetch(git_dir: &Path, remote: &Remote, progress: bool, report: Report) -> Result<()> {
    let mut locks_cleared = false;
    for _ in 0..4 {
        let Some(stderr) = run_fetch(git_dir, remote, progress)? else {
            return Ok(());
        };
        let text = String::from_utf8_lossy(&stderr);
        if text.contains(".lock': File exists") && !locks_cleared {
            locks_cleared = true;
            if remove_stale_locks(git_dir)? > 0 {
                continue;
            }
        }
        let conflicts = ref_conflicts(&text);
        if conflicts.is_empty() {
            return Err(fetch_error(git_dir, remote, &stderr));
        }
        for old in conflicts {
            move_deleted_ref(git_dir, &old, progress.then_some(report))?;
        }
    }
    Err(Error::new(
        Exit::Software,
        format!(
            "cannot fetch into '{}': ref conflicts remain",
            git_dir.display()
        ),
    ))
}

/// Kept refs named in git's `cannot lock ref 'NEW': 'OLD' exists; cannot
/// create 'NEW'` messages.
fn ref_conflicts(stderr: &str) -> Vec<String> {
    let mut old: Vec<String> = stderr
        .lines()
        .filter_map(|l| {
            let rest = l.split_once("cannot lock ref '")?.1;
            let (_, rest) = rest.split_once("': '")?;
            let (old, _) = rest.split_once("' exists; cannot create '")?;
            old.starts_with("refs/").then(|| old.to_string())
        })
        .collect();
    old.sort();
    old.dedup();
    old
}

/// The prefix under which kept refs that block new upstream refs are moved.
pub const DELETED_PREFIX: &str = "refs/lw-mirror/deleted/";

/// Moves `old` aside, telling `tell` where to.
fn move_deleted_ref(git_dir: &Path, old: &str, tell: Option<Report>) -> Result<()> {
    let out = git::output(
        git::command(None).arg("--git-dir").arg(git_dir).args([
            "rev-parse",
            "--verify",
            "--quiet",
            old,
        ]),
        "read a ref",
    )?;
    let oid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || oid.is_empty() {
        return Err(Error::new(
            Exit::Software,
            format!("cannot read '{old}' in '{}'", git_dir.display()),
        ));
    }
    let new = format!(
        "{DELETED_PREFIX}{}",
        old.strip_prefix("refs/").unwrap_or(old)
    );
    let mut child = git::command(None)
        .arg("--git-dir")
        .arg(git_dir)
        .args([
            "update-ref",
            "--stdin",
            "-m",
            "lw-mirror: deleted upstream, moved aside",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::new(Exit::Unavailable, "cannot run git update-ref").with_source(e))?;
    let script = format!("start\nupdate {new} {oid}\ndelete {old} {oid}\ncommit\n");
    let write = child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(script.as_bytes());
    let out = child
        .wait_with_output()
        .map_err(|e| Error::new(Exit::IoErr, "cannot wait for git").with_source(e))?;
    if write.is_err() || !out.status.success() {
        return Err(Error::new(
            Exit::Software,
            format!(
                "cannot move '{old}' to '{new}' in '{}': {}",
                git_dir.display(),
                git::last_words(&out.stderr)
            ),
        ));
    }
    if let Some(report) = tell {
        report(&format!(
            "'{old}' was deleted upstream and blocks a new ref; kept as '{new}'"
        ));
    }
    Ok(())
}

/// Runs the fetch; `Some(stderr)` when it failed.
fn run_fetch(git_dir: &Path, remote: &Remote, progress: bool) -> Result<Option<Vec<u8>>> {
    let mut cmd: Command = git::command(None);
    cmd.arg("--git-dir").arg(git_dir).args([
        "fetch",
        "--no-write-fetch-head",
        "--no-auto-maintenance",
    ]);
    cmd.arg(if progress { "--progress" } else { "--quiet" })
        .arg("origin");
    remote.authorize(&mut cmd);
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::new(Exit::Unavailable, "cannot run git fetch").with_source(e))?;
    let mut pipe = child
        .stderr
        .take()
        .expect("stderr is piped because it was set to Stdio::piped()");
    // Keep what git says for the error message; pass it on when showing progress.
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    let mut term = io::stderr();
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if progress {
                    let _ = term.write_all(&buf[..n]);
                }
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 64 * 1024 {
                    kept.drain(..kept.len() - 32 * 1024);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let status = child
        .wait()
        .map_err(|e| Error::new(Exit::IoErr, "cannot wait for git fetch").with_source(e))?;
    Ok(if status.success() { None } else { Some(kept) })
}

fn fetch_error(git_dir: &Path, remote: &Remote, stderr: &[u8]) -> Error {
    let text = String::from_utf8_lossy(stderr);
    let why = remote.scrub(&git::last_words(stderr));
    let local = |exit| {
        Error::new(
            exit,
            format!(
                "cannot fetch from '{}' into '{}': {why}",
                remote.url,
                git_dir.display()
            ),
        )
    };
    if text.contains("No space left") || text.contains("Disk quota") {
        local(Exit::IoErr)
    } else if text.contains(".lock': File exists") {
        local(Exit::TempFail)
    } else {
        unreachable(remote, stderr)
    }
}

/// Removes git lock files (`*.lock`) from the mirror's refs, logs and top.
fn remove_stale_locks(git_dir: &Path) -> Result<usize> {
    fn walk(dir: &Path, n: &mut usize) -> Result<()> {
        let Ok(entries) = fs::read_dir(dir) else {
            return Ok(());
        };
        for e in entries.flatten() {
            let p = e.path();
            let ft = e
                .file_type()
                .map_err(|err| Error::io("cannot read", &p, err))?;
            if ft.is_dir() {
                walk(&p, n)?;
            } else if p.extension().is_some_and(|x| x == "lock") {
                fs::remove_file(&p).map_err(|err| Error::io("cannot remove", &p, err))?;
                *n += 1;
            }
        }
        Ok(())
    }
    let mut n = 0;
    for top in [
        "HEAD.lock",
        "packed-refs.lock",
        "config.lock",
        "shallow.lock",
    ] {
        let p = git_dir.join(top);
        if fs::remove_file(&p).is_ok() {
            n += 1;
        }
    }
    walk(&git_dir.join("refs"), &mut n)?;
    walk(&git_dir.join("logs"), &mut n)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_conflicts_are_read_from_git_messages() {
        let text = "error: cannot lock ref 'refs/heads/a/b': 'refs/heads/a' exists; cannot create 'refs/heads/a/b'\n\
                    error: cannot lock ref 'refs/heads/x': 'refs/heads/x/y' exists; cannot create 'refs/heads/x'\n\
                    error: cannot lock ref 'refs/heads/q': Unable to create lock\n";
        assert_eq!(
            ref_conflicts(text),
            vec!["refs/heads/a".to_string(), "refs/heads/x/y".to_string()]
        );
    }
}
