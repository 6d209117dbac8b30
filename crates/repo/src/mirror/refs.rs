//! Keeping a mirror's refs cheap to read: counting loose refs and packing
//! them (refs only, never objects; see the module documentation).

use std::fs;
use std::path::Path;

use crate::git;
use base::cli::Report;

/// Loose refs a sync leaves before it packs them (see the module docs).
pub const LOOSE_REFS_MAX: usize = 32;

/// How many loose ref files `refs/` holds, counting up to `max`.
pub fn loose_refs(git_dir: &Path, max: usize) -> usize {
    fn walk(dir: &Path, n: &mut usize, max: usize) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            if *n >= max {
                return;
            }
            match e.file_type() {
                Ok(t) if t.is_dir() => walk(&e.path(), n, max),
                Ok(t) if t.is_file() => *n += 1,
                _ => {}
            }
        }
    }
    let mut n = 0;
    walk(&git_dir.join("refs"), &mut n, max);
    n
}

/// `git pack-refs --all`: every ref into `packed-refs`; objects are not
/// touched.  A failure (another git holds `packed-refs.lock`) is reported
/// and otherwise ignored: the refs stay loose and correct.
pub(super) fn pack_refs(git_dir: &Path, report: Report) {
    let res = git::output(
        git::command(None)
            .arg("--git-dir")
            .arg(git_dir)
            .args(["pack-refs", "--all", "--prune"]),
        "pack refs",
    );
    match res {
        Ok(out) if out.status.success() => {}
        Ok(out) => report(&format!(
            "refs of '{}' left loose for the next sync to pack: {}",
            git_dir.display(),
            git::last_words(&out.stderr)
        )),
        Err(e) => report(&format!(
            "refs of '{}' left loose for the next sync to pack: {e}",
            git_dir.display()
        )),
    }
}
