//! A [`ContainerSpec`] as a Pod, and a Pod as a [`Container`]: pure
//! conversions, tested without a cluster.
//!
//! Every pod gets the hardened floor whatever the spec asks: it runs as
//! non-root (`runAsNonRoot`; a spec naming root is refused), with every
//! capability dropped, no privilege escalation, seccomp `RuntimeDefault`
//! (a Docker-style inline profile cannot be given to a kubelet, which
//! takes profiles by file on the node), no service-account token and no
//! service links; `restartPolicy: Never`, as a container is not restarted
//! either.  From the spec: the read-only root, the memory and CPU limits
//! (requests default to them), tmpfs as `emptyDir` in memory with its size,
//! named volumes as PersistentVolumeClaims (writable to the pod's user
//! through `fsGroup`, its group or uid), the runtime as
//! `runtimeClassName`, sysctls the kubelet counts as safe, a health check as
//! a readiness probe.  Not expressible per pod and so left out: the pids
//! limit (the kubelet's `podPidsLimit` is per node), ulimits, the CPU
//! weight, log options.  Refused: host paths (the cluster does not see this
//! host's files) and published ports (a Service would be the way; not built).
//!
//! Labels: Kubernetes allows label values of at most 63 characters of
//! `[A-Za-z0-9._-]`; the spec's labels are all kept in the annotation
//! [`LABELS_ANNOTATION`] (read back as the container's labels) and those
//! that are valid are also labels, so `containers_with_label` can select on
//! them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, Container as KContainer, EmptyDirVolumeSource, EnvVar, ExecAction,
    HostAlias, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, Sysctl, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::error::{Error, Exit, Result};
use crate::{Container, ContainerSpec};

/// The one container of a pod.
pub const MAIN: &str = "main";
/// The label every object this engine makes carries.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "loopwright";
/// A pod on network `N` carries the label `net.loopwright.org/N=1`.
pub const NET_PREFIX: &str = "net.loopwright.org/";
/// The spec's labels, whole, as JSON.
pub const LABELS_ANNOTATION: &str = "loopwright.org/labels";
/// A ConfigMap holding a stopped pod's manifest carries this label.
pub const STOPPED_LABEL: &str = "loopwright.org/stopped-pod";
const STOPPED_KEY: &str = "pod.json";

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

/// A label value Kubernetes accepts.
pub fn valid_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && v.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
}

/// A label key Kubernetes accepts: `[prefix/]name`, the name a valid
/// non-empty value, the prefix a DNS subdomain.
pub fn valid_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    !name.is_empty()
        && valid_label_value(name)
        && prefix.is_none_or(|p| {
            !p.is_empty() && p.len() <= 253 && p.split('.').all(|part| dns_label(part, 63))
        })
}

/// A DNS label: lower-case alphanumerics and `-`, not at either end.
fn dns_label(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A valid object name (a DNS subdomain).
pub fn check_name(kind: &str, name: &str) -> Result<()> {
    if name.len() <= 253 && name.split('.').all(|p| dns_label(p, 63)) {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "{kind} name '{name}' is not a Kubernetes object name (lower-case letters, digits, '-' and '.', at most 253 characters)"
        )))
    }
}

/// A contract label filter (`key` or `key=value`) as a label selector.
pub fn selector(label: &str) -> Result<String> {
    let (k, v) = match label.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (label, None),
    };
    if !valid_label_key(k) || v.is_some_and(|v| !valid_label_value(v)) {
        return Err(Error::data(format!(
            "label '{label}' cannot be selected on Kubernetes (keys are [prefix/]name, values at most 63 characters of letters, digits, '-', '_' and '.')"
        )));
    }
    Ok(label.to_string())
}

