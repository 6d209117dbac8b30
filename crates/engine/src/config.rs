//! The engine's keys of `.loopwright/config`: which engine, where, and on
//! Kubernetes its claims and what a pod asks of the scheduler.  The
//! product's commands check them with every other layer's.

use base::config::Keys;

/// The engine's keys: lw-sandbox(1), lw-service(1), lw-build(1).
pub const KEYS: Keys = &[
    "engine",
    "engine.host",
    "engine.kubeconfig",
    "engine.context",
    "engine.namespace",
    // the claims (kubernetes/storage.rs)
    "kube.storage-class",
    "kube.access-mode",
    "kube.tools-access-mode",
    // what a pod asks of the scheduler (kubernetes/pod/spec.rs)
    "kube.cpu-request",
    // the warm pool a create claims from (kubernetes/pool.rs)
    "kube.warm-pool",
];
