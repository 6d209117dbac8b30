//! The runtime contract (crates/engine/src/lib.rs) on the Kubernetes API, through kube-rs
//! and the generated k8s-openapi types: the only module that names them.
//!
//! A container is a Pod of one container named `main` (pod.rs: non-root,
//! read-only root when asked, every capability dropped, seccomp
//! `RuntimeDefault`, no privilege escalation, limits from the spec,
//! `runtimeClassName` from its runtime); exec and logs go through the
//! API's subresources (exec over WebSocket, `v5.channel.k8s.io`); a named
//! volume is a PersistentVolumeClaim, a tmpfs an `emptyDir` in memory; a
//! network is a NetworkPolicy (network.rs); the cluster never sees this
//! host's files (paths.rs).  It is a sandbox runner, not an image builder:
//! whether an image is there is what the nodes report (`status.images`,
//! image.rs), and `select` pairs the runner with a Docker builder; a pod
//! pulling from a registry the Docker CLI has credentials for names them
//! as a pull secret (pull.rs, with the credentials module).
//!
//! [`KubeEngine`] keeps one client and a current-thread tokio runtime, so its
//! methods block like the contract says.  The kubeconfig is found the usual
//! way (`KUBECONFIG`, else `~/.kube/config`; the project's `engine.kubeconfig`
//! when `KUBECONFIG` is unset), the context is `engine.context` or the
//! kubeconfig's current one, the namespace `engine.namespace` or the
//! context's (connect.rs).  Errors (errors.rs): no kubeconfig, or an API server that does not answer,
//! is 69 naming the context; a request RBAC forbids is 77 naming the verb
//! and the resource; a namespace quota that refuses a pod is 75, and nothing
//! of that pod is left.
//!
//! A warm pool (pool.rs): pods made ahead from one spec, each with claims
//! of its own, each claimed by one caller for good with a label patch
//! conditional on its version.

mod access;
mod connect;
mod errors;
mod image;
pub use image::normalize;
mod network;
mod paths;
mod pod;
mod pool;
pub use crate::pool::{Claimed, OwnClaim, pool_key};
pub use pool::{ENV_ANNOTATION, POOL_LABEL, POOL_POD_LABEL, WARM_POOL_KEY};
mod pull;
mod sandbox;
mod service;
mod storage;

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, LocalObjectReference, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};

use crate::{
    Container, ContainerSpec, Engine, EngineInfo, EngineVersion, ExecRequest, Image, Images,
    OutStream, RuntimeInfo,
};
use base::error::{Error, Exit, Result};

pub use access::{RULES, Rule, Scope, grant, role_yaml, scope_of};
pub(crate) use errors::api_err;
use errors::unreachable;
pub use pod::{MANAGED_BY, MANAGED_BY_VALUE, NET_PREFIX};
pub use storage::{ACCESS_MODE_KEY, STORAGE_CLASS_KEY, Storage, TOOLS_ACCESS_MODE_KEY};

/// The `.loopwright/config` keys of this engine.
pub const KUBECONFIG_KEY: &str = "engine.kubeconfig";
pub const CONTEXT_KEY: &str = "engine.context";
pub const NAMESPACE_KEY: &str = "engine.namespace";

/// How long `start` waits for a pod to run: the image is on the node (or
/// pulled by then) and the scheduler has placed it.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `remove` waits for a pod to be gone.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(60);
/// An API server that does not accept a connection in this time is down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the connection's settings came from.
#[derive(Clone, Debug, Default)]
pub struct Target {
    /// The kubeconfig file read (`KUBECONFIG` may name several).
    pub kubeconfig: String,
    pub context: String,
    pub namespace: String,
    /// The API server's URL.
    pub server: String,
}

/// A Kubernetes cluster through kube-rs.
pub struct KubeEngine {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    target: Target,
    /// Whether the default-deny policy is known to exist.
    deny_made: std::sync::atomic::AtomicBool,
    /// What a named volume's claim asks for (storage.rs).
    storage: Storage,
    /// `kube.cpu-request` in millicores: a pod's CPU request below its
    /// limit (pod/spec.rs); `None`: the limit.
    cpu_request: Option<u64>,
    /// `kube.warm-pool`: how many ready pods each pool keeps (0: none).
    warm_pool: usize,
}

