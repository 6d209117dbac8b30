//! The runtime contracts: what loopwright asks of a container engine.
//!
//! Commands and the library speak to these traits, never to an engine's API:
//! this module is the boundary.  There are two contracts, for two jobs:
//!
//! * the **sandbox runner** ([`SandboxEngine`], on [`Engine`] and
//!   [`NetworkEngine`]): containers, exec, volumes, networks;
//! * the **image builder** ([`ImageBuilder`]): build, tag, remove, save,
//!   load (what lw-build and the image cache push and pull through).
//!
//! Both look images up ([`Images`]).  [`docker`] (bollard, the Docker Engine
//! API) implements both; [`kubernetes`] (kube-rs) implements the runner
//! only.  Each command chooses its engines once, in its binary, through
//! [`select`] (the `engine` and `engine.host` keys of `.loopwright/config`,
//! `LW_ENGINE`, `DOCKER_HOST`), and passes them down: on Kubernetes the
//! runner is paired there with the Docker builder the same settings name.
//! A gVisor runtime is only a `runtime` name in [`ContainerSpec`], and
//! Podman's compatible socket and a remote `DOCKER_HOST` go through
//! [`docker`] as they are.  Another engine is a new module implementing the
//! traits, not a change to the modules that use them.  docs/architecture.md
//! draws it.
//!
//! * [`Engine`]: containers (create, start, stop, remove, inspect, exec with
//!   its exit status) and what the engine is;
//! * [`SandboxEngine`]: what a sandbox's life adds: containers and volumes by
//!   label (so `ls` and `gc` find what a killed `create` left), named
//!   volumes, an exec fed from the caller with a terminal when asked; and,
//!   as a supertrait, every network operation, so a sandbox wires its
//!   networks through the engine it was given;
//! * [`NetworkEngine`]: networks (create, inspect, list by label, remove,
//!   connect, disconnect) and a container's log;
//! * [`ImageBuilder`]: images (tag, remove, build from a tar context with
//!   streamed output, save, load, their layers); [`Images`]: inspect, list
//!   by label.
//!
//! The methods block: an implementation keeps whatever runtime it needs to
//! itself (the Docker one, a current-thread tokio runtime), so callers are
//! plain synchronous code and no async runtime leaks into the commands.
//!
//! Errors follow the house exit statuses: an engine that cannot be reached is
//! 69 (unavailable) with a hint on how to start it; a missing object is 66; a
//! name already taken is 73; anything else the engine refuses is 69 as well,
//! since only the engine knows why, and carries a [`Refusal`] when a caller
//! acts on the reason (a published port held by something else).  An exec whose container dies under it
//! ends at once with 69 too, whether or not the engine ends its stream, with
//! the way the container ended as a [`Died`] ([`died`]).

pub mod config;
pub mod credentials;
mod died;
pub mod distribution;
pub mod docker;
pub mod hostpaths;
pub mod kubernetes;
mod paths;
pub mod pool;
mod refusal;
pub mod runtime;
pub mod select;
mod stdin;
mod tar_out;
pub mod tty;

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

pub use died::{Died, died, exit_state};
pub use docker::DockerEngine;
pub use kubernetes::KubeEngine;
pub use paths::HostPaths;
pub use pool::{Claimed, OwnClaim, WarmPool, pool_key};
pub use refusal::Refusal;
pub use runtime::{EngineInfo, Isolation, RuntimeInfo};
pub use select::{ENGINE_KEY, EngineKind, Engines, Pair, connect_docker};

use base::error::Result;

/// The current-thread tokio runtime an engine client keeps, so that its
/// methods block as the contract says.
pub(crate) fn io_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            base::error::Error::new(base::error::Exit::Software, "cannot start the I/O runtime")
                .with_source(e)
        })
}

/// What the engine says about itself.
#[derive(Clone, Debug)]
pub struct EngineVersion {
    /// The engine's own version, e.g. `20.10.24`.
    pub version: String,
    /// The API version both sides agreed on, e.g. `1.41`.
    pub api: String,
}

