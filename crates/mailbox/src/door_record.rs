//! What the root records for the door besides the registry: a keyed digest
//! of each secret value a sandbox was made with, and the door's budgets
//! (mailbox-spec.md, "SECRETS AT THE DOOR" and "BUDGET AND REFUSALS").
//!
//! ```text
//! ROOT/state/door/key                random 32 bytes, hex (0600): the digests' key
//! ROOT/state/door/secrets/NAME.json  sandbox NAME's secrets, name -> HMAC-SHA256 (0600)
//! ROOT/state/door/budgets.json       door.log-max and door.quarantine-max (0600)
//! ```
//!
//! Why digests: the door learns a value from its own environment, by name
//! (redact/names.rs).  A door started with a different value under that
//! name would mask that one and pass the sandbox's unmasked, silently.  So
//! the command that makes a sandbox records, per secret, HMAC-SHA256 under
//! a random key of this root of `NAME NUL VALUE`, and the door refuses (78)
//! a value whose digest differs.  Keyed, so that a digest without the key
//! does not let anyone test guesses of a short value; the key is made once
//! per root, by whichever writer comes first (a link never replaces).
//!
//! Why budgets here: the door's caps were read from the project around the
//! working directory, so a mediator run from `/` applied the defaults
//! whatever the project set.  The command that records a sandbox's secret
//! names (lw-sandbox create; `lw-mediate register` inside a project) records
//! its project's caps, and lw-mediate reads them here first: the root wins
//! over the project around the working directory, which only warns when it
//! sets other values.
//!
//! All of it lives in `state/`, closed (0700) and outside every sandbox's
//! mounts: no sandbox reads or writes it.  Its files are written whole and
//! replaced atomically, opened without following a link.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::layout::Root;
use base::config::{FILE, Project, parse_bytes};
use base::digest::{hex, hmac_sha256};
use base::error::{Error, Exit, Result};
use base::fs::Durability;

/// The version of the files written here.
pub const VERSION: u32 = 1;
/// The digest scheme the secrets' files name.
pub const SCHEME: &str = "hmac-sha256";
/// Largest file read here (bytes).
const MAX_FILE: u64 = 256 * 1024;

/// The door's record in a root (`ROOT/state/door`).
#[derive(Clone, Debug)]
pub struct DoorRecord {
    root: Root,
    pub dir: PathBuf,
}

/// One sandbox's digests, as written.
#[derive(Serialize, Deserialize)]
struct Digests {
    version: u32,
    sandbox: String,
    digest: String,
    secrets: BTreeMap<String, String>,
}

/// The door's budgets as a project set them: `None` where it set none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budgets {
    /// `door.log-max`, bytes (above 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_max: Option<u64>,
    /// `door.quarantine-max`, bytes (0 keeps nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine_max: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct BudgetsFile {
    version: u32,
    #[serde(flatten)]
    budgets: Budgets,
    /// The configuration they were read from.
    project: String,
    /// When (RFC 3339 UTC).
    recorded: String,
}

/// The budgets in force and where they came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InForce {
    pub budgets: Budgets,
    /// `ROOT/state/door/budgets.json`, the project's config, or None (defaults).
    pub from: Option<PathBuf>,
}

impl Budgets {
    /// `door.log-max` and `door.quarantine-max` of the project `p`; a value
    /// that is not a size is 78 naming the key and the file.
    pub fn of_project(p: &Project) -> Result<Budgets> {
        let file = p.top.join(FILE);
        let size_of = |key: &str, want: &str, above0: bool| -> Result<Option<u64>> {
            let Some(v) = p.config.get(key) else {
                return Ok(None);
            };
            size(v)
                .filter(|n| !above0 || *n > 0)
                .map(Some)
                .ok_or_else(|| {
                    Error::config(format!(
                        "'{key} = {v}' in {}: expected {want}",
                        file.display()
                    ))
                })
        };
        Ok(Budgets {
            log_max: size_of("door.log-max", "a size above 0, such as 512k or 8m", true)?,
            quarantine_max: size_of(
                "door.quarantine-max",
                "a size, such as 16m or 0 (keep nothing)",
                false,
            )?,
        })
    }
}