impl KubeEngine {
    /// Where this engine points.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// What a named volume's claim asks for.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The client, for tests and tools beside the contract.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Drives `f` to completion on the engine's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.target.namespace)
    }

    fn stopped(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.target.namespace)
    }

    fn unreachable(&self, e: &kube::Error) -> Error {
        unreachable(&self.target, e)
    }

    /// An API error as the house exit statuses say (see [`api_err`]).
    pub(crate) fn err(&self, verb: &str, resource: &str, what: &str, e: kube::Error) -> Error {
        api_err(&self.target, verb, resource, what, e)
    }

    /// The changes of pod `name` after resource version `rv`, for at most
    /// `left` (the API server ends a watch after 290 s at most).
    async fn watch_pod(
        &self,
        pods: &Api<Pod>,
        name: &str,
        rv: &str,
        left: Duration,
        what: &str,
    ) -> Result<futures_util::stream::BoxStream<'static, kube::Result<WatchEvent<Pod>>>> {
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(left.as_secs().clamp(1, 290) as u32);
        Ok(pods
            .watch(&wp, rv)
            .await
            .map_err(|e| self.err("watch", "pods", what, e))?
            .boxed())
    }

    /// Pod `name` (`None` when there is none) and the version to watch it
    /// from: the list's, which is the API server's current one.  A pod's
    /// own version can be older than the server's watch cache still holds
    /// (a busy namespace: a hundred pods made since), and a watch from it
    /// ends at once with 410 Gone: asked again in a loop, a get and a
    /// watch for nothing, hundreds a second over a fleet's execs.
    pub(super) async fn pod_now(
        pods: &Api<Pod>,
        name: &str,
    ) -> kube::Result<(Option<Pod>, String)> {
        let lp = ListParams::default().fields(&format!("metadata.name={name}"));
        let list = pods.list(&lp).await?;
        let rv = list.metadata.resource_version.clone().unwrap_or_default();
        Ok((list.items.into_iter().next(), rv))
    }

    /// Waits until `name`'s container runs (true), or the pod ends or fails
    /// to start (an error saying why).
    fn wait_running(&self, name: &str) -> Result<()> {
        let pods = self.pods();
        let what = format!("pod '{name}' did not start");
        self.block_on(async {
            let deadline = tokio::time::Instant::now() + START_TIMEOUT;
            loop {
                let (p, rv) = Self::pod_now(&pods, name)
                    .await
                    .map_err(|e| self.err("list", "pods", &what, e))?;
                let Some(p) = p else {
                    return Err(Error::new(Exit::NoInput, format!("{what}: it was deleted")));
                };
                if let Some(done) = pod::start_outcome(&p) {
                    return done.map_err(|why| not_started(&what, why));
                }
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    return Err(Error::new(
                        Exit::TempFail,
                        format!(
                            "{what} within {} s: {}",
                            START_TIMEOUT.as_secs(),
                            pod::pending_reason(&p)
                        ),
                    ));
                }
                let mut s = self.watch_pod(&pods, name, &rv, left, &what).await?;
                while let Some(ev) = s
                    .try_next()
                    .await
                    .map_err(|e| self.err("watch", "pods", &what, e))?
                {
                    match ev {
                        WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                            if let Some(done) = pod::start_outcome(&p) {
                                return done.map_err(|why| not_started(&what, why));
                            }
                        }
                        WatchEvent::Deleted(_) => {
                            return Err(Error::new(
                                Exit::NoInput,
                                format!("{what}: it was deleted"),
                            ));
                        }
                        // An expired version: read the pod again.
                        WatchEvent::Error(_) => break,
                        WatchEvent::Bookmark(_) => {}
                    }
                }
            }
        })
    }

    /// Deletes pod `name` (`grace` seconds to end) and waits until it is gone.
    fn delete_pod(&self, name: &str, grace: u32) -> Result<()> {
        let pods = self.pods();
        let what = format!("cannot remove pod '{name}'");
        self.block_on(async {
            let dp = DeleteParams {
                grace_period_seconds: Some(grace),
                ..Default::default()
            };
            let uid = match pods.delete(name, &dp).await {
                Ok(either) => either.left().and_then(|p| p.metadata.uid),
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
                Err(e) => return Err(self.err("delete", "pods", &what, e)),
            };
            let deadline =
                tokio::time::Instant::now() + REMOVE_TIMEOUT + Duration::from_secs(grace.into());
            loop {
                let (p, rv) = Self::pod_now(&pods, name)
                    .await
                    .map_err(|e| self.err("list", "pods", &what, e))?;
                match p {
                    None => return Ok(()),
                    // A pod made again under the same name is another one.
                    Some(p) if uid.is_some() && p.metadata.uid != uid => return Ok(()),
                    Some(_) => {}
                }
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    return Err(Error::new(
                        Exit::TempFail,
                        format!(
                            "{what}: still terminating after {} s",
                            REMOVE_TIMEOUT.as_secs()
                        ),
                    ));
                }
                let mut s = self.watch_pod(&pods, name, &rv, left, &what).await?;
                while let Some(ev) = s
                    .try_next()
                    .await
                    .map_err(|e| self.err("watch", "pods", &what, e))?
                {
                    match ev {
                        WatchEvent::Deleted(_) => return Ok(()),
                        WatchEvent::Error(_) => break,
                        _ => {}
                    }
                }
            }
        })
    }

    /// Runs `cmd` in pod `name` with the streams `io` wires; returns the
    /// exit status.  Kubernetes' exec has no user, directory or environment
    /// of its own: a working directory and variables are set by wrapping the
    /// command (`env`, `sh -c 'cd'`), a user other than the pod's is refused.
    pub(crate) fn exec_streams(
        &self,
        container: &str,
        req: &ExecRequest,
        io: crate::ExecIo<'_>,
    ) -> Result<i64> {
        sandbox::exec_streams(self, container, req, io)
    }
}

