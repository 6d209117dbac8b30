//! The doctor's project checks: the mirror, the images, the image cache, the
//! mailbox root and its locks, and the GitHub settings.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base::config::Project;
use engine::DockerEngine;
use mailbox::layout::Root;

use super::{Finding, Status, f};

pub(super) fn mirror(p: &Project, fresh: Duration) -> Finding {
    let env = std::env::var_os(repo::mirror::ENV_PATH).map(PathBuf::from);
    let path = match repo::mirror::locate(None, env.as_deref(), Some(p), &p.top) {
        Ok(path) => path,
        Err(e) => return f("mirror", Status::Fail, e.to_string(), None),
    };
    let m = repo::mirror::Mirror::new(&path);
    match m.status() {
        Ok(s) => {
            let age = base::time::now().saturating_sub(s.last_fetch);
            let detail = format!(
                "{} ({} refs, {}, fetched {} ago from {})",
                path.display(),
                s.refs,
                repo::mirror::human_size(s.size),
                base::time::human_age(age),
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

/// What the toolchain layer takes for each declaration (lib/init/versions:
/// the same words lw-build prints): a warning for each that cannot be had
/// as asked, else one `ok` line; nothing without lw init's toolchain.
pub(super) fn toolchain(p: &Project) -> Vec<Finding> {
    let resolved = crate::init::versions::current(&p.top);
    let notes: Vec<Finding> = resolved
        .iter()
        .filter_map(|r| r.note.as_ref())
        .map(|n| {
            f(
                "toolchain",
                Status::Warn,
                n.clone(),
                Some("declare a version the build can have, or accept this one".into()),
            )
        })
        .collect();
    if !notes.is_empty() || resolved.is_empty() {
        return notes;
    }
    let list: Vec<String> = resolved
        .iter()
        .map(|r| format!("{} {}", r.stack, r.toolchain))
        .collect();
    vec![f(
        "toolchain",
        Status::Ok,
        format!(
            "{}: as the project declares (toolchain.versions)",
            list.join(", ")
        ),
        None,
    )]
}

pub(super) fn image(p: &Project, engine: Option<&DockerEngine>) -> Vec<Finding> {
    let rt = match wall::image::Runtime::load(&p.top) {
        Ok(rt) => rt,
        Err(e) if e.exit == base::Exit::NoInput => {
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
        let why = match wall::image::explain(engine, layer) {
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
            Some(format!("chmod 700 {}", root.dir.display())),
        ));
    } else if mode & 0o077 != 0 {
        out.push(f(
            "mailbox",
            Status::Fail,
            format!(
                "{} is open to group or others (mode {mode:o}): they could read every message; lw-sandbox makes a root 0700",
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
    out.extend(closed(root));
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
    let top = base::fs::open_dir_no_links(boxdir).ok()?;
    for m in ["inbox", "outbox"] {
        for d in ["", "tmp", "new", "cur"] {
            let rel = Path::new(m).join(d);
            if let Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) =
                base::fs::open_dir_beneath(&top, &rel)
            {
                return Some(rel.display().to_string().trim_end_matches('/').to_string());
            }
        }
    }
    None
}

/// `sandboxes/` and `state/` closed (0700), the records in `state/` 0600,
/// `registry/` writable by its owner only (it is 0755: the sandboxes read it
/// through their read-only mount).  Older versions made them 0755 and 0644.
fn closed(root: &Root) -> Vec<Finding> {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| {
        std::fs::symlink_metadata(p)
            .ok()
            .map(|m| (m.is_dir(), m.permissions().mode() & 0o777))
    };
    let mut out = Vec::new();
    for d in [root.sandboxes_dir(), root.state_dir()] {
        if let Some((_, m)) = mode(&d)
            && m & 0o077 != 0
        {
            out.push(f(
                "mailbox",
                Status::Fail,
                format!(
                    "{} is open to group or others (mode {m:o}); it must be 0700",
                    d.display()
                ),
                Some(format!("chmod 700 {}", d.display())),
            ));
        }
    }
    let reg = root.registry_dir();
    if let Some((_, m)) = mode(&reg)
        && m & 0o022 != 0
    {
        out.push(f(
            "mailbox",
            Status::Fail,
            format!(
                "{} is writable by group or others (mode {m:o}): anyone could change what sandboxes see of their peers",
                reg.display()
            ),
            Some(format!("chmod 755 {}", reg.display())),
        ));
    } else if let Some((_, m)) = mode(&reg)
        && m & 0o005 != 0o005
    {
        out.push(f(
            "mailbox",
            Status::Warn,
            format!(
                "{} is closed to the sandboxes' user (mode {m:o}): lw-mcp's whoami inside them sees no peers",
                reg.display()
            ),
            Some(format!("chmod 755 {}", reg.display())),
        ));
    }
    let state = root.state_dir();
    let mut open: Vec<PathBuf> = Vec::new();
    // The door's record too: its key and the digests of secret values.
    let door = state.join("door");
    for dir in [
        state.clone(),
        state.join("sandbox"),
        door.clone(),
        door.join("secrets"),
    ] {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if (p.extension().is_some_and(|x| x == "json") || p == door.join("key"))
                && let Some((false, m)) = mode(&p)
                && m & 0o077 != 0
            {
                open.push(p);
            }
        }
    }
    if !open.is_empty() {
        open.sort();
        let m = mode(&open[0]).map_or(0, |x| x.1);
        out.push(f(
            "mailbox",
            Status::Fail,
            format!(
                "{} record(s) in {} are open to group or others ({}, mode {m:o}); records are 0600",
                open.len(),
                state.display(),
                open[0].display()
            ),
            Some(format!(
                "find {} -maxdepth 2 -name '*.json' -exec chmod 600 {{}} +",
                state.display()
            )),
        ));
    }
    out
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
    let Some(cfg_path) = sync::Config::find(dir) else {
        return f(
            "github",
            Status::Skip,
            "no .loopwright/sync.json: lw-sync is not configured",
            None,
        );
    };
    let cfg = match sync::Config::load(&cfg_path) {
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
    let token = match sync::github::Token::load(cfg.token_file.as_deref()) {
        Ok(t) => t,
        Err(e) => return f("github", Status::Fail, e.to_string(), None),
    };
    let base = std::env::var("LW_GITHUB_API_URL")
        .ok()
        .or(cfg.api_url.clone())
        .unwrap_or_else(|| "https://api.github.com".into());
    let limits = sync::github::Limits {
        max_wait: Duration::from_secs(5),
        read_attempts: 1,
        ..Default::default()
    };
    let client = sync::github::Client::new(&base, token, limits, Default::default());
    let mut client = match client {
        Ok(c) => c,
        Err(e) => return f("github", Status::Fail, e.to_string(), None),
    };
    let who = match client.user() {
        Ok(Some(login)) => format!("token of {login}"),
        Ok(None) => "token (an installation token: no user)".into(),
        // No answer to be had (nothing listens, no answer in time, the
        // connection dropped, GitHub failing): the exit status says so, and
        // the fix is the URL or the network, never the token.
        Err(e) if matches!(e.exit, base::Exit::Unavailable | base::Exit::TempFail) => {
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
    let client = match wall::image::cache::configured(&p.top, None, None) {
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
        Err(e) if e.exit == base::Exit::NoPerm => f(
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn fails(root: &Root) -> Vec<(String, String)> {
        mailbox(root)
            .into_iter()
            .filter(|x| x.status == Status::Fail)
            .map(|x| (x.detail, x.fix.unwrap_or_default()))
            .collect()
    }

    /// A GitHub that cannot answer (here: 503 to every request, as a
    /// dropped connection or a timeout ends too) is the URL's or the
    /// network's failure: the fix named is the API URL, not the token.
    #[test]
    fn a_github_with_no_answer_to_give_is_a_reachability_failure_not_a_token_one() {
        use std::io::{Read as _, Write as _};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                let mut req = Vec::new();
                let mut b = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&b[..n]),
                    }
                }
                let _ = c.write_all(
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
            }
        });
        let dir = std::env::temp_dir().join(format!("lw-doctor-gh-{}", base::id::new_id()));
        std::fs::create_dir_all(dir.join(".loopwright")).unwrap();
        std::fs::write(dir.join("token"), "t0ken\n").unwrap();
        std::fs::write(
            dir.join(".loopwright/sync.json"),
            serde_json::json!({
                "api_url": format!("http://127.0.0.1:{port}"),
                "repo": "o/r",
                "issue": 1,
                "token_file": dir.join("token"),
            })
            .to_string(),
        )
        .unwrap();
        if ["GH_TOKEN", "GITHUB_TOKEN", "LW_GITHUB_API_URL"]
            .iter()
            .any(|v| std::env::var_os(v).is_some())
        {
            eprintln!("skipped: GH_TOKEN, GITHUB_TOKEN or LW_GITHUB_API_URL is set");
            return;
        }
        let x = github(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(x.status, Status::Fail, "{}", x.detail);
        assert!(x.detail.contains("503"), "{}", x.detail);
        let fix = x.fix.unwrap_or_default();
        assert!(fix.contains("check the API URL"), "{fix}");
    }

    /// Issue 29, item 7: a root older versions made 0755, with 0755 state
    /// and 0644 records, passed lw doctor.
    #[test]
    fn a_root_open_to_others_fails_with_the_chmod_that_closes_it() {
        let dir = std::env::temp_dir().join(format!("lw-doctor-{}", base::id::new_id()));
        let root = Root::new(&dir);
        root.make_dir(&dir.join("state/sandbox")).unwrap();
        root.init().unwrap();
        std::fs::write(dir.join("state/sandbox/a.json"), "{}").unwrap();
        chmod(&dir.join("state/sandbox/a.json"), 0o600);
        assert_eq!(fails(&root), vec![], "a root as init makes it");
        for (p, mode) in [
            (dir.clone(), 0o700),
            (dir.join("sandboxes"), 0o700),
            (dir.join("state"), 0o700),
            (dir.join("registry"), 0o755),
        ] {
            let m = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(m, mode, "{}", p.display());
        }

        chmod(&dir.join("registry"), 0o700);
        let warns: Vec<Finding> = mailbox(&root)
            .into_iter()
            .filter(|x| x.status == Status::Warn)
            .collect();
        assert_eq!(warns.len(), 1, "{warns:?}");
        assert!(warns[0].detail.contains("whoami"), "{warns:?}");
        chmod(&dir.join("registry"), 0o755);

        chmod(&dir, 0o755);
        let fx = fails(&root);
        assert_eq!(fx.len(), 1, "{fx:?}");
        assert!(fx[0].0.contains("mode 755"), "{fx:?}");
        assert_eq!(fx[0].1, format!("chmod 700 {}", dir.display()));
        chmod(&dir, 0o700);

        chmod(&dir.join("state"), 0o755);
        chmod(&dir.join("sandboxes"), 0o750);
        chmod(&dir.join("registry"), 0o775);
        chmod(&dir.join("state/sandbox/a.json"), 0o644);
        let fixes: Vec<String> = fails(&root).into_iter().map(|x| x.1).collect();
        assert_eq!(
            fixes,
            vec![
                format!("chmod 700 {}", dir.join("sandboxes").display()),
                format!("chmod 700 {}", dir.join("state").display()),
                format!("chmod 755 {}", dir.join("registry").display()),
                format!(
                    "find {} -maxdepth 2 -name '*.json' -exec chmod 600 {{}} +",
                    dir.join("state").display()
                ),
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
