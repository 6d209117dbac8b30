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
//! An unknown key is an error too (exit 78, naming the key, the file, the
//! line and the closest known key): a misspelt `sandbx.memory` would
//! otherwise be ignored and the sandbox silently get the default.
//!
//! Each layer owns its keys ([`Keys`]: the door's `door.*` in the mailbox
//! crate, `engine.*` and `kube.*` in the engine crate, the rest in the
//! product), and a reader says which it checks ([`Check`]): the product's
//! commands check every key against the list the product assembles (the
//! one loopwright(7) lists); a lower layer's command (lw-mediate) refuses
//! what looks like one of its own keys and is not, and leaves the other
//! layers' keys to the commands that read them.  So a sandbox setting is
//! added in the product alone.
//!
//! The project is found from the git top level (the nearest directory up
//! from the current one that holds `.git`, as `git rev-parse --show-toplevel`
//! finds it), so every worktree of a project has its own `.loopwright/`.  Relative paths in values are relative to the project top.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Exit, Result};

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
        Config::parse_checked(text, path, key_ok, &|_, _| None)
    }

    /// Parses a project's `.loopwright/config`: [`Config::parse`], and
    /// every key must pass `check`.
    pub fn parse_project(text: &str, path: &Path, check: Check<'_>) -> Result<Config> {
        Config::parse_checked(text, path, &valid_key, &|key, line| {
            check.refuse(key).map(|hint| {
                Error::config(format!(
                    "unknown key '{key}' in '{}' line {line}; {hint}",
                    path.display()
                ))
            })
        })
    }

    /// `key_ok` checks a key's syntax, `refuse` (given the key and its line
    /// number) whether it is known.
    fn parse_checked(
        text: &str,
        path: &Path,
        key_ok: &dyn Fn(&str) -> bool,
        refuse: &dyn Fn(&str, usize) -> Option<Error>,
    ) -> Result<Config> {
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
            if let Some(e) = refuse(key, i + 1) {
                return Err(e);
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

    /// Reads a project's `.loopwright/config` at `path` (every key passing
    /// `check`, [`Config::parse_project`]); a missing file is an empty
    /// configuration.
    pub fn load(path: &Path, check: Check<'_>) -> Result<Config> {
        match std::fs::read_to_string(path) {
            Ok(text) => Config::parse_project(&text, path, check),
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

/// The keys one layer reads from `.loopwright/config`.  An upper-case part
/// stands for any name (`agent.KIT.ca`: `agent.claude.ca`); a last one may
/// itself hold dots (`egress.host.NAME`: `egress.host.api.internal`).  The
/// man page that documents each is named in loopwright(7), CONFIGURATION.
pub type Keys = &'static [&'static str];

/// Which keys a reader of `.loopwright/config` refuses.
#[derive(Clone, Copy, Debug)]
pub enum Check<'a> {
    /// Every key must be one of these (the product's commands, with every
    /// layer's keys): anything else is refused, with the closest key.
    All(&'a [Keys]),
    /// A lower layer's own keys: a key of their namespaces (the first
    /// dotted part: `door` of `door.secrets`) must be one of them, and a key
    /// whose namespace is a slip of theirs (`dor.secrets`) is refused; every
    /// other key is another layer's, left to the commands that read it.
    Own(Keys),
}

impl Check<'_> {
    /// None when `key` passes; else the hint that follows the refusal.
    pub fn refuse(&self, key: &str) -> Option<String> {
        match *self {
            Check::All(layers) => unknown_key(key, layers.iter().flat_map(|k| k.iter())),
            Check::Own(keys) => {
                let ns = |k: &str| k.split('.').next().unwrap_or("").to_string();
                let theirs = ns(key);
                let near = keys.iter().any(|k| {
                    let mine = ns(k);
                    mine == theirs || edit_distance(&mine, &theirs) <= mine.len().min(3) / 2
                });
                if near {
                    unknown_key(key, keys.iter())
                } else {
                    None
                }
            }
        }
    }
}

/// Whether `key` is `pattern` ([`KNOWN`]) with its upper-case part, if any,
/// filled in by a non-empty name.
fn matches(pattern: &str, key: &str) -> bool {
    let Some(at) = pattern.find(|c: char| c.is_ascii_uppercase()) else {
        return pattern == key;
    };
    let end = pattern[at..]
        .find(|c: char| !c.is_ascii_uppercase())
        .map_or(pattern.len(), |n| at + n);
    let (prefix, suffix) = (&pattern[..at], &pattern[end..]);
    key.len() > prefix.len() + suffix.len()
        && key.starts_with(prefix)
        && key.ends_with(suffix)
        && !key[prefix.len()..key.len() - suffix.len()].starts_with('.')
        && !key[prefix.len()..key.len() - suffix.len()].ends_with('.')
}

/// `pattern` with its upper-case part filled from `key`, part for part (the
/// last part takes the rest of `key`), so that `agnt.claude.ca` is compared
/// with `agent.claude.ca` and not with `agent.KIT.ca`.
fn fill(pattern: &str, key: &str) -> String {
    let parts: Vec<&str> = pattern.split('.').collect();
    let theirs: Vec<&str> = key.split('.').collect();
    let mut out = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        let placeholder = p.bytes().all(|b| b.is_ascii_uppercase());
        out.push(match (placeholder, i + 1 == parts.len()) {
            (true, true) if theirs.len() > i => theirs[i..].join("."),
            (true, false) if theirs.len() > i => theirs[i].to_string(),
            _ => p.to_string(),
        });
    }
    out.join(".")
}

/// None when `key` is one of `known`; else the hint that follows the
/// refusal: the closest known key when it is close enough to be a slip.
fn unknown_key<'k>(
    key: &str,
    known: impl Iterator<Item = &'k &'static str> + Clone,
) -> Option<String> {
    if known.clone().any(|p| matches(p, key)) {
        return None;
    }
    let best = known
        .map(|p| fill(p, key))
        .map(|c| (edit_distance(key, &c), c))
        .min();
    Some(match best {
        Some((d, best)) if d <= 3.max(key.len() / 3) => format!("did you mean '{best}'?"),
        _ => "loopwright(7) lists the known keys".to_string(),
    })
}