/// The labels an object of ours carries: the valid ones of `labels`, and
/// [`MANAGED_BY`].
pub fn object_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = labels
        .iter()
        .filter(|(k, v)| valid_label_key(k) && valid_label_value(v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.insert(MANAGED_BY.into(), MANAGED_BY_VALUE.into());
    out
}

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

/// The pod `spec` describes, with `runtime_class` (already resolved).
pub fn pod_of(spec: &ContainerSpec, runtime_class: Option<String>) -> Result<Pod> {
    if let Some(n) = &spec.name {
        check_name("pod", n)?;
    }
    if !spec.ports.is_empty() {
        return Err(Error::new(
            Exit::Unavailable,
            "publishing ports is not built for Kubernetes (a Service would carry them); create the sandbox without --port",
        ));
    }
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
    let (uid, gid) = match spec.user.as_deref() {
        Some(u) => {
            let (u, g) = user_of(u)?;
            (Some(u), g)
        }
        None => (None, None),
    };
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
    let sysctls: Vec<Sysctl> = spec
        .sysctls
        .iter()
        .filter(|(k, _)| SAFE_SYSCTLS.contains(&k.as_str()))
        .map(|(k, v)| Sysctl {
            name: k.clone(),
            value: v.clone(),
        })
        .collect();
    let (command, args) = match &spec.entrypoint {
        Some(e) if e.is_empty() => ((!spec.cmd.is_empty()).then(|| spec.cmd.clone()), None),
        Some(e) => (
            Some(e.clone()),
            (!spec.cmd.is_empty()).then(|| spec.cmd.clone()),
        ),
        None => (None, (!spec.cmd.is_empty()).then(|| spec.cmd.clone())),
    };
    let env: Vec<EnvVar> = spec
        .env
        .iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), ""));
            EnvVar {
                name: k.to_string(),
                value: Some(v.to_string()),
                ..Default::default()
            }
        })
        .collect();
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
    let annotations = BTreeMap::from([(
        LABELS_ANNOTATION.to_string(),
        serde_json::to_string(&spec.labels).unwrap_or_default(),
    )]);
    let container = KContainer {
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
    };
    Ok(Pod {
        metadata: ObjectMeta {
            name: spec.name.clone(),
            generate_name: spec.name.is_none().then(|| "lw-".to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            restart_policy: Some("Never".into()),
            runtime_class_name: runtime_class,
            termination_grace_period_seconds: Some(10),
            security_context: Some(PodSecurityContext {
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
            }),
            volumes: (!volumes.is_empty()).then_some(volumes),
            host_aliases: host_aliases(&spec.hosts),
            ..Default::default()
        }),
        status: None,
    })
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

fn main_status(p: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == MAIN)
}

/// Waiting reasons that will not pass by waiting.
const STUCK: &[&str] = &[
    "ErrImageNeverPull",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
];

/// Whether a pod's start is decided: `Ok` when its container runs, `Err`
/// with the reason when it never will; `None` while it may still.
pub fn start_outcome(p: &Pod) -> Option<std::result::Result<(), String>> {
    let phase = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    if p.metadata.deletion_timestamp.is_some() {
        return Some(Err("it is being deleted".into()));
    }
    let st = main_status(p);
    if let Some(state) = st.and_then(|c| c.state.as_ref()) {
        if state.running.is_some() && phase == "Running" {
            return Some(Ok(()));
        }
        if let Some(w) = &state.waiting {
            let reason = w.reason.as_deref().unwrap_or("");
            if STUCK.contains(&reason) {
                return Some(Err(format!(
                    "{reason}: {}{}",
                    w.message.as_deref().unwrap_or(""),
                    if reason == "ErrImageNeverPull" || reason.contains("Pull") {
                        "; import the image into the node's runtime (docker save IMAGE | ctr -n k8s.io images import -) or push it where the cluster pulls from (lw-build push, with build.cache): the nodes must reach that registry and trust its CA, and 'docker login HOST' gives lw-sandbox the credentials it passes them as a pull secret"
                    } else {
                        ""
                    }
                )));
            }
        }
        if let Some(t) = &state.terminated {
            return Some(Err(format!(
                "its container ended with status {} ({})",
                t.exit_code,
                t.reason.as_deref().or(t.message.as_deref()).unwrap_or("")
            )));
        }
    }
    if phase == "Failed" || phase == "Succeeded" {
        let s = p.status.as_ref();
        return Some(Err(format!(
            "the pod {} ({})",
            phase.to_lowercase(),
            s.and_then(|s| s.reason.as_deref().or(s.message.as_deref()))
                .unwrap_or("")
        )));
    }
    for c in p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
    {
        // Claims not bound yet are a provisioner at work, and one "not
        // found" just made is the scheduler's cache behind (either way
        // the start's timeout says when it lasts), not a pod no node can
        // take.
        let claims_pending = |m: &str| {
            m.contains("unbound immediate PersistentVolumeClaims")
                || (m.contains("persistentvolumeclaim \"") && m.contains("not found"))
        };
        if c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
            && !c.message.as_deref().is_some_and(claims_pending)
        {
            return Some(Err(format!(
                "no node can take it: {}",
                c.message.as_deref().unwrap_or("")
            )));
        }
    }
    None
}

