//! A sync: one at a time under the mirror's lock; the first makes the
//! mirror whole in a temporary directory and renames it into place, later
//! ones fetch into it (never pruning) and record the fetch.

use std::fs;
use std::io;
use std::path::Path;
use std::time::Duration;

use rustix::fs::{self as rfs, RenameFlags};

use super::fetch::{fetch, unreachable};
use super::refs::{LOOSE_REFS_MAX, loose_refs, pack_refs};
use super::state::{State, fsync_dir, write_state};
use super::{Found, Mirror};
use crate::git::{self, Remote};
use base::cli::Report;
use base::error::{Error, Exit, Result};
use base::time;

/// The git configuration every mirror carries, and why.
pub const NEVER_PRUNE: &[(&str, &str)] = &[
    // Every ref, as `git clone --mirror` fetches them.
    ("remote.origin.fetch", "+refs/*:refs/*"),
    // A fetch never deletes a ref, whatever the caller's global config says.
    ("remote.origin.prune", "false"),
    ("remote.origin.pruneTags", "false"),
    ("fetch.prune", "false"),
    ("fetch.pruneTags", "false"),
    // No gc or maintenance behind our back: auto gc prunes unreachable
    // objects older than two weeks, which is what a clone may borrow.
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("receive.autoGc", "false"),
    // And if someone runs gc by hand, it still deletes nothing.
    ("gc.pruneExpire", "never"),
    ("gc.reflogExpire", "never"),
    ("gc.reflogExpireUnreachable", "never"),
    // Bare repositories keep no reflogs by default; these keep the old tip
    // of a force-pushed branch reachable.
    ("core.logAllRefUpdates", "always"),
    // Speed: the forced-update check walks history only to print a notice.
    ("fetch.showForcedUpdates", "false"),
    ("advice.fetchShowForcedUpdates", "false"),
];

/// What a sync did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Made the mirror.
    Created,
    /// Fetched into it.
    Fetched,
    /// Another sync fetched while this one waited.
    Waited,
    /// The last fetch was recent enough (`--if-older-than`).
    Fresh,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Fetched => "fetched",
            Outcome::Waited => "waited",
            Outcome::Fresh => "fresh",
        }
    }
}

/// How to sync.
pub struct SyncOptions<'a> {
    /// Return at once when the last fetch finished less than this ago.
    pub if_older_than: Option<Duration>,
    /// Show git's progress on stderr, and report notices (waiting for
    /// another sync, an upstream that moved, a ref moved aside).
    pub progress: bool,
    /// Where the sync's notes and warnings go (refs left loose always).
    pub report: Report<'a>,
    /// The upstream, asked for only when a fetch will happen; gets the URL
    /// the mirror was made from, if it exists.
    pub remote: &'a mut dyn FnMut(Option<&str>) -> Result<Remote>,
}

impl Mirror {
    /// Creates the mirror or fetches into it; see the module documentation.
    pub fn sync(&self, opts: &mut SyncOptions) -> Result<Outcome> {
        let asked = time::now();
        if let Some(max) = opts.if_older_than
            && let Found::Ready(s) = self.find()?
            && asked.saturating_sub(s.fetch_finished) < max
        {
            return Ok(Outcome::Fresh);
        }
        let parent = self.parent();
        fs::create_dir_all(&parent)
            .map_err(|e| Error::io_as(Exit::CantCreat, "cannot create", &parent, e))?;
        let lock_path = self.lock_path();
        let lock_err = |e| Error::lock(&lock_path, e);
        let lock = match base::fs::try_lock(&lock_path).map_err(lock_err)? {
            Some(held) => held,
            None => {
                if opts.progress {
                    (opts.report)(&format!(
                        "waiting for another sync of '{}'",
                        self.path.display()
                    ));
                }
                base::fs::lock(&lock_path).map_err(lock_err)?
            }
        };
        // The lock is held until `lock` is dropped, at the end of this function.
        let outcome = match self.find()? {
            Found::Ready(state) => {
                if state.fetch_started >= asked {
                    Outcome::Waited
                } else if opts
                    .if_older_than
                    .is_some_and(|max| time::now().saturating_sub(state.fetch_finished) < max)
                {
                    Outcome::Fresh
                } else {
                    let remote = (opts.remote)(Some(&state.url))?;
                    self.update(state, &remote, opts.progress, opts.report)?;
                    Outcome::Fetched
                }
            }
            Found::Absent => {
                let remote = (opts.remote)(None)?;
                self.create(&remote, opts.progress, opts.report)?;
                Outcome::Created
            }
            Found::Foreign => return Err(self.foreign()),
            Found::Damaged(why) => return Err(self.damaged(&why)),
        };
        drop(lock);
        Ok(outcome)
    }

