//! The warm-pool contract (docs/scale.md): ready containers made ahead
//! from one spec, each taken for good by one create.  Kubernetes keeps one
//! (crates/engine/src/kubernetes/pool.rs); Docker does not need one (a
//! container starts there in well under a second).

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::ContainerSpec;
use base::error::Result;

/// A claim each pod of a pool gets of its own, made with it: named the
/// pod's name and `suffix` (`-work`, or `-mail`, sized `sandbox.mail-disk`
/// as a sandbox's: storage.rs), mounted writable at `target`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OwnClaim {
    pub suffix: String,
    pub target: String,
}

/// A pod taken from a pool, and its own claims, now the caller's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimed {
    pub pod: String,
    pub claims: Vec<String>,
}

/// The pool a spec's pods belong to, each with claims `own`: the first 16
/// hex digits of a SHA-256 of the spec without its name and labels (the
/// parts a claim gives) and of `own`.
pub fn pool_key(spec: &ContainerSpec, own: &[OwnClaim]) -> String {
    let mut s = spec.clone();
    s.name = None;
    s.labels = BTreeMap::new();
    // Debug of the spec is stable: its maps are BTreeMaps.
    let digest = Sha256::digest(format!("{s:?}\n{own:?}").as_bytes());
    base::digest::hex(&digest[..8])
}

/// A pool of ready containers (on Kubernetes, pods) a create claims
/// instead of making its own: [`crate::SandboxEngine::warm_pool`].
pub trait WarmPool {
    /// How many ready containers each pool keeps (`kube.warm-pool`).
    fn pool_size(&self) -> usize;
    /// Makes containers from `spec`, each with claims `own`, until pool
    /// [`pool_key`]`(spec, own)` holds `n`, at most `most` of them (`None`:
    /// as many as it lacks); returns the names made.  It does not wait for
    /// them to run.
    fn fill(
        &self,
        spec: &ContainerSpec,
        own: &[OwnClaim],
        n: usize,
        most: Option<usize>,
    ) -> Result<Vec<String>>;
    /// Takes a running container of pool `key` for good, giving it and its
    /// own claims `labels`; `None` when none runs.
    fn claim(&self, key: &str, labels: &BTreeMap<String, String>) -> Result<Option<Claimed>>;
    /// Gives claimed `container` the variables `env` (`KEY=VALUE`): every
    /// exec in it gets them, before the exec's own.  Its spec cannot take
    /// them after it is made.
    fn set_env(&self, container: &str, env: &[String]) -> Result<()>;
    /// The keys of the pools whose containers carry `label` (`key=value`).
    fn pool_keys(&self, label: &str) -> Result<Vec<String>>;
    /// Removes pool `key`'s containers and the claims still in the pool;
    /// returns how many containers it removed.
    fn drain(&self, key: &str) -> Result<usize>;
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
        assert_eq!(pool_key(&a, &[]), pool_key(&b, &[]));
        assert_eq!(pool_key(&a, &[]).len(), 16);
        let mut c = a.clone();
        c.image = "busybox:2".into();
        assert_ne!(pool_key(&a, &[]), pool_key(&c, &[]));
        let mut d = a.clone();
        d.memory_bytes = Some(128 << 20);
        assert_ne!(pool_key(&a, &[]), pool_key(&d, &[]));
        let mut e = a.clone();
        e.env.push("LW_SANDBOX=a".into());
        assert_ne!(pool_key(&a, &[]), pool_key(&e, &[]));
        let work = OwnClaim {
            suffix: "-work".into(),
            target: "/work".into(),
        };
        assert_ne!(pool_key(&a, &[]), pool_key(&a, std::slice::from_ref(&work)));
    }
}
