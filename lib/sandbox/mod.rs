//! Sandboxes: one hardened container per task, holding its own clone.
//!
//! # What a sandbox is
//!
//! A container made from the project's current image (lw-build), running as
//! uid 100000 (no host account) with a read-only root, no capabilities,
//! no-new-privileges, Docker's default seccomp profile without io_uring,
//! AppArmor's docker-default where the host has it, CPU, pids, memory, disk,
//! log and push limits (limits.rs, disk.rs) and no network unless asked.
//! It sees exactly these host things:
//!
//! | inside                         | what                                      | mode |
//! |--------------------------------|-------------------------------------------|------|
//! | `/work`                        | its own workspace filesystem (disk.rs)    | rw   |
//! | `/work/repo`                   | its clone, on its branch                  | rw   |
//! | `/lw/mirror`                   | the project's bare mirror (lw-mirror)     | ro   |
//! | `/lw/mailbox`                  | `ROOT/sandboxes/NAME` (`LW_MAILBOX`), nosuid,nodev,noexec | rw |
//! | `/lw/registry`                 | `ROOT/registry` (`LW_REGISTRY`)           | ro   |
//! | `/usr/local/bin/lw-{post,inbox,mcp}` | the static mailbox commands         | ro   |
//! | `/tmp`                         | tmpfs, noexec, nosuid, nodev              | rw   |
//! | `/run/secrets`                 | tmpfs with its secrets, if any            | ro files |
//!
//! The clone is made inside the container, from the read-only mirror, with
//! `git clone --shared` (objects borrowed through `objects/info/alternates`),
//! so it costs a checkout, shares no `.git` with the host or another
//! sandbox, and the host never runs git in it.
//!
//! # State, and why creation is crash-safe
//!
//! Everything a sandbox owns is findable from the mailbox root:
//!
//! * `ROOT/state/sandbox/NAME.json`, the record, written *before* anything
//!   else is made (with `ready: false`) and marked ready last;
//! * `ROOT/state/sandbox/NAME.lock`, held (flock) by whichever lw-sandbox is
//!   creating, removing or collecting NAME;
//! * the container, named `lw-sb-ROOTID-NAME` and labelled with
//!   [`LABEL_SANDBOX`] and [`LABEL_ROOT`] (sandboxes of earlier versions
//!   also have a workspace volume of that name);
//! * the disk images of the workspace and the mailbox, `ROOT/state/disk/`,
//!   loop-mounted (disk.rs);
//! * port leases in `ROOT/state/ports` (lib/ports.rs);
//! * the registry record `ROOT/registry/NAME.json` and the mailbox
//!   `ROOT/sandboxes/NAME` (lib/registry.rs).
//!
//! A `create` killed at any instant leaves a record that is not ready and a
//! lock nobody holds, or (killed before the record) nothing at all.  `gc`
//! takes each name's lock without waiting, so it never touches a sandbox
//! being made, and reclaims every sandbox whose record is not ready, every
//! labelled container or volume without a record, sandboxes whose container
//! was removed behind our back, and with each of them its leases, registry
//! record, mailbox (archived first, mailbox.rs), disk images and lock file,
//! and mail dirs that neither a sandbox nor a registry record owns.
//! Registry records that lw-sandbox did not make (`lw-mediate register`)
//! are not its to remove.

pub mod disk;
pub mod hostpaths;
pub mod limits;
pub mod mailbox;
pub mod push;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::Project;
use crate::egress;
use crate::engine::{Bind, Container, ContainerSpec, ExecRequest, OutStream, PortMap};
use crate::engine::{ExecIo, Isolation, NetworkEngine, SandboxEngine};
use crate::error::{Error, Exit, Result};
use crate::layout::Root;
use crate::ports::{Leases, Range};
use crate::registry::{self, Registry};
use crate::secrets::{self, Secret};

/// Labels on every container and volume lw-sandbox makes.
pub const LABEL_SANDBOX: &str = "org.loopwright.sandbox";
/// The mailbox root's id (see [`root_id`]).
pub const LABEL_ROOT: &str = "org.loopwright.root";
/// The mailbox root's path, for people reading `docker ps`.
pub const LABEL_ROOT_PATH: &str = "org.loopwright.root-path";
pub const LABEL_BRANCH: &str = "org.loopwright.branch";

/// Paths inside a sandbox.
pub const WORK: &str = "/work";
pub const REPO: &str = "/work/repo";
pub const HOME: &str = "/work/home";
pub const MIRROR: &str = "/lw/mirror";
pub const MAILBOX: &str = "/lw/mailbox";
pub const REGISTRY: &str = "/lw/registry";
pub const BIN_DIR: &str = "/usr/local/bin";

/// Defaults, each overridable in `.loopwright/config`.
///
/// The sandbox's user is uid 100000, which is no account on the host (it
/// lies above the ranges useradd hands out and below the subordinate ids
/// of user namespaces): files a sandbox leaves in its mail dir or
/// workspace belong to nobody who could be impersonated through them.
pub const DEFAULT_UID: u32 = 100_000;
pub const DEFAULT_PIDS: i64 = 512;
pub const DEFAULT_MEMORY: &str = "2g";
pub const DEFAULT_TMP_SIZE: &str = "256m";

/// PID 1 of a sandbox: waits, and leaves at once on SIGTERM so `stop` is quick.
const KEEPALIVE: &str = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

const RECORD_VERSION: u32 = 1;

/// A sandbox's network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Only the loopback interface.
    None,
    /// Docker's default bridge: the sandbox reaches anything the host reaches.
    Bridge,
    /// Its own internal network shared only with its own proxy, which lets
    /// through the allow-list's host:port pairs (lib/egress).
    Egress,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Bridge => "bridge",
            Network::Egress => "egress",
        }
    }
}

/// A published port: container port to leased host port on 127.0.0.1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Port {
    /// `8080/tcp`.
    pub container: String,
    pub host: u16,
}

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
    pub agent: Option<crate::agent::AgentRecord>,
    /// The shared services it is attached to (`create --service`, lib/service).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<String>,
    /// The OCI runtime its container runs under (`runsc` for gVisor); absent
    /// in records older than the choice, which ran under the default, runc.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
}

