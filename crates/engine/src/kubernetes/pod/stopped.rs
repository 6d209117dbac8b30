//! A stopped pod: a pod cannot be stopped and kept, so its manifest is kept
//! in a ConfigMap of the same name (labelled as the pod was, and
//! [`STOPPED_LABEL`]) and `start` makes it again.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::status::{container_of, labels_of};
use super::{MANAGED_BY, MANAGED_BY_VALUE, STOPPED_LABEL};
use crate::Container;
use base::error::{Error, Exit, Result};

const STOPPED_KEY: &str = "pod.json";

/// The ConfigMap keeping a stopped pod's manifest (what `start` makes again).
pub(crate) fn stopped_record(p: &Pod) -> Result<ConfigMap> {
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
pub(crate) fn is_stopped_record(cm: &ConfigMap) -> bool {
    let l = cm.metadata.labels.as_ref();
    l.and_then(|l| l.get(STOPPED_LABEL)).map(String::as_str) == Some("1")
        && l.and_then(|l| l.get(MANAGED_BY)).map(String::as_str) == Some(MANAGED_BY_VALUE)
}

/// The pod a stopped record keeps.
pub(crate) fn pod_from_record(cm: &ConfigMap) -> Result<Pod> {
    let json = cm
        .data
        .as_ref()
        .and_then(|d| d.get(STOPPED_KEY))
        .ok_or_else(|| Error::data("the stopped pod's record holds no manifest"))?;
    serde_json::from_str(json)
        .map_err(|e| Error::data(format!("the stopped pod's record is unreadable: {e}")))
}

/// A stopped record as a [`Container`] that is not running.
pub(crate) fn container_of_record(cm: &ConfigMap) -> Container {
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
