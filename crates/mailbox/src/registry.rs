//! The sandbox registry: which sandboxes exist, their branch and their scope
//! (mailbox-spec.md, "THE REGISTRY").
//!
//! One file per sandbox, `ROOT/registry/NAME.json`, so that lw-sandbox and an
//! operator never rewrite each other's records and a reader never needs a
//! lock.  A record is replaced atomically: written to a hidden temporary file
//! in the same directory, fsynced, renamed over `NAME.json` (here replacing
//! is the point), then the directory is fsynced.  A reader therefore sees the
//! old record or the new one, never a mix.  Readers skip names that start
//! with `.` (temporaries) and names that do not end in `.json`.
//!
//! The mediator treats a recipient as known when its record exists; a name
//! whose record was removed ("gone") gets a bounce, never a silent drop.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::layout::{self, Root};
use base::error::{Error, Exit, Result};

pub const REGISTRY_VERSION: u32 = 1;
/// Largest record a reader opens (bytes); records are a few hundred bytes.
pub const MAX_RECORD: u64 = 256 * 1024;
pub const MAX_SCOPE: usize = 256;

/// One sandbox's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sandbox {
    pub version: u32,
    pub name: String,
    /// The git branch the sandbox pushes its work to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// Path globs (`src/api/**`) or named contracts (`schema:users`) the
    /// sandbox owns or depends on.  Empty: the sandbox declared no scope and
    /// receives every contract change.
    #[serde(default)]
    pub scope: Vec<String>,
    /// When the record was written (RFC 3339 UTC).
    pub registered: String,
    /// Set for a sandbox of another host (federation, lw-sync(1)): lw-sync
    /// keeps this record after that host's announcement, and delivers that
    /// sandbox's messages into this mailbox's outbox.  Absent: this host's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Names of the secrets the sandbox was given (values never are
    /// recorded): the door must resolve each (crates/mailbox/src/redact/names.rs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// Its project's `door.secrets` when it was made: the door must
    /// resolve each too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub door_secrets: Vec<String>,
    /// Its project's `sandbox.secrets` when it was made: the door watches
    /// for those that are set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_secrets: Vec<String>,
}

impl Sandbox {
    pub fn new(name: &str, branch: Option<String>, scope: Vec<String>) -> Sandbox {
        Sandbox {
            version: REGISTRY_VERSION,
            name: name.to_string(),
            branch,
            scope,
            registered: base::time::rfc3339(base::time::now()),
            host: None,
            secrets: Vec::new(),
            door_secrets: Vec::new(),
            allowed_secrets: Vec::new(),
        }
    }

    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.version != REGISTRY_VERSION {
            return Err(format!(
                "unsupported registry version {} (this reader knows {REGISTRY_VERSION})",
                self.version
            ));
        }
        check_name(&self.name)?;
        if let Some(h) = &self.host {
            check_name(h).map_err(|e| format!("host: {e}"))?;
        }
        if let Some(b) = &self.branch
            && (b.is_empty() || b.len() > 255 || b.chars().any(|c| c.is_control() || c == ' '))
        {
            return Err(format!(
                "branch '{}' is empty, too long or has spaces or control characters",
                b.escape_debug()
            ));
        }
        if self.scope.len() > MAX_SCOPE {
            return Err(format!(
                "scope has {} entries; the limit is {MAX_SCOPE}",
                self.scope.len()
            ));
        }
        for s in &self.scope {
            if s.is_empty() || s.len() > crate::message::MAX_REF || s.chars().any(char::is_control)
            {
                return Err(format!(
                    "scope entry '{}' is empty, too long or has a control character",
                    s.escape_debug()
                ));
            }
        }
        for (field, names) in [
            ("secrets", &self.secrets),
            ("door_secrets", &self.door_secrets),
            ("allowed_secrets", &self.allowed_secrets),
        ] {
            if names.len() > MAX_SCOPE {
                return Err(format!(
                    "{field} has {} names; the limit is {MAX_SCOPE}",
                    names.len()
                ));
            }
            if let Some(n) = names.iter().find(|n| !base::config::valid_var_name(n)) {
                return Err(format!(
                    "{field}: '{}' is not a secret name (letters, digits and '_', not starting with a digit)",
                    n.escape_debug()
                ));
            }
        }
        if base::time::parse_rfc3339(&self.registered).is_none() {
            return Err(format!(
                "registered '{}' is not an RFC 3339 UTC time",
                self.registered.escape_debug()
            ));
        }
        Ok(())
    }
}

/// A sandbox name must be valid and must not be one of the reserved parties.
pub fn check_name(name: &str) -> std::result::Result<(), String> {
    if !layout::valid_name(name) {
        return Err(format!(
            "'{}' is not a valid sandbox name (1-63 of a-z 0-9 . _ -, starting with a letter or digit)",
            name.escape_debug()
        ));
    }
    if name == layout::MEDIATOR || name == layout::HUMAN {
        return Err(format!("'{name}' is reserved and cannot name a sandbox"));
    }
    Ok(())
}

