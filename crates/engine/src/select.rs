//! Which engines a command talks to, chosen once, in its binary, and passed
//! down: the sandbox runner and the image builder (the two contracts of
//! lib.rs).  lw-build, lw-service, lw-sandbox and lw-doctor all choose here,
//! so one project's settings reach one engine whichever command reads them.
//!
//! The settings, and which wins (the environment over the project, as the
//! Docker CLI and kubectl have it):
//!
//! 1. the kind: `LW_ENGINE` when set and not empty, else `engine` in
//!    `.loopwright/config`, else `docker`.  `docker` (also `podman`) or
//!    `kubernetes` (also `k8s`); another name is 78.
//! 2. the Docker engine (the runner on Docker, and the builder on either
//!    kind): `DOCKER_HOST` when set and not empty, else the project's
//!    `engine.host` (e.g. Podman's `unix:///run/podman/podman.sock`), else
//!    the local dockerd (`unix:///var/run/docker.sock`).
//! 3. on Kubernetes, the cluster: `KUBECONFIG` over `engine.kubeconfig`,
//!    `engine.context`, `engine.namespace` (kubernetes/connect.rs).
//!
//! Docker builds what it runs: runner and builder are one engine, one
//! connection.  Kubernetes builds nothing: its runner is paired here with
//! the Docker builder of rule 2, connected when an image is first asked
//! of it, so a command that builds nothing (`lw-sandbox ls`, `rm`, `exec`,
//! a create with `--image`) does not need a Docker engine at all.

use std::sync::OnceLock;

use crate::docker::HOST_KEY;
use crate::{
    BuildEvent, BuildOutcome, BuildRequest, DockerEngine, Image, ImageBuilder, Images, KubeEngine,
    SandboxEngine,
};
use base::config::Config;
use base::error::{Error, Result};

/// The `.loopwright/config` key naming the engine.
pub const ENGINE_KEY: &str = "engine";

/// The Docker engine's address when neither `DOCKER_HOST` nor `engine.host`
/// names one.
pub const LOCAL_DOCKER: &str = "unix:///var/run/docker.sock";

/// The engines there are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Docker,
    Kubernetes,
}

