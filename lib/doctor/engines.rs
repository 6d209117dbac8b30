//! The doctor's engine checks: Docker or Kubernetes, whether the engine sees
//! this host's files, its OCI runtimes, and the shared services on it.

use std::path::Path;

use base::config::Project;
use engine::{DockerEngine, Engine};

use super::{Finding, Status, f};

/// Each shared service (lib/service): its state and the sandboxes using it.
pub(super) fn services(
    root: &Path,
    engine: &DockerEngine,
    project: Option<&Project>,
) -> Vec<Finding> {
    let svc = crate::service::Services::new(root, engine::Pair::docker(engine));
    match svc.list(project) {
        Err(e) => vec![f(
            "service",
            Status::Fail,
            e.to_string(),
            Some("check the engine, then lw-service ls".into()),
        )],
        Ok(list) => list
            .into_iter()
            .map(|s| {
                let users = if s.sandboxes.is_empty() {
                    "no sandbox uses it".to_string()
                } else {
                    format!("used by sandbox(es) {}", s.sandboxes.join(", "))
                };
                let detail = format!(
                    "{} {}{}; {users}",
                    s.name,
                    s.state,
                    if s.detail.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", s.detail)
                    }
                );
                let (status, fix) = match s.state.as_str() {
                    "ready" | "down" => (Status::Ok, None),
                    "orphan" => (Status::Warn, Some("lw-service gc".to_string())),
                    "invalid" => (
                        Status::Fail,
                        Some(format!("fix .loopwright/services/{}", s.name)),
                    ),
                    _ => (Status::Warn, Some(format!("lw-service logs {}", s.name))),
                };
                f("service", status, detail, fix)
            })
            .collect(),
    }
}

/// `engine = kubernetes`: the API server and context, what RBAC lets this
/// user do, the runtime classes, and the two things the API cannot promise
/// (this host's files; NetworkPolicy enforcement, the network plugin's).
pub(super) fn kubernetes(
    kind: base::error::Result<engine::EngineKind>,
    project: Option<&Project>,
) -> Vec<Finding> {
    use engine::{HostPaths, KubeEngine};
    if let Err(e) = kind {
        return vec![f(
            "engine",
            Status::Fail,
            e.to_string(),
            Some("set engine to docker or kubernetes".into()),
        )];
    }
    let e = match KubeEngine::connect_for(project.map(|p| &p.config)) {
        Ok(e) => e,
        Err(err) => {
            return vec![f(
                "engine",
                Status::Fail,
                err.to_string(),
                Some("set KUBECONFIG (or engine.kubeconfig) and engine.context to a reachable cluster".into()),
            )];
        }
    };
    let mut out = Vec::new();
    let t = e.target().clone();
    let v = e
        .version()
        .map(|v| v.version)
        .unwrap_or_else(|err| err.to_string());
    out.push(f(
        "engine",
        Status::Ok,
        format!(
            "kubernetes {v} at {} (context {}, namespace {}, kubeconfig {})",
            t.server, t.context, t.namespace, t.kubeconfig
        ),
        None,
    ));
    out.extend(rbac(&e));
    out.push(f(
        "engine-files",
        Status::Warn,
        format!("the cluster at {} does not share this host's files: remote mode; lw-sandbox create needs the volume transport", e.address()),
        None,
    ));
    out.push(f(
        "kube-network",
        Status::Warn,
        "networks are NetworkPolicy objects (default deny for every pod of loopwright's); whether they are enforced is the cluster network plugin's doing, which the API does not say (the reference bridge plugin enforces none)",
        Some("run a plugin that enforces NetworkPolicy (Calico, Cilium, kube-router)".into()),
    ));
    match e.info() {
        Ok(i) => out.push(f("runtimes", Status::Ok, i.names().join(", "), None)),
        Err(err) => out.push(f("runtimes", Status::Warn, err.to_string(), None)),
    }
    out
}