/// An image as loopwright needs it.
#[derive(Clone, Debug, Default)]
pub struct Image {
    /// The content id, `sha256:...`.
    pub id: String,
    /// Every `repo:tag` pointing at it.
    pub tags: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// Creation time in seconds since the epoch (0 when the engine did not say).
    pub created: i64,
}

/// One image build.
#[derive(Clone, Debug, Default)]
pub struct BuildRequest {
    /// A tar archive: the whole build context.
    pub context: Vec<u8>,
    /// Path of the Dockerfile inside the context.
    pub dockerfile: String,
    /// `repo:tag` applied when, and only when, the build succeeds.
    pub tag: String,
    pub labels: BTreeMap<String, String>,
    pub args: BTreeMap<String, String>,
}

/// A line of build output, as it arrives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildEvent {
    /// Text from a build step (the step headers and the commands' own output).
    Output(String),
    /// Engine status, e.g. progress of a pull.
    Status(String),
}

/// How a build ended when the engine itself worked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildOutcome {
    /// The image id; the tag now points at it.
    Built(String),
    /// A step failed; the engine's message (no tag was applied).
    Failed(String),
}

/// A bind mount from the host.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Bind {
    pub source: String,
    pub target: String,
    pub read_only: bool,
}

/// A named volume of the engine mounted into a container (`create_volume`
/// makes it): what a sandbox mounts when the engine does not see the host's
/// files (lib/sandbox/volume.rs).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct VolumeMount {
    pub volume: String,
    pub target: String,
    pub read_only: bool,
}

/// A published port: container port (`8080/tcp`) to host address and port.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct PortMap {
    pub container: String,
    pub host_ip: String,
    pub host_port: u16,
}

/// Everything needed to create a container.  Options left empty take the
/// engine's defaults; hardening is the caller's to ask for.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ContainerSpec {
    pub name: Option<String>,
    pub image: String,
    pub cmd: Vec<String>,
    pub entrypoint: Option<Vec<String>>,
    pub env: Vec<String>,
    pub user: Option<String>,
    pub workdir: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub read_only_root: bool,
    pub cap_drop: Vec<String>,
    pub security_opt: Vec<String>,
    pub pids_limit: Option<i64>,
    pub memory_bytes: Option<i64>,
    /// Mount point to options, e.g. `/tmp` -> `rw,noexec,nosuid,size=64m`.
    pub tmpfs: BTreeMap<String, String>,
    pub binds: Vec<Bind>,
    /// Named volumes of the engine, mounted beside the binds.
    pub volumes: Vec<VolumeMount>,
    /// `none`, `bridge` or a network name; `None` is the engine's default.
    pub network: Option<String>,
    pub ports: Vec<PortMap>,
    pub tty: bool,
    pub open_stdin: bool,
    /// CPUs in billionths (`--cpus 1.5` is 1_500_000_000).
    pub nano_cpus: Option<i64>,
    /// Options of the json-file log driver (`max-size`, `max-file`).
    pub log_options: BTreeMap<String, String>,
    /// Namespaced kernel settings (`net.ipv4.ip_forward` -> `0`).
    pub sysctls: BTreeMap<String, String>,
    /// The relative CPU weight (the engine's default is 1024).
    pub cpu_shares: Option<i64>,
    /// Resource limits: name (`nofile`, `core`), soft, hard.
    pub ulimits: Vec<(String, i64, i64)>,
    /// A health check: the command (exec form) and its interval.
    pub healthcheck: Option<(Vec<String>, std::time::Duration)>,
    /// The OCI runtime to run it under (`runsc` for gVisor); `None` is the
    /// engine's default (runc).  See [`EngineInfo::runtimes`].
    pub runtime: Option<String>,
    /// Extra lines of the container's /etc/hosts: name -> address (Docker's
    /// `--add-host`, a pod's `hostAliases`), for names no DNS serves.
    pub hosts: BTreeMap<String, String>,
    /// The engine starts it again when its process ends with a failure
    /// (killed, out of memory), not when it is stopped (Docker's
    /// `--restart on-failure`: after 100 ms, doubling while it keeps failing
    /// within 10 s).
    pub restart_on_failure: bool,
}

