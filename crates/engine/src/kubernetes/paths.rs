//! [`HostPaths`] on Kubernetes: a cluster never sees this host's files
//! (its nodes are other machines, or this one through a kubelet that mounts
//! only what a pod's volumes name), so the probe answers "no such file"
//! without making anything, and a sandbox on it is in remote mode.
//! The engine's identity is the `kube-system` namespace's uid, which a
//! cluster keeps for its life (the usual cluster id).

use std::path::Path;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

use super::KubeEngine;
use crate::HostPaths;
use base::error::Result;

impl HostPaths for KubeEngine {
    fn address(&self) -> String {
        let t = self.target();
        format!(
            "{} (context {}, namespace {})",
            t.server, t.context, t.namespace
        )
    }

    fn engine_id(&self) -> Result<String> {
        let api: Api<Namespace> = Api::all(self.client().clone());
        match self.block_on(api.get("kube-system")) {
            Ok(ns) => Ok(format!(
                "k8s-{}",
                ns.metadata
                    .uid
                    .unwrap_or_else(|| self.target().context.clone())
            )),
            // A user who may not read namespaces still has a stable name for it.
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(format!(
                "k8s-{}",
                self.target()
                    .server
                    .replace(|c: char| !c.is_ascii_alphanumeric(), "-")
            )),
            Err(e) => Err(self.err(
                "get",
                "namespaces",
                "cannot ask the cluster its identity",
                e,
            )),
        }
    }

    fn read_through_bind(&self, _dir: &Path, _name: &str) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
}
