//! Shared services: one database or API that chosen sandboxes reach, and
//! nothing else.
//!
//! A service is declared in `.loopwright/services/NAME` (decl.rs) and run by
//! `lw-service up NAME` as one hardened container of the mailbox root, on a
//! network of its own:
//!
//! ```text
//!   sandbox a ─┐
//!              ├─(lw-svc-ROOTID-NAME: internal, no host address)─ service, known there as NAME
//!   sandbox b ─┘
//!   sandbox c    (not attached: no route to the service, no DNS answer for NAME)
//! ```
//!
//! * The network is `internal` (no route out) and the host has no address
//!   on it, like a sandbox's egress network.  `lw-sandbox create --service
//!   NAME` attaches the sandbox to it (attach.rs); nothing else is on it.
//!   The service answers there to the DNS name NAME (a network alias); a
//!   sandbox that is not attached has no interface on that network, so it
//!   gets neither a route nor an answer.  Sandboxes attached to one service
//!   can reach each other over its network: they share the service, which
//!   is a channel between them anyway.
//! * The network and the data volume outlive the container: `down` removes
//!   the container only, so attached sandboxes stay attached and find the
//!   service again at the next `up`, with its data.  `rm` removes the
//!   network too (detaching the sandboxes), and the volume with `--volumes`.
//! * `port = HOST:PORT` publishes the port on 127.0.0.1:HOST.  Publishing
//!   needs a network the engine can forward to, so such a service is also
//!   on a network of its own that is not internal (`-pub`, containers
//!   isolated): it then has a route out, which `up` says.
//! * `egress = HOST:PORT ...` gives the service the sandboxes' egress proxy
//!   (crates/wall/src/egress/) and that allow-list; without it the service reaches
//!   nothing outside.
//! * Hardening as for sandboxes: no capabilities, no-new-privileges, the
//!   sandboxes' seccomp profile and AppArmor profile, a read-only root with
//!   tmpfs `/tmp` and `/run`, memory, pids and CPU limits, rotated logs, no
//!   core dumps.  The user is the declaration's `user`, else the image's own
//!   (`up` warns when that is root).
//! * Secrets (`secret = NAME ...`, allowed by `sandbox.secrets`) travel as a
//!   sandbox's do (crates/wall/src/secrets.rs): streamed over exec into a tmpfs at
//!   `/run/secrets`; the command waits for them before it starts.
//!
//! Nothing is kept on disk: every engine object carries [`LABEL_SERVICE`],
//! the root's id and the project's path, which is how `ls` finds them and
//! `gc` knows a service whose declaration is gone.
//!
//! By file: `decl` (the declaration), `attach` (what lw-sandbox calls),
//! `image` (the image a service runs), `up` (making it run), `state`
//! (readiness, logs, `ls`), `down` (`down`, `rm`, `gc`).

pub mod attach;
pub mod decl;
mod down;
mod image;
mod state;
mod up;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use decl::{Declaration, Source};
pub use state::Status;
pub use up::Up;

use engine::{ImageBuilder, Pair, SandboxEngine};
use wall::{LABEL_ROOT, LABEL_ROOT_PATH};

/// The service an engine object belongs to.
pub const LABEL_SERVICE: &str = "org.loopwright.service";
/// What it is: `container`, `network`, `publish`, `volume`.
pub const LABEL_KIND: &str = "org.loopwright.service.kind";
/// The project whose declaration it runs.
pub const LABEL_PROJECT: &str = "org.loopwright.service.project";
/// The hash of the declaration and image a container runs.
pub const LABEL_CONFIG: &str = "org.loopwright.service.config";

/// The readiness command a container runs (for `lw-sandbox create --service`).
pub const LABEL_READY: &str = "org.loopwright.service.ready";

/// The services of one mailbox root, on one engine.
pub struct Services<'a> {
    /// The root's id (`wall::root_id`).
    pub id: String,
    pub root_path: PathBuf,
    /// The runner the services run on (the sandboxes' own).
    pub engine: &'a dyn SandboxEngine,
    /// The builder paired with it, for `build = DIR` and the egress proxy.
    pub images: &'a dyn ImageBuilder,
}

/// The object names of service NAME in root ID.
pub fn container_name(id: &str, name: &str) -> String {
    format!("lw-svc-{id}-{name}")
}
pub fn network_name(id: &str, name: &str) -> String {
    format!("lw-svc-{id}-{name}")
}
pub fn publish_network_name(id: &str, name: &str) -> String {
    format!("lw-svc-{id}-{name}-pub")
}
pub fn volume_name(id: &str, name: &str) -> String {
    format!("lw-svc-{id}-{name}-data")
}

fn tail(text: &[u8], n: usize) -> String {
    let t = String::from_utf8_lossy(text);
    let lines: Vec<&str> = t.lines().collect();
    base::visible::visible(&lines[lines.len().saturating_sub(n)..].join("\n")).into_owned()
}

impl<'a> Services<'a> {
    pub fn new(root: &Path, engines: Pair<'a>) -> Services<'a> {
        Services {
            id: wall::root_id(root),
            root_path: root.to_path_buf(),
            engine: engines.runner,
            images: engines.builder,
        }
    }

    fn labels(&self, name: &str, kind: &str, project: &Path) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_SERVICE.to_string(), name.to_string()),
            (LABEL_KIND.to_string(), kind.to_string()),
            (LABEL_ROOT.to_string(), self.id.clone()),
            (
                LABEL_ROOT_PATH.to_string(),
                self.root_path.to_string_lossy().into_owned(),
            ),
            (
                LABEL_PROJECT.to_string(),
                project.to_string_lossy().into_owned(),
            ),
        ])
    }
}