/// A container as loopwright needs it.
#[derive(Clone, Debug, Default)]
pub struct Container {
    pub id: String,
    /// Without the leading slash Docker adds.
    pub name: String,
    /// The image id it runs.
    pub image: String,
    pub running: bool,
    /// `created`, `running`, `exited`, ...
    pub status: String,
    pub exit_code: Option<i64>,
    /// The kernel's OOM killer ended it at its memory limit (inspect says;
    /// a listing does not).
    pub oom_killed: bool,
    pub labels: BTreeMap<String, String>,
    pub ports: Vec<PortMap>,
    /// The OCI runtime it runs under, as the engine names it (`runc`, `runsc`).
    pub runtime: String,
}

/// A command to run in a running container.
#[derive(Clone, Debug, Default)]
pub struct ExecRequest {
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub user: Option<String>,
    pub workdir: Option<String>,
}

/// Which stream a chunk of exec output came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutStream {
    Stdout,
    Stderr,
}

/// What an engine holds of images: the lookups both contracts share, a
/// runner to know whether it can run an image (on Kubernetes, what the
/// nodes report), a builder to know what it built.
pub trait Images {
    /// The image `reference` (tag or id) points at, `None` when there is none.
    fn image(&self, reference: &str) -> Result<Option<Image>>;
    /// True when `reference` names a local image.
    fn image_exists(&self, reference: &str) -> Result<bool> {
        Ok(self.image(reference)?.is_some())
    }
    /// Local images carrying `label` (`key` or `key=value`), newest first.
    fn images_with_label(&self, label: &str) -> Result<Vec<Image>>;
}

/// The image builder contract: building, tagging and removing images, and
/// moving them in and out of the engine as archives, the format of `docker
/// save` (a tar of `manifest.json`, one config per image and one
/// `layer.tar` per layer): how lw-build makes a project's layers and the
/// image cache (crates/wall/src/image/cache.rs) carries them between an engine and a
/// registry or a file.  The Docker engine (and Podman's socket) is one;
/// Kubernetes is not: [`select`] pairs its runner with a Docker builder.
pub trait ImageBuilder: Images {
    /// Points `repo:tag` at `image`.
    fn tag(&self, image: &str, repo: &str, tag: &str) -> Result<()>;
    /// Removes the tag or image `reference`; a missing one is not an error.
    fn remove_image(&self, reference: &str, force: bool) -> Result<()>;
    /// Builds `req`, passing every line of output to `on_event` as it arrives.
    /// A failing step is `Ok(BuildOutcome::Failed)`; `Err` means the engine
    /// itself failed.
    fn build(
        &self,
        req: &BuildRequest,
        on_event: &mut dyn FnMut(BuildEvent),
    ) -> Result<BuildOutcome>;
    /// Writes one archive of `references` (tags or ids; shared layers once)
    /// to `out`; returns its size in bytes.
    fn save_images(&self, references: &[&str], out: &mut dyn std::io::Write) -> Result<u64>;
    /// Loads the archive in `archive` (read from its current position);
    /// returns the references the engine says it loaded.  A layer the
    /// engine already holds (same chain of layer digests) may be absent from
    /// the archive: the engine does not read it.
    fn load_images(&self, archive: std::fs::File) -> Result<Vec<String>>;
    /// The layer digests (`sha256:...` of each uncompressed layer tar, in
    /// order) of the image `reference`, `None` when there is no such image.
    fn image_layers(&self, reference: &str) -> Result<Option<Vec<String>>>;
}

