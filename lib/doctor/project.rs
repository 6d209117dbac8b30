//! The doctor's project checks: the mirror, the images, the image cache, the
//! mailbox root and its locks, and the GitHub settings.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Project;
use crate::engine::DockerEngine;
use crate::layout::Root;

use super::{Finding, Status, f};

pub(super) fn mirror(p: &Project, fresh: Duration) -> Finding {
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

pub(super) fn image(p: &Project, engine: Option<&DockerEngine>) -> Vec<Finding> {
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

pub(super) fn mailbox(root: &Root) -> Vec<Finding> {
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
    // Each sandbox's mailbox must be closed to others: a sandbox's is root's
    // with mode 0711 (it passes through to its Maildirs, which are its
    // user's), a party's registered by hand its owner's with 0700.
    if let Ok(rd) = std::fs::read_dir(root.sandboxes_dir()) {
        for e in rd.flatten() {
            let p = e.path();
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                let mode = m.permissions().mode() & 0o777;
                if !m.is_dir() || mode & 0o066 != 0 {
                    out.push(f(
                        "mailbox",
                        Status::Fail,
                        format!("{} is {} (mode {mode:o}); a sandbox's mailbox must be a directory others can neither list nor write", p.display(), if m.is_dir() { "open to others" } else { "not a directory" }),
                        Some(format!("chmod 700 {}", p.display())),
                    ));
                } else if let Some(at) = planted_link(&p) {
                    out.push(f(
                        "mailbox",
                        Status::Fail,
                        format!("{} holds a symbolic link or a non-directory at '{at}', where a Maildir directory belongs: planted by the sandbox (its mail dir predates the root-owned layout); loopwright never follows it, and that mailbox's mail waits", p.display()),
                        Some(format!(
                            "lw-sandbox rm --force {} (its mail is archived), then create it again",
                            p.file_name().unwrap_or_default().to_string_lossy()
                        )),
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

/// The first of a mail dir's Maildir directories that is a symbolic link
/// or not a directory (opened beneath it, no link followed), if any.
fn planted_link(boxdir: &Path) -> Option<String> {
    let top = crate::fs::open_dir_no_links(boxdir).ok()?;
    for m in ["inbox", "outbox"] {
        for d in ["", "tmp", "new", "cur"] {
            let rel = Path::new(m).join(d);
            if let Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) =
                crate::fs::open_dir_beneath(&top, &rel)
            {
                return Some(rel.display().to_string().trim_end_matches('/').to_string());
            }
        }
    }
    None
}

pub(super) fn lock_finding(what: &'static str, path: &Path) -> Finding {
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

pub(super) fn github(dir: &Path) -> Finding {
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
pub(super) fn image_cache(p: &Project) -> Finding {
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
