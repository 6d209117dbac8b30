//! What this user may do, as the API server's own review says, and what a
//! sandbox's life asks of it.

use kube::Api;
use kube::api::PostParams;

use super::KubeEngine;
use crate::error::Result;

impl KubeEngine {
    /// Whether this user may `verb` the `resource` (`pods`, `pods/exec`) in
    /// the engine's namespace, as the API server's own review says.
    pub fn can(&self, verb: &str, resource: &str) -> Result<bool> {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
        };
        let (res, sub) = match resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_string())),
            None => (resource, None),
        };
        let group = match res {
            "networkpolicies" => "networking.k8s.io",
            _ => "",
        };
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(self.target.namespace.clone()),
                    verb: Some(verb.into()),
                    group: Some(group.into()),
                    resource: Some(res.into()),
                    subresource: sub,
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let r = self
            .block_on(api.create(&PostParams::default(), &review))
            .map_err(|e| {
                self.err(
                    "create",
                    "selfsubjectaccessreviews",
                    "cannot ask the API server what this user may do",
                    e,
                )
            })?;
        Ok(r.status.is_some_and(|s| s.allowed))
    }
}

/// What a sandbox's life asks of the API, as (verb, resource).
pub const NEEDED: &[(&str, &str)] = &[
    ("create", "pods"),
    ("delete", "pods"),
    ("list", "pods"),
    ("create", "pods/exec"),
    ("get", "pods/log"),
    ("create", "persistentvolumeclaims"),
    ("create", "networkpolicies"),
    ("create", "configmaps"),
    // The egress proxy's Service (service.rs), and the label that puts its
    // pod behind it.
    ("create", "services"),
    ("delete", "services"),
    ("patch", "pods"),
];
