//! The single-node cluster of scripts/k8s-cluster for the Kubernetes
//! suites: started under /tmp/lw-k8s.lock with images imported from the
//! Docker engine (no registry), stopped when dropped; its ports are the
//! ones the script chose for its state directory (`Cluster::port`); `None` (and a line
//! saying why) when the cached binaries are absent.  Also what the suites
//! share: a fresh namespace, exec that returns status and output, a pod's
//! address, whether the network components are cached.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use engine::{ExecRequest, KubeEngine, OutStream, SandboxEngine};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;

pub const VERSION: &str = "1.35.4";
pub const IMAGE: &str = "loopwright/test-busybox:latest";

pub fn repo() -> PathBuf {
    crate::workspace()
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
    env: Vec<(String, String)>,
    fresh: Option<PathBuf>,
    _lock: std::fs::File,
}

impl Cluster {
    /// Starts the cluster with `images` imported; `suite` names the caller
    /// in the failure said when it cannot run (the suites are `#[ignore]`d
    /// and run only where the binaries are cached: a run without them is
    /// a failure, never a pass that ran nothing).
    pub fn start(suite: &str, images: &[&str]) -> Option<Cluster> {
        Cluster::start_with(suite, images, &[], false)
    }

    /// [`Cluster::start`] with scripts/k8s-cluster's environment `env`
    /// (such as the registry its containerd trusts); with `fresh`, in a
    /// state directory of its own, removed when dropped, so that its node
    /// holds no image but the pause image (the shared state's containerd
    /// keeps what earlier runs imported).
    pub fn start_with(
        suite: &str,
        images: &[&str],
        env: &[(&str, &str)],
        fresh: bool,
    ) -> Option<Cluster> {
        let mut env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let fresh = fresh.then(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("the clock is after 1970");
            std::env::temp_dir().join(format!("lw-k8s-{suite}-{}", t.as_nanos()))
        });
        if let Some(dir) = &fresh {
            env.push(("LW_K8S_STATE".into(), dir.display().to_string()));
        }
        let missing = missing();
        if !missing.is_empty() {
            panic!(
                "{suite}: CANNOT RUN: Kubernetes {VERSION} is not cached in {} (missing: {}); scripts/k8s-build builds it (about an hour on 2 cores), after which this suite uses it",
                cache_bin().display(),
                missing.join(", ")
            );
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
        let lock = base::fs::lock(Path::new("/tmp/lw-k8s.lock")).expect("the cluster's lock file");
        let t0 = Instant::now();
        let out = Command::new(repo().join("scripts/k8s-cluster"))
            .arg("start")
            .env("LW_K8S_IMAGES", images.join(" "))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/k8s-cluster runs");
        if !out.status.success() {
            // What it started before it failed goes now (a cluster's
            // processes left running took the next suite's CPU).
            let _ = Command::new(repo().join("scripts/k8s-cluster"))
                .arg("stop")
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::null())
                .status();
            if let Some(dir) = &fresh {
                let _ = std::fs::remove_dir_all(dir);
            }
            panic!("scripts/k8s-cluster start failed: {out:?}");
        }
        let kubeconfig = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(
            kubeconfig.exists(),
            "no kubeconfig at {}",
            kubeconfig.display()
        );
        Some(Cluster {
            kubeconfig,
            started_in: t0.elapsed(),
            env,
            fresh,
            _lock: lock,
        })
    }

    pub fn kubeconfig(&self) -> String {
        self.kubeconfig.to_str().unwrap().to_string()
    }

    /// The port scripts/k8s-cluster gave `component` (`apiserver`,
    /// `kubelet`, ...; the `port.NAME` lines of its state's plan).
    pub fn port(&self, component: &str) -> u16 {
        plan_port(&self.kubeconfig, component)
    }

    /// The API server's audit log (scripts/k8s-cluster's policy: every
    /// ServiceAccount's requests, at Metadata level).
    pub fn audit_log(&self) -> PathBuf {
        self.kubeconfig
            .parent()
            .expect("the kubeconfig is in the state dir")
            .join("log/audit.log")
    }

    /// Where the audit log ends now: [`Cluster::audited`] from here.
    pub fn audit_mark(&self) -> u64 {
        std::fs::metadata(self.audit_log()).map_or(0, |m| m.len())
    }

    /// The requests `user` made since `mark` (each audit ID once: a watch
    /// or an exec is logged when its answer starts and again when it
    /// ends), in all and by `VERB RESOURCE[/SUBRESOURCE]`.
    pub fn audited(
        &self,
        mark: u64,
        user: &str,
    ) -> (usize, std::collections::BTreeMap<String, usize>) {
        use std::io::{Read, Seek};
        let mut f = std::fs::File::open(self.audit_log()).unwrap_or_else(|e| {
            panic!(
                "the audit log {}: {e} (scripts/k8s-cluster writes it)",
                self.audit_log().display()
            )
        });
        let len = f.metadata().map_or(0, |m| m.len());
        assert!(
            len >= mark,
            "the audit log {} was rotated since the mark (scripts/k8s-cluster's --audit-log-maxsize)",
            self.audit_log().display()
        );
        f.seek(std::io::SeekFrom::Start(mark)).unwrap();
        let mut text = String::new();
        f.read_to_string(&mut text).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        let mut by = std::collections::BTreeMap::new();
        for l in text.lines() {
            let Ok(ev) = serde_json::from_str::<serde_json::Value>(l) else {
                continue; // a line the API server is still writing
            };
            if ev["user"]["username"] != user {
                continue;
            }
            let id = ev["auditID"].as_str().unwrap_or_default().to_string();
            if !seen.insert(id) {
                continue;
            }
            let o = &ev["objectRef"];
            let res = match (o["resource"].as_str(), o["subresource"].as_str()) {
                (Some(r), Some(s)) => format!("{r}/{s}"),
                (Some(r), None) => r.to_string(),
                _ => ev["requestURI"].as_str().unwrap_or("?").to_string(),
            };
            let key = format!("{} {res}", ev["verb"].as_str().unwrap_or("?"));
            *by.entry(key).or_insert(0) += 1;
        }
        (seen.len(), by)
    }

    /// `ctr ARGS` against the node's containerd (namespace k8s.io): its stdout.
    pub fn ctr(&self, args: &[&str]) -> String {
        let sock = self
            .kubeconfig
            .parent()
            .expect("the kubeconfig is in the state dir")
            .join("containerd.sock");
        let o = Command::new("ctr")
            .arg("-a")
            .arg(&sock)
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .expect("ctr runs");
        assert!(
            o.status.success(),
            "ctr {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
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
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .status();
        if let Some(dir) = &self.fresh {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The port of `component` in the plan of the cluster whose state
/// directory holds `kubeconfig` (scripts/k8s-cluster writes both there).
pub fn plan_port(kubeconfig: &Path, component: &str) -> u16 {
    let plan = kubeconfig
        .parent()
        .expect("the kubeconfig is in the state dir")
        .join("plan");
    let text = std::fs::read_to_string(&plan)
        .unwrap_or_else(|e| panic!("the cluster's plan {}: {e}", plan.display()));
    let key = format!("port.{component} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .unwrap_or_else(|| panic!("{} has no {key}line", plan.display()))
        .parse()
        .expect("a port number")
}

pub use crate::nonce;

/// Whether scripts/k8s-build-net has cached kube-router and kube-proxy, so
/// the cluster enforces NetworkPolicy and routes Services (unless
/// LW_K8S_NO_NETPOL tells scripts/k8s-cluster to leave them out).
pub fn network_cached() -> bool {
    if std::env::var_os("LW_K8S_NO_NETPOL").is_some_and(|v| !v.is_empty()) {
        return false;
    }
    Command::new(repo().join("scripts/k8s-build-net"))
        .env("LW_K8S_ONLY_CACHED", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Makes a namespace named `prefix-NONCE` as `admin`; returns its name.
pub fn namespace(admin: &KubeEngine, prefix: &str) -> String {
    let ns = format!("{prefix}-{}", nonce());
    let namespaces: Api<Namespace> = Api::all(admin.client().clone());
    admin
        .block_on(namespaces.create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.clone()),
                    ..Default::default()
                },
                ..Default::default()
            },
        ))
        .expect("namespace");
    ns
}

/// Runs `cmd` in `pod`: exit status, stdout, stderr.
pub fn run(e: &dyn SandboxEngine, pod: &str, cmd: &[&str]) -> (i64, String, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let req = ExecRequest {
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let code = e
        .exec(pod, &req, &mut |s, b| match s {
            OutStream::Stdout => out.extend_from_slice(b),
            OutStream::Stderr => err.extend_from_slice(b),
        })
        .unwrap_or_else(|e| panic!("exec {cmd:?} in {pod}: {e}"));
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

/// The address of a running pod.
pub fn pod_ip(e: &KubeEngine, pod: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(e.client().clone(), &e.target().namespace);
    e.block_on(pods.get(pod))
        .unwrap()
        .status
        .and_then(|s| s.pod_ip)
        .unwrap_or_else(|| panic!("pod {pod} has no address"))
}

/// A fresh namespace `PREFIX-NONCE` and a ServiceAccount in it bound to
/// exactly what `lw doctor --kube-role --namespace NS` prints (applied by
/// the admin): the path of a kubeconfig that is that account (its token,
/// the namespace its context's), and the namespace.
pub fn service_account<'c>(
    cluster: &'c Cluster,
    prefix: &str,
    dir: &Path,
) -> (PathBuf, String, Gone<'c>) {
    service_account_bound(cluster, prefix, dir, true)
}

/// [`service_account`], bound to the ClusterRole too only when
/// `cluster_wide` (without it: the namespace's Role alone, the usual
/// grant of a namespace's owner).
pub fn service_account_bound<'c>(
    cluster: &'c Cluster,
    prefix: &str,
    dir: &Path,
    cluster_wide: bool,
) -> (PathBuf, String, Gone<'c>) {
    let ns = format!("{prefix}-{}", crate::nonce());
    cluster.kubectl(&["create", "namespace", &ns]);
    let gone = Gone {
        cluster,
        objects: vec![
            format!("namespace/{ns}"),
            format!("clusterrolebinding/loopwright-{ns}"),
        ],
    };
    let role = Command::new(crate::bin("lw-doctor"))
        .args(["--kube-role", "--namespace", &ns])
        .output()
        .expect("lw doctor runs");
    assert!(role.status.success(), "lw doctor --kube-role: {role:?}");
    let role_file = dir.join(format!("{ns}-role.yaml"));
    std::fs::write(&role_file, &role.stdout).unwrap();
    cluster.kubectl(&["apply", "-f", role_file.to_str().unwrap()]);
    cluster.kubectl(&["-n", &ns, "create", "serviceaccount", "lw"]);
    let sa = format!("{ns}:lw");
    cluster.kubectl(&[
        "-n",
        &ns,
        "create",
        "rolebinding",
        "loopwright",
        "--role=loopwright",
        &format!("--serviceaccount={sa}"),
    ]);
    if cluster_wide {
        cluster.kubectl(&[
            "create",
            "clusterrolebinding",
            &format!("loopwright-{ns}"),
            "--clusterrole=loopwright-cluster",
            &format!("--serviceaccount={sa}"),
        ]);
    }
    let token = cluster.kubectl(&["-n", &ns, "create", "token", "lw", "--duration=2h"]);
    let server = cluster.kubectl(&[
        "config",
        "view",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.server}",
    ]);
    let ca = cluster.kubectl(&[
        "config",
        "view",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.certificate-authority}",
    ]);
    let kc = dir.join(format!("{ns}.kubeconfig"));
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters: [{{name: lw, cluster: {{server: \"{server}\", certificate-authority: \"{ca}\"}}}}]\n\
             users: [{{name: lw, user: {{token: \"{}\"}}}}]\n\
             contexts: [{{name: lw, context: {{cluster: lw, user: lw, namespace: {ns}}}}}]\n\
             current-context: lw\n",
            token.trim()
        ),
    )
    .unwrap();
    (kc, ns, gone)
}

/// Cluster objects deleted when dropped (whatever the test's outcome: the
/// cluster's state outlives the run).
pub struct Gone<'c> {
    cluster: &'c Cluster,
    objects: Vec<String>,
}

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        for o in &self.objects {
            let _ = Command::new(cache_bin().join("kubectl"))
                .arg("--kubeconfig")
                .arg(&self.cluster.kubeconfig)
                .args(["delete", o, "--ignore-not-found", "--wait=true"])
                .output();
        }
    }
}