/// A record that could not be read, with the reason.
#[derive(Debug, Clone)]
pub struct BadRecord {
    pub file: String,
    pub reason: String,
}

/// The registry directory of a mailbox root.
#[derive(Clone, Debug)]
pub struct Registry {
    pub dir: PathBuf,
    sandboxes: PathBuf,
    /// The digests of the secrets each record names (crate::door_record).
    door: crate::door_record::DoorRecord,
}

impl Registry {
    pub fn new(root: &Root) -> Registry {
        Registry {
            dir: root.registry_dir(),
            sandboxes: root.sandboxes_dir(),
            door: crate::door_record::DoorRecord::new(root),
        }
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    /// Writes (or replaces) the record of `sb` and creates its mailbox
    /// (`sandboxes/NAME/{inbox,outbox}`) when missing.
    pub fn register(&self, sb: &Sandbox) -> Result<PathBuf> {
        sb.validate().map_err(Error::usage)?;
        layout::make_registry_dir(&self.dir)?;
        mkdir(&self.sandboxes)?;
        let boxdir = layout::SandboxBox::new(self.sandboxes.join(&sb.name));
        mkdir(&boxdir.dir)?;
        // Only its owner opens a mail dir (lw doctor checks it), whoever made it.
        std::fs::set_permissions(
            &boxdir.dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .map_err(|e| Error::io("cannot set the mode of", &boxdir.dir, e))?;
        boxdir.inbox().create()?;
        boxdir.outbox().create()?;

        let path = self.record_path(&sb.name);
        let mut bytes = serde_json::to_vec_pretty(sb)
            .expect("a Sandbox serialises because all its fields are plain data");
        bytes.push(b'\n');
        base::fs::write_replace(&path, &bytes, 0o644, base::fs::Durability::Synced)
            .map_err(|e| Error::io("cannot write registry record", &path, e))?;
        Ok(path)
    }

    /// Removes the record of `name`, then the digests of its secrets; true
    /// when there was one.  The sandbox's mailbox stays: messages already
    /// delivered are not lost.
    pub fn unregister(&self, name: &str) -> Result<bool> {
        check_name(name).map_err(Error::usage)?;
        let path = self.record_path(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                sync_dir(&self.dir)?;
                self.door.forget(name)?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io("cannot remove registry record", &path, e)),
        }
    }

    /// Removes the temporary files a writer of `name`'s record left when it
    /// was killed mid-write (crates/base/src/fs's `.NAME.json.HEX.tmp`); returns their
    /// paths.  Only for a name whose writers are known dead (lw-sandbox gc
    /// holds its lock).
    pub fn remove_partial(&self, name: &str) -> Vec<PathBuf> {
        let prefix = format!(".{name}.json.");
        let mut gone = Vec::new();
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return gone;
        };
        for ent in rd.flatten() {
            let n = ent.file_name();
            let n = n.to_string_lossy();
            if n.starts_with(&prefix)
                && n.ends_with(".tmp")
                && std::fs::remove_file(ent.path()).is_ok()
            {
                gone.push(ent.path());
            }
        }
        gone
    }

    /// The record of `name`, or None when it is not registered.
    pub fn get(&self, name: &str) -> Result<Option<Sandbox>> {
        if check_name(name).is_err() {
            return Ok(None);
        }
        let path = self.record_path(name);
        match read_record(&path) {
            Ok(Some(sb)) if sb.name == name => Ok(Some(sb)),
            Ok(Some(sb)) => Err(Error::data(format!(
                "registry record '{}' names sandbox '{}'; the file name and the name inside must agree",
                path.display(),
                sb.name
            ))),
            Ok(None) => Ok(None),
            Err(reason) => Err(Error::data(format!(
                "registry record '{}' is unreadable: {reason}",
                path.display()
            ))),
        }
    }

    /// Every readable record sorted by name, and the records that are not.
    pub fn list(&self) -> Result<(Vec<Sandbox>, Vec<BadRecord>)> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((vec![], vec![])),
            Err(e) => {
                return Err(Error::io_as(
                    Exit::NoInput,
                    "cannot read registry",
                    &self.dir,
                    e,
                ));
            }
        };
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for ent in rd {
            let ent =
                ent.map_err(|e| Error::io_as(Exit::IoErr, "cannot read registry", &self.dir, e))?;
            let fname = ent.file_name();
            let Some(text) = fname.to_str() else {
                bad.push(BadRecord {
                    file: crate::maildir::escape_name(&fname),
                    reason: "file name is not UTF-8".into(),
                });
                continue;
            };
            if text.starts_with('.') {
                continue;
            }
            let Some(stem) = text.strip_suffix(".json") else {
                continue;
            };
            match read_record(&ent.path()) {
                Ok(Some(sb)) if sb.name == stem => good.push(sb),
                Ok(Some(sb)) => bad.push(BadRecord {
                    file: text.to_string(),
                    reason: format!(
                        "names sandbox '{}'; the file name and the name inside must agree",
                        sb.name
                    ),
                }),
                Ok(None) => {}
                Err(reason) => bad.push(BadRecord {
                    file: text.to_string(),
                    reason,
                }),
            }
        }
        good.sort_by(|a, b| a.name.cmp(&b.name));
        Ok((good, bad))
    }
}

