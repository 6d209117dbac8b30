//! `create`: the steps, in the order that keeps a killed create reclaimable.
//!
//! Checks first (names, branch, ports, secrets, the image): nothing is made
//! until they pass.  A missing mirror is made next (before anything could
//! mount its path).  Then, under the name's lock: the record (not ready),
//! port leases, the registry record and the mailbox, the workspace,
//! the container and its start, while a thread fetches into an existing
//! mirror; then where the branch starts (a `--from` naming nothing undoes
//! what was made), the clone inside the container, the secrets, the
//! incremental install when the branch's lockfiles differ from the image's,
//! and last the record marked ready.  A failure rolls back what was made; a
//! `kill -9` leaves it to `gc`.
//!
//! # Incremental install
//!
//! The image's last layer carries the manifest of its inputs (a label written
//! by lw-build): each lockfile's path and sha256.  When a file of that list
//! exists at the commit the sandbox starts from and its content differs, the
//! dependencies baked into the image are not the branch's.  Rather than
//! rebuild the image for one branch, lw-sandbox runs the layer's install step
//! in `/work/repo` of this sandbox's workspace, in a one-shot container made
//! from the same image, with the same hardening, user, limits and network as
//! the sandbox itself.  That container is labelled like the sandbox, removed
//! when the step ends, and its output goes to standard error with its
//! control characters made visible.  What the step installs must land under
//! `/work` (the only writable place): `node_modules`, `$HOME/.cargo`, a
//! virtualenv under `/work`.
//!
//! The rule: nothing from the task's branch runs with more reach than the
//! sandbox has.  The step is `sandbox.install` (the host's configuration)
//! or else the install script (the layer's input whose name ends in
//! `deps.sh`) as the image holds it, `sh /opt/loopwright/deps/PATH
//! /work/repo` — never the branch's copy, which the sandbox's agent may have
//! written.  A branch whose script differs from the image's is reported;
//! `--allow-install-change` runs the branch's copy instead.  Either runs on
//! the sandbox's own network: `none` has none (an install that must
//! download fails, saying so), `egress` reaches only its allow-list.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::*;
use crate::config::Config;
use crate::image::{LABEL_LAYER, LABEL_MANIFEST, Runtime};
use crate::mirror::{self, Mirror, SyncOptions};

/// Where the deps layer (runtime/deps.Dockerfile) keeps its inputs in the
/// image, the install script among them at its project path.
const IMAGE_DEPS: &str = "/opt/loopwright/deps";

/// The image a sandbox runs and what it was built from.
#[derive(Clone, Debug)]
pub struct ImageChoice {
    pub reference: String,
    /// Set when the image is not the current one: what to tell the user.
    pub stale: Option<String>,
    /// The last layer's inputs: project path and sha256.
    pub inputs: Vec<(String, String)>,
}