/// What RBAC lets this user do, against every rule of the client's table
/// (crates/engine/src/kubernetes/access.rs).
fn rbac(e: &engine::KubeEngine) -> Vec<Finding> {
    let asked: Vec<(engine::kubernetes::Rule, Result<bool, String>)> = engine::kubernetes::RULES
        .iter()
        .map(|r| (*r, e.may(r).map_err(|err| err.to_string())))
        .collect();
    rbac_findings(&e.target().namespace, &asked)
}

/// The RBAC findings from each rule's review (`Err`: the review failed).
/// A namespace's rule the sandbox cannot do without fails (`kube-rbac`,
/// granted by a Role); a cluster-wide one never does, since an account
/// bound only to the namespace's Role is a usual setup: it warns
/// (`kube-rbac-cluster`), naming what is lost without it and that only a
/// ClusterRole and a ClusterRoleBinding grant it.
fn rbac_findings(
    ns: &str,
    asked: &[(engine::kubernetes::Rule, Result<bool, String>)],
) -> Vec<Finding> {
    use engine::kubernetes::Scope;
    let (mut denied, mut degraded, mut cluster) = (Vec::new(), Vec::new(), Vec::new());
    for (r, may) in asked {
        let why = match may {
            Ok(true) => continue,
            Ok(false) => None,
            Err(err) => Some(err),
        };
        let what = match why {
            Some(err) => format!("{} {} ({err})", r.verb, r.resource),
            None => format!("{} {}", r.verb, r.resource),
        };
        match r.scope {
            Scope::Cluster => cluster.push(format!("{what}: {}", r.why)),
            Scope::Namespace if r.required => denied.push(what),
            Scope::Namespace => degraded.push(format!("{what}: {}", r.why)),
        }
    }
    let also = if degraded.is_empty() {
        String::new()
    } else {
        format!("; without {}", degraded.join(", "))
    };
    let mut out = vec![if denied.is_empty() {
        f(
            "kube-rbac",
            Status::Ok,
            format!("this user may do all a sandbox needs in namespace {ns}{also}"),
            None,
        )
    } else {
        f(
            "kube-rbac",
            Status::Fail,
            format!(
                "RBAC forbids in namespace {ns}: {}{also}",
                denied.join(", ")
            ),
            Some(format!(
                "grant them with a Role and a RoleBinding in namespace {ns}: lw doctor --kube-role --namespace {ns} | kubectl apply -f -, then kubectl -n {ns} create rolebinding loopwright --role=loopwright --user=USER (or --serviceaccount={ns}:NAME)"
            )),
        )
    }];
    if !cluster.is_empty() {
        out.push(f(
            "kube-rbac-cluster",
            Status::Warn,
            format!(
                "this user may not, cluster-wide: {}",
                cluster.join("; ")
            ),
            Some(format!(
                "optional; a cluster administrator grants them with a ClusterRole and a ClusterRoleBinding (a Role cannot: these resources have no namespace): the ClusterRole loopwright-cluster that lw doctor --kube-role --namespace {ns} prints, then kubectl create clusterrolebinding loopwright-{ns} --clusterrole=loopwright-cluster --user=USER"
            )),
        ));
    }
    out
}

/// `--kube-role`: the Role and ClusterRole the client needs, for namespace
/// `namespace`, else the project's (`engine.namespace`, else its
/// kubeconfig context's), else a placeholder to replace.
pub fn kube_role(cwd: &Path, namespace: Option<String>) -> base::error::Result<String> {
    let ns = match namespace {
        Some(ns) => ns,
        None => {
            let project = wall::config::project(cwd)?;
            engine::KubeEngine::configured_namespace(project.as_ref().map(|p| &p.config))
                .unwrap_or_else(|| "NAMESPACE".to_string())
        }
    };
    Ok(engine::kubernetes::role_yaml(&ns))
}