/// The id of a mailbox root: 8 hex digits of the sha256 of its canonical
/// path.  Container and volume names carry it so that two roots on one
/// engine never collide.
pub fn root_id(root: &Path) -> String {
    let canon = fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let d = Sha256::digest(canon.as_os_str().as_encoded_bytes());
    d[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// Where lw-sandbox works: a mailbox root and an engine.
pub struct Sandboxes<'a> {
    pub root: Root,
    pub id: String,
    pub engine: &'a dyn SandboxEngine,
}

/// Options of `create`.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    pub name: String,
    pub branch: String,
    pub from: Option<String>,
    pub scope: Vec<String>,
    /// Container ports to publish (`8080`, `8080/tcp`, `53/udp`).
    pub ports: Vec<String>,
    pub secrets: Vec<String>,
    pub network: Network,
    /// Entries added to the project's egress allow-list (`--allow HOST:PORT`).
    pub allow: Vec<String>,
    /// An image to use instead of the project's current one.
    pub image: Option<String>,
    /// Use the newest earlier image when the current one is not built.
    pub allow_stale: bool,
    /// Skip fetching into the mirror (it must exist).
    pub no_fetch: bool,
    /// An agent kit to install and set up (lib/agent), and how its key travels.
    pub agent: Option<(String, crate::agent::Credential)>,
    /// Limits given as flags (`--cpus`, `--memory`, `--pids`, `--disk`, `--mail-disk`).
    pub limits: limits::Overrides,
    /// Run the install script of the task's branch when it differs from
    /// the image's (create.rs, "Incremental install").
    pub allow_install_change: bool,
    /// Shared services to attach it to (`--service NAME`, lib/service).
    pub services: Vec<String>,
    /// The OCI runtime (`--runtime`); `None` takes `sandbox.runtime`.
    pub runtime: Option<String>,
}

/// What `create` made.
#[derive(Clone, Debug)]
pub struct Created {
    pub record: Record,
    pub head: String,
    /// Warnings already printed (stale image, bridge network, install).
    pub notes: Vec<String>,
    /// How long each step took: check, image, mirror, resolve, record,
    /// container, start, clone, secrets, install, ready.
    pub timings: Vec<(&'static str, Duration)>,
}

/// The state of a sandbox as `ls` shows it.
#[derive(Clone, Debug)]
pub struct Status {
    pub name: String,
    pub branch: String,
    /// `running`, `exited`, `created`, `creating`, `missing` (the container
    /// is gone), `broken` (a dead create, for gc).
    pub state: String,
    pub ports: Vec<Port>,
    pub created: String,
    pub age: Duration,
    /// Commits on the branch no upstream ref has; None when not running.
    pub unpushed: Option<u64>,
    pub container: String,
    pub image: String,
    pub network: Network,
    /// The shared services it is attached to.
    pub services: Vec<String>,
    /// The OCI runtime its container runs under (the engine's word when the
    /// container exists, else the record's).
    pub runtime: String,
}

/// What `gc` reclaimed, one line each: `KIND WHAT`.
pub type Reclaimed = Vec<(String, String)>;

fn io_err<'p>(what: &str, p: &'p Path) -> impl FnOnce(std::io::Error) -> Error + 'p {
    let what = what.to_string();
    move |e| Error::io(&what, p, e)
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
    fn remove(self) {
        let _ = fs::remove_file(&self.path);
    }
}