    fn update(
        &self,
        mut state: State,
        remote: &Remote,
        progress: bool,
        report: Report,
    ) -> Result<()> {
        let moved = remote.url != state.url;
        if moved {
            set_config(&self.path, "remote.origin.url", &remote.url)?;
        }
        let started = time::now();
        if let Err(e) = fetch(&self.path, remote, progress, report) {
            // A URL that does not work is not kept: the mirror stays as it was.
            if moved {
                set_config(&self.path, "remote.origin.url", &state.url)?;
            }
            return Err(e);
        }
        if moved && progress {
            report(&format!(
                "upstream of '{}' is now '{}'",
                self.path.display(),
                remote.url
            ));
        }
        state.url = remote.url.clone();
        state.fetch_started = started;
        state.fetch_finished = time::now();
        write_state(&self.path, &state, false)?;
        if loose_refs(&self.path, LOOSE_REFS_MAX) >= LOOSE_REFS_MAX {
            pack_refs(&self.path, report);
        }
        Ok(())
    }

    fn create(&self, remote: &Remote, progress: bool, report: Report) -> Result<()> {
        let parent = self.parent();
        self.remove_leftovers()?;
        let tmp = parent.join(format!("{}{}", self.tmp_prefix(), std::process::id()));
        let res = (|| {
            let out = git::output(
                git::command(None)
                    .args(["init", "--quiet", "--bare", "--template="])
                    .arg(&tmp),
                "create a mirror",
            )?;
            if !out.status.success() {
                return Err(Error::new(
                    Exit::CantCreat,
                    format!(
                        "cannot create '{}': {}",
                        tmp.display(),
                        git::last_words(&out.stderr)
                    ),
                ));
            }
            set_config(&tmp, "remote.origin.url", &remote.url)?;
            for (k, v) in NEVER_PRUNE {
                set_config(&tmp, k, v)?;
            }
            let started = time::now();
            if let Some(head) = remote_head(&tmp, remote)? {
                let out = git::output(
                    git::command(None).arg("--git-dir").arg(&tmp).args([
                        "symbolic-ref",
                        "HEAD",
                        &head,
                    ]),
                    "set HEAD",
                )?;
                if !out.status.success() {
                    return Err(Error::data(format!(
                        "upstream HEAD '{head}' is not a valid ref name: {}",
                        git::last_words(&out.stderr)
                    )));
                }
            }
            fetch(&tmp, remote, progress, report)?;
            // The reflogs of a fresh fetch only say each ref was created.
            let logs = tmp.join("logs");
            if logs.exists() {
                fs::remove_dir_all(&logs).map_err(|e| Error::io("cannot remove", &logs, e))?;
            }
            pack_refs(&tmp, report);
            let now = time::now();
            let state = State {
                url: remote.url.clone(),
                created: now,
                fetch_started: started,
                fetch_finished: now,
            };
            write_state(&tmp, &state, true)?;
            // An empty directory at the path (made by hand, or a mount point)
            // is replaced; anything else was refused by `find`.
            let _ = fs::remove_dir(&self.path);
            rfs::renameat_with(rfs::CWD, &tmp, rfs::CWD, &self.path, RenameFlags::NOREPLACE)
                .map_err(|e| {
                    let msg = format!(
                        "cannot rename '{}' to '{}'",
                        tmp.display(),
                        self.path.display()
                    );
                    Error::new(Exit::CantCreat, msg).with_source(io::Error::from(e))
                })?;
            fsync_dir(&parent)
        })();
        if res.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        res
    }

    /// Removes temporary directories left by a killed first sync.  Called
    /// with the lock held, so none of them belongs to a live sync.
    fn remove_leftovers(&self) -> Result<()> {
        let parent = self.parent();
        let prefix = self.tmp_prefix();
        let dir = fs::read_dir(&parent).map_err(|e| Error::io("cannot read", &parent, e))?;
        for entry in dir.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let p = entry.path();
                fs::remove_dir_all(&p).map_err(|e| Error::io("cannot remove", &p, e))?;
            }
        }
        Ok(())
    }
}

fn set_config(git_dir: &Path, key: &str, value: &str) -> Result<()> {
    let out = git::output(
        git::command(None)
            .arg("--git-dir")
            .arg(git_dir)
            .args(["config", key, value]),
        "configure",
    )?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::new(
            Exit::IoErr,
            format!(
                "cannot set '{key}' in '{}': {}",
                git_dir.display(),
                git::last_words(&out.stderr)
            ),
        ))
    }
}

/// The ref the upstream's HEAD points to, as `git clone --mirror` sets it.
fn remote_head(git_dir: &Path, remote: &Remote) -> Result<Option<String>> {
    let mut cmd = git::command(None);
    cmd.arg("--git-dir")
        .arg(git_dir)
        .args(["ls-remote", "--symref", "origin", "HEAD"]);
    remote.authorize(&mut cmd);
    let out = git::output(&mut cmd, "reach the upstream")?;
    if !out.status.success() {
        return Err(unreachable(remote, &out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().find_map(|l| {
        let (r, name) = l.strip_prefix("ref: ")?.split_once('\t')?;
        (name == "HEAD").then(|| r.to_string())
    }))
}