fn non_empty_env(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

impl EngineKind {
    /// `LW_ENGINE`, else the project's `engine`, else Docker; an unknown
    /// name is 78 naming the two.
    pub fn of(config: Option<&Config>) -> Result<EngineKind> {
        let (name, from) = match non_empty_env("LW_ENGINE") {
            Some(v) => (Some(v), "LW_ENGINE"),
            None => (
                config.and_then(|c| c.get(ENGINE_KEY)).map(str::to_string),
                "engine in .loopwright/config",
            ),
        };
        match name.as_deref() {
            None | Some("docker") | Some("podman") => Ok(EngineKind::Docker),
            Some("kubernetes") | Some("k8s") => Ok(EngineKind::Kubernetes),
            Some(other) => Err(Error::config(format!(
                "{from} is '{other}'; it is 'docker' (also Podman's socket, through engine.host) or 'kubernetes'"
            ))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Docker => "docker",
            EngineKind::Kubernetes => "kubernetes",
        }
    }
}

/// The Docker engine's address: `DOCKER_HOST`, else the project's
/// `engine.host`, else the local socket (rule 2 above).
pub fn docker_host(config: Option<&Config>) -> String {
    non_empty_env("DOCKER_HOST")
        .or_else(|| {
            config
                .and_then(|c| c.get(HOST_KEY))
                .filter(|h| !h.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| LOCAL_DOCKER.to_string())
}

/// Connects to the Docker engine the settings name (rule 2): the image
/// builder of either kind, and lw-doctor's Docker checks.
pub fn connect_docker(config: Option<&Config>) -> Result<DockerEngine> {
    DockerEngine::connect_to(&docker_host(config))
}

/// The engines a command works with: a runner and the builder paired with
/// it.
#[allow(clippy::large_enum_variant, reason = "one per command, made once")]
pub enum Engines {
    /// Docker (or Podman's socket): runner and builder in one.
    Docker(DockerEngine),
    /// A cluster, paired with the Docker builder of the same settings.
    Kubernetes(KubeEngine, PairedBuilder),
}

impl Engines {
    /// Chooses and connects the runner as the settings say; the builder
    /// is the runner on Docker, and on Kubernetes the Docker engine of rule
    /// 2, connected on first use.
    pub fn connect(config: Option<&Config>) -> Result<Engines> {
        Ok(match EngineKind::of(config)? {
            EngineKind::Docker => Engines::Docker(connect_docker(config)?),
            EngineKind::Kubernetes => Engines::Kubernetes(
                KubeEngine::connect_for(config)?,
                PairedBuilder::new(docker_host(config)),
            ),
        })
    }

    pub fn kind(&self) -> EngineKind {
        match self {
            Engines::Docker(_) => EngineKind::Docker,
            Engines::Kubernetes(..) => EngineKind::Kubernetes,
        }
    }

    /// The sandbox runner.
    pub fn runner(&self) -> &dyn SandboxEngine {
        match self {
            Engines::Docker(d) => d,
            Engines::Kubernetes(k, _) => k,
        }
    }

    /// The image builder.
    pub fn builder(&self) -> &dyn ImageBuilder {
        match self {
            Engines::Docker(d) => d,
            Engines::Kubernetes(_, b) => b,
        }
    }

    /// The two, borrowed, as the library takes them.
    pub fn pair(&self) -> Pair<'_> {
        Pair {
            runner: self.runner(),
            builder: self.builder(),
            kind: self.kind(),
        }
    }
}

/// A runner and its builder, as the library takes them (lib/sandbox,
/// lib/service): chosen by [`Engines::connect`], or put together by a test.
#[derive(Clone, Copy)]
pub struct Pair<'a> {
    pub runner: &'a dyn SandboxEngine,
    pub builder: &'a dyn ImageBuilder,
    /// What the runner is.  On Kubernetes the builder's images are not the
    /// runner's: the nodes pull them from the image cache, or have them
    /// imported.
    pub kind: EngineKind,
}

impl<'a> Pair<'a> {
    /// One Docker engine as both.
    pub fn docker(engine: &'a DockerEngine) -> Pair<'a> {
        Pair {
            runner: engine,
            builder: engine,
            kind: EngineKind::Docker,
        }
    }
}

/// The Docker builder a Kubernetes runner is paired with, connected when
/// first asked.
pub struct PairedBuilder {
    host: String,
    engine: OnceLock<DockerEngine>,
}

impl PairedBuilder {
    /// The builder at `host` (a `DOCKER_HOST` address), not yet connected.
    pub fn new(host: String) -> PairedBuilder {
        PairedBuilder {
            host,
            engine: OnceLock::new(),
        }
    }

    /// The connected engine; a failure is the connection's error, saying
    /// why a cluster needs it.
    pub fn engine(&self) -> Result<&DockerEngine> {
        if let Some(e) = self.engine.get() {
            return Ok(e);
        }
        let e = DockerEngine::connect_to(&self.host).map_err(|e| {
            Error::new(
                e.exit,
                format!(
                    "{}; Kubernetes builds no images: they are built (or found) on this Docker engine (DOCKER_HOST, else engine.host), and a sandbox's can be named with --image",
                    e.msg
                ),
            )
        })?;
        Ok(self.engine.get_or_init(|| e))
    }
}

impl Images for PairedBuilder {
    fn image(&self, reference: &str) -> Result<Option<Image>> {
        self.engine()?.image(reference)
    }

    fn images_with_label(&self, label: &str) -> Result<Vec<Image>> {
        self.engine()?.images_with_label(label)
    }
}

impl ImageBuilder for PairedBuilder {
    fn tag(&self, image: &str, repo: &str, tag: &str) -> Result<()> {
        self.engine()?.tag(image, repo, tag)
    }

    fn remove_image(&self, reference: &str, force: bool) -> Result<()> {
        self.engine()?.remove_image(reference, force)
    }

    fn build(
        &self,
        req: &BuildRequest,
        on_event: &mut dyn FnMut(BuildEvent),
    ) -> Result<BuildOutcome> {
        self.engine()?.build(req, on_event)
    }

    fn save_images(&self, references: &[&str], out: &mut dyn std::io::Write) -> Result<u64> {
        self.engine()?.save_images(references, out)
    }

    fn load_images(&self, archive: std::fs::File) -> Result<Vec<String>> {
        self.engine()?.load_images(archive)
    }

    fn image_layers(&self, reference: &str) -> Result<Option<Vec<String>>> {
        self.engine()?.image_layers(reference)
    }
}

#[cfg(test)]
// std::env::set_var, unsafe since Rust 2024: these tests hold a lock while
// they change the environment.
#[allow(unsafe_code)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::parse_project(
            text,
            std::path::Path::new("/p/.loopwright/config"),
            base::config::Check::All(&[crate::config::KEYS]),
        )
        .unwrap()
    }

    // One test: it sets the process's environment.
    #[test]
    fn the_environment_wins_over_the_project_then_the_defaults() {
        let c = config("engine = kubernetes\nengine.host = unix:///run/podman/podman.sock\n");
        // SAFETY: the only test of this module touching these variables;
        // no other test of the crate reads them.
        unsafe {
            std::env::remove_var("LW_ENGINE");
            std::env::remove_var("DOCKER_HOST");
        }
        assert_eq!(EngineKind::of(Some(&c)).unwrap(), EngineKind::Kubernetes);
        assert_eq!(docker_host(Some(&c)), "unix:///run/podman/podman.sock");
        assert_eq!(EngineKind::of(None).unwrap(), EngineKind::Docker);
        assert_eq!(docker_host(None), LOCAL_DOCKER);
        unsafe {
            std::env::set_var("LW_ENGINE", "docker");
            std::env::set_var("DOCKER_HOST", "tcp://b:2376");
        }
        assert_eq!(EngineKind::of(Some(&c)).unwrap(), EngineKind::Docker);
        assert_eq!(docker_host(Some(&c)), "tcp://b:2376");
        unsafe {
            std::env::set_var("LW_ENGINE", "");
            std::env::set_var("DOCKER_HOST", "");
        }
        assert_eq!(EngineKind::of(Some(&c)).unwrap(), EngineKind::Kubernetes);
        assert_eq!(docker_host(Some(&c)), "unix:///run/podman/podman.sock");
        unsafe { std::env::set_var("LW_ENGINE", "lxc") };
        let e = EngineKind::of(Some(&c)).unwrap_err();
        assert!(e.msg.starts_with("LW_ENGINE is 'lxc'"), "{}", e.msg);
        unsafe {
            std::env::remove_var("LW_ENGINE");
            std::env::remove_var("DOCKER_HOST");
        }
    }
}
