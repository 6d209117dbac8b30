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
//! | `/usr/local/bin/lw-{post,inbox,mcp,confine}` | the static mailbox commands, the seccomp launcher | ro |
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
//! * port leases in `ROOT/state/ports` (crates/wall/src/ports.rs);
//! * the registry record `ROOT/registry/NAME.json` and the mailbox
//!   `ROOT/sandboxes/NAME` (crates/mailbox/src/registry.rs).
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
//!
//! # Where each part lives
//!
//! * `create`: the steps of `create`, with its checks,
//!   image choice, clone and incremental install in `create/`;
//! * `record`: the record and the name lock;
//! * `settings`: the `sandbox.*` configuration and the limit flags over it;
//! * `spec`: the hardened container a sandbox runs in;
//! * `running`: a made sandbox at work (start, stop, commands run in it);
//! * `ls`: what `ls`, `port` and `logs --egress` show;
//! * `gc`: `rm` and `gc`, reclaiming everything a sandbox owns;
//! * `agent`: the agent's steps of a sandbox (crates/agent/ knows no sandbox);
//! * `volume`, `courier`: a sandbox on an engine that does not see the
//!   host's files (volume mode), and the carrier of its mail (with the one
//!   detached courier per root that `create` starts);
//! * `push`, `disk`, `limits`, `mailbox`: as their names say (whether the
//!   engine sees the host's files is engine::hostpaths).

mod agent;
pub mod courier;
mod create;
pub mod disk;
mod gc;
mod lifecycle;
pub mod limits;
mod ls;
pub mod mailbox;
mod pool;
pub mod pull;
pub mod push;
mod record;
mod running;
pub mod scratch;
mod settings;
mod spec;
pub mod volume;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use ::base::error::{Error, Exit, Result};
use ::mailbox::layout::Root;
use base::config::Project;
pub use create::{ImageChoice, check_branch, parse_port, resolve_image};
use engine::{EngineKind, ImageBuilder, Pair, SandboxEngine};
pub use ls::{HEADER as LS_HEADER, Status};
pub use record::{NameLock, Record};
pub use settings::{
    DEFAULT_MEMORY, DEFAULT_PIDS, DEFAULT_TMP_SIZE, DEFAULT_UID, KEY_RUNTIME, Settings,
};
pub use spec::container_spec;
use wall::ports::Leases;
pub use wall::{
    BIN_DIR, HOME, LABEL_BRANCH, LABEL_ROOT, LABEL_ROOT_PATH, LABEL_SANDBOX, MAILBOX, MIRROR,
    REGISTRY, REPO, WORK, host_has_apparmor, root_id, security_options,
};

/// A sandbox's network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Only the loopback interface.
    None,
    /// Docker's default bridge: the sandbox reaches anything the host reaches.
    Bridge,
    /// Its own internal network shared only with its own proxy, which lets
    /// through the allow-list's host:port pairs (crates/wall/src/egress/).
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

/// A published port: container port to leased host port on 127.0.0.1,
/// or, in volume mode, on the engine's host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Port {
    /// `8080/tcp`.
    pub container: String,
    pub host: u16,
    /// Where it is reached when not on 127.0.0.1 of this host: the engine's
    /// host (volume mode, where it is published on all its addresses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
}

impl Port {
    /// `ADDRESS:PORT`, as a client reaches it.
    pub fn address(&self) -> String {
        format!(
            "{}:{}",
            self.ip.as_deref().unwrap_or("127.0.0.1"),
            self.host
        )
    }
}

/// Where lw-sandbox works: a mailbox root and the engines its binary chose
/// (engine::select): the runner, and the builder the images come from.
pub struct Sandboxes<'a> {
    pub root: Root,
    pub id: String,
    /// The sandbox runner.
    pub engine: &'a dyn SandboxEngine,
    /// The image builder paired with it (the runner itself on Docker).
    pub images: &'a dyn ImageBuilder,
    /// What the runner is: on Kubernetes the builder's images reach the
    /// nodes through the image cache or an import.
    pub kind: EngineKind,
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
    /// An agent kit to install and set up (crates/agent/), and how its key travels.
    pub agent: Option<(String, ::agent::Credential)>,
    /// Limits given as flags (`--cpus`, `--memory`, `--pids`, `--disk`, `--mail-disk`).
    pub limits: limits::Overrides,
    /// Run the install script of the task's branch when it differs from
    /// the image's (lib/sandbox/create/install.rs).
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

/// What `gc` reclaimed, one line each: `KIND WHAT`.
pub type Reclaimed = Vec<(String, String)>;

fn io_err<'p>(what: &str, p: &'p Path) -> impl FnOnce(std::io::Error) -> Error + 'p {
    let what = what.to_string();
    move |e| Error::io(&what, p, e)
}

impl<'a> Sandboxes<'a> {
    pub fn new(root: Root, engines: Pair<'a>) -> Sandboxes<'a> {
        let id = root_id(&root.dir);
        Sandboxes {
            root,
            id,
            engine: engines.runner,
            images: engines.builder,
            kind: engines.kind,
        }
    }

    /// The runner and builder it was given.
    pub fn engines(&self) -> Pair<'a> {
        Pair {
            runner: self.engine,
            builder: self.images,
            kind: self.kind,
        }
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
    let found = wall::config::project(&start)?;
    if project.is_some() && found.is_none() {
        return Err(Error::usage(format!(
            "'{}' is not inside a git checkout",
            start.display()
        )));
    }
    let env = std::env::var_os(repo::mirror::ENV_PATH).map(PathBuf::from);
    let path = repo::mirror::locate(mirror, env.as_deref(), found.as_ref(), &cwd)?;
    Ok((found, path))
}

/// lw-post, lw-inbox, lw-mcp and lw-confine, beside the running program:
/// mounted into sandboxes.
pub fn mailbox_commands() -> [(PathBuf, &'static str); 4] {
    let dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_default();
    [
        (dir.join("lw-post"), "lw-post"),
        (dir.join("lw-inbox"), "lw-inbox"),
        (dir.join("lw-mcp"), "lw-mcp"),
        (dir.join(wall::CONFINE), wall::CONFINE),
    ]
}

/// The command `shell` runs: the user's login shell, else bash, else sh.
pub fn login_shell() -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        "exec \"${SHELL:-$(command -v bash || echo sh)}\" -l".into(),
    ]
}