impl DoorRecord {
    pub fn new(root: &Root) -> DoorRecord {
        DoorRecord {
            root: root.clone(),
            dir: root.state_dir().join("door"),
        }
    }

    fn key_path(&self) -> PathBuf {
        self.dir.join("key")
    }

    /// Where sandbox `name`'s digests are.
    pub fn secrets_path(&self, name: &str) -> PathBuf {
        self.dir.join("secrets").join(format!("{name}.json"))
    }

    /// [`Self::secrets_path`] of a valid sandbox name (64 otherwise): a
    /// name is a file name here.
    fn secrets_file(&self, name: &str) -> Result<PathBuf> {
        if !crate::layout::valid_name(name) {
            return Err(Error::usage(format!(
                "'{}' is not a valid sandbox name",
                name.escape_debug()
            )));
        }
        Ok(self.secrets_path(name))
    }

    pub fn budgets_path(&self) -> PathBuf {
        self.dir.join("budgets.json")
    }

    fn make_dir(&self, d: &Path) -> Result<()> {
        self.root
            .make_dir(d)
            .map_err(|e| Error::io("cannot create", d, e))
    }

    /// The root's key, made when `make` and missing; None when missing.
    fn key(&self, make: bool) -> Result<Option<Vec<u8>>> {
        let path = self.key_path();
        if let Some(text) = read_small(&path)? {
            return parse_key(&text).map(Some).ok_or_else(|| {
                Error::config(format!(
                    "the door's key '{}' is not 64 hex digits; remove it and the digests in '{}', then make the sandboxes again",
                    path.display(),
                    self.dir.join("secrets").display()
                ))
            });
        }
        if !make {
            return Ok(None);
        }
        self.make_dir(&self.dir)?;
        let mut key = [0u8; 32];
        key[..16].copy_from_slice(&base::id::random128().to_ne_bytes());
        key[16..].copy_from_slice(&base::id::random128().to_ne_bytes());
        let tmp = self
            .dir
            .join(format!(".key.{:032x}.tmp", base::id::random128()));
        base::fs::write_replace(
            &tmp,
            format!("{}\n", hex(&key)).as_bytes(),
            0o600,
            Durability::Synced,
        )
        .map_err(|e| Error::io("cannot write", &tmp, e))?;
        // A link never replaces: of two writers, the first one's key stays
        // and the other reads it.
        let linked = std::fs::hard_link(&tmp, &path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                base::fs::sync_dir(&self.dir)
                    .map_err(|e| Error::io("cannot fsync", &self.dir, e))?;
                Ok(Some(key.to_vec()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => self.key(false),
            Err(e) => Err(Error::io("cannot create", &path, e)),
        }
    }

    /// Records the keyed digests of `values` (name, value) for sandbox
    /// `sandbox`, replacing what it had; with no values, removes its file.
    pub fn record_secrets(&self, sandbox: &str, values: &[(String, Vec<u8>)]) -> Result<()> {
        let path = self.secrets_file(sandbox)?;
        if values.is_empty() {
            return self.forget(sandbox);
        }
        let key = self.key(true)?.expect("key(true) makes the key");
        let d = Digests {
            version: VERSION,
            sandbox: sandbox.to_string(),
            digest: SCHEME.into(),
            secrets: values
                .iter()
                .map(|(n, v)| (n.clone(), digest(&key, n, v)))
                .collect(),
        };
        self.make_dir(path.parent().expect("secrets/NAME.json has a parent"))?;
        let mut bytes = serde_json::to_vec_pretty(&d).expect("digests are plain data");
        bytes.push(b'\n');
        base::fs::write_replace(&path, &bytes, 0o600, Durability::Synced)
            .map_err(|e| Error::io("cannot write", &path, e))
    }

    /// Removes sandbox `sandbox`'s digests (its record went).
    pub fn forget(&self, sandbox: &str) -> Result<()> {
        let path = self.secrets_file(sandbox)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("cannot remove", &path, e)),
        }
    }

