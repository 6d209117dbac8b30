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
//! and last the record marked ready.  A failure rolls back what was made
//! (and the root's tools volume, made by a first create, when no sandbox
//! of the root is left to use it); a `kill -9` leaves it to `gc`.
//!
//! This file holds the order; each step is in the module named for it:
//! `checks`, `image` (which image, which of its inputs the branch changed),
//! `parts` (leases, mailbox, egress, workspace, container), `clone`,
//! `install` (the incremental install).

mod checks;
mod clone;
mod image;
mod install;
mod parts;

use std::fs;
use std::path::{Path, PathBuf};

pub use checks::{check_branch, parse_port};
pub use image::{ImageChoice, resolve_image};

use super::record::RECORD_VERSION;
use super::{CreateOptions, Created, NameLock, Record, Sandboxes, io_err};
use base::cli::Report;
use base::config::Project;
use base::error::{Error, Exit, Result};
use checks::Checked;
use engine::ContainerSpec;
use repo::mirror::{self, Mirror, SyncOptions};

/// Step timings of a create, for `--verbose` and `--json`.
pub(super) struct Clock {
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
    pub(super) fn mark(&mut self, step: &'static str) {
        let now = std::time::Instant::now();
        self.steps.push((step, now - self.last));
        self.last = now;
    }
}