/// The project's current image (lw-build's final tag), or `flag`.  A current
/// tag that is not built is refused (66) unless `allow_stale`, which takes
/// the newest earlier image of the same layer, saying so.
pub fn resolve_image(
    engine: &dyn crate::engine::Engine,
    project: Option<&Project>,
    flag: Option<&str>,
    allow_stale: bool,
) -> Result<ImageChoice> {
    let inputs_of = |reference: &str| -> Result<Vec<(String, String)>> {
        let img = engine.image(reference)?;
        let manifest = img
            .and_then(|i| i.labels.get(LABEL_MANIFEST).cloned())
            .unwrap_or_default();
        Ok(manifest
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                (w.next()? == "input").then_some(())?;
                let path = w.next()?.to_string();
                let _mode = w.next()?;
                Some((path, w.next()?.to_string()))
            })
            .collect())
    };
    if let Some(r) = flag {
        if !engine.image_exists(r)? {
            return Err(Error::new(
                Exit::NoInput,
                format!("image '{r}' is not in the engine; build it (lw-build) or load it"),
            ));
        }
        return Ok(ImageChoice {
            reference: r.to_string(),
            stale: None,
            inputs: inputs_of(r)?,
        });
    }
    let Some(project) = project else {
        return Err(Error::usage(
            "not inside a project: run in the project's checkout, pass --project DIR, or name an --image",
        ));
    };
    let runtime = Runtime::load(&project.top)
        .map_err(|e| Error::new(e.exit, format!("{}; or name an image with --image", e.msg)))?;
    let plan = runtime.plan(engine)?;
    let last = plan
        .layers
        .last()
        .expect("a runtime definition has at least one layer");
    if last.cached() {
        return Ok(ImageChoice {
            reference: last.tag.clone(),
            stale: None,
            inputs: inputs_of(&last.tag)?,
        });
    }
    let missing: Vec<&str> = plan
        .layers
        .iter()
        .filter(|l| !l.cached())
        .map(|l| l.def.name.as_str())
        .collect();
    let older = engine.images_with_label(&format!("{LABEL_LAYER}={}", last.repo))?;
    let why = format!(
        "the project's image '{}' is not built (layer(s) {} changed; lw-build --explain says which input)",
        last.tag,
        missing.join(", ")
    );
    match older.first() {
        Some(img) if allow_stale => {
            let reference = img
                .tags
                .iter()
                .find(|t| t.starts_with(&last.repo))
                .cloned()
                .unwrap_or_else(|| img.id.clone());
            Ok(ImageChoice {
                stale: Some(format!(
                    "{why}; using the stale image '{reference}' as --allow-stale asks"
                )),
                inputs: inputs_of(&reference)?,
                reference,
            })
        }
        Some(img) => Err(Error::new(
            Exit::NoInput,
            format!(
                "{why}; run lw-build, or pass --allow-stale to use the stale image '{}'",
                img.tags.first().cloned().unwrap_or_else(|| img.id.clone())
            ),
        )),
        None => Err(Error::new(
            Exit::NoInput,
            format!("{why}; no earlier image exists either; run lw-build"),
        )),
    }
}

/// The commit `rev` names in the mirror, or None.
fn mirror_commit(mirror: &Path, rev: &str) -> Result<Option<String>> {
    let out = crate::git::output(
        crate::git::command(None)
            .arg("--git-dir")
            .arg(mirror)
            .args([
                "rev-parse",
                "--verify",
                "--quiet",
                "--end-of-options",
                &format!("{rev}^{{commit}}"),
            ]),
        "read the mirror",
    )?;
    let sha = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok((out.status.success() && !sha.is_empty()).then_some(sha))
}

/// Inputs whose content at `commit` differs from the image's.  Read from
/// the mirror (which lw-mirror made; no sandbox writes it).
fn drifted_inputs(mirror: &Path, commit: &str, inputs: &[(String, String)]) -> Result<Vec<String>> {
    if inputs.is_empty() {
        return Ok(vec![]);
    }
    let mut child = crate::git::command(None)
        .arg("--git-dir")
        .arg(mirror)
        .args(["cat-file", "--batch"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Error::new(Exit::Unavailable, "cannot run git cat-file").with_source(e))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let queries: String = inputs
        .iter()
        .map(|(p, _)| format!("{commit}:{p}\n"))
        .collect();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(queries.as_bytes());
    });
    let mut r = BufReader::new(child.stdout.take().expect("stdout is piped"));
    let mut drift = Vec::new();
    for (path, sha) in inputs {
        let mut header = String::new();
        if r.read_line(&mut header).unwrap_or(0) == 0 {
            break;
        }
        let w: Vec<&str> = header.split_whitespace().collect();
        if w.len() == 3 && w[1] == "blob" {
            let size: usize = w[2].parse().unwrap_or(0);
            let mut data = vec![0u8; size + 1];
            if r.read_exact(&mut data).is_err() {
                break;
            }
            data.pop();
            let got: String = Sha256::digest(&data)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            if &got != sha {
                drift.push(path.clone());
            }
        }
    }
    let _ = writer.join();
    let _ = child.wait();
    Ok(drift)
}