    /// Checks the values `env` gives against the digests recorded for
    /// sandbox `sandbox`: 78 naming the first secret whose value differs
    /// (never the value).  A name unset or empty in `env` is not checked
    /// here: the names the door must resolve fail on their own
    /// (redact/names.rs).  No file: nothing was recorded (a sandbox made
    /// before digests were), nothing to check.
    pub fn check(&self, sandbox: &str, env: &dyn Fn(&str) -> Option<OsString>) -> Result<()> {
        let path = self.secrets_file(sandbox)?;
        let Some(text) = read_small(&path)? else {
            return Ok(());
        };
        let bad = |why: &str| {
            Error::config(format!(
                "the door's record '{}' {why}; make the sandbox '{sandbox}' again (lw-sandbox rm, create) to record it anew",
                path.display()
            ))
        };
        let d: Digests = serde_json::from_slice(&text)
            .map_err(|e| bad(&format!("is not a record of digests: {e}")))?;
        if d.version != VERSION || d.digest != SCHEME || d.sandbox != sandbox {
            return Err(bad(&format!(
                "is version {} of {} for '{}', not version {VERSION} of {SCHEME} for '{sandbox}'",
                d.version, d.digest, d.sandbox
            )));
        }
        let Some(key) = self.key(false)? else {
            return Err(bad(&format!(
                "holds digests but the key '{}' is missing, so they cannot be checked",
                self.key_path().display()
            )));
        };
        for (name, want) in &d.secrets {
            let Some(v) = env(name).filter(|v| !v.is_empty()) else {
                continue;
            };
            if !same(&digest(&key, name, v.as_encoded_bytes()), want) {
                return Err(Error::config(format!(
                    "secret {name} in this environment is not the value sandbox '{sandbox}' was made with \
                     (its keyed digest, recorded in '{}', differs), so the door would pass that value unmasked; \
                     export {name} with the value the sandbox was made with (for lw-mediate, lw-sync \
                     and lw-sandbox start), or remove the sandbox",
                    path.display()
                )));
            }
        }
        Ok(())
    }

    /// Records the budgets `b`, read from `project` (its config file).
    pub fn record_budgets(&self, b: &Budgets, project: &Path) -> Result<()> {
        self.make_dir(&self.dir)?;
        let f = BudgetsFile {
            version: VERSION,
            budgets: b.clone(),
            project: project.to_string_lossy().into_owned(),
            recorded: base::time::rfc3339(base::time::now()),
        };
        let path = self.budgets_path();
        let mut bytes = serde_json::to_vec_pretty(&f).expect("budgets are plain data");
        bytes.push(b'\n');
        base::fs::write_replace(&path, &bytes, 0o600, Durability::Synced)
            .map_err(|e| Error::io("cannot write", &path, e))
    }

    /// The budgets the root records, None when it records none.
    pub fn budgets(&self) -> Result<Option<Budgets>> {
        let path = self.budgets_path();
        let Some(text) = read_small(&path)? else {
            return Ok(None);
        };
        match serde_json::from_slice::<BudgetsFile>(&text) {
            Ok(f) if f.version == VERSION && f.budgets.log_max != Some(0) => Ok(Some(f.budgets)),
            Ok(f) => Err(Error::config(format!(
                "the door's budgets '{}' are version {} with door.log-max {:?}; remove the file and run lw-sandbox create again",
                path.display(),
                f.version,
                f.budgets.log_max
            ))),
            Err(e) => Err(Error::config(format!(
                "the door's budgets '{}' are not readable: {e}; remove the file and run lw-sandbox create again",
                path.display()
            ))),
        }
    }

