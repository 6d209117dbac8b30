//! The single-node cluster of scripts/k8s-cluster for the Kubernetes
//! suites: started under /tmp/lw-k8s.lock with images imported from the
//! Docker engine (no registry), stopped when dropped; `None` (and a line
//! saying why) when the cached binaries are absent.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

pub const VERSION: &str = "1.35.4";

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn cache_bin() -> PathBuf {
    let cache = std::env::var("LW_K8S_CACHE").unwrap_or_else(|_| "/opt/loopwright-k8s".into());
    Path::new(&cache).join(VERSION).join("bin")
}

/// The binaries the cluster needs that are not cached.
pub fn missing() -> Vec<&'static str> {
    [
        "kube-apiserver",
        "kubelet",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
    ]
    .into_iter()
    .filter(|b| !cache_bin().join(b).exists())
    .collect()
}

/// The cluster, stopped (and its pods deleted) when dropped.
pub struct Cluster {
    pub kubeconfig: PathBuf,
    /// Start time: node Ready with the images imported.
    pub started_in: std::time::Duration,
    _lock: std::fs::File,
}

impl Cluster {
    /// Starts the cluster with `images` imported; `suite` names the caller
    /// in the line said when it cannot run.
    pub fn start(suite: &str, images: &[&str]) -> Option<Cluster> {
        let missing = missing();
        if !missing.is_empty() {
            eprintln!(
                "{suite}: CANNOT RUN: Kubernetes {VERSION} is not cached in {} (missing: {}); scripts/k8s-build builds it (about an hour on 2 cores), after which this suite uses it",
                cache_bin().display(),
                missing.join(", ")
            );
            return None;
        }
        for tool in ["containerd", "ctr", "docker", "setpriv"] {
            assert!(
                Command::new("sh")
                    .args(["-c", &format!("command -v {tool}")])
                    .stdout(Stdio::null())
                    .status()
                    .unwrap()
                    .success(),
                "{suite}: {tool} is not installed, so the cluster cannot start: apt-get install containerd docker.io util-linux"
            );
        }
        let lock =
            loopwright::fs::lock(Path::new("/tmp/lw-k8s.lock")).expect("the cluster's lock file");
        let t0 = Instant::now();
        let out = Command::new(repo().join("scripts/k8s-cluster"))
            .arg("start")
            .env("LW_K8S_IMAGES", images.join(" "))
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/k8s-cluster runs");
        assert!(
            out.status.success(),
            "scripts/k8s-cluster start failed: {out:?}"
        );
        let kubeconfig = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(
            kubeconfig.exists(),
            "no kubeconfig at {}",
            kubeconfig.display()
        );
        Some(Cluster {
            kubeconfig,
            started_in: t0.elapsed(),
            _lock: lock,
        })
    }

    /// `kubectl ARGS` against the cluster: its stdout (it must succeed).
    pub fn kubectl(&self, args: &[&str]) -> String {
        let o = Command::new(cache_bin().join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .expect("kubectl runs");
        assert!(
            o.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/k8s-cluster"))
            .arg("stop")
            .stdout(Stdio::null())
            .status();
    }
}
