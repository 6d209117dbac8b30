//! A pod's state: whether its start is decided, why it is still pending,
//! and the pod as the contract's [`Container`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{LABELS_ANNOTATION, MAIN};
use crate::Container;

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

/// The waiting reasons that say a node has not the image and cannot get it.
const IMAGE_MISSING: &[&str] = &[
    "ErrImageNeverPull",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
];

/// Whether a [`start_outcome`] error is an image the node has not and
/// cannot pull.
pub(crate) fn image_missing(why: &str) -> bool {
    IMAGE_MISSING.iter().any(|r| {
        why.strip_prefix(r)
            .is_some_and(|t| t.starts_with([':', ' ']))
    })
}

/// Whether a pod's start is decided: `Ok` when its container runs, `Err`
/// with the reason when it never will; `None` while it may still.
pub(crate) fn start_outcome(p: &Pod) -> Option<std::result::Result<(), String>> {
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
                let image = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.containers.iter().find(|c| c.name == MAIN))
                    .and_then(|c| c.image.as_deref())
                    .filter(|_| IMAGE_MISSING.contains(&reason))
                    .map(|i| format!(" (image '{i}')"))
                    .unwrap_or_default();
                return Some(Err(format!(
                    "{reason}{image}: {}{}",
                    w.message.as_deref().unwrap_or(""),
                    if IMAGE_MISSING.contains(&reason) {
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
pub(crate) fn pending_reason(p: &Pod) -> String {
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
pub(super) fn labels_of(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(LABELS_ANNOTATION))
        .and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_else(|| meta.labels.clone().unwrap_or_default())
}

/// A pod as the contract's [`Container`]: its name is its id.
pub(crate) fn container_of(p: &Pod) -> Container {
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