    /// The budgets in force: the root's record when there is one (the root
    /// wins), else those of the project around `cwd`, else none set.  The
    /// project around `cwd` is read either way (a value that is not a size
    /// is 78); the warnings say where it sets other values than the root.
    pub fn in_force(&self, cwd: &Path) -> Result<(InForce, Vec<String>)> {
        let here = match Project::find(cwd, crate::config::CHECK)? {
            Some(p) => Some((Budgets::of_project(&p)?, p.top.join(FILE))),
            None => None,
        };
        let Some(rec) = self.budgets()? else {
            return Ok(match here {
                Some((b, file)) => (
                    InForce {
                        budgets: b,
                        from: Some(file),
                    },
                    vec![],
                ),
                None => (
                    InForce {
                        budgets: Budgets::default(),
                        from: None,
                    },
                    vec![],
                ),
            });
        };
        let mut warnings = Vec::new();
        if let Some((b, file)) = here {
            for (key, root, proj) in [
                ("door.log-max", rec.log_max, b.log_max),
                ("door.quarantine-max", rec.quarantine_max, b.quarantine_max),
            ] {
                if root != proj {
                    let show =
                        |v: Option<u64>| v.map_or("unset".to_string(), |n| format!("{n} bytes"));
                    warnings.push(format!(
                        "{key} is {} in {} but {} in the root's '{}', which applies; \
                         lw-sandbox create (or lw-mediate register) in that project records its value",
                        show(proj),
                        file.display(),
                        show(root),
                        self.budgets_path().display()
                    ));
                }
            }
        }
        Ok((
            InForce {
                budgets: rec,
                from: Some(self.budgets_path()),
            },
            warnings,
        ))
    }
}

/// A size in bytes (`512k`, `8m`, `1073741824`), or `0`.
pub fn size(v: &str) -> Option<u64> {
    if v.trim() == "0" {
        return Some(0);
    }
    parse_bytes(v).and_then(|n| u64::try_from(n).ok())
}

/// The keyed digest of secret `name`'s `value`, hex.
fn digest(key: &[u8], name: &str, value: &[u8]) -> String {
    let mut msg = Vec::with_capacity(name.len() + 1 + value.len());
    msg.extend_from_slice(name.as_bytes());
    msg.push(0);
    msg.extend_from_slice(value);
    hex(&hmac_sha256(key, &msg))
}

