//! What this user may do, as the API server's own review says, and what a
//! sandbox's life asks of it: [`RULES`], the one table both the client's
//! calls (a test reads this module's sources and finds each of them there)
//! and `lw doctor`'s review and `--kube-role` are made from.

use std::collections::BTreeMap;

use kube::Api;
use kube::api::PostParams;

use super::KubeEngine;
use base::error::Result;

impl KubeEngine {
    /// Whether this user may `verb` the `resource` (`pods`, `pods/exec`) in
    /// the engine's namespace, as the API server's own review says.
    pub fn can(&self, verb: &str, resource: &str) -> Result<bool> {
        let rule = RULES.iter().find(|r| r.resource == resource);
        let group = rule.map_or("", |r| r.group);
        let scope = rule.map_or(Scope::Namespace, |r| r.scope);
        self.review(verb, group, resource, scope)
    }

    /// Whether this user may do `rule` (in the engine's namespace, or the
    /// cluster's for a [`Scope::Cluster`] one).
    pub fn may(&self, rule: &Rule) -> Result<bool> {
        self.review(rule.verb, rule.group, rule.resource, rule.scope)
    }

    fn review(&self, verb: &str, group: &str, resource: &str, scope: Scope) -> Result<bool> {
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
        };
        let (res, sub) = match resource.split_once('/') {
            Some((r, s)) => (r, Some(s.to_string())),
            None => (resource, None),
        };
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: (scope == Scope::Namespace).then(|| self.target.namespace.clone()),
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

/// Where a rule applies: the engine's namespace (a Role), or the cluster
/// (a ClusterRole: the resource has no namespace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Namespace,
    Cluster,
}

/// One thing the client asks of the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub verb: &'static str,
    /// A resource, or `resource/subresource`.
    pub resource: &'static str,
    /// The API group (`""`: the core group).
    pub group: &'static str,
    pub scope: Scope,
    /// Whether a sandbox's life fails without it (else something degrades
    /// and says so).
    pub required: bool,
    /// What the client does with it.
    pub why: &'static str,
}

const fn ns(verb: &'static str, resource: &'static str, why: &'static str) -> Rule {
    Rule {
        verb,
        resource,
        group: "",
        scope: Scope::Namespace,
        required: true,
        why,
    }
}

const NETPOL: &str = "networking.k8s.io";

/// Every request the client makes: the single source of what to grant.
pub const RULES: &[Rule] = &[
    ns(
        "create",
        "pods",
        "a sandbox, a helper, the egress proxy (also as a dry run)",
    ),
    ns("get", "pods", "start, inspect, exec's user, a pod's end"),
    ns(
        "list",
        "pods",
        "containers by label, a network's members; a pod and the version to watch it from",
    ),
    ns(
        "watch",
        "pods",
        "wait for a pod to run or be gone; an exec's pod dying",
    ),
    ns("delete", "pods", "stop, remove"),
    ns(
        "patch",
        "pods",
        "connect/disconnect a network, the label a Service selects",
    ),
    ns(
        "create",
        "pods/exec",
        "exec (the WebSocket upgrade, Kubernetes 1.35 on)",
    ),
    ns(
        "get",
        "pods/exec",
        "exec (the WebSocket upgrade, before 1.35)",
    ),
    ns("get", "pods/log", "logs"),
    ns(
        "create",
        "configmaps",
        "a stopped pod's manifest, kept to start again",
    ),
    ns("get", "configmaps", "start or inspect a stopped pod"),
    ns("list", "configmaps", "stopped containers by label"),
    ns("delete", "configmaps", "start or remove a stopped pod"),
    ns(
        "create",
        "persistentvolumeclaims",
        "a named volume (workspace, mail, tools)",
    ),
    ns(
        "list",
        "persistentvolumeclaims",
        "volumes by label (rm, gc)",
    ),
    ns(
        "delete",
        "persistentvolumeclaims",
        "remove a volume (rm, gc)",
    ),
    ns(
        "patch",
        "persistentvolumeclaims",
        "a warm pool pod's own claims, given to the sandbox that claims it",
    ),
    ns("create", "services", "publish: the egress proxy's name"),
    ns("get", "services", "publish: one made before"),
    ns("delete", "services", "unpublish"),
    ns(
        "create",
        "secrets",
        "a registry's pull secret, the first time (server-side apply)",
    ),
    ns(
        "patch",
        "secrets",
        "a registry's pull secret, brought up to date",
    ),
    Rule {
        group: NETPOL,
        ..ns("create", "networkpolicies", "a network; the default deny")
    },
    Rule {
        group: NETPOL,
        ..ns("get", "networkpolicies", "inspect a network")
    },
    Rule {
        group: NETPOL,
        ..ns("list", "networkpolicies", "networks by label")
    },
    Rule {
        group: NETPOL,
        ..ns("delete", "networkpolicies", "remove a network")
    },
    Rule {
        scope: Scope::Cluster,
        required: false,
        ..ns(
            "list",
            "nodes",
            "the images the nodes report (create needs it not: a pod's own status says its node cannot get the image)",
        )
    },
    Rule {
        group: "node.k8s.io",
        scope: Scope::Cluster,
        required: false,
        ..ns(
            "list",
            "runtimeclasses",
            "the RuntimeClass of sandbox.runtime (without it only the nodes' default runtime, runc: no gVisor)",
        )
    },
    Rule {
        scope: Scope::Cluster,
        required: false,
        ..ns(
            "get",
            "namespaces",
            "the cluster's identity (kube-system's uid; else its address)",
        )
    },
    Rule {
        group: "authorization.k8s.io",
        scope: Scope::Cluster,
        required: false,
        ..ns(
            "create",
            "selfsubjectaccessreviews",
            "lw doctor's review (every user may)",
        )
    },
];