/// Why a pod is still pending, for a timeout's message.
pub fn pending_reason(p: &Pod) -> String {
    if let Some(w) = main_status(p).and_then(|c| c.state.as_ref()?.waiting.as_ref()) {
        return format!(
            "{} {}",
            w.reason.as_deref().unwrap_or(""),
            w.message.as_deref().unwrap_or("")
        )
        .trim()
        .to_string();
    }
    let phase = p
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    for c in p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
    {
        if c.status == "False" {
            return format!(
                "phase {phase}, {} false: {}",
                c.type_,
                c.message.as_deref().unwrap_or("")
            );
        }
    }
    format!("phase {phase}")
}

/// The labels a pod was made with (the annotation, else its labels).
fn labels_of(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(LABELS_ANNOTATION))
        .and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_else(|| meta.labels.clone().unwrap_or_default())
}

/// A pod as the contract's [`Container`]: its name is its id.
pub fn container_of(p: &Pod) -> Container {
    let name = p.metadata.name.clone().unwrap_or_default();
    let phase = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    let st = main_status(p);
    let state = st.and_then(|c| c.state.as_ref());
    let running = phase == "Running" && state.is_some_and(|s| s.running.is_some());
    let evicted = p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted");
    let status = if p.metadata.deletion_timestamp.is_some() {
        "removing"
    } else if evicted {
        "evicted"
    } else {
        match phase {
            "Pending" => "created",
            "Running" if running => "running",
            "Running" => "starting",
            "Succeeded" | "Failed" => "exited",
            _ => "unknown",
        }
    };
    let spec = p.spec.as_ref();
    Container {
        id: name.clone(),
        name,
        image: st
            .map(|c| c.image_id.clone())
            .filter(|i| !i.is_empty())
            .or_else(|| spec.and_then(|s| s.containers.first()?.image.clone()))
            .unwrap_or_default(),
        running,
        status: status.into(),
        exit_code: state
            .and_then(|s| s.terminated.as_ref())
            .map(|t| i64::from(t.exit_code)),
        oom_killed: state
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.reason.as_deref() == Some("OOMKilled")),
        labels: labels_of(&p.metadata),
        ports: Vec::new(),
        runtime: spec
            .and_then(|s| s.runtime_class_name.clone())
            .unwrap_or_else(|| crate::runtime::DEFAULT_RUNTIME.into()),
    }
}

