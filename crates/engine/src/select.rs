//! Which engine a project's commands talk to: `engine` in
//! `.loopwright/config` (`docker`, the default, or `kubernetes`), else
//! `LW_ENGINE` in the environment, so the same commands work on either.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::{DockerEngine, KubeEngine, SandboxEngine};

/// The `.loopwright/config` key naming the engine.
pub const ENGINE_KEY: &str = "engine";

/// The engines there are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Docker,
    Kubernetes,
}

impl EngineKind {
    /// `LW_ENGINE`, else the project's `engine`, else Docker; an unknown
    /// name is 78 naming the two.
    pub fn of(config: Option<&Config>) -> Result<EngineKind> {
        let env = std::env::var("LW_ENGINE").ok().filter(|v| !v.is_empty());
        let (name, from) = match env {
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

/// Connects to the engine the project chooses.
pub fn connect_sandbox_engine(config: Option<&Config>) -> Result<Box<dyn SandboxEngine>> {
    Ok(match EngineKind::of(config)? {
        EngineKind::Docker => Box::new(DockerEngine::connect_for(config)?),
        EngineKind::Kubernetes => Box::new(KubeEngine::connect_for(config)?),
    })
}