/// Equal hex digests, compared in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn parse_key(text: &[u8]) -> Option<Vec<u8>> {
    let t = std::str::from_utf8(text).ok()?.trim_end_matches('\n');
    if t.len() != 64 {
        return None;
    }
    (0..32)
        .map(|i| u8::from_str_radix(t.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// The bytes of the regular file at `path`, opened without following a
/// link; None when absent.  Anything else there, or a file over
/// [`MAX_FILE`], is 78 naming it.
fn read_small(path: &Path) -> Result<Option<Vec<u8>>> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::io_as(
                Exit::Config,
                "cannot open the door's record",
                path,
                e,
            ));
        }
    };
    let meta = f
        .metadata()
        .map_err(|e| Error::io_as(Exit::Config, "cannot stat", path, e))?;
    if !meta.is_file() || meta.size() > MAX_FILE {
        return Err(Error::config(format!(
            "the door's record '{}' is not a regular file of at most {MAX_FILE} bytes; remove it",
            path.display()
        )));
    }
    let mut b = Vec::new();
    f.take(MAX_FILE)
        .read_to_end(&mut b)
        .map_err(|e| Error::io_as(Exit::Config, "cannot read", path, e))?;
    Ok(Some(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn root() -> Root {
        let d = std::env::temp_dir().join(format!("lw-door-record-{}", base::id::new_id()));
        std::fs::create_dir_all(&d).unwrap();
        Root::new(d)
    }

    const VALUE: &str = "sk-live-7f3a9c2b41";

    #[test]
    fn a_wrong_value_is_78_naming_the_secret_and_never_the_value() {
        let r = root();
        let d = DoorRecord::new(&r);
        d.record_secrets("api", &[("API_KEY".into(), VALUE.as_bytes().to_vec())])
            .unwrap();
        for p in [d.key_path(), d.secrets_path("api")] {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", p.display());
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(!text.contains(VALUE), "{text}");
            assert!(!text.contains(&base::digest::sha256_hex(VALUE.as_bytes())));
        }
        let env = |v: &'static str| move |n: &str| (n == "API_KEY").then(|| OsString::from(v));
        d.check("api", &env(VALUE)).unwrap();
        // Unset: the names' own rule applies (redact/names.rs).
        d.check("api", &|_| None).unwrap();
        // Not recorded: nothing to check.
        d.check("web", &env("other")).unwrap();
        for wrong in ["sk-live-7f3a9c2b42", "abcdef", "x", "sk-live-7f3a9c2b41\n"] {
            let e = d.check("api", &env(wrong)).unwrap_err();
            assert_eq!(e.exit, Exit::Config);
            assert!(e.msg.starts_with("secret API_KEY in this environment is not the value sandbox 'api' was made with"), "{e}");
            assert!(e.msg.contains("export API_KEY"), "{e}");
            assert!(!e.msg.contains(wrong) || wrong == "x", "{e}");
        }
        // Another root's key gives other digests: the key is the root's.
        let r2 = root();
        let d2 = DoorRecord::new(&r2);
        d2.record_secrets("api", &[("API_KEY".into(), VALUE.as_bytes().to_vec())])
            .unwrap();
        assert_ne!(
            std::fs::read(d.secrets_path("api")).unwrap(),
            std::fs::read(d2.secrets_path("api")).unwrap()
        );
        // The key gone: the digests cannot be checked, 78.
        std::fs::remove_file(d.key_path()).unwrap();
        let e = d.check("api", &env(VALUE)).unwrap_err();
        assert!(e.msg.contains("the key"), "{e}");
        for bad in ["../x", "A", ""] {
            let e = d.record_secrets(bad, &[("K".into(), b"value1".to_vec())]);
            assert_eq!(e.unwrap_err().exit, Exit::Usage, "{bad}");
        }
        // No values: the file goes.
        d.record_secrets("api", &[]).unwrap();
        assert!(!d.secrets_path("api").exists());
        for r in [r, r2] {
            std::fs::remove_dir_all(&r.dir).unwrap();
        }
    }

    #[test]
    fn the_key_is_made_once_and_a_link_is_not_followed() {
        let r = root();
        let d = DoorRecord::new(&r);
        let k1 = d.key(true).unwrap().unwrap();
        assert_eq!(d.key(true).unwrap().unwrap(), k1, "made once");
        std::fs::remove_file(d.key_path()).unwrap();
        let elsewhere = r.dir.join("elsewhere");
        std::fs::write(&elsewhere, format!("{}\n", "ab".repeat(32))).unwrap();
        std::os::unix::fs::symlink(&elsewhere, d.key_path()).unwrap();
        assert_eq!(d.key(false).unwrap_err().exit, Exit::Config);
        std::fs::remove_dir_all(&r.dir).unwrap();
    }

    #[test]
    fn the_roots_budgets_win_and_a_differing_project_warns() {
        let r = root();
        let d = DoorRecord::new(&r);
        let proj = r.dir.join("proj");
        std::fs::create_dir_all(proj.join(".loopwright")).unwrap();
        std::fs::create_dir_all(proj.join(".git")).unwrap();
        std::fs::write(proj.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        let outside = r.dir.clone();
        let (f, w) = d.in_force(&outside).unwrap();
        assert_eq!((f.budgets, f.from, w.len()), (Budgets::default(), None, 0));
        std::fs::write(proj.join(FILE), "door.log-max = 64k\n").unwrap();
        let (f, _) = d.in_force(&proj).unwrap();
        assert_eq!(f.budgets.log_max, Some(64 << 10));
        let b = Budgets {
            log_max: Some(4096),
            quarantine_max: Some(0),
        };
        std::fs::write(
            proj.join(FILE),
            "door.log-max = 64k\ndoor.quarantine-max = 0\n",
        )
        .unwrap();
        assert_eq!(
            d.in_force(&proj).unwrap().0.budgets.quarantine_max,
            Some(0),
            "0 keeps nothing"
        );
        std::fs::write(proj.join(FILE), "door.log-max = 64k\n").unwrap();
        d.record_budgets(&b, &proj.join(FILE)).unwrap();
        let (f, w) = d.in_force(&outside).unwrap();
        assert_eq!(f.budgets, b);
        assert!(w.is_empty(), "{w:?}");
        let (f, w) = d.in_force(&proj).unwrap();
        assert_eq!(f.budgets, b, "the root wins");
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with("door.log-max is 65536 bytes in "),
            "{}",
            w[0]
        );
        assert!(
            w[1].contains("door.quarantine-max is unset in "),
            "{}",
            w[1]
        );
        std::fs::write(d.budgets_path(), "{").unwrap();
        assert_eq!(d.in_force(&outside).unwrap_err().exit, Exit::Config);
        std::fs::remove_dir_all(&r.dir).unwrap();
    }
}