/// The ConfigMap keeping a stopped pod's manifest (what `start` makes again).
pub fn stopped_record(p: &Pod) -> Result<ConfigMap> {
    let mut kept = Pod {
        metadata: ObjectMeta {
            name: p.metadata.name.clone(),
            labels: p.metadata.labels.clone(),
            annotations: p.metadata.annotations.clone(),
            ..Default::default()
        },
        spec: p.spec.clone(),
        status: None,
    };
    if let Some(s) = kept.spec.as_mut() {
        s.node_name = None;
    }
    let json = serde_json::to_string(&kept).map_err(|e| {
        Error::new(
            Exit::Software,
            format!("cannot keep the pod's manifest: {e}"),
        )
    })?;
    let mut labels = p.metadata.labels.clone().unwrap_or_default();
    labels.insert(STOPPED_LABEL.into(), "1".into());
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: p.metadata.name.clone(),
            labels: Some(labels),
            annotations: p.metadata.annotations.clone(),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(STOPPED_KEY.to_string(), json)])),
        ..Default::default()
    })
}

/// True for a ConfigMap this engine keeps a stopped pod in.
pub fn is_stopped_record(cm: &ConfigMap) -> bool {
    let l = cm.metadata.labels.as_ref();
    l.and_then(|l| l.get(STOPPED_LABEL)).map(String::as_str) == Some("1")
        && l.and_then(|l| l.get(MANAGED_BY)).map(String::as_str) == Some(MANAGED_BY_VALUE)
}

/// The pod a stopped record keeps.
pub fn pod_from_record(cm: &ConfigMap) -> Result<Pod> {
    let json = cm
        .data
        .as_ref()
        .and_then(|d| d.get(STOPPED_KEY))
        .ok_or_else(|| Error::data("the stopped pod's record holds no manifest"))?;
    serde_json::from_str(json)
        .map_err(|e| Error::data(format!("the stopped pod's record is unreadable: {e}")))
}

