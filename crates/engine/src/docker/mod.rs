//! The runtime contract (crates/engine/src/lib.rs) on the Docker Engine API, through
//! bollard: the only module that names it.
//!
//! [`DockerEngine`] keeps one client and a current-thread tokio runtime and
//! drives bollard on it, so its methods block like the contract says.
//! `DOCKER_HOST` chooses the engine, local or remote; the API version is
//! negotiated (bollard 0.21 speaks to dockerd 20.10, API 1.41).  It is both
//! a sandbox runner and an image builder.  The runner's base contract is
//! implemented here (the create body in `spec.rs`), the sandbox part in
//! `sandbox.rs` (volumes, labelled containers), exec in `exec.rs` (stdin, a
//! terminal, and the container's death raced against the stream) and
//! networks in `network.rs`; the builder in `image.rs`.

mod connect;
mod exec;
mod image;
mod network;
mod paths;
mod runtime;
mod sandbox;
mod spec;
mod ssh;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bollard::Docker;
use bollard::models::{ExecConfig, PortBinding};
use bollard::query_parameters as qp;

use crate::{
    Container, ContainerSpec, Engine, EngineVersion, ExecRequest, OutStream, PortMap, Refusal,
};
use base::error::{Error, Exit, Result};

/// The Docker Engine through bollard.
pub struct DockerEngine {
    rt: tokio::runtime::Runtime,
    docker: Docker,
    host: String,
    /// Whether the engine is Podman, once asked (crates/engine/src/docker/runtime.rs).
    podman: std::sync::OnceLock<bool>,
    /// Kept for the client's life: an ssh tunnel ends when this is dropped.
    _via: connect::Via,
}

/// The `.loopwright/config` key naming the engine when `DOCKER_HOST` does not.
pub const HOST_KEY: &str = "engine.host";

/// Builds can run apt-get for minutes; bollard's default of two minutes per
/// request would cut them off.
const BUILD_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

impl DockerEngine {
    /// Connects to the engine at `host` (`unix://PATH`, `tcp://HOST:PORT`,
    /// `ssh://[USER@]HOST`; TLS as `DOCKER_TLS_VERIFY` says) and agrees on
    /// an API version with it.  Which host is the settings' to say
    /// (`DOCKER_HOST`, else `engine.host`): a command and a test connect
    /// through `select::connect_docker` or `Engines::connect`, so none
    /// passes the project's `engine.host` by.
    pub fn connect_to(host: &str) -> Result<DockerEngine> {
        let host = host.to_string();
        let rt = crate::io_runtime()?;
        let (docker, via) = connect::client(&host)?;
        let docker = rt
            .block_on(docker.negotiate_version())
            .map_err(|e| connect::first_request_err(&host, via.tls(), &e))?;
        Ok(DockerEngine {
            rt,
            docker,
            host,
            podman: std::sync::OnceLock::new(),
            _via: via,
        })
    }

    /// The engine's address, as `DOCKER_HOST` would write it.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// An engine error as the house exit statuses say (404 is 66, 409 is 73,
    /// a lost connection says how to start the engine, the rest is 69).
    pub(crate) fn err(&self, what: &str, e: bollard::errors::Error) -> Error {
        api_err(&self.host, what, e)
    }

    /// The bollard client, for the engine extensions beside the commands
    /// that need them (sandbox.rs, network.rs), so
    /// that one connection and one runtime serve every trait.
    pub(crate) fn client(&self) -> &Docker {
        &self.docker
    }

    /// Drives `f` to completion on the engine's current-thread runtime.
    pub(crate) fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }
}

/// An exec of `req` with its output attached (stdin and a terminal are the
/// caller's to add).
fn exec_config(req: &ExecRequest) -> ExecConfig {
    ExecConfig {
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        cmd: Some(req.cmd.clone()),
        env: if req.env.is_empty() {
            None
        } else {
            Some(req.env.clone())
        },
        user: req.user.clone(),
        working_dir: req.workdir.clone(),
        ..Default::default()
    }
}

