//! Secret values known to the host, kept from leaving through the door
//! (the mediator and lw-sync; mailbox-spec.md, "SECRETS AT THE DOOR").
//!
//! The values are never written anywhere by loopwright (lib/secrets.rs): a
//! sandbox's `--secret NAME` value lives in the environment of the command
//! that made the sandbox and in the sandbox's tmpfs.  The door therefore
//! learns them the same way, from its own environment: every name the
//! project allows (`sandbox.secrets` in `.loopwright/config`), every name in
//! `door.secrets` there, and the names the command adds (lw-sync adds its own
//! token).  A name unset in the environment is skipped.
//!
//! A value shorter than [`MIN_SECRET`] bytes is ignored with a warning:
//! masking a one-character "secret" would mask every `a` in every text.
//! Matching is exact, byte for byte; masking replaces every occurrence of a
//! value (longest first) with `[secret NAME]`.

use std::borrow::Cow;
use std::ffi::OsString;
use std::path::Path;

use crate::config::{Config, Project};
use crate::error::Result;

/// Shortest value treated as a secret, in bytes.
pub const MIN_SECRET: usize = 6;
/// The `.loopwright/config` key naming further secret variables.
pub const KEY_DOOR: &str = "door.secrets";

/// Known secret values.  `Debug` shows names only.
#[derive(Clone, Default)]
pub struct Secrets {
    /// (name, value), longest value first.
    list: Vec<(String, String)>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.list.iter().map(|(n, _)| n.as_str()).collect();
        write!(f, "Secrets({names:?})")
    }
}

impl Secrets {
    pub fn new() -> Secrets {
        Secrets::default()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Adds a value; returns a warning instead when it is too short to
    /// mask safely or not UTF-8 (no message can then contain it).
    pub fn add(&mut self, name: &str, value: &[u8]) -> Option<String> {
        let value = match std::str::from_utf8(value) {
            Ok(v) => v.trim_end_matches(['\n', '\r']),
            Err(_) => {
                return Some(format!(
                    "secret {name} is not UTF-8, so no message can contain it; not watched for"
                ));
            }
        };
        if value.len() < MIN_SECRET {
            return Some(format!(
                "secret {name} is shorter than {MIN_SECRET} bytes; ignored, so that the door does not mask every occurrence of it in ordinary text"
            ));
        }
        if !self.list.iter().any(|(_, v)| v == value) {
            self.list.push((name.to_string(), value.to_string()));
            self.list.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        }
        None
    }

    /// Adds the values of environment variables `names` (unset ones are skipped).
    pub fn add_env(
        &mut self,
        names: &[String],
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Vec<String> {
        let mut warnings = Vec::new();
        for n in names {
            if let Some(v) = env(n).filter(|v| !v.is_empty()) {
                warnings.extend(self.add(n, &v.into_encoded_bytes()));
            }
        }
        warnings
    }

    /// The secrets of the project around `dir` (none outside a project):
    /// the values of `sandbox.secrets` and `door.secrets` in `env`.
    pub fn for_project(
        dir: &Path,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<(Secrets, Vec<String>)> {
        let mut s = Secrets::new();
        let Some(p) = Project::find(dir)? else {
            return Ok((s, vec![]));
        };
        let names = names_in(&p.config)?;
        let w = s.add_env(&names, env);
        Ok((s, w))
    }

    /// The name of the first secret whose value occurs in `text`.
    pub fn find(&self, text: &str) -> Option<&str> {
        self.list
            .iter()
            .find(|(_, v)| text.contains(v.as_str()))
            .map(|(n, _)| n.as_str())
    }

    /// `text` with every known value replaced by `[secret NAME]`.
    pub fn mask<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if self.find(text).is_none() {
            return Cow::Borrowed(text);
        }
        let mut out = text.to_string();
        for (n, v) in &self.list {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), &format!("[secret {n}]"));
            }
        }
        Cow::Owned(out)
    }

    /// Masks `s` in place.
    pub fn mask_in(&self, s: &mut String) {
        if let Cow::Owned(m) = self.mask(s) {
            *s = m;
        }
    }
}

/// Every secret name a project's configuration lists.
pub fn names_in(c: &Config) -> Result<Vec<String>> {
    let mut names = crate::secrets::allowed(c)?;
    for n in c
        .get(KEY_DOOR)
        .unwrap_or("")
        .split(|ch: char| ch.is_whitespace() || ch == ',')
        .filter(|n| !n.is_empty())
    {
        if !crate::secrets::valid_name(n) {
            return Err(crate::Error::config(format!(
                "'{n}' in '{KEY_DOOR}' is not a variable name (letters, digits and '_', not starting with a digit)"
            )));
        }
        if !names.iter().any(|x| x == n) {
            names.push(n.to_string());
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_and_masks_longest_first() {
        let mut s = Secrets::new();
        assert!(s.add("SHORT", b"abcdef").is_none());
        assert!(s.add("LONG", b"abcdefghij").is_none());
        assert_eq!(s.find("x abcdefghij y"), Some("LONG"));
        assert_eq!(
            s.mask("abcdefghij and abcdef"),
            "[secret LONG] and [secret SHORT]"
        );
        assert!(matches!(s.mask("nothing here"), Cow::Borrowed(_)));
        assert!(!format!("{s:?}").contains("abcdef"));
    }

    #[test]
    fn a_one_character_secret_is_ignored_with_a_warning() {
        let mut s = Secrets::new();
        let w = s.add("A", b"a").expect("a warning");
        assert!(w.contains("shorter than 6 bytes"), "{w}");
        assert!(s.is_empty());
        assert_eq!(s.mask("banana"), "banana");
        assert!(
            s.add("BIN", &[0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa])
                .is_some()
        );
    }

    #[test]
    fn config_names_both_keys() {
        let c = Config::parse(
            "sandbox.secrets = API_KEY\ndoor.secrets = DEPLOY_KEY API_KEY\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(names_in(&c).unwrap(), ["API_KEY", "DEPLOY_KEY"]);
        let env = |n: &str| (n == "DEPLOY_KEY").then(|| OsString::from("d3pl0y-k3y\n"));
        let mut s = Secrets::new();
        assert!(s.add_env(&names_in(&c).unwrap(), &env).is_empty());
        assert_eq!(s.find("use d3pl0y-k3y"), Some("DEPLOY_KEY"));
    }
}
