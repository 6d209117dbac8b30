//! Which secret names the door knows, whatever its working directory.
//!
//! The root records them: the registry record of each of this host's
//! sandboxes (`ROOT/registry/NAME.json`, mailbox-spec.md "THE REGISTRY")
//! names the secrets the sandbox was given (`secrets`), and the names its
//! project's `.loopwright/config` listed when it was made (`door_secrets`,
//! `allowed_secrets`).  lw-sandbox create writes them; `lw-mediate register
//! --secret` does by hand.  Values are never recorded: the door reads them
//! from its own environment, where lw-sandbox read them.
//!
//! Sandboxes made before registry records carried names have them only in
//! lw-sandbox's own record, `ROOT/state/sandbox/NAME.json` (its `secrets`
//! field, names only); the door reads that field too, at start, so an
//! upgrade leaves no sandbox's secrets unwatched.
//!
//! The value must be the one the sandbox was made with: lw-sandbox create
//! (and `lw-mediate register`) records a keyed digest of each value it had
//! (crate::door_record), and a value here whose digest differs is a
//! configuration error (78) naming the secret, never the value: the door
//! would mask its own value and pass the sandbox's.
//!
//! A name a sandbox was given, or one its project's `door.secrets` lists,
//! must resolve: the sandbox holds that value, or the operator asked the
//! door to watch for it, and a door that cannot see it would pass it
//! silently.  So an unset one is a configuration error (78) naming the
//! secret and the record.  A name merely allowed by `sandbox.secrets` is
//! watched for when set.  The project around the working directory adds its
//! names as before, unset ones skipped: it is an addition, never the only
//! source.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::Secrets;
use crate::door_record::DoorRecord;
use crate::layout::Root;
use crate::registry::{Registry, Sandbox};
use base::config::{Config, valid_var_name};
use base::error::{Error, Result};

/// The `.loopwright/config` key naming further secret variables.
pub const KEY_DOOR: &str = "door.secrets";
/// The `.loopwright/config` key naming the secrets a sandbox may be given
/// (crates/wall/src/secrets.rs reads it for lw-sandbox; the door reads it here).
pub const KEY_SANDBOX: &str = "sandbox.secrets";

/// The variable names listed by `key` (space or comma separated).
fn list(c: &Config, key: &str) -> Result<Vec<String>> {
    let mut names: Vec<String> = Vec::new();
    for n in c
        .get(key)
        .unwrap_or("")
        .split(|ch: char| ch.is_whitespace() || ch == ',')
        .filter(|n| !n.is_empty())
    {
        if !valid_var_name(n) {
            return Err(Error::config(format!(
                "'{n}' in '{key}' is not a variable name (letters, digits and '_', not starting with a digit)"
            )));
        }
        if !names.iter().any(|x| x == n) {
            names.push(n.to_string());
        }
    }
    Ok(names)
}

/// The names of a project's `door.secrets`.
pub fn door_names(c: &Config) -> Result<Vec<String>> {
    list(c, KEY_DOOR)
}

