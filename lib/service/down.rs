//! Taking services down: `down` (the container only: network, attached
//! sandboxes and data stay), `rm` (its networks too, the data with
//! `--volumes`) and `gc` (the services whose declaration is gone).

use std::time::Duration;

use super::{LABEL_SERVICE, Services, container_name, decl, volume_name};
use base::error::Result;
use engine::NetworkEngine;
use wall::LABEL_ROOT;

impl<'a> Services<'a> {
    pub(super) fn remove_container(&self, name: &str) -> Result<bool> {
        let container = container_name(&self.id, name);
        let had = self.engine.inspect(&container)?.is_some();
        self.engine.remove(&container, true)?;
        let nets: &dyn NetworkEngine = self.engine;
        if !wall::egress::leftovers(nets, Some(&format!("{LABEL_SERVICE}={name}")))?.is_empty() {
            wall::egress::teardown(nets, &container)?;
        }
        Ok(had)
    }

    /// `down`: removes the container; its network, its sandboxes' place on
    /// it and its data volume stay.
    pub fn down(&self, name: &str) -> Result<bool> {
        decl::check_name(name)?;
        let container = container_name(&self.id, name);
        if self.engine.inspect(&container)?.is_some() {
            self.engine.stop(&container, Duration::from_secs(10))?;
        }
        self.remove_container(name)
    }

    /// `rm`: `down`, then its networks (sandboxes detached, each reported)
    /// and, with `volumes`, its data.
    pub fn remove(&self, name: &str, volumes: bool, out: &mut dyn FnMut(&str)) -> Result<()> {
        if self.down(name)? {
            out(&format!("container {}", container_name(&self.id, name)));
        }
        let nets: &dyn NetworkEngine = self.engine;
        for n in nets.networks_with_label(&format!("{LABEL_SERVICE}={name}"))? {
            if n.labels.get(LABEL_ROOT) != Some(&self.id) {
                continue;
            }
            for c in n.containers.keys() {
                nets.disconnect(&n.id, c)?;
                out(&format!("detached {c}"));
            }
            nets.remove_network(&n.id)?;
            out(&format!("network {}", n.name));
        }
        let v = volume_name(&self.id, name);
        let has = self
            .engine
            .volumes_with_label(&format!("{LABEL_SERVICE}={name}"))?
            .iter()
            .any(|x| x.name == v);
        if has && volumes {
            self.engine.remove_volume(&v)?;
            out(&format!("volume {v}"));
        } else if has {
            out(&format!("kept volume {v}"));
        }
        Ok(())
    }

    /// `gc`: removes the services whose declaration is gone (their data
    /// volume too with `volumes`).
    pub fn gc(&self, volumes: bool, out: &mut dyn FnMut(&str)) -> Result<()> {
        for (name, top) in self.known()? {
            if top.join(decl::DIR).join(&name).exists() {
                continue;
            }
            self.remove(&name, volumes, out)?;
        }
        Ok(())
    }
}
