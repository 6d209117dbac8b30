//! Connecting: the kubeconfig, context and namespace found the usual way
//! (the module's documentation in mod.rs), and the first request that says
//! whether the API server answers.

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::{CONNECT_TIMEOUT, CONTEXT_KEY, KUBECONFIG_KEY, KubeEngine, NAMESPACE_KEY, Target};
use base::error::{Error, Exit, Result};

impl KubeEngine {
    /// Connects as the project's configuration says (see the module's
    /// documentation) and checks the API server answers.
    pub fn connect_for(config: Option<&base::config::Config>) -> Result<KubeEngine> {
        let get = |k: &str| {
            config
                .and_then(|c| c.get(k))
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        let kubeconfig = std::env::var("KUBECONFIG")
            .ok()
            .filter(|v| !v.is_empty())
            .or_else(|| get(KUBECONFIG_KEY));
        let storage = super::Storage::from_config(&get)?;
        let cpu_request = match get(super::pod::CPU_REQUEST_KEY) {
            None => None,
            Some(v) => Some(super::pod::millicores(&v).ok_or_else(|| {
                Error::config(format!(
                    "'{} = {v}' in .loopwright/config: expected a number of CPUs above 0, such as 0.05 or 1",
                    super::pod::CPU_REQUEST_KEY
                ))
            })?),
        };
        let warm_pool = match get(super::WARM_POOL_KEY) {
            None => 0,
            Some(v) => v.trim().parse::<usize>().ok().filter(|n| *n <= 1000).ok_or_else(|| {
                Error::config(format!(
                    "'{} = {v}' in .loopwright/config: expected how many ready pods to keep, 0 to 1000",
                    super::WARM_POOL_KEY
                ))
            })?,
        };
        let mut e =
            KubeEngine::connect_with(kubeconfig.as_deref(), get(CONTEXT_KEY), get(NAMESPACE_KEY))?;
        e.storage = storage;
        e.cpu_request = cpu_request;
        e.warm_pool = warm_pool;
        Ok(e)
    }

    /// The namespace the project's configuration names (`engine.namespace`,
    /// else its context's in the kubeconfig), read without asking the
    /// cluster; `None` when neither says.
    pub fn configured_namespace(config: Option<&base::config::Config>) -> Option<String> {
        let get = |k: &str| {
            config
                .and_then(|c| c.get(k))
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        if let Some(ns) = get(NAMESPACE_KEY) {
            return Some(ns);
        }
        let kubeconfig = std::env::var("KUBECONFIG")
            .ok()
            .filter(|v| !v.is_empty())
            .or_else(|| get(KUBECONFIG_KEY));
        let files = kubeconfig_files(kubeconfig.as_deref());
        let (kc, context) = read_kubeconfig(&files, "", get(CONTEXT_KEY)).ok()?;
        kc.contexts
            .into_iter()
            .find(|c| c.name == context)?
            .context?
            .namespace
            .filter(|n| !n.is_empty())
    }

    /// Connects with `kubeconfig` (a path, or several joined by `:`; `None`
    /// is `~/.kube/config`), `context` (`None`: the current one) and
    /// `namespace` (`None`: the context's, else `default`).
    pub fn connect_with(
        kubeconfig: Option<&str>,
        context: Option<String>,
        namespace: Option<String>,
    ) -> Result<KubeEngine> {
        let rt = crate::io_runtime()?;
        let files = kubeconfig_files(kubeconfig);
        let shown = files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":");
        let (kc, context) = read_kubeconfig(&files, &shown, context)?;
        let opts = KubeConfigOptions {
            context: Some(context.clone()),
            ..Default::default()
        };
        let mut cfg = rt
            .block_on(kube::Config::from_custom_kubeconfig(kc, &opts))
            .map_err(|e| {
                Error::new(
                    Exit::Unavailable,
                    format!("cannot reach Kubernetes context '{context}': {shown}: {e}"),
                )
            })?;
        cfg.connect_timeout = Some(CONNECT_TIMEOUT);
        let namespace = namespace.unwrap_or_else(|| cfg.default_namespace.clone());
        cfg.default_namespace = namespace.clone();
        let target = Target {
            kubeconfig: shown,
            context: context.clone(),
            namespace,
            server: cfg.cluster_url.to_string(),
        };
        let client = {
            let _g = rt.enter();
            kube::Client::try_from(cfg).map_err(|e| {
                Error::new(
                    Exit::Unavailable,
                    format!(
                        "cannot reach Kubernetes context '{context}' at {}: {e}",
                        target.server
                    ),
                )
            })?
        };
        let engine = KubeEngine {
            rt,
            client,
            target,
            deny_made: std::sync::atomic::AtomicBool::new(false),
            storage: super::Storage::default(),
            cpu_request: None,
            warm_pool: 0,
        };
        // The first request says whether the server answers at all.
        engine
            .block_on(engine.client.apiserver_version())
            .map_err(|e| engine.unreachable(&e))?;
        Ok(engine)
    }
}

/// The kubeconfig files: those `kubeconfig` lists (`:`-separated), else
/// `~/.kube/config`.
fn kubeconfig_files(kubeconfig: Option<&str>) -> Vec<std::path::PathBuf> {
    match kubeconfig {
        Some(list) => std::env::split_paths(list)
            .filter(|p| !p.as_os_str().is_empty())
            .collect(),
        None => match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
            Some(h) => vec![std::path::Path::new(&h).join(".kube/config")],
            None => Vec::new(),
        },
    }
}

