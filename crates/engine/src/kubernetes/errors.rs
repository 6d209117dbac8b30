//! API errors as the house exit statuses say.

use super::Target;
use base::error::{Error, Exit};

/// The API server of `t` did not answer.
pub(super) fn unreachable(t: &Target, e: &kube::Error) -> Error {
    Error::new(
        Exit::Unavailable,
        format!(
            "cannot reach Kubernetes context '{}' at {}: {e}; start the cluster or point KUBECONFIG / engine.context at a running one",
            t.context, t.server
        ),
    )
}

/// An API error as the house exit statuses say: 403 is 77 naming `verb`
/// and `resource` (a quota's refusal, also 403, is 75), 404 is 66, 409
/// is 73, a lost connection 69 naming the context, the rest 69.
pub(crate) fn api_err(t: &Target, verb: &str, resource: &str, what: &str, e: kube::Error) -> Error {
    match &e {
        kube::Error::Api(s) => {
            let ns = &t.namespace;
            let exit = match s.code {
                403 if s.message.contains("exceeded quota") => {
                    return Error::new(
                        Exit::TempFail,
                        format!(
                            "{what}: namespace '{ns}' is at its quota ({}); nothing was made; remove sandboxes or raise the ResourceQuota",
                            s.message
                        ),
                    );
                }
                403 => {
                    let scope = super::scope_of(verb, resource);
                    let place = match scope {
                        super::Scope::Namespace => format!("in namespace '{ns}'"),
                        super::Scope::Cluster => "cluster-wide".to_string(),
                    };
                    return Error::new(
                        Exit::NoPerm,
                        format!(
                            "{what}: Kubernetes RBAC forbids '{verb}' on '{resource}' {place} for context '{}' ({}); {}",
                            t.context,
                            s.message,
                            super::grant(scope, ns)
                        ),
                    );
                }
                401 => {
                    return Error::new(
                        Exit::NoPerm,
                        format!(
                            "{what}: the API server of context '{}' does not accept these credentials ({}); renew them in the kubeconfig",
                            t.context, s.message
                        ),
                    );
                }
                404 => Exit::NoInput,
                409 => Exit::CantCreat,
                422 | 400 => Exit::DataErr,
                _ => Exit::Unavailable,
            };
            Error::new(exit, format!("{what}: {}", s.message))
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) => unreachable(t, &e),
        _ => Error::new(Exit::Unavailable, format!("{what}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: message.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn rbac_quota_and_missing_objects_have_their_exits() {
        let t = Target {
            context: "prod".into(),
            namespace: "team".into(),
            ..Default::default()
        };
        let e = api_err(
            &t,
            "create",
            "pods",
            "cannot create pod 'x'",
            api(
                403,
                "pods is forbidden: User \"u\" cannot create resource \"pods\"",
            ),
        );
        assert_eq!(e.exit, Exit::NoPerm);
        assert!(
            e.msg.contains("'create' on 'pods'")
                && e.msg.contains("'prod'")
                && e.msg.contains("'team'"),
            "{}",
            e.msg
        );
        assert!(e.msg.contains("a Role and a RoleBinding"), "{}", e.msg);
        // A resource without a namespace: what a Role cannot grant.
        let e = api_err(
            &t,
            "list",
            "runtimeclasses",
            "cannot list RuntimeClasses",
            api(403, "runtimeclasses.node.k8s.io is forbidden"),
        );
        assert_eq!(e.exit, Exit::NoPerm);
        assert!(
            e.msg.contains("cluster-wide")
                && e.msg.contains("a ClusterRole and a ClusterRoleBinding")
                && !e.msg.contains("in namespace 'team'")
                && !e.msg.contains("with a Role and"),
            "{}",
            e.msg
        );
        let e = api_err(
            &t,
            "create",
            "pods",
            "x",
            api(
                403,
                "pods \"x\" is forbidden: exceeded quota: q, requested: pods=1",
            ),
        );
        assert_eq!(e.exit, Exit::TempFail);
        assert!(
            e.msg.contains("quota") && e.msg.contains("nothing was made"),
            "{}",
            e.msg
        );
        assert_eq!(
            api_err(&t, "get", "pods", "x", api(404, "not found")).exit,
            Exit::NoInput
        );
        assert_eq!(
            api_err(&t, "create", "pods", "x", api(409, "exists")).exit,
            Exit::CantCreat
        );
        assert_eq!(
            api_err(&t, "create", "pods", "x", api(422, "invalid")).exit,
            Exit::DataErr
        );
        assert_eq!(
            api_err(&t, "get", "pods", "x", api(401, "Unauthorized")).exit,
            Exit::NoPerm
        );
    }
}