/// The runner's base contract: containers (create, start, stop, remove,
/// inspect, exec with its exit status), and what the engine is.
pub trait Engine: Images {
    /// Checks the engine answers and says which version it runs.
    fn version(&self) -> Result<EngineVersion>;
    /// Creates a container and returns its id.
    fn create(&self, spec: &ContainerSpec) -> Result<String>;
    fn start(&self, container: &str) -> Result<()>;
    /// Stops with SIGTERM, then SIGKILL after `timeout`; a stopped one is not an error.
    fn stop(&self, container: &str, timeout: Duration) -> Result<()>;
    /// Removes a container; a missing one is not an error.
    fn remove(&self, container: &str, force: bool) -> Result<()>;
    /// The container `name_or_id`, `None` when there is none.
    fn inspect(&self, name_or_id: &str) -> Result<Option<Container>>;
    /// Runs `req` in a running container, passing its output to `on_output`
    /// as it arrives, and returns its exit status.  When the container ends
    /// while it runs, the exec ends too (within seconds) with 69 and a
    /// [`Died`] as its error's source.
    fn exec(
        &self,
        container: &str,
        req: &ExecRequest,
        on_output: &mut dyn FnMut(OutStream, &[u8]),
    ) -> Result<i64>;
    /// What the engine is (Docker or Podman), the OCI runtimes it offers and
    /// its security options; see [`runtime`].
    fn info(&self) -> Result<EngineInfo>;
    /// Waits until `container` next stops running (it exits, is killed, or
    /// is removed), at most `timeout`: `Some(true)` when it did, `Some(false)`
    /// when the time passed.  `None`: the engine cannot tell, as on
    /// Kubernetes, whose kubelet restarts a pod's container whatever ended it.
    fn wait_exit(&self, container: &str, timeout: Duration) -> Result<Option<bool>> {
        let _ = (container, timeout);
        Ok(None)
    }
}

/// A named volume.
#[derive(Clone, Debug, Default)]
pub struct Volume {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// How an exec's standard streams are connected.
pub struct ExecIo<'a> {
    /// Bytes fed to the command's standard input, then end of file.  `None`
    /// leaves its stdin closed.
    pub stdin: Option<Box<dyn Read + Send>>,
    /// Allocate a terminal (output then arrives as one stream, stdout).
    pub tty: bool,
    /// The terminal's size, rows and columns.
    pub size: Option<(u16, u16)>,
    pub on_output: &'a mut dyn FnMut(OutStream, &[u8]),
    /// The caller wants no more output: once this is set (by `on_output`,
    /// typically), the engine reads none past the chunk in hand, closes the
    /// exec's streams and returns [`STOPPED`] at once, without waiting for
    /// the command to end.  `None`: the output is read to its end.
    pub stop: Option<&'a AtomicBool>,
}

impl<'a> ExecIo<'a> {
    /// The common case: stdin closed, no terminal, every chunk of output
    /// to `on_output`, read to its end.
    pub fn output(on_output: &'a mut dyn FnMut(OutStream, &[u8])) -> Self {
        ExecIo {
            stdin: None,
            tty: false,
            size: None,
            on_output,
            stop: None,
        }
    }
}

/// What [`SandboxEngine::exec_io`] returns for an exec whose caller set
/// [`ExecIo::stop`]: 141, what a shell says of a writer whose reader went
/// away (128 + SIGPIPE).  It is the caller's word, not the command's
/// status: closing the streams ends the command on one engine and leaves it
/// running on another (Docker's exec runs on, blocked on its full pipe;
/// `copy_out` kills its `tar` itself).
pub const STOPPED: i64 = 128 + 13;

