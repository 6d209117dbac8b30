//! A warm pool (docs/scale.md): pods made ahead from one spec, each
//! claimed by one caller for good.
//!
//! A pool is named by [`pool_key`], a hash of everything in the spec but
//! its name and labels (image, user, limits, mounts, runtime, command), and
//! its pods carry it in [`POOL_LABEL`].  [`KubeEngine::pool_fill`] makes
//! pods until the pool holds `n`; [`KubeEngine::pool_claim`] takes a running
//! one by patching its labels (the pool label removed, the caller's set)
//! with the resourceVersion it listed as a precondition: two claims of one
//! pod both send the same version, the API server applies the first and
//! answers the second 409, and the loser tries the next pod.  A claimed pod
//! is never returned: it leaves the pool's selector with the patch that
//! gives it its owner.  Nothing is shared between a pool's pods: each is
//! made from the spec alone, with the volumes the spec names (a caller
//! wanting claims of its own per pod names them per pod, as a sandbox's).
//!
//! Idle, a pool costs no request: no exec, no watch; a claim is one list
//! and one patch.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use sha2::{Digest, Sha256};

use super::{KubeEngine, pod};
use crate::ContainerSpec;
use base::error::{Error, Result};

/// The label a pool's pods carry: the pool's key.
pub const POOL_LABEL: &str = "org.loopwright.pool";

