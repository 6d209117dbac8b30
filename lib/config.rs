//! Project configuration: `.loopwright/config` at the top of the project's
//! git checkout.
//!
//! The format is deliberately small, so that a shell script can read it with
//! `sed` and a person can edit it without a manual:
//!
//! ```text
//! # comment lines and blank lines are ignored
//! mirror.path = .loopwright/cache/mirror.git
//! mirror.url  = https://example.com/project.git
//! ```
//!
//! One `key = value` per line.  A key is made of lower-case letters, digits,
//! `-`, `_` and `.` (a dotted name: `mirror.path`, `sandbox.ports`).  White
//! space around the key and the value is trimmed; the value is the rest of
//! the line, taken literally (no quoting, no escapes, no inline comments).  A
//! key given twice is an error, so that the file never means two things.
//! Unknown keys are kept: each command reads the keys it knows.
//!
//! The project is found from the git top level (the nearest directory up
//! from the current one that holds `.git`, as `git rev-parse --show-toplevel`
//! finds it), so every worktree of a project has its own `.loopwright/`.  Relative paths in values are relative to the project top.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Exit, Result};
use crate::git;

/// The project's directory for loopwright files, relative to its top level.
pub const DIR: &str = ".loopwright";
/// The configuration file, relative to the project's top level.
pub const FILE: &str = ".loopwright/config";
/// The git-ignored cache, relative to the project's top level.
pub const CACHE: &str = ".loopwright/cache";

/// A parsed `key = value` file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    values: BTreeMap<String, String>,
    /// Where the values came from, for error messages.
    pub path: Option<PathBuf>,
}

impl Config {
    /// Parses `text`; `path` names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config> {
        Config::parse_keys(text, path, &valid_key)
    }

    /// Parses `text` with `key_ok` deciding which keys are valid (a service
    /// declaration's `env.NAME` keeps the variable's case, lib/service).
    pub fn parse_keys(text: &str, path: &Path, key_ok: &dyn Fn(&str) -> bool) -> Result<Config> {
        let mut values = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| Error::config(format!("{}:{}: {why}", path.display(), i + 1));
            let Some((key, value)) = line.split_once('=') else {
                return Err(bad("expected 'key = value'"));
            };
            let key = key.trim();
            if !key_ok(key) {
                return Err(bad(&format!(
                    "invalid key '{key}' (use lower-case letters, digits, '-', '_' and '.')"
                )));
            }
            if values
                .insert(key.to_string(), value.trim().to_string())
                .is_some()
            {
                return Err(bad(&format!("key '{key}' given twice")));
            }
        }
        Ok(Config {
            values,
            path: Some(path.to_path_buf()),
        })
    }

    /// Reads `path`; a missing file is an empty configuration.
    pub fn load(path: &Path) -> Result<Config> {
        match std::fs::read_to_string(path) {
            Ok(text) => Config::parse(&text, path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Config {
                values: BTreeMap::new(),
                path: Some(path.to_path_buf()),
            }),
            Err(e) => Err(Error::io_as(Exit::Config, "cannot read", path, e)),
        }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.values
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// Iterates over all keys and values, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// The keys of `.loopwright/config`: lower-case letters, digits, `-`, `_`, `.`.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && !key.starts_with('.')
        && !key.ends_with('.')
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

/// A project: the top of a git checkout and its `.loopwright/config`.
#[derive(Clone, Debug)]
pub struct Project {
    pub top: PathBuf,
    /// The checkout's git directory (`.git`, or where a `.git` file points).
    pub git_dir: PathBuf,
    pub config: Config,
}

impl Project {
    /// Finds the project that contains `dir`, or `None` outside any git checkout.
    pub fn find(dir: &Path) -> Result<Option<Project>> {
        let Some((top, git_dir)) = git::find_checkout(dir) else {
            return Ok(None);
        };
        let config = Config::load(&top.join(FILE))?;
        Ok(Some(Project {
            top,
            git_dir,
            config,
        }))
    }

    /// `value` as a path: relative paths are relative to the project top.
    pub fn path(&self, value: &str) -> PathBuf {
        let p = Path::new(value);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.top.join(p)
        }
    }

    /// The project's cache directory (`.loopwright/cache`).
    pub fn cache(&self) -> PathBuf {
        self.top.join(CACHE)
    }
}

/// Parses a duration: `90`, `90s`, `15m`, `2h`, `1d`, or sums such as `1h30m`.
/// A bare number is seconds.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = match &rest[..unit_len] {
            "" if digits == s.len() => 1,
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total = total.checked_add(n.checked_mul(unit)?)?;
    }
    Some(Duration::from_secs(total))
}

/// True for a name usable as an environment variable and a file name
/// (secret names: letters, digits and `_`, not starting with a digit).
pub fn valid_var_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keys_values_comments_and_blank_lines() {
        let c = Config::parse(
            "# top\n\nmirror.path = a b \n sandbox.ports=4000-4100\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(c.get("mirror.path"), Some("a b"));
        assert_eq!(c.get("sandbox.ports"), Some("4000-4100"));
        assert_eq!(c.get("mirror.url"), None);
        assert_eq!(c.iter().count(), 2);
    }

    #[test]
    fn value_keeps_equals_signs_and_hashes() {
        let c = Config::parse("mirror.url = https://h/p?a=b#x\n", Path::new("c")).unwrap();
        assert_eq!(c.get("mirror.url"), Some("https://h/p?a=b#x"));
    }

    #[test]
    fn rejects_missing_equals_bad_keys_and_duplicates_with_line_numbers() {
        let e = Config::parse("ok = 1\nnonsense\n", Path::new("f")).unwrap_err();
        assert_eq!(e.exit, Exit::Config);
        assert_eq!(e.to_string(), "f:2: expected 'key = value'");
        let e = Config::parse("Mirror.Path = x\n", Path::new("f")).unwrap_err();
        assert!(
            e.to_string().starts_with("f:1: invalid key 'Mirror.Path'"),
            "{e}"
        );
        let e = Config::parse("a = 1\na = 2\n", Path::new("f")).unwrap_err();
        assert_eq!(e.to_string(), "f:2: key 'a' given twice");
    }

    #[test]
    fn missing_file_is_empty() {
        let c = Config::load(Path::new("/nonexistent/loopwright/config")).unwrap();
        assert_eq!(c.iter().count(), 0);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Some(Duration::from_secs(900)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Some(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        for bad in ["", "m", "1x", "1h30", "-1s", "1.5h", "h1"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }
}
