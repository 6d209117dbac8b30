//! The merge attributes a pair is merged with: what `git merge` would read
//! from the branches' `.gitattributes`, limited to git's built-in merge
//! behaviour (issue 40).
//!
//! merge-tree runs in the bare `all.git`, where no `.gitattributes` is read:
//! `merge=union` would give a false conflict, `-merge` or `binary` a missed
//! one.  So every `.gitattributes` of the merge base is read as data, and
//! the host writes an attributes file (`state/radar/attrs/BASE`, passed as
//! `core.attributesFile`) that keeps, per pattern, only `merge`, `-merge`,
//! `!merge`, `merge=text|binary|union`, `binary` (as `-merge`) and
//! `conflict-marker-size=N`.  A driver a branch names (`merge=NAME`) is
//! dropped (git then merges as text, as it does for a driver no config
//! defines); filters, `diff=` and macros never reach git.  Nested files'
//! patterns are rewritten relative to the top.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use super::Limits;
use super::run::git_out;

/// Bytes of one `.gitattributes` read (more is ignored).
const MAX_FILE: usize = 256 << 10;
/// `.gitattributes` files read from one tree.
const MAX_FILES: usize = 64;

/// The attributes file for merges from `base` (made once per base).
pub(super) fn for_tree(all: &Path, limits: &Limits, base: &str) -> Result<PathBuf, String> {
    let dir = all.with_file_name("attrs");
    let path = dir.join(base);
    if path.exists() {
        return Ok(path);
    }
    let mut out = String::new();
    for (dir_of, spec) in files(all, limits, base) {
        let args = [
            OsStr::new("cat-file"),
            OsStr::new("blob"),
            OsStr::from_bytes(&spec),
        ];
        let small = Limits {
            output: MAX_FILE,
            ..*limits
        };
        if let Ok((_, blob)) = git_out(all, &small, &[], &args, &[0]) {
            out.push_str(&filter(&dir_of, &String::from_utf8_lossy(&blob)));
        }
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    base::fs::write_replace(&path, out.as_bytes(), 0o644, base::fs::Durability::Unsynced)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// The `.gitattributes` blobs of `base`: (their directory with a trailing
/// slash, or "", and `BASE:PATH`).  The top one when the tree is too large
/// to list.
fn files(all: &Path, limits: &Limits, base: &str) -> Vec<(String, Vec<u8>)> {
    let top = vec![(String::new(), format!("{base}:.gitattributes").into_bytes())];
    let args = ["ls-tree", "-r", "-z", "--full-tree", "--name-only", base];
    let Ok((_, list)) = git_out(all, limits, &[], &args, &[0]) else {
        return top;
    };
    let mut v = Vec::new();
    for p in list.split(|b| *b == 0) {
        let Ok(p) = std::str::from_utf8(p) else {
            continue;
        };
        if p == ".gitattributes" || p.ends_with("/.gitattributes") {
            let dir = &p[..p.len() - ".gitattributes".len()];
            v.push((dir.to_string(), format!("{base}:{p}").into_bytes()));
        }
        if v.len() == MAX_FILES {
            break;
        }
    }
    v
}

/// The lines of one `.gitattributes` in directory `dir` ("" or "d/e/"),
/// kept to the built-in merge attributes, patterns made relative to the top.
pub(super) fn filter(dir: &str, text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut words = line.split_ascii_whitespace();
        let Some(pat) = words.next() else { continue };
        if pat.starts_with('#') || pat.starts_with('"') || pat.starts_with("[attr]") {
            continue;
        }
        let kept: Vec<&str> = words
            .filter_map(|a| match a {
                "merge" | "-merge" | "!merge" | "merge=text" | "merge=binary" | "merge=union" => {
                    Some(a)
                }
                "binary" => Some("-merge"),
                _ if a
                    .strip_prefix("conflict-marker-size=")
                    .is_some_and(|n| n.parse::<u8>().is_ok()) =>
                {
                    Some(a)
                }
                _ => None,
            })
            .collect();
        if kept.is_empty() {
            continue;
        }
        let pat = if dir.is_empty() {
            pat.to_string()
        } else if let Some(p) = pat.strip_prefix('/') {
            format!("{dir}{p}")
        } else if pat.trim_end_matches('/').contains('/') {
            format!("{dir}{pat}")
        } else {
            format!("{dir}**/{pat}")
        };
        out.push_str(&format!("{pat} {}\n", kept.join(" ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_built_in_merge_attributes_pass() {
        let text = "# c\n*.log merge=union\n*.bin binary diff=evil\n*.c merge=evil filter=x\n\
                    [attr]mine -merge\n\"q s\" -merge\nlock.json -merge text eol=lf\n\
                    *.md conflict-marker-size=12 conflict-marker-size=x\n";
        assert_eq!(
            filter("", text),
            "*.log merge=union\n*.bin -merge\nlock.json -merge\n*.md conflict-marker-size=12\n"
        );
        assert_eq!(
            filter("d/e/", "*.log merge=union\n/top -merge\nsub/x -merge\n"),
            "d/e/**/*.log merge=union\nd/e/top -merge\nd/e/sub/x -merge\n"
        );
    }
}
