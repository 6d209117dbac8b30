//! A warm pool (docs/scale.md): pods made ahead from one spec, each
//! claimed by one caller for good.
//!
//! A pool is named by [`pool_key`], a hash of everything in the spec but
//! its name and labels (image, user, limits, mounts, runtime, command) and
//! of the claims each pod gets of its own, and its pods carry it in
//! [`POOL_LABEL`].  [`KubeEngine::pool_fill`] makes pods until the pool
//! holds `n`: each is named here (`lw-pool-KEY-` and ten random hex
//! digits) so that its own claims ([`OwnClaim`]: `POD-work`, `POD-mail`)
//! are made before it, labelled with the pool and with the pod in
//! [`POOL_POD_LABEL`].  [`KubeEngine::pool_claim`] takes a running one by
//! patching its labels (the pool label removed, the caller's set) with the
//! resourceVersion it listed as a precondition: two claims of one pod both
//! send the same version, the API server applies the first and answers the
//! second 409, and the loser tries the next pod.  The winner then gives
//! the pod's own claims the caller's labels too, so they are found, kept
//! and removed as the caller's volumes.  A claimed pod is never returned:
//! it leaves the pool's selector with the patch that gives it its owner.
//! Nothing is shared between a pool's pods: each is made from the spec
//! alone, a writable volume in it is refused, and what a pod may write
//! outside its scratch is its own claims.
//!
//! Idle, a pool costs no request: no exec, no watch; a claim is one list
//! and one patch, and one more patch per own claim.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use sha2::{Digest, Sha256};

use super::{KubeEngine, pod};
use crate::{Claimed, ContainerSpec, ExecRequest, OwnClaim, VolumeMount, WarmPool, pool_key};
use base::error::{Error, Result};

/// The `.loopwright/config` key of the pool's size: how many ready pods a
/// pool keeps for `create` to claim (0, the default: none).
pub const WARM_POOL_KEY: &str = "kube.warm-pool";
/// The label a pool's pods carry: the pool's key.
pub const POOL_LABEL: &str = "org.loopwright.pool";
/// The label on a pool pod's own claims while it is in the pool: the pod.
pub const POOL_POD_LABEL: &str = "org.loopwright.pool-pod";
/// The annotation of a claimed pod that holds its sandbox's variables
/// (a JSON list of `KEY=VALUE`), which every exec in it is given first
/// (sandbox.rs): a pod's spec cannot take them after it is made.
pub const ENV_ANNOTATION: &str = "loopwright.org/env";

/// A name for a new pod of pool `key`: the key and ten random hex digits.
fn pod_name(key: &str) -> String {
    let r = base::id::random128().to_le_bytes();
    format!("lw-pool-{key}-{}", base::digest::hex(&r[..5]))
}

