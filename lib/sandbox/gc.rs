//! `rm` and `gc`: reclaiming everything a sandbox owns (its containers,
//! egress network and proxy, volume, agent key, port leases, registry record,
//! mailbox, archived first, disk images, record and lock), for one sandbox
//! or for every one a dead create or a vanished container left; and `gc`
//! the root's tools volume once no sandbox of the root is left.

use std::collections::BTreeMap;
use std::fs;

use super::{Network, Record, Sandboxes, disk, mailbox, push};
use ::base::error::{Error, Exit, Result};
use ::mailbox::registry::{self, Registry};
use engine::NetworkEngine;
use wall::egress;
use wall::{LABEL_SANDBOX, REPO};

impl<'a> Sandboxes<'a> {
    /// `rm`: refuses while work would be lost, unless `force`.
    pub fn remove(&self, name: &str, force: bool, out: &mut dyn FnMut(&str)) -> Result<()> {
        // Refuse an unknown name before making its lock file.
        let known = self.get(name)?;
        let lock = self.lock(name, courier_holds(&known))?.ok_or_else(|| {
            Error::new(
                Exit::TempFail,
                format!("sandbox '{name}' is busy (another lw-sandbox holds it); try again"),
            )
        })?;
        let rec = self.get(name)?;
        if !force && self.engine.inspect(&rec.container)?.is_some() {
            self.running(&rec)?;
            let (n, dirty, log) = self.unpushed(&rec)?;
            if n > 0 || dirty > 0 {
                let mut msg = format!("sandbox '{name}' has work that would be lost:");
                if n > 0 {
                    msg += &format!(
                        " {n} unpushed commit(s) on '{}':\n{}\n",
                        rec.branch,
                        ::base::visible::visible(&log)
                    );
                }
                if dirty > 0 {
                    msg += &format!(" {dirty} uncommitted change(s) in {REPO};");
                }
                msg += &format!(" push it (lw-sandbox push {name}) or remove anyway with --force");
                return Err(Error::new(Exit::TempFail, msg));
            }
        }
        if rec.volume_mode {
            // What its mail volume still holds comes to the root first, to
            // be archived like a local mail dir's (lib/sandbox/courier/).
            if let Err(e) = super::courier::Courier::new(self).carry_locked(&rec, &mut |m| out(m)) {
                out(&format!("archived nothing from its mail volume: {e}"));
            }
        }
        self.reclaim(&rec.name, Some(&rec), out)?;
        lock.remove();
        Ok(())
    }

    /// Removes everything of sandbox `name`; the caller holds its lock.
    pub(super) fn reclaim(
        &self,
        name: &str,
        rec: Option<&Record>,
        out: &mut dyn FnMut(&str),
    ) -> Result<()> {
        self.reclaim_engine_parts(name, rec, out)?;
        self.remove_agent_key(name, out)?;
        for p in self.leases().release(name)? {
            out(&format!("port {p}"));
        }
        let reg = Registry::new(&self.root);
        if reg.unregister(name)? {
            out(&format!("registry {name}"));
        }
        for p in reg.remove_partial(name) {
            out(&format!("partial {}", p.display()));
        }
        self.reclaim_mailbox_and_disks(name, out)?;
        if self.record_path(name).exists() {
            self.remove_record(name)?;
            out(&format!("record {name}"));
        }
        Ok(())
    }