/// A pod that will not start: 66 when its node has not its image and
/// cannot pull it (the pod's own status says so, the image named in the
/// kubelet's words), 69 otherwise.
fn not_started(what: &str, why: String) -> Error {
    let exit = if pod::image_missing(&why) {
        Exit::NoInput
    } else {
        Exit::Unavailable
    };
    Error::new(exit, format!("{what}: {why}"))
}

impl Images for KubeEngine {
    fn image(&self, reference: &str) -> Result<Option<Image>> {
        self.node_image(reference)
    }

    fn images_with_label(&self, _label: &str) -> Result<Vec<Image>> {
        // Nodes report names and sizes, not labels.
        Ok(Vec::new())
    }
}

impl Engine for KubeEngine {
    fn version(&self) -> Result<EngineVersion> {
        let v = self
            .block_on(self.client.apiserver_version())
            .map_err(|e| self.err("get", "version", "cannot ask the API server its version", e))?;
        Ok(EngineVersion {
            version: v.git_version,
            api: format!("{}.{}", v.major, v.minor),
        })
    }

    fn create(&self, spec: &ContainerSpec) -> Result<String> {
        let runtime_class = match spec.runtime.as_deref() {
            None => None,
            Some(r) => self.runtime_class(r)?,
        };
        let mut p = pod::pod_of(spec, runtime_class, self.cpu_request)?;
        let name = p.metadata.name.clone().unwrap_or_default();
        let what = format!("cannot create pod '{name}'");
        // A dry run first: RBAC, the quota and the name are checked before
        // anything is made (the default-deny policy included).
        let dry = PostParams {
            dry_run: true,
            ..Default::default()
        };
        self.block_on(self.pods().create(&dry, &p))
            .map_err(|e| self.err("create", "pods", &what, e))?;
        self.ensure_default_deny()?;
        if let (Some(secret), Some(ps)) = (self.pull_secret(&spec.image)?, p.spec.as_mut()) {
            ps.image_pull_secrets = Some(vec![LocalObjectReference { name: secret }]);
        }
        if spec.network.as_deref() == Some("bridge") {
            self.ensure_bridge()?;
        }
        let made = self
            .block_on(self.pods().create(&PostParams::default(), &p))
            .map_err(|e| self.err("create", "pods", &what, e))?;
        Ok(made.metadata.name.unwrap_or(name))
    }