/// A suffix an own claim may have: `-` and lowercase letters and digits,
/// so that `POD` and it make a valid claim name.
fn valid_suffix(s: &str) -> bool {
    s.len() > 1
        && s.len() <= 16
        && s.starts_with('-')
        && s[1..]
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// The merge patch that gives an object `labels`: the pool's labels
/// removed, `labels` (the valid ones) set and recorded in full in the
/// labels annotation; with `rv`, that version a precondition (a pod's
/// claim).
fn claim_patch(rv: Option<&str>, labels: &BTreeMap<String, String>) -> serde_json::Value {
    let mut set = serde_json::Map::new();
    set.insert(POOL_LABEL.into(), serde_json::Value::Null);
    set.insert(POOL_POD_LABEL.into(), serde_json::Value::Null);
    for (k, v) in pod::object_labels(labels) {
        set.insert(k, v.into());
    }
    let mut meta = serde_json::json!({
        "labels": set,
        "annotations": {
            pod::LABELS_ANNOTATION: serde_json::to_string(labels).unwrap_or_default(),
        },
    });
    if let Some(rv) = rv {
        meta["resourceVersion"] = rv.into();
    }
    serde_json::json!({ "metadata": meta })
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

    /// Makes pods from `spec` (its name ignored), each with claims `own`
    /// of its own, until pool [`pool_key`]`(spec, own)` holds `n`; returns
    /// the names made.  A pod's claims are made before it, and removed
    /// again when the pod cannot be made.  It does not wait for the pods
    /// to run: a claim takes only running ones.
    pub fn pool_fill(
        &self,
        spec: &ContainerSpec,
        own: &[OwnClaim],
        n: usize,
    ) -> Result<Vec<String>> {
        self.fill_at_most(spec, own, n, None)
    }

    /// [`KubeEngine::pool_fill`], making at most `most` pods (`None`: as
    /// many as the pool lacks): the courier refills a few at a time, so
    /// mail keeps moving while a large pool fills.
    fn fill_at_most(
        &self,
        spec: &ContainerSpec,
        own: &[OwnClaim],
        n: usize,
        most: Option<usize>,
    ) -> Result<Vec<String>> {
        let key = pool_key(spec, own);
        shares_nothing(spec, &key)?;
        if let Some(c) = own.iter().find(|c| !valid_suffix(&c.suffix)) {
            return Err(Error::usage(format!(
                "cannot fill the pool '{key}': its own claim's suffix '{}' is not '-' and up to 15 lowercase letters or digits",
                c.suffix.escape_debug()
            )));
        }
        let have = self.pool_list(&key)?.len();
        let n = n.min(have.saturating_add(most.unwrap_or(usize::MAX)));
        let mut s = spec.clone();
        s.labels.insert(POOL_LABEL.into(), key.clone());
        let runtime_class = self.pool_runtime_class(spec)?;
        if (have..n).next().is_some() {
            self.ensure_default_deny()?;
        }
        let what = format!("cannot fill the pool '{key}'");
        let mut made = Vec::new();
        for _ in have..n {
            let name = pod_name(&key);
            let mut one = s.clone();
            one.name = Some(name.clone());
            let mut claims = Vec::new();
            let pod = (|| -> Result<Pod> {
                // The spec's labels too (a sandbox's root): what is the
                // root's is found by its label, in the pool or not.
                let mut labels = spec.labels.clone();
                labels.insert(POOL_LABEL.to_string(), key.clone());
                labels.insert(POOL_POD_LABEL.to_string(), name.clone());
                for c in own {
                    let claim = format!("{name}{}", c.suffix);
                    let pvc = self.storage().claim(&claim, &labels);
                    self.block_on(self.claims().create(&PostParams::default(), &pvc))
                        .map_err(|e| self.err("create", "persistentvolumeclaims", &what, e))?;
                    claims.push(claim.clone());
                    one.volumes.push(VolumeMount {
                        volume: claim,
                        target: c.target.clone(),
                        read_only: false,
                    });
                }
                let p = pod::pod_of(&one, runtime_class.clone(), self.cpu_request)?;
                self.block_on(self.pods().create(&PostParams::default(), &p))
                    .map_err(|e| self.err("create", "pods", &what, e))
            })();
            match pod {
                Ok(_) => made.push(name),
                Err(e) => {
                    for c in &claims {
                        let _ = self.block_on(self.claims().delete(c, &DeleteParams::default()));
                    }
                    return Err(e);
                }
            }
        }
        Ok(made)
    }

    fn pool_runtime_class(&self, spec: &ContainerSpec) -> Result<Option<String>> {
        match spec.runtime.as_deref() {
            None => Ok(None),
            Some(r) => self.runtime_class(r),
        }
    }

    /// Takes a running pod of pool `key` for good, giving it and its own
    /// claims `labels`; `None` when the pool has none running (the caller
    /// makes its pod the ordinary way).  A pod another claim took first
    /// (409) sends this one to the next.
    pub fn pool_claim(
        &self,
        key: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<Option<Claimed>> {
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
            let claims = own_claims(&p);
            let (Some(name), Some(rv)) = (p.metadata.name, p.metadata.resource_version) else {
                continue;
            };
            let patch = Patch::Merge(claim_patch(Some(&rv), labels));
            match self.block_on(self.pods().patch(&name, &PatchParams::default(), &patch)) {
                Ok(_) => {}
                // Claimed (409) or deleted (404) since the list.
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => continue,
                Err(e) => return Err(self.err("patch", "pods", &what, e)),
            }
            // The pod is ours: only this call patches its claims.
            let patch = Patch::Merge(claim_patch(None, labels));
            for c in &claims {
                self.block_on(self.claims().patch(c, &PatchParams::default(), &patch))
                    .map_err(|e| {
                        self.err(
                            "patch",
                            "persistentvolumeclaims",
                            &format!(
                                "{what}: the pod '{name}' is claimed but its claim '{c}' is not"
                            ),
                            e,
                        )
                    })?;
            }
            return Ok(Some(Claimed { pod: name, claims }));
        }
        Ok(None)
    }

    /// Deletes every pod of pool `key` (`None`: of every pool) and the
    /// claims still in the pool (a claimed pod's are its owner's) without
    /// waiting; returns how many pods it asked to delete.
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
        let claims = self
            .block_on(self.claims().list(&lp))
            .map_err(|e| self.err("list", "persistentvolumeclaims", &what, e))?;
        for c in claims.items.iter().filter_map(in_pool) {
            match self.block_on(self.claims().delete(c, &DeleteParams::default())) {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(self.err("delete", "persistentvolumeclaims", &what, e)),
            }
        }
        Ok(n)
    }
}

