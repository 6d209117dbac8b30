//! A sandbox's task branch against its base, as plain text, read from
//! host-owned repositories only: the radar's copy of the branch
//! (`ROOT/state/radar/sandboxes/NAME.git`, `refs/radar/head`), else the
//! mirror's pushed branch.  git runs there with the radar's hardened
//! settings and caps (lib/radar/run.rs), never in the sandbox's clone, and
//! with textconv and external diff off, so nothing the branch holds runs.

use std::path::{Path, PathBuf};

use crate::layout::Root;
use crate::radar::run::{self, Limits};

/// Bytes of diff shown at most; the rest is cut with a note.
pub const MAX_DIFF: usize = 2 << 20;

fn limits() -> Limits {
    Limits {
        time: std::time::Duration::from_secs(10),
        output: MAX_DIFF,
        ..Limits::default()
    }
}

/// The commit `rev` names in `git_dir`, if any.
fn resolve(git_dir: &Path, rev: &str) -> Option<String> {
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
pub fn diff(root: &Root, name: &str) -> String {
    let Some(rec) = super::data::record(root, name) else {
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
