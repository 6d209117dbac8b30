//! [`NetworkEngine`] on Kubernetes: a network is a NetworkPolicy, and a
//! pod's log comes from the pods/log subresource.
//!
//! Every pod this engine makes is selected by one namespace-wide policy,
//! [`DEFAULT_DENY`], with no rules: nothing in, nothing out (`--network
//! none`).  Policies only add, so a network is a policy that selects the
//! pods labelled `net.loopwright.org/NAME=1` and allows traffic among them
//! (none when `isolate_containers`), and out of the cluster too unless
//! `internal`.  `connect`/`disconnect` set and remove that label on a
//! running pod; aliases have no place in a policy: `publish` puts a
//! Service in front of a pod instead (service.rs).  `bridge` is [`BRIDGE`]:
//! egress anywhere.
//!
//! NetworkPolicy is enforced by the cluster's network plugin, not by the
//! API server: a plugin without policy support (the reference `bridge`
//! CNI plugin, flannel) accepts the objects and enforces nothing.  The test
//! cluster (scripts/k8s-cluster) runs kube-router's firewall beside the
//! bridge plugin when it is cached, and then enforces them
//! (tests/kube_network.rs); these objects are the request, the plugin is
//! the wall.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::AsyncBufReadExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};

use super::{KubeEngine, pod};
use crate::{Network, NetworkEngine, NetworkSpec};
use base::error::{Error, Exit, Result};

/// The policy that denies every pod of ours everything not allowed by another.
pub(super) const DEFAULT_DENY: &str = "loopwright-default-deny";
/// The policy of `--network bridge`: egress anywhere.
pub(super) const BRIDGE: &str = "loopwright-bridge";
const FLAGS_ANNOTATION: &str = "loopwright.org/network";

impl KubeEngine {
    fn policies(&self) -> Api<NetworkPolicy> {
        Api::namespaced(self.client().clone(), &self.target().namespace)
    }

    fn ensure_policy(&self, np: &NetworkPolicy) -> Result<()> {
        let name = np.metadata.name.clone().unwrap_or_default();
        match self.block_on(self.policies().create(&PostParams::default(), np)) {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(self.err(
                "create",
                "networkpolicies",
                &format!("cannot create network policy '{name}'"),
                e,
            )),
        }
    }

    /// Makes [`DEFAULT_DENY`] unless it exists (asked once per connection).
    pub(super) fn ensure_default_deny(&self) -> Result<()> {
        if self.deny_made.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        self.ensure_policy(&NetworkPolicy {
            metadata: meta(DEFAULT_DENY, &BTreeMap::new(), None),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(select(pod::MANAGED_BY, pod::MANAGED_BY_VALUE)),
                policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
                ingress: None,
                egress: None,
            }),
        })?;
        self.deny_made
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Makes [`BRIDGE`] unless it exists.
    pub(super) fn ensure_bridge(&self) -> Result<()> {
        self.ensure_policy(&NetworkPolicy {
            metadata: meta(BRIDGE, &BTreeMap::new(), None),
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(select(&format!("{}bridge", pod::NET_PREFIX), "1")),
                policy_types: Some(vec!["Egress".into()]),
                ingress: None,
                egress: Some(vec![NetworkPolicyEgressRule::default()]),
            }),
        })
    }

    fn members(&self, name: &str) -> Result<BTreeMap<String, String>> {
        let pods: Api<Pod> = Api::namespaced(self.client().clone(), &self.target().namespace);
        let lp = ListParams::default().labels(&format!("{}{name}=1", pod::NET_PREFIX));
        let list = self.block_on(pods.list(&lp)).map_err(|e| {
            self.err(
                "list",
                "pods",
                &format!("cannot list the pods on network '{name}'"),
                e,
            )
        })?;
        Ok(list
            .items
            .into_iter()
            .map(|p| {
                let ip = p
                    .status
                    .and_then(|s| s.pod_ip)
                    .map(|ip| format!("{ip}/32"))
                    .unwrap_or_default();
                (p.metadata.name.unwrap_or_default(), ip)
            })
            .collect())
    }

    fn network_of(&self, np: NetworkPolicy) -> Result<Network> {
        let name = np.metadata.name.clone().unwrap_or_default();
        let flags = np
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(FLAGS_ANNOTATION))
            .cloned()
            .unwrap_or_default();
        let labels = np
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(pod::LABELS_ANNOTATION))
            .and_then(|j| serde_json::from_str(j).ok())
            .unwrap_or_else(|| np.metadata.labels.clone().unwrap_or_default());
        Ok(Network {
            // A policy's name is unique in its namespace and is what the
            // API takes: callers that pass ids back (egress) must reach it.
            id: name.clone(),
            internal: flags.split(',').any(|f| f == "internal"),
            options: flags
                .split(',')
                .filter(|f| !f.is_empty())
                .map(|f| (f.to_string(), "true".to_string()))
                .collect(),
            labels,
            subnets: Vec::new(),
            containers: self.members(&name)?,
            created: np
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            name,
        })
    }

    fn label_pod(&self, network: &str, container: &str, on: bool) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client().clone(), &self.target().namespace);
        let key = format!("{}{network}", pod::NET_PREFIX);
        let patch =
            serde_json::json!({"metadata": {"labels": {key: if on { Some("1") } else { None }}}});
        let what = if on {
            format!("cannot attach '{container}' to network '{network}'")
        } else {
            format!("cannot detach '{container}' from network '{network}'")
        };
        match self.block_on(pods.patch(container, &PatchParams::default(), &Patch::Merge(&patch))) {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 && !on => Ok(()),
            Err(e) => Err(self.err("patch", "pods", &what, e)),
        }
    }
}

