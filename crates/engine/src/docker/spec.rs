//! A [`ContainerSpec`] as the Engine API's create body: the container's
//! own settings, and its host settings (limits, mounts, ports, hardening,
//! with what Podman needs beside them, runtime.rs).

use std::collections::{BTreeMap, HashMap};

use bollard::models::{
    ContainerCreateBody, HealthConfig, HostConfig, HostConfigLogConfig, PortBinding,
    ResourcesUlimits, RestartPolicy, RestartPolicyNameEnum,
};

use super::DockerEngine;
use crate::ContainerSpec;
use base::error::Result;

fn opt_vec(v: &[String]) -> Option<Vec<String>> {
    if v.is_empty() { None } else { Some(v.to_vec()) }
}

/// Container port to the host addresses and ports it is published on.
fn port_bindings(spec: &ContainerSpec) -> Option<HashMap<String, Option<Vec<PortBinding>>>> {
    let mut by_port: BTreeMap<String, Vec<PortBinding>> = BTreeMap::new();
    for p in &spec.ports {
        by_port
            .entry(p.container.clone())
            .or_default()
            .push(PortBinding {
                host_ip: Some(p.host_ip.clone()),
                host_port: Some(p.host_port.to_string()),
            });
    }
    (!by_port.is_empty()).then(|| by_port.into_iter().map(|(k, v)| (k, Some(v))).collect())
}

/// The binds, then the named volumes (a named volume is a bind whose
/// source is its name).
fn binds(spec: &ContainerSpec) -> Option<Vec<String>> {
    let mode = |ro: bool| if ro { "ro" } else { "rw" };
    opt_vec(
        &spec
            .binds
            .iter()
            .map(|b| format!("{}:{}:{}", b.source, b.target, mode(b.read_only)))
            .chain(
                spec.volumes
                    .iter()
                    .map(|v| format!("{}:{}:{}", v.volume, v.target, mode(v.read_only))),
            )
            .collect::<Vec<_>>(),
    )
}

fn health(test: &[String], every: std::time::Duration) -> HealthConfig {
    HealthConfig {
        test: Some(
            std::iter::once("CMD".to_string())
                .chain(test.iter().cloned())
                .collect(),
        ),
        interval: Some(every.as_nanos() as i64),
        timeout: Some(10_000_000_000),
        retries: Some(3),
        ..Default::default()
    }
}

impl DockerEngine {
    /// The create request for `spec`.
    pub(super) fn create_body(&self, spec: &ContainerSpec) -> Result<ContainerCreateBody> {
        let exposed: Vec<String> = spec.ports.iter().map(|p| p.container.clone()).collect();
        Ok(ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: opt_vec(&spec.cmd),
            entrypoint: spec.entrypoint.clone(),
            env: opt_vec(&spec.env),
            user: spec.user.clone(),
            working_dir: spec.workdir.clone(),
            labels: Some(spec.labels.clone().into_iter().collect()),
            exposed_ports: opt_vec(&exposed),
            tty: Some(spec.tty),
            open_stdin: Some(spec.open_stdin),
            healthcheck: spec
                .healthcheck
                .as_ref()
                .map(|(test, every)| health(test, *every)),
            host_config: Some(self.host_config(spec)?),
            ..Default::default()
        })
    }

    /// The host side of `spec`: limits, mounts, network, ports, hardening.
    fn host_config(&self, spec: &ContainerSpec) -> Result<HostConfig> {
        let mut ulimits = spec.ulimits.clone();
        ulimits.extend(self.podman_ulimits(&spec.ulimits));
        Ok(HostConfig {
            readonly_rootfs: Some(spec.read_only_root),
            cap_drop: opt_vec(&spec.cap_drop),
            security_opt: opt_vec(&self.engine_security_opt(&spec.security_opt)?),
            pids_limit: spec.pids_limit,
            memory: spec.memory_bytes,
            tmpfs: if spec.tmpfs.is_empty() {
                None
            } else {
                Some(self.engine_tmpfs(&spec.tmpfs, spec.user.as_deref())?)
            },
            binds: binds(spec),
            network_mode: spec.network.clone(),
            nano_cpus: spec.nano_cpus,
            cpu_shares: spec.cpu_shares,
            runtime: spec.runtime.clone(),
            ulimits: (!ulimits.is_empty()).then(|| {
                ulimits
                    .iter()
                    .map(|(name, soft, hard)| ResourcesUlimits {
                        name: Some(name.clone()),
                        soft: Some(*soft),
                        hard: Some(*hard),
                    })
                    .collect()
            }),
            log_config: (!spec.log_options.is_empty()).then(|| HostConfigLogConfig {
                typ: Some("json-file".into()),
                config: Some(spec.log_options.clone().into_iter().collect()),
            }),
            sysctls: (!spec.sysctls.is_empty()).then(|| spec.sysctls.clone().into_iter().collect()),
            extra_hosts: (!spec.hosts.is_empty())
                .then(|| spec.hosts.iter().map(|(n, a)| format!("{n}:{a}")).collect()),
            port_bindings: port_bindings(spec),
            restart_policy: spec.restart_on_failure.then_some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::ON_FAILURE),
                maximum_retry_count: None,
            }),
            ..Default::default()
        })
    }
}