/// `create`'s limit flags over the configuration's (exit 64 naming the flag).
fn apply_overrides(settings: &mut Settings, o: &limits::Overrides) -> Result<()> {
    if let Some(v) = &o.memory {
        settings.memory = parse_bytes(v).ok_or_else(|| {
            Error::usage(format!(
                "--memory '{v}' is not valid: expected a size such as 512m or 2g"
            ))
        })?;
    }
    if let Some(v) = &o.pids {
        settings.pids = v.parse().ok().filter(|n: &i64| *n > 0).ok_or_else(|| {
            Error::usage(format!(
                "--pids '{v}' is not valid: expected a positive number"
            ))
        })?;
    }
    settings.limits.apply(o)
}

/// The host's git identity for the project, if it has one.
fn host_identity(project: Option<&Project>, key: &str) -> Option<String> {
    let p = project?;
    crate::git::config_get(&p.top, key)
        .ok()
        .flatten()
        .filter(|v| !v.is_empty())
}

/// Gives `dir` and everything below it to `uid`.
fn chown_tree(dir: &Path, uid: u32) -> Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(uid)).map_err(|e| {
        Error::io_as(
            Exit::NoPerm,
            &format!("cannot give the mailbox to uid {uid} (run lw-sandbox as root, or set sandbox.uid to your uid); chown"),
            dir,
            e,
        )
    })?;
    if fs::symlink_metadata(dir)
        .map(|m| m.is_dir())
        .unwrap_or(false)
    {
        for ent in fs::read_dir(dir)
            .map_err(io_err("cannot read", dir))?
            .flatten()
        {
            chown_tree(&ent.path(), uid)?;
        }
    }
    Ok(())
}

/// The sandbox's `~/.gitconfig`: its identity and trust in the mirror.
fn gitconfig(name: &str, email: &str) -> String {
    let q = |v: &str| {
        let v: String = v.chars().filter(|c| !c.is_control()).collect();
        format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
    };
    format!(
        "[user]\n\tname = {}\n\temail = {}\n[safe]\n\tdirectory = {MIRROR}\n",
        q(name),
        q(email)
    )
}

