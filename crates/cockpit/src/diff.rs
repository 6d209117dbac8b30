//! A sandbox's task branch against its base, as plain text, read from
//! host-owned repositories only: the radar's copy of the branch
//! (`ROOT/state/radar/sandboxes/NAME.git`, `refs/radar/head`), else the
//! mirror's pushed branch.  git runs there with the radar's hardened
//! settings and caps (crates/repo/src/radar/run.rs), never in the sandbox's clone, and
//! with textconv and external diff off, so nothing the branch holds runs.

use std::path::{Path, PathBuf};

use mailbox::layout::Root;
use repo::radar::run::{self, Limits};

/// Bytes of diff shown at most; the rest is cut with a note.
pub(super) const MAX_DIFF: usize = 2 << 20;

fn limits() -> Limits {
    Limits {
        time: std::time::Duration::from_secs(10),
        output: MAX_DIFF,
        ..Limits::default()
    }
}

/// The commit `rev` names in `git_dir`, if any.
pub(super) fn resolve(git_dir: &Path, rev: &str) -> Option<String> {
    let mut cmd = run::git(git_dir);
    cmd.args(["rev-parse", "--verify", "--quiet", "--end-of-options"])
        .arg(format!("{rev}^{{commit}}"));
    let ran = run::run(cmd, &limits()).ok()?;
    if !ran.status.success() {
        return None;
    }
    let s = String::from_utf8(ran.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())).then(|| s.to_string())
}

/// Where the branch's tip is: (repository, commit, what it is).
fn tip(root: &Root, name: &str, branch: &str, mirror: &Path) -> Option<(PathBuf, String, String)> {
    let radar = root
        .state_dir()
        .join("radar/sandboxes")
        .join(format!("{name}.git"));
    if let Some(c) = resolve(&radar, "refs/radar/head") {
        return Some((radar, c, "the radar's last fetch".into()));
    }
    for r in [
        format!("refs/heads/{branch}"),
        format!("refs/remotes/origin/{branch}"),
    ] {
        if let Some(c) = resolve(mirror, &r) {
            return Some((mirror.to_path_buf(), c, format!("the mirror's {r}")));
        }
    }
    None
}

/// The diff of sandbox `name`'s task branch against its base, with a
/// diffstat first; a sentence when there is nothing to show.
pub(super) fn diff(root: &Root, name: &str) -> String {
    let Some(rec) = super::record::record(root, name) else {
        return format!("{name}: no lw-sandbox record on this host, so no branch to show\n");
    };
    let Some((repo, head, from)) = tip(root, name, &rec.branch, &rec.mirror) else {
        return format!(
            "{name}: branch {} is neither pushed to the mirror nor fetched by lw-radar yet\n",
            rec.branch
        );
    };
    let base = rec
        .base
        .clone()
        .or_else(|| resolve(&rec.mirror, "HEAD"))
        .and_then(|b| resolve(&repo, &b));
    let Some(base) = base else {
        return format!("{name}: the base of branch {} is not known\n", rec.branch);
    };
    let mut cmd = run::git(&repo);
    cmd.args([
        "-c",
        "core.quotePath=true",
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--stat",
        "--patch",
        "--end-of-options",
    ])
    .arg(format!("{base}...{head}"));
    let header = format!(
        "branch {} at {head} ({from}), against {base}\n\n",
        rec.branch
    );
    match run::run(cmd, &limits()) {
        Ok(r) if r.status.success() => {
            let body = String::from_utf8_lossy(&r.stdout);
            if body.is_empty() {
                format!("{header}no changes\n")
            } else {
                format!("{header}{body}")
            }
        }
        Ok(r) => format!(
            "{header}git diff failed: {}\n",
            String::from_utf8_lossy(&r.stderr).trim()
        ),
        Err(e) => format!("{header}{e}\n"),
    }
}

/// How far a task branch is from its base: commits ahead and a diffstat,
/// read with the same hardened, capped git as [`diff`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub(super) struct BranchStat {
    pub head: String,
    pub base: String,
    /// Where the tip was read: the radar's copy or the mirror's ref.
    pub from: String,
    pub ahead: u64,
    pub files: u64,
    pub insertions: u64,
    pub deletions: u64,
}