    /// The engine's part: its containers, egress network and proxy, volume.
    fn reclaim_engine_parts(
        &self,
        name: &str,
        rec: Option<&Record>,
        out: &mut dyn FnMut(&str),
    ) -> Result<()> {
        let container = rec
            .map(|r| r.container.clone())
            .unwrap_or_else(|| self.container_name(name));
        let volume = rec
            .map(|r| r.volume.clone())
            .unwrap_or_else(|| self.volume_name(name));
        // Its container, and any other this root labelled for it (an install step's).
        let mut doomed: Vec<String> = self
            .engine
            .containers_with_label(&self.root_label())?
            .into_iter()
            .filter(|c| c.labels.get(LABEL_SANDBOX).map(String::as_str) == Some(name))
            .map(|c| c.name)
            .collect();
        if !doomed.contains(&container) && self.engine.inspect(&container)?.is_some() {
            doomed.push(container.clone());
        }
        for c in doomed {
            self.engine.remove(&c, true)?;
            out(&format!("container {c}"));
        }
        if rec.is_some_and(|r| r.network == Network::Egress) {
            let nets: &dyn NetworkEngine = self.engine;
            egress::teardown(nets, &container)?;
            out(&format!("egress {}", egress::proxy_name(&container)));
        }
        // Its workspace volume, and in volume mode its mail volume.
        for v in self
            .engine
            .volumes_with_label(&format!("{LABEL_SANDBOX}={name}"))?
            .iter()
            .filter(|v| v.name == volume || v.labels.get(wall::LABEL_ROOT) == Some(&self.id))
        {
            self.engine.remove_volume(&v.name)?;
            out(&format!("volume {}", v.name));
        }
        Ok(())
    }

    /// The mail dir (archived first) and the disk images.
    fn reclaim_mailbox_and_disks(&self, name: &str, out: &mut dyn FnMut(&str)) -> Result<()> {
        // The mail dir goes whole; what it still holds is archived first
        // (lib/sandbox/mailbox.rs), never kept live for nobody to read.
        let boxdir = self.root.sandbox(name).dir;
        if boxdir.exists() {
            if let Some((dir, n)) = mailbox::archive(&self.root, name)? {
                out(&format!(
                    "archived mailbox {} to {} ({n} unread message(s))",
                    boxdir.display(),
                    dir.display()
                ));
            }
            disk::mail(&self.root, name).remove()?;
            out(&format!("mailbox {}", boxdir.display()));
        } else if disk::mail(&self.root, name).remove()? {
            out(&format!(
                "disk {}",
                disk::mail(&self.root, name).image.display()
            ));
        }
        if super::scratch::remove(&self.root, name)? {
            out(&format!(
                "scratch {}",
                super::scratch::dir(&self.root, name).display()
            ));
        }
        if disk::work(&self.root, name).remove()? {
            out(&format!(
                "disk {}",
                disk::work(&self.root, name).image.display()
            ));
        }
        Ok(())
    }

