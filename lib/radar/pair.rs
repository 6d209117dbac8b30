//! One pair's verdict: merge base, `git merge-tree --write-tree`, the hunks
//! of conflicted files, and the changed paths in the other's scope, each
//! git capped (radar/run.rs) and run in the host-owned `all.git`.

use std::path::Path;

use super::{Limits, Live, MAX_HUNK_FILES, Verdict, run, verdict};

/// Runs one capped git in `repo`; its stdout, or why not.
fn git_out(
    repo: &Path,
    limits: &Limits,
    args: &[&str],
    ok: &[i32],
) -> std::result::Result<(i32, Vec<u8>), String> {
    let mut c = run::git(repo);
    c.args(args);
    let r = run::run(c, limits).map_err(|e| format!("{}: {e}", args[0]))?;
    let code = r.status.code().unwrap_or(-1);
    if !ok.contains(&code) {
        return Err(format!(
            "{}: {}",
            args[0],
            crate::visible::visible(&crate::git::last_words(&r.stderr))
        ));
    }
    Ok((code, r.stdout))
}

/// The merge base and verdict of one pair, computed in `all`.
pub fn compute_pair(
    all: &Path,
    limits: &Limits,
    a: &Live,
    b: &Live,
    ha: &str,
    hb: &str,
) -> std::result::Result<(String, Verdict), String> {
    let (code, base) = git_out(all, limits, &["merge-base", ha, hb], &[0, 1])?;
    if code == 1 {
        return Err("no common history".into());
    }
    let base = String::from_utf8_lossy(&base).trim().to_string();
    let (_, out) = git_out(
        all,
        limits,
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
        let spec = format!("{}:{p}", mt.tree);
        match git_out(all, limits, &["cat-file", "blob", &spec], &[0]) {
            Ok((_, blob)) => verdict::hunks(&blob),
            Err(_) => vec![],
        }
    });
    let changed = |h: &str| -> std::result::Result<Vec<String>, String> {
        let (_, out) = git_out(
            all,
            limits,
            &[
                "diff-tree",
                "-r",
                "-z",
                "--name-only",
                "--no-renames",
                &base,
                h,
            ],
            &[0],
        )?;
        Ok(String::from_utf8_lossy(&out)
            .split('\0')
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect())
    };
    if !b.scope.is_empty() {
        v.a_in_b_scope = verdict::in_scope(&changed(ha)?, &b.scope);
    }
    if !a.scope.is_empty() {
        v.b_in_a_scope = verdict::in_scope(&changed(hb)?, &a.scope);
    }
    Ok((base, v))
}
