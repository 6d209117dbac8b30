//! `lw doctor`: checks everything loopwright depends on and says, for each
//! finding, what to do about it.
//!
//! Every check is independent and never changes anything: a doctor that
//! "fixes" things behind the user's back would hide the very state it is asked
//! about.  A check that cannot run (no project, no token configured) says so
//! as `skip`, not as a failure.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Project;
use crate::engine::{DockerEngine, Engine};
use crate::layout::Root;

pub use crate::finding::{Finding, Status};

fn f(
    check: &'static str,
    status: Status,
    detail: impl Into<String>,
    fix: Option<String>,
) -> Finding {
    Finding {
        check,
        status,
        detail: detail.into(),
        fix,
    }
}

/// What the doctor looks at.
pub struct Inputs {
    pub cwd: PathBuf,
    pub root: Option<PathBuf>,
    /// A mirror older than this is reported as stale.
    pub fresh: Duration,
}

/// Runs every check, in the order a newcomer would fix things.
pub fn run(inp: &Inputs) -> Vec<Finding> {
    let mut out = Vec::new();
    let project = match Project::find(&inp.cwd) {
        Ok(Some(p)) => {
            out.push(f(
                "project",
                Status::Ok,
                format!("{}", p.top.display()),
                None,
            ));
            Some(p)
        }
        Ok(None) => {
            out.push(f(
                "project",
                Status::Skip,
                format!(
                    "'{}' is not inside a git checkout; mirror and image checks skipped",
                    inp.cwd.display()
                ),
                Some("run lw doctor inside the project".into()),
            ));
            None
        }
        Err(e) => {
            out.push(f(
                "project",
                Status::Fail,
                e.to_string(),
                Some("fix .loopwright/config at the line named".into()),
            ));
            None
        }
    };
    out.push(git());
    let kind = crate::engine::EngineKind::of(project.as_ref().map(|p| &p.config));
    let on_docker = matches!(kind, Ok(crate::engine::EngineKind::Docker));
    if !on_docker {
        out.extend(kubernetes(kind, project.as_ref()));
    }
    let engine = if on_docker {
        docker(&mut out, project.as_ref())
    } else {
        None
    };
    if let Some(e) = &engine {
        out.push(host_files(e));
        out.extend(runtimes(e, project.as_ref()));
    }
    out.push(apparmor());
    if let Some(p) = &project {
        out.push(mirror(p, inp.fresh));
        out.extend(image(p, engine.as_ref()));
        out.push(image_cache(p));
        out.extend(crate::agent::doctor::checks(
            p,
            engine.as_ref().map(|e| e as &dyn Engine),
        ));
    }
    let root = inp
        .root
        .clone()
        .or_else(|| project.as_ref().map(|p| p.cache().join("mailbox")));
    if let (Some(r), Some(e)) = (&root, &engine) {
        out.extend(services(r, e, project.as_ref()));
    }
    match root {
        Some(r) => out.extend(mailbox(&Root::new(r))),
        None => out.push(f(
            "mailbox",
            Status::Skip,
            "no mailbox root (no --root, no LW_ROOT, no project)",
            Some("set LW_ROOT".into()),
        )),
    }
    out.push(github(
        project
            .as_ref()
            .map(|p| p.top.as_path())
            .unwrap_or(&inp.cwd),
    ));
    out
}