    fn start(&self, container: &str) -> Result<()> {
        // A pod runs once made; one stopped (kept as its manifest) is made again.
        let what = format!("cannot start pod '{container}'");
        let pod = self
            .block_on(self.pods().get_opt(container))
            .map_err(|e| self.err("get", "pods", &what, e))?;
        if pod.is_none() {
            let kept = self
                .block_on(self.stopped().get_opt(container))
                .map_err(|e| self.err("get", "configmaps", &what, e))?;
            let Some(cm) = kept.filter(pod::is_stopped_record) else {
                return Err(Error::new(Exit::NoInput, format!("{what}: no such pod")));
            };
            let p = pod::pod_from_record(&cm)?;
            self.block_on(self.pods().create(&PostParams::default(), &p))
                .map_err(|e| self.err("create", "pods", &what, e))?;
            self.block_on(self.stopped().delete(container, &DeleteParams::default()))
                .map_err(|e| self.err("delete", "configmaps", &what, e))?;
        }
        self.wait_running(container)
    }

    fn stop(&self, container: &str, timeout: Duration) -> Result<()> {
        // A pod cannot be stopped and kept: its manifest is kept in a
        // ConfigMap of the same name (labelled as the pod was) and the pod
        // ends; `start` makes it again.  What it wrote outside its volumes
        // is gone, as after a restart.
        let what = format!("cannot stop pod '{container}'");
        let Some(p) = self
            .block_on(self.pods().get_opt(container))
            .map_err(|e| self.err("get", "pods", &what, e))?
        else {
            return Ok(());
        };
        let cm = pod::stopped_record(&p)?;
        match self.block_on(self.stopped().create(&PostParams::default(), &cm)) {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(self.err("create", "configmaps", &what, e)),
        }
        self.delete_pod(container, timeout.as_secs().min(u32::MAX as u64) as u32)
    }

    fn remove(&self, container: &str, force: bool) -> Result<()> {
        self.delete_pod(container, if force { 0 } else { 10 })?;
        match self.block_on(self.stopped().get_opt(container)) {
            Ok(Some(cm)) if pod::is_stopped_record(&cm) => {
                match self.block_on(self.stopped().delete(container, &DeleteParams::default())) {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(self.err(
                        "delete",
                        "configmaps",
                        &format!("cannot remove the stopped pod '{container}'"),
                        e,
                    )),
                }
            }
            Ok(_) => Ok(()),
            Err(e) => Err(self.err(
                "get",
                "configmaps",
                &format!("cannot remove the stopped pod '{container}'"),
                e,
            )),
        }
    }

    fn inspect(&self, name_or_id: &str) -> Result<Option<Container>> {
        let what = format!("cannot inspect pod '{name_or_id}'");
        if let Some(p) = self
            .block_on(self.pods().get_opt(name_or_id))
            .map_err(|e| self.err("get", "pods", &what, e))?
        {
            return Ok(Some(pod::container_of(&p)));
        }
        match self
            .block_on(self.stopped().get_opt(name_or_id))
            .map_err(|e| self.err("get", "configmaps", &what, e))?
        {
            Some(cm) if pod::is_stopped_record(&cm) => Ok(Some(pod::container_of_record(&cm))),
            _ => Ok(None),
        }
    }

    fn exec(
        &self,
        container: &str,
        req: &ExecRequest,
        on_output: &mut dyn FnMut(OutStream, &[u8]),
    ) -> Result<i64> {
        self.exec_streams(container, req, crate::ExecIo::output(on_output))
    }