/// The branch the mirror's HEAD names (the clone makes a local one for it).
fn mirror_head_branch(mirror: &Path) -> String {
    fs::read_to_string(mirror.join("HEAD"))
        .ok()
        .and_then(|h| {
            h.trim()
                .strip_prefix("ref: refs/heads/")
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// Whether `--from` names a ref the mirror lacks while the branch itself is
/// not there either (so `--from` would be used, and would fail).
fn from_is_missing(mirror: &Path, opts: &CreateOptions) -> Result<bool> {
    let Some(f) = &opts.from else {
        return Ok(false);
    };
    Ok(
        mirror_commit(mirror, &format!("refs/heads/{}", opts.branch))?.is_none()
            && mirror_commit(mirror, &format!("refs/heads/{f}"))?.is_none()
            && mirror_commit(mirror, f)?.is_none(),
    )
}

/// Where the task's branch starts: its upstream tip when it exists (the
/// first value), else `--from`, else the upstream's HEAD.
fn start_commit(
    mirror: &Path,
    opts: &CreateOptions,
    warn: &mut dyn FnMut(&str),
) -> Result<(Option<String>, String)> {
    let exists = mirror_commit(mirror, &format!("refs/heads/{}", opts.branch))?;
    let base = match (&exists, &opts.from) {
        (Some(tip), _) => {
            if opts.from.is_some() {
                warn(&format!(
                    "branch '{}' exists upstream; --from is ignored",
                    opts.branch
                ));
            }
            tip.clone()
        }
        (None, Some(f)) => match mirror_commit(mirror, &format!("refs/heads/{f}"))? {
            Some(c) => c,
            None => mirror_commit(mirror, f)?.ok_or_else(|| {
                Error::usage(format!(
                    "--from '{f}' names no branch, tag or commit in the mirror '{}'",
                    mirror.display()
                ))
            })?,
        },
        (None, None) => mirror_commit(mirror, "HEAD")?.ok_or_else(|| {
            Error::data(format!(
                "the mirror '{}' has no HEAD commit; name one with --from",
                mirror.display()
            ))
        })?,
    };
    Ok((exists, base))
}

/// Step timings of a create, for `--verbose` and `--json`.
struct Clock {
    last: std::time::Instant,
    steps: Vec<(&'static str, std::time::Duration)>,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            last: std::time::Instant::now(),
            steps: vec![],
        }
    }
    fn mark(&mut self, step: &'static str) {
        let now = std::time::Instant::now();
        self.steps.push((step, now - self.last));
        self.last = now;
    }
}

/// The clone, run inside the sandbox as its user.  Arguments: branch,
/// start commit, 1 when the branch exists upstream, user name, email.
const CLONE: &str = r#"set -eu
B=$1 BASE=$2 EXISTS=$3 DEFAULT=$5
mkdir -p /work/home
# Identity, and trust in the mirror (it belongs to the host's user; git reads
# safe.directory only from global configuration).
[ -e /work/home/.gitconfig ] || printf '%s' "$4" > /work/home/.gitconfig
if [ ! -e /work/repo/.git ]; then
    git clone --quiet --shared --no-checkout /lw/mirror /work/repo
    cd /work/repo
    if [ "$EXISTS" = 1 ]; then
        git checkout --quiet -B "$B" --track "origin/$B"
    else
        git checkout --quiet --no-track -B "$B" "$BASE"
    fi
    # The clone made a local branch for the mirror's HEAD: only B is the task's.
    if [ -n "$DEFAULT" ] && [ "$DEFAULT" != "$B" ]; then git branch --quiet -D "$DEFAULT" 2>/dev/null || true; fi
fi
git -C /work/repo rev-parse HEAD
"#;

impl<'a> Sandboxes<'a> {
    /// Makes sandbox `opts.name`; see the module documentation.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        opts: &CreateOptions,
        project: Option<&Project>,
        mirror_path: &Path,
        bins: &[(PathBuf, &str)],
        warn: &mut dyn FnMut(&str),
    ) -> Result<Created> {
        let name = opts.name.as_str();
        let mut clock = Clock::new();
        registry::check_name(name).map_err(Error::usage)?;
        check_branch(&opts.branch)?;
        let mut settings = Settings::from_project(project)?;
        apply_overrides(&mut settings, &opts.limits)?;
        let whats = opts
            .ports
            .iter()
            .map(|p| parse_port(p))
            .collect::<Result<Vec<_>>>()?;
        if !whats.is_empty() && opts.network != Network::Bridge {
            return Err(Error::usage(format!(
                "--port publishes on 127.0.0.1 through the engine's bridge, which --network {} has not; add --network bridge",
                opts.network.as_str()
            )));
        }
        if !opts.allow.is_empty() && opts.network != Network::Egress {
            return Err(Error::usage(
                "--allow extends the egress allow-list; add --network egress",
            ));
        }
        let runtime = self.check_runtime(
            opts.runtime.as_deref().or(settings.runtime.as_deref()),
            opts.network,
        )?;
        // Read (and refused when bad, exit 78) before anything is made.
        let agent = match &opts.agent {
            Some((kit, cred)) => Some(crate::agent::setup::Prepared::check(
                project,
                kit,
                *cred,
                opts.network,
                warn,
            )?),
            None => None,
        };
        let egress = match opts.network {
            Network::Egress => {
                let eg = egress::Settings::from_config(
                    project.map_or(&Config::default(), |p| &p.config),
                )?;
                let mut extra = opts.allow.clone();
                extra.extend(agent.iter().flat_map(|a| a.allow()));
                let allow = eg.allow_with(&extra)?;
                Some((eg, allow))
            }
            _ => None,
        };
        secrets::check_allowed(&opts.secrets, &settings.allowed_secrets)?;
        crate::service::attach::require(self.engine, &self.id, &opts.services)?;
        let secret_values = secrets::resolve(&opts.secrets, &|n| std::env::var_os(n))?;
        for (p, _) in bins {
            if !p.is_file() {
                return Err(Error::new(
                    Exit::Unavailable,
                    format!(
                        "'{}' is missing; install lw-post, lw-inbox and lw-mcp beside lw-sandbox",
                        p.display()
                    ),
                ));
            }
        }
        let mut notes = Vec::new();
        if settings.limits.disk.is_none() {
            let n = format!(
                "sandbox '{name}' has no disk quota (sandbox.disk = off): it can fill the host's disk, and its mail dir is mounted without nosuid,nodev,noexec"
            );
            warn(&n);
            notes.push(n);
        }
        if opts.network == Network::Bridge {
            let n = format!(
                "sandbox '{name}' gets the bridge network: it can reach anything this host reaches"
            );
            warn(&n);
            notes.push(n);
        }

        // Every mount below is of a host path: an engine elsewhere would see none.
        super::hostpaths::require_shared(self.engine, &self.root)?;
        clock.mark("check");
        let mut image = resolve_image(
            self.engine,
            project,
            opts.image.as_deref(),
            opts.allow_stale,
        )?;
        clock.mark("image");
        if let Some(a) = &agent {
            image.reference = a.image(
                self.engine,
                project,
                &image.reference,
                opts.image.as_deref(),
                warn,
            )?;
            clock.mark("agent-image");
        }
        if let Some(s) = &image.stale {
            warn(s);
            notes.push(s.clone());
        }

        // The mirror: made first when missing (a bind mount of a missing path
        // would leave an empty directory there); otherwise refreshed while the
        // container is made and started, and waited for before the clone.
        let m = Mirror::new(mirror_path);
        let fresh_within = mirror::create_freshness(project)?;
        let sync_now = |if_older_than: Option<std::time::Duration>| {
            let mut remote =
                |stored: Option<&str>| mirror::default_remote(project, stored, mirror_path);
            m.sync(&mut SyncOptions {
                if_older_than,
                progress: false,
                remote: &mut remote,
            })
        };
        let fetch_later = if opts.no_fetch {
            m.ready()?;
            false
        } else if matches!(m.find()?, mirror::Found::Ready(_)) {
            true
        } else {
            sync_now(None)?;
            false
        };
        clock.mark("mirror");
        std::thread::scope(|scope| -> Result<Created> {
            let mut fetch = fetch_later.then(|| scope.spawn(|| sync_now(Some(fresh_within))));
            if !self.root.dir.exists() {
                // A new root is its owner's alone (lw doctor checks it).
                fs::create_dir_all(&self.root.dir)
                    .map_err(io_err("cannot create", &self.root.dir))?;
                fs::set_permissions(&self.root.dir, fs::Permissions::from_mode(0o700))
                    .map_err(io_err("cannot set the mode of", &self.root.dir))?;
            }
            self.root.init()?;
            let lock = self.lock(name, false)?.ok_or_else(|| {
                Error::new(
                    Exit::TempFail,
                    format!("sandbox '{name}' is being created or removed by another lw-sandbox"),
                )
            })?;
            match self.record(name) {
                Ok(Some(r)) if r.ready => {
                    return Err(Error::new(
                        Exit::CantCreat,
                        format!(
                            "sandbox '{name}' exists (branch '{}'); pick another name or lw-sandbox rm it",
                            r.branch
                        ),
                    ));
                }
                Ok(Some(_)) | Err(_) => {
                    return Err(Error::new(
                        Exit::CantCreat,
                        format!(
                            "a killed create left sandbox '{name}' half made; run lw-sandbox gc, then create again"
                        ),
                    ));
                }
                Ok(None) => {}
            }
            let container = self.container_name(name);
            if self.engine.inspect(&container)?.is_some() {
                return Err(Error::new(
                    Exit::CantCreat,
                    format!(
                        "a container named '{container}' exists without a sandbox record; run lw-sandbox gc (or docker rm it)"
                    ),
                ));
            }
            let mut rec = Record {
                version: RECORD_VERSION,
                name: name.to_string(),
                branch: opts.branch.clone(),
                base: None,
                scope: opts.scope.clone(),
                container,
                volume: self.volume_name(name),
                image: image.reference.clone(),
                network: opts.network,
                ports: vec![],
                secrets: secret_values.iter().map(|s| s.name.clone()).collect(),
                uid: settings.uid,
                project: project.map(|p| p.top.clone()).unwrap_or_default(),
                mirror: fs::canonicalize(&m.path).unwrap_or_else(|_| m.path.clone()),
                created: crate::time::rfc3339(crate::time::now()),
                ready: false,
                agent: agent.as_ref().map(|a| a.record()),
                services: opts.services.clone(),
                runtime,
            };
            self.write_record(&rec)?;
            let mut drift = Vec::new();
            let made = (|| -> Result<String> {
                let hosts = self.leases().lease(settings.ports, name, &whats)?;
                rec.ports = whats
                    .iter()
                    .zip(&hosts)
                    .map(|(w, h)| Port {
                        container: w.clone(),
                        host: *h,
                    })
                    .collect();
                if !rec.ports.is_empty() {
                    self.write_record(&rec)?;
                }
                // The mail dir on its own filesystem (lib/sandbox/disk.rs),
                // mounted before the registry makes its boxes on it.
                if let Some(bytes) = settings.limits.mail_disk {
                    disk::mail(&self.root, name).make(bytes, settings.uid, 0o700)?;
                }
                let reg = Registry::new(&self.root);
                reg.register(&registry::Sandbox::new(
                    name,
                    Some(rec.branch.clone()),
                    rec.scope.clone(),
                ))?;
                let boxdir = self.root.sandbox(name).dir;
                chown_tree(&boxdir, settings.uid)?;
                clock.mark("record");

                if let Some((eg, allow)) = &egress {
                    let nets: &dyn crate::engine::NetworkEngine = self.engine;
                    let mut o = egress::Options::from(eg);
                    o.labels.insert(LABEL_ROOT.into(), self.id.clone());
                    egress::prepare(nets, &rec.container, allow, &o, &mut |_| {})?;
                    clock.mark("egress");
                    if let Some(a) = &agent {
                        let labels = BTreeMap::from([
                            (LABEL_SANDBOX.to_string(), name.to_string()),
                            (LABEL_ROOT.to_string(), self.id.clone()),
                            (
                                LABEL_ROOT_PATH.to_string(),
                                self.root.dir.to_string_lossy().into_owned(),
                            ),
                        ]);
                        a.start_proxy(nets, &rec, eg, &self.root, &labels)?;
                        clock.mark("model-proxy");
                    }
                }
                let work = disk::work(&self.root, name);
                match settings.limits.disk {
                    Some(bytes) => work.make(bytes, settings.uid, 0o755)?,
                    None => work.plain(settings.uid)?,
                }
                let spec = container_spec(
                    self,
                    &rec,
                    &settings,
                    &boxdir,
                    bins,
                    !secret_values.is_empty(),
                );
                self.engine.create(&spec)?;
                crate::service::attach::connect(
                    self.engine,
                    &self.id,
                    &rec.container,
                    &rec.services,
                    spec.network.as_deref(),
                )?;
                clock.mark("container");
                self.engine.start(&rec.container).map_err(|e| {
                    let mut e = e;
                    if e.msg.contains("port is already allocated")
                        || e.msg.contains("address already in use")
                    {
                        e.exit = Exit::TempFail;
                        e.msg += "; a leased port was taken by something else: try again";
                    }
                    e
                })?;

                clock.mark("start");
                if let Some(h) = fetch.take() {
                    h.join()
                        .map_err(|_| Error::new(Exit::Software, "the mirror fetch panicked"))??;
                    clock.mark("fetch-wait");
                }
                // The window let the mirror be used as it was, but --from
                // names a ref it lacks: that ref is needed, so fetch now.
                if fetch_later && from_is_missing(&m.path, opts)? {
                    sync_now(None)?;
                    clock.mark("fetch-needed");
                }
                let (exists, base) = start_commit(&m.path, opts, warn)?;
                rec.base = exists.is_none().then(|| base.clone());
                drift = drifted_inputs(&m.path, &base, &image.inputs)?;
                clock.mark("resolve");
                let default = mirror_head_branch(&m.path);
                let user_name = settings
                    .git_name
                    .clone()
                    .or_else(|| host_identity(project, "user.name"))
                    .unwrap_or_else(|| format!("lw-sandbox {name}"));
                let email = settings
                    .git_email
                    .clone()
                    .or_else(|| host_identity(project, "user.email"))
                    .unwrap_or_else(|| format!("{name}@sandbox.loopwright.invalid"));
                let exists_flag = if exists.is_some() { "1" } else { "0" };
                let (code, out, err) = self.run(
                    &rec,
                    &[
                        "/bin/sh",
                        "-c",
                        CLONE,
                        "lw-clone",
                        &rec.branch,
                        &base,
                        exists_flag,
                        &gitconfig(&user_name, &email),
                        &default,
                    ],
                    None,
                )?;
                if code != 0 {
                    let why = String::from_utf8_lossy(&err);
                    let hint = if why.contains("Permission denied") || why.contains("Read-only") {
                        format!(
                            "; the image must give {WORK} to uid {} (lw-build's base layer does)",
                            settings.uid
                        )
                    } else if why.contains("not found") && why.contains("git") {
                        "; the image has no git (lw-build's base layer installs it)".to_string()
                    } else {
                        String::new()
                    };
                    return Err(Error::new(
                        Exit::Unavailable,
                        format!(
                            "cannot clone into sandbox '{name}' (exit {code}): {}{hint}",
                            crate::visible::visible(why.trim())
                        ),
                    ));
                }
                let head = String::from_utf8_lossy(&out).trim().to_string();
                clock.mark("clone");
                if let Some(a) = &agent {
                    a.write_context(self, &rec)?;
                    clock.mark("context");
                }
                if !secret_values.is_empty() {
                    self.install_secrets(&rec, &secret_values)?;
                    clock.mark("secrets");
                }
                if !drift.is_empty() {
                    self.incremental_install(
                        &rec,
                        &settings,
                        &spec,
                        &image,
                        &drift,
                        opts.allow_install_change,
                        warn,
                    )?;
                    clock.mark("install");
                }
                Ok(head)
            })();
            match made {
                Ok(head) => {
                    rec.ready = true;
                    self.write_record(&rec)?;
                    drop(lock);
                    if !drift.is_empty() {
                        notes.push(format!(
                            "installed dependencies for changed {}",
                            drift.join(", ")
                        ));
                    }
                    clock.mark("ready");
                    Ok(Created {
                        record: rec,
                        head,
                        notes,
                        timings: clock.steps,
                    })
                }
                Err(e) => {
                    let mut sink = |_: &str| {};
                    if let Err(c) = self.reclaim(name, Some(&rec), &mut sink) {
                        warn(&format!(
                            "could not undo the half-made sandbox '{name}' ({c}); lw-sandbox gc will"
                        ));
                    } else {
                        lock.remove();
                    }
                    Err(e)
                }
            }
        })
    }

    /// Runs the deps layer's install step for this sandbox (module documentation).
    #[allow(clippy::too_many_arguments)]
    fn incremental_install(
        &self,
        rec: &Record,
        settings: &Settings,
        spec: &ContainerSpec,
        image: &ImageChoice,
        drift: &[String],
        allow_change: bool,
        warn: &mut dyn FnMut(&str),
    ) -> Result<()> {
        let script = image.inputs.iter().find(|(p, _)| p.ends_with("deps.sh"));
        let changed = script.is_some_and(|(p, _)| drift.contains(p));
        let q = |p: &str| p.replace('\'', "'\\''");
        let cmd = match (&settings.install, script) {
            (Some(c), _) => c.clone(),
            // The task's branch changed the install script: reported, and run
            // only when asked (it runs with the sandbox's reach, no more).
            (None, Some((p, _))) if changed && allow_change => {
                warn(&format!(
                    "the install script '{p}' differs on branch '{}' from the image's; running the branch's as --allow-install-change asks",
                    rec.branch
                ));
                format!("sh '{}' {REPO}", q(p))
            }
            (None, Some((p, _))) => {
                if changed {
                    warn(&format!(
                        "the install script '{p}' differs on branch '{}' from the image's; the image's copy runs (pass --allow-install-change to run the branch's)",
                        rec.branch
                    ));
                    if drift.len() == 1 {
                        return Ok(());
                    }
                }
                format!("sh '{IMAGE_DEPS}/{}' {REPO}", q(p))
            }
            (None, None) => {
                warn(&format!(
                    "{} differ(s) from the image's but no install step is known (set sandbox.install); run lw-build to rebuild the image",
                    drift.join(", ")
                ));
                return Ok(());
            }
        };
        // The step runs on the sandbox's own network: none stays none, an
        // egress sandbox's step goes through the same allow-list.
        let net = match rec.network {
            Network::Egress => "egress network, through its allow-list",
            Network::Bridge => "bridge network",
            Network::None => "no network, as the sandbox",
        };
        warn(&format!(
            "{} differ(s) from the image's; running '{cmd}' for sandbox '{}' ({net})",
            drift.join(", "),
            rec.name
        ));
        let mut s = spec.clone();
        let name = format!("{}-install", rec.container);
        s.name = Some(name.clone());
        s.ports.clear();
        self.engine.create(&s)?;
        let res = (|| {
            self.engine.start(&name)?;
            let req = ExecRequest {
                cmd: vec!["/bin/sh".into(), "-c".into(), cmd.clone()],
                env: vec![],
                user: Some(format!("{0}:{0}", rec.uid)),
                workdir: Some(REPO.into()),
            };
            let mut err = std::io::stderr();
            // The output is the sandbox's text: control characters shown.
            let mut on = |_: OutStream, b: &[u8]| {
                let text = String::from_utf8_lossy(b);
                let _ = err.write_all(crate::visible::visible(&text).as_bytes());
            };
            let code = self.engine.exec_io(
                &name,
                &req,
                ExecIo {
                    stdin: None,
                    tty: false,
                    size: None,
                    on_output: &mut on,
                },
            )?;
            if code != 0 {
                let hint = if rec.network == Network::None {
                    "; the sandbox has no network, and neither has its install: create it with --network egress (the package registry in the allow-list), or rebuild the image with lw-build"
                } else {
                    ""
                };
                return Err(Error::data(format!(
                    "the incremental install '{cmd}' failed (exit {code}); its output is above{hint}"
                )));
            }
            Ok(())
        })();
        self.engine.remove(&name, true)?;
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitconfig_quotes_what_git_would_misread() {
        let c = gitconfig("A \"B\" \\ C\n[core]", "a@b");
        assert_eq!(
            c,
            "[user]\n\tname = \"A \\\"B\\\" \\\\ C[core]\"\n\temail = \"a@b\"\n[safe]\n\tdirectory = /lw/mirror\n"
        );
        // git itself reads it back as written.
        let dir = std::env::temp_dir().join(format!("lw-gitconfig-{}", crate::id::new_id()));
        fs::create_dir_all(&dir).unwrap();
        let f = dir.join("config");
        fs::write(&f, &c).unwrap();
        let out = std::process::Command::new("git")
            .args(["config", "--file"])
            .arg(&f)
            .args(["user.name"])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim_end(),
            "A \"B\" \\ C[core]"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_mirror_head_names_the_branch_to_drop() {
        let dir = std::env::temp_dir().join(format!("lw-head-{}", crate::id::new_id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("HEAD"), "ref: refs/heads/trunk\n").unwrap();
        assert_eq!(mirror_head_branch(&dir), "trunk");
        fs::write(dir.join("HEAD"), "0123abcd\n").unwrap();
        assert_eq!(mirror_head_branch(&dir), "");
        fs::remove_dir_all(&dir).unwrap();
    }
}