/// Every secret name a project's configuration lists: `sandbox.secrets`,
/// then `door.secrets`.
pub fn names_in(c: &Config) -> Result<Vec<String>> {
    let mut names = list(c, KEY_SANDBOX)?;
    for n in door_names(c)? {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    Ok(names)
}

impl Secrets {
    /// The secrets the door keeps from leaving the root `root`: every name
    /// the registry records (see the module documentation), then the
    /// project around `cwd`, each value from `env`.  Returns the warnings
    /// (short values, unreadable records); fails with 78 on a name that must
    /// resolve and does not.
    pub fn for_root(
        root: &Root,
        cwd: &Path,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<(Secrets, Vec<String>)> {
        let mut s = Secrets::new();
        let (good, bad) = Registry::new(root).list()?;
        let mut warnings: Vec<String> = bad
            .into_iter()
            .map(|b| {
                format!(
                    "registry record '{}' skipped: {}; the secrets it names are not known",
                    b.file, b.reason
                )
            })
            .collect();
        warnings.extend(s.add_recorded(root, good.iter(), env)?);
        for (path, name, names) in sandbox_records(root) {
            for n in &names {
                if s.knows(n) {
                    continue;
                }
                match env(n).filter(|v| !v.is_empty()) {
                    Some(v) => warnings.extend(s.add(n, &v.into_encoded_bytes())),
                    None => return Err(unresolved(n, &path, "it was given to sandbox", &name)),
                }
            }
        }
        warnings.extend(s.add_project(cwd, env)?);
        Ok((s, warnings))
    }

    /// Looks up the names `records` (this host's registry records, in
    /// `root`) carry that were not looked up yet, and checks the values
    /// against the digests `root` records for each record not checked yet.
    /// Fails with 78 on the first that must resolve and is unset or empty
    /// in `env`, and on a value whose digest differs.
    pub fn add_recorded<'a>(
        &mut self,
        root: &Root,
        records: impl IntoIterator<Item = &'a Sandbox>,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<Vec<String>> {
        let registry_dir = root.registry_dir();
        let door = DoorRecord::new(root);
        let mut warnings = Vec::new();
        for r in records.into_iter().filter(|r| r.host.is_none()) {
            let must = r
                .secrets
                .iter()
                .map(|n| (n, "it was given to sandbox"))
                .chain(
                    r.door_secrets
                        .iter()
                        .map(|n| (n, "door.secrets of the project of sandbox")),
                );
            for (n, why) in must {
                if self.knows(n) {
                    continue;
                }
                match env(n).filter(|v| !v.is_empty()) {
                    Some(v) => warnings.extend(self.add(n, &v.into_encoded_bytes())),
                    None => {
                        let path = registry_dir.join(format!("{}.json", r.name));
                        return Err(unresolved(n, &path, why, &r.name));
                    }
                }
            }
            let seen = (r.name.clone(), r.registered.clone());
            if !self.checked.contains(&seen) {
                door.check(&r.name, env)?;
                self.checked.insert(seen);
            }
            let optional: Vec<String> = r
                .allowed_secrets
                .iter()
                .filter(|n| !self.knows(n))
                .cloned()
                .collect();
            warnings.extend(self.add_env(&optional, env));
        }
        Ok(warnings)
    }
}

fn unresolved(n: &str, path: &Path, why: &str, sandbox: &str) -> Error {
    Error::config(format!(
        "cannot resolve secret {n} named by '{}': {n} is not set in this environment, and {why} {sandbox}; \
         export {n} where lw-mediate and lw-sync run (they must know every value they keep from leaving), \
         or remove the sandbox",
        path.display()
    ))
}

/// The `secrets` of lw-sandbox's records, `ROOT/state/sandbox/*.json`
/// (path, sandbox, names).  Only that field is read: the door does not
/// depend on the rest of the wall's record.  A record that does not parse
/// is lw-sandbox's to report (`lw-sandbox gc`).
fn sandbox_records(root: &Root) -> Vec<(PathBuf, String, Vec<String>)> {
    #[derive(serde::Deserialize)]
    struct Names {
        name: String,
        #[serde(default)]
        secrets: Vec<String>,
    }
    let dir = root.state_dir().join("sandbox");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return vec![];
    };
    let mut out = Vec::new();
    for ent in rd.flatten() {
        let p = ent.path();
        let f = ent.file_name();
        let f = f.to_string_lossy();
        if f.starts_with('.') || !f.ends_with(".json") {
            continue;
        }
        let Ok(b) = std::fs::read(&p) else { continue };
        if let Ok(r) = serde_json::from_slice::<Names>(&b) {
            let names: Vec<String> = r
                .secrets
                .into_iter()
                .filter(|n| valid_var_name(n))
                .collect();
            if !names.is_empty() {
                out.push((p, r.name, names));
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use base::error::Exit;

    #[test]
    fn config_names_both_keys() {
        let c = Config::parse(
            "sandbox.secrets = API_KEY\ndoor.secrets = DEPLOY_KEY API_KEY\n",
            Path::new("c"),
        )
        .unwrap();
        assert_eq!(names_in(&c).unwrap(), ["API_KEY", "DEPLOY_KEY"]);
        assert_eq!(door_names(&c).unwrap(), ["DEPLOY_KEY", "API_KEY"]);
        let env = |n: &str| (n == "DEPLOY_KEY").then(|| OsString::from("d3pl0y-k3y\n"));
        let mut s = Secrets::new();
        assert!(s.add_env(&names_in(&c).unwrap(), &env).is_empty());
        assert_eq!(s.find("use d3pl0y-k3y"), Some("DEPLOY_KEY"));
        let bad = Config::parse("sandbox.secrets = 9LIVES\n", Path::new("c")).unwrap();
        assert_eq!(names_in(&bad).unwrap_err().exit, Exit::Config);
    }

    fn record(name: &str, given: &[&str], door: &[&str], allowed: &[&str]) -> Sandbox {
        let mut r = Sandbox::new(name, None, vec![]);
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        r.secrets = v(given);
        r.door_secrets = v(door);
        r.allowed_secrets = v(allowed);
        r
    }

    #[test]
    fn recorded_names_resolve_or_fail_with_78_naming_the_secret() {
        let dir = &Root::new("/r");
        let env = |n: &str| match n {
            "API_KEY" => Some(OsString::from("sk-live-0123456789")),
            "DEPLOY_KEY" => Some(OsString::from("d3pl0y-k3y")),
            "EMPTY" => Some(OsString::new()),
            _ => None,
        };
        let mut s = Secrets::new();
        let recs = [
            record(
                "api",
                &["API_KEY"],
                &["DEPLOY_KEY"],
                &["API_KEY", "NPM_TOKEN"],
            ),
            // Another host's proxy: its secrets are not here.
            Sandbox {
                host: Some("other".into()),
                ..record("far", &["FAR_KEY"], &[], &[])
            },
        ];
        assert!(s.add_recorded(dir, &recs, &env).unwrap().is_empty());
        assert_eq!(s.len(), 2);
        assert_eq!(s.find("x sk-live-0123456789"), Some("API_KEY"));
        assert_eq!(s.find("d3pl0y-k3y"), Some("DEPLOY_KEY"));
        // Unset, given: 78 naming it, the record and the way out.
        for (given, door) in [(&["NPM_TOKEN"][..], &[][..]), (&[], &["EMPTY"])] {
            let e = s
                .add_recorded(dir, &[record("web", given, door, &[])], &env)
                .unwrap_err();
            let n = given.first().or(door.first()).unwrap();
            assert_eq!(e.exit, Exit::Config);
            assert!(e.msg.contains(&format!("cannot resolve secret {n}")), "{e}");
            assert!(e.msg.contains("'/r/registry/web.json'"), "{e}");
            assert!(e.msg.contains(&format!("export {n}")), "{e}");
        }
        // lw-sandbox's own record of a sandbox made before registry
        // records carried names.
        let root =
            Root::new(std::env::temp_dir().join(format!("lw-redact-{}", base::id::new_id())));
        std::fs::create_dir_all(root.state_dir().join("sandbox")).unwrap();
        std::fs::write(
            root.state_dir().join("sandbox/old.json"),
            r#"{"version":1,"name":"old","secrets":["OLD_KEY"],"other":"fields"}"#,
        )
        .unwrap();
        let here = root.dir.clone();
        let e = Secrets::for_root(&root, &here, &env).unwrap_err();
        assert_eq!(e.exit, Exit::Config);
        assert!(e.msg.contains("secret OLD_KEY named by '"), "{e}");
        assert!(e.msg.contains("state/sandbox/old.json'"), "{e}");
        let env2 = |n: &str| (n == "OLD_KEY").then(|| OsString::from("0ld-k3y-value"));
        let (s2, _) = Secrets::for_root(&root, &here, &env2).unwrap();
        assert_eq!(s2.find("MGxkLWszeS12YWx1ZQ"), Some("OLD_KEY"));
        std::fs::remove_dir_all(&root.dir).unwrap();
        // Merely allowed and unset: skipped.
        let mut s = Secrets::new();
        assert!(
            s.add_recorded(dir, &[record("web", &[], &[], &["NPM_TOKEN"])], &env)
                .unwrap()
                .is_empty()
        );
        assert!(s.is_empty());
    }
}