/// The Docker engine the settings name: the runner, or on Kubernetes the
/// image builder (then one that does not answer only warns: sandboxes
/// still run, from images a registry holds).
pub(super) fn docker(
    out: &mut Vec<Finding>,
    project: Option<&Project>,
    role: super::DockerRole,
) -> Option<DockerEngine> {
    let builder = role == super::DockerRole::Builder;
    let what = if builder {
        "; the image builder paired with the Kubernetes runner"
    } else {
        ""
    };
    match engine::connect_docker(project.map(|p| &p.config))
        .and_then(|e| e.version().map(|v| (e, v)))
    {
        Ok((e, v)) => {
            out.push(f(
                "docker",
                Status::Ok,
                format!("engine {} (API {}) at {}{what}", v.version, v.api, e.host()),
                None,
            ));
            Some(e)
        }
        Err(err) => {
            let fix = if rustix::process::geteuid().is_root() {
                "install and start it: apt-get install -y docker.io && dockerd &"
            } else {
                "ask an administrator to install docker.io and add you to the docker group, or set DOCKER_HOST"
            };
            let status = if builder { Status::Warn } else { Status::Fail };
            out.push(f(
                "docker",
                status,
                format!("{err}{what}"),
                Some(fix.into()),
            ));
            None
        }
    }
}

/// Whether the engine sees this host's files (a nonce written in a temp dir,
/// read back through a bind mount; crates/engine/src/hostpaths.rs), and so which mode
/// sandboxes get.
pub(super) fn host_files(engine: &DockerEngine) -> Finding {
    use engine::hostpaths::{Sharing, probe};
    let tmp = std::env::temp_dir();
    match probe(engine, &tmp) {
        Ok(Sharing::Shared) => f(
            "engine-files",
            Status::Ok,
            format!(
                "the engine at {} sees this host's files (a nonce written in {} read back through a bind mount): local mode, sandboxes bind-mount their mail dir, mirror, clone and tools",
                engine.host(),
                tmp.display()
            ),
            None,
        ),
        Ok(Sharing::Separate) => f(
            "engine-files",
            Status::Ok,
            format!(
                "the engine at {} does not share this host's filesystem (a nonce written in {} was not there through a bind mount): remote mode, sandboxes keep their mail dir, clone and tools in engine volumes and the courier (lw-sandbox courier) carries their mail",
                engine.host(),
                tmp.display()
            ),
            None,
        ),
        Err(e) => f(
            "engine-files",
            Status::Warn,
            format!("cannot tell whether the engine sees this host's files: {e}"),
            None,
        ),
    }
}

