//! The record and the name lock of a sandbox: `ROOT/state/sandbox/NAME.json`
//! (written whole through `fs::write_replace`, before anything else is made,
//! marked ready last) and `ROOT/state/sandbox/NAME.lock`, held by whichever
//! lw-sandbox is creating, removing or collecting NAME (module documentation
//! of lib/sandbox).

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Network, Port, Sandboxes, io_err};
use base::error::{Error, Exit, Result};
use mailbox::registry;

pub(super) const RECORD_VERSION: u32 = 1;

/// What `ROOT/state/sandbox/NAME.json` holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub version: u32,
    pub name: String,
    pub branch: String,
    /// The commit the branch was made from, when it did not exist upstream.
    #[serde(default)]
    pub base: Option<String>,
    #[serde(default)]
    pub scope: Vec<String>,
    pub container: String,
    pub volume: String,
    pub image: String,
    pub network: Network,
    #[serde(default)]
    pub ports: Vec<Port>,
    /// Names only; values are never stored.
    #[serde(default)]
    pub secrets: Vec<String>,
    pub uid: u32,
    /// The project's top directory and its mirror.
    pub project: PathBuf,
    pub mirror: PathBuf,
    pub created: String,
    /// False until the clone is on its branch: a record that is not ready
    /// and whose lock is free belongs to a create that died.
    pub ready: bool,
    /// The agent kit it was made for (`create --agent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<agent::AgentRecord>,
    /// The shared services it is attached to (`create --service`, lib/service).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<String>,
    /// The OCI runtime its container runs under (`runsc` for gVisor); absent
    /// in records older than the choice, which ran under the default, runc.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// On an engine that does not see the host's files: its workspace and
    /// mail dir are volumes on the engine's side (lib/sandbox/volume.rs).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub volume_mode: bool,
    /// In volume mode, its mail volume (its workspace's is `volume`): the
    /// sandbox's own, or the claim a pool pod was made with (lib/sandbox/pool.rs).
    /// Absent in older records and in local mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mail_volume: Option<String>,
    /// The address of the engine it was made on (`DOCKER_HOST` or the
    /// local socket); absent in older records.  A command that reaches
    /// another engine leaves it alone: its container is not there, and
    /// that does not make it lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// The sh script its image's label gave at create (a devcontainer.json's
    /// postStartCommand, [`wall::image::LABEL_POST_START`]): run at each
    /// start.  Kept here, where the sandbox cannot write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_start: Option<String>,
    /// The number of its branch's pull request (`push --pr`, crates/sync/src/pr).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<u64>,
}

impl Record {
    /// The runtime it was made under (`runc` for records older than the choice).
    pub fn runtime_name(&self) -> &str {
        self.runtime
            .as_deref()
            .unwrap_or(engine::runtime::DEFAULT_RUNTIME)
    }
}

/// An exclusive lock on one sandbox name (see the module documentation).
pub struct NameLock {
    _file: File,
    path: PathBuf,
}

impl NameLock {
    /// Removes the lock file while holding it (gc, rm): whoever opens the
    /// path next gets a new file, and whoever waits on the old one sees
    /// that the path moved and retries.
    pub(super) fn remove(self) {
        let _ = fs::remove_file(&self.path);
    }
}

impl<'a> Sandboxes<'a> {
    pub(super) fn state_dir(&self) -> PathBuf {
        self.root.state_dir().join("sandbox")
    }

    pub(super) fn record_path(&self, name: &str) -> PathBuf {
        self.state_dir().join(format!("{name}.json"))
    }

    /// Takes the lock of `name`; `wait` false returns None when it is held.
    pub fn lock(&self, name: &str, wait: bool) -> Result<Option<NameLock>> {
        let dir = self.state_dir();
        self.root
            .make_dir(&dir)
            .map_err(io_err("cannot create", &dir))?;
        let path = dir.join(format!("{name}.lock"));
        loop {
            let f = if wait {
                base::fs::lock(&path).map(Some)
            } else {
                base::fs::try_lock(&path)
            };
            let Some(f) = f.map_err(|e| Error::lock(&path, e))? else {
                return Ok(None);
            };
            // The file may have been removed by the holder we waited for.
            let held = f.metadata().map_err(io_err("cannot stat", &path))?;
            match fs::metadata(&path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {
                    return Ok(Some(NameLock { _file: f, path }));
                }
                _ => continue,
            }
        }
    }

    /// The record of `name`, None when there is none.
    pub fn record(&self, name: &str) -> Result<Option<Record>> {
        let p = self.record_path(name);
        match fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                Error::data(format!(
                    "sandbox record '{}' is unreadable: {e}; run lw-sandbox gc",
                    p.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io_as(Exit::IoErr, "cannot read", &p, e)),
        }
    }

    /// The ready record of `name`, or an error that says why there is none.
    pub fn get(&self, name: &str) -> Result<Record> {
        registry::check_name(name).map_err(Error::usage)?;
        match self.record(name)? {
            Some(r) if self.elsewhere(&r) => Err(self.elsewhere_err(&r)),
            Some(r) if r.ready => Ok(r),
            Some(_) => Err(Error::new(
                Exit::TempFail,
                format!(
                    "sandbox '{name}' is being created, or its creation died; wait, or run lw-sandbox gc"
                ),
            )),
            None => Err(Error::new(
                Exit::NoInput,
                format!(
                    "no sandbox '{name}' in '{}'; lw-sandbox ls lists them",
                    self.root.dir.display()
                ),
            )),
        }
    }

    /// Whether `r` was made on another engine than the one this command
    /// reaches (a root may hold sandboxes on several).
    pub fn elsewhere(&self, r: &Record) -> bool {
        r.engine
            .as_deref()
            .is_some_and(|e| e != self.engine.address())
    }

    fn elsewhere_err(&self, r: &Record) -> Error {
        let at = r.engine.as_deref().unwrap_or_default();
        Error::new(
            Exit::Unavailable,
            format!(
                "sandbox '{}' is on the engine at {at}, not the one at {} that this command reaches; run it with DOCKER_HOST={at} (and that engine's TLS variables)",
                r.name,
                self.engine.address()
            ),
        )
    }

    pub(super) fn write_record(&self, r: &Record) -> Result<()> {
        let dir = self.state_dir();
        self.root
            .make_dir(&dir)
            .map_err(io_err("cannot create", &dir))?;
        let path = self.record_path(&r.name);
        let mut bytes = serde_json::to_vec_pretty(r)
            .expect("a Record serialises because all its fields are plain data");
        bytes.push(b'\n');
        base::fs::write_replace(&path, &bytes, 0o600, base::fs::Durability::Synced)
            .map_err(|e| Error::io("cannot write", &path, e))
    }

    pub(super) fn remove_record(&self, name: &str) -> Result<()> {
        let p = self.record_path(name);
        match fs::remove_file(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("cannot remove", &p, e)),
        }
    }

    /// Every record, ready or not, sorted by name.
    pub fn records(&self) -> Result<Vec<Record>> {
        let dir = self.state_dir();
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io_as(Exit::IoErr, "cannot read", &dir, e)),
        };
        let mut out = Vec::new();
        for ent in rd.flatten() {
            let n = ent.file_name().to_string_lossy().into_owned();
            if n.starts_with('.') {
                continue;
            }
            if let Some(stem) = n.strip_suffix(".json")
                && let Ok(Some(r)) = self.record(stem)
            {
                out.push(r);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}