impl<'a> Sandboxes<'a> {
    pub fn new(root: Root, engine: &'a dyn SandboxEngine) -> Sandboxes<'a> {
        let id = root_id(&root.dir);
        Sandboxes { root, id, engine }
    }

    fn state_dir(&self) -> PathBuf {
        self.root.state_dir().join("sandbox")
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.state_dir().join(format!("{name}.json"))
    }

    pub fn leases(&self) -> Leases {
        Leases::new(&self.root.state_dir())
    }

    pub fn container_name(&self, name: &str) -> String {
        format!("lw-sb-{}-{name}", self.id)
    }

    pub fn volume_name(&self, name: &str) -> String {
        format!("lw-sb-{}-{name}-work", self.id)
    }

    fn root_label(&self) -> String {
        format!("{LABEL_ROOT}={}", self.id)
    }

    /// Takes the lock of `name`; `wait` false returns None when it is held.
    pub fn lock(&self, name: &str, wait: bool) -> Result<Option<NameLock>> {
        let dir = self.state_dir();
        fs::create_dir_all(&dir).map_err(io_err("cannot create", &dir))?;
        let path = dir.join(format!("{name}.lock"));
        loop {
            let f = if wait {
                crate::fs::lock(&path).map(Some)
            } else {
                crate::fs::try_lock(&path)
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

    fn write_record(&self, r: &Record) -> Result<()> {
        let dir = self.state_dir();
        fs::create_dir_all(&dir).map_err(io_err("cannot create", &dir))?;
        let path = self.record_path(&r.name);
        let mut bytes = serde_json::to_vec_pretty(r)
            .expect("a Record serialises because all its fields are plain data");
        bytes.push(b'\n');
        crate::fs::write_replace(&path, &bytes, 0o644, crate::fs::Durability::Synced)
            .map_err(|e| Error::io("cannot write", &path, e))
    }

    fn remove_record(&self, name: &str) -> Result<()> {
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

    /// Runs a command in a sandbox as its user, capturing its output.
    pub fn run(
        &self,
        rec: &Record,
        cmd: &[&str],
        stdin: Option<Vec<u8>>,
    ) -> Result<(i64, Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let req = ExecRequest {
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            env: vec![],
            user: Some(format!("{0}:{0}", rec.uid)),
            workdir: Some(WORK.into()),
        };
        let mut on = |s: OutStream, b: &[u8]| match s {
            OutStream::Stdout => out.extend_from_slice(b),
            OutStream::Stderr => err.extend_from_slice(b),
        };
        let io = ExecIo {
            stdin: stdin
                .map(|b| Box::new(std::io::Cursor::new(b)) as Box<dyn std::io::Read + Send>),
            tty: false,
            size: None,
            on_output: &mut on,
        };
        let code = self.engine.exec_io(&rec.container, &req, io)?;
        Ok((code, out, err))
    }

    /// The container of a ready sandbox, started (without its secrets: only
    /// lw-sandbox's own git runs) if it was stopped; `Container::running`
    /// says whether it was running before.
    fn running(&self, rec: &Record) -> Result<Container> {
        let c = self.engine.inspect(&rec.container)?.ok_or_else(|| {
            Error::new(
                Exit::NoInput,
                format!(
                    "the container of sandbox '{}' ('{}') is gone; its workspace cannot be reached; lw-sandbox gc reclaims the rest",
                    rec.name, rec.container
                ),
            )
        })?;
        if !c.running {
            self.mount_disks(&rec.name)?;
            self.engine.start(&rec.container)?;
        }
        Ok(c)
    }

    /// Mounts the sandbox's disk images again (after a reboot) before its
    /// container starts: started without them, it would write the host's disk.
    fn mount_disks(&self, name: &str) -> Result<()> {
        for d in [disk::work(&self.root, name), disk::mail(&self.root, name)] {
            if d.image.exists() {
                d.mount()?;
            }
        }
        Ok(())
    }

    /// Writes the sandbox's secrets from the environment into its tmpfs.
    fn install_secrets(&self, rec: &Record, secrets: &[Secret]) -> Result<()> {
        for s in secrets {
            let cmd = secrets::install_cmd(&s.name);
            let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let (code, _, err) = self.run(rec, &cmd, Some(s.value.clone()))?;
            if code != 0 {
                return Err(Error::new(
                    Exit::Software,
                    format!(
                        "cannot write secret '{}' into sandbox '{}': {}",
                        s.name,
                        rec.name,
                        crate::visible::visible(String::from_utf8_lossy(&err).trim())
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Starts a stopped sandbox and writes its secrets again.
    pub fn start(&self, name: &str) -> Result<Record> {
        let rec = self.get(name)?;
        let secrets = secrets::resolve(&rec.secrets, &|n| std::env::var_os(n))?;
        let c = self
            .engine
            .inspect(&rec.container)?
            .ok_or_else(|| gone(&rec))?;
        // The proxy first: a sandbox started without it has no network.
        if rec.network == Network::Egress {
            let nets: &dyn NetworkEngine = self.engine;
            egress::start_proxy(nets, &rec.container, Duration::from_secs(30))?;
            if rec
                .agent
                .as_ref()
                .is_some_and(|a| a.credential == crate::agent::Credential::Proxy)
            {
                crate::agent::proxy::start(nets, &rec.container)?;
            }
        }
        if !c.running {
            self.mount_disks(&rec.name)?;
            self.engine.start(&rec.container)?;
        }
        self.install_secrets(&rec, &secrets)?;
        Ok(rec)
    }

    pub fn stop(&self, name: &str) -> Result<Record> {
        let rec = self.get(name)?;
        match self.engine.inspect(&rec.container)? {
            None => Err(gone(&rec)),
            Some(_) => {
                self.engine.stop(&rec.container, Duration::from_secs(10))?;
                let proxy = egress::proxy_name(&rec.container);
                if rec.network == Network::Egress && self.engine.inspect(&proxy)?.is_some() {
                    self.engine.stop(&proxy, Duration::from_secs(10))?;
                }
                let model = crate::agent::proxy::name(&rec.container);
                if rec.agent.is_some() && self.engine.inspect(&model)?.is_some() {
                    self.engine.stop(&model, Duration::from_secs(10))?;
                }
                Ok(rec)
            }
        }
    }

    /// Commits on the sandbox's branch that no upstream ref holds, and
    /// uncommitted changes, as the sandbox's own git sees them after a fetch
    /// from the mirror.  The numbers are parsed strictly: the sandbox writes them.
    pub fn unpushed(&self, rec: &Record) -> Result<(u64, u64, String)> {
        let script = "cd /work/repo || exit 3; git fetch -q origin 2>/dev/null; \
            echo \"$(git rev-list --count \"refs/heads/$1\" --not --remotes=origin)\"; \
            echo \"$(git status --porcelain | wc -l)\"; \
            git log --oneline -n 20 \"refs/heads/$1\" --not --remotes=origin";
        let (code, out, err) = self.run(
            rec,
            &["/bin/sh", "-c", script, "lw-unpushed", &rec.branch],
            None,
        )?;
        let text = String::from_utf8_lossy(&out);
        let mut lines = text.lines();
        let n = lines.next().and_then(|l| l.trim().parse::<u64>().ok());
        let dirty = lines.next().and_then(|l| l.trim().parse::<u64>().ok());
        match (code, n, dirty) {
            (0, Some(n), Some(d)) => Ok((n, d, lines.collect::<Vec<_>>().join("\n"))),
            _ => Err(Error::new(
                Exit::Software,
                format!(
                    "cannot count unpushed commits in sandbox '{}' (exit {code}): {}",
                    rec.name,
                    crate::visible::visible(String::from_utf8_lossy(&err).trim())
                ),
            )),
        }
    }

    /// The runtime `wanted` (`--runtime` or `sandbox.runtime`), checked
    /// against what the engine offers before anything is made: unknown is
    /// 64 listing the known ones, gVisor missing 69 with its install line,
    /// gVisor without `--oci-seccomp` 69 (the profile would not apply),
    /// and a runtime the engine starts without networking (runsc's
    /// `--network=none`) refuses every network but `none` (64).
    pub fn check_runtime(&self, wanted: Option<&str>, network: Network) -> Result<Option<String>> {
        let Some(name) = wanted else {
            return Ok(None);
        };
        let info = self.engine.info()?;
        info.check(name)?;
        if !info.runtime_applies_seccomp(name) {
            return Err(Error::new(
                Exit::Unavailable,
                format!(
                    "runtime '{name}' is registered with the engine at {} without --oci-seccomp, so \
                     gVisor would not apply the sandbox's seccomp profile (user namespaces, for \
                     one, would be allowed inside); add \"--oci-seccomp\" to its runtimeArgs in \
                     /etc/docker/daemon.json and reload dockerd (kill -HUP $(pidof dockerd))",
                    info.host
                ),
            ));
        }
        if network != Network::None && info.runtime_without_network(name) {
            return Err(Error::usage(format!(
                "runtime '{name}' runs with its network switched off on the engine at {} \
                 (registered with --network=none), so a --network {} sandbox would reach nothing; \
                 create it with --network none (the default; an agent needs egress, so it runs \
                 under runc), or register {name} with a network that works on this host",
                info.host,
                network.as_str()
            )));
        }
        Ok(Some(name.to_string()))
    }

    /// `ls`: every sandbox of the root.
    pub fn list(&self, count_unpushed: bool) -> Result<Vec<Status>> {
        let containers = self.engine.containers_with_label(&self.root_label())?;
        let now = crate::time::now();
        let mut out = Vec::new();
        for rec in self.records()? {
            let c = containers.iter().find(|c| c.name == rec.container);
            let state = match (rec.ready, c) {
                (false, _) => {
                    if self.lock(&rec.name, false)?.is_some() {
                        "broken"
                    } else {
                        "creating"
                    }
                }
                (true, None) => "missing",
                (true, Some(c)) => c.status.as_str(),
            }
            .to_string();
            let created = crate::time::parse_rfc3339(&rec.created).unwrap_or(now);
            let unpushed = if count_unpushed && state == "running" {
                self.unpushed(&rec).ok().map(|u| u.0)
            } else {
                None
            };
            out.push(Status {
                name: rec.name.clone(),
                branch: rec.branch.clone(),
                state,
                ports: rec.ports.clone(),
                created: rec.created.clone(),
                age: now.saturating_sub(created),
                unpushed,
                container: rec.container.clone(),
                image: rec.image.clone(),
                network: rec.network,
                services: rec.services.clone(),
                runtime: c
                    .and_then(|c| self.engine.inspect(&c.name).ok().flatten())
                    .map(|i| i.runtime)
                    // Podman names every runtime "oci" here: the record knows.
                    .filter(|r| !r.is_empty() && r != "oci")
                    .unwrap_or_else(|| rec.runtime_name().to_string()),
            });
        }
        Ok(out)
    }

    /// `rm`: refuses while work would be lost, unless `force`.
    pub fn remove(&self, name: &str, force: bool, out: &mut dyn FnMut(&str)) -> Result<()> {
        // Refuse an unknown name before making its lock file.
        self.get(name)?;
        let lock = self.lock(name, false)?.ok_or_else(|| {
            Error::new(
                Exit::TempFail,
                format!("sandbox '{name}' is busy (another lw-sandbox holds it); try again"),
            )
        })?;
        let rec = self.get(name)?;
        if !force && self.engine.inspect(&rec.container)?.is_some() {
            self.running(&rec)?;
            let (n, dirty, log) = self.unpushed(&rec)?;
            if n > 0 || dirty > 0 {
                let mut msg = format!("sandbox '{name}' has work that would be lost:");
                if n > 0 {
                    msg += &format!(
                        " {n} unpushed commit(s) on '{}':\n{}\n",
                        rec.branch,
                        crate::visible::visible(&log)
                    );
                }
                if dirty > 0 {
                    msg += &format!(" {dirty} uncommitted change(s) in {REPO};");
                }
                msg += &format!(" push it (lw-sandbox push {name}) or remove anyway with --force");
                return Err(Error::new(Exit::TempFail, msg));
            }
        }
        self.reclaim(&rec.name, Some(&rec), out)?;
        lock.remove();
        Ok(())
    }

    /// Removes everything of sandbox `name`; the caller holds its lock.
    fn reclaim(&self, name: &str, rec: Option<&Record>, out: &mut dyn FnMut(&str)) -> Result<()> {
        let container = rec
            .map(|r| r.container.clone())
            .unwrap_or_else(|| self.container_name(name));
        let volume = rec
            .map(|r| r.volume.clone())
            .unwrap_or_else(|| self.volume_name(name));
        // Its container, and any other this root labelled for it (an install step's).
        let mut doomed: Vec<String> = self
            .engine
            .containers_with_label(&self.root_label())?
            .into_iter()
            .filter(|c| c.labels.get(LABEL_SANDBOX).map(String::as_str) == Some(name))
            .map(|c| c.name)
            .collect();
        if !doomed.contains(&container) && self.engine.inspect(&container)?.is_some() {
            doomed.push(container.clone());
        }
        for c in doomed {
            self.engine.remove(&c, true)?;
            out(&format!("container {c}"));
        }
        if rec.is_some_and(|r| r.network == Network::Egress) {
            let nets: &dyn NetworkEngine = self.engine;
            egress::teardown(nets, &container)?;
            out(&format!("egress {}", egress::proxy_name(&container)));
        }
        let had_volume = self
            .engine
            .volumes_with_label(&format!("{LABEL_SANDBOX}={name}"))?
            .iter()
            .any(|v| v.name == volume);
        if had_volume {
            self.engine.remove_volume(&volume)?;
            out(&format!("volume {volume}"));
        }
        let keys = crate::agent::proxy::key_dir(&self.root.state_dir(), name);
        if keys.exists() {
            fs::remove_dir_all(&keys).map_err(io_err("cannot remove", &keys))?;
            out(&format!("agent-key {}", keys.display()));
        }
        for p in self.leases().release(name)? {
            out(&format!("port {p}"));
        }
        let reg = Registry::new(&self.root);
        if reg.unregister(name)? {
            out(&format!("registry {name}"));
        }
        for p in reg.remove_partial(name) {
            out(&format!("partial {}", p.display()));
        }
        // The mail dir goes whole; what it still holds is archived first
        // (lib/sandbox/mailbox.rs), never kept live for nobody to read.
        let boxdir = self.root.sandbox(name).dir;
        if boxdir.exists() {
            if let Some((dir, n)) = mailbox::archive(&self.root, name, &boxdir)? {
                out(&format!(
                    "archived mailbox {} to {} ({n} unread message(s))",
                    boxdir.display(),
                    dir.display()
                ));
            }
            disk::mail(&self.root, name).remove()?;
            out(&format!("mailbox {}", boxdir.display()));
        } else if disk::mail(&self.root, name).remove()? {
            out(&format!(
                "disk {}",
                disk::mail(&self.root, name).image.display()
            ));
        }
        if disk::work(&self.root, name).remove()? {
            out(&format!(
                "disk {}",
                disk::work(&self.root, name).image.display()
            ));
        }
        if self.record_path(name).exists() {
            self.remove_record(name)?;
            out(&format!("record {name}"));
        }
        Ok(())
    }

    /// `gc`: reclaims what dead creates and vanished containers left.
    pub fn gc(&self, out: &mut dyn FnMut(&str)) -> Result<()> {
        let mut names: BTreeMap<String, Option<Record>> = BTreeMap::new();
        for r in self.records()? {
            names.insert(r.name.clone(), Some(r));
        }
        let containers = self.engine.containers_with_label(&self.root_label())?;
        let volumes = self.engine.volumes_with_label(&self.root_label())?;
        for l in containers
            .iter()
            .map(|c| &c.labels)
            .chain(volumes.iter().map(|v| &v.labels))
        {
            if let Some(n) = l.get(LABEL_SANDBOX) {
                names.entry(n.clone()).or_insert(None);
            }
        }
        for l in self.leases().list()? {
            names.entry(l.owner).or_insert(None);
        }
        // Disk images, and mail dirs no sandbox and no registry record own
        // (a `lw-mediate register`ed party keeps its mail dir).
        for n in disk::names(&self.root) {
            names.entry(n).or_insert(None);
        }
        let reg = Registry::new(&self.root);
        if let Ok(rd) = fs::read_dir(self.root.sandboxes_dir()) {
            for ent in rd.flatten() {
                let n = ent.file_name().to_string_lossy().into_owned();
                if registry::check_name(&n).is_ok() && matches!(reg.get(&n), Ok(None)) {
                    names.entry(n).or_insert(None);
                }
            }
        }
        // Unreadable or stray record files and lock files of vanished names.
        if let Ok(rd) = fs::read_dir(self.state_dir()) {
            for ent in rd.flatten() {
                let n = ent.file_name().to_string_lossy().into_owned();
                if let Some(stem) = n.strip_suffix(".json").or_else(|| n.strip_suffix(".lock"))
                    && registry::check_name(stem).is_ok()
                {
                    names.entry(stem.to_string()).or_insert(None);
                } else if n.starts_with('.') && n.ends_with(".tmp") {
                    let _ = fs::remove_file(ent.path());
                }
            }
        }
        for (name, rec) in names {
            let Some(lock) = self.lock(&name, false)? else {
                out(&format!("busy {name}"));
                continue;
            };
            // Re-read under the lock: a create may have finished meanwhile.
            let rec = match self.record(&name) {
                Ok(r) => r,
                Err(_) => rec,
            };
            let dead = match &rec {
                None => true,
                Some(r) if !r.ready => true,
                Some(r) => self.engine.inspect(&r.container)?.is_none(),
            };
            if dead {
                self.reclaim(&name, rec.as_ref(), out)?;
                lock.remove();
            }
        }
        // Egress networks and proxies whose sandbox no record names any more.
        let nets: &dyn NetworkEngine = self.engine;
        let known: Vec<String> = self.records()?.into_iter().map(|r| r.container).collect();
        for key in egress::leftovers(nets, Some(&self.root_label()))? {
            if !known.contains(&key) {
                egress::teardown(nets, &key)?;
                out(&format!("egress {}", egress::proxy_name(&key)));
            }
        }
        push::remove_leftovers(&self.root.state_dir(), out);
        Ok(())
    }

    /// `logs --egress`: the requests the sandbox's proxy refused, oldest first.
    pub fn egress_denials(&self, name: &str) -> Result<Vec<egress::Request>> {
        let rec = self.get(name)?;
        if rec.network != Network::Egress {
            return Err(Error::usage(format!(
                "sandbox '{name}' has network '{}', not egress; only egress sandboxes have a proxy log",
                rec.network.as_str()
            )));
        }
        let nets: &dyn NetworkEngine = self.engine;
        egress::denials(nets, &rec.container)
    }

    /// `port`: the published ports, as the engine reports them.
    pub fn ports(&self, name: &str) -> Result<Vec<PortMap>> {
        let rec = self.get(name)?;
        let c = self
            .engine
            .inspect(&rec.container)?
            .ok_or_else(|| gone(&rec))?;
        if c.ports.is_empty() {
            // A stopped container reports no bindings; the record knows them.
            return Ok(rec
                .ports
                .iter()
                .map(|p| PortMap {
                    container: p.container.clone(),
                    host_ip: "127.0.0.1".into(),
                    host_port: p.host,
                })
                .collect());
        }
        Ok(c.ports)
    }
}

impl<'a> Sandboxes<'a> {
    /// `exec` and `shell`: runs `cmd` in a running sandbox as its user, with
    /// this process's standard input, output and error (a terminal in raw
    /// mode when `tty`); returns the command's status.
    pub fn attach(
        &self,
        name: &str,
        cmd: Vec<String>,
        tty: bool,
        workdir: Option<String>,
    ) -> Result<i64> {
        let rec = self.get(name)?;
        match self.engine.inspect(&rec.container)? {
            Some(c) if c.running => {}
            Some(_) => {
                return Err(Error::new(
                    Exit::Unavailable,
                    format!("sandbox '{name}' is stopped; lw-sandbox start {name}"),
                ));
            }
            None => return Err(gone(&rec)),
        }
        let term = std::env::var("TERM").unwrap_or_else(|_| "xterm".into());
        let req = ExecRequest {
            cmd,
            env: if tty {
                vec![format!("TERM={term}")]
            } else {
                vec![]
            },
            user: Some(format!("{0}:{0}", rec.uid)),
            workdir: Some(workdir.unwrap_or_else(|| REPO.into())),
        };
        let _raw = tty.then(crate::tty::RawMode::enter);
        let mut stdout = std::io::stdout().lock();
        let mut stderr = std::io::stderr();
        let mut on = |s: OutStream, b: &[u8]| {
            // Flushed at once: git's transport (push) converses through us.
            let _ = match s {
                OutStream::Stdout => stdout.write_all(b).and_then(|_| stdout.flush()),
                OutStream::Stderr => stderr.write_all(b),
            };
        };
        let io = ExecIo {
            stdin: Some(Box::new(std::io::stdin())),
            tty,
            size: crate::tty::size(),
            on_output: &mut on,
        };
        self.engine.exec_io(&rec.container, &req, io)
    }
}

fn ports_json(ports: &[Port]) -> serde_json::Value {
    ports.iter().map(|p| serde_json::json!({"container": p.container, "host": format!("127.0.0.1:{}", p.host)})).collect()
}

/// The project (`--project`, else the checkout holding the current
/// directory) and its mirror (`--mirror`, `$LW_MIRROR`, the project's).
pub fn find_project(
    project: Option<&Path>,
    mirror: Option<&Path>,
) -> Result<(Option<Project>, PathBuf)> {
    let cwd = std::env::current_dir()
        .map_err(|e| Error::new(Exit::IoErr, "cannot find the current directory").with_source(e))?;
    let start = project
        .map(Path::to_path_buf)
        .unwrap_or_else(|| cwd.clone());
    let found = Project::find(&start)?;
    if project.is_some() && found.is_none() {
        return Err(Error::usage(format!(
            "'{}' is not inside a git checkout",
            start.display()
        )));
    }
    let env = std::env::var_os(crate::mirror::ENV_PATH).map(PathBuf::from);
    let path = crate::mirror::locate(mirror, env.as_deref(), found.as_ref(), &cwd)?;
    Ok((found, path))
}

/// lw-post, lw-inbox and lw-mcp, beside the running program: mounted into sandboxes.
pub fn mailbox_commands() -> [(PathBuf, &'static str); 3] {
    let dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_default();
    [
        (dir.join("lw-post"), "lw-post"),
        (dir.join("lw-inbox"), "lw-inbox"),
        (dir.join("lw-mcp"), "lw-mcp"),
    ]
}

impl Created {
    /// `created NAME in Tms: step Tms, ...` (`create --verbose`).
    pub fn timings_line(&self) -> String {
        let steps: Vec<String> = self
            .timings
            .iter()
            .map(|(s, d)| format!("{s} {:.1}ms", d.as_secs_f64() * 1e3))
            .collect();
        let total: f64 = self
            .timings
            .iter()
            .map(|(_, d)| d.as_secs_f64() * 1e3)
            .sum();
        format!(
            "created {} in {total:.1}ms: {}",
            self.record.name,
            steps.join(", ")
        )
    }

    /// The `create --json` record (man page, JSON OUTPUT).
    pub fn json(&self, mailbox: &Path) -> serde_json::Value {
        let r = &self.record;
        let timings: serde_json::Map<String, serde_json::Value> = self
            .timings
            .iter()
            .map(|(s, d)| (s.to_string(), serde_json::json!(d.as_secs_f64() * 1e3)))
            .collect();
        serde_json::json!({
            "type": "sandbox", "name": r.name, "branch": r.branch, "head": self.head, "container": r.container,
            "image": r.image, "network": r.network.as_str(), "ports": ports_json(&r.ports), "mailbox": mailbox,
            "notes": self.notes, "timings_ms": timings,
        })
    }
}

impl Status {
    /// The `ls --json` record.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "sandbox", "name": self.name, "branch": self.branch, "state": self.state, "created": self.created,
            "age_secs": self.age.as_secs(), "unpushed": self.unpushed, "container": self.container, "image": self.image,
            "network": self.network.as_str(), "ports": ports_json(&self.ports), "services": self.services,
            "runtime": self.runtime, "isolation": Isolation::of(&self.runtime).as_str(),
        })
    }

    /// The isolation column of `ls`: the level and its runtime, `gvisor(runsc)`.
    pub fn isolation(&self) -> String {
        format!(
            "{}({})",
            Isolation::of(&self.runtime).as_str(),
            self.runtime
        )
    }

    /// The `ls` line: name, branch, state, ports, network, age, unpushed,
    /// isolation, services; tab-separated.
    pub fn line(&self) -> String {
        let ports: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{}->{}", p.host, p.container))
            .collect();
        let ports = if ports.is_empty() {
            "-".to_string()
        } else {
            ports.join(",")
        };
        let unpushed = self.unpushed.map_or("-".to_string(), |n| n.to_string());
        let services = if self.services.is_empty() {
            "-".to_string()
        } else {
            self.services.join(",")
        };
        format!(
            "{}\t{}\t{}\t{ports}\t{}\t{}\t{unpushed}\t{}\t{services}",
            self.name,
            self.branch,
            self.state,
            self.network.as_str(),
            crate::time::human_age(self.age),
            self.isolation()
        )
    }
}

impl push::Pushed {
    /// The `push --json` record.
    pub fn json(&self, name: &str) -> serde_json::Value {
        serde_json::json!({"type": "push", "name": name, "branch": self.branch, "commit": self.commit, "url": self.url, "outcome": self.outcome})
    }
}

/// The command `shell` runs: the user's login shell, else bash, else sh.
pub fn login_shell() -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        "exec \"${SHELL:-$(command -v bash || echo sh)}\" -l".into(),
    ]
}

fn gone(rec: &Record) -> Error {
    Error::new(
        Exit::NoInput,
        format!(
            "the container '{}' of sandbox '{}' was removed behind lw-sandbox's back; run lw-sandbox gc to reclaim the rest",
            rec.container, rec.name
        ),
    )
}

/// Parses `8080`, `8080/tcp`, `53/udp` into `8080/tcp` form.
pub fn parse_port(s: &str) -> Result<String> {
    let (num, proto) = s.split_once('/').unwrap_or((s, "tcp"));
    match (num.parse::<u16>(), proto) {
        (Ok(n), "tcp" | "udp") if n > 0 => Ok(format!("{n}/{proto}")),
        _ => Err(Error::usage(format!(
            "'{s}' is not a container port (PORT or PORT/tcp or PORT/udp)"
        ))),
    }
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

/// Checks a branch name the way git does.
pub fn check_branch(branch: &str) -> Result<()> {
    let bad = || {
        Error::usage(format!(
            "'{}' is not a valid branch name (see git check-ref-format); e.g. lw/api-change",
            branch.escape_debug()
        ))
    };
    if branch.is_empty() || branch.starts_with('-') || branch == "HEAD" {
        return Err(bad());
    }
    let out = crate::git::output(
        crate::git::command(None).args(["check-ref-format", &format!("refs/heads/{branch}")]),
        "check a branch name",
    )?;
    if out.status.success() {
        Ok(())
    } else {
        Err(bad())
    }
}

mod create;
pub use create::resolve_image;

/// The `.loopwright/config` key of the sandboxes' OCI runtime.
pub const KEY_RUNTIME: &str = "sandbox.runtime";

impl Record {
    /// The runtime it was made under (`runc` for records older than the choice).
    pub fn runtime_name(&self) -> &str {
        self.runtime
            .as_deref()
            .unwrap_or(crate::engine::runtime::DEFAULT_RUNTIME)
    }
}

/// The sandbox settings read from the project's configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    pub uid: u32,
    pub pids: i64,
    pub memory: i64,
    pub tmp_size: String,
    pub ports: Range,
    pub allowed_secrets: Vec<String>,
    pub git_name: Option<String>,
    pub git_email: Option<String>,
    /// The incremental install command (default: the deps layer's deps.sh).
    pub install: Option<String>,
    /// CPUs, disk, log and push limits (lib/sandbox/limits.rs).
    pub limits: limits::Limits,
    /// `sandbox.runtime`: the OCI runtime, `None` for the engine's default.
    pub runtime: Option<String>,
}

impl Settings {
    pub fn from_project(p: Option<&Project>) -> Result<Settings> {
        let empty = crate::config::Config::default();
        let c = p.map(|p| &p.config).unwrap_or(&empty);
        let bad = |k: &str, v: &str, want: &str| {
            Error::config(format!(
                "'{k} = {v}' in .loopwright/config: expected {want}"
            ))
        };
        let uid = match c.get("sandbox.uid") {
            None => DEFAULT_UID,
            Some(v) => v
                .parse()
                .ok()
                .filter(|u| *u > 0)
                .ok_or_else(|| bad("sandbox.uid", v, "a non-zero user id"))?,
        };
        let pids = match c.get("sandbox.pids") {
            None => DEFAULT_PIDS,
            Some(v) => v
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad("sandbox.pids", v, "a positive number"))?,
        };
        let mem = c.get("sandbox.memory").unwrap_or(DEFAULT_MEMORY);
        let memory = parse_bytes(mem)
            .ok_or_else(|| bad("sandbox.memory", mem, "a size such as 512m or 2g"))?;
        let tmp_size = c
            .get("sandbox.tmp-size")
            .unwrap_or(DEFAULT_TMP_SIZE)
            .to_string();
        if parse_bytes(&tmp_size).is_none() {
            return Err(bad("sandbox.tmp-size", &tmp_size, "a size such as 256m"));
        }
        let ports = Range::parse(
            c.get(crate::ports::KEY_RANGE)
                .unwrap_or(crate::ports::DEFAULT_RANGE),
        )?;
        Ok(Settings {
            uid,
            pids,
            memory,
            tmp_size,
            ports,
            allowed_secrets: secrets::allowed(c)?,
            git_name: c.get("sandbox.git-name").map(str::to_string),
            git_email: c.get("sandbox.git-email").map(str::to_string),
            install: c.get("sandbox.install").map(str::to_string),
            limits: limits::Limits::from_config(c)?,
            runtime: match c.get(KEY_RUNTIME) {
                None => None,
                Some(v)
                    if !v.is_empty()
                        && v.chars()
                            .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch)) =>
                {
                    Some(v.to_string())
                }
                Some(v) => return Err(bad(KEY_RUNTIME, v, "a runtime name such as runc or runsc")),
            },
        })
    }
}

/// The hardened container of a sandbox.
#[allow(clippy::too_many_arguments)]
pub fn container_spec(
    sb: &Sandboxes,
    rec: &Record,
    settings: &Settings,
    mailbox: &Path,
    bins: &[(PathBuf, &str)],
    with_secrets: bool,
) -> ContainerSpec {
    let mut labels = BTreeMap::from([
        (LABEL_SANDBOX.to_string(), rec.name.clone()),
        (LABEL_ROOT.to_string(), sb.id.clone()),
        (
            LABEL_ROOT_PATH.to_string(),
            sb.root.dir.to_string_lossy().into_owned(),
        ),
        (LABEL_BRANCH.to_string(), rec.branch.clone()),
    ]);
    labels.retain(|_, v| !v.is_empty());
    let mut tmpfs = BTreeMap::from([(
        "/tmp".to_string(),
        format!("rw,noexec,nosuid,nodev,size={}", settings.tmp_size),
    )]);
    if with_secrets {
        tmpfs.insert(
            secrets::DIR.to_string(),
            format!(
                "rw,noexec,nosuid,nodev,size=1m,mode=0700,uid={0},gid={0}",
                settings.uid
            ),
        );
    }
    let mut binds = vec![
        Bind {
            // The workspace's own filesystem (or, with sandbox.disk = off, a
            // plain directory), given to the sandbox's user by the host.
            source: disk::work(&sb.root, &rec.name)
                .mount
                .to_string_lossy()
                .into_owned(),
            target: WORK.into(),
            read_only: false,
        },
        Bind {
            source: rec.mirror.to_string_lossy().into_owned(),
            target: MIRROR.into(),
            read_only: true,
        },
        Bind {
            source: mailbox.to_string_lossy().into_owned(),
            target: MAILBOX.into(),
            read_only: false,
        },
        // Read-only: lw-mcp's whoami names the peers and their scopes.
        Bind {
            source: sb.root.registry_dir().to_string_lossy().into_owned(),
            target: REGISTRY.into(),
            read_only: true,
        },
    ];
    for (src, name) in bins {
        binds.push(Bind {
            source: src.to_string_lossy().into_owned(),
            target: format!("{BIN_DIR}/{name}"),
            read_only: true,
        });
    }
    let mut env = vec![
        format!("LW_MAILBOX={MAILBOX}"),
        format!("LW_SANDBOX={}", rec.name),
        format!("LW_REGISTRY={REGISTRY}"),
        format!("LW_BRANCH={}", rec.branch),
        format!("HOME={HOME}"),
    ];
    let network = match rec.network {
        // The plan egress::prepare returned names this network and this environment.
        Network::Egress => {
            env.extend(egress::proxy_env());
            egress::network_name(&rec.container)
        }
        // No network of its own: the first service's is its only one.
        Network::None if !rec.services.is_empty() => {
            crate::service::attach::primary_network(&sb.id, &rec.services)
                .expect("services is not empty")
        }
        n => n.as_str().to_string(),
    };
    if let Some(a) = &rec.agent {
        // The model proxy is reached directly, not through the egress proxy.
        env.retain(|e| !e.starts_with("NO_PROXY=") && !e.starts_with("no_proxy="));
        env.push(format!("NO_PROXY={}", crate::agent::no_proxy()));
        env.push(format!("no_proxy={}", crate::agent::no_proxy()));
        env.extend(a.env.iter().cloned());
    }
    // A shared service is reached directly, never through the egress proxy.
    for e in env.iter_mut() {
        if !rec.services.is_empty() && (e.starts_with("NO_PROXY=") || e.starts_with("no_proxy=")) {
            e.push(',');
            e.push_str(&rec.services.join(","));
        }
    }
    ContainerSpec {
        name: Some(rec.container.clone()),
        image: rec.image.clone(),
        cmd: vec![],
        entrypoint: Some(vec!["/bin/sh".into(), "-c".into(), KEEPALIVE.into()]),
        env,
        user: Some(format!("{0}:{0}", settings.uid)),
        workdir: Some(WORK.into()),
        labels,
        read_only_root: true,
        cap_drop: vec!["ALL".into()],
        security_opt: security_options(),
        pids_limit: Some(settings.pids),
        memory_bytes: Some(settings.memory),
        nano_cpus: Some((settings.limits.cpus * 1e9) as i64),
        log_options: settings.limits.log_options().into_iter().collect(),
        tmpfs,
        binds,
        network: Some(network),
        ports: rec
            .ports
            .iter()
            .map(|p| PortMap {
                container: p.container.clone(),
                host_ip: "127.0.0.1".into(),
                host_port: p.host,
            })
            .collect(),
        tty: false,
        open_stdin: false,
        sysctls: BTreeMap::new(),
        // Below the host's own containers (1024), no core dumps of what the
        // agent ran, and a health check (CIS Docker 5.11, 5.18, 5.26).
        cpu_shares: Some(512),
        // (Only lowered: raising one above the engine's own is refused.)
        ulimits: vec![("core".into(), 0, 0)],
        healthcheck: Some((
            vec!["/bin/sh".into(), "-c".into(), format!("test -w {WORK}")],
            Duration::from_secs(300),
        )),
        runtime: rec.runtime.clone(),
    }
}

/// The sandboxes' seccomp profile: Docker's default without io_uring
/// (runtime/seccomp.json, made by scripts/seccomp-profile).
pub const SECCOMP_PROFILE: &str = include_str!("../../runtime/seccomp.json");

/// True when the host's kernel has AppArmor enabled.
pub fn host_has_apparmor() -> bool {
    fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.trim_start().starts_with('Y'))
}

/// no-new-privileges, the seccomp profile, and AppArmor's docker-default
/// where the host has AppArmor (lw doctor says when it has not).
pub fn security_options() -> Vec<String> {
    let mut v = vec![
        "no-new-privileges:true".to_string(),
        format!("seccomp={SECCOMP_PROFILE}"),
    ];
    if host_has_apparmor() {
        v.push("apparmor=docker-default".into());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_sizes_and_branches() {
        assert_eq!(parse_port("8080").unwrap(), "8080/tcp");
        assert_eq!(parse_port("53/udp").unwrap(), "53/udp");
        for bad in ["0", "x", "80/sctp", "70000"] {
            assert_eq!(parse_port(bad).unwrap_err().exit, Exit::Usage, "{bad}");
        }
        assert_eq!(parse_bytes("2g"), Some(2 << 30));
        assert_eq!(parse_bytes("512M"), Some(512 << 20));
        assert_eq!(parse_bytes("x"), None);
        assert!(check_branch("lw/api-1").is_ok());
        for bad in ["", "-x", "a..b", "a b", "x.lock", "HEAD", "a~1", "a:b"] {
            assert_eq!(check_branch(bad).unwrap_err().exit, Exit::Usage, "{bad}");
        }
    }

    #[test]
    fn root_ids_differ_by_root() {
        assert_ne!(root_id(Path::new("/a")), root_id(Path::new("/b")));
        assert_eq!(root_id(Path::new("/nonexistent/x")).len(), 8);
    }
}