    fn info(&self) -> Result<EngineInfo> {
        let v = self.version()?;
        let mut runtimes = vec![RuntimeInfo {
            name: crate::runtime::DEFAULT_RUNTIME.into(),
            path: "(the node's default handler)".into(),
            args: Vec::new(),
        }];
        for (name, handler) in self.runtime_classes()? {
            if name != crate::runtime::DEFAULT_RUNTIME {
                runtimes.push(RuntimeInfo {
                    name,
                    path: handler,
                    args: Vec::new(),
                });
            }
        }
        runtimes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(EngineInfo {
            host: self.target.server.clone(),
            product: "kubernetes".into(),
            version: v.version,
            runtimes,
            default_runtime: crate::runtime::DEFAULT_RUNTIME.into(),
            security: vec!["name=seccomp,profile=RuntimeDefault".into()],
        })
    }
}

impl KubeEngine {
    /// RuntimeClasses: name to handler.
    fn runtime_classes(&self) -> Result<BTreeMap<String, String>> {
        use k8s_openapi::api::node::v1::RuntimeClass;
        let api: Api<RuntimeClass> = Api::all(self.client.clone());
        let list = self
            .block_on(api.list(&ListParams::default()))
            .map_err(|e| self.err("list", "runtimeclasses", "cannot list RuntimeClasses", e))?;
        Ok(list
            .items
            .into_iter()
            .map(|r| (r.metadata.name.unwrap_or_default(), r.handler))
            .collect())
    }

    /// The RuntimeClass a spec's runtime names: one of that name, else one
    /// whose handler it is (`runsc` is usually the class `gvisor`).  The
    /// default runtime is no class at all.
    fn runtime_class(&self, runtime: &str) -> Result<Option<String>> {
        if runtime == crate::runtime::DEFAULT_RUNTIME {
            return Ok(None);
        }
        let classes = self.runtime_classes()?;
        if classes.contains_key(runtime) {
            return Ok(Some(runtime.to_string()));
        }
        if let Some((name, _)) = classes.iter().find(|(_, h)| h.as_str() == runtime) {
            return Ok(Some(name.clone()));
        }
        let known: Vec<&str> = classes.keys().map(String::as_str).collect();
        Err(Error::new(
            Exit::Unavailable,
            format!(
                "runtime '{runtime}': context '{}' has no RuntimeClass of that name or handler (it has: {}); add one (for gVisor: a RuntimeClass 'gvisor' with handler 'runsc', and runsc configured in the nodes' containerd)",
                self.target.context,
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            ),
        ))
    }

    /// Reads the whole log of `container` (both streams: the API merges them).
    pub(crate) fn read_log(&self, container: &str) -> Result<Vec<u8>> {
        let what = format!("cannot read the log of pod '{container}'");
        let lp = kube::api::LogParams {
            container: Some(pod::MAIN.into()),
            ..Default::default()
        };
        self.block_on(async {
            let mut s = self
                .pods()
                .log_stream(container, &lp)
                .await
                .map_err(|e| self.err("get", "pods/log", &what, e))?;
            let mut out = Vec::new();
            use futures_util::AsyncReadExt;
            s.read_to_end(&mut out)
                .await
                .map_err(|e| Error::new(Exit::Unavailable, format!("{what}: {e}")))?;
            Ok(out)
        })
    }

    /// Every pod carrying `label`, and the stopped ones kept as manifests.
    pub(crate) fn labelled(&self, label: &str) -> Result<Vec<Container>> {
        let what = format!("cannot list pods labelled '{label}'");
        let lp = ListParams::default().labels(&pod::selector(label)?);
        let pods = self
            .block_on(self.pods().list(&lp))
            .map_err(|e| self.err("list", "pods", &what, e))?;
        let mut out: Vec<Container> = pods.items.iter().map(pod::container_of).collect();
        let kept = self
            .block_on(self.stopped().list(&lp))
            .map_err(|e| self.err("list", "configmaps", &what, e))?;
        for cm in kept.items.iter().filter(|c| pod::is_stopped_record(c)) {
            let c = pod::container_of_record(cm);
            if !out.iter().any(|o| o.name == c.name) {
                out.push(c);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}
