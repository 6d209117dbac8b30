//! `.loopwright/sync.json`: which issue or pull request a run's entries go
//! to, who is mentioned on escalations and who may answer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::github::Target;
use base::error::{Error, Exit, Result};
use mailbox::log::Entry;

pub const CONFIG_DIR: &str = ".loopwright";
pub const CONFIG_FILE: &str = "sync.json";

/// Where one sandbox's messages go.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    #[serde(default)]
    pub repo: Option<String>,
    pub issue: u64,
}

/// `.loopwright/sync.json`.
#[derive(Clone, Debug, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// API base URL (GitHub Enterprise: `https://HOST/api/v3`).
    #[serde(default)]
    pub api_url: Option<String>,
    /// `OWNER/NAME` of the default target.
    #[serde(default)]
    pub repo: Option<String>,
    /// The run's issue or pull-request number.
    #[serde(default)]
    pub issue: Option<u64>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// GitHub logins mentioned on escalations to a human.
    #[serde(default)]
    pub mention: Vec<String>,
    /// Logins whose `/lw answer` lines are delivered; when empty, the
    /// repository's owners, members and collaborators.
    #[serde(default)]
    pub answerers: Vec<String>,
    /// The login the token posts as, used when GitHub refuses `GET /user`
    /// (GitHub App installation tokens, Actions' `GITHUB_TOKEN`).
    #[serde(default)]
    pub login: Option<String>,
    /// Further logins whose lw-sync comments are trusted (besides the token's user).
    #[serde(default)]
    pub trust: Vec<String>,
    /// Most log entries in one comment when a backlog is batched.
    #[serde(default)]
    pub batch: Option<usize>,
    /// A sandbox's own task issue or pull request.
    #[serde(default)]
    pub sandboxes: BTreeMap<String, TargetConfig>,
    /// Sandboxes whose target is a learned pull request, with the time
    /// (ms since the epoch) its number was recorded (`learn_pulls`).
    #[serde(skip)]
    pub pulls_since: BTreeMap<String, u64>,
    /// Federation: this host's name among `hosts` (lw-sync(1), FEDERATION).
    #[serde(default)]
    pub host: Option<String>,
    /// Federation: host name -> the GitHub login its lw-sync posts as.  Only
    /// comments by these logins are read as hosts' comments.
    #[serde(default)]
    pub hosts: BTreeMap<String, String>,
}

/// The federation part of the configuration, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Federation {
    /// This host's name.
    pub me: String,
    /// Host name -> login, this host's included.
    pub hosts: BTreeMap<String, String>,
}

impl Federation {
    /// The host whose lw-sync posts as `login`, if any.
    pub fn host_of(&self, login: &str) -> Option<&str> {
        self.hosts
            .iter()
            .find(|(_, l)| l.as_str() == login)
            .map(|(h, _)| h.as_str())
    }
    /// This host's own login.
    pub fn my_login(&self) -> &str {
        &self.hosts[&self.me]
    }
}

fn valid_login(l: &str) -> bool {
    !l.is_empty()
        && l.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'[' | b']'))
}

