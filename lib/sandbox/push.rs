//! `push`: the only way work leaves a sandbox.
//!
//! The host never runs git in the sandbox's repository, and never with
//! configuration or hooks the sandbox could have written.  Instead:
//!
//! 1. A quarantine repository is made on the host for this one push
//!    (`ROOT/state/push/NAME.RANDOM`): `git init --bare --template=` (no
//!    hooks), its objects borrowing from the mirror through alternates so
//!    that only the sandbox's new objects travel.
//! 2. The host's git fetches `refs/heads/BRANCH` — the branch recorded at
//!    create, never one the sandbox names — into it, through git's `ext::`
//!    transport: the other end is `git upload-pack /work/repo` running
//!    *inside* the sandbox, reached by `lw-sandbox exec`.  The fetch is
//!    `repo::git::fetch_untrusted`: no hook runs, every protocol but
//!    `ext` is forbidden, and every object is checked, so malformed objects
//!    are refused.
//! 3. The host's git pushes that one ref to the upstream's
//!    `refs/heads/BRANCH` with the host's credentials (crates/repo/src/git/ hands a
//!    URL's credentials over in the environment; credential helpers of the
//!    host's user config work as usual), never forced unless asked.
//! 4. The mirror is refreshed and the quarantine removed; the sandbox's own
//!    clone fetches from the mirror, so `ls` counts its commits as pushed.
//!
//! A push killed midway leaves a quarantine directory; `gc` removes it.

use std::fs;
use std::path::{Path, PathBuf};

use super::{Record, Sandboxes};
use base::cli::Report;
use base::error::{Error, Exit, Result};
use repo::git;
use repo::mirror::{self, Mirror, SyncOptions};

/// What a push did.
#[derive(Clone, Debug)]
pub struct Pushed {
    pub branch: String,
    pub commit: String,
    pub url: String,
    /// `new`, `updated`, `up-to-date` or `forced`.
    pub outcome: String,
}

impl Pushed {
    /// The `push --json` record.
    pub fn json(&self, name: &str) -> serde_json::Value {
        serde_json::json!({"type": "push", "name": name, "branch": self.branch, "commit": self.commit, "url": self.url, "outcome": self.outcome})
    }
}

fn quarantine_dir(state: &Path) -> PathBuf {
    state.join("push")
}

fn lock_of(q: &Path) -> PathBuf {
    PathBuf::from(format!("{}.lock", q.display()))
}

/// Escapes an argument of an `ext::` command line (space and `%`).
fn ext_escape(s: &str) -> String {
    s.replace('%', "%%").replace(' ', "% ")
}

/// Removes quarantines left by killed pushes.  Called by gc, which holds no
/// lock for them: a live push keeps its directory locked (see `push`).
pub fn remove_leftovers(state: &Path, out: &mut dyn FnMut(&str)) {
    let dir = quarantine_dir(state);
    let Ok(rd) = fs::read_dir(&dir) else { return };
    for ent in rd.flatten() {
        let p = ent.path();
        if p.to_string_lossy().ends_with(".lock") {
            continue;
        }
        let lock = lock_of(&p);
        match base::fs::try_lock(&lock) {
            Ok(Some(_held)) => {
                let _ = fs::remove_dir_all(&p);
                let _ = fs::remove_file(&lock);
                out(&format!("quarantine {}", p.display()));
            }
            _ => continue,
        }
    }
}

