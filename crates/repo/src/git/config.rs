//! Reading a repository's configuration: the few values loopwright needs
//! (`origin`'s URL, a user's identity), read from the config text as git
//! reads it, or asked of git itself.

use std::path::Path;

use super::{command, last_words, output};
use base::error::{Error, Result};

/// `remote.origin.url` of the checkout whose git directory is `git_dir`.
/// The repository's own config file is read directly when it is plain;
/// one with includes or per-worktree config, or one that does not set the
/// key (it may come from the user's config), is asked of git itself.
pub fn origin_url(top: &Path, git_dir: &Path) -> Result<Option<String>> {
    let common = match std::fs::read_to_string(git_dir.join("commondir")) {
        Ok(c) => git_dir.join(c.trim()),
        Err(_) => git_dir.to_path_buf(),
    };
    if let Ok(text) = std::fs::read_to_string(common.join("config")) {
        let lower = text.to_ascii_lowercase();
        if !lower.contains("[include")
            && !lower.contains("worktreeconfig")
            && let Some(url) = config_value(&text, "remote", Some("origin"), "url")
        {
            return Ok(Some(url));
        }
    }
    config_get(top, "remote.origin.url")
}

/// The last value of `section.subsection.key` in git config text, or `None`
/// when it is absent or the text is beyond this reader (then ask git).
fn config_value(text: &str, section: &str, sub: Option<&str>, key: &str) -> Option<String> {
    let mut inside = false;
    let mut found = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let l = line.trim_start();
        if l.starts_with('[') {
            let end = l.find(']')?;
            let head = &l[1..end];
            inside = match head.split_once(char::is_whitespace) {
                Some((s, rest)) => {
                    let q = rest.trim();
                    let q = q.strip_prefix('"')?.strip_suffix('"')?;
                    if q.contains('\\') {
                        return None;
                    }
                    s.eq_ignore_ascii_case(section) && Some(q) == sub
                }
                None => {
                    // `[remote.origin]`, the old spelling, is lower-cased by git.
                    let (s, q) = match head.split_once('.') {
                        Some((s, q)) => (s, Some(q.to_ascii_lowercase())),
                        None => (head, None),
                    };
                    s.eq_ignore_ascii_case(section) && q.as_deref() == sub
                }
            };
            let rest = l[end + 1..].trim_start();
            if !(rest.is_empty() || rest.starts_with('#') || rest.starts_with(';')) {
                return None; // `[section] key = value` on one line: leave it to git
            }
            continue;
        }
        if !inside || l.is_empty() || l.starts_with('#') || l.starts_with(';') {
            continue;
        }
        let (k, v) = match l.split_once('=') {
            Some((k, v)) => (k.trim(), v),
            None => (l.trim(), ""),
        };
        if !k.eq_ignore_ascii_case(key) {
            continue;
        }
        let mut raw = v.to_string();
        while raw.trim_end().ends_with('\\') && !raw.trim_end().ends_with("\\\\") {
            let t = raw.trim_end();
            raw = format!("{}{}", &t[..t.len() - 1], lines.next()?);
        }
        found = Some(unquote(&raw)?);
    }
    found
}

/// A git config value: quotes removed, escapes resolved, comments cut.
fn unquote(raw: &str) -> Option<String> {
    let mut out = String::new();
    let mut quoted = false;
    let mut pending_space = String::new();
    let mut chars = raw.trim_start().chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' => {
                out.push_str(&pending_space);
                pending_space.clear();
                out.push(match chars.next()? {
                    'n' => '\n',
                    't' => '\t',
                    'b' => '\u{8}',
                    '"' => '"',
                    '\\' => '\\',
                    _ => return None,
                });
            }
            '#' | ';' if !quoted => break,
            c if c.is_whitespace() && !quoted => pending_space.push(c),
            c => {
                out.push_str(&pending_space);
                pending_space.clear();
                out.push(c);
            }
        }
    }
    (!quoted).then_some(out)
}

/// `git config --get KEY` in `dir`; `None` when unset.
pub fn config_get(dir: &Path, key: &str) -> Result<Option<String>> {
    let out = output(
        command(Some(dir)).args(["config", "--get", key]),
        "read the configuration",
    )?;
    match out.status.code() {
        Some(0) => Ok(Some(
            String::from_utf8_lossy(&out.stdout)
                .trim_end_matches('\n')
                .to_string(),
        )),
        Some(1) => Ok(None),
        _ => Err(Error::config(format!(
            "cannot read '{key}' in '{}': {}",
            dir.display(),
            last_words(&out.stderr)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base::config::find_checkout;

    #[test]
    fn reads_origin_from_plain_config_text_as_git_does() {
        let text = "[core]\n\tbare = false\n[remote \"upstream\"]\n\turl = /u\n[Remote \"origin\"]\n\tURL = https://h/x.git ; a comment\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n";
        assert_eq!(
            config_value(text, "remote", Some("origin"), "url").as_deref(),
            Some("https://h/x.git")
        );
        let text = "[remote \"origin\"]\n  url = \"/path with/#hash\"  # c\n[remote \"origin\"]\n  url = /later\n";
        assert_eq!(
            config_value(text, "remote", Some("origin"), "url").as_deref(),
            Some("/later")
        );
        let text = "[remote \"origin\"]\n  url = \"/a/#b\"\n";
        assert_eq!(
            config_value(text, "remote", Some("origin"), "url").as_deref(),
            Some("/a/#b")
        );
        let text = "[remote.origin]\n  url = /old\n";
        assert_eq!(
            config_value(text, "remote", Some("origin"), "url").as_deref(),
            Some("/old")
        );
        let text = "[remote \"Origin\"]\n  url = /other\n";
        assert_eq!(config_value(text, "remote", Some("origin"), "url"), None);
        assert_eq!(
            config_value(
                "[remote \"origin\"]\n url = \"/open\n",
                "remote",
                Some("origin"),
                "url"
            ),
            None
        );
    }

    #[test]
    fn config_reader_agrees_with_git() {
        let dir = std::env::temp_dir().join(format!("lw-git-config-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = output(command(None).args(["init", "-q"]).arg(&dir), "init").unwrap();
        assert!(out.status.success());
        for url in [
            "https://h/x.git",
            "/p a/t\"h#q;s",
            "  lead",
            "ssh://git@h:22/x",
        ] {
            let out = output(
                command(Some(&dir)).args(["config", "remote.origin.url", url]),
                "set",
            )
            .unwrap();
            assert!(out.status.success());
            let text = std::fs::read_to_string(dir.join(".git/config")).unwrap();
            let ours = config_value(&text, "remote", Some("origin"), "url");
            assert_eq!(
                ours,
                config_get(&dir, "remote.origin.url").unwrap(),
                "{url:?} in {text}"
            );
            let (top, git_dir) = find_checkout(&dir.join(".git/refs")).unwrap_or_default();
            assert_eq!(top, dir);
            assert_eq!(origin_url(&top, &git_dir).unwrap().as_deref(), Some(url));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
