//! A [`ContainerSpec`] as a Pod: the hardened floor and what the spec
//! asks (the module's documentation in mod.rs says which is which).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container as KContainer, EmptyDirVolumeSource, EnvVar, ExecAction, HostAlias,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, Sysctl, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{LABELS_ANNOTATION, MAIN, NET_PREFIX, check_name, object_labels, valid_label_key};
use crate::ContainerSpec;
use base::error::{Error, Exit, Result};

/// Sysctls the kubelet allows without node configuration.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// `uid[:gid]`, numeric (a pod has no /etc/passwd to look names up in).
fn user_of(user: &str) -> Result<(i64, Option<i64>)> {
    let bad = || {
        Error::usage(format!(
            "user '{user}': a pod's user must be numeric (uid or uid:gid)"
        ))
    };
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let uid: i64 = u.parse().map_err(|_| bad())?;
    let gid = match g {
        Some(g) => Some(g.parse().map_err(|_| bad())?),
        None => None,
    };
    if uid == 0 {
        return Err(Error::new(
            Exit::NoPerm,
            format!("user '{user}': pods run as non-root on Kubernetes (runAsNonRoot)"),
        ));
    }
    Ok((uid, gid))
}

/// Docker's tmpfs size (`64m`, `1g`, bytes) as a quantity.
fn size_quantity(s: &str) -> Option<Quantity> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&s[..i], s[i..].to_ascii_lowercase()),
        None => (s, String::new()),
    };
    let _: u64 = num.parse().ok()?;
    let suffix = match unit.as_str() {
        "" | "b" => "",
        "k" | "kb" => "Ki",
        "m" | "mb" => "Mi",
        "g" | "gb" => "Gi",
        _ => return None,
    };
    Some(Quantity(format!("{num}{suffix}")))
}

/// The pod volume `name` for the PersistentVolumeClaim `claim`, and its
/// mount at `target`.
fn claim_mount(name: String, claim: &str, target: &str, read_only: bool) -> (Volume, VolumeMount) {
    let volume = Volume {
        name: name.clone(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.to_string(),
            read_only: Some(read_only),
        }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name,
        mount_path: target.to_string(),
        read_only: Some(read_only),
        ..Default::default()
    };
    (volume, mount)
}

/// The `.loopwright/config` key of a pod's CPU request.
pub(crate) const CPU_REQUEST_KEY: &str = "kube.cpu-request";

/// A number of CPUs (`0.05`, `2`) in millicores; `None` unless above 0.
pub(crate) fn millicores(v: &str) -> Option<u64> {
    let n: f64 = v.trim().parse().ok()?;
    (n.is_finite() && n > 0.0 && n < 1e6).then(|| ((n * 1000.0).round() as u64).max(1))
}

/// The pod `spec` describes, with `runtime_class` (already resolved) and
/// a CPU request of `cpu_request` millicores below its limit (`None`: the
/// limit, as Kubernetes defaults it); a request above the limit is 78.
pub(crate) fn pod_of(
    spec: &ContainerSpec,
    runtime_class: Option<String>,
    cpu_request: Option<u64>,
) -> Result<Pod> {
    if let (Some(req), Some(n)) = (cpu_request, spec.nano_cpus) {
        let limit = (n / 1_000_000).max(1) as u64;
        if req > limit {
            return Err(Error::config(format!(
                "{CPU_REQUEST_KEY} ({req}m) is above the sandbox's CPU limit ({limit}m, sandbox.cpus or --cpus): lower it or raise the limit"
            )));
        }
    }
    if let Some(n) = &spec.name {
        check_name("pod", n)?;
    }
    if !spec.ports.is_empty() {
        return Err(Error::new(
            Exit::Unavailable,
            "publishing ports is not built for Kubernetes (a Service would carry them); create the sandbox without --port",
        ));
    }
    let (volumes, mounts) = volumes_of(spec)?;
    let (uid, gid) = match spec.user.as_deref() {
        Some(u) => {
            let (u, g) = user_of(u)?;
            (Some(u), g)
        }
        None => (None, None),
    };
    let annotations = BTreeMap::from([(
        LABELS_ANNOTATION.to_string(),
        serde_json::to_string(&spec.labels).unwrap_or_default(),
    )]);
    Ok(Pod {
        metadata: ObjectMeta {
            name: spec.name.clone(),
            generate_name: spec.name.is_none().then(|| "lw-".to_string()),
            labels: Some(pod_labels(spec)?),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![main_container(spec, mounts, cpu_request)],
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            restart_policy: Some("Never".into()),
            runtime_class_name: runtime_class,
            termination_grace_period_seconds: Some(10),
            security_context: Some(pod_security(spec, uid, gid)),
            volumes: (!volumes.is_empty()).then_some(volumes),
            host_aliases: host_aliases(&spec.hosts),
            ..Default::default()
        }),
        status: None,
    })
}