    /// `gc`: reclaims what dead creates and vanished containers left.
    pub fn gc(&self, out: &mut dyn FnMut(&str)) -> Result<()> {
        let mut names: BTreeMap<String, Option<Record>> = BTreeMap::new();
        for r in self.records()? {
            names.insert(r.name.clone(), Some(r));
        }
        let containers = self.engine.containers_with_label(&self.root_label())?;
        let volumes = self.engine.volumes_with_label(&self.root_label())?;
        for l in containers
            .iter()
            .map(|c| &c.labels)
            .chain(volumes.iter().map(|v| &v.labels))
        {
            if let Some(n) = l.get(LABEL_SANDBOX) {
                names.entry(n.clone()).or_insert(None);
            }
        }
        for l in self.leases().list()? {
            names.entry(l.owner).or_insert(None);
        }
        // Disk images, and mail dirs no sandbox and no registry record own
        // (a `lw-mediate register`ed party keeps its mail dir).
        for n in disk::names(&self.root) {
            names.entry(n).or_insert(None);
        }
        let reg = Registry::new(&self.root);
        if let Ok(rd) = fs::read_dir(self.root.sandboxes_dir()) {
            for ent in rd.flatten() {
                let n = ent.file_name().to_string_lossy().into_owned();
                if registry::check_name(&n).is_ok() && matches!(reg.get(&n), Ok(None)) {
                    names.entry(n).or_insert(None);
                }
            }
        }
        // Unreadable or stray record files and lock files of vanished names.
        if let Ok(rd) = fs::read_dir(self.state_dir()) {
            for ent in rd.flatten() {
                let n = ent.file_name().to_string_lossy().into_owned();
                if let Some(stem) = n.strip_suffix(".json").or_else(|| n.strip_suffix(".lock"))
                    && registry::check_name(stem).is_ok()
                {
                    names.entry(stem.to_string()).or_insert(None);
                } else if n.starts_with('.') && n.ends_with(".tmp") {
                    let _ = fs::remove_file(ent.path());
                }
            }
        }
        for (name, rec) in names {
            let wait = rec.as_ref().is_some_and(courier_holds);
            let Some(lock) = self.lock(&name, wait)? else {
                out(&format!("busy {name}"));
                continue;
            };
            // Re-read under the lock: a create may have finished meanwhile.
            let rec = match self.record(&name) {
                Ok(r) => r,
                Err(_) => rec,
            };
            let dead = match &rec {
                // Another engine's: its container is looked for there.
                Some(r) if self.elsewhere(r) => false,
                None => true,
                Some(r) if !r.ready => true,
                Some(r) => self.engine.inspect(&r.container)?.is_none(),
            };
            if dead {
                self.reclaim(&name, rec.as_ref(), out)?;
                lock.remove();
            }
        }
        // Egress networks and proxies whose sandbox no record names any more.
        let nets: &dyn NetworkEngine = self.engine;
        let known: Vec<String> = self.records()?.into_iter().map(|r| r.container).collect();
        for key in egress::leftovers(nets, Some(&self.root_label()))? {
            if !known.contains(&key) {
                egress::teardown(nets, &key)?;
                out(&format!("egress {}", egress::proxy_name(&key)));
            }
        }
        push::remove_leftovers(&self.root.state_dir(), out);
        // The warm pool turned off (kube.warm-pool 0): its pods go, and
        // the plan the courier refills from; on, the pools of older plans.
        if let Some(p) = self.engine.warm_pool() {
            self.pool_drain_root(p.pool_size() > 0, out)?;
        }
        self.reclaim_root_leftovers(out)
    }

    /// What the root made once for all its sandboxes (the tools volumes of
    /// lib/sandbox/volume.rs, a claim on Kubernetes), once no sandbox of
    /// the root is left on this engine to use it: no record of this engine
    /// (another engine's sandboxes use that engine's), no container
    /// labelled with one.  A service's volumes are the service's (lw-service gc).
    /// Also run by a create that failed (create/mod.rs): a failed first
    /// create leaves no 1 GiB tools claim behind until `gc`.
    pub(super) fn reclaim_root_leftovers(&self, out: &mut dyn FnMut(&str)) -> Result<()> {
        let in_use = |s: &Self| -> Result<bool> {
            Ok(s.records()?.iter().any(|r| !s.elsewhere(r))
                || s.engine
                    .containers_with_label(&s.root_label())?
                    .iter()
                    .any(|c| c.labels.contains_key(LABEL_SANDBOX)))
        };
        if in_use(self)? {
            return Ok(());
        }
        let prefix = format!("lw-sb-{}-tools-", self.id);
        let doomed: Vec<String> = self
            .engine
            .volumes_with_label(&self.root_label())?
            .into_iter()
            .filter(|v| {
                v.name.starts_with(&prefix)
                    && !v.labels.contains_key(LABEL_SANDBOX)
                    && !v.labels.contains_key(crate::service::LABEL_SERVICE)
            })
            .map(|v| v.name)
            .collect();
        // A create that began meanwhile has written its record by now.
        if doomed.is_empty() || in_use(self)? {
            return Ok(());
        }
        // The warm pool's pods mount the tools volume: they go first.
        self.pool_drain_root(false, out)?;
        for v in doomed {
            self.engine.remove_volume(&v)?;
            out(&format!("volume {v}"));
        }
        Ok(())
    }
}

/// Whether the lock of `rec`'s sandbox is one the root's courier takes for
/// a pass (a ready volume-mode sandbox, whose create is over): then `rm`
/// and `gc` wait for it instead of calling the sandbox busy.
fn courier_holds(rec: &Record) -> bool {
    rec.ready && rec.volume_mode
}