impl<'a> Sandboxes<'a> {
    /// Makes sandbox `opts.name`; see the module documentation.  Its
    /// warnings (and the mirror's, from the thread that fetches) go to
    /// `report`.
    pub fn create(
        &self,
        opts: &CreateOptions,
        project: Option<&Project>,
        mirror_path: &Path,
        bins: &[(PathBuf, &str)],
        report: Report,
    ) -> Result<Created> {
        let mut warn_each = |m: &str| report(m);
        let warn: &mut dyn FnMut(&str) = &mut warn_each;
        let mut clock = Clock::new();
        let mut c = self.check(opts, project, bins, warn)?;
        clock.mark("check");
        let image = self.image(opts, project, &mut c, &mut clock, warn)?;

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
                report,
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
            let lock = self.claim(&opts.name)?;
            let mut rec = self.first_record(opts, project, &c, &image, &m)?;
            let mut drift = Vec::new();
            let made = (|| -> Result<String> {
                let spec = self.make_parts(&mut rec, &c, bins, &mut clock)?;
                if let Some(h) = fetch.take() {
                    h.join()
                        .map_err(|_| Error::new(Exit::Software, "the mirror fetch panicked"))??;
                    clock.mark("fetch-wait");
                }
                // The window let the mirror be used as it was, but --from
                // names a ref it lacks: that ref is needed, so fetch now.
                if fetch_later && clone::from_is_missing(&m.path, opts)? {
                    sync_now(None)?;
                    clock.mark("fetch-needed");
                }
                let head;
                (head, drift) = self.clone_branch(
                    &mut rec,
                    opts,
                    project,
                    &c.settings,
                    &m.path,
                    &image,
                    &mut clock,
                    warn,
                )?;
                self.finish(&rec, opts, &c, &spec, &image, &drift, &mut clock, warn)?;
                Ok(head)
            })();
            self.conclude(made, rec, lock, &drift, c.notes, clock, warn)
        })
    }

    /// The image: the project's (or `--image`), then the agent's above it.
    fn image(
        &self,
        opts: &CreateOptions,
        project: Option<&Project>,
        c: &mut Checked,
        clock: &mut Clock,
        warn: &mut dyn FnMut(&str),
    ) -> Result<ImageChoice> {
        // A cluster builds nothing: the image is lw-build's, on the builder
        // paired with it.
        let cluster = self.kind == engine::EngineKind::Kubernetes;
        let mut image = match (project, opts.image.as_deref()) {
            (Some(p), None) if cluster => {
                image::resolve_for_cluster(self.images, p, opts.allow_stale)?
            }
            (_, Some(r)) if cluster => image::named_for_cluster(self.images, r)?,
            _ => resolve_image(
                self.engine,
                project,
                opts.image.as_deref(),
                opts.allow_stale,
            )?,
        };
        // Read before the agent's layer: the project's image carries it.
        let images: &dyn engine::Images = if cluster { self.images } else { self.engine };
        image.post_start = image::post_start_of(images, &image.reference)?;
        clock.mark("image");
        if let Some(a) = &c.agent {
            image.reference = a.image(
                self.images,
                project,
                &image.reference,
                opts.image.as_deref(),
                warn,
            )?;
            clock.mark("agent-image");
        }
        if let Some(s) = &image.stale {
            warn(s);
            c.notes.push(s.clone());
        }
        Ok(image)
    }

    /// Makes the root when it is new, and takes the name's lock: refused
    /// when the name is taken, half made, or its container exists.
    fn claim(&self, name: &str) -> Result<NameLock> {
        // A new root is its owner's alone (lw doctor checks it).
        self.root
            .make_dir(&self.root.dir)
            .map_err(io_err("cannot create", &self.root.dir))?;
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
        Ok(lock)
    }

    /// The record, not ready, written before anything else is made.
    fn first_record(
        &self,
        opts: &CreateOptions,
        project: Option<&Project>,
        c: &Checked,
        image: &ImageChoice,
        m: &Mirror,
    ) -> Result<Record> {
        let name = opts.name.as_str();
        let rec = Record {
            version: RECORD_VERSION,
            name: name.to_string(),
            branch: opts.branch.clone(),
            base: None,
            scope: opts.scope.clone(),
            container: self.container_name(name),
            volume: self.volume_name(name),
            image: image.reference.clone(),
            network: opts.network,
            ports: vec![],
            secrets: c.secrets.iter().map(|s| s.name.clone()).collect(),
            uid: c.settings.uid,
            project: project.map(|p| p.top.clone()).unwrap_or_default(),
            mirror: fs::canonicalize(&m.path).unwrap_or_else(|_| m.path.clone()),
            created: base::time::rfc3339(base::time::now()),
            ready: false,
            agent: c.agent.as_ref().map(|a| a.record()),
            services: opts.services.clone(),
            runtime: c.runtime.clone(),
            volume_mode: c.on_volumes,
            mail_volume: c.on_volumes.then(|| self.mail_volume(name)),
            engine: Some(self.engine.address()),
            pull_request: None,
            post_start: image.post_start.clone(),
        };
        self.write_record(&rec)?;
        Ok(rec)
    }

    /// After the clone: the agent's context, the secrets, the incremental
    /// install, the postStartCommand.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        rec: &Record,
        opts: &CreateOptions,
        c: &Checked,
        spec: &ContainerSpec,
        image: &ImageChoice,
        drift: &[String],
        clock: &mut Clock,
        warn: &mut dyn FnMut(&str),
    ) -> Result<()> {
        if let Some(a) = &c.agent {
            self.write_agent_context(a, rec)?;
            clock.mark("context");
        }
        if !c.secrets.is_empty() {
            self.install_secrets(rec, &c.secrets)?;
            clock.mark("secrets");
        }
        if !drift.is_empty() {
            self.incremental_install(
                rec,
                &c.settings,
                spec,
                image,
                drift,
                opts.allow_install_change,
                warn,
            )?;
            clock.mark("install");
        }
        if rec.post_start.is_some() {
            self.post_start(rec, warn)?;
            clock.mark("post-start");
        }
        Ok(())
    }

    /// Marks a made sandbox ready, or undoes a half-made one.
    #[allow(clippy::too_many_arguments)]
    fn conclude(
        &self,
        made: Result<String>,
        mut rec: Record,
        lock: NameLock,
        drift: &[String],
        mut notes: Vec<String>,
        mut clock: Clock,
        warn: &mut dyn FnMut(&str),
    ) -> Result<Created> {
        let name = rec.name.clone();
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
                if let Err(c) = self.reclaim(&name, Some(&rec), &mut sink) {
                    warn(&format!(
                        "could not undo the half-made sandbox '{name}' ({c}); lw-sandbox gc will"
                    ));
                } else {
                    lock.remove();
                    // What the root made for its sandboxes (the tools
                    // volume), when no sandbox of the root is left to use
                    // it: a failed first create leaves the root as it was.
                    if let Err(c) = self.reclaim_root_leftovers(&mut sink) {
                        warn(&format!(
                            "could not remove the root's tools volume after the failed create of '{name}' ({c}); lw-sandbox gc will"
                        ));
                    }
                }
                Err(e)
            }
        }
    }
}