/// Reads one record without following a symbolic link; None when absent.
fn read_record(path: &Path) -> std::result::Result<Option<Sandbox>, String> {
    let meta = match path.symlink_metadata() {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot stat: {e}")),
    };
    if !meta.file_type().is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > MAX_RECORD {
        return Err(format!(
            "record is {} bytes; the limit is {MAX_RECORD}",
            meta.len()
        ));
    }
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read: {e}")),
    };
    let sb: Sandbox =
        serde_json::from_slice(&bytes).map_err(|e| format!("not a registry record: {e}"))?;
    sb.validate()?;
    Ok(Some(sb))
}

/// Makes `p` with mode 0700: `sandboxes/`, and the mail dirs in it.
fn mkdir(p: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    match std::fs::DirBuilder::new().mode(0o700).create(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::io("cannot create directory", p, e)),
    }
}

fn sync_dir(p: &Path) -> Result<()> {
    base::fs::sync_dir(p).map_err(|e| Error::io_as(Exit::IoErr, "cannot fsync", p, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> Root {
        let d = std::env::temp_dir().join(format!("lw-registry-{}", base::id::new_id()));
        std::fs::create_dir_all(&d).unwrap();
        Root::new(d)
    }

    #[test]
    fn partial_writes_of_one_name_are_removed_and_no_other() {
        let r = root();
        let reg = Registry::new(&r);
        reg.register(&Sandbox::new("k1", None, vec![])).unwrap();
        let dir = r.registry_dir();
        for n in [".k1.json.0a.tmp", ".k10.json.0b.tmp", ".k1.json.0c.tmp"] {
            std::fs::write(dir.join(n), b"{").unwrap();
        }
        let gone = reg.remove_partial("k1");
        assert_eq!(gone.len(), 2, "{gone:?}");
        assert!(
            dir.join(".k10.json.0b.tmp").exists(),
            "another name's file went"
        );
        assert!(dir.join("k1.json").exists(), "the record itself went");
    }

    #[test]
    fn a_proxy_record_names_its_host_and_older_records_have_none() {
        let r = root();
        let reg = Registry::new(&r);
        let mut sb = Sandbox::new("web", None, vec!["schema/**".into()]);
        sb.host = Some("hostb".into());
        reg.register(&sb).unwrap();
        assert_eq!(
            reg.get("web").unwrap().unwrap().host.as_deref(),
            Some("hostb")
        );
        sb.host = Some("Host B".into());
        assert!(reg.register(&sb).is_err());
        let old = r#"{"version":1,"name":"api","scope":[],"registered":"2026-11-30T17:06:45Z"}"#;
        std::fs::write(reg.dir.join("api.json"), old).unwrap();
        assert_eq!(reg.get("api").unwrap().unwrap().host, None);
        let text = std::fs::read_to_string(reg.dir.join("web.json")).unwrap();
        assert!(text.contains("\"host\": \"hostb\""), "{text}");
    }

    #[test]
    fn register_get_list_unregister() {
        let r = root();
        let reg = Registry::new(&r);
        assert!(
            reg.list().unwrap().0.is_empty(),
            "absent registry lists nothing"
        );
        let a = Sandbox::new("api", Some("lw/api".into()), vec!["src/api/**".into()]);
        reg.register(&a).unwrap();
        reg.register(&Sandbox::new("web", None, vec![])).unwrap();
        assert_eq!(reg.get("api").unwrap(), Some(a.clone()));
        assert!(
            r.sandbox("api")
                .inbox()
                .sub(crate::maildir::Sub::New)
                .is_dir()
        );
        let names: Vec<_> = reg.list().unwrap().0.into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["api", "web"]);
        // Replacing keeps one record and leaves no temporary behind.
        reg.register(&Sandbox::new("api", None, vec![])).unwrap();
        assert_eq!(reg.get("api").unwrap().unwrap().scope, Vec::<String>::new());
        assert_eq!(std::fs::read_dir(&reg.dir).unwrap().count(), 2);
        assert!(reg.unregister("api").unwrap());
        assert!(!reg.unregister("api").unwrap());
        assert_eq!(reg.get("api").unwrap(), None);
    }

    #[test]
    fn rejects_reserved_and_bad_names_and_reports_bad_records() {
        let r = root();
        let reg = Registry::new(&r);
        for bad in ["human", "mediator", "A", "../x"] {
            let err = reg.register(&Sandbox::new(bad, None, vec![])).unwrap_err();
            assert_eq!(err.exit, Exit::Usage, "{bad}: {err}");
        }
        std::fs::create_dir_all(&reg.dir).unwrap();
        std::fs::write(reg.dir.join("junk.json"), b"{").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", reg.dir.join("link.json")).unwrap();
        let (good, bad) = reg.list().unwrap();
        assert!(good.is_empty());
        assert_eq!(bad.len(), 2, "{bad:?}");
    }
}