/// Each shared service (lib/service): its state and the sandboxes using it.
fn services(root: &Path, engine: &DockerEngine, project: Option<&Project>) -> Vec<Finding> {
    let svc = crate::service::Services::new(root, engine);
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

fn git() -> Finding {
    match std::process::Command::new("git").arg("--version").output() {
        Ok(o) if o.status.success() => {
            let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let ok = v
                .split_whitespace()
                .nth(2)
                .and_then(|n| {
                    let mut it = n.split('.').map(|x| x.parse::<u32>().unwrap_or(0));
                    Some((it.next()?, it.next()?))
                })
                .is_some_and(|(maj, min)| (maj, min) >= (2, 30));
            if ok {
                f("git", Status::Ok, v, None)
            } else {
                f(
                    "git",
                    Status::Warn,
                    format!("{v}; loopwright is tested with git 2.30 and later"),
                    Some("install a newer git".into()),
                )
            }
        }
        _ => f(
            "git",
            Status::Fail,
            "git is not installed or not on PATH",
            Some("apt-get install git".into()),
        ),
    }
}

/// `engine = kubernetes`: the API server and context, what RBAC lets this
/// user do, the runtime classes, and the two things the API cannot promise
/// (this host's files; NetworkPolicy enforcement, the network plugin's).
fn kubernetes(
    kind: crate::error::Result<crate::engine::EngineKind>,
    project: Option<&Project>,
) -> Vec<Finding> {
    use crate::engine::{HostPaths, KubeEngine};
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
    let mut denied = Vec::new();
    for (verb, res) in crate::engine::kubernetes::NEEDED {
        match e.can(verb, res) {
            Ok(true) => {}
            Ok(false) => denied.push(format!("{verb} {res}")),
            Err(err) => denied.push(format!("{verb} {res} ({err})")),
        }
    }
    out.push(if denied.is_empty() {
        f(
            "kube-rbac",
            Status::Ok,
            format!(
                "this user may do all a sandbox needs in namespace {}",
                t.namespace
            ),
            None,
        )
    } else {
        f(
            "kube-rbac",
            Status::Fail,
            format!(
                "RBAC forbids in namespace {}: {}",
                t.namespace,
                denied.join(", ")
            ),
            Some("grant them with a Role and RoleBinding (docs/engines.md lists the rules)".into()),
        )
    });
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

fn docker(out: &mut Vec<Finding>, project: Option<&Project>) -> Option<DockerEngine> {
    match DockerEngine::connect_for(project.map(|p| &p.config))
        .and_then(|e| e.version().map(|v| (e, v)))
    {
        Ok((e, v)) => {
            out.push(f(
                "docker",
                Status::Ok,
                format!("engine {} (API {}) at {}", v.version, v.api, e.host()),
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
            out.push(f("docker", Status::Fail, err.to_string(), Some(fix.into())));
            None
        }
    }
}

/// Whether the engine sees this host's files (a nonce written in a temp dir,
/// read back through a bind mount; lib/sandbox/hostpaths), and so which mode
/// sandboxes get.
fn host_files(engine: &DockerEngine) -> Finding {
    use crate::sandbox::hostpaths::{Sharing, probe};
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
            Status::Warn,
            format!(
                "the engine at {} does not share this host's filesystem (a nonce written in {} was not there through a bind mount): remote mode, which needs the volume transport loopwright does not have yet; lw-sandbox create refuses on this engine (exit 69)",
                engine.host(),
                tmp.display()
            ),
            Some("create sandboxes on an engine on this machine (unset DOCKER_HOST), or run loopwright on the engine's machine".into()),
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
fn runtimes(e: &DockerEngine, project: Option<&Project>) -> Vec<Finding> {
    use crate::engine::{Isolation, SandboxEngine};
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
    if info.runtime(crate::engine::runtime::GVISOR).is_none() {
        out[0].status = Status::Warn;
        out[0].fix = Some(format!(
            "for gVisor (lw-sandbox create --runtime runsc): {}",
            crate::engine::runtime::RUNSC_INSTALL
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

/// Sandboxes run under AppArmor's docker-default where the host has
/// AppArmor (lib/sandbox); say when it has not.
fn apparmor() -> Finding {
    if crate::sandbox::host_has_apparmor() {
        f(
            "apparmor",
            Status::Ok,
            "sandboxes run under the docker-default AppArmor profile",
            None,
        )
    } else {
        f(
            "apparmor",
            Status::Warn,
            "the host has no AppArmor: sandboxes run without an AppArmor profile (no capabilities, no-new-privileges and the seccomp profile still apply)",
            Some("nothing to do unless you want AppArmor: boot a kernel with it enabled".into()),
        )
    }
}

fn mirror(p: &Project, fresh: Duration) -> Finding {
    let env = std::env::var_os(crate::mirror::ENV_PATH).map(PathBuf::from);
    let path = match crate::mirror::locate(None, env.as_deref(), Some(p), &p.top) {
        Ok(path) => path,
        Err(e) => return f("mirror", Status::Fail, e.to_string(), None),
    };
    let m = crate::mirror::Mirror::new(&path);
    match m.status() {
        Ok(s) => {
            let age = crate::time::now().saturating_sub(s.last_fetch);
            let detail = format!(
                "{} ({} refs, {}, fetched {} ago from {})",
                path.display(),
                s.refs,
                crate::mirror::human_size(s.size),
                crate::time::human_age(age),
                s.url
            );
            if age > fresh {
                f(
                    "mirror",
                    Status::Warn,
                    detail,
                    Some("refresh it: lw-mirror sync".into()),
                )
            } else {
                f("mirror", Status::Ok, detail, None)
            }
        }
        Err(_) if !path.exists() => f(
            "mirror",
            Status::Warn,
            format!("no mirror at {} yet", path.display()),
            Some("create it: lw-mirror sync".into()),
        ),
        Err(e) => f(
            "mirror",
            Status::Fail,
            e.to_string(),
            Some("rebuild it: lw-mirror sync (a damaged mirror is rebuilt)".into()),
        ),
    }
}

fn image(p: &Project, engine: Option<&DockerEngine>) -> Vec<Finding> {
    let rt = match crate::image::Runtime::load(&p.top) {
        Ok(rt) => rt,
        Err(e) if e.exit == crate::Exit::NoInput => {
            return vec![f(
                "image",
                Status::Warn,
                e.to_string(),
                Some("write the default runtime: lw-build init".into()),
            )];
        }
        Err(e) => {
            return vec![f(
                "image",
                Status::Fail,
                e.to_string(),
                Some("fix the runtime definition at the line named".into()),
            )];
        }
    };
    let Some(engine) = engine else {
        return vec![f(
            "image",
            Status::Skip,
            "the Docker engine is not reachable",
            None,
        )];
    };
    let plan = match rt.plan(engine) {
        Ok(plan) => plan,
        Err(e) => return vec![f("image", Status::Fail, e.to_string(), None)],
    };
    let mut out = Vec::new();
    for layer in &plan.layers {
        if layer.cached() {
            out.push(f(
                "image",
                Status::Ok,
                format!("layer {} is current: {}", layer.def.name, layer.tag),
                None,
            ));
            continue;
        }
        let why = match crate::image::explain(engine, layer) {
            Ok(ex) => match ex.replaces {
                Some((old, changes)) if !changes.is_empty() => {
                    let names: Vec<String> = changes.iter().map(|c| c.to_string()).collect();
                    format!("stale: {old} differs in {}", names.join(", "))
                }
                Some((old, _)) => format!("stale: replaces {old}"),
                None => "never built".to_string(),
            },
            Err(e) => e.to_string(),
        };
        out.push(f(
            "image",
            Status::Warn,
            format!("layer {} ({}) is {why}", layer.def.name, layer.tag),
            Some("build it: lw-build".into()),
        ));
    }
    out
}

fn mailbox(root: &Root) -> Vec<Finding> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mut out = Vec::new();
    let meta = match std::fs::metadata(&root.dir) {
        Ok(m) => m,
        Err(_) => {
            return vec![f(
                "mailbox",
                Status::Warn,
                format!("no mailbox root at {} yet", root.dir.display()),
                Some("it is created by the first lw-sandbox create or lw-mediate".into()),
            )];
        }
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        out.push(f(
            "mailbox",
            Status::Fail,
            format!(
                "{} is writable by group or others (mode {mode:o}): anyone could plant messages",
                root.dir.display()
            ),
            Some(format!("chmod go-w {}", root.dir.display())),
        ));
    } else if mode & 0o077 != 0 {
        out.push(f(
            "mailbox",
            Status::Warn,
            format!(
                "{} is open to group or others (mode {mode:o}); lw-sandbox makes a root 0700",
                root.dir.display()
            ),
            Some(format!("chmod 700 {}", root.dir.display())),
        ));
    } else {
        out.push(f(
            "mailbox",
            Status::Ok,
            format!(
                "{} (mode {mode:o}, owner uid {})",
                root.dir.display(),
                meta.uid()
            ),
            None,
        ));
    }
    // Each sandbox's mailbox must belong to one user and be closed to others.
    if let Ok(rd) = std::fs::read_dir(root.sandboxes_dir()) {
        for e in rd.flatten() {
            let p = e.path();
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                let mode = m.permissions().mode() & 0o777;
                if !m.is_dir() || mode & 0o077 != 0 {
                    out.push(f(
                        "mailbox",
                        Status::Fail,
                        format!("{} is {} (mode {mode:o}); a sandbox's mailbox must be a directory only its owner can open", p.display(), if m.is_dir() { "open to others" } else { "not a directory" }),
                        Some(format!("chmod 700 {}", p.display())),
                    ));
                }
            }
        }
    }
    out.push(lock_finding(
        "mediator",
        &root.state_dir().join("mediator.lock"),
    ));
    out.push(lock_finding("sync", &root.state_dir().join("sync.lock")));
    out
}

fn lock_finding(what: &'static str, path: &Path) -> Finding {
    let check = if what == "mediator" {
        "mediator"
    } else {
        "sync"
    };
    let Ok(file) = std::fs::OpenOptions::new().read(true).open(path) else {
        return f(
            check,
            Status::Ok,
            format!("not running (no lock file {})", path.display()),
            None,
        );
    };
    match file.try_lock_shared() {
        Ok(()) => f(
            check,
            Status::Ok,
            format!("not running (lock {} is free)", path.display()),
            None,
        ),
        Err(std::fs::TryLockError::WouldBlock) => f(
            check,
            Status::Ok,
            format!("running (lock {} is held)", path.display()),
            None,
        ),
        Err(std::fs::TryLockError::Error(e)) => f(
            check,
            Status::Fail,
            format!("cannot check lock {}: {e}", path.display()),
            None,
        ),
    }
}

fn github(dir: &Path) -> Finding {
    let Some(cfg_path) = crate::sync::Config::find(dir) else {
        return f(
            "github",
            Status::Skip,
            "no .loopwright/sync.json: lw-sync is not configured",
            None,
        );
    };
    let cfg = match crate::sync::Config::load(&cfg_path) {
        Ok(c) => c,
        Err(e) => {
            return f(
                "github",
                Status::Fail,
                e.to_string(),
                Some("fix .loopwright/sync.json".into()),
            );
        }
    };
    let token = match crate::github::Token::load(cfg.token_file.as_deref()) {
        Ok(t) => t,
        Err(e) => return f("github", Status::Fail, e.to_string(), None),
    };
    let base = std::env::var("LW_GITHUB_API_URL")
        .ok()
        .or(cfg.api_url.clone())
        .unwrap_or_else(|| "https://api.github.com".into());
    let limits = crate::github::Limits {
        max_wait: Duration::from_secs(5),
        read_attempts: 1,
        ..Default::default()
    };
    let client = crate::github::Client::new(&base, token, limits, Default::default());
    let mut client = match client {
        Ok(c) => c,
        Err(e) => return f("github", Status::Fail, e.to_string(), None),
    };
    let who = match client.user() {
        Ok(Some(login)) => format!("token of {login}"),
        Ok(None) => "token (an installation token: no user)".into(),
        Err(e)
            if e.exit == crate::Exit::Unavailable
                || e.to_string().contains("connection failed") =>
        {
            return f("github", Status::Fail, format!("{base}: {e}"), Some("check the API URL (LW_GITHUB_API_URL or \"api_url\" in .loopwright/sync.json) and that it is reachable".into()));
        }
        Err(e) => {
            return f(
                "github",
                Status::Fail,
                e.to_string(),
                Some("set GH_TOKEN to a token with issues: write on the repository".into()),
            );
        }
    };
    match cfg.default_target() {
        Ok(t) => match client.list_comments(&t, Some("2999-01-01T00:00:00Z")) {
            Ok(_) => f(
                "github",
                Status::Ok,
                format!("{who} reads {t} at {base}"),
                None,
            ),
            Err(e) => f(
                "github",
                Status::Fail,
                e.to_string(),
                Some("give the token issues: read and write on the repository".into()),
            ),
        },
        Err(e) => f(
            "github",
            Status::Warn,
            format!("{who} at {base}; {e}"),
            None,
        ),
    }
}

/// The image cache (`build.cache`): reachable over TLS, credentials accepted.
fn image_cache(p: &Project) -> Finding {
    if p.config
        .get("build.cache")
        .is_none_or(|v| v.trim().is_empty())
    {
        return f(
            "image-cache",
            Status::Skip,
            "no build.cache in .loopwright/config; layers are built on this machine only",
            None,
        );
    }
    let client = match crate::image::cache::configured(&p.top, None, None) {
        Ok(Some(c)) => c,
        Ok(None) => return f("image-cache", Status::Skip, "no image cache", None),
        Err(e) => {
            return f(
                "image-cache",
                Status::Fail,
                e.to_string(),
                Some("fix build.cache / build.cache-ca in .loopwright/config".into()),
            );
        }
    };
    match client.login(false) {
        Ok(()) => f(
            "image-cache",
            Status::Ok,
            format!("{} reachable, access granted", client.cache),
            None,
        ),
        Err(e) if e.exit == crate::Exit::NoPerm => f(
            "image-cache",
            Status::Fail,
            e.to_string(),
            Some(format!("docker login {}", client.cache.host)),
        ),
        Err(e) => f(
            "image-cache",
            Status::Fail,
            e.to_string(),
            Some(
                "start the registry, or check build.cache and build.cache-ca (lw-build builds locally meanwhile)"
                    .into(),
            ),
        ),
    }
}