/// The image of the project at `proj` (lw-build's, on the Docker engine),
/// for a cluster to import.
pub fn project_image(proj: &Path) -> String {
    let project = wall::config::project(proj)
        .unwrap()
        .expect("the fixture is a project");
    let docker = engine::connect_docker(None).expect("the Docker engine is reachable");
    loopwright::sandbox::resolve_image(&docker, Some(&project), None, false)
        .expect("the fixture's image is built")
        .reference
}

/// What of root `root_id` is left in namespace `ns`, through the API:
/// every kind loopwright makes (pods, claims, policies, configmaps,
/// Services, Secrets) labelled with the root, and the PersistentVolumes
/// bound to its claims (`lw-sb-ROOTID-...`), which the provisioner deletes
/// after their claim: waited for (bounded) until none is left.  One name
/// a line; `keep` drops the lines that contain it (the tools claim, where
/// the root's is to stay).
pub fn leftovers(cluster: &Cluster, ns: &str, root_id: &str, keep: Option<&str>) -> String {
    let t = Instant::now();
    loop {
        let mut left = cluster.kubectl(&[
            "-n",
            ns,
            "get",
            "pods,pvc,networkpolicies,configmaps,services,secrets",
            "-l",
            &format!("org.loopwright.root={root_id}"),
            "-o",
            "name",
        ]);
        let pvs = cluster.kubectl(&[
            "get",
            "pv",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.claimRef.namespace} {.spec.claimRef.name}{\"\\n\"}{end}",
        ]);
        for l in pvs.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if let [pv, claim_ns, claim] = f[..]
                && claim_ns == ns
                && claim.starts_with(&format!("lw-sb-{root_id}-"))
            {
                left += &format!("persistentvolume/{pv} (claim {claim})\n");
            }
        }
        let left: String = left
            .lines()
            .filter(|l| keep.is_none_or(|k| !l.contains(k)))
            .map(|l| format!("{l}\n"))
            .collect();
        if left.is_empty() || t.elapsed() > std::time::Duration::from_secs(60) {
            return left;
        }
        // Claims and volumes go after their last pod, by the controllers:
        // no event of ours to wait on.
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}
