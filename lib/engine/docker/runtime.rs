//! The engine's runtimes and product (Docker or Podman), and what Podman's
//! Docker-compatible socket needs that dockerd does not.
//!
//! Podman 4's compatible API gives a container without explicit `nofile`
//! and `nproc` limits its own defaults, which a host without
//! CAP_SYS_RESOURCE refuses ("error setting rlimit type 7"); on Podman a
//! container spec without them gets the host's own hard limits (capped),
//! which any process may keep.

use crate::engine::{EngineInfo, RuntimeInfo};
use crate::error::Result;

use super::DockerEngine;

/// Podman names its engine component this way in `/version`.
const PODMAN_COMPONENT: &str = "Podman Engine";

/// The ceiling of the limits given on Podman (Docker's own default).
const ULIMIT_CAP: u64 = 1 << 20;

impl DockerEngine {
    /// `/info` and `/version`, as the contract's [`EngineInfo`].
    pub(crate) fn engine_info(&self) -> Result<EngineInfo> {
        let v = self
            .block_on(self.client().version())
            .map_err(|e| self.err("cannot ask the engine its version", e))?;
        let podman = v
            .components
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|c| c.name == PODMAN_COMPONENT);
        let _ = self.podman.set(podman);
        let i = self
            .block_on(self.client().info())
            .map_err(|e| self.err("cannot ask the engine about itself", e))?;
        let mut runtimes: Vec<RuntimeInfo> = i
            .runtimes
            .unwrap_or_default()
            .into_iter()
            .map(|(name, r)| RuntimeInfo {
                name,
                path: r.path.unwrap_or_default(),
                args: r.runtime_args.unwrap_or_default(),
            })
            .collect();
        runtimes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(EngineInfo {
            host: self.host().to_string(),
            product: if podman { "podman" } else { "docker" }.into(),
            version: v.version.unwrap_or_default(),
            runtimes,
            default_runtime: i.default_runtime.unwrap_or_else(|| "runc".into()),
            security: i.security_options.unwrap_or_default(),
        })
    }

    /// True when the engine is Podman (asked once per connection).
    pub(crate) fn is_podman(&self) -> bool {
        if let Some(p) = self.podman.get() {
            return *p;
        }
        let p = self
            .block_on(self.client().version())
            .ok()
            .and_then(|v| v.components)
            .unwrap_or_default()
            .iter()
            .any(|c| c.name == PODMAN_COMPONENT);
        *self.podman.get_or_init(|| p)
    }

    /// The `nofile` and `nproc` limits a container spec lacks, on Podman:
    /// this host's hard limits, at most [`ULIMIT_CAP`].
    pub(crate) fn podman_ulimits(&self, have: &[(String, i64, i64)]) -> Vec<(String, i64, i64)> {
        if !self.host().starts_with("unix://") || !self.is_podman() {
            return Vec::new();
        }
        use rustix::process::{Resource, getrlimit};
        let mut out = Vec::new();
        for (name, res) in [("nofile", Resource::Nofile), ("nproc", Resource::Nproc)] {
            if have.iter().any(|(n, _, _)| n == name) {
                continue;
            }
            let hard = getrlimit(res).maximum.unwrap_or(ULIMIT_CAP).min(ULIMIT_CAP) as i64;
            out.push((name.to_string(), hard, hard));
        }
        out
    }
}