fn unreachable_err(host: &str, e: &bollard::errors::Error) -> Error {
    if host.contains("podman") {
        return Error::new(
            Exit::Unavailable,
            format!(
                "cannot reach the Podman socket at {host}: {e}; start it (podman system service \
                 --time=0 {host}, or systemctl start podman.socket) or point DOCKER_HOST at a \
                 running engine"
            ),
        );
    }
    if host.starts_with("ssh://") {
        // The tunnel is up (ssh.rs says so otherwise): the far socket is not.
        return Error::new(
            Exit::Unavailable,
            format!(
                "cannot reach the Docker engine at {host}: {e}; ssh logged in, but no engine \
                 answers on its socket there: start dockerd on that host (with its unix socket), \
                 or name the socket it listens on (ssh://USER@HOST/PATH)"
            ),
        );
    }
    if host.starts_with("tcp://") {
        // Another machine's engine: this host can neither start nor see it.
        return Error::new(
            Exit::Unavailable,
            format!(
                "cannot reach the Docker engine at {host}: {e}; start the engine on that host \
                 (dockerd --host tcp://0.0.0.0:2376 --tlsverify ...), check that this host \
                 reaches it, or point DOCKER_HOST at a running engine"
            ),
        );
    }
    Error::new(
        Exit::Unavailable,
        format!(
            "cannot reach the Docker engine at {host}: {e}; start it (sudo systemctl start docker, \
             or run dockerd; for Podman: podman system service --time=0 unix://PATH) or point \
             DOCKER_HOST at a running engine"
        ),
    )
}

