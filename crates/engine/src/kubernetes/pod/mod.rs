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
//!
//! The conversions live beside this file: the spec as a pod (spec.rs), a
//! pod's state as a start's outcome and as a [`Container`] (status.rs), a
//! stopped pod kept as a ConfigMap (stopped.rs).

mod spec;
mod status;
mod stopped;

use std::collections::BTreeMap;

use base::error::{Error, Result};

pub(super) use spec::{CPU_REQUEST_KEY, millicores, pod_of};
pub(super) use status::{container_of, image_missing, pending_reason, start_outcome};
pub(super) use stopped::{container_of_record, is_stopped_record, pod_from_record, stopped_record};

/// The one container of a pod.
pub(super) const MAIN: &str = "main";
/// The label every object this engine makes carries.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "loopwright";
/// A pod on network `N` carries the label `net.loopwright.org/N=1`.
pub const NET_PREFIX: &str = "net.loopwright.org/";
/// The spec's labels, whole, as JSON.
pub(super) const LABELS_ANNOTATION: &str = "loopwright.org/labels";
/// A ConfigMap holding a stopped pod's manifest carries this label.
pub(super) const STOPPED_LABEL: &str = "loopwright.org/stopped-pod";

/// A label value Kubernetes accepts.
pub(super) fn valid_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && v.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
}

/// A label key Kubernetes accepts: `[prefix/]name`, the name a valid
/// non-empty value, the prefix a DNS subdomain.
pub(super) fn valid_label_key(k: &str) -> bool {
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
pub(super) fn check_name(kind: &str, name: &str) -> Result<()> {
    if name.len() <= 253 && name.split('.').all(|p| dns_label(p, 63)) {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "{kind} name '{name}' is not a Kubernetes object name (lower-case letters, digits, '-' and '.', at most 253 characters)"
        )))
    }
}

/// A contract label filter (`key` or `key=value`) as a label selector.
pub(super) fn selector(label: &str) -> Result<String> {
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
pub(super) fn object_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = labels
        .iter()
        .filter(|(k, v)| valid_label_key(k) && valid_label_value(v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.insert(MANAGED_BY.into(), MANAGED_BY_VALUE.into());
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::{Bind, ContainerSpec};
    use base::error::Exit;

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
        let p = pod_of(&sp, None, None).unwrap();
        let aliases = p.spec.unwrap().host_aliases.unwrap();
        assert_eq!(aliases.len(), 2);
        assert_eq!(aliases[0].ip, "10.0.0.7");
        assert_eq!(
            aliases[0].hostnames.as_deref(),
            Some(&["a.test".to_string(), "b.test".to_string()][..])
        );
        assert!(
            pod_of(&spec(), None, None)
                .unwrap()
                .spec
                .unwrap()
                .host_aliases
                .is_none()
        );
    }

    #[test]
    fn a_spec_becomes_a_hardened_pod() {
        let p = pod_of(&spec(), Some("gvisor".into()), None).unwrap();
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
        assert_eq!(pod_of(&s, None, None).unwrap_err().exit, Exit::NoPerm);
        let mut s = spec();
        s.binds.push(Bind {
            source: "/home/x/repo".into(),
            target: "/work".into(),
            read_only: false,
        });
        let e = pod_of(&s, None, None).unwrap_err();
        assert_eq!(e.exit, Exit::Unavailable);
        assert!(
            e.msg.contains("does not see this host's files"),
            "{}",
            e.msg
        );
        let mut s = spec();
        s.name = Some("Bad_Name".into());
        assert_eq!(pod_of(&s, None, None).unwrap_err().exit, Exit::Usage);
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
        let p = pod_of(&spec(), None, None).unwrap();
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

    #[test]
    fn an_image_the_node_cannot_get_is_named_and_told_apart() {
        use k8s_openapi::api::core::v1::{
            Container as C, ContainerState, ContainerStateWaiting, ContainerStatus, PodSpec,
            PodStatus,
        };
        let waiting = |reason: &str| Pod {
            spec: Some(PodSpec {
                containers: vec![C {
                    name: MAIN.into(),
                    image: Some("example.test/app:1".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                container_statuses: Some(vec![ContainerStatus {
                    name: MAIN.into(),
                    state: Some(ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(reason.into()),
                            message: Some("kubelet's words".into()),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        for r in ["ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff"] {
            let Some(Err(why)) = start_outcome(&waiting(r)) else {
                panic!("{r} decides the start");
            };
            assert!(why.contains("image 'example.test/app:1'"), "{why}");
            assert!(why.contains("build.cache"), "the fix: {why}");
            assert!(image_missing(&why), "{why}");
        }
        let Some(Err(why)) = start_outcome(&waiting("CrashLoopBackOff")) else {
            panic!("CrashLoopBackOff decides the start");
        };
        assert!(!image_missing(&why) && !why.contains("image '"), "{why}");
    }

    #[test]
    fn a_cpu_request_below_the_limit_is_asked_for_and_one_above_is_78() {
        let res = |p: Pod| p.spec.unwrap().containers[0].resources.clone().unwrap();
        let r = res(pod_of(&spec(), None, None).unwrap());
        assert_eq!(r.limits.unwrap()["cpu"].0, "500m");
        assert!(r.requests.is_none(), "the limit is the request");
        let r = res(pod_of(&spec(), None, Some(millicores("0.05").unwrap())).unwrap());
        assert_eq!(r.requests.unwrap()["cpu"].0, "50m");
        assert_eq!(r.limits.unwrap()["cpu"].0, "500m");
        let e = pod_of(&spec(), None, Some(2000)).unwrap_err();
        assert_eq!(e.exit, Exit::Config);
        assert!(e.msg.contains("kube.cpu-request"), "{}", e.msg);
        for bad in ["0", "-1", "x", "NaN", ""] {
            assert_eq!(millicores(bad), None, "{bad}");
        }
        assert_eq!(millicores("1"), Some(1000));
        assert_eq!(millicores("0.0001"), Some(1));
    }
}