/// A stopped record as a [`Container`] that is not running.
pub fn container_of_record(cm: &ConfigMap) -> Container {
    let mut c = match pod_from_record(cm) {
        Ok(p) => container_of(&p),
        Err(_) => Container {
            id: cm.metadata.name.clone().unwrap_or_default(),
            name: cm.metadata.name.clone().unwrap_or_default(),
            labels: labels_of(&cm.metadata),
            ..Default::default()
        },
    };
    c.running = false;
    c.status = "exited".into();
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Bind;

    fn spec() -> ContainerSpec {
        ContainerSpec {
            name: Some("lw-abc-one".into()),
            image: "loopwright/test-busybox:latest".into(),
            cmd: vec!["sleep".into(), "3600".into()],
            user: Some("100000:100000".into()),
            read_only_root: true,
            memory_bytes: Some(64 << 20),
            nano_cpus: Some(500_000_000),
            labels: BTreeMap::from([
                ("org.loopwright.sandbox".into(), "one".into()),
                ("org.loopwright.root-path".into(), "/tmp/x y".into()),
            ]),
            tmpfs: BTreeMap::from([("/tmp".into(), "rw,noexec,size=64m".into())]),
            network: Some("lw-net-1".into()),
            ..Default::default()
        }
    }

    #[test]
    fn hosts_become_one_alias_per_address() {
        let mut sp = spec();
        sp.hosts = BTreeMap::from([
            ("a.test".to_string(), "10.0.0.7".to_string()),
            ("b.test".to_string(), "10.0.0.7".to_string()),
            ("c.test".to_string(), "10.0.0.8".to_string()),
        ]);
        let p = pod_of(&sp, None).unwrap();
        let aliases = p.spec.unwrap().host_aliases.unwrap();
        assert_eq!(aliases.len(), 2);
        assert_eq!(aliases[0].ip, "10.0.0.7");
        assert_eq!(
            aliases[0].hostnames.as_deref(),
            Some(&["a.test".to_string(), "b.test".to_string()][..])
        );
        assert!(
            pod_of(&spec(), None)
                .unwrap()
                .spec
                .unwrap()
                .host_aliases
                .is_none()
        );
    }

    #[test]
    fn a_spec_becomes_a_hardened_pod() {
        let p = pod_of(&spec(), Some("gvisor".into())).unwrap();
        let s = p.spec.as_ref().unwrap();
        let c = &s.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".into()])
        );
        let psc = s.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.run_as_user, Some(100000));
        assert_eq!(psc.fs_group, Some(100000), "the volumes are the user's");
        assert_eq!(
            psc.seccomp_profile.as_ref().unwrap().type_,
            "RuntimeDefault"
        );
        assert_eq!(s.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(s.automount_service_account_token, Some(false));
        let lim = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(lim["memory"].0, (64u64 << 20).to_string());
        assert_eq!(lim["cpu"].0, "500m");
        let v = &s.volumes.as_ref().unwrap()[0];
        assert_eq!(
            v.empty_dir.as_ref().unwrap().size_limit.as_ref().unwrap().0,
            "64Mi"
        );
        let labels = p.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["org.loopwright.sandbox"], "one");
        assert!(!labels.contains_key("org.loopwright.root-path"));
        assert_eq!(labels["net.loopwright.org/lw-net-1"], "1");
        // Every label comes back, the invalid one from the annotation.
        let back = container_of(&p);
        assert_eq!(back.labels["org.loopwright.root-path"], "/tmp/x y");
        assert_eq!(
            c.args.as_deref(),
            Some(&["sleep".to_string(), "3600".into()][..])
        );
    }

    #[test]
    fn root_host_paths_and_ports_are_refused() {
        let mut s = spec();
        s.user = Some("0".into());
        assert_eq!(pod_of(&s, None).unwrap_err().exit, Exit::NoPerm);
        let mut s = spec();
        s.binds.push(Bind {
            source: "/home/x/repo".into(),
            target: "/work".into(),
            read_only: false,
        });
        let e = pod_of(&s, None).unwrap_err();
        assert_eq!(e.exit, Exit::Unavailable);
        assert!(
            e.msg.contains("does not see this host's files"),
            "{}",
            e.msg
        );
        let mut s = spec();
        s.name = Some("Bad_Name".into());
        assert_eq!(pod_of(&s, None).unwrap_err().exit, Exit::Usage);
    }

    #[test]
    fn labels_and_selectors() {
        assert!(valid_label_key("org.loopwright.sandbox"));
        assert!(valid_label_key("net.loopwright.org/lw-x"));
        assert!(!valid_label_key("a/b/c"));
        assert!(!valid_label_value("/tmp/x"));
        assert!(valid_label_value(""));
        assert!(selector("org.loopwright.root=abc123").is_ok());
        assert_eq!(
            selector("org.loopwright.root-path=/tmp").unwrap_err().exit,
            Exit::DataErr
        );
    }

    #[test]
    fn a_stopped_record_gives_the_pod_back() {
        let p = pod_of(&spec(), None).unwrap();
        let cm = stopped_record(&p).unwrap();
        assert!(is_stopped_record(&cm));
        let back = pod_from_record(&cm).unwrap();
        assert_eq!(back.metadata.name, p.metadata.name);
        assert_eq!(back.spec, p.spec);
        let c = container_of_record(&cm);
        assert!(!c.running);
        assert_eq!(c.status, "exited");
    }

    #[test]
    fn unbound_claims_wait_and_other_unschedulable_pods_fail() {
        use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
        let pending = |msg: &str| Pod {
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                conditions: Some(vec![PodCondition {
                    type_: "PodScheduled".into(),
                    status: "False".into(),
                    reason: Some("Unschedulable".into()),
                    message: Some(msg.into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            start_outcome(&pending(
                "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. not found"
            )),
            None
        );
        assert_eq!(
            start_outcome(&pending(
                "0/1 nodes are available: persistentvolumeclaim \"lw-sb-x-a-work\" not found. not found"
            )),
            None
        );
        assert!(matches!(
            start_outcome(&pending("0/1 nodes are available: 1 Insufficient memory.")),
            Some(Err(m)) if m.contains("Insufficient memory")
        ));
    }
}