impl WarmPool for KubeEngine {
    fn pool_size(&self) -> usize {
        self.warm_pool
    }

    fn fill(
        &self,
        spec: &ContainerSpec,
        own: &[OwnClaim],
        n: usize,
        most: Option<usize>,
    ) -> Result<Vec<String>> {
        self.fill_at_most(spec, own, n, most)
    }

    fn claim(&self, key: &str, labels: &BTreeMap<String, String>) -> Result<Option<Claimed>> {
        self.pool_claim(key, labels)
    }

    fn set_env(&self, container: &str, env: &[String]) -> Result<()> {
        let what = format!("cannot give the claimed pod '{container}' its sandbox's variables");
        let value = serde_json::to_string(env).unwrap_or_default();
        let patch = serde_json::json!({"metadata": {"annotations": {ENV_ANNOTATION: value}}});
        self.block_on(
            self.pods()
                .patch(container, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .map_err(|e| self.err("patch", "pods", &what, e))?;
        Ok(())
    }

    fn pool_keys(&self, label: &str) -> Result<Vec<String>> {
        let sel = format!("{POOL_LABEL},{}", pod::selector(label)?);
        let what = format!("cannot list the pools '{sel}'");
        let list = self
            .block_on(self.pods().list(&ListParams::default().labels(&sel)))
            .map_err(|e| self.err("list", "pods", &what, e))?;
        let keys: std::collections::BTreeSet<String> = list
            .items
            .iter()
            .filter_map(|p| p.metadata.labels.as_ref()?.get(POOL_LABEL).cloned())
            .collect();
        Ok(keys.into_iter().collect())
    }

    fn drain(&self, key: &str) -> Result<usize> {
        self.pool_drain(Some(key))
    }
}

/// `req` with the variables a claimed pool pod was given
/// ([`ENV_ANNOTATION`]) before its own, which win: a pod's spec
/// cannot take a sandbox's variables after it is made (pool.rs).
pub(super) fn with_pod_env<'r>(
    p: &Pod,
    req: &'r ExecRequest,
) -> Result<std::borrow::Cow<'r, ExecRequest>> {
    let Some(v) = p
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ENV_ANNOTATION))
    else {
        return Ok(std::borrow::Cow::Borrowed(req));
    };
    let mut env: Vec<String> = serde_json::from_str(v).map_err(|e| {
        Error::data(format!(
            "pod '{}': its annotation {} is not a JSON list of KEY=VALUE ({e})",
            p.metadata.name.as_deref().unwrap_or_default(),
            ENV_ANNOTATION
        ))
    })?;
    env.retain(|e| e.split_once('=').is_some_and(|(k, _)| !k.is_empty()));
    env.extend(req.env.iter().cloned());
    Ok(std::borrow::Cow::Owned(ExecRequest {
        env,
        cmd: req.cmd.clone(),
        user: req.user.clone(),
        workdir: req.workdir.clone(),
    }))
}

/// The claims pool pod `p` made with it: those it mounts whose names are
/// its own followed by a suffix (not the root's shared tools claim).
fn own_claims(p: &Pod) -> Vec<String> {
    let Some(name) = p.metadata.name.as_deref() else {
        return vec![];
    };
    let prefix = format!("{name}-");
    p.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .filter(|c| {
            c.strip_prefix(&prefix)
                .is_some_and(|s| valid_suffix(&format!("-{s}")))
        })
        .collect()
}