/// The pool a spec's pods belong to: the first 16 hex digits of a SHA-256
/// of the spec without its name and labels (the parts a claim gives).
pub fn pool_key(spec: &ContainerSpec) -> String {
    let mut s = spec.clone();
    s.name = None;
    s.labels = BTreeMap::new();
    // Debug of the spec is stable: its maps are BTreeMaps.
    let digest = Sha256::digest(format!("{s:?}").as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The merge patch that claims a pod listed at `rv`: the pool label
/// removed, `labels` (the valid ones) set and recorded in full in the
/// labels annotation, the version a precondition.
fn claim_patch(rv: &str, labels: &BTreeMap<String, String>) -> serde_json::Value {
    let mut set = serde_json::Map::new();
    set.insert(POOL_LABEL.into(), serde_json::Value::Null);
    for (k, v) in pod::object_labels(labels) {
        set.insert(k, v.into());
    }
    serde_json::json!({
        "metadata": {
            "resourceVersion": rv,
            "labels": set,
            "annotations": {
                pod::LABELS_ANNOTATION: serde_json::to_string(labels).unwrap_or_default(),
            },
        }
    })
}

/// Every pod of a pool is made from one spec: a volume it mounts
/// writable would be one claim written by every sandbox that claims a pod.
/// Read-only ones (the root's tools) may be shared; a writable one is 64.
fn shares_nothing(spec: &ContainerSpec, key: &str) -> Result<()> {
    let writable = spec
        .volumes
        .iter()
        .filter(|v| !v.read_only)
        .map(|v| v.volume.as_str())
        .chain(
            spec.binds
                .iter()
                .filter(|b| !b.read_only)
                .map(|b| b.source.as_str()),
        )
        .next();
    match writable {
        Some(v) => Err(Error::usage(format!(
            "cannot fill the pool '{key}': its pods would share the writable volume '{v}'; a pool pod mounts only read-only volumes (its own scratch is an emptyDir)"
        ))),
        None => Ok(()),
    }
}

/// Where in a list of `n` pods the claim for `labels` starts.
fn spread(labels: &BTreeMap<String, String>, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let d = Sha256::digest(serde_json::to_string(labels).unwrap_or_default().as_bytes());
    (u64::from_le_bytes(d[..8].try_into().expect("a digest has 8 bytes")) % n as u64) as usize
}

impl KubeEngine {
    /// The pods of pool `key`, not being deleted, with their versions.
    fn pool_list(&self, key: &str) -> Result<Vec<Pod>> {
        let what = format!("cannot list the pool '{key}'");
        let lp = ListParams::default().labels(&format!("{POOL_LABEL}={key}"));
        let list = self
            .block_on(self.pods().list(&lp))
            .map_err(|e| self.err("list", "pods", &what, e))?;
        Ok(list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect())
    }

    /// The names of pool `key`'s pods, running or not.
    pub fn pool_pods(&self, key: &str) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .pool_list(key)?
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        names.sort();
        Ok(names)
    }

    /// Makes pods from `spec` (its name ignored: each pod is named
    /// `lw-pool-` and a suffix the API server picks) until pool
    /// [`pool_key`]`(spec)` holds `n`; returns the names made.  It does not
    /// wait for them to run: a claim takes only running ones.
    pub fn pool_fill(&self, spec: &ContainerSpec, n: usize) -> Result<Vec<String>> {
        let key = pool_key(spec);
        shares_nothing(spec, &key)?;
        let have = self.pool_list(&key)?.len();
        let mut s = spec.clone();
        s.name = None;
        s.labels.insert(POOL_LABEL.into(), key.clone());
        let mut p = pod::pod_of(&s, self.pool_runtime_class(spec)?, self.cpu_request)?;
        p.metadata.generate_name = Some("lw-pool-".into());
        if (have..n).next().is_some() {
            self.ensure_default_deny()?;
        }
        let what = format!("cannot fill the pool '{key}'");
        let mut made = Vec::new();
        for _ in have..n {
            let pod = self
                .block_on(self.pods().create(&PostParams::default(), &p))
                .map_err(|e| self.err("create", "pods", &what, e))?;
            made.extend(pod.metadata.name);
        }
        Ok(made)
    }

    fn pool_runtime_class(&self, spec: &ContainerSpec) -> Result<Option<String>> {
        match spec.runtime.as_deref() {
            None => Ok(None),
            Some(r) => self.runtime_class(r),
        }
    }

    /// Takes a running pod of pool `key` for good, giving it `labels`;
    /// `None` when the pool has none running (the caller makes its pod the
    /// ordinary way).  A pod another claim took first (409) sends this one
    /// to the next.
    pub fn pool_claim(
        &self,
        key: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<Option<String>> {
        let what = format!("cannot claim a pod of the pool '{key}'");
        let mut pods = self.pool_list(key)?;
        // Claims at once that all tried the first pod would meet a 409 on
        // each pod before theirs: each starts where its owner's hash says.
        let start = spread(labels, pods.len());
        pods.rotate_left(start);
        for p in pods {
            if !pod::container_of(&p).running {
                continue;
            }
            let (Some(name), Some(rv)) = (p.metadata.name, p.metadata.resource_version) else {
                continue;
            };
            let patch = Patch::Merge(claim_patch(&rv, labels));
            match self.block_on(self.pods().patch(&name, &PatchParams::default(), &patch)) {
                Ok(_) => return Ok(Some(name)),
                // Claimed (409) or deleted (404) since the list.
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => continue,
                Err(e) => return Err(self.err("patch", "pods", &what, e)),
            }
        }
        Ok(None)
    }

    /// Deletes every pod of pool `key` (`None`: of every pool) without
    /// waiting; returns how many it asked to delete.
    pub fn pool_drain(&self, key: Option<&str>) -> Result<usize> {
        let sel = match key {
            Some(k) => format!("{POOL_LABEL}={k}"),
            None => POOL_LABEL.to_string(),
        };
        let what = format!("cannot remove the pool pods '{sel}'");
        let lp = ListParams::default().labels(&sel);
        let list = self
            .block_on(self.pods().list(&lp))
            .map_err(|e| self.err("list", "pods", &what, e))?;
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        let mut n = 0;
        for name in list.items.into_iter().filter_map(|p| p.metadata.name) {
            match self.block_on(self.pods().delete(&name, &dp)) {
                Ok(_) => n += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(self.err("delete", "pods", &what, e)),
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_ignores_name_and_labels_and_follows_the_rest() {
        let a = ContainerSpec {
            name: Some("lw-sb-x-a".into()),
            image: "busybox:1".into(),
            labels: BTreeMap::from([("org.loopwright.sandbox".into(), "a".into())]),
            memory_bytes: Some(64 << 20),
            ..Default::default()
        };
        let mut b = a.clone();
        b.name = Some("lw-sb-x-b".into());
        b.labels.insert("org.loopwright.sandbox".into(), "b".into());
        assert_eq!(pool_key(&a), pool_key(&b));
        assert_eq!(pool_key(&a).len(), 16);
        assert!(pod::valid_label_value(&pool_key(&a)));
        let mut c = a.clone();
        c.image = "busybox:2".into();
        assert_ne!(pool_key(&a), pool_key(&c));
        let mut d = a.clone();
        d.memory_bytes = Some(128 << 20);
        assert_ne!(pool_key(&a), pool_key(&d));
    }

    #[test]
    fn claims_for_different_owners_start_at_different_pods() {
        let starts: std::collections::BTreeSet<usize> = (0..16)
            .map(|i| spread(&BTreeMap::from([("s".into(), format!("o-{i}"))]), 16))
            .collect();
        assert!(starts.len() > 4, "{starts:?}");
        assert_eq!(spread(&BTreeMap::new(), 0), 0);
    }

    #[test]
    fn a_pool_whose_pods_would_share_a_writable_volume_is_refused() {
        let mut s = ContainerSpec {
            image: "busybox:1".into(),
            ..Default::default()
        };
        s.volumes.push(crate::VolumeMount {
            volume: "lw-tools-x".into(),
            target: "/opt/lw".into(),
            read_only: true,
        });
        assert!(shares_nothing(&s, "k").is_ok());
        s.volumes.push(crate::VolumeMount {
            volume: "lw-work-x".into(),
            target: "/work".into(),
            read_only: false,
        });
        let e = shares_nothing(&s, "k").unwrap_err();
        assert_eq!(e.exit, base::error::Exit::Usage);
        assert!(e.msg.contains("'lw-work-x'"), "{}", e.msg);
    }

    #[test]
    fn a_claim_removes_the_pool_label_sets_the_owners_and_is_conditional() {
        let labels = BTreeMap::from([
            ("org.loopwright.sandbox".to_string(), "a".to_string()),
            (
                "org.loopwright.root-path".to_string(),
                "/not a label".to_string(),
            ),
        ]);
        let p = claim_patch("42", &labels);
        let m = &p["metadata"];
        assert_eq!(m["resourceVersion"], "42");
        assert!(m["labels"][POOL_LABEL].is_null());
        assert_eq!(m["labels"]["org.loopwright.sandbox"], "a");
        assert_eq!(m["labels"][pod::MANAGED_BY], pod::MANAGED_BY_VALUE);
        // A value no label can hold is only in the annotation.
        assert!(m["labels"].get("org.loopwright.root-path").is_none());
        let ann: BTreeMap<String, String> =
            serde_json::from_str(m["annotations"][pod::LABELS_ANNOTATION].as_str().unwrap())
                .unwrap();
        assert_eq!(ann, labels);
    }
}