/// The existing `files` read and merged (shown as `shown`), and the context
/// to use: `context`, else the current one; either must be one of its
/// contexts.  69 naming the context when there is none.
fn read_kubeconfig(
    files: &[std::path::PathBuf],
    shown: &str,
    context: Option<String>,
) -> Result<(Kubeconfig, String)> {
    let ctx_shown = context.clone().unwrap_or_else(|| "(current)".into());
    let no_config = |why: String| {
        Error::new(
            Exit::Unavailable,
            format!(
                "cannot reach Kubernetes context '{ctx_shown}': {why}; set KUBECONFIG (or engine.kubeconfig in .loopwright/config) to a kubeconfig naming the cluster, and engine.context to one of its contexts"
            ),
        )
    };
    let mut merged: Option<Kubeconfig> = None;
    for f in files {
        if !f.exists() {
            continue;
        }
        let k = Kubeconfig::read_from(f)
            .map_err(|e| no_config(format!("kubeconfig {} is unreadable: {e}", f.display())))?;
        merged = Some(match merged {
            None => k,
            Some(m) => m.merge(k).map_err(|e| no_config(e.to_string()))?,
        });
    }
    let Some(kc) = merged else {
        return Err(no_config(if shown.is_empty() {
            "no kubeconfig (KUBECONFIG is unset and HOME is not set)".into()
        } else {
            format!("no kubeconfig at {shown}")
        }));
    };
    let context = match context.or_else(|| kc.current_context.clone()) {
        Some(c) => c,
        None => return Err(no_config(format!("{shown} names no current context"))),
    };
    if !kc.contexts.iter().any(|c| c.name == context) {
        let known: Vec<&str> = kc.contexts.iter().map(|c| c.name.as_str()).collect();
        return Err(Error::new(
            Exit::Unavailable,
            format!(
                "cannot reach Kubernetes context '{context}': {shown} has no such context (it has: {}); set engine.context to one of them",
                known.join(", ")
            ),
        ));
    }
    Ok((kc, context))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_kubeconfig_is_unavailable_naming_the_context() {
        let e =
            KubeEngine::connect_with(Some("/nonexistent/kubeconfig"), Some("prod".into()), None)
                .err()
                .unwrap();
        assert_eq!(e.exit, Exit::Unavailable);
        assert!(
            e.msg.contains("'prod'") && e.msg.contains("/nonexistent/kubeconfig"),
            "{}",
            e.msg
        );
    }
}