fn select(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
        match_expressions: None,
    }
}

fn meta(name: &str, labels: &BTreeMap<String, String>, flags: Option<String>) -> ObjectMeta {
    let mut annotations = BTreeMap::from([(
        pod::LABELS_ANNOTATION.to_string(),
        serde_json::to_string(labels).unwrap_or_default(),
    )]);
    if let Some(f) = flags {
        annotations.insert(FLAGS_ANNOTATION.into(), f);
    }
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(pod::object_labels(labels)),
        annotations: Some(annotations),
        ..Default::default()
    }
}

/// The policy of network `spec`: its members reach each other (unless
/// isolated) and the outside (unless internal).
pub(super) fn policy_of(spec: &NetworkSpec) -> Result<NetworkPolicy> {
    pod::check_name("network", &spec.name)?;
    let key = format!("{}{}", pod::NET_PREFIX, spec.name);
    if !pod::valid_label_key(&key) {
        return Err(Error::usage(format!(
            "network name '{}' is longer than a Kubernetes label name allows (63)",
            spec.name
        )));
    }
    let members = || NetworkPolicyPeer {
        pod_selector: Some(select(&key, "1")),
        ..Default::default()
    };
    let ingress = (!spec.isolate_containers).then(|| {
        vec![NetworkPolicyIngressRule {
            from: Some(vec![members()]),
            ports: None,
        }]
    });
    let egress = match (spec.internal, spec.isolate_containers) {
        (false, _) => Some(vec![NetworkPolicyEgressRule::default()]),
        (true, false) => Some(vec![NetworkPolicyEgressRule {
            to: Some(vec![members()]),
            ports: None,
        }]),
        (true, true) => None,
    };
    let mut flags = Vec::new();
    if spec.internal {
        flags.push("internal");
    }
    if spec.isolate_containers {
        flags.push("isolate_containers");
    }
    if spec.no_host_address {
        flags.push("no_host_address");
    }
    Ok(NetworkPolicy {
        metadata: meta(&spec.name, &spec.labels, Some(flags.join(","))),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(select(&key, "1")),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress,
            egress,
        }),
    })
}

fn ours(np: &NetworkPolicy) -> bool {
    let name = np.metadata.name.as_deref().unwrap_or("");
    name != DEFAULT_DENY
        && name != BRIDGE
        && np
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(pod::MANAGED_BY))
            .map(String::as_str)
            == Some(pod::MANAGED_BY_VALUE)
}

impl NetworkEngine for KubeEngine {
    fn create_network(&self, spec: &NetworkSpec) -> Result<Network> {
        let np = policy_of(spec)?;
        let what = format!("cannot create network '{}'", spec.name);
        let made = self
            .block_on(self.policies().create(&PostParams::default(), &np))
            .map_err(|e| self.err("create", "networkpolicies", &what, e))?;
        self.network_of(made)
    }

    fn network(&self, name_or_id: &str) -> Result<Option<Network>> {
        let what = format!("cannot inspect network '{name_or_id}'");
        match self.block_on(self.policies().get_opt(name_or_id)) {
            Ok(Some(np)) if ours(&np) => Ok(Some(self.network_of(np)?)),
            Ok(_) => Ok(None),
            Err(e) => Err(self.err("get", "networkpolicies", &what, e)),
        }
    }

