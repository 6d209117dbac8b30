//! Images on Kubernetes: the API builds, tags and removes none (select.rs
//! pairs the runner with a Docker builder); a node's
//! runtime pulls what a pod names (`imagePullPolicy: IfNotPresent`) from a
//! registry — in real use the one `build.cache` names — or runs what was
//! imported into it (`docker save IMAGE | ctr -n k8s.io images import -`,
//! what scripts/k8s-cluster does with `LW_K8S_IMAGES`).  [`Images::image`]
//! reads the nodes' `status.images`, which the kubelet reports (its 50
//! largest by default, refreshed with the node's status, so behind an
//! import), and which needs the right to list nodes.  `lw-sandbox create`
//! does not use it: a pod whose node cannot get its image says so in its
//! own status (ErrImageNeverPull, ErrImagePull, ImagePullBackOff), which is
//! 66 naming the image (mod.rs, `not_started`).
//!
//! [`Images::image`]: crate::Images::image

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;

use super::KubeEngine;
use crate::Image;
use base::error::Result;

/// `reference` as a runtime names it: `docker.io/library/busybox:latest`.
pub fn normalize(reference: &str) -> String {
    if reference.starts_with("sha256:") {
        return reference.to_string();
    }
    let first = reference.split('/').next().unwrap_or("");
    let has_domain = reference.contains('/')
        && (first.contains('.') || first.contains(':') || first == "localhost");
    let mut r = if has_domain {
        reference.to_string()
    } else if reference.contains('/') {
        format!("docker.io/{reference}")
    } else {
        format!("docker.io/library/{reference}")
    };
    let last = r.rsplit('/').next().unwrap_or("");
    if !last.contains(':') && !r.contains('@') {
        r.push_str(":latest");
    }
    r
}

impl KubeEngine {
    pub(super) fn node_image(&self, reference: &str) -> Result<Option<Image>> {
        let want = normalize(reference);
        let nodes: Api<Node> = Api::all(self.client().clone());
        let list = self
            .block_on(nodes.list(&ListParams::default()))
            .map_err(|e| {
                self.err(
                    "list",
                    "nodes",
                    &format!("cannot look for image '{reference}' on the nodes"),
                    e,
                )
            })?;
        for n in list.items {
            for img in n.status.and_then(|s| s.images).unwrap_or_default() {
                let names = img.names.unwrap_or_default();
                if names.iter().any(|x| x == &want || x == reference) {
                    let id = names
                        .iter()
                        .find(|x| x.contains("@sha256:") || x.starts_with("sha256:"))
                        .cloned()
                        .unwrap_or_else(|| want.clone());
                    return Ok(Some(Image {
                        id,
                        tags: names.into_iter().filter(|x| !x.contains('@')).collect(),
                        ..Default::default()
                    }));
                }
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn references_as_the_runtime_names_them() {
        assert_eq!(normalize("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(
            normalize("loopwright/test-busybox:latest"),
            "docker.io/loopwright/test-busybox:latest"
        );
        assert_eq!(
            normalize("loopwright.local/pause:1"),
            "loopwright.local/pause:1"
        );
        assert_eq!(normalize("localhost:5000/x"), "localhost:5000/x:latest");
    }
}