/// The stat of `head` against `base` in `repo` (None when git cannot say).
pub(super) fn stat(repo: &Path, base: &str, head: &str, from: &str) -> Option<BranchStat> {
    let base = resolve(repo, base)?;
    let mut cmd = run::git(repo);
    cmd.args(["rev-list", "--count", "--end-of-options"])
        .arg(format!("{base}..{head}"));
    let ran = run::run(cmd, &limits()).ok()?;
    let ahead = String::from_utf8(ran.stdout).ok()?.trim().parse().ok()?;
    let mut cmd = run::git(repo);
    cmd.args([
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--shortstat",
        "--end-of-options",
    ])
    .arg(format!("{base}...{head}"));
    let ran = run::run(cmd, &limits()).ok()?;
    if !ran.status.success() {
        return None;
    }
    let (files, insertions, deletions) = shortstat(&String::from_utf8_lossy(&ran.stdout));
    Some(BranchStat {
        head: head.to_string(),
        base,
        from: from.to_string(),
        ahead,
        files,
        insertions,
        deletions,
    })
}

/// ` 2 files changed, 3 insertions(+), 1 deletion(-)` as numbers.
fn shortstat(s: &str) -> (u64, u64, u64) {
    let (mut f, mut i, mut d) = (0, 0, 0);
    for part in s.trim().split(',') {
        let mut w = part.split_whitespace();
        let (Some(n), Some(what)) = (w.next().and_then(|n| n.parse().ok()), w.next()) else {
            continue;
        };
        match what {
            w if w.starts_with("file") => f = n,
            w if w.starts_with("insertion") => i = n,
            w if w.starts_with("deletion") => d = n,
            _ => {}
        }
    }
    (f, i, d)
}

/// A repository's refs (name -> commit), and with [`Refs::with_head`] its
/// HEAD's commit, read once per refresh with capped gits.
#[derive(Default)]
pub(super) struct Refs {
    pub refs: std::collections::HashMap<String, String>,
    pub head: Option<String>,
}

impl Refs {
    /// The refs of `repo`, empty when it is not a repository.
    pub(super) fn read(repo: &Path) -> Refs {
        if !repo.is_dir() {
            return Refs::default();
        }
        let mut cmd = run::git(repo);
        cmd.args(["for-each-ref", "--format=%(objectname) %(refname)"]);
        let refs = run::run(cmd, &limits())
            .ok()
            .filter(|r| r.status.success())
            .map(|r| {
                String::from_utf8_lossy(&r.stdout)
                    .lines()
                    .filter_map(|l| l.split_once(' '))
                    .filter(|(c, _)| c.bytes().all(|b| b.is_ascii_hexdigit()))
                    .map(|(c, n)| (n.to_string(), c.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        Refs { refs, head: None }
    }

    /// [`Refs::read`] and the commit of HEAD (a mirror's default branch).
    pub(super) fn with_head(repo: &Path) -> Refs {
        let mut r = Refs::read(repo);
        if repo.is_dir() {
            r.head = resolve(repo, "HEAD");
        }
        r
    }
}

/// Where sandbox `rec`'s branch is and what its base is: (repository,
/// base, head, what the tip is), as [`diff`] finds them, from refs read
/// once per refresh (`mirror`: [`Refs::read`] of `rec.mirror`).
pub(super) fn locate(
    root: &Root,
    rec: &loopwright::sandbox::Record,
    mirror: &Refs,
) -> Option<(PathBuf, String, String, String)> {
    let radar = root
        .state_dir()
        .join("radar/sandboxes")
        .join(format!("{}.git", rec.name));
    let base = rec.base.clone().or_else(|| mirror.head.clone())?;
    if let Some(c) = Refs::read(&radar).refs.get("refs/radar/head") {
        return Some((radar, base, c.clone(), "the radar's last fetch".into()));
    }
    for r in [
        format!("refs/heads/{}", rec.branch),
        format!("refs/remotes/origin/{}", rec.branch),
    ] {
        if let Some(c) = mirror.refs.get(&r) {
            return Some((
                rec.mirror.clone(),
                base,
                c.clone(),
                format!("the mirror's {r}"),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn shortstat_reads_gits_summary() {
        assert_eq!(
            super::shortstat(" 2 files changed, 3 insertions(+), 1 deletion(-)\n"),
            (2, 3, 1)
        );
        assert_eq!(
            super::shortstat(" 1 file changed, 4 deletions(-)"),
            (1, 0, 4)
        );
        assert_eq!(super::shortstat(""), (0, 0, 0));
    }
}