pub(crate) fn status_of(e: &bollard::errors::Error) -> Option<u16> {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

pub(crate) fn api_err(host: &str, what: &str, e: bollard::errors::Error) -> Error {
    use bollard::errors::Error as B;
    match &e {
        B::DockerResponseServerError {
            status_code,
            message,
        } => {
            let exit = match status_code {
                404 => Exit::NoInput,
                409 => Exit::CantCreat,
                _ => Exit::Unavailable,
            };
            match Refusal::in_message(message) {
                Some(r) => Error::new(exit, what).with_source(r),
                None => Error::new(exit, format!("{what}: {message}")),
            }
        }
        B::SocketNotFoundError(_)
        | B::HyperLegacyError { .. }
        | B::IOError { .. }
        | B::RequestTimeoutError => unreachable_err(host, &e),
        _ => Error::new(Exit::Unavailable, format!("{what}: {e}")),
    }
}

pub(crate) fn labels_of(map: Option<HashMap<String, String>>) -> BTreeMap<String, String> {
    map.unwrap_or_default().into_iter().collect()
}

fn ports_of(map: Option<HashMap<String, Option<Vec<PortBinding>>>>) -> Vec<PortMap> {
    let mut out = Vec::new();
    for (container, bindings) in map.unwrap_or_default() {
        for b in bindings.unwrap_or_default() {
            let host_port = b
                .host_port
                .as_deref()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            out.push(PortMap {
                container: container.clone(),
                host_ip: b.host_ip.unwrap_or_default(),
                host_port,
            });
        }
    }
    out.sort_by(|a, b| (&a.container, a.host_port).cmp(&(&b.container, b.host_port)));
    out
}

impl Engine for DockerEngine {
    fn version(&self) -> Result<EngineVersion> {
        let v = self
            .rt
            .block_on(self.docker.version())
            .map_err(|e| self.err("cannot ask the engine its version", e))?;
        let c = self.docker.client_version();
        Ok(EngineVersion {
            version: v.version.unwrap_or_default(),
            api: format!("{}.{}", c.major_version, c.minor_version),
        })
    }

    fn create(&self, spec: &ContainerSpec) -> Result<String> {
        let body = self.create_body(spec)?;
        let opts = spec.name.as_ref().map(|n| qp::CreateContainerOptions {
            name: Some(n.clone()),
            ..Default::default()
        });
        let what = format!(
            "cannot create container '{}'",
            spec.name.as_deref().unwrap_or(&spec.image)
        );
        let r = self
            .rt
            .block_on(self.docker.create_container(opts, body))
            .map_err(|e| self.err(&what, e))?;
        Ok(r.id)
    }

    fn start(&self, container: &str) -> Result<()> {
        self.rt
            .block_on(
                self.docker
                    .start_container(container, None::<qp::StartContainerOptions>),
            )
            .map_err(|e| self.err(&format!("cannot start container '{container}'"), e))
    }

    fn stop(&self, container: &str, timeout: Duration) -> Result<()> {
        let opts = qp::StopContainerOptions {
            t: Some(timeout.as_secs() as i32),
            signal: None,
        };
        match self
            .rt
            .block_on(self.docker.stop_container(container, Some(opts)))
        {
            Ok(()) => Ok(()),
            // 304: already stopped.
            Err(e) if status_of(&e) == Some(304) => Ok(()),
            Err(e) => Err(self.err(&format!("cannot stop container '{container}'"), e)),
        }
    }

    fn remove(&self, container: &str, force: bool) -> Result<()> {
        let opts = qp::RemoveContainerOptions {
            force,
            v: true,
            link: false,
        };
        match self
            .rt
            .block_on(self.docker.remove_container(container, Some(opts)))
        {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(self.err(&format!("cannot remove container '{container}'"), e)),
        }
    }

    fn wait_exit(&self, container: &str, timeout: Duration) -> Result<Option<bool>> {
        // The engine answers when the container next exits: a docker kill or
        // stop, a crash (then it may be `restarting`), or its removal (404).
        let opts = qp::WaitContainerOptions {
            condition: "next-exit".into(),
        };
        let docker = self
            .docker
            .clone()
            .with_timeout(timeout + Duration::from_secs(5));
        let answer = self.rt.block_on(async {
            tokio::time::timeout(
                timeout,
                futures_util::StreamExt::next(&mut docker.wait_container(container, Some(opts))),
            )
            .await
        });
        Ok(Some(answer.is_ok()))
    }

    fn inspect(&self, name_or_id: &str) -> Result<Option<Container>> {
        match self.rt.block_on(
            self.docker
                .inspect_container(name_or_id, None::<qp::InspectContainerOptions>),
        ) {
            Ok(c) => {
                let state = c.state.unwrap_or_default();
                Ok(Some(Container {
                    id: c.id.unwrap_or_default(),
                    name: c
                        .name
                        .unwrap_or_default()
                        .trim_start_matches('/')
                        .to_string(),
                    image: c.image.unwrap_or_default(),
                    running: state.running.unwrap_or(false),
                    status: state.status.map(|s| s.to_string()).unwrap_or_default(),
                    exit_code: state.exit_code,
                    oom_killed: state.oom_killed.unwrap_or(false),
                    labels: labels_of(c.config.and_then(|c| c.labels)),
                    ports: ports_of(c.network_settings.and_then(|n| n.ports)),
                    runtime: c.host_config.and_then(|h| h.runtime).unwrap_or_default(),
                }))
            }
            Err(e) if status_of(&e) == Some(404) => Ok(None),
            Err(e) => Err(self.err(&format!("cannot inspect container '{name_or_id}'"), e)),
        }
    }

    fn exec(
        &self,
        container: &str,
        req: &ExecRequest,
        on_output: &mut dyn FnMut(OutStream, &[u8]),
    ) -> Result<i64> {
        let io = crate::ExecIo::output(on_output);
        self.exec_attached(container, req, io)
    }

    fn info(&self) -> Result<crate::EngineInfo> {
        self.engine_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_engine_says_how_to_start_it() {
        let e = unreachable_err(
            "unix:///nonexistent.sock",
            &bollard::errors::Error::RequestTimeoutError,
        );
        assert_eq!(e.exit, Exit::Unavailable);
        assert!(e.msg.contains("unix:///nonexistent.sock"), "{}", e.msg);
        assert!(e.msg.contains("systemctl start docker"), "{}", e.msg);
    }

    #[test]
    fn not_found_is_no_input_and_conflict_is_cant_create() {
        let nf = bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            message: "no such image".into(),
        };
        assert_eq!(api_err("h", "x", nf).exit, Exit::NoInput);
        let c = bollard::errors::Error::DockerResponseServerError {
            status_code: 409,
            message: "name in use".into(),
        };
        assert_eq!(api_err("h", "x", c).exit, Exit::CantCreat);
    }

    #[test]
    fn a_port_held_by_something_else_is_a_typed_refusal_worded_as_the_engine_said() {
        for message in [
            "driver failed programming external connectivity on endpoint c: Bind for 127.0.0.1:8080 failed: port is already allocated",
            "driver failed programming external connectivity on endpoint c: Error starting userland proxy: listen tcp4 127.0.0.1:8080: bind: address already in use",
        ] {
            let e = api_err(
                "h",
                "cannot start container 'c'",
                bollard::errors::Error::DockerResponseServerError {
                    status_code: 500,
                    message: message.into(),
                },
            );
            assert_eq!(e.exit, Exit::Unavailable);
            assert_eq!(Refusal::of(&e), Some(&Refusal::PortTaken(message.into())));
            assert_eq!(
                e.to_string(),
                format!("cannot start container 'c': {message}")
            );
        }
        let other = api_err(
            "h",
            "x",
            bollard::errors::Error::DockerResponseServerError {
                status_code: 500,
                message: "no space left on device".into(),
            },
        );
        assert_eq!(Refusal::of(&other), None);
    }
}