fn run_git(cmd: &mut std::process::Command, what: &str) -> Result<(bool, String, String)> {
    let out = git::output(cmd, what)?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

impl<'a> Sandboxes<'a> {
    /// Pushes the sandbox's branch to the upstream; `lw_sandbox` is this
    /// program, run by git as the transport.  A mirror that could not be
    /// refreshed after the push is told to `report`.
    pub fn push(
        &self,
        name: &str,
        lw_sandbox: &Path,
        force: bool,
        report: Report,
    ) -> Result<Pushed> {
        let rec = self.get(name)?;
        let was_running = self.running(&rec)?.running;
        let res = self.push_running(&rec, lw_sandbox, force, report);
        // What the upstream has now: lw-sync puts the radar's status there.
        if let Ok(p) = &res
            && let Err(e) =
                sync::pr::pushed::record(&self.root.state_dir(), name, &p.branch, &p.commit)
        {
            report(&format!(
                "pushed, but could not record the pushed head: {e}"
            ));
        }
        if !was_running {
            // Back as it was: a stopped sandbox stays stopped.
            let _ = self
                .engine
                .stop(&rec.container, std::time::Duration::from_secs(10));
        }
        res
    }

    fn push_running(
        &self,
        rec: &Record,
        lw_sandbox: &Path,
        force: bool,
        report: Report,
    ) -> Result<Pushed> {
        let name = rec.name.as_str();
        let rec = rec.clone();
        let project = if rec.project.as_os_str().is_empty() {
            None
        } else {
            wall::config::project(&rec.project)?
        };
        let m = Mirror::new(&rec.mirror);
        let state = m.ready()?;
        let remote = mirror::default_remote(project.as_ref(), Some(&state.url), &rec.project)?;
        let cap = super::Settings::from_project(project.as_ref())?
            .limits
            .push_max;

        let qdir = quarantine_dir(&self.root.state_dir());
        fs::create_dir_all(&qdir).map_err(|e| Error::io("cannot create", &qdir, e))?;
        let q = qdir.join(format!("{name}.{:016x}", base::id::random128() as u64));
        let qlock_path = lock_of(&q);
        let _qlock = base::fs::lock(&qlock_path).map_err(|e| Error::lock(&qlock_path, e))?;
        let res = self.push_through(&rec, &q, &m.path, &remote, lw_sandbox, force, cap);
        let _ = fs::remove_dir_all(&q);
        let _ = fs::remove_file(&qlock_path);
        let pushed = res?;

        // Let the mirror, then the sandbox's clone, learn the new tip.
        let mut again =
            |stored: Option<&str>| mirror::default_remote(project.as_ref(), stored, &rec.project);
        if let Err(e) = m.sync(&mut SyncOptions {
            if_older_than: None,
            progress: false,
            report,
            remote: &mut again,
        }) {
            report(&format!("pushed, but could not refresh the mirror: {e}"));
        }
        let _ = self.run(
            &rec,
            &["/bin/sh", "-c", "cd /work/repo && git fetch -q origin"],
            None,
        );
        if rec.volume_mode {
            // No mirror inside (lib/sandbox/volume.rs): the pushed tip is
            // what the upstream's branch now is.
            let _ = self.run(
                &rec,
                &[
                    "git",
                    "-C",
                    super::REPO,
                    "update-ref",
                    &format!("refs/remotes/origin/{}", rec.branch),
                    &pushed.commit,
                ],
                None,
            );
        }
        Ok(pushed)
    }

    /// Steps 1 to 3 of the module documentation, in quarantine `q`.
    #[allow(clippy::too_many_arguments)]
    fn push_through(
        &self,
        rec: &Record,
        q: &Path,
        mirror: &Path,
        remote: &git::Remote,
        lw_sandbox: &Path,
        force: bool,
        cap: u64,
    ) -> Result<Pushed> {
        make_quarantine(q, mirror)?;
        let local = format!("refs/lw-sandbox/{}", rec.branch);
        let sha = self.fetch_from_sandbox(rec, q, &local, lw_sandbox)?;
        // The new objects are all the quarantine holds (the rest is borrowed
        // from the mirror): over the cap, nothing goes upstream.
        let size = base::fs::tree_size(&q.join("objects"));
        if size > cap {
            return Err(Error::data(format!(
                "the push of branch '{}' from sandbox '{}' is {size} bytes of new objects; the cap is {cap} (sandbox.push-max); nothing was pushed",
                rec.branch, rec.name
            )));
        }
        let outcome = push_upstream(rec, q, &local, remote, force)?;
        Ok(Pushed {
            branch: rec.branch.clone(),
            commit: sha,
            url: remote.url.clone(),
            outcome: outcome.into(),
        })
    }

    /// Fetches the recorded branch out of the sandbox into `local` of the
    /// quarantine, through `lw-sandbox exec` as git's transport; its tip.
    fn fetch_from_sandbox(
        &self,
        rec: &Record,
        q: &Path,
        local: &str,
        lw_sandbox: &Path,
    ) -> Result<String> {
        let transport = format!(
            "ext::{} exec --root {} {} -- git upload-pack {}",
            ext_escape(&lw_sandbox.to_string_lossy()),
            ext_escape(&self.root.dir.to_string_lossy()),
            ext_escape(&rec.name),
            super::REPO
        );
        let mut fetch = git::command(None);
        fetch.arg("--git-dir").arg(q);
        fetch.args(["-c", "protocol.ext.allow=always"]);
        git::fetch_untrusted(&mut fetch)
            .arg(&transport)
            .arg(format!("+refs/heads/{}:{local}", rec.branch));
        let (ok, _, err) = run_git(&mut fetch, "fetch from the sandbox")?;
        if !ok {
            let why = git::last_words(err.as_bytes());
            let exit = if why.contains("couldn't find remote ref") {
                Exit::NoInput
            } else {
                Exit::DataErr
            };
            return Err(Error::new(
                exit,
                format!(
                    "cannot fetch branch '{}' out of sandbox '{}': {}",
                    rec.branch,
                    rec.name,
                    base::visible::visible(&why)
                ),
            ));
        }
        let (_, sha, _) = run_git(
            git::command(None)
                .arg("--git-dir")
                .arg(q)
                .args(["rev-parse", "--verify", local]),
            "read the fetched tip",
        )?;
        Ok(sha.trim().to_string())
    }
}

/// An empty bare repository at `q`, with no hooks, borrowing the mirror's
/// objects through alternates.
fn make_quarantine(q: &Path, mirror: &Path) -> Result<()> {
    let (ok, _, err) = run_git(
        git::command(None)
            .args(["init", "--quiet", "--bare", "--template="])
            .arg(q),
        "make a quarantine",
    )?;
    if !ok {
        return Err(Error::new(
            Exit::CantCreat,
            format!(
                "cannot make the quarantine '{}': {}",
                q.display(),
                err.trim()
            ),
        ));
    }
    let alt = q.join("objects/info/alternates");
    fs::create_dir_all(q.join("objects/info")).map_err(|e| Error::io("cannot create", &alt, e))?;
    fs::write(&alt, format!("{}\n", mirror.join("objects").display()))
        .map_err(|e| Error::io("cannot write", &alt, e))
}

/// Pushes `local` of the quarantine to the upstream's branch with the
/// host's credentials; the outcome (`new`, `forced`, `up-to-date`,
/// `updated`).  A branch that moved upstream is 75, with a hint.
fn push_upstream(
    rec: &Record,
    q: &Path,
    local: &str,
    remote: &git::Remote,
    force: bool,
) -> Result<&'static str> {
    let spec = format!(
        "{}{local}:refs/heads/{}",
        if force { "+" } else { "" },
        rec.branch
    );
    let mut push = git::command(None);
    push.arg("--git-dir").arg(q);
    for c in git::NO_HOOKS {
        push.args(["-c", c]);
    }
    push.args([
        "push",
        "--porcelain",
        "--no-verify",
        "--no-recurse-submodules",
        &remote.url,
        &spec,
    ]);
    remote.authorize(&mut push);
    let (ok, out, err) = run_git(&mut push, "push to the upstream")?;
    let line = out
        .lines()
        .find(|l| l.contains(&format!("refs/heads/{}", rec.branch)))
        .unwrap_or("");
    if !ok {
        return Err(push_refused(rec, remote, line, &err));
    }
    Ok(match line.chars().next() {
        Some('*') => "new",
        Some('+') => "forced",
        Some('=') => "up-to-date",
        _ => "updated",
    })
}

/// The error of a push the upstream refused (`line`, git's porcelain line
/// of the branch, and `err`, its stderr): 75 when the branch moved.
fn push_refused(rec: &Record, remote: &git::Remote, line: &str, err: &str) -> Error {
    let why = remote.scrub(&format!(
        "{} {}",
        line.trim(),
        git::last_words(err.as_bytes())
    ));
    let exit = if line.contains("non-fast-forward")
        || line.contains("fetch first")
        || line.contains("rejected")
    {
        Exit::TempFail
    } else {
        Exit::Unavailable
    };
    let hint = if exit == Exit::TempFail {
        "; the upstream branch moved: merge it into the sandbox's branch, or push with --force"
    } else {
        ""
    };
    Error::new(
        exit,
        format!(
            "cannot push '{}' to '{}': {why}{hint}",
            rec.branch, remote.url
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ext_arguments_escape_spaces_and_percent_signs() {
        assert_eq!(ext_escape("/a b/100%/lw-sandbox"), "/a% b/100%%/lw-sandbox");
        assert_eq!(
            lock_of(Path::new("/r/state/push/a.b.0f")),
            Path::new("/r/state/push/a.b.0f.lock")
        );
    }
}