/// Levenshtein distance in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diag + usize::from(ca != *cb));
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
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
    /// Finds the project that contains `dir`, or `None` outside any git
    /// checkout; its configuration's keys must pass `check`.
    pub fn find(dir: &Path, check: Check<'_>) -> Result<Option<Project>> {
        let Some((top, git_dir)) = find_checkout(dir) else {
            return Ok(None);
        };
        let config = Config::load(&top.join(FILE), check)?;
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

/// Parses `512m`, `2g`, `1073741824` into bytes.
pub fn parse_bytes(s: &str) -> Option<i64> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mul) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1i64 << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (&s[..], 1),
    };
    num.parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .and_then(|n| n.checked_mul(mul))
}

/// The top of the checkout that contains `dir` and its git directory, found
/// without running git: the nearest directory, from `dir` up, that holds a
/// `.git` directory or a `.git` file (`gitdir: ...`, as in worktrees and
/// submodules).  This is what `git rev-parse --show-toplevel` answers in
/// every ordinary case, at no process's cost; `GIT_DIR` and
/// `GIT_CEILING_DIRECTORIES` are not consulted, because the commands act on
/// the project they are run in.
pub fn find_checkout(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut cur = Some(dir);
    while let Some(d) = cur {
        let dot = d.join(".git");
        if let Ok(md) = std::fs::metadata(&dot) {
            if md.is_dir() && dot.join("HEAD").exists() {
                return Some((d.to_path_buf(), dot));
            }
            if md.is_file() {
                let text = std::fs::read_to_string(&dot).ok()?;
                let target = text.strip_prefix("gitdir:")?.trim();
                return Some((d.to_path_buf(), d.join(target)));
            }
        }
        cur = d.parent();
    }
    None
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

    /// Two layers' keys, as the product assembles them.
    const DOOR: Keys = &["door.secrets", "door.log-max"];
    const SANDBOX: Keys = &["sandbox.memory", "agent.KIT.ca", "egress.host.NAME"];

    #[test]
    fn a_check_of_all_refuses_every_key_of_no_layer_with_the_closest() {
        let all = Check::All(&[DOOR, SANDBOX]);
        let p = Path::new("/p/.loopwright/config");
        let e = Config::parse_project(
            "door.log-max = 1g
sandbx.memory = 2g
",
            p,
            all,
        )
        .unwrap_err();
        assert_eq!(e.exit, Exit::Config);
        assert_eq!(
            e.msg,
            "unknown key 'sandbx.memory' in '/p/.loopwright/config' line 2; did you mean 'sandbox.memory'?"
        );
        for ok in [
            "door.secrets",
            "agent.claude.ca",
            "egress.host.api.internal",
        ] {
            assert_eq!(all.refuse(ok), None, "{ok}");
        }
        for bad in ["agent.ca", "agent..ca", "egress.host", "colour"] {
            assert!(all.refuse(bad).is_some(), "{bad}");
        }
        assert_eq!(
            all.refuse("colour").unwrap(),
            "loopwright(7) lists the known keys"
        );
    }

    #[test]
    fn a_check_of_own_keys_leaves_other_layers_keys_alone_but_not_slips_of_its_own() {
        let own = Check::Own(DOOR);
        for other in [
            "sandbox.memory",
            "sandbx.memory",
            "engine",
            "kube.storage-class",
        ] {
            assert_eq!(own.refuse(other), None, "{other}");
        }
        for (slip, hint) in [
            ("door.log-maxx", "did you mean 'door.log-max'?"),
            ("dor.secrets", "did you mean 'door.secrets'?"),
            ("doors.secrets", "did you mean 'door.secrets'?"),
        ] {
            assert_eq!(own.refuse(slip).as_deref(), Some(hint), "{slip}");
        }
        assert_eq!(own.refuse("door.secrets"), None);
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("sandbx", "sandbox"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("é", "e"), 1);
    }

    #[test]
    fn missing_file_is_empty() {
        let c = Config::load(Path::new("/nonexistent/loopwright/config"), Check::All(&[])).unwrap();
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
