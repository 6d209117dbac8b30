//! [`NetworkEngine::publish`](crate::NetworkEngine::publish) on
//! Kubernetes: a Service in front of one pod.
//!
//! A pod's address changes whenever it is made again (a `stop` and `start`
//! of this engine makes a new pod), and a cluster has no per-network names
//! like Docker's aliases; a Service gives the pod a cluster address that
//! outlives it.  The Service is named as the pod and selects it by the label
//! [`SERVICE_LABEL`], which `publish` sets on the pod, so only that pod is
//! behind it.  The address is routed by the cluster's service proxy
//! (kube-proxy); who may reach it is still the NetworkPolicies' business,
//! applied to the pod behind it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

use super::{KubeEngine, pod};
use base::error::{Error, Exit, Result};

/// The label that puts a pod behind the Service of its name.
pub(super) const SERVICE_LABEL: &str = "service.loopwright.org/name";

impl KubeEngine {
    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client().clone(), &self.target().namespace)
    }

    /// Makes (or finds) the Service of `container` and returns its address.
    pub(super) fn publish_service(
        &self,
        container: &str,
        port: u16,
        labels: &BTreeMap<String, String>,
    ) -> Result<String> {
        if !pod::valid_label_value(container) {
            return Err(Error::usage(format!(
                "cannot publish '{container}': a Service selects its pod by a label, and a label value is at most 63 letters, digits, '-', '_' and '.'"
            )));
        }
        let what = format!("cannot put a Service in front of pod '{container}'");
        let pods: Api<Pod> = Api::namespaced(self.client().clone(), &self.target().namespace);
        let patch = serde_json::json!({"metadata": {"labels": {SERVICE_LABEL: container}}});
        self.block_on(pods.patch(container, &PatchParams::default(), &Patch::Merge(&patch)))
            .map_err(|e| self.err("patch", "pods", &what, e))?;
        let svc = service_of(container, port, labels);
        let made = match self.block_on(self.services().create(&PostParams::default(), &svc)) {
            Ok(s) => s,
            Err(kube::Error::Api(s)) if s.code == 409 => self
                .block_on(self.services().get(container))
                .map_err(|e| self.err("get", "services", &what, e))?,
            Err(e) => return Err(self.err("create", "services", &what, e)),
        };
        made.spec
            .and_then(|s| s.cluster_ip)
            .filter(|ip| !ip.is_empty() && ip != "None")
            .ok_or_else(|| {
                Error::new(
                    Exit::Unavailable,
                    format!(
                        "{what}: the API server gave the Service '{container}' no cluster address"
                    ),
                )
            })
    }

    /// Removes the Service of `container`; none is not an error.
    pub(super) fn unpublish_service(&self, container: &str) -> Result<()> {
        let what = format!("cannot remove the Service of '{container}'");
        match self.block_on(self.services().delete(container, &DeleteParams::default())) {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.err("delete", "services", &what, e)),
        }
    }
}

/// The Service named `container` that sends `port` to the pod labelled
/// [`SERVICE_LABEL`]`=container`.
pub(super) fn service_of(container: &str, port: u16, labels: &BTreeMap<String, String>) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(container.to_string()),
            labels: Some(pod::object_labels(labels)),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(
                SERVICE_LABEL.to_string(),
                container.to_string(),
            )])),
            ports: Some(vec![ServicePort {
                port: i32::from(port),
                target_port: Some(IntOrString::Int(i32::from(port))),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            type_: Some("ClusterIP".into()),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_selects_only_its_pod_and_carries_our_labels() {
        let labels = BTreeMap::from([("org.loopwright.egress.key".to_string(), "k1".to_string())]);
        let s = service_of("k1-proxy", 3128, &labels);
        let spec = s.spec.unwrap();
        assert_eq!(spec.selector.unwrap()[SERVICE_LABEL], "k1-proxy");
        assert_eq!(spec.ports.unwrap()[0].port, 3128);
        let l = s.metadata.labels.unwrap();
        assert_eq!(l["org.loopwright.egress.key"], "k1");
        assert_eq!(l[pod::MANAGED_BY], pod::MANAGED_BY_VALUE);
    }
}