/// The name of claim `c` when it is still a pool pod's (it names its pod).
fn in_pool(c: &PersistentVolumeClaim) -> Option<&String> {
    let labels = c.metadata.labels.as_ref()?;
    labels.get(POOL_POD_LABEL)?;
    c.metadata.name.as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_with(env: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("lw-pool-k-0".into());
        if let Some(v) = env {
            p.metadata.annotations = Some(std::collections::BTreeMap::from([(
                ENV_ANNOTATION.to_string(),
                v.to_string(),
            )]));
        }
        p
    }

    #[test]
    fn a_claimed_pods_variables_come_first_and_the_execs_own_win() {
        let req = ExecRequest {
            cmd: vec!["printenv".into()],
            env: vec!["TERM=xterm".into(), "LW_SANDBOX=mine".into()],
            ..Default::default()
        };
        let p = pod_with(Some(
            r#"["LW_SANDBOX=b1","PATH=/lw/bin:/bin","=x","NOEQUALS"]"#,
        ));
        let got = with_pod_env(&p, &req).unwrap();
        // Entries that are no assignment (`env` would take them for the
        // command) are dropped; the exec's own come last, so they win.
        assert_eq!(
            got.env,
            [
                "LW_SANDBOX=b1",
                "PATH=/lw/bin:/bin",
                "TERM=xterm",
                "LW_SANDBOX=mine"
            ]
        );
        assert_eq!(
            super::super::sandbox::wrapped(&got),
            [
                "env",
                "LW_SANDBOX=b1",
                "PATH=/lw/bin:/bin",
                "TERM=xterm",
                "LW_SANDBOX=mine",
                "printenv"
            ]
        );
        // A pod never claimed: the request as it was.
        assert_eq!(with_pod_env(&pod_with(None), &req).unwrap().env, req.env);
        // An annotation that is no list of strings: 65, naming the pod.
        let e = with_pod_env(&pod_with(Some("{\"a\":1}")), &req).unwrap_err();
        assert_eq!(e.exit, base::error::Exit::DataErr);
        assert!(e.msg.contains("lw-pool-k-0"), "{}", e.msg);
    }

    #[test]
    fn a_pool_pods_name_and_its_claims_names_are_valid() {
        let a = ContainerSpec {
            image: "busybox:1".into(),
            ..Default::default()
        };
        assert!(pod::valid_label_value(&pool_key(&a, &[])));
        let work = OwnClaim {
            suffix: "-work".into(),
            target: "/work".into(),
        };
        let name = pod_name(&pool_key(&a, std::slice::from_ref(&work)));
        assert_eq!(name.len(), "lw-pool-".len() + 16 + 1 + 10);
        assert!(pod::check_name("pod", &name).is_ok());
        assert!(pod::check_name("volume", &format!("{name}{}", work.suffix)).is_ok());
        assert_ne!(name, pod_name(&pool_key(&a, &[work])));
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
        let p = claim_patch(Some("42"), &labels);
        let m = &p["metadata"];
        assert_eq!(m["resourceVersion"], "42");
        assert!(m["labels"][POOL_LABEL].is_null());
        assert!(m["labels"][POOL_POD_LABEL].is_null());
        // An own claim's patch has no precondition: the pod's was it.
        assert!(
            claim_patch(None, &labels)["metadata"]
                .get("resourceVersion")
                .is_none()
        );
        assert_eq!(m["labels"]["org.loopwright.sandbox"], "a");
        assert_eq!(m["labels"][pod::MANAGED_BY], pod::MANAGED_BY_VALUE);
        // A value no label can hold is only in the annotation.
        assert!(m["labels"].get("org.loopwright.root-path").is_none());
        let ann: BTreeMap<String, String> =
            serde_json::from_str(m["annotations"][pod::LABELS_ANNOTATION].as_str().unwrap())
                .unwrap();
        assert_eq!(ann, labels);
    }

    #[test]
    fn a_pods_own_claims_are_those_named_after_it_and_no_shared_one() {
        use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, PodSpec, Volume};
        let vol = |claim: &str| Volume {
            name: format!("v-{claim}"),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                read_only: None,
            }),
            ..Default::default()
        };
        let mut p = Pod::default();
        p.metadata.name = Some("lw-pool-k-0123456789".into());
        p.spec = Some(PodSpec {
            volumes: Some(vec![
                vol("lw-pool-k-0123456789-work"),
                vol("lw-pool-k-0123456789-mail"),
                vol("lw-sb-root-tools-k"),
                // Another pod's, whose name starts as this one's does.
                vol("lw-pool-k-0123456789-x-work"),
                vol("lw-pool-k-0123456789-"),
            ]),
            ..Default::default()
        });
        assert_eq!(
            own_claims(&p),
            ["lw-pool-k-0123456789-work", "lw-pool-k-0123456789-mail"]
        );
        for bad in [
            "",
            "-",
            "work",
            "-Work",
            "-a.b",
            "-a-b",
            "-0123456789abcdef",
        ] {
            assert!(!valid_suffix(bad), "{bad}");
        }
    }

    #[test]
    fn only_claims_that_still_name_a_pool_pod_are_drained() {
        let claim = |labels: &[(&str, &str)]| {
            let mut c = PersistentVolumeClaim::default();
            c.metadata.name = Some("c".into());
            c.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            c
        };
        let pooled = claim(&[(POOL_LABEL, "k"), (POOL_POD_LABEL, "lw-pool-k-1")]);
        assert_eq!(in_pool(&pooled).map(String::as_str), Some("c"));
        // Claimed: the owner's labels, no pool pod.
        let owned = claim(&[("org.loopwright.sandbox", "a")]);
        assert_eq!(in_pool(&owned), None);
    }
}