/// The pod's volumes and the main container's mounts: each named volume
/// (and each bind naming one) a claim, each tmpfs an `emptyDir` in memory.
/// A bind of a host path is refused.
fn volumes_of(spec: &ContainerSpec) -> Result<(Vec<Volume>, Vec<VolumeMount>)> {
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    for (i, b) in spec.binds.iter().enumerate() {
        if b.source.starts_with('/') {
            return Err(Error::new(
                Exit::Unavailable,
                format!(
                    "cannot mount '{}' into a pod: a Kubernetes cluster does not see this host's files (named volumes, which are PersistentVolumeClaims, do work)",
                    b.source
                ),
            ));
        }
        check_name("volume", &b.source)?;
        let (v, m) = claim_mount(format!("vol{i}"), &b.source, &b.target, b.read_only);
        volumes.push(v);
        mounts.push(m);
    }
    for (i, v) in spec.volumes.iter().enumerate() {
        check_name("volume", &v.volume)?;
        let (v, m) = claim_mount(format!("named{i}"), &v.volume, &v.target, v.read_only);
        volumes.push(v);
        mounts.push(m);
    }
    for (i, (target, opts)) in spec.tmpfs.iter().enumerate() {
        let size = opts
            .split(',')
            .find_map(|o| o.strip_prefix("size="))
            .and_then(size_quantity);
        let vname = format!("tmp{i}");
        volumes.push(Volume {
            name: vname.clone(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: size,
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: vname,
            mount_path: target.clone(),
            ..Default::default()
        });
    }
    Ok((volumes, mounts))
}

/// The pod's labels: the spec's valid ones, ours, and one per network
/// (`net.loopwright.org/N=1`, what a NetworkPolicy selects).
fn pod_labels(spec: &ContainerSpec) -> Result<BTreeMap<String, String>> {
    let mut labels = object_labels(&spec.labels);
    match spec.network.as_deref() {
        None | Some("none") | Some("") => {}
        Some(n) => {
            let key = format!("{NET_PREFIX}{n}");
            if !valid_label_key(&key) {
                return Err(Error::usage(format!(
                    "network name '{n}' cannot be a Kubernetes label (at most 63 letters, digits, '-', '_' and '.')"
                )));
            }
            labels.insert(key, "1".into());
        }
    }
    Ok(labels)
}

/// The memory and CPU limits (a pod's requests default to them).
fn limits_of(spec: &ContainerSpec) -> BTreeMap<String, Quantity> {
    let mut limits = BTreeMap::new();
    if let Some(m) = spec.memory_bytes {
        limits.insert("memory".to_string(), Quantity(m.to_string()));
    }
    if let Some(n) = spec.nano_cpus {
        limits.insert(
            "cpu".to_string(),
            Quantity(format!("{}m", (n / 1_000_000).max(1))),
        );
    }
    limits
}

/// Docker's entrypoint and command as a container's `command` and `args`.
fn command_of(spec: &ContainerSpec) -> (Option<Vec<String>>, Option<Vec<String>>) {
    let cmd = (!spec.cmd.is_empty()).then(|| spec.cmd.clone());
    match &spec.entrypoint {
        Some(e) if e.is_empty() => (cmd, None),
        Some(e) => (Some(e.clone()), cmd),
        None => (None, cmd),
    }
}

/// `KEY=VALUE` lines as the container's variables.
fn env_of(spec: &ContainerSpec) -> Vec<EnvVar> {
    spec.env
        .iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), ""));
            EnvVar {
                name: k.to_string(),
                value: Some(v.to_string()),
                ..Default::default()
            }
        })
        .collect()
}

