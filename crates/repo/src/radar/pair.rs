//! One pair's verdict: merge base, `git merge-tree --write-tree`, the hunks
//! of conflicted files, and the changed paths in the other's scope, each
//! git capped (radar/run.rs) and run in the host-owned `all.git`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use super::run::git_out;
use super::{Limits, Live, MAX_HUNK_FILES, Verdict, attrs, verdict};

fn merge_base(all: &Path, limits: &Limits, x: &str, y: &str) -> Result<Option<String>, String> {
    let (code, base) = git_out(all, limits, &[], &["merge-base", x, y], &[0, 1])?;
    Ok((code == 0).then(|| String::from_utf8_lossy(&base).trim().to_string()))
}

/// The paths changed from `from` to `to`, shown by `verdict::name`.
fn changed(all: &Path, limits: &Limits, from: &str, to: &str) -> Result<Vec<String>, String> {
    let args = [
        "diff-tree",
        "-r",
        "-z",
        "--name-only",
        "--no-renames",
        from,
        to,
    ];
    let (_, out) = git_out(all, limits, &[], &args, &[0])?;
    Ok(out
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(verdict::name)
        .collect())
}

/// The merge base and verdict of one pair, computed in `all`.  `upstream`
/// is the current base (the mirror's), when known: a side's own changes,
/// for the scope check, are counted from its merge base with it, so
/// upstream commits a side merged in are not its own.
pub fn compute_pair(
    all: &Path,
    limits: &Limits,
    (a, b): (&Live, &Live),
    (ha, hb): (&str, &str),
    upstream: Option<&str>,
) -> std::result::Result<(String, Verdict), String> {
    let base = merge_base(all, limits, ha, hb)?.ok_or("no common history")?;
    // The built-in merge attributes of the merge base, and nothing else
    // from it (radar/attrs.rs).
    let attr_file = attrs::for_tree(all, limits, &base)?;
    let mut opt = std::ffi::OsString::from("core.attributesFile=");
    opt.push(&attr_file);
    let pre = [OsStr::new("-c"), opt.as_os_str()];
    let (_, out) = git_out(
        all,
        limits,
        &pre,
        &["merge-tree", "--write-tree", "-z", ha, hb],
        &[0, 1],
    )?;
    let mt = verdict::parse_merge_tree(&out).map_err(|e| format!("merge-tree: {}", e.0))?;
    let mut reads = 0;
    let mut v = Verdict::from_merge(&mt, |p| {
        reads += 1;
        if reads > MAX_HUNK_FILES {
            return vec![];
        }
        let mut spec = format!("{}:", mt.tree).into_bytes();
        spec.extend(mt.raw.get(p).map_or(p.as_bytes(), Vec::as_slice));
        let args = [
            OsStr::new("cat-file"),
            OsStr::new("blob"),
            OsStr::from_bytes(&spec),
        ];
        match git_out(all, limits, &[], &args, &[0]) {
            Ok((_, blob)) => verdict::hunks(&blob),
            Err(_) => vec![],
        }
    });
    let own = |h: &str| -> std::result::Result<Vec<String>, String> {
        let from = match upstream {
            Some(u) => merge_base(all, limits, h, u)?.unwrap_or_else(|| base.clone()),
            None => base.clone(),
        };
        changed(all, limits, &from, h)
    };
    if !b.scope.is_empty() {
        v.a_in_b_scope = verdict::in_scope(&own(ha)?, &b.scope);
    }
    if !a.scope.is_empty() {
        v.b_in_a_scope = verdict::in_scope(&own(hb)?, &a.scope);
    }
    Ok((base, v))
}
