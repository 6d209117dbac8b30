//! Pull secrets: a node pulls a pod's image from a registry with the
//! credentials of the pod's `imagePullSecrets`, never with this host's.  So
//! when a pod names an image on a registry for which the Docker CLI's
//! configuration holds credentials (what `docker login HOST` wrote, and
//! what `lw-build push` uses for `build.cache`), the engine puts them in a
//! Secret of type `kubernetes.io/dockerconfigjson` in the namespace, one
//! per registry (`lw-pull-HOST-PORT`, labelled as ours, brought up to date
//! by every create), and the pod names it.  An image without a registry
//! host, or a registry without credentials, gets none: the node pulls
//! anonymously, or runs what was imported into it.
//!
//! The secret is shared by every pod pulling from that registry, so
//! removing a sandbox leaves it; it holds only what the user's own Docker
//! configuration already holds.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams};

use super::KubeEngine;
use super::pod::{MANAGED_BY, MANAGED_BY_VALUE};
use crate::credentials::{self, Credentials};
use base::error::Result;

/// The registry host (`HOST[:PORT]`) `reference` names, if it names one
/// (Docker's rule: a first component with a dot, a colon, or `localhost`).
pub(super) fn registry_host(reference: &str) -> Option<&str> {
    let (first, rest) = reference.split_once('/')?;
    let domain = first.contains('.') || first.contains(':') || first == "localhost";
    (domain && !rest.is_empty()).then_some(first)
}

/// The secret's name for registry `host`: a DNS label.
pub(super) fn secret_name(host: &str) -> String {
    let h: String = host
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("lw-pull-{}", h.trim_matches('-'))
}

/// The secret for `host` holding `cred`, as the kubelet reads it.
pub(super) fn secret_of(host: &str, cred: &Credentials) -> Secret {
    let auth = credentials::base64_encode(format!("{}:{}", cred.user, cred.secret).as_bytes());
    let config = serde_json::json!({
        "auths": {host: {"username": cred.user, "password": cred.secret, "auth": auth}}
    });
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(host)),
            labels: Some(BTreeMap::from([(
                MANAGED_BY.to_string(),
                MANAGED_BY_VALUE.to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        data: Some(BTreeMap::from([(
            ".dockerconfigjson".to_string(),
            ByteString(config.to_string().into_bytes()),
        )])),
        ..Default::default()
    }
}

impl KubeEngine {
    /// The pull secret for `image`'s registry, made or brought up to date;
    /// `None` when no credentials are known for it.
    pub(super) fn pull_secret(&self, image: &str) -> Result<Option<String>> {
        let Some(host) = registry_host(image) else {
            return Ok(None);
        };
        let Some(cred) = credentials::lookup(host)? else {
            return Ok(None);
        };
        let secret = secret_of(host, &cred);
        let name = secret_name(host);
        let api: Api<Secret> = Api::namespaced(self.client().clone(), &self.target().namespace);
        let what = format!(
            "cannot make pull secret '{name}' for registry '{host}' (credentials from {})",
            cred.source
        );
        self.block_on(api.patch(
            &name,
            &PatchParams::apply(MANAGED_BY_VALUE).force(),
            &Patch::Apply(&secret),
        ))
        .map_err(|e| self.err("patch", "secrets", &what, e))?;
        Ok(Some(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_references_with_a_registry_host_get_a_secret() {
        assert_eq!(
            registry_host("127.0.0.1:5000/lw/layers:deps-ab"),
            Some("127.0.0.1:5000")
        );
        assert_eq!(
            registry_host("cache.example.com/lw:x"),
            Some("cache.example.com")
        );
        assert_eq!(registry_host("localhost/x"), Some("localhost"));
        assert_eq!(registry_host("loopwright/lw-sbtest:abc"), None);
        assert_eq!(registry_host("busybox"), None);
    }

    #[test]
    fn the_secret_is_a_docker_config_for_that_host() {
        assert_eq!(secret_name("127.0.0.1:5000"), "lw-pull-127-0-0-1-5000");
        let cred = Credentials {
            user: "lw".into(),
            secret: "pw".into(),
            source: "the test".into(),
        };
        let s = secret_of("Cache.Example.com:443", &cred);
        assert_eq!(
            s.metadata.name.as_deref(),
            Some("lw-pull-cache-example-com-443")
        );
        assert_eq!(s.type_.as_deref(), Some("kubernetes.io/dockerconfigjson"));
        let data = &s.data.as_ref().unwrap()[".dockerconfigjson"].0;
        let v: serde_json::Value = serde_json::from_slice(data).unwrap();
        assert_eq!(v["auths"]["Cache.Example.com:443"]["auth"], "bHc6cHc=");
        assert_eq!(v["auths"]["Cache.Example.com:443"]["username"], "lw");
    }
}