impl Config {
    /// `.loopwright/sync.json` in `start` or the nearest parent that has one.
    pub fn find(start: &Path) -> Option<PathBuf> {
        start
            .ancestors()
            .map(|d| d.join(CONFIG_DIR).join(CONFIG_FILE))
            .find(|p| p.is_file())
    }

    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read(path)
            .map_err(|e| Error::io_as(Exit::Config, "cannot read configuration", path, e))?;
        serde_json::from_slice(&text).map_err(|e| {
            Error::config(format!(
                "configuration '{}' is invalid: {e}",
                path.display()
            ))
        })
    }

    /// The federation settings, or None when `host` is unset.  Each host
    /// needs a login of its own: entries are named by message id, so two
    /// hosts posting as one login would take each other's entries for their
    /// own.
    pub fn federation(&self) -> Result<Option<Federation>> {
        let Some(me) = &self.host else {
            if !self.hosts.is_empty() {
                return Err(Error::config(
                    "\"hosts\" is set but \"host\" is not: name this host (one of the keys of \"hosts\") in .loopwright/sync.json",
                ));
            }
            return Ok(None);
        };
        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for (h, l) in &self.hosts {
            mailbox::registry::check_name(h)
                .map_err(|e| Error::config(format!("host name in \"hosts\": {e}")))?;
            if !valid_login(l) {
                return Err(Error::config(format!(
                    "host '{h}' maps to '{}', which is not a GitHub login",
                    l.escape_debug()
                )));
            }
            if let Some(other) = seen.insert(l, h) {
                return Err(Error::config(format!(
                    "hosts '{other}' and '{h}' both post as '{l}'; give each host a token of its own login"
                )));
            }
        }
        if !self.hosts.contains_key(me) {
            return Err(Error::config(format!(
                "\"host\" is '{me}', which is not among \"hosts\"; add \"{me}\": \"LOGIN\" (the login this host's token posts as)"
            )));
        }
        Ok(Some(Federation {
            me: me.clone(),
            hosts: self.hosts.clone(),
        }))
    }

    pub fn batch(&self) -> usize {
        self.batch.unwrap_or(20).max(1)
    }

    fn check(&self) -> Result<()> {
        if let Some(r) = &self.repo {
            Target::parse_repo(r)?;
        }
        for (name, t) in &self.sandboxes {
            if let Some(r) = &t.repo {
                Target::parse_repo(r)?;
            }
            if t.issue == 0 {
                return Err(Error::config(format!(
                    "sandbox '{name}' maps to issue 0; issue numbers start at 1"
                )));
            }
        }
        if let Some(l) = &self.login
            && !valid_login(l)
        {
            return Err(Error::config(format!(
                "login '{}' is not a GitHub login (e.g. octocat, github-actions[bot])",
                l.escape_debug()
            )));
        }
        for m in self.mention.iter().chain(&self.answerers) {
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(Error::config(format!(
                    "'{}' is not a GitHub login",
                    m.escape_debug()
                )));
            }
        }
        Ok(())
    }

    /// Learns the pull requests `lw-sandbox push --pr` opened (crates/sync/src/pr's
    /// records under `state`): a sandbox that sync.json does not map gets
    /// its branch's pull request as its target, for every entry not
    /// mirrored yet (one already mirrored stays where it went: the sync
    /// state says where, `Syncer::target_of`), so no entry is on two
    /// threads (#43).  A mapping written in sync.json wins.  Called again
    /// after each read of the log, so an entry read is never newer than the
    /// records learned.
    pub fn learn_pulls(&mut self, state: &Path) -> Result<()> {
        for (name, rec) in crate::pr::load_all(state)? {
            let Some(number) = rec.number else { continue };
            let learned = self.pulls_since.contains_key(&name);
            if self.sandboxes.contains_key(&name) && !learned {
                continue;
            }
            self.sandboxes.insert(
                name.clone(),
                TargetConfig {
                    repo: Some(rec.repo),
                    issue: number,
                },
            );
            self.pulls_since.insert(name, rec.since.unwrap_or(0));
        }
        Ok(())
    }

    /// The run's issue: `repo` and `issue` must both be set.
    pub fn default_target(&self) -> Result<Target> {
        self.check()?;
        match (&self.repo, self.issue) {
            (Some(r), Some(n)) if n > 0 => Ok(Target {
                repo: r.clone(),
                issue: n,
            }),
            (None, _) => Err(Error::config(
                "no repository: set \"repo\" in .loopwright/sync.json or pass --repo OWNER/NAME",
            )),
            _ => Err(Error::config(
                "no issue: set \"issue\" in .loopwright/sync.json or pass --issue N",
            )),
        }
    }

    /// Where an entry goes: its sender's task issue when mapped, else the
    /// first mapped recipient's, else the run's issue.
    pub fn target_for(&self, e: &Entry) -> Result<Target> {
        let mut parties = vec![e.sender.as_str()];
        if let Some(m) = &e.message {
            parties.extend(m.to.iter().map(String::as_str));
        }
        parties.extend(e.decision.to.iter().map(String::as_str));
        for p in parties {
            if let Some(t) = self.sandboxes.get(p) {
                let repo = match t.repo.clone().or_else(|| self.repo.clone()) {
                    Some(r) => r,
                    None => {
                        return Err(Error::config(format!(
                            "sandbox '{p}' has no repository and there is no default \"repo\""
                        )));
                    }
                };
                return Ok(Target {
                    repo,
                    issue: t.issue,
                });
            }
        }
        self.default_target()
    }

    /// Every configured target (for pull and verify).
    pub fn targets(&self) -> Result<Vec<Target>> {
        let mut set = BTreeSet::new();
        if self.repo.is_some() && self.issue.is_some() {
            set.insert(self.default_target()?);
        }
        for (name, t) in &self.sandboxes {
            let repo = t
                .repo
                .clone()
                .or_else(|| self.repo.clone())
                .ok_or_else(|| {
                    Error::config(format!(
                        "sandbox '{name}' has no repository and there is no default \"repo\""
                    ))
                })?;
            set.insert(Target {
                repo,
                issue: t.issue,
            });
        }
        if set.is_empty() {
            return Err(self
                .default_target()
                .expect_err("no target means the default target is incomplete"));
        }
        Ok(set.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(v: serde_json::Value) -> Config {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn federation_needs_a_login_per_host_and_names_this_one() {
        assert_eq!(Config::default().federation().unwrap(), None);
        let ok = cfg(serde_json::json!({"host": "a", "hosts": {"a": "bot-a", "b": "app[bot]"}}));
        let f = ok.federation().unwrap().unwrap();
        assert_eq!((f.my_login(), f.host_of("app[bot]")), ("bot-a", Some("b")));
        assert_eq!(f.host_of("mallory"), None);
        for (bad, says) in [
            (serde_json::json!({"hosts": {"a": "x"}}), "\"host\" is not"),
            (
                serde_json::json!({"host": "c", "hosts": {"a": "x"}}),
                "not among",
            ),
            (
                serde_json::json!({"host": "a", "hosts": {"a": "x", "b": "x"}}),
                "both post as 'x'",
            ),
            (
                serde_json::json!({"host": "a", "hosts": {"a": "x y"}}),
                "not a GitHub login",
            ),
            (
                serde_json::json!({"host": "A", "hosts": {"A": "x"}}),
                "not a valid sandbox name",
            ),
        ] {
            let e = cfg(bad).federation().unwrap_err();
            assert_eq!(e.exit, Exit::Config);
            assert!(e.msg.contains(says), "{}", e.msg);
        }
    }
}