/// The runtimes the engine offers (with their isolation level and what
/// limits them here), its security options, `sandbox.runtime` checked
/// against them, and the isolation of each live sandbox.
pub(super) fn runtimes(e: &DockerEngine, project: Option<&Project>) -> Vec<Finding> {
    use engine::{Isolation, SandboxEngine};
    let info = match e.info() {
        Ok(i) => i,
        Err(err) => return vec![f("runtimes", Status::Fail, err.to_string(), None)],
    };
    let local = info.host.starts_with("unix://");
    let list: Vec<String> = info
        .runtimes
        .iter()
        .map(|r| {
            let mut notes = vec![Isolation::of(&r.name).as_str().to_string()];
            if r.name == info.default_runtime {
                notes.insert(0, "default".into());
            }
            if info.runtime_without_network(&r.name) {
                notes.push("network none only".into());
            }
            if !info.runtime_applies_seccomp(&r.name) {
                notes.push("NO --oci-seccomp: refused for sandboxes".into());
            }
            if info.installed(r, local) == Some(false) {
                notes.push(format!("{} not installed", r.path));
            }
            format!("{} ({})", r.name, notes.join(", "))
        })
        .collect();
    let mut out = vec![f(
        "runtimes",
        Status::Ok,
        format!(
            "{} {}: {}; security: {}",
            info.product,
            info.version,
            list.join(", "),
            info.security_names().join(", ")
        ),
        None,
    )];
    if info.runtime(engine::runtime::GVISOR).is_none() {
        out[0].status = Status::Warn;
        out[0].fix = Some(format!(
            "for gVisor (lw-sandbox create --runtime runsc): {}",
            engine::runtime::RUNSC_INSTALL
        ));
    }
    if let Some(want) = project.and_then(|p| p.config.get(crate::sandbox::KEY_RUNTIME))
        && let Err(err) = info.check(want)
    {
        out.push(f(
            "sandbox.runtime",
            Status::Fail,
            err.to_string(),
            Some("fix sandbox.runtime in .loopwright/config or the engine".into()),
        ));
    }
    if let Ok(cs) = e.containers_with_label(crate::sandbox::LABEL_SANDBOX) {
        let mut live: Vec<String> = cs
            .iter()
            .filter(|c| c.running)
            .filter_map(|c| e.inspect(&c.name).ok().flatten())
            .map(|c| {
                let name = c
                    .labels
                    .get(crate::sandbox::LABEL_SANDBOX)
                    .cloned()
                    .unwrap_or(c.name);
                format!(
                    "{name} {}({})",
                    Isolation::of(&c.runtime).as_str(),
                    c.runtime
                )
            })
            .collect();
        live.sort();
        out.push(f(
            "isolation",
            Status::Ok,
            if live.is_empty() {
                "no live sandboxes".to_string()
            } else {
                live.join(", ")
            },
            None,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::kubernetes::{RULES, Scope};

    /// Every rule reviewed: `may` answers for each.
    fn asked(
        may: impl Fn(&engine::kubernetes::Rule) -> bool,
    ) -> Vec<(engine::kubernetes::Rule, Result<bool, String>)> {
        RULES.iter().map(|r| (*r, Ok(may(r)))).collect()
    }

    #[test]
    fn an_account_bound_only_to_the_role_passes_and_is_told_what_it_lacks() {
        // What `lw doctor --kube-role` prints as the Role, and nothing else.
        let found = rbac_findings("team", &asked(|r| r.scope == Scope::Namespace));
        assert_eq!(found[0].check, "kube-rbac");
        assert_eq!(found[0].status, Status::Ok, "{}", found[0].detail);
        let cluster = &found[1];
        assert_eq!(
            (cluster.check, cluster.status),
            ("kube-rbac-cluster", Status::Warn)
        );
        // Each cluster-wide request is named with what is lost without it.
        assert!(
            cluster.detail.contains("list runtimeclasses: the RuntimeClass of sandbox.runtime (without it only the nodes' default runtime, runc: no gVisor)")
                && cluster.detail.contains("list nodes"),
            "{}",
            cluster.detail
        );
        let fix = cluster.fix.as_deref().unwrap();
        assert!(
            fix.contains("ClusterRole and a ClusterRoleBinding") && fix.contains("a Role cannot"),
            "{fix}"
        );
    }

    #[test]
    fn a_namespace_request_refused_fails_and_is_granted_by_a_role() {
        let found = rbac_findings("team", &asked(|r| r.resource != "pods/exec"));
        assert_eq!(found.len(), 1, "every cluster-wide request allowed");
        assert_eq!(found[0].status, Status::Fail);
        assert!(
            found[0].detail.contains("create pods/exec"),
            "{}",
            found[0].detail
        );
        let fix = found[0].fix.as_deref().unwrap();
        assert!(
            fix.contains("a Role and a RoleBinding in namespace team")
                && !fix.contains("ClusterRole"),
            "{fix}"
        );
    }

    #[test]
    fn a_review_that_fails_is_named_with_its_cause() {
        let mut a = asked(|_| true);
        for (r, may) in a.iter_mut() {
            if r.resource == "runtimeclasses" || r.resource == "pods/log" {
                *may = Err("the API server did not answer".into());
            }
        }
        let found = rbac_findings("team", &a);
        assert_eq!(found[0].status, Status::Fail);
        assert!(
            found[0]
                .detail
                .contains("get pods/log (the API server did not answer)"),
            "{}",
            found[0].detail
        );
        assert_eq!(found[1].status, Status::Warn);
        assert!(
            found[1]
                .detail
                .contains("list runtimeclasses (the API server"),
            "{}",
            found[1].detail
        );
    }
}