/// Where `verb` on `resource` applies, as [`RULES`] says (a request the
/// table lacks is taken for the namespace's: the table's test keeps every
/// request in it).
pub fn scope_of(verb: &str, resource: &str) -> Scope {
    RULES
        .iter()
        .find(|r| r.verb == verb && r.resource == resource)
        .map_or(Scope::Namespace, |r| r.scope)
}

/// How what `scope` holds is granted: a Role and RoleBinding in
/// `namespace`, or, for a resource without a namespace, a ClusterRole and
/// ClusterRoleBinding, which a Role cannot stand in for.
pub fn grant(scope: Scope, namespace: &str) -> String {
    match scope {
        Scope::Namespace => format!(
            "grant it with a Role and a RoleBinding in namespace '{namespace}' (lw doctor --kube-role prints the Role)"
        ),
        Scope::Cluster => "grant it with a ClusterRole and a ClusterRoleBinding, which a cluster administrator makes (a Role cannot: the resource has no namespace; lw doctor --kube-role prints the ClusterRole)".to_string(),
    }
}

/// The Role (namespace `namespace`) and ClusterRole that grant [`RULES`], as
/// YAML for `kubectl apply -f -`, with how to bind them in comments.
pub fn role_yaml(namespace: &str) -> String {
    let mut out = String::from(
        "# What loopwright's client asks of the API server (lw doctor --kube-role).\n\
         # Bind both to the user or ServiceAccount that runs lw-sandbox, e.g.:\n",
    );
    out += &format!(
        "#   kubectl -n {namespace} create rolebinding loopwright --role=loopwright --serviceaccount={namespace}:NAME\n\
         #   kubectl create clusterrolebinding loopwright-{namespace} --clusterrole=loopwright-cluster --serviceaccount={namespace}:NAME\n"
    );
    for (scope, kind, name) in [
        (Scope::Namespace, "Role", "loopwright"),
        (Scope::Cluster, "ClusterRole", "loopwright-cluster"),
    ] {
        out += "---\napiVersion: rbac.authorization.k8s.io/v1\n";
        out += &format!("kind: {kind}\nmetadata:\n  name: {name}\n");
        if scope == Scope::Namespace {
            out += &format!("  namespace: {namespace}\n");
        }
        out += "rules:\n";
        // One rule per (group, resource), its verbs in the table's order.
        let mut rules: BTreeMap<(&str, &str), Vec<&Rule>> = BTreeMap::new();
        for r in RULES.iter().filter(|r| r.scope == scope) {
            rules.entry((r.group, r.resource)).or_default().push(r);
        }
        for ((group, resource), rs) in rules {
            let verbs: Vec<&str> = rs.iter().map(|r| r.verb).collect();
            out += &format!(
                "- apiGroups: [\"{group}\"]\n  resources: [\"{resource}\"]\n  verbs: [{}]\n",
                verbs
                    .iter()
                    .map(|v| format!("\"{v}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            for r in rs {
                out += &format!("  # {}: {}\n", r.verb, r.why);
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;