/// The sandbox runner contract: the base contract and networks, plus
/// what a sandbox's life needs.
pub trait SandboxEngine: Engine + NetworkEngine + HostPaths + Sync {
    /// Every container, running or not, carrying `label` (`key` or `key=value`).
    fn containers_with_label(&self, label: &str) -> Result<Vec<Container>>;
    /// Creates the volume `name`; an existing one is reused.
    fn create_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<()>;
    /// Removes the volume `name`; a missing one is not an error.
    fn remove_volume(&self, name: &str) -> Result<()>;
    /// Every volume carrying `label`.
    fn volumes_with_label(&self, label: &str) -> Result<Vec<Volume>>;
    /// Runs `req` in a running container with `io` attached; returns its exit
    /// status (128+n when a signal ended it).  When the container ends while
    /// it runs: 69 with a [`Died`], as [`Engine::exec`].  When the caller
    /// sets [`ExecIo::stop`]: [`STOPPED`] at once, the exec's streams closed
    /// (Docker drops the attach connection, Kubernetes the WebSocket) and
    /// nothing more read, so what crosses the connection is what the caller
    /// took and the chunk in flight; the command may still run (Docker does
    /// not end it), and ending it is the caller's.
    fn exec_io(&self, container: &str, req: &ExecRequest, io: ExecIo<'_>) -> Result<i64>;
    /// Whether a container (and an exec in it) may run as root.  Kubernetes
    /// runs every pod as non-root and an exec as the pod's own user, so
    /// volume mode fills its volumes as the sandbox's user there (the
    /// volumes made writable to it by the pod's `fsGroup`), and the default
    /// [`SandboxEngine::copy_in`] and [`SandboxEngine::copy_out`] run `tar`
    /// as that user, which keeps modes but cannot give files away.
    fn runs_as_root(&self) -> bool {
        true
    }
    /// The engine's warm pool, when it can keep one (Kubernetes): a create
    /// claims a ready container from it instead of making one when its
    /// [`WarmPool::pool_size`] is above 0 (lib/sandbox/pool.rs), and `gc`
    /// drains the pools no create uses any more.
    fn warm_pool(&self) -> Option<&dyn WarmPool> {
        None
    }
    /// Unpacks the tar archive `tar` into the directory `dir` of `container`
    /// (created or running; `dir` on a writable volume when its root is
    /// read-only), keeping each entry's owner and mode as the archive says.
    /// How files reach an engine that does not see the host's
    /// (lib/sandbox/volume.rs).  The default runs `tar -x` in the running
    /// container through [`SandboxEngine::exec_io`], as root, or where
    /// containers run as non-root ([`SandboxEngine::runs_as_root`]) as the
    /// container's user with the files its own (`-o`); the Docker engine
    /// uses its archive endpoint (`docker cp`) instead.
    fn copy_in(&self, container: &str, dir: &str, tar: Box<dyn Read + Send>) -> Result<()> {
        let root = self.runs_as_root();
        let owner = if root { "-p" } else { "-o" };
        let req = ExecRequest {
            cmd: ["tar", "-x", owner, "-f", "-", "-C", dir]
                .map(String::from)
                .to_vec(),
            user: root.then(|| "0".into()),
            ..Default::default()
        };
        let mut err = Vec::new();
        let mut on = |s: OutStream, b: &[u8]| {
            if s == OutStream::Stderr {
                err.extend_from_slice(b)
            }
        };
        let io = ExecIo {
            stdin: Some(tar),
            tty: false,
            size: None,
            on_output: &mut on,
            stop: None,
        };
        match self.exec_io(container, &req, io)? {
            0 => Ok(()),
            n => Err(base::error::Error::new(
                base::error::Exit::Unavailable,
                format!(
                    "cannot copy into '{dir}' of container '{container}': tar exited {n}: {}",
                    String::from_utf8_lossy(&err).trim()
                ),
            )),
        }
    }
    /// Writes a tar archive of `path` (a file or a directory, by its last
    /// component, never following a link at its end) in `container`
    /// (created or running) to `out`; returns the bytes written.  A missing
    /// `path` is 66; `out` failing is 74.  The default runs `tar -c` in the
    /// running container through [`SandboxEngine::exec_io`]; the Docker
    /// engine uses its archive endpoint (`docker cp`) instead.
    ///
    /// Bounded by its reader: once `out` fails (a reader that stops at its
    /// bound drops its end of the pipe), no more of the archive crosses the
    /// engine's connection, whatever `path` holds (five sparse 2 GiB files
    /// are 10 GiB of archive).  The default stops the exec
    /// ([`ExecIo::stop`]) and then kills its `tar` in a second exec, since
    /// closing an exec's streams does not end its process on every engine;
    /// tar_out.rs says why this and not a bound inside the container.
    fn copy_out(&self, container: &str, path: &str, out: &mut dyn std::io::Write) -> Result<u64> {
        tar_out::copy_out(self, container, path, out)
    }
}

/// A network to create.
#[derive(Clone, Debug, Default)]
pub struct NetworkSpec {
    pub name: String,
    /// No route out of the network: its containers reach only each other.
    pub internal: bool,
    /// The host gets no address on the network, so its containers cannot
    /// reach the host's services through it either.
    pub no_host_address: bool,
    /// Containers on the network may not talk to each other.
    pub isolate_containers: bool,
    pub labels: BTreeMap<String, String>,
}

/// A network as the egress topology needs it.
#[derive(Clone, Debug, Default)]
pub struct Network {
    pub id: String,
    pub name: String,
    pub internal: bool,
    pub labels: BTreeMap<String, String>,
    pub options: BTreeMap<String, String>,
    /// Subnets in CIDR form, with their gateways (empty when none).
    pub subnets: Vec<(String, String)>,
    /// Attached containers: name to IPv4 address (CIDR form).
    pub containers: BTreeMap<String, String>,
    /// Creation time as the engine wrote it (RFC 3339), for ordering.
    pub created: String,
}

/// The runtime contract, with networks.
pub trait NetworkEngine: Engine {
    /// Creates a network; names need not be unique to the engine, so callers
    /// that share a name settle on one (see `egress`).
    fn create_network(&self, spec: &NetworkSpec) -> Result<Network>;
    /// The network `name_or_id`, `None` when there is none.
    fn network(&self, name_or_id: &str) -> Result<Option<Network>>;
    /// Every network carrying `label` (`key` or `key=value`).
    fn networks_with_label(&self, label: &str) -> Result<Vec<Network>>;
    /// Removes a network; a missing one is not an error.
    fn remove_network(&self, name_or_id: &str) -> Result<()>;
    /// Attaches `container` (created or running) to `network`, where it is
    /// also known by `aliases`.
    fn connect(&self, network: &str, container: &str, aliases: &[&str]) -> Result<()>;
    /// Detaches `container` from `network`; not being attached is not an error.
    fn disconnect(&self, network: &str, container: &str) -> Result<()>;
    /// What `container` wrote to stdout (`stdout`) or stderr so far.
    fn logs(&self, container: &str, stdout: bool) -> Result<Vec<u8>>;
    /// Follows `container`'s output until a line satisfies `done`, the
    /// container stops (false), or `timeout` passes (false).
    fn wait_for_line(
        &self,
        container: &str,
        timeout: Duration,
        done: &mut dyn FnMut(&str) -> bool,
    ) -> Result<bool>;
    /// Gives `container`'s `port` a stable address that the members of its
    /// networks use, and returns that address's host; `None` when the
    /// engine needs no object for it because the aliases given to
    /// [`connect`](NetworkEngine::connect) resolve (Docker).  On Kubernetes
    /// it is a Service named as the container, labelled `labels`, and the
    /// host is its cluster address (there is no per-network name service).
    fn publish(
        &self,
        container: &str,
        port: u16,
        labels: &BTreeMap<String, String>,
    ) -> Result<Option<String>> {
        let _ = (container, port, labels);
        Ok(None)
    }
    /// Removes what [`publish`](NetworkEngine::publish) made for
    /// `container`; nothing there is not an error.
    fn unpublish(&self, container: &str) -> Result<()> {
        let _ = container;
        Ok(())
    }
}