    fn networks_with_label(&self, label: &str) -> Result<Vec<Network>> {
        let what = format!("cannot list networks labelled '{label}'");
        let lp = ListParams::default().labels(&pod::selector(label)?);
        let list = self
            .block_on(self.policies().list(&lp))
            .map_err(|e| self.err("list", "networkpolicies", &what, e))?;
        let mut out = Vec::new();
        for np in list.items.into_iter().filter(ours) {
            out.push(self.network_of(np)?);
        }
        out.sort_by(|a, b| (&a.created, &a.id).cmp(&(&b.created, &b.id)));
        Ok(out)
    }

    fn remove_network(&self, name_or_id: &str) -> Result<()> {
        let what = format!("cannot remove network '{name_or_id}'");
        match self.block_on(self.policies().delete(name_or_id, &DeleteParams::default())) {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.err("delete", "networkpolicies", &what, e)),
        }
    }

    fn connect(&self, network: &str, container: &str, _aliases: &[&str]) -> Result<()> {
        if self.network(network)?.is_none() && network != "bridge" {
            return Err(Error::new(
                Exit::NoInput,
                format!("cannot attach '{container}' to network '{network}': no such network"),
            ));
        }
        if network == "bridge" {
            self.ensure_bridge()?;
        }
        self.label_pod(network, container, true)
    }

    fn disconnect(&self, network: &str, container: &str) -> Result<()> {
        self.label_pod(network, container, false)
    }

    fn publish(
        &self,
        container: &str,
        port: u16,
        labels: &BTreeMap<String, String>,
    ) -> Result<Option<String>> {
        self.publish_service(container, port, labels).map(Some)
    }

    fn unpublish(&self, container: &str) -> Result<()> {
        self.unpublish_service(container)
    }

    fn logs(&self, container: &str, stdout: bool) -> Result<Vec<u8>> {
        // The API keeps one log of both streams: it is the stdout's.
        if stdout {
            self.read_log(container)
        } else {
            Ok(Vec::new())
        }
    }

    fn wait_for_line(
        &self,
        container: &str,
        timeout: Duration,
        done: &mut dyn FnMut(&str) -> bool,
    ) -> Result<bool> {
        let pods: Api<Pod> = Api::namespaced(self.client().clone(), &self.target().namespace);
        let what = format!("cannot follow the log of pod '{container}'");
        let lp = kube::api::LogParams {
            container: Some(pod::MAIN.into()),
            follow: true,
            ..Default::default()
        };
        let deadline = tokio::time::Instant::now() + timeout;
        self.block_on(async {
            let s = match tokio::time::timeout_at(deadline, pods.log_stream(container, &lp)).await {
                Err(_) => return Ok(false),
                Ok(r) => r.map_err(|e| self.err("get", "pods/log", &what, e))?,
            };
            let mut lines = s.lines();
            use futures_util::StreamExt;
            loop {
                match tokio::time::timeout_at(deadline, lines.next()).await {
                    Err(_) => return Ok(false),
                    Ok(None) => return Ok(false),
                    Ok(Some(Err(e))) => {
                        return Err(Error::new(Exit::Unavailable, format!("{what}: {e}")));
                    }
                    Ok(Some(Ok(line))) => {
                        if done(line.trim_end()) {
                            return Ok(true);
                        }
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_internal_isolated_network_allows_nothing() {
        let np = policy_of(&NetworkSpec {
            name: "lw-net-a".into(),
            internal: true,
            isolate_containers: true,
            ..Default::default()
        })
        .unwrap();
        let s = np.spec.unwrap();
        assert!(s.ingress.is_none() && s.egress.is_none());
        assert_eq!(s.policy_types.unwrap(), ["Ingress", "Egress"]);
    }

    #[test]
    fn an_internal_network_reaches_its_members_only() {
        let np = policy_of(&NetworkSpec {
            name: "lw-net-b".into(),
            internal: true,
            ..Default::default()
        })
        .unwrap();
        let s = np.spec.unwrap();
        let to = s.egress.unwrap()[0].to.clone().unwrap();
        assert_eq!(
            to[0]
                .pod_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()["net.loopwright.org/lw-net-b"],
            "1"
        );
    }
}