/// The pod's one container, [`MAIN`]: no privilege, every capability
/// dropped, the spec's command, limits and mounts, its health check as a
/// readiness probe.
fn main_container(
    spec: &ContainerSpec,
    mounts: Vec<VolumeMount>,
    cpu_request: Option<u64>,
) -> KContainer {
    let (command, args) = command_of(spec);
    let env = env_of(spec);
    let limits = limits_of(spec);
    let requests = cpu_request
        .filter(|_| limits.contains_key("cpu"))
        .map(|m| BTreeMap::from([("cpu".to_string(), Quantity(format!("{m}m")))]));
    KContainer {
        name: MAIN.into(),
        image: Some(spec.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        command,
        args,
        env: (!env.is_empty()).then_some(env),
        working_dir: spec.workdir.clone(),
        tty: Some(spec.tty),
        stdin: Some(spec.open_stdin),
        security_context: Some(SecurityContext {
            read_only_root_filesystem: Some(spec.read_only_root),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..Default::default()
        }),
        resources: (!limits.is_empty()).then(|| ResourceRequirements {
            limits: Some(limits),
            requests,
            ..Default::default()
        }),
        volume_mounts: (!mounts.is_empty()).then_some(mounts),
        readiness_probe: spec.healthcheck.as_ref().map(|(cmd, every)| Probe {
            exec: Some(ExecAction {
                command: Some(cmd.clone()),
            }),
            period_seconds: Some(every.as_secs().clamp(1, 3600) as i32),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod's security: non-root as `uid`/`gid`, its volumes the user's
/// (`fsGroup`), seccomp `RuntimeDefault`, the safe sysctls of the spec.
fn pod_security(spec: &ContainerSpec, uid: Option<i64>, gid: Option<i64>) -> PodSecurityContext {
    let sysctls: Vec<Sysctl> = spec
        .sysctls
        .iter()
        .filter(|(k, _)| SAFE_SYSCTLS.contains(&k.as_str()))
        .map(|(k, v)| Sysctl {
            name: k.clone(),
            value: v.clone(),
        })
        .collect();
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: uid,
        run_as_group: gid,
        // The volumes are the user's to write (a claim's storage
        // applies it; the test cluster's provisioner makes them as
        // the sandbox's user, scripts/k8s-cluster): nothing in a pod
        // runs as root to give them away.
        fs_group: gid.or(uid),
        fs_group_change_policy: uid.map(|_| "OnRootMismatch".into()),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        sysctls: (!sysctls.is_empty()).then_some(sysctls),
        ..Default::default()
    }
}

/// `name -> address` as the kubelet writes them into /etc/hosts: one
/// alias per address, naming each of its names.
fn host_aliases(hosts: &BTreeMap<String, String>) -> Option<Vec<HostAlias>> {
    let mut by_ip: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (name, ip) in hosts {
        by_ip.entry(ip).or_default().push(name.clone());
    }
    (!by_ip.is_empty()).then(|| {
        by_ip
            .into_iter()
            .map(|(ip, names)| HostAlias {
                hostnames: Some(names),
                ip: ip.to_string(),
            })
            .collect()
    })
}
